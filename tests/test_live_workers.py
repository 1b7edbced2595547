"""Live clients against real HTTP servers on loopback that speak each vendor's wire format.

Every test runs the official SDK (openai, anthropic, google-genai) over real HTTP against a
:class:`~rl_conductor.workers.live.testing.ScriptedServer` whose bodies follow the vendors'
documented examples: success and usage, usage absent, truncation, 429 with ``Retry-After``,
500, timeout, malformed body, permanent 4xx; then the executor's fallback, the circuit breaker,
the spend guard, the cache (sqlite and a real S3 server) and key redaction.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

import pytest

from _pools import pool_spend_guard
from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.tasks.base import Task
from rl_conductor.workers.base import CallContext, utf8_token_bound
from rl_conductor.workers.cache import CachedWorker, S3CacheStore, SqliteCacheStore
from rl_conductor.workers.live.base import LiveWorker
from rl_conductor.workers.live.resilience import (
    CircuitBreaker,
    CircuitOpenError,
    MalformedResponseError,
    PermanentWorkerError,
    TransientWorkerError,
    retry_after_seconds,
)
from rl_conductor.workers.live.spend import SpendLimitError
from rl_conductor.workers.live.testing import (
    Reply,
    Request,
    error,
    ok,
    scripted_server,
    success_body,
    worker_spec,
)
from rl_conductor.workers.pool import Pool, PoolConfigError, build_pool
from rl_conductor.workflow import Step, Workflow

VENDORS = ("openai", "anthropic", "gemini")
KEY = "sk-live-test-Zq8rW2xYv6"
KEY_VAR = "RLC_TEST_API_KEY"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 times 7?"}]
TASK = Task(id="t/1", question="What is 6 times 7?", answer="42", domain="math", source="t", grader="math")


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, KEY)


_spec = functools.partial(
    worker_spec,
    api_key_env=KEY_VAR,
    price_in=2.0,
    price_out=8.0,
    retries={"attempts": 3, "initial_s": 0.0, "jitter_s": 0.0},
    timeout_s=5,
)


class SleepRecorder:
    """Records the waits tenacity asks for instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def _worker(vendor: str, url: str, *, pool_opts: dict[str, Any] | None = None, **extra: Any) -> Any:
    pool = build_pool({"workers": [_spec(vendor, url, **extra)], **(pool_opts or {})})
    return pool.workers[0]


async def _call(worker: Any, max_tokens: int = 64) -> Any:
    return await worker.complete(MESSAGES, max_tokens=max_tokens, temperature=0.2)


# ------------------------------------------------------------------------------------ success


@pytest.mark.parametrize("vendor", VENDORS)
async def test_success_reports_the_servers_usage_and_prices_it(vendor: str) -> None:
    with scripted_server(vendor, [ok(vendor, "42", input_tokens=31, output_tokens=5)]) as srv:
        worker = _worker(vendor, srv.base_url)
        comp = await _call(worker, max_tokens=77)
    assert (comp.text, comp.input_tokens, comp.output_tokens) == ("42", 31, 5)
    assert comp.cost_usd == pytest.approx((31 * 2.0 + 5 * 8.0) / 1e6)
    assert comp.finish_reason == "stop" and not comp.tokens_estimated and comp.worker == "w"
    (req,) = srv.requests
    sent = req.path + json.dumps(req.body)  # Gemini names the model in the path
    assert "test-model" in sent and "What is 6 times 7?" in sent and "Be brief." in sent
    if vendor == "openai":
        assert req.path == "/v1/chat/completions" and req.body["max_tokens"] == 77
        assert req.body["messages"] == MESSAGES and req.body["temperature"] == 0.2
        assert req.headers["authorization"] == f"Bearer {KEY}"
    elif vendor == "anthropic":
        assert req.path == "/v1/messages" and req.body["max_tokens"] == 77
        assert req.body["system"] == "Be brief." and req.body["messages"] == MESSAGES[1:]
        assert KEY in req.headers.get("x-api-key", "") + req.headers.get("authorization", "")
    else:
        assert req.path == "/v1beta/models/test-model:generateContent"
        assert req.body["generationConfig"] == {"maxOutputTokens": 77, "temperature": 0.2}
        assert req.headers["x-goog-api-key"] == KEY


