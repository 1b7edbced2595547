"""The traffic log and the feedback routes (rl_conductor.loop.traffic / .feedback / .serving).

The log is tested on its own (batches, flush on close, retention, a full queue that drops instead
of blocking, S3 on the real SeaweedFS server) and through the real KServe predictor on loopback:
every answered request recorded with its workflow, per-step workers, tokens and cost; private
requests never in the public log (not at all without a private store, only there with one);
feedback authenticated, graded, idempotent, 409 on a conflict, 404 on an unknown id.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from predictor import Predictor, predictor, write_pool
from rl_conductor import storage
from rl_conductor.loop import traffic as tl
from rl_conductor.loop.feedback import read_feedback
from rl_conductor.serving.request import ConductorRequest

KEY = "k-traffic-0123456789abcdef"


def _doc(rid: str, answer: str = "42") -> dict[str, Any]:
    return {
        "request_id": rid,
        "answer": answer,
        "workflow": [{"worker": "w", "instruction": "solve", "access": []}],
        "steps": [{"index": 0, "worker": "w", "status": "ok", "input_tokens": 3, "output_tokens": 4}],
        "tokens": 7,
        "cost_usd": 0.001,
        "wall_s": 0.01,
    }


def test_records_are_batched_flushed_on_close_and_readable(tmp_path: Path) -> None:
    log = tl.TrafficLog(tl.TrafficConfig(store=str(tmp_path), batch_size=3, flush_interval_s=30))
    for i in range(7):
        log.submit(ConductorRequest(question=f"q{i}"), _doc(f"r{i}"), "v1")
    log.close()  # two full batches and the rest, written on close
    files = tl.batch_files(str(tmp_path))
    assert len(files) == 3
    rows = tl.read_traffic(str(tmp_path))
    assert [r["request_id"] for r in rows] == [f"r{i}" for i in range(7)]
    assert rows[0]["question"] == "q0" and rows[0]["steps"][0]["worker"] == "w" and rows[0]["tokens"] == 7
    assert tl.read_traffic(str(tmp_path), since=time.time() + 60) == []


def test_feedback_lookups_read_one_batch_file_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An id the log wrote (this process or an earlier one) is found by reading its one batch file;
    an unknown id reads none (before: every batch file of the store, for each such feedback); the
    location index is bounded."""
    earlier = tl.TrafficLog(tl.TrafficConfig(store=str(tmp_path), batch_size=2, index_size=1))
    for i in range(6):
        earlier.submit(ConductorRequest(question=f"q{i}"), _doc(f"old{i}"), "v1")
    earlier.close()
    assert len(tl.batch_files(str(tmp_path))) == 3
    monkeypatch.setattr(tl, "LOCATION_INDEX_SIZE", 4)
    log = tl.TrafficLog(tl.TrafficConfig(store=str(tmp_path), batch_size=1, index_size=1))
    log.flush()  # the start-up indexing is done
    reads: list[str] = []
    real_read = storage.read_text
    monkeypatch.setattr(storage, "read_text", lambda uri: reads.append(uri) or real_read(uri))
    assert log.lookup("nope") is None and reads == []
    found = log.lookup("old5")
    assert isinstance(found, dict) and found["question"] == "q5" and len(reads) == 1
    for i in range(3):
        log.submit(ConductorRequest(question=f"n{i}"), _doc(f"new{i}"), "v1")
    log.flush()
    reads.clear()
    found = log.lookup("new0")  # out of the one-record id index: from its file
    assert isinstance(found, dict) and found["question"] == "n0" and len(reads) == 1
    assert len(log._where) == 4  # bounded: the oldest ids fell out, and are unknown
    reads.clear()
    assert log.lookup("old0") is None and reads == []
    log.close()


def test_retention_and_size_cap_delete_the_oldest_batches(tmp_path: Path) -> None:
    store = str(tmp_path)
    day = 86_400.0
    now = time.time()
    for age_days in (40, 20, 10, 0):
        storage.write_bytes(tl.batch_uri(store, now - age_days * day), b'{"request_id": "x", "ts": 0}\n' * 10)
    assert tl.sweep(store, retention_days=30, max_bytes=None, now=now) == 1
    assert len(tl.batch_files(store)) == 3
    size = tl.batch_files(store)[0][2]
    assert tl.sweep(store, retention_days=None, max_bytes=size * 2, now=now) == 1
    kept = tl.batch_files(store)
    assert len(kept) == 2 and kept[-1][1] / 1000 > now - 1  # the newest stays


