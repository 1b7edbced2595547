"""One retry layer, loud failures: what one step of a served request sends, and what it records.

The predictor's service runs real live clients (the ``openai`` SDK over HTTP) against
loopback servers that speak OpenAI's wire format and its errors. Counted are the HTTP requests
the server received: a transient error is retried by the live client alone (``retries:
attempts`` of the pool, 3 by default), a 4xx other than 408/409/429 is sent once, and nothing
above the client retries the same worker again. Then: the circuit breaker lets a restarted
worker back after seconds, refused calls and circuit states are their own metrics, and a
fallback names who was asked, who answered and why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client import REGISTRY

from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.catalog import make_policy
from rl_conductor.policies.fixed import FixedPlan
from rl_conductor.serving.request import ConductorRequest
from rl_conductor.serving.service import ConductorService, load_policy
from rl_conductor.tasks.base import Task
from rl_conductor.workers.live.byo_server import byo_openai_server
from rl_conductor.workers.live.resilience import (
    DEFAULT_ATTEMPTS,
    DEFAULT_MAX_RESET_AFTER_S,
    DEFAULT_RESET_AFTER_S,
    CircuitBreaker,
)
from rl_conductor.workers.live.testing import Reply, error, ok, scripted_server
from rl_conductor.workers.pool import build_pool
from rl_conductor.workflow import Step, Workflow

TASK = Task(id="t/1", question="What is 6 times 7?", answer="42", domain="math", source="t", grader="math")
NO_WAIT = {"initial_s": 0.0, "jitter_s": 0.0}


def _spec(name: str, url: str, *, hosting: str = "self", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "openai",
        "model": "test-model",
        "base_url": url,
        "price_in": 0.1,
        "price_out": 0.2,
        "hosting": hosting,
        "timeout_s": 5,
        **extra,
    }


async def _serve_one(pool: Any) -> dict[str, Any]:
    service = ConductorService(FixedPlan([0]), pool)
    return await service.answer(ConductorRequest(question="What is 6 times 7?"))


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --------------------------------------------------------------------------- attempts per step


async def test_a_transient_error_is_retried_by_the_client_alone() -> None:
    with scripted_server("openai", default=error("openai", 503)) as srv:
        pool = build_pool({"retries": NO_WAIT, "workers": [_spec("flaky", srv.base_url)]})
        doc = await _serve_one(pool)
    # the live client's attempts and no more (the predictor's own retries made this 9)
    assert len(srv.requests) == DEFAULT_ATTEMPTS == 3
    assert doc["answer"] == "" and doc["steps"][0]["status"] == "failed"


async def test_the_number_of_attempts_is_the_pool_files() -> None:
    with scripted_server("openai", default=error("openai", 429, retry_after="0")) as srv:
        pool = build_pool({"retries": {"attempts": 2, **NO_WAIT}, "workers": [_spec("busy", srv.base_url)]})
        await _serve_one(pool)
    assert len(srv.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_a_4xx_is_sent_once(status: int) -> None:
    with scripted_server("openai", default=error("openai", status)) as srv:
        pool = build_pool({"retries": NO_WAIT, "workers": [_spec("w", srv.base_url)]})
        doc = await _serve_one(pool)
    assert len(srv.requests) == 1, f"HTTP {status} was sent {len(srv.requests)} times"
    assert f"HTTP {status}" in doc["steps"][0]["note"]


async def test_a_failed_step_asks_each_fallback_worker_at_most_attempts_times() -> None:
    with (
        scripted_server("openai", default=error("openai", 500)) as a,
        scripted_server("openai", default=error("openai", 502)) as b,
    ):
        pool = build_pool(
            {"retries": NO_WAIT, "workers": [_spec("a", a.base_url), _spec("b", b.base_url, price_out=0.3)]}
        )
        doc = await _serve_one(pool)
    assert (len(a.requests), len(b.requests)) == (DEFAULT_ATTEMPTS, DEFAULT_ATTEMPTS)
    assert doc["worker_fallback"]


# --------------------------------------------------------------------------- circuit breaker


async def test_a_restarted_worker_is_called_again_within_seconds() -> None:
    now = [0.0]
    replies: list[Reply] = [error("openai", 503)] * 5  # down for five calls, then back
    with scripted_server("openai", replies, default=ok("openai", "42")) as srv:
        worker = build_pool({"retries": 1, "workers": [_spec("w", srv.base_url)]}).workers[0]
        worker.breaker.clock = lambda: now[0]
        task_limits = RequestLimits()
        for _ in range(5):
            await execute(Workflow((Step(0, "solve", ()),)), TASK, _one(worker), task_limits)
        assert worker.breaker.state == "open"
        now[0] = DEFAULT_RESET_AFTER_S  # the breaker's first wait: 2 s (it was 30 s)
        trace = await execute(Workflow((Step(0, "solve", ()),)), TASK, _one(worker), task_limits)
    assert trace.final_answer == "42" and worker.breaker.state == "closed"
    assert DEFAULT_RESET_AFTER_S <= 2.0


def test_a_long_outage_is_probed_at_most_every_max_reset_after_s() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=1, clock=lambda: now[0])
    breaker.record_failure()
    waits = []
    for _ in range(8):  # every probe fails: the wait doubles, up to its ceiling
        while breaker.state == "open":
            now[0] += 0.25
        waits.append(now[0] - (breaker.opened_at or 0.0))
        breaker.before_call("w")
        breaker.record_failure()
    assert waits[0] == DEFAULT_RESET_AFTER_S and waits[1] == 2 * DEFAULT_RESET_AFTER_S
    assert max(waits) == DEFAULT_MAX_RESET_AFTER_S == 16.0
    while breaker.state == "open":
        now[0] += 0.25
    breaker.before_call("w")
    breaker.record_success()  # back: the next outage starts from the short wait again
    assert breaker.state == "closed" and breaker.open_for_s == DEFAULT_RESET_AFTER_S


async def test_refused_calls_are_not_errors_and_the_circuit_state_is_a_gauge() -> None:
    with scripted_server("openai", default=error("openai", 500)) as srv:
        spec = _spec("tripping", srv.base_url, circuit={"failure_threshold": 1, "reset_after_s": 60})
        pool = build_pool({"retries": 1, "workers": [spec]})
        service = ConductorService(FixedPlan([0]), pool)
        assert _sample("conductor_worker_circuit_state", worker="tripping") == 0  # closed
        for _ in range(3):
            await service.answer(ConductorRequest(question="What is 6 times 7?"))
    assert len(srv.requests) == 1  # one call opened the circuit, the next two were refused
    assert _sample("conductor_worker_calls_total", worker="tripping", outcome="error") == 1
    assert _sample("conductor_worker_calls_total", worker="tripping", outcome="refused") == 2
    assert _sample("conductor_worker_circuit_state", worker="tripping") == 2  # open


# --------------------------------------------------------------------------- loud failures


async def test_a_wrong_path_names_the_worker_the_url_the_status_and_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with byo_openai_server(prefix="/v1", model="m") as srv:
        url = f"{srv.root}/openai/v1"  # the KServe path on a llama.cpp-style server
        worker = build_pool({"workers": [_spec("llama", url, model="m")]}).workers[0]
        with caplog.at_level(logging.WARNING), pytest.raises(Exception) as info:
            await worker.complete([{"role": "user", "content": "hi"}], max_tokens=64, temperature=0.0)
    message = str(info.value)
    assert "llama" in message and "HTTP 404" in message and url in message
    assert "/v1" in message and "llama.cpp" in message
    assert any("HTTP 404" in r.getMessage() for r in caplog.records)  # logged, not only raised


async def test_a_refused_key_names_the_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLC_WRONG_KEY", "sk-wrong-0123456789")
    with byo_openai_server(api_key="sk-right-0123456789", model="m") as srv:
        worker = build_pool(
            {"workers": [_spec("ext", f"{srv.root}/v1", model="m", api_key_env="RLC_WRONG_KEY")]}
        ).workers[0]
        with pytest.raises(Exception) as info:
            await worker.complete([{"role": "user", "content": "hi"}], max_tokens=64, temperature=0.0)
    message = str(info.value)
    assert "ext" in message and "HTTP 401" in message and f"{srv.root}/v1" in message
    assert "RLC_WRONG_KEY" in message and "sk-wrong" not in message


@contextmanager
def _keyless_and_spare() -> Iterator[Any]:
    """A pool of two external workers: ``keyless`` sends no key to a server that wants one (401),
    ``spare`` (dearer) reaches an open server."""
    with (
        byo_openai_server(api_key="sk-right-0123456789", model="m") as guarded,
        byo_openai_server(model="m") as open_server,
    ):
        yield build_pool(
            {
                "workers": [
                    _spec("keyless", f"{guarded.root}/v1", model="m", hosting="external"),
                    _spec("spare", f"{open_server.root}/v1", model="m", hosting="external", price_out=0.3),
                ]
            }
        )


async def test_a_fallback_records_who_was_asked_who_answered_and_why() -> None:
    with _keyless_and_spare() as pool:
        trace = await execute(Workflow((Step(0, "solve", ()),)), TASK, pool.view(), RequestLimits())
    step = trace.steps[0]
    assert step.status == "ok" and step.requested_worker == "keyless" and step.worker == "spare"
    assert [a.worker for a in step.attempts] == ["keyless", "spare"]
    assert "HTTP 401" in step.attempts[0].error and "fallback to spare" in step.note
    assert trace.worker_fallbacks == 1


def _one(worker: Any) -> Any:
    from rl_conductor.workers.pool import Pool

    return Pool(name="one", workers=[worker]).view()


# --------------------------------------------------------------------------- one policy parser


def test_fixed_is_a_policy_spec_for_eval_as_for_serve() -> None:
    pool = build_pool({"workers": [_spec("a", "http://127.0.0.1:9/v1"), _spec("b", "http://127.0.0.1:9/v1")]})
    built = make_policy("fixed:0,1", pool)
    assert isinstance(built, FixedPlan) and built.ordinals == [0, 1]
    assert isinstance(load_policy(None, "fixed:1", pool), FixedPlan)


def test_conductor_eval_accepts_a_fixed_policy(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from rl_conductor.cli import app

    out = tmp_path / "eval.json"
    res = CliRunner().invoke(
        app, ["eval", "--pool", "paper-sim", "--policy", "fixed:0,1", "--limit", "2", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "fixed:0,1" in out.read_text()


async def test_an_evaluation_counts_worker_fallbacks() -> None:
    """A wrong key behind `single:NAME`: the row's calls went to another worker; the summary says so."""
    from rl_conductor.evaluation.runner import evaluate_async

    with _keyless_and_spare() as pool:
        res = await evaluate_async(make_policy("single:keyless", pool), pool.view(), [TASK], progress=False)
    summary = res.summary()
    assert summary["worker_fallback_rate"] == 1.0 and summary["fallback_rate"] == 0.0
    assert summary["worker_shares"] == {"spare": 1.0}
