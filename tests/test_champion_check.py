"""The loop's alert (rl_conductor.loop.monitor): is the serving champion below the gate's floor?

The end-to-end tests serve the session's micro Conductor (registered champion in sqlite MLflow)
through the predictor's service with the traffic log hooked in, give feedback, and run
``conductor retrain check``: its exit status, its line, the Prometheus textfile, a Pushgateway on
loopback and the MLflow run and version tags. The micro Conductor learns only the output format,
so the paper-sim floor (gemini-2.5-pro alone, the routers) beats it: the alert must fire (no
Conductor a test can afford to train clears that floor, so the "not below" side is the rule's
test and the gauges' one).
"""

from __future__ import annotations

import asyncio
import http.server
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from _tiny import Micro
from rl_conductor.loop.monitor import BELOW_FLOOR_EXIT, verdict

# --------------------------------------------------------------------------- the rule


def test_the_alert_needs_the_whole_interval_below_the_best_floor_policy() -> None:
    ids = [f"t{i}" for i in range(40)]
    floor = {"single:a": {i: 0.8 for i in ids}, "knn": {i: 0.6 for i in ids}}
    level = {i: 0.8 for i in ids}
    assert verdict(level, floor)[0] == "single:a"  # the best floor policy is the bar
    assert verdict(level, floor)[4] >= 0  # level: not below
    noisy = {i: (0.9 if k % 2 else 0.68) for k, i in enumerate(ids)}  # 0.79 on average, noisy
    _, _, gap, low, high = verdict(noisy, floor)
    assert gap < 0 < high and low < 0  # below on average, within noise: no alert
    below = {i: (0.75 if k % 2 else 0.7) for k, i in enumerate(ids)}
    _, mean, gap, _, high = verdict(below, floor)
    assert mean == pytest.approx(0.8) and high < 0 and gap == pytest.approx(-0.075)
    with pytest.raises(ValueError, match="no questions"):
        verdict({}, floor)


def test_gold_feedback_names_the_answer_where_feedback_can_grade_it_else_a_score() -> None:
    from rl_conductor.loop.feedback import gold_feedback, parse_feedback
    from rl_conductor.tasks.base import Task

    math = Task(id="m", question="1+1?", answer="2", domain="math", source="t", grader="math")
    code = Task(id="c", question="add", answer="def add(a, b): ...", domain="code", source="t", grader="code")
    assert gold_feedback("r1", math) == {"request_id": "r1", "answer": "2", "grader": "math"}
    assert gold_feedback("r2", code) == {"request_id": "r2", "score": 0.0}
    assert gold_feedback("r3", code, score=1.0)["score"] == 1.0
    assert parse_feedback(gold_feedback("r1", math)).grader == "math"


# --------------------------------------------------------------------------- end to end


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A Pushgateway's push route on loopback: keeps what was PUT."""

    received: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append((self.command, self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[str]:
    _Gateway.received = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def registered(
    micro: Micro, mlflow_db_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str]]:
    """The micro Conductor as champion of a fresh model name in a sqlite MLflow of its own."""
    import mlflow

    from rl_conductor.serving.pyfunc import MODEL_CODE
    from rl_conductor.tracking import mlflow_utils, registry

    db = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_db_template, db)
    uri = f"sqlite:///{db}"
    monkeypatch.setenv(mlflow_utils.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    previous = mlflow.get_tracking_uri()
    mlflow_utils.configure(uri)
    name = f"check-{uuid.uuid4().hex[:8]}"
    registry.log_conductor_model(micro.final_dir, model_code=MODEL_CODE, name=name, alias="champion")
    try:
        yield name, uri
    finally:
        mlflow_utils.reset()
        mlflow.set_tracking_uri(previous)


def _serve_with_feedback(champion: Path, pool: str, store: Path, n: int) -> None:
    """``n`` paper-mix questions through the predictor's service with the traffic log, then a
    gold-answer feedback on each (a score for code, whose grader feedback cannot run)."""
    from rl_conductor.loop.feedback import Feedback, gold_feedback, parse_feedback
    from rl_conductor.loop.traffic import TrafficConfig, TrafficLog
    from rl_conductor.serving.request import ConductorRequest
    from rl_conductor.serving.service import ConductorService, load_policy
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.workers.pool import load_pool

    p = load_pool(pool)
    service = ConductorService(load_policy(str(champion), None, p), p)
    log = TrafficLog(TrafficConfig(store=str(store), batch_size=50, flush_interval_s=0.5))
    service.on_answered.append(log.submit)
    items = load_tasks("paper-mix", "train", limit=n, seed=5)

    async def ask() -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(*(service.answer(ConductorRequest(question=t.question)) for t in items))
        )

    docs = asyncio.run(ask())
    log.flush()
    fb = Feedback(log)
    for task, doc in zip(items, docs, strict=True):
        assert fb.submit(parse_feedback(gold_feedback(doc["request_id"], task)))["status"] == "recorded"
    log.close()