def test_a_full_queue_drops_instead_of_blocking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    real = storage.write_bytes

    def slow_write(uri: str, data: bytes) -> None:
        gate.wait(10)
        real(uri, data)

    monkeypatch.setattr(storage, "write_bytes", slow_write)
    log = tl.TrafficLog(tl.TrafficConfig(store=str(tmp_path), batch_size=1, max_queue=2))
    before = tl.DROPPED.labels("queue_full")._value.get()
    started = time.perf_counter()
    for i in range(20):
        log.submit(ConductorRequest(question=f"q{i}"), _doc(f"r{i}"), "v1")
    elapsed = time.perf_counter() - started
    dropped = tl.DROPPED.labels("queue_full")._value.get() - before
    gate.set()
    log.close()
    assert dropped >= 15  # the writer holds one, the queue two: the rest were dropped, not waited for
    assert elapsed < 5  # generous: a blocking submit would wait the writer's 10 s
    assert len(tl.read_traffic(str(tmp_path))) == 20 - dropped


def test_private_requests_need_a_private_store_other_than_the_public_one(tmp_path: Path) -> None:
    from rl_conductor.validation import InvalidValue

    with pytest.raises(InvalidValue, match="other than --traffic_store"):
        tl.TrafficConfig(store=str(tmp_path / "a"), private_store=str(tmp_path / "a" / "."))
    public, private = tmp_path / "public", tmp_path / "private"
    log = tl.TrafficLog(tl.TrafficConfig(store=str(public)))
    log.submit(ConductorRequest(question="secret", sensitivity="private"), _doc("p1"), "v1")
    log.submit(ConductorRequest(question="open"), _doc("o1"), "v1")
    log.close()
    assert [r["request_id"] for r in tl.read_traffic(str(public))] == ["o1"]
    assert log.lookup("p1") == tl.PRIVATE_NOT_RECORDED
    log = tl.TrafficLog(tl.TrafficConfig(store=str(public), private_store=str(private)))
    log.submit(ConductorRequest(question="secret", sensitivity="private"), _doc("p2"), "v1")
    log.close()
    assert [r["request_id"] for r in tl.read_traffic(str(private))] == ["p2"]
    assert "p2" not in {r["request_id"] for r in tl.read_traffic(str(public))}


def test_the_log_writes_to_s3(s3_bucket: str) -> None:
    store = f"{s3_bucket}/serving"
    log = tl.TrafficLog(tl.TrafficConfig(store=store, batch_size=2))
    for i in range(3):
        log.submit(ConductorRequest(question=f"q{i}"), _doc(f"s{i}"), "openai")
    log.close()
    assert [r["request_id"] for r in tl.read_traffic(store)] == ["s0", "s1", "s2"]
    assert tl.find_record(store, "s1")["question"] == "q1"


# --------------------------------------------------------------------------- the real predictor


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Predictor, Path, Path]]:
    root = tmp_path_factory.mktemp("traffic")
    pool = write_pool(root / "pool.yaml")
    public, private = root / "public", root / "private"
    args = ["--policy", "fixed:2,0", "--pool", str(pool), "--traffic_store", str(public)]
    args += ["--traffic_private_store", str(private), "--traffic_flush_interval_s", "0.2"]
    with predictor(args, root, env={"CONDUCTOR_API_KEYS": KEY}, cli=True) as srv:  # the loop: conductor serve
        yield srv, public, private


@pytest.fixture(scope="module")
def http(served: tuple[Predictor, Path, Path]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[0].url, timeout=30, headers={"authorization": f"Bearer {KEY}"}) as c:
        yield c


def _ask(http: httpx.Client, question: str, **fields: Any) -> dict[str, Any]:
    resp = http.post("/v1/models/conductor:predict", json={"instances": [{"question": question, **fields}]})
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["predictions"][0])


def _wait_for(store: Path, rid: str) -> dict[str, Any]:
    for _ in range(100):
        found = tl.find_record(str(store), rid)
        if found is not None:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{rid} never reached {store}")


def test_served_requests_are_recorded_with_workflow_workers_and_cost(
    http: httpx.Client, served: tuple[Predictor, Path, Path]
) -> None:
    _, public, private = served
    doc = _ask(http, "What is 6 * 7?")
    rec = _wait_for(public, doc["request_id"])
    assert rec["question"] == "What is 6 * 7?" and rec["answer"] == doc["answer"]
    assert [s["worker"] for s in rec["steps"]] == ["cloud-x", "local-a"]
    assert rec["cost_usd"] == pytest.approx(doc["cost_usd"]) and rec["tokens"] == doc["tokens"] > 0
    assert rec["latency_s"] > 0 and rec["time"].endswith("+00:00") and rec["endpoint"] == "v1"
    assert [w["worker"] for w in rec["workflow"]] == ["cloud-x", "local-a"]
    assert tl.find_record(str(private), doc["request_id"]) is None


