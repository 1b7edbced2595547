"""``conductor pool check``: each worker called once over real HTTP, failures named with a fix.

The servers are :func:`~rl_conductor.workers.live.byo_server.byo_openai_server`: real loopback
HTTP servers that answer as llama.cpp's ``llama-server`` does (routes under ``/v1`` only, 404
``File Not Found`` elsewhere, 401 ``Invalid API Key`` without the right bearer token). The pool
check on ``local-live`` against two real ``conductor worker serve`` processes is in
``tests/test_local_worker.py`` (it shares that module's servers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_conductor.workers.check import check_pool, check_pool_file
from rl_conductor.workers.live.byo_server import byo_openai_server
from rl_conductor.workers.pool import build_pool

KEY = "sk-local-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[1]


def _entry(name: str, url: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "openai",
        "model": "m",
        "base_url": url,
        "price_in": 1.0,
        "price_out": 2.0,
        "hosting": "external",
        **extra,
    }


def _conductor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rl_conductor.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=full,
    )


def test_pool_check_names_every_broken_worker_and_exits_1(tmp_path: Path) -> None:
    with byo_openai_server(api_key=KEY, model="m") as srv:
        pool = {
            "name": "byo",
            "cache": str(tmp_path / "cache.sqlite"),  # never used by a check
            "workers": [
                _entry("good", f"{srv.root}/v1", api_key_env="RLC_GOOD_KEY"),
                _entry("wrong-path", f"{srv.root}/openai/v1", api_key_env="RLC_GOOD_KEY"),
                _entry("wrong-key", f"{srv.root}/v1", api_key_env="RLC_WRONG_KEY"),
                _entry("no-key", f"{srv.root}/v1", api_key_env="RLC_UNSET_KEY"),
                _entry("down", "http://127.0.0.1:9/v1"),
            ],
        }
        path = tmp_path / "byo.yaml"
        path.write_text(yaml.safe_dump(pool))
        env = {"RLC_GOOD_KEY": KEY, "RLC_WRONG_KEY": "sk-wrong-0123456789", "RLC_UNSET_KEY": ""}
        res = _conductor("pool", "check", str(path), "--json", str(tmp_path / "check.json"), env=env)
        table = _conductor("pool", "check", str(path), env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads((tmp_path / "check.json").read_text())
    rows = {w["name"]: w for w in report["workers"]}
    assert not report["ok"] and list(rows) == ["good", "wrong-path", "wrong-key", "no-key", "down"]
    good = rows["good"]
    assert good["ok"] and good["input_tokens"] > 0 and good["output_tokens"] > 0 and good["cost_usd"] > 0
    assert good["latency_s"] > 0
    assert rows["wrong-path"]["status"] == "error" and "HTTP 404" in rows["wrong-path"]["detail"]
    assert "llama.cpp and vLLM serve the OpenAI API under /v1" in rows["wrong-path"]["detail"]
    assert f"{srv.root}/openai/v1" in rows["wrong-path"]["detail"]
    assert "HTTP 401" in rows["wrong-key"]["detail"] and "RLC_WRONG_KEY" in rows["wrong-key"]["detail"]
    assert rows["no-key"]["status"] == "config" and "RLC_UNSET_KEY is not set" in rows["no-key"]["detail"]
    assert rows["down"]["status"] == "error" and "is the server running" in rows["down"]["detail"]
    assert "sk-wrong" not in res.stdout + res.stderr + (tmp_path / "check.json").read_text()
    # the table and one line per failure, then the one-line summary on stderr
    assert table.returncode == 1 and "good" in table.stdout and "wrong-path:" in table.stdout
    assert "4 of 5 workers failed" in table.stderr
    # each worker was asked exactly once (no retries, no cache): good, wrong-path, wrong-key
    assert len(srv.requests) == 2 * 3
    assert not (tmp_path / "cache.sqlite").exists()


def test_pool_check_exits_0_when_every_worker_answers(tmp_path: Path) -> None:
    with byo_openai_server(model="m") as a, byo_openai_server(model="m") as b:
        path = tmp_path / "ok.yaml"
        path.write_text(
            yaml.safe_dump(
                {"name": "ok", "workers": [_entry("a", f"{a.root}/v1"), _entry("b", f"{b.root}/v1")]}
            )
        )
        res = _conductor("pool", "check", str(path), "--json", "-")
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["ok"] and [w["status"] for w in report["workers"]] == ["ok", "ok"]


def test_pool_check_of_a_missing_pool_is_a_usage_error() -> None:
    res = _conductor("pool", "check", "no-such-pool")
    assert res.returncode == 2 and res.stderr.startswith("Error: no pool named")


def test_check_pool_calls_beneath_the_cache(tmp_path: Path) -> None:
    """The library function (for the predictor's readiness): a built pool, its cache bypassed."""
    with byo_openai_server(model="m") as srv:
        pool = build_pool({"cache": str(tmp_path / "c.sqlite"), "workers": [_entry("a", f"{srv.root}/v1")]})
        first, second = check_pool(pool), check_pool(pool)
    assert first.ok and second.ok and len(srv.requests) == 2  # a cached answer proves nothing


def test_ensure_pool_ready_names_the_worker_that_does_not_answer() -> None:
    from rl_conductor.workers.check import PoolNotReady, ensure_pool_ready

    with byo_openai_server(model="m") as srv:
        good = build_pool({"name": "ready", "workers": [_entry("a", f"{srv.root}/v1")]})
        assert ensure_pool_ready(good).ok
        bad = build_pool(
            {"name": "half", "workers": [_entry("a", f"{srv.root}/v1"), _entry("b", f"{srv.root}/openai/v1")]}
        )
        with pytest.raises(PoolNotReady, match=r"pool half: 1 of 2 workers failed: b \(error: HTTP 404"):
            ensure_pool_ready(bad)


def test_a_pool_without_endpoints_checks_ok() -> None:
    report = check_pool_file("paper-sim")
    assert report.ok and {w.status for w in report.workers} == {"ok"}
    replay = check_pool_file("routellm-replay")  # no endpoint: every recorded item is replayed
    assert replay.ok and {w.status for w in replay.workers} == {"ok"}
    assert all(w.replay and w.replay["replayed"] == w.replay["items"] > 4000 for w in replay.workers)


def _recordings_pool(tmp_path: Path) -> Path:
    """Three replay workers: ``a`` sound (one answer longer than max_tokens), ``b`` missing two
    items and recorded at three times its pool prices, ``c`` recorded above a call's worst case."""
    rows = []
    for i in range(6):
        ok = {"text": f"#### {i + 1}", "correct": True, "input_tokens": 100, "output_tokens": 50}
        responses: dict[str, Any] = {"a": {**ok, "cost_usd": 150 / 1e6}}
        if i == 5:
            responses["a"] = {"text": "x" * 30_000 + f" #### {i + 1}", "correct": True}
        if i < 4:
            responses["b"] = {**ok, "correct": i % 2 == 0, "cost_usd": 3 * 150 / 1e6}
        responses["c"] = {**ok, "cost_usd": 1.0 if i == 0 else 150 / 1e6}
        rows.append({"id": f"x/{i}", "question": f"What is {i} + 1?", "answer": str(i + 1), "grader": "math",
                     "domain": "math", "responses": responses})  # fmt: skip
    rec = tmp_path / "rec.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pool = tmp_path / "rec.yaml"
    pool.write_text(yaml.safe_dump({"name": "rec", "recordings": str(rec), "workers": [
        {"name": n, "kind": "replay", "price_in": 1.0, "price_out": 1.0} for n in "abc"]}))  # fmt: skip
    return pool


def test_pool_check_replays_a_recordings_file_and_says_what_a_run_would_meet(tmp_path: Path) -> None:
    report = check_pool_file(_recordings_pool(tmp_path))
    a, b, c = report.workers
    assert a.status == "ok" and a.replay is not None
    assert a.replay == {"items": 6, "replayed": 6, "missing": 0, "failed": 0, "cut": 1, "max_tokens": 4096,
                        "recorded_accuracy": 1.0, "price_ratio": pytest.approx(1), "errors": {}}  # fmt: skip
    assert "1 longer than max_tokens 4096" in a.detail and "cost_usd" not in a.detail
    assert b.status == "ok" and b.replay is not None
    assert (b.replay["replayed"], b.replay["missing"], b.replay["recorded_accuracy"]) == (4, 2, 0.5)
    assert "2 without a recording of 'b'" in b.detail
    assert "recorded cost_usd is 3x the pool's prices" in b.detail
    assert b.cost_usd == pytest.approx(3 * 150 / 1e6)  # per replayed item, as recorded
    assert c.status == "error" and not report.ok
    assert (
        c.detail.startswith("1 of 6 items cannot be replayed:") and "above this call's worst case" in c.detail
    )


def test_pool_check_cli_prints_each_replay_and_exits_1_for_one_that_cannot_replay(tmp_path: Path) -> None:
    pool = _recordings_pool(tmp_path)
    out = tmp_path / "report.json"
    res = _conductor("pool", "check", str(pool), "--json", str(out))
    assert res.returncode == 1, res.stdout + res.stderr
    flat = " ".join(res.stdout.split())
    assert "a: replayed 6/6 items, recorded accuracy 100.0%" in flat
    assert "c: 1 of 6 items cannot be replayed" in flat
    assert "Error: 1 of 3 workers failed: c (error)" in res.stderr
    saved = json.loads(out.read_text())
    assert [w["replay"]["replayed"] for w in saved["workers"]] == [6, 4, 5]


# --------------------------------------------------------------------------- the BYO docs page


def _doc_pool() -> str:
    """The pool YAML of docs/byo-openai-server.md (its block marked ``# byo.yaml``)."""
    text = (ROOT / "docs" / "byo-openai-server.md").read_text()
    blocks = text.split("```yaml\n")[1:]
    found = [b.split("```", 1)[0] for b in blocks if b.startswith("# byo.yaml")]
    assert len(found) == 1, "docs/byo-openai-server.md must hold one ```yaml block starting '# byo.yaml'"
    return found[0]


@pytest.mark.parametrize("prefix", ["/v1"])
def test_the_docs_pool_works_against_a_v1_server(tmp_path: Path, prefix: str) -> None:
    with (
        byo_openai_server(prefix=prefix, model="smollm2", api_key=KEY) as llama,
        byo_openai_server(prefix=prefix, model="qwen2.5-7b", api_key=KEY) as vllm,
    ):
        path = tmp_path / "byo.yaml"
        path.write_text(_doc_pool())
        env = {
            "LLAMA_URL": f"{llama.root}{prefix}",
            "VLLM_URL": f"{vllm.root}{prefix}",
            "LLAMA_API_KEY": KEY,
            "VLLM_API_KEY": KEY,
        }
        res = _conductor("pool", "check", str(path), "--json", "-", env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        report = json.loads(res.stdout)
        assert [w["status"] for w in report["workers"]] == ["ok", "ok"]
        # the same file, evaluated with the page's policy specs
        out = tmp_path / "eval.json"
        ev = _conductor(
            *("eval", "--pool", str(path), "--limit", "2", "--json", str(out)),
            *("--policy", "single:llama-local", "--policy", "moa:llama-local,vllm-local>vllm-local"),
            *("--policy", "fixed:0,1"),
            env=env,
        )
        assert ev.returncode == 0, ev.stdout + ev.stderr
        policies = [r["policy"] for r in json.loads(out.read_text())["results"]]
        assert policies == ["single:llama-local", "moa:llama-local,vllm-local>vllm-local", "fixed:0,1"]
        # the page's commonest mistake: KServe's /openai/v1 on a /v1 server
        broken = _conductor(
            "pool", "check", str(path), "--json", "-", env={**env, "LLAMA_URL": f"{llama.root}/openai/v1"}
        )
    assert broken.returncode == 1
    llama_row = json.loads(broken.stdout)["workers"][0]
    assert "HTTP 404" in llama_row["detail"] and "serve the OpenAI API under /v1" in llama_row["detail"]


def test_pool_check_json_into_a_path_that_cannot_be_written_is_one_line_exit_2(tmp_path: Path) -> None:
    """Before: a traceback after every worker was called. Now: refused before any call."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with byo_openai_server(model="m") as a:
        path = tmp_path / "ok.yaml"
        path.write_text(yaml.safe_dump({"name": "ok", "workers": [_entry("a", f"{a.root}/v1")]}))
        for target in (blocker / "x.json", tmp_path):
            res = _conductor("pool", "check", str(path), "--json", str(target))
            assert res.returncode == 2, res.stdout + res.stderr
            lines = res.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("Error: --json ") and "cannot write" in lines[0]
            assert "Traceback" not in res.stderr
        assert a.requests == []  # refused before any worker was called


def _rows(n: int, **responses: Any) -> list[dict[str, Any]]:
    """``n`` math items, each with ``responses`` (model -> response) as given."""
    return [{"id": f"x/{i}", "question": f"What is {i} + 1?", "answer": str(i + 1), "grader": "math",
             "domain": "math", "responses": dict(responses)} for i in range(n)]  # fmt: skip


def _pool(
    tmp_path: Path, name: str, rows: list[dict[str, Any]], workers: list[dict[str, Any]], **extra: Any
) -> Path:
    rec = tmp_path / f"{name}.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pool = tmp_path / f"{name}.yaml"
    pool.write_text(yaml.safe_dump({"name": name, "recordings": str(rec), "workers": workers, **extra}))
    return pool


def test_pool_check_replays_at_the_workers_own_output_cap(tmp_path: Path) -> None:
    """A worker's ``max_output_tokens`` caps its calls in a run (executor._affordable_cap): the check
    cuts and prices at that cap too, rather than reporting answers a run would cut as whole."""
    long = {"text": "y" * 8_000 + " #### {}", "correct": True}
    rows = [
        {**r, "responses": {"a": {**long, "text": long["text"].format(i + 1)}}}
        for i, r in enumerate(_rows(3))
    ]
    pool = _pool(tmp_path, "capped", rows, [{"name": "a", "kind": "replay", "price_in": 1.0, "price_out": 1.0,
                                             "max_output_tokens": 1000}])  # fmt: skip
    (a,) = check_pool_file(pool).workers
    assert a.replay is not None and a.replay["max_tokens"] == 1000 and a.replay["cut"] == 3
    assert a.output_tokens == 1000 and "3 longer than max_tokens 1000" in a.detail


def test_pool_check_asks_a_worker_with_its_own_file_the_pools_items(tmp_path: Path) -> None:
    """In the built pool the first replay worker's file names the dataset; a later worker with a file
    of its own is asked those items (and has none of them): the check says so, as a run would find."""
    own = tmp_path / "own.jsonl"
    own.write_text(
        "".join(json.dumps({**r, "id": f"y/{i}"}) + "\n" for i, r in enumerate(_rows(2, b={"correct": True})))
    )
    prices = {"kind": "replay", "price_in": 1.0, "price_out": 1.0}
    pool = _pool(tmp_path, "mixed", _rows(4, a={"correct": True}),
                 [{"name": "a", **prices}, {"name": "b", **prices, "recordings": str(own)}])  # fmt: skip
    a, b = check_pool_file(pool).workers
    assert a.replay is not None and a.replay["replayed"] == 4
    assert b.replay is not None and (b.replay["items"], b.replay["missing"]) == (4, 4) and b.status == "error"


def test_pool_check_words_its_findings_as_a_run_would_meet_them(tmp_path: Path) -> None:
    # recorded at 1x, 1x, 3x and 3x the pool's prices: the median is 2x
    costs = [150e-6, 150e-6, 450e-6, 450e-6]
    rows = _rows(4)
    for r, c in zip(rows, costs, strict=True):
        r["responses"] = {"a": {"text": f"#### {r['answer']}", "correct": True, "input_tokens": 100,
                                "output_tokens": 50, "cost_usd": c},
                          "t": {"text": f"#### {r['answer']}"}}  # fmt: skip
    rows[0]["responses"]["t"] = {"correct": False}  # t: three texts without a label, one label
    pool = _pool(tmp_path, "words", rows, [{"name": n, "kind": "replay", "price_in": 1.0, "price_out": 1.0}
                                           for n in ("a", "t")])  # fmt: skip
    a, t = check_pool_file(pool).workers
    assert a.replay is not None and a.replay["price_ratio"] == pytest.approx(2.0)
    assert "2x the pool's prices" in a.detail and "check price_in / price_out" in a.detail
    assert "recorded accuracy 0.0% (over the 1 labelled)" in t.detail


def test_pool_check_counts_one_cause_once_and_a_whole_answer_as_whole(tmp_path: Path) -> None:
    rows = _rows(3)
    for r in rows:  # every item recorded far above a call's worst case; and a text of exactly the cap
        whole = "z" * (4 * 4096 - 7) + f" #### {r['answer']}"  # 4,096 tokens as estimated
        r["responses"] = {"a": {"text": f"#### {r['answer']}", "correct": True, "cost_usd": 5.0},
                          "b": {"text": whole, "correct": True}}  # fmt: skip
    pool = _pool(tmp_path, "once", rows, [{"name": n, "kind": "replay", "price_in": 1.0, "price_out": 1.0}
                                          for n in ("a", "b")])  # fmt: skip
    a, b = check_pool_file(pool).workers
    assert a.status == "error" and a.replay is not None and list(a.replay["errors"].values()) == [3]
    assert "(3x; the first: task 'x/0' was recorded at $5," in a.detail  # its amounts, whole
    assert "recorded cost_usd" not in a.detail  # no tokens recorded: no price ratio to tell
    assert b.replay is not None and b.replay["cut"] == 0  # 4,096 tokens at a cap of 4,096: not cut


def test_pool_check_tells_the_price_ratio_where_no_item_replays(tmp_path: Path) -> None:
    """Prices far below the recorded costs make every item unreplayable: the ratio, read from the
    recordings rather than from replayed calls, still says which field to fix."""
    rows = _rows(3)
    for r in rows:
        r["responses"] = {"a": {"text": f"#### {r['answer']}", "correct": True, "input_tokens": 100,
                                "output_tokens": 50, "cost_usd": 150e-6}}  # fmt: skip
    pool = _pool(
        tmp_path, "cheap", rows, [{"name": "a", "kind": "replay", "price_in": 0.0001, "price_out": 0.0002}]
    )
    (a,) = check_pool_file(pool).workers
    assert a.status == "error" and a.replay is not None and a.replay["replayed"] == 0
    assert a.replay["price_ratio"] == pytest.approx(150e-6 / (100 * 0.0001e-6 + 50 * 0.0002e-6))
    assert "check price_in / price_out" in a.detail
