"""Privacy at rest: a private request's text is stored nowhere other requests read (issue 23,
finding 3).

A live worker with the pool's response cache (sqlite, and a real SeaweedFS S3 server) runs a
private request, then a public one with the same question: the shared store holds nothing of
the private one, and the public request is not answered from it (it makes its own HTTP call, so
nothing about the private question shows in its speed). An optional separate private store
(``cache_private``) serves private requests only. ``record export`` leaves serving traffic out
unless asked and private entries always.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rl_conductor.cli import app
from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.tasks.base import Task
from rl_conductor.workers.base import CallContext, Completion
from rl_conductor.workers.cache import CachedWorker, S3CacheStore, SqliteCacheStore
from rl_conductor.workers.cache_export import export_cache
from rl_conductor.workers.live.testing import Reply, Request, ok, scripted_server
from rl_conductor.workers.pool import PoolConfigError, build_pool
from rl_conductor.workflow import Step, Workflow

SECRET = "patient 4471 tested positive for condition QX-93"
ANSWER = "answer about QX-93"


def _spec(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "local",
        "kind": "openai",
        "model": "test-model",
        "base_url": url,
        "price_in": 0.1,
        "price_out": 0.2,
        "hosting": "self",  # private requests may only reach self-hosted workers
        "retries": {"attempts": 1},
        "timeout_s": 5,
        **extra,
    }


def _echo(req: Request) -> Reply:
    return ok("openai", ANSWER, input_tokens=12, output_tokens=5)


def _task(source: str = "request") -> Task:
    return Task(id="request/abc", question=SECRET, answer="", domain="unknown", source=source, grader="qa")


async def _ask(pool: Any, sensitivity: str, task: Task | None = None) -> Any:
    wf = Workflow(steps=(Step(0, "answer", ()),))
    return await execute(wf, task or _task(), pool.view(), RequestLimits(sensitivity=sensitivity))  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["sqlite", "s3"])
async def test_private_requests_never_enter_the_shared_cache(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        where: str = str(tmp_path / "cache.sqlite")
        reader: Any = SqliteCacheStore(Path(where))
    else:
        where = f"{request.getfixturevalue('s3_bucket')}/cache"
        reader = S3CacheStore(where)
    with scripted_server("openai", default=_echo) as srv:
        pool = build_pool({"cache": where, "workers": [_spec(srv.base_url)]})
        private = await _ask(pool, "private")
        assert private.final_answer == ANSWER and len(srv.requests) == 1
        assert not list(reader.rows()), "a private request was written to the shared cache"
        if backend == "sqlite":
            raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("cache.sqlite"))
            assert b"QX-93" not in raw
        # a public request with the same question is not answered from anything the private one left
        public = await _ask(pool, "public")
        assert len(srv.requests) == 2 and not public.steps[0].cached
        again = await _ask(pool, "public")  # public requests still share the cache among themselves
        assert len(srv.requests) == 2 and again.steps[0].cached
        # and a private request is never answered from the shared (public) cache either
        await _ask(pool, "private")
        assert len(srv.requests) == 3
    rows = list(reader.rows())
    assert [r["sensitivity"] for r in rows] == ["public"] and rows[0]["origin"] == "serving"


async def test_a_separate_private_store_serves_private_requests_only(tmp_path: Path) -> None:
    shared, private_db = tmp_path / "shared.sqlite", tmp_path / "private.sqlite"
    with scripted_server("openai", default=_echo) as srv:
        pool = build_pool(
            {"cache": str(shared), "cache_private": str(private_db), "workers": [_spec(srv.base_url)]}
        )
        await _ask(pool, "private")
        await _ask(pool, "private")  # a hit, from the private store
        assert len(srv.requests) == 1
        await _ask(pool, "public")  # a miss: the shared store knows nothing of it
        assert len(srv.requests) == 2
    private_rows = list(SqliteCacheStore(private_db).rows())
    assert [r["sensitivity"] for r in private_rows] == ["private"]
    assert [r["sensitivity"] for r in SqliteCacheStore(shared).rows()] == ["public"]


def test_private_store_must_not_be_the_shared_one(tmp_path: Path) -> None:
    db = str(tmp_path / "c.sqlite")
    with pytest.raises(PoolConfigError, match="cache_private"):
        build_pool({"cache": db, "cache_private": db, "workers": [_spec("http://127.0.0.1:9/v1")]})
    with pytest.raises(PoolConfigError, match="cache_private"):
        build_pool(
            {"cache": "s3://b/cache", "cache_private": "s3://b/cache/p", "workers": [_spec("http://x/v1")]}
        )


class _Answer:
    """A worker that answers at once (to fill a store with entries of each kind)."""

    def __init__(self) -> None:
        from rl_conductor.workers.fake import fake_info

        self.info = fake_info("w")

    async def complete(
        self, messages: Any, *, max_tokens: int, temperature: float, context: Any = None
    ) -> Any:
        return Completion(text="\\boxed{4}", input_tokens=3, output_tokens=2, cost_usd=1e-6, latency_s=0.0)


async def _filled(tmp_path: Path) -> tuple[Path, Path]:
    """A shared store with a benchmark item's entry and a served request's, and a private store."""
    shared, private = tmp_path / "shared.sqlite", tmp_path / "private.sqlite"
    worker = CachedWorker(
        inner=_Answer(), store=SqliteCacheStore(shared), private_store=SqliteCacheStore(private)
    )
    item = Task(id="math/7", question="2+2?", answer="4", domain="math", source="gsm8k", grader="math")
    for task, sensitivity in ((item, "public"), (_task(), "public"), (_task(), "private")):
        msgs = [{"role": "user", "content": task.question}]
        ctx = CallContext(task=task, sensitivity=sensitivity)
        await worker.complete(msgs, max_tokens=64, temperature=0.2, context=ctx)
    return shared, private


async def test_record_export_leaves_out_serving_traffic_and_never_exports_private(tmp_path: Path) -> None:
    shared, private = await _filled(tmp_path)
    out = tmp_path / "rec.jsonl"
    stats = export_cache(SqliteCacheStore(shared), out)
    assert (stats["items"], stats["serving_skipped"], stats["private_skipped"]) == (1, 1, 0)
    assert SECRET not in out.read_text(encoding="utf-8")
    stats = export_cache(SqliteCacheStore(shared), out, include_serving=True)
    assert stats["items"] == 2 and SECRET in out.read_text(encoding="utf-8")
    # pointed at the private store, nothing comes out, with or without serving traffic
    stats = export_cache(SqliteCacheStore(private), out, include_serving=True)
    assert (stats["items"], stats["private_skipped"]) == (0, 1)
    assert SECRET not in out.read_text(encoding="utf-8")


def test_record_export_never_exports_serving_entries_of_unknown_sensitivity(tmp_path: Path) -> None:
    """Entries written before private requests were kept out of the cache carry no marker: any
    served question among them may be private, so none is exported, even with include_serving."""
    store = SqliteCacheStore(tmp_path / "old.sqlite")
    row = {"key": "k1", "worker": "w", "created": 1.0, "task": _task().to_dict(), "text": "x",
           "input_tokens": 1, "output_tokens": 1, "cost_usd": 0.0, "latency_s": 0.0}  # fmt: skip
    store.put("k1", row)
    stats = export_cache(store, tmp_path / "rec.jsonl", include_serving=True)
    assert (stats["items"], stats["private_skipped"]) == (0, 1)


async def test_record_export_cli_says_what_it_left_out(tmp_path: Path) -> None:
    shared, _ = await _filled(tmp_path)
    out = tmp_path / "rec.jsonl"
    result = CliRunner().invoke(app, ["record", "export", "--cache", str(shared), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 items" in result.output and "left out: 1 serving, 0 private" in result.output
    assert SECRET not in out.read_text(encoding="utf-8")
    result = CliRunner().invoke(
        app, ["record", "export", "--cache", str(shared), "--out", str(out), "--include-serving"]
    )
    assert result.exit_code == 0 and "2 items" in result.output


def test_serving_traces_keep_no_private_text(mlflow_db_template: Path, tmp_path: Path) -> None:
    """The predictor's MLflow traces (a tracking store every operator reads) get a private
    request's question, answer and plan text as their length only; a public one's as they are.
    The plan text was kept whole: a Conductor's subtasks quote the question."""
    import shutil

    import mlflow

    from rl_conductor.serving.request import ConductorRequest
    from rl_conductor.serving.service import _Tracer
    from rl_conductor.tracking import mlflow_utils

    db = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_db_template, db)
    previous = mlflow.get_tracking_uri()
    mlflow_utils.configure(f"sqlite:///{db}", artifact_root=str(tmp_path / "mlruns"))
    try:
        tracer = _Tracer("privacy-test")
        for i, sensitivity in enumerate(("private", "public")):
            request = ConductorRequest(question=SECRET, sensitivity=sensitivity)  # type: ignore[arg-type]
            doc = {
                "request_id": f"r{i}",
                "raw_plan": f"1. local: restate '{SECRET}' and answer it",
                "answer": ANSWER,
                "steps": [],
                "cost_usd": 0.0,
                "tokens": 0,
                "deadline_cut": False,
                "notes": [],
            }
            tracer.record(request, doc, [], 1_000_000_000, 2_000_000_000)
        mlflow.flush_trace_async_logging()
        exp = mlflow_utils.client().get_experiment_by_name("privacy-test")
        assert exp is not None
        traces = mlflow.search_traces(locations=[exp.experiment_id], return_type="list")
        by_id = {}
        for tr in traces:
            root = next(s for s in tr.data.spans if s.parent_id is None)
            by_id[root.attributes["request_id"]] = json.dumps(
                [root.inputs, root.outputs, root.attributes], ensure_ascii=False
            )
    finally:
        mlflow_utils.reset()
        mlflow.set_tracking_uri(previous)
        mlflow.set_registry_uri(previous)
    assert set(by_id) == {"r0", "r1"}
    assert "QX-93" not in by_id["r0"] and "[private:" in by_id["r0"]
    assert SECRET in by_id["r1"]  # public requests are traced as they are


