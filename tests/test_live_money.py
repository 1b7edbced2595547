"""Money on live workers: every billed token is read and charged, reservations bound any text,
parallel calls of one request share its budget (issue 23, finding 2).

Each test runs the official SDKs over real HTTP against a loopback server speaking the vendor's
wire format (:mod:`rl_conductor.workers.live.testing`). The servers bill like a vendor at its
worst (:class:`~rl_conductor.workers.live.testing.BillingServer`): every output token allowed,
much of it as reasoning / thinking, and input counted one token per character or per UTF-8 byte,
so a test compares what the request was charged with what the vendor would bill.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from typing import Any

import pytest

from _pools import pool_spend_guard
from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.baselines import MixtureOfAgents, Oracle
from rl_conductor.tasks.base import Task
from rl_conductor.workers.live.spend import SpendLimitError, worst_case_cost
from rl_conductor.workers.live.testing import (
    BillingServer,
    Reply,
    ScriptedServer,
    count_bytes,
    count_chars,
    error,
    ok,
    request_max_tokens,
    request_messages,
    scripted_server,
    worker_spec,
)
from rl_conductor.workers.pool import build_pool
from rl_conductor.workflow import Step, Workflow

VENDORS = ("openai", "anthropic", "gemini")
KEY_VAR = "RLC_TEST_API_KEY"
PRICE_IN, PRICE_OUT = 1.25, 10.0  # Gemini 2.5 Pro's list prices, USD per 1M tokens
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6 times 7?"}]


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, "sk-test-money")


_spec = functools.partial(
    worker_spec,
    api_key_env=KEY_VAR,
    price_in=PRICE_IN,
    price_out=PRICE_OUT,
    retries={"attempts": 1},
    timeout_s=10,
)


def _task(question: str) -> Task:
    return Task(id="t/money", question=question, answer="42", domain="math", source="test", grader="math")


@pytest.mark.parametrize("vendor", VENDORS)
async def test_every_billed_token_is_charged(vendor: str) -> None:
    """100 prompt tokens (40 of them cache reads) and 10 answer + 50 reasoning tokens, each in
    the vendor's own fields: charged 100 in, 60 out. Before: Anthropic dropped the cache reads
    (charged 60 in) and Gemini the thoughts (charged 10 out); OpenAI already read both right."""
    reply = ok(vendor, "42", input_tokens=100, output_tokens=10, reasoning_tokens=50, cached_tokens=40)
    with scripted_server(vendor, [reply]) as srv:
        worker = build_pool({"workers": [_spec(vendor, srv.base_url)]}).workers[0]
        comp = await worker.complete(MESSAGES, max_tokens=256, temperature=0.2)
    assert (comp.text, comp.input_tokens, comp.output_tokens) == ("42", 100, 60)
    assert comp.cost_usd == pytest.approx((100 * PRICE_IN + 60 * PRICE_OUT) / 1e6)
    assert not comp.tokens_estimated


async def test_gemini_thoughts_are_charged_and_the_plan_stays_within_its_budget() -> None:
    """Issue 23: a $0.01 budget over a three-step plan reported $0.0007 while the vendor would
    bill $0.0287 (2.9x). Now the response's cost is what the vendor bills, within the budget."""
    bill = BillingServer("gemini", reasoning_share=0.95)
    with scripted_server("gemini", default=bill) as srv:
        pool = build_pool({"workers": [_spec("gemini", srv.base_url)]})
        wf = Workflow(steps=(Step(0, "solve", ()), Step(0, "check", "all"), Step(0, "answer", "all")))
        trace = await execute(wf, _task("What is 6 times 7?"), pool.view(), RequestLimits(max_cost_usd=0.01))
    billed = bill.cost(PRICE_IN, PRICE_OUT)
    assert len(bill.billed) >= 1 and billed > 0
    assert trace.cost_usd == pytest.approx(billed, rel=1e-9)
    assert trace.cost_usd <= 0.01
    assert trace.calls == len(srv.requests)


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(
    ("question", "budget", "count", "status"),
    [
        # issue 23: charged $0.124 on $0.06 (2.07x); its worst case no longer fits the budget
        ("日本語" * 33000, 0.06, count_chars, "skipped_budget"),
        ("日本語" * 33000, 0.06, count_bytes, "skipped_budget"),
        ("😀👍🏽" * 1500, 0.03, count_bytes, "ok"),  # 16,500 bytes: fits, output capped
        ("東京は" * 2000 + "？", 0.5, count_bytes, "ok"),
    ],
)
async def test_non_ascii_input_never_overspends(
    vendor: str, question: str, budget: float, count: Any, status: str
) -> None:
    bill = BillingServer(vendor, count=count, overhead=16)
    with scripted_server(vendor, default=bill) as srv:
        pool = build_pool({"workers": [_spec(vendor, srv.base_url)]})
        wf = Workflow(steps=(Step(0, "solve", ()),))
        trace = await execute(wf, _task(question), pool.view(), RequestLimits(max_cost_usd=budget))
    billed = bill.cost(PRICE_IN, PRICE_OUT)
    assert billed <= budget, f"the vendor would bill ${billed:.4f} on a ${budget} budget"
    assert trace.cost_usd == pytest.approx(billed, rel=1e-9, abs=1e-12) and trace.cost_usd <= budget
    assert trace.calls == len(srv.requests)
    assert trace.steps[0].status == status