def test_private_requests_go_only_to_the_private_store(
    http: httpx.Client, served: tuple[Predictor, Path, Path]
) -> None:
    _, public, private = served
    docs = [_ask(http, f"private question {i}", sensitivity="private") for i in range(5)]
    for d in docs:
        assert _wait_for(private, d["request_id"])["sensitivity"] == "private"
    public_text = "".join(storage.read_text(u) for u, *_ in tl.batch_files(str(public)))
    assert "private question" not in public_text
    assert not [r for r in tl.read_traffic(str(public)) if r["sensitivity"] != "public"]


def test_feedback_is_authenticated_graded_idempotent_and_refuses_conflicts(
    http: httpx.Client, served: tuple[Predictor, Path, Path]
) -> None:
    srv, public, _ = served
    doc = _ask(http, "What is 6 * 7?")
    _wait_for(public, doc["request_id"])
    body = {"request_id": doc["request_id"], "answer": "42", "grader": "math"}
    assert httpx.post(f"{srv.url}/v1/feedback", json=body).status_code == 401  # no key
    first = http.post("/v1/feedback", json=body)
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "recorded"
    fb = first.json()["feedback"]
    assert fb["correct"] is True and fb["reward"] == 1.0  # the fake worker answers "A: 42"
    again = http.post("/v1/feedback", json=body)
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    conflict = http.post("/v1/feedback", json={"request_id": doc["request_id"], "score": 0.1})
    assert conflict.status_code == 409 and "already has different feedback" in conflict.json()["error"]
    stored = read_feedback(str(public))
    assert list(stored) == [doc["request_id"]] or doc["request_id"] in stored
    assert stored[doc["request_id"]]["answer"] == "42"
    unknown = http.post("/v1/feedback", json={"request_id": "nope", "score": 1})
    assert unknown.status_code == 404 and "unknown request_id 'nope'" in unknown.json()["error"]
    for bad, field in (({"request_id": "x"}, "score"), ({"request_id": "x", "score": 1.5}, "score")):
        resp = http.post("/v1/feedback", json=bad)
        assert resp.status_code == 400 and field in resp.json()["error"]


def test_openai_route_feedback_by_completion_id(
    http: httpx.Client, served: tuple[Predictor, Path, Path]
) -> None:
    _, public, _ = served
    resp = http.post(
        "/openai/v1/chat/completions",
        json={"model": "conductor", "messages": [{"role": "user", "content": "Name a prime."}]},
    )
    assert resp.status_code == 200, resp.text
    cid = resp.json()["id"]
    assert _wait_for(public, cid)["endpoint"] == "openai"
    ok = http.post("/openai/v1/feedback", json={"request_id": cid, "score": 0.25})
    assert ok.status_code == 200 and ok.json()["object"] == "feedback"
    assert ok.json()["feedback"]["reward"] == 0.25
    missing = http.post("/openai/v1/feedback", json={"request_id": "chatcmpl-none", "score": 0.5})
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"


def test_without_a_private_store_private_requests_are_not_recorded(tmp_path: Path) -> None:
    pool = write_pool(tmp_path / "pool.yaml")
    public = tmp_path / "public"
    args = ["--policy", "fixed:0", "--pool", str(pool), "--traffic_store", str(public)]
    args += ["--traffic_flush_interval_s", "0.2"]
    with predictor(args, tmp_path, cli=True) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        private = [_ask(http, f"secret {i}", sensitivity="private") for i in range(4)]
        public_doc = _ask(http, "open question")
        _wait_for(public, public_doc["request_id"])
        refused = http.post("/v1/feedback", json={"request_id": private[0]["request_id"], "score": 1})
        assert refused.status_code == 422 and "private" in refused.json()["error"]
    rows = tl.read_traffic(str(public))
    assert [r["request_id"] for r in rows] == [public_doc["request_id"]]
    assert "secret" not in json.dumps(rows)


def test_bad_traffic_flags_are_one_line_and_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    pool = write_pool(tmp_path / "pool.yaml")
    cmd = [sys.executable, "-m", "rl_conductor.cli", "serve", "--policy", "fixed:0", "--pool", str(pool)]
    cmd += ["--auth", "none", "--traffic_store", str(tmp_path), "--traffic_private_store", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("Error:") and "--traffic_private_store" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_batches_written_in_the_same_millisecond_read_back_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen clock (every batch in one millisecond) still reads the records in write order:
    CI once read r6 before r3 when two batches shared their name's millisecond."""
    frozen = time.time()
    monkeypatch.setattr(tl.time, "time", lambda: frozen)
    log = tl.TrafficLog(tl.TrafficConfig(store=str(tmp_path), batch_size=1, flush_interval_s=30))
    for i in range(12):
        log.submit(ConductorRequest(question=f"q{i}"), _doc(f"r{i}"), "v1")
    log.close()
    assert len(tl.batch_files(str(tmp_path))) == 12
    assert [r["request_id"] for r in tl.read_traffic(str(tmp_path))] == [f"r{i}" for i in range(12)]