@pytest.mark.parametrize("vendor", VENDORS)
async def test_missing_usage_is_charged_its_worst_case_and_marked(vendor: str) -> None:
    """A server without usage may still bill hidden reasoning: the charge is what it could bill."""
    text = "The product is forty-two."
    with scripted_server(vendor, [ok(vendor, text, input_tokens=None, output_tokens=None)]) as srv:
        comp = await _call(_worker(vendor, srv.base_url), max_tokens=64)
    assert comp.tokens_estimated
    assert comp.output_tokens == 64
    assert comp.input_tokens == utf8_token_bound(MESSAGES)


@pytest.mark.parametrize("vendor", VENDORS)
async def test_truncated_output_is_reported_as_length(vendor: str) -> None:
    with scripted_server(vendor, [ok(vendor, "6 times 7 is", truncated=True)]) as srv:
        comp = await _call(_worker(vendor, srv.base_url))
    assert comp.finish_reason == "length" and comp.text == "6 times 7 is"


# ------------------------------------------------------------------------------------ failures


@pytest.mark.parametrize("vendor", VENDORS)
async def test_429_honours_retry_after_then_succeeds(vendor: str) -> None:
    script = [error(vendor, 429, retry_after="7"), error(vendor, 503), ok(vendor, "42")]
    with scripted_server(vendor, script) as srv:
        worker = _worker(vendor, srv.base_url, retries={"attempts": 3, "initial_s": 0.25, "jitter_s": 0})
        sleeper = SleepRecorder()
        worker.sleep = sleeper
        comp = await _call(worker)
    assert comp.text == "42" and len(srv.requests) == 3
    # the server's Retry-After (7 s) first, then exponential backoff (0.25 * 2) for the 503
    assert sleeper.waits == [7.0, 0.5]
    assert worker.stats().retries == 2 and worker.stats().failures == 0


async def test_retry_after_is_capped() -> None:
    with scripted_server("openai", [error("openai", 429, retry_after="3600")]) as srv:
        worker = _worker("openai", srv.base_url, retries={"attempts": 2, "max_retry_after_s": 12})
        worker.sleep = sleeper = SleepRecorder()
        await _call(worker)
    assert sleeper.waits == [12.0]


