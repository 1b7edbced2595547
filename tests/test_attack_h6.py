"""Outside attack on what landed with issues 21-27 (H6): inputs an attacker or a careless user can
send that made the project misreport. Each test failed before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tests.test_traffic_log import _doc
from typer.testing import CliRunner

from rl_conductor.cli import app
from rl_conductor.errors import InvalidArgument
from rl_conductor.evaluation.suite import run_eval
from rl_conductor.loop import traffic as tl
from rl_conductor.loop.monitor import check_champion
from rl_conductor.serving.request import ConductorRequest
from rl_conductor.validation import InvalidValue


def _pool(tmp_path: Path) -> Path:
    """A recordings pool of one external and one self-hosted worker, both right on 4 test items."""
    rows = [
        {"id": f"h6/{i}", "split": "test", "question": f"What is {i} + 1?", "answer": str(i + 1),
         "grader": "math", "responses": {"ext": {"correct": True}, "own": {"correct": True}}}
        for i in range(4)
    ]  # fmt: skip
    rec = tmp_path / "h6.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    workers = [
        {"name": "ext", "kind": "replay", "price_in": 1.0, "price_out": 1.0, "hosting": "external"},
        {"name": "own", "kind": "replay", "price_in": 1.0, "price_out": 1.0, "hosting": "self"},
    ]
    pool = tmp_path / "h6.yaml"
    pool.write_text(yaml.safe_dump({"name": "h6", "recordings": str(rec), "workers": workers}))
    return pool


def test_an_evaluation_whose_limits_permit_no_worker_is_refused_not_reported_as_zero(tmp_path: Path) -> None:
    """``--sensitivity private --allowed-workers ext`` (ext external): every step was skipped as
    forbidden, the table said 0 % and the command exited 0 (a server answers such a request 4xx)."""
    pool = str(_pool(tmp_path))
    kw = {"pool": pool, "dataset": None, "split": "test", "limit": None, "seed": 0, "progress": False}
    with pytest.raises(InvalidArgument, match="no worker of pool 'h6' is permitted by --sensitivity private"):
        run_eval(["single:ext"], sensitivity="private", allowed="ext", **kw)
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--pool",
            pool,
            "--policy",
            "single:own",
            "--sensitivity",
            "private",
            "--allowed-workers",
            "ext",
        ],
    )
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "no worker of pool 'h6' is permitted" in result.stderr
    # what is permitted still runs: the self-hosted worker on a private request, the external on a public one
    (own,) = run_eval(["single:own"], sensitivity="private", allowed="own", **kw)
    (ext,) = run_eval(["single:ext"], sensitivity="public", allowed="ext", **kw)
    assert own["accuracy"] == ext["accuracy"] == 1.0


@pytest.mark.parametrize(("kw", "name"), [({"min_tasks": 0}, "min_tasks"), ({"min_tasks": 1}, "min_tasks"),
                                          ({"fit_limit": -3}, "fit_limit")])  # fmt: skip
def test_the_champion_check_refuses_what_its_cli_refuses(
    tmp_path: Path, kw: dict[str, int], name: str
) -> None:
    """The champion-check pipeline passes its root inputs straight to check_champion: min_tasks 0
    read the window (records, no feedback) and went on to a verdict over no question."""

    store = tmp_path / "traffic"
    log = tl.TrafficLog(tl.TrafficConfig(store=str(store), batch_size=1, flush_interval_s=30))
    log.submit(ConductorRequest(question="What is 1 + 1?"), _doc("r0", "2"), "v1")
    log.close()
    assert tl.read_traffic(str(store))
    with pytest.raises(InvalidValue, match=name):
        check_champion(traffic_store=str(store), **kw)