async def test_spend_guard_reserves_enough_for_any_text() -> None:
    """The pool's run-wide ``max_usd`` used the same 2.5-characters-a-token reservation."""
    bill = BillingServer("openai", count=count_bytes, overhead=16)
    messages = [{"role": "user", "content": "語" * 3000}]
    with scripted_server("openai", default=bill) as srv:
        pool = build_pool({"max_usd": 0.02, "workers": [_spec("openai", srv.base_url)]})
        worker = pool.workers[0]
        for _ in range(10):
            with suppress(SpendLimitError):
                await worker.complete(messages, max_tokens=128, temperature=0.2)
    guard = pool_spend_guard(pool)
    assert guard is not None and 0 < len(srv.requests) < 10
    assert guard.spent_usd == pytest.approx(bill.cost(PRICE_IN, PRICE_OUT)) and guard.spent_usd <= 0.02


async def test_anthropic_thinking_budget_stays_inside_the_reserved_max_tokens() -> None:
    bill = BillingServer("anthropic", reasoning_share=0.8)
    with scripted_server("anthropic", default=bill) as srv:
        pool = build_pool({"workers": [_spec("anthropic", srv.base_url, thinking_budget_tokens=3000)]})
        worker = pool.workers[0]
        for cap in (4096, 1500, 1000):
            comp = await worker.complete(MESSAGES, max_tokens=cap, temperature=0.2)
            assert comp.output_tokens == cap  # thinking is billed inside output_tokens
    bodies = [r.body for r in srv.requests]
    assert [b["max_tokens"] for b in bodies] == [4096, 1500, 1000]
    assert bodies[0]["thinking"] == {"type": "enabled", "budget_tokens": 3000}
    assert bodies[1]["thinking"] == {"type": "enabled", "budget_tokens": 1500 - 64}
    assert "thinking" not in bodies[2]  # under 1,024 tokens of thinking fit: sent without it
    assert all(b["thinking"]["budget_tokens"] < b["max_tokens"] for b in bodies[:2])


@pytest.mark.parametrize("bad", [512, True, "lots"])
def test_anthropic_thinking_budget_is_validated(bad: Any) -> None:
    from rl_conductor.workers.pool import PoolConfigError

    with pytest.raises(PoolConfigError, match="thinking_budget_tokens"):
        build_pool({"workers": [_spec("anthropic", "http://127.0.0.1:9", thinking_budget_tokens=bad)]})


@pytest.fixture
def three_vendors() -> Iterator[tuple[list[ScriptedServer], list[BillingServer]]]:
    bills = [BillingServer(v, reasoning_share=0.5) for v in VENDORS]
    with ExitStack() as stack:
        servers = [
            stack.enter_context(scripted_server(v, default=b)) for v, b in zip(VENDORS, bills, strict=True)
        ]
        yield servers, bills