def test_retry_after_forms() -> None:
    assert retry_after_seconds({"Retry-After": "2"}) == 2.0
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_seconds({"Retry-After": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=1445412480.0) == 10.0
    assert retry_after_seconds({"Retry-After": "soon"}) is None and retry_after_seconds({}) is None


@pytest.mark.parametrize("vendor", VENDORS)
async def test_500s_exhaust_the_retries(vendor: str) -> None:
    with scripted_server(vendor, default=error(vendor, 500)) as srv:
        worker = _worker(vendor, srv.base_url)
        worker.sleep = SleepRecorder()
        with pytest.raises(TransientWorkerError, match="HTTP 500") as info:
            await _call(worker)
    assert info.value.status == 500 and len(srv.requests) == 3
    assert worker.stats().failures == 1


@pytest.mark.parametrize("vendor", VENDORS)
async def test_timeout_is_retried_then_fails(vendor: str) -> None:
    with scripted_server(vendor, default=Reply(body=success_body(vendor, "late"), delay_s=1.5)) as srv:
        worker = _worker(vendor, srv.base_url, timeout_s=0.2, retries={"attempts": 2, "initial_s": 0})
        with pytest.raises(TransientWorkerError, match=r"timed out after 0\.2s") as info:
            await _call(worker)
    assert info.value.timed_out and worker.stats().attempts == 2


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("body", ["{not json", {"unexpected": "shape"}])
async def test_malformed_body_is_a_clear_error_and_not_retried(vendor: str, body: Any) -> None:
    with scripted_server(vendor, default=Reply(body=body)) as srv:
        worker = _worker(vendor, srv.base_url)
        with pytest.raises(MalformedResponseError, match="w: "):
            await _call(worker)
    assert len(srv.requests) == 1


@pytest.mark.parametrize("vendor", VENDORS)
async def test_400_is_permanent(vendor: str) -> None:
    with (
        scripted_server(vendor, default=error(vendor, 400, message="bad model")) as srv,
        pytest.raises(PermanentWorkerError, match="HTTP 400"),
    ):
        await _call(_worker(vendor, srv.base_url))
    assert len(srv.requests) == 1


# ------------------------------------------------------------------------------------ pool files


def test_missing_key_is_a_clear_error_at_pool_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VAR)
    for vendor in VENDORS:
        with pytest.raises(PoolConfigError, match=f"environment variable {KEY_VAR} is not set"):
            build_pool({"workers": [_spec(vendor, "http://127.0.0.1:9/v1")]})
    spec = _spec("anthropic", "http://127.0.0.1:9")
    del spec["api_key_env"]
    with pytest.raises(PoolConfigError, match="api_key_env"):
        build_pool({"workers": [spec]})
    with pytest.raises(PoolConfigError, match="`model`"):
        build_pool({"workers": [{**_spec("openai", "http://127.0.0.1:9/v1"), "model": ""}]})
    with pytest.raises(PoolConfigError, match="base_url must start with http"):
        build_pool({"workers": [_spec("openai", "ftp://x")]})
    with pytest.raises(PoolConfigError, match="NOPE_PORT is not set"):
        build_pool({"workers": [_spec("openai", "http://127.0.0.1:${NOPE_PORT}/v1")]})
    monkeypatch.setenv(KEY_VAR, KEY)
    pool = build_pool({"workers": [_spec("openai", "http://127.0.0.1:${NOPE_PORT:-8123}/v1")]})
    assert pool.workers[0].base_url == "http://127.0.0.1:8123/v1"