def _echo_400(req: Request) -> Reply:
    """A self-hosted server's validation error that quotes the prompt (as vLLM's and llama.cpp's do)."""
    from rl_conductor.workers.live.testing import error, request_messages

    prompt = request_messages("openai", req.body)[-1][1]  # the user's message, with the question
    return error("openai", 400, message=f"prompt rejected: {prompt[-120:]!r}")


async def test_a_worker_error_echoing_a_private_question_is_neither_logged_nor_traced(
    mlflow_db_template: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The request's log line, the adapters' WARNING line and the MLflow trace keep the failed
    worker's name and its error's type; the worker's message, which quotes the private question,
    stays out of them (before: all three held it). The client's 502 body may say it."""
    import logging
    import shutil

    import mlflow

    from rl_conductor.policies.fixed import FixedPlan
    from rl_conductor.serving.request import ConductorRequest
    from rl_conductor.serving.server import WorkersFailed
    from rl_conductor.serving.service import ConductorService, _Tracer
    from rl_conductor.tracking import mlflow_utils

    caplog.set_level(logging.INFO)
    request = ConductorRequest(question=SECRET, sensitivity="private")
    with scripted_server("openai", default=_echo_400) as srv:
        service = ConductorService(FixedPlan([0]), build_pool({"workers": [_spec(srv.base_url)]}))
        doc = await service.answer(request)
    assert "QX-93" in json.dumps(srv.requests[0].body)  # the worker did get it, and echoed it
    assert doc["answer"] == "" and "QX-93" in doc["error"]  # the client's own body says why
    failed = WorkersFailed([doc], "v1", [request])
    logging.getLogger("rl_conductor.serving").warning("POST /v1 -> %d: %s", failed.status, failed.loggable)
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if '"conductor.request"' in r.getMessage()]
    assert line["error"] == "no worker could answer: local: PermanentWorkerError", line["error"]
    assert "local: PermanentWorkerError" in failed.loggable
    assert not [r.getMessage() for r in caplog.records if "QX-93" in r.getMessage()]

    db = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_db_template, db)
    previous = mlflow.get_tracking_uri()
    mlflow_utils.configure(f"sqlite:///{db}", artifact_root=str(tmp_path / "mlruns"))
    try:
        _Tracer("privacy-errors").record(request, doc, [], 1_000_000_000, 2_000_000_000)
        mlflow.flush_trace_async_logging()
        exp = mlflow_utils.client().get_experiment_by_name("privacy-errors")
        assert exp is not None
        (trace,) = mlflow.search_traces(locations=[exp.experiment_id], return_type="list")
        spans = json.dumps(
            [[s.inputs, s.outputs, s.attributes] for s in trace.data.spans], ensure_ascii=False
        )
    finally:
        mlflow_utils.reset()
        mlflow.set_tracking_uri(previous)
        mlflow.set_registry_uri(previous)
    assert len(trace.data.spans) == 2 and '"local"' in spans  # the step's span, its worker named
    assert "QX-93" not in spans