@pytest.mark.parametrize("policy", ["oracle", "moa"])
async def test_parallel_policies_share_one_budget(
    policy: str, three_vendors: tuple[list[ScriptedServer], list[BillingServer]]
) -> None:
    """Issue 23: ``--policy oracle`` spent $0.0093 on a $0.003 request (every worker had the whole
    budget) and reported $0.00008 and one call. Now all calls together stay within the budget and
    the trace reports every one of them."""
    servers, bills = three_vendors
    specs = [
        _spec(v, s.base_url, name=f"{v}-w", price_in=p / 4, price_out=p)
        for v, s, p in zip(VENDORS, servers, (10.0, 15.0, 12.0), strict=True)
    ]
    pool = build_pool({"workers": specs})
    runner = Oracle() if policy == "oracle" else MixtureOfAgents()
    budget = 0.003
    ep = await runner.run(
        _task("What is 6 times 7?"), pool.view(), RequestLimits(max_cost_usd=budget, max_tokens=256)
    )
    billed = sum(b.cost(s["price_in"], s["price_out"]) for b, s in zip(bills, specs, strict=True))
    assert billed <= budget
    assert ep.trace.cost_usd == pytest.approx(billed, rel=1e-9)
    assert ep.trace.calls == sum(len(s.requests) for s in servers) >= 1


async def test_served_oracle_reports_what_the_vendors_bill(
    three_vendors: tuple[list[ScriptedServer], list[BillingServer]],
) -> None:
    """The issue's reproduction through the predictor's service: ``--policy oracle``, $0.003."""
    from rl_conductor.serving.request import ConductorRequest
    from rl_conductor.serving.service import ConductorService

    servers, bills = three_vendors
    specs = [
        _spec(v, s.base_url, name=f"{v}-w", price_in=p / 4, price_out=p)
        for v, s, p in zip(VENDORS, servers, (10.0, 15.0, 12.0), strict=True)
    ]
    service = ConductorService(Oracle(), build_pool({"workers": specs}))
    doc = await service.answer(ConductorRequest(question="What is 6 times 7?", max_cost_usd=0.003))
    billed = sum(b.cost(s["price_in"], s["price_out"]) for b, s in zip(bills, specs, strict=True))
    assert 0 < billed <= 0.003
    assert doc["cost_usd"] == pytest.approx(billed, rel=1e-9)
    assert doc["calls"] == sum(len(s.requests) for s in servers)


# -- attempts that time out may still be billed ------------------------------------------------

SLOW = 3.0  # seconds a stalled reply takes: far past the client's per-attempt timeout


def _attempt_bound(srv: ScriptedServer, worker: Any, index: int) -> float:
    """What the ``index``-th request the server received may be billed at worst."""
    body = srv.requests[index].body
    msgs = [{"role": r, "content": c} for r, c in request_messages("openai", body)]
    return worst_case_cost(worker.info, msgs, request_max_tokens("openai", body) or 0)


async def _one_step(srv: ScriptedServer, *, attempts: int, step_timeout_s: float = 30.0) -> tuple[Any, Any]:
    spec = _spec("openai", srv.base_url, retries={"attempts": attempts, "initial_s": 0.0, "jitter_s": 0.0})
    pool = build_pool({"workers": [{**spec, "timeout_s": 0.5}]})
    wf = Workflow([Step(0, "Solve the problem.", [])])
    limits = RequestLimits(max_tokens=256, step_timeout_s=step_timeout_s)
    return await execute(wf, _task("What is 6 times 7?"), pool.view(), limits), pool.workers[0]


async def test_a_timed_out_attempt_that_is_retried_is_charged_its_worst_case() -> None:
    """The first request times out (the vendor may bill it), the retry answers: the step is
    charged the answer's cost and the first request's worst case. Before: only the answer's."""
    answer = ok("openai", "42", input_tokens=30, output_tokens=5)
    with scripted_server("openai", [Reply(200, answer.body, delay_s=SLOW), answer]) as srv:
        trace, worker = await _one_step(srv, attempts=2)
    assert len(srv.requests) == 2 and trace.steps[0].status == "ok"
    answered = (30 * PRICE_IN + 5 * PRICE_OUT) / 1e6
    assert trace.cost_usd == pytest.approx(answered + _attempt_bound(srv, worker, 0), rel=1e-9)
    assert trace.attempts[0].cost_usd == pytest.approx(trace.cost_usd, rel=1e-9)


async def test_a_call_failing_after_timed_out_attempts_is_charged_each_of_them() -> None:
    """Two requests sent, both timed out, the call ends in an error: charged both worst cases
    (before: $0, the error's). A 5xx that follows is not billed."""
    stalled = Reply(200, ok("openai", "42").body, delay_s=SLOW)
    with scripted_server("openai", [stalled, stalled, error("openai", 503)]) as srv:
        trace, worker = await _one_step(srv, attempts=3)
    assert len(srv.requests) == 3 and trace.steps[0].status == "failed"
    bound = _attempt_bound(srv, worker, 0)
    assert bound > 0
    assert trace.cost_usd == pytest.approx(2 * bound, rel=1e-9)
    assert [a.status for a in trace.attempts] == ["error"]