async def test_no_key_reaches_logs_errors_or_traces(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # the SDKs and httpx log requests at DEBUG
    echo = f"invalid x-api-key {KEY}"  # a server that echoes the key back in its error
    script = [error("openai", 429, retry_after="0"), ok("openai", "42")]
    with (
        scripted_server("openai", script) as good,
        scripted_server("openai", default=error("openai", 401, message=echo)) as bad,
    ):
        pool = build_pool(
            {
                "workers": [
                    _spec("openai", bad.base_url, name="bad", hosting="self"),
                    _spec("openai", good.base_url, name="good", hosting="self"),
                ]
            }
        )
        with pytest.raises(PermanentWorkerError) as info:
            await _call(pool.workers[0])
        trace = await execute(Workflow([Step(0, "multiply", [])]), TASK, pool.view(), RequestLimits())
    assert KEY not in str(info.value) and "***" in str(info.value)
    assert trace.steps[0].worker == "good" and "bad: PermanentWorkerError" in trace.steps[0].note
    assert KEY not in json.dumps(trace.to_dict())
    assert any("Retrying" in r.getMessage() or "retrying" in r.getMessage() for r in caplog.records)
    assert caplog.records and all(KEY not in r.getMessage() for r in caplog.records)
    assert KEY not in caplog.text
    assert all(KEY not in repr(w) for w in pool.workers)


# ------------------------------------------------------------------------------------ executor


async def test_executor_falls_back_to_a_worker_of_the_same_hosting_class() -> None:
    with (
        scripted_server("openai", default=error("openai", 500)) as dead,
        scripted_server("anthropic", [ok("anthropic", "42", input_tokens=20, output_tokens=3)]) as alive,
        scripted_server("gemini") as other_class,
    ):
        pool = build_pool(
            {
                "workers": [
                    _spec("openai", dead.base_url, name="dead", hosting="external", retries=2),
                    _spec("gemini", other_class.base_url, name="self-hosted", hosting="self"),
                    _spec("anthropic", alive.base_url, name="alive", hosting="external"),
                ],
            }
        )
        trace = await execute(Workflow([Step(0, "multiply", [])]), TASK, pool.view(), RequestLimits())
    (step,) = trace.steps
    assert step.status == "ok" and step.worker == "alive" and step.answer == "42"
    assert (step.input_tokens, step.output_tokens) == (20, 3)
    assert "dead: TransientWorkerError" in step.note and "fallback to alive" in step.note
    assert len(dead.requests) == 2 and not other_class.requests  # a self-hosted worker is never the fallback


async def test_empty_and_truncated_outputs_are_marked_on_the_step() -> None:
    with (
        scripted_server("openai", default=ok("openai", "  ")) as empty,
        scripted_server("openai", default=ok("openai", "6 times 7 equals", truncated=True)) as cut,
    ):
        pool = build_pool(
            {
                "workers": [
                    _spec("openai", empty.base_url, name="empty", hosting="self"),
                    _spec("openai", cut.base_url, name="cut", hosting="external"),
                ]
            }
        )
        wf = Workflow([Step(0, "multiply", []), Step(1, "multiply", [])])
        trace = await execute(wf, TASK, pool.view(), RequestLimits())
    first, second = trace.steps
    assert first.status == "failed" and "empty answer" in first.note  # no same-class fallback
    assert second.status == "ok" and second.finish_reason == "length"
    assert "truncated" in second.note and trace.final_answer == "6 times 7 equals"


async def test_circuit_opens_after_repeated_failures_and_closes_after_a_good_probe() -> None:
    now = [0.0]
    replies: list[Reply] = [error("openai", 500)] * 2
    with scripted_server("openai", list(replies), default=ok("openai", "42")) as srv:
        worker = _worker("openai", srv.base_url, retries=1)
        worker.breaker = CircuitBreaker(failure_threshold=2, reset_after_s=30, clock=lambda: now[0])
        for _ in range(2):
            with pytest.raises(TransientWorkerError):
                await _call(worker)
        assert worker.breaker.state == "open" and len(srv.requests) == 2
        with pytest.raises(CircuitOpenError, match="circuit open"):
            await _call(worker)
        assert len(srv.requests) == 2  # refused without an HTTP call
        now[0] = 31.0
        assert worker.breaker.state == "half_open"
        comp = await _call(worker)  # the probe succeeds
        assert comp.text == "42" and worker.breaker.state == "closed" and len(srv.requests) == 3
    assert worker.stats().refused_by_circuit == 1 and worker.breaker.opened_count == 1


async def test_a_failed_probe_reopens_the_circuit() -> None:
    now = [0.0]
    with scripted_server("gemini", default=error("gemini", 503)) as srv:
        worker = _worker("gemini", srv.base_url, retries=1)
        worker.breaker = CircuitBreaker(failure_threshold=1, reset_after_s=10, clock=lambda: now[0])
        with pytest.raises(TransientWorkerError):
            await _call(worker)
        now[0] = 10.5
        with pytest.raises(TransientWorkerError):  # the probe goes out and fails
            await _call(worker)
        with pytest.raises(CircuitOpenError):
            await _call(worker)
    assert len(srv.requests) == 2 and worker.breaker.opened_count == 2


# ------------------------------------------------------------------------------------ spend guard


async def test_spend_guard_stops_before_the_ceiling_is_crossed() -> None:
    # worst case of one call: ceil(len/2.5) + 16 per message input tokens at $2/M, 64 output at $8/M
    with scripted_server("openai", default=ok("openai", "42", input_tokens=30, output_tokens=60)) as srv:
        pool = build_pool({"max_usd": 0.003, "workers": [_spec("openai", srv.base_url)]})
        worker = pool.workers[0]
        sent = refused = 0
        for _ in range(10):
            try:
                await _call(worker)
                sent += 1
            except SpendLimitError as exc:
                refused += 1
                assert "not sent" in str(exc)
    guard = pool_spend_guard(pool)
    assert guard is not None
    assert sent == len(srv.requests) and refused == 10 - sent and 0 < sent < 10
    assert guard.spent_usd == pytest.approx(sent * (30 * 2.0 + 60 * 8.0) / 1e6)
    assert guard.spent_usd <= 0.003 and guard.refused == refused and guard.reserved_usd == 0


# ------------------------------------------------------------------------------------ cache


def _echo(vendor: str) -> Any:
    def reply(req: Request) -> Reply:
        text = json.dumps(req.body)[-40:]
        return ok(vendor, f"echo {len(text)}", input_tokens=11, output_tokens=4)

    return reply


@pytest.mark.parametrize("vendor", VENDORS)
async def test_cache_answers_a_repeated_call_without_http(vendor: str, tmp_path: Any) -> None:
    store = SqliteCacheStore(tmp_path / "c.sqlite")
    with scripted_server(vendor, default=_echo(vendor)) as srv:
        pool = build_pool({"cache": str(tmp_path / "c.sqlite"), "workers": [_spec(vendor, srv.base_url)]})
        worker = pool.workers[0]
        assert isinstance(worker, CachedWorker) and isinstance(worker.inner, LiveWorker)
        ctx = CallContext(task=TASK, step_index=0)
        first = await worker.complete(MESSAGES, max_tokens=64, temperature=0.2, context=ctx)
        again = await worker.complete(MESSAGES, max_tokens=64, temperature=0.2, context=ctx)
        other = await worker.complete(MESSAGES, max_tokens=65, temperature=0.2, context=ctx)
        sample = await worker.complete(
            MESSAGES, max_tokens=64, temperature=0.2, context=CallContext(task=TASK, nonce=3)
        )
    assert len(srv.requests) == 3  # max_tokens and nonce are part of the key; the repeat is not sent
    assert not first.cached and again.cached and not other.cached and not sample.cached
    assert (again.text, again.input_tokens, again.output_tokens, again.cost_usd) == (
        first.text, first.input_tokens, first.output_tokens, first.cost_usd,
    )  # fmt: skip
    assert (worker.hits, worker.misses) == (1, 3)
    rows = list(store.rows())  # a second connection sees what the pool wrote
    assert len(rows) == 3 and rows[0]["task"]["id"] == TASK.id and rows[0]["worker_info"]["price_in"] == 2.0


async def test_s3_cache_store_round_trips_through_a_real_s3_server(s3_bucket: str) -> None:
    uri = f"{s3_bucket}/cache"
    with scripted_server("openai", default=_echo("openai")) as srv:
        for expect_requests in (1, 1):  # a second pool (a new run) hits the objects the first wrote
            pool = build_pool({"cache": uri, "workers": [_spec("openai", srv.base_url)]})
            await pool.workers[0].complete(MESSAGES, max_tokens=8, temperature=0.0)
            assert len(srv.requests) == expect_requests
    rows = list(S3CacheStore(uri).rows())
    assert len(rows) == 1 and rows[0]["text"].startswith("echo")
    assert pool.workers[0].hits == 1


def test_pool_options_are_validated() -> None:
    with pytest.raises(PoolConfigError, match="max_usd"):
        build_pool({"max_usd": -1, "workers": [_spec("openai", "http://127.0.0.1:9/v1")]})
    with pytest.raises(PoolConfigError, match="cache"):
        build_pool({"cache": {"backend": "redis"}, "workers": [_spec("openai", "http://127.0.0.1:9/v1")]})
    with pytest.raises(PoolConfigError, match="retry attempts"):
        build_pool({"workers": [_spec("openai", "http://127.0.0.1:9/v1", retries=0)]})
    assert isinstance(build_pool({"workers": [_spec("openai", "http://x/v1")]}), Pool)
