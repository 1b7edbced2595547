"""The budget property on live-format workers: never a cent over ``max_cost_usd``, and the trace's
cost is exactly what the vendors would bill (issue 23).

``tests/test_executor.py`` proves the executor's limits on the library's fake workers. Here the
same promise is checked where it broke: the official SDKs (openai, anthropic, google-genai) over
real HTTP to loopback servers that speak each vendor's format and bill at their worst
(:class:`~rl_conductor.workers.live.testing.BillingServer`): any share of every allowed output
token as reasoning / thinking, input counted one token per UTF-8 byte, per character or per four
characters plus up to 16 a message, prompt-cache reads. Questions mix ASCII, CJK, accents and
emoji, up to tens of thousands of characters; policies include the parallel ones (oracle, MoA,
self-consistency) and chains. For every example: what the vendors bill is within the budget,
the trace reports exactly that, and every HTTP call is an attempt in the trace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.baselines import MixtureOfAgents, Oracle, SelfConsistency
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Trace
from rl_conductor.workers.live.testing import (
    BillingServer,
    ScriptedServer,
    count_bytes,
    count_chars,
    count_words,
    scripted_server,
    worker_spec,
)
from rl_conductor.workers.pool import Pool, build_pool
from rl_conductor.workflow import Step, Workflow

VENDORS = ("openai", "anthropic", "gemini")
KEY_VAR = "RLC_TEST_API_KEY"
#: (price_in, price_out) USD per 1M tokens, per vendor, for each of the pools an example draws
PRICES = (
    ((1.25, 10.0), (3.0, 15.0), (0.15, 0.6)),
    ((15.0, 60.0), (0.8, 4.0), (2.5, 10.0)),
    ((0.05, 0.4), (0.25, 1.25), (1.25, 10.0)),
)
ALPHABET = list("abcxyz 0123456789+=?.\n") + list("日本語東京は中文한국어") + ["😀", "👍🏽", "é", "ß", "🇯🇵"]
POLICIES = ("single", "chain", "parallel", "moa", "self-consistency", "oracle")


@dataclass
class _World:
    loop: asyncio.AbstractEventLoop
    servers: list[ScriptedServer]
    bills: list[BillingServer]
    pools: list[Pool]


@pytest.fixture(scope="module")
def world() -> Iterator[_World]:
    """One server per vendor and a few pools over them, kept for every example (one event loop,
    so the SDK clients and their connections are reused)."""
    mp = pytest.MonkeyPatch()
    mp.setenv(KEY_VAR, "sk-test-property")
    bills = [BillingServer(v) for v in VENDORS]
    loop = asyncio.new_event_loop()
    try:
        with ExitStack() as stack:
            servers = [
                stack.enter_context(scripted_server(v, default=b))
                for v, b in zip(VENDORS, bills, strict=True)
            ]
            pools = [
                build_pool(
                    {
                        "workers": [
                            worker_spec(
                                v,
                                s.base_url,
                                f"{v}-w",
                                api_key_env=KEY_VAR,
                                price_in=p_in,
                                price_out=p_out,
                                retries={"attempts": 1},
                                timeout_s=20,
                            )
                            for v, s, (p_in, p_out) in zip(VENDORS, servers, prices, strict=True)
                        ]
                    }
                )
                for prices in PRICES
            ]
            yield _World(loop, servers, bills, pools)
    finally:
        loop.close()
        mp.undo()


@dataclass(frozen=True)
class _Example:
    question: str
    budget: float
    max_tokens: int
    policy: str
    pool: int
    first: int
    count: Any
    overhead: int
    output_share: float
    reasoning_share: float
    cached_share: float


@st.composite
def _examples(draw: st.DrawFn) -> _Example:
    unit = "".join(draw(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=60)))
    return _Example(
        question=unit * draw(st.sampled_from([1, 3, 40, 400, 2000])),
        budget=draw(st.floats(1e-6, 0.08)),
        max_tokens=draw(st.integers(64, 8192)),
        policy=draw(st.sampled_from(POLICIES)),
        pool=draw(st.integers(0, len(PRICES) - 1)),
        first=draw(st.integers(0, len(VENDORS) - 1)),
        count=draw(st.sampled_from([count_bytes, count_chars, count_words])),
        overhead=draw(st.integers(0, 16)),
        output_share=draw(st.sampled_from([0.0, 0.3, 1.0])),
        reasoning_share=draw(st.sampled_from([0.0, 0.5, 0.97, 1.0])),
        cached_share=draw(st.sampled_from([0.0, 0.5])),
    )


async def _run(ex: _Example, pool: Pool) -> Trace:
    view = pool.view()
    task = Task(id="t/prop", question=ex.question, answer="42", domain="math", source="test", grader="math")
    limits = RequestLimits(max_cost_usd=ex.budget, max_tokens=ex.max_tokens)
    a, b, c = ex.first, (ex.first + 1) % 3, (ex.first + 2) % 3
    if ex.policy == "oracle":
        return (await Oracle().run(task, view, limits)).trace
    if ex.policy == "moa":
        return (await MixtureOfAgents().run(task, view, limits)).trace
    if ex.policy == "self-consistency":
        return (await SelfConsistency(view.names()[a], samples=4).run(task, view, limits)).trace
    steps = {
        "single": (Step(a, "solve", ()),),
        "chain": (Step(a, "draft", ()), Step(b, "check", "all"), Step(c, "answer", "all")),
        "parallel": (Step(a, "x", ()), Step(b, "y", ()), Step(c, "z", ()), Step(a, "pick", "all")),
    }[ex.policy]
    return await execute(Workflow(steps=steps), task, view, limits)


@settings(
    max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@pytest.mark.slow
@given(_examples())
def test_live_workers_never_overspend(world: _World, ex: _Example) -> None:
    for bill in world.bills:
        bill.count, bill.overhead = ex.count, ex.overhead
        bill.output_share, bill.reasoning_share, bill.cached_share = (
            ex.output_share,
            ex.reasoning_share,
            ex.cached_share,
        )
        bill.billed.clear()
    before = [len(s.requests) for s in world.servers]
    trace = world.loop.run_until_complete(asyncio.wait_for(_run(ex, world.pools[ex.pool]), 60))
    billed = sum(b.cost(p_in, p_out) for b, (p_in, p_out) in zip(world.bills, PRICES[ex.pool], strict=True))
    assert billed <= ex.budget, f"the vendors would bill ${billed:.6g} on a ${ex.budget:.6g} budget"
    assert trace.cost_usd == pytest.approx(billed, rel=1e-9, abs=1e-15)
    assert trace.cost_usd <= ex.budget
    assert trace.calls == sum(len(s.requests) for s in world.servers) - sum(before)
    assert not any("above its reservation" in a.error for a in trace.attempts)