async def test_the_step_timeout_charges_every_request_sent() -> None:
    """The first request times out at the client's 0.5 s, the retry is still waiting when the
    step's 1.2 s run out: two requests may be billed, and both are charged (before: one)."""
    stalled = Reply(200, ok("openai", "42").body, delay_s=SLOW)
    with scripted_server("openai", [stalled, stalled]) as srv:
        trace, worker = await _one_step(srv, attempts=2, step_timeout_s=1.2)
    # the step's timeout ends the call; on a busy machine the retry's own client timeout may fire
    # first, which ends it as an error: either way every request sent is charged (below)
    assert [a.status for a in trace.attempts] in (["timeout"], ["error"])
    # the retry was sent (it may not have reached the server yet on a busy machine: charged alike)
    assert 1 <= len(srv.requests) <= 2
    bound = _attempt_bound(srv, worker, 0)
    assert trace.cost_usd == pytest.approx(2 * bound, rel=1e-9)


async def _stalling_step(
    srv: ScriptedServer, *, budget: float | None, pool_max_usd: float | None = None
) -> tuple[Any, Any, Any]:
    """One step on a worker with the default retry count (3 attempts) whose first two requests
    stall past its 0.5 s per-attempt timeout: (trace, worker, the pool's spend guard)."""
    spec = _spec("openai", srv.base_url, retries={"initial_s": 0.0, "jitter_s": 0.0}, timeout_s=0.5)
    pool = build_pool({"workers": [spec], **({"max_usd": pool_max_usd} if pool_max_usd else {})})
    wf = Workflow([Step(0, "Solve the problem.", [])])
    limits = RequestLimits(max_tokens=256, max_cost_usd=budget, step_timeout_s=30.0)
    trace = await execute(wf, _task("What is 6 times 7?"), pool.view(), limits)
    return trace, pool.workers[0], pool_spend_guard(pool)


@pytest.mark.parametrize("budget", [0.0005, 0.0012, 0.003, 0.006, 0.02])
async def test_retried_timeouts_never_take_a_request_past_its_budget(budget: float) -> None:
    """Each timed-out attempt may be billed its worst case; a retry is sent only when its own
    worst case fits what the budget has left after them (before: $0.0005 ended at $0.001021)."""
    stalled = Reply(200, ok("openai", "42").body, delay_s=SLOW)
    answer = ok("openai", "42", input_tokens=30, output_tokens=5)
    with scripted_server("openai", [stalled, stalled], default=answer) as srv:
        trace, worker, _ = await _stalling_step(srv, budget=budget)
        sent = len(srv.requests)
    charged = sum(_attempt_bound(srv, worker, i) for i in range(min(sent, 2)))
    assert trace.cost_usd <= budget, f"charged ${trace.cost_usd:.6g} of a ${budget:g} budget"
    assert trace.cost_usd >= charged * (1 - 1e-9), "every stalled request sent is charged"
    step = trace.steps[0]
    if sent == 0:  # not even the least output the first request may ask for fits
        assert step.status == "skipped_budget" and step.note == "budget exhausted"
    elif sent < 3:  # a retry did not fit: not sent, and the budget says it stopped the step
        assert step.status == "skipped_budget" and "retry not sent" in step.note
    else:
        assert step.status == "ok" and step.answer == "42"


async def test_retried_timeouts_never_cross_the_pools_max_usd() -> None:
    stalled = Reply(200, ok("openai", "42").body, delay_s=SLOW)
    with scripted_server("openai", [stalled, stalled]) as srv:
        trace, worker, guard = await _stalling_step(srv, budget=None, pool_max_usd=0.004)
        sent = len(srv.requests)
    assert guard is not None
    assert sent == 1, "one worst case fits the 0.004 ceiling, a second one does not"
    assert guard.spent_usd <= guard.max_usd and trace.cost_usd <= guard.max_usd
    assert guard.spent_usd == pytest.approx(_attempt_bound(srv, worker, 0), rel=1e-9)
    assert trace.steps[0].status == "failed" and "retry not sent" in trace.steps[0].note