def _check(args: list[str]) -> Any:
    from typer.testing import CliRunner

    from rl_conductor.cli import app

    return CliRunner().invoke(app, ["retrain", "check", *args])


@pytest.mark.slow
def test_a_champion_below_the_floor_exits_3_and_says_so_in_prometheus_and_mlflow(
    micro: Micro, registered: tuple[str, str], tmp_path: Path, gateway: str
) -> None:
    from rl_conductor.tracking import mlflow_utils

    name, _ = registered
    store = tmp_path / "traffic"
    _serve_with_feedback(micro.final_dir, "paper-sim", store, 40)
    textfile = tmp_path / "node-exporter" / "conductor.prom"
    textfile.parent.mkdir()
    args = ["--traffic-store", str(store), "--model-name", name, "--min-tasks", "30", "--fit-limit", "60"]
    result = _check([*args, "--prom-textfile", str(textfile), "--pushgateway", gateway])
    assert result.exit_code == BELOW_FLOOR_EXIT, result.output
    # the verdict after MLflow's download and transformers' loading bars: a bar closed late under
    # load can add a blank line or leave its text, unterminated, before the verdict
    last = result.output.rstrip().splitlines()[-1]
    line = last[last.find("ALERT") :] if "ALERT" in last else last
    assert line.startswith("ALERT champion v1 of " + name + " is below the gate's floor"), line
    assert "n=40" in line and "paired gap -" in line
    # once: not also as the monitor's log record on stderr (CliRunner's output holds both streams)
    assert result.output.count("below the gate's floor") == 1, result.output
    gauges = {
        s.name: s.value
        for fam in text_string_to_metric_families(textfile.read_text())
        for s in fam.samples
        if s.labels == {"model": name}
    }
    assert gauges["conductor_champion_below_floor"] == 1.0
    assert gauges["conductor_champion_floor_gap_ci_high"] < 0 and gauges["conductor_champion_floor_gap"] < 0
    assert gauges["conductor_champion_check_questions"] == 40 and gauges["conductor_champion_version"] == 1
    [(method, path, body)] = _Gateway.received
    assert method == "PUT" and path == "/metrics/job/conductor-champion-check"
    assert b'conductor_champion_below_floor{model="' + name.encode() + b'"} 1.0' in body
    c = mlflow_utils.client()
    assert c.get_model_version(name, "1").tags["check.below_floor"] == "true"
    exp = c.get_experiment_by_name(f"{name}-loop")
    [run] = c.search_runs([exp.experiment_id], "tags.`loop.step` = 'check'")
    assert run.data.tags["check.below_floor"] == "true"
    assert run.data.metrics["check/below_floor"] == 1.0 and run.data.metrics["check/n"] == 40
    assert run.data.metrics["check/gap_ci_high"] < 0
    assert "check/single_gemini-2.5-pro/mean_reward" in run.data.metrics and "check/knn/mean_reward" in (
        run.data.metrics
    )


@pytest.mark.slow
def test_too_little_feedback_in_the_window_gives_no_verdict_and_exit_1(
    micro: Micro, registered: tuple[str, str], tmp_path: Path
) -> None:
    name, _ = registered
    store = tmp_path / "traffic"
    _serve_with_feedback(micro.final_dir, "paper-sim", store, 12)
    result = _check(["--traffic-store", str(store), "--model-name", name, "--min-tasks", "13"])
    assert result.exit_code == 1  # not a silent 0: a pager must tell "fine" from "unknown"
    assert "12 requests with feedback" in result.output and "no verdict" in result.output
    result = _check(["--traffic-store", str(tmp_path / "nothing-here"), "--model-name", name])
    assert result.exit_code == 1 and "no traffic records in the window of" in result.output


def test_the_gauges_of_a_champion_not_below_the_floor_read_0(tmp_path: Path) -> None:
    from rl_conductor.loop.monitor import CheckOutcome, export_metrics

    outcome = CheckOutcome(
        below_floor=False,
        reason="level",
        model_name="m",
        champion_version=4,
        n=50,
        champion_reward=0.8,
        floor_policy="knn",
        floor_reward=0.79,
        gap=0.01,
        ci_low=-0.02,
        ci_high=0.04,
        earned_reward=None,
        checked_at=1.7e9,
        floor_rewards={"knn": 0.79},
    )
    textfile = tmp_path / "c.prom"
    export_metrics(outcome, textfile=str(textfile))
    got = {s.name: s.value for f in text_string_to_metric_families(textfile.read_text()) for s in f.samples}
    assert got["conductor_champion_below_floor"] == 0.0 and got["conductor_champion_version"] == 4
    assert got["conductor_champion_floor_gap_ci_low"] == -0.02
    assert got["conductor_champion_check_timestamp_seconds"] == 1.7e9
    from rl_conductor.errors import UserError

    with pytest.raises(UserError, match=r"cannot push the check.s metrics to http://127\.0\.0\.1:9"):
        export_metrics(outcome, pushgateway="http://127.0.0.1:9")  # nothing listens: said, not lost


# --------------------------------------------------------------------------- as a pipeline step


def test_compiled_champion_check_yaml_is_not_stale_and_has_the_schedule_parameters(tmp_path: Path) -> None:
    import yaml

    from rl_conductor.loop.pipeline import CHECK_PACKAGE_NAME, compile_check_pipeline
    from rl_conductor.pipeline.runner import default_package_path

    fresh = compile_check_pipeline(tmp_path / CHECK_PACKAGE_NAME)
    committed = default_package_path(CHECK_PACKAGE_NAME)
    docs = list(yaml.safe_load_all(committed.read_text()))
    assert list(yaml.safe_load_all(fresh.read_text())) == docs, (
        "pipelines/champion_check.yaml is stale: run `conductor retrain compile`"
    )
    params = docs[0]["root"]["inputDefinitions"]["parameters"]
    for name in ("traffic_store", "window_hours", "min_tasks", "pushgateway", "prom_textfile"):
        assert name in params, name
    assert params["window_hours"]["defaultValue"] == 24.0


@pytest.mark.slow
def test_the_champion_check_runs_as_a_pipeline_step_on_the_local_runner(
    micro: Micro, registered: tuple[str, str], tmp_path: Path
) -> None:
    """The same check as ``conductor retrain check``, as the ``conductor-champion-check`` pipeline
    on kfp's local runner: its output is the verdict, the gauges and MLflow say the same."""
    from rl_conductor.loop.pipeline import run_check_local
    from rl_conductor.tracking import mlflow_utils

    name, uri = registered
    store = tmp_path / "traffic"
    _serve_with_feedback(micro.final_dir, "paper-sim", store, 40)
    textfile = tmp_path / "conductor.prom"
    below = run_check_local(
        pipeline_root=tmp_path / "kfp",
        traffic_store=str(store),
        model_name=name,
        window_hours=0.0,
        min_tasks=30,
        fit_limit=60,
        mlflow_tracking_uri=uri,
        prom_textfile=str(textfile),
    )
    assert below is True  # the micro Conductor is below the floor (module docstring)
    families = text_string_to_metric_families(textfile.read_text())
    gauges = {s.name: s.value for f in families for s in f.samples}
    assert gauges["conductor_champion_below_floor"] == 1.0
    assert gauges["conductor_champion_check_questions"] == 40
    c = mlflow_utils.client()
    assert c.get_model_version(name, "1").tags["check.below_floor"] == "true"
    exp = c.get_experiment_by_name(f"{name}-loop")
    [run] = c.search_runs([exp.experiment_id], "tags.`loop.step` = 'check'")
    assert run.data.metrics["check/below_floor"] == 1.0 and run.data.metrics["check/n"] == 40
