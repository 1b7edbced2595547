"""The executor: concurrency, dependencies, messages, budgets, privacy, failures and recursion.

Workers are the library's :class:`FakeWorker` (fixed latency, scripted answers and failures),
which record every call they receive, so the tests can check who was called, when, and with
what message. A hypothesis property runs random workflows on random pools under random limits
and checks the executor's guarantees: never over budget, never an external worker on a private
request, never a worker outside ``allowed_workers``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_conductor.executor import RecursionRequest, execute
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Limits, StepRecord, Trace
from rl_conductor.workers.base import CallContext, Hosting, Message
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow

TASK = Task(id="t/1", question="What is 6 * 7?", answer="42", domain="math", source="test", grader="math")


def _worker(
    name: str,
    *,
    latency_s: float = 0.0,
    hosting: Hosting = "external",
    price_in: float = 1.0,
    price_out: float = 2.0,
    **kw: object,
) -> FakeWorker:
    info = fake_info(name, price_in=price_in, price_out=price_out, hosting=hosting)
    kw.setdefault("answer", f"answer from {name}")
    return FakeWorker(info=info, latency_s=latency_s, **kw)  # type: ignore[arg-type]


def _view(*workers: FakeWorker) -> PoolView:
    return Pool(name="test", workers=list(workers)).view()


def _by_step(*workers: FakeWorker) -> dict[int, dict[str, object]]:
    """Every recorded call, keyed by the step index of its context."""
    out: dict[int, dict[str, object]] = {}
    for w in workers:
        for call in w.calls:
            ctx = call["context"]
            assert isinstance(ctx, CallContext)
            out[ctx.step_index] = call
    return out


def _message(call: dict[str, object]) -> str:
    messages = call["messages"]
    assert isinstance(messages, list) and len(messages) == 1
    return str(messages[0]["content"])


def _step_answer(messages: Sequence[Message], ctx: CallContext | None) -> str:
    assert ctx is not None
    return f"ANSWER-{ctx.step_index}"


# ----------------------------------------------------------------------------- order and concurrency


async def test_independent_steps_run_concurrently() -> None:
    workers = [_worker(f"w{i}", latency_s=0.2) for i in range(4)]
    wf = Workflow(
        steps=(Step(0, "solve", ()), Step(1, "solve", ()), Step(2, "solve", ()), Step(3, "aggregate", "all"))
    )
    trace = await execute(wf, TASK, _view(*workers))
    assert [s.status for s in trace.steps] == ["ok"] * 4
    # the simulated critical path is exact: three parallel 0.2 s steps, then the aggregator
    assert trace.latency_s == pytest.approx(0.4, abs=1e-9)
    assert trace.steps[3].started_s == pytest.approx(0.2, abs=1e-9)
    assert 0.39 <= trace.wall_s < 0.7
    assert trace.final_answer == "answer from w3"


async def test_dependencies_are_respected() -> None:
    lat = 0.05
    w = _worker("w", latency_s=lat, responder=_step_answer)
    # 0 and 2 are independent; 1 needs 0; 3 needs 1 and 2
    wf = Workflow(steps=(Step(0, "a", ()), Step(0, "b", (0,)), Step(0, "c", ()), Step(0, "d", (1, 2))))
    trace = await execute(wf, TASK, _view(w))
    calls = _by_step(w)
    t = {i: float(calls[i]["t"]) for i in calls}  # type: ignore[arg-type]
    assert t[1] >= t[0] + lat
    assert t[3] >= t[1] + lat and t[3] >= t[2] + lat
    assert abs(t[2] - t[0]) < lat / 2  # started together
    assert [s.started_s for s in trace.steps] == pytest.approx([0.0, lat, 0.0, 2 * lat])
    assert trace.latency_s == pytest.approx(3 * lat)


async def test_each_message_shows_exactly_its_visible_answers() -> None:
    w = _worker("w", responder=_step_answer)
    wf = Workflow(
        steps=(
            Step(0, "first", ()),
            Step(0, "second", ()),
            Step(0, "third", (0,)),
            Step(0, "fourth", "all"),
            Step(0, "fifth", (1, 3)),
        )
    )
    trace = await execute(wf, TASK, _view(w))
    calls = _by_step(w)
    for i, step in enumerate(wf.steps):
        msg = _message(calls[i])
        assert TASK.question in msg
        assert msg.rstrip().endswith(f"Your subtask: {step.instruction}")
        for j in range(5):
            assert (f"ANSWER-{j}" in msg) == (j in step.visible(i)), (i, j)
        ctx = calls[i]["context"]
        assert isinstance(ctx, CallContext)
        assert ctx.visible_answers == tuple(f"ANSWER-{j}" for j in step.visible(i))
        assert trace.steps[i].visible == list(step.visible(i))
    assert trace.final_answer == "ANSWER-4"


# ----------------------------------------------------------------------------- the limits property

_PRICES = st.sampled_from(
    [0.0, 0.01, 0.1, 0.15, 0.3, 1.0, 1.25, 3.0, 10.0, 15.0, 60.0, 600.0, 1000.0, 2000.0, 3000.0]
)
_BUDGETS = st.one_of(
    st.none(),
    st.just(0.0),
    st.floats(min_value=1e-8, max_value=0.05, allow_nan=False, allow_infinity=False),
    st.sampled_from([1e-6, 3e-5, 1e-4, 0.1, 0.3, 0.7, 1.0]),
)


@st.composite
def _scenarios(draw: st.DrawFn) -> tuple[list[FakeWorker], Workflow, Limits]:
    n = draw(st.integers(1, 5))
    workers = [
        FakeWorker(
            info=fake_info(
                f"w{i}",
                price_in=draw(_PRICES),
                price_out=draw(_PRICES),
                hosting=draw(st.sampled_from(["self", "external"])),
            ),
            answer=f"answer from w{i}",
            output_tokens=draw(st.sampled_from([1, 50, 63, 64, 65, 700, 4096, 10_000])),
            fail_times=draw(st.sampled_from([0, 0, 0, 1, 5])),
            latency_s=draw(st.sampled_from([0.0, 0.0, 0.001, 0.002])),
        )
        for i in range(n)
    ]
    k = draw(st.integers(1, 5))
    steps = []
    for i in range(k):
        access = draw(
            st.one_of(
                st.just("all"),
                st.just(()),
                st.lists(st.integers(0, max(0, i - 1)), max_size=i).map(
                    lambda x, i=i: tuple(sorted({r for r in x if r < i}))
                ),
            )
        )
        worker = draw(st.integers(0, n))  # n == the Conductor itself (recursion)
        steps.append(Step(worker, draw(st.sampled_from(["solve", "check {x} [y]", "x" * 3000])), access))
    names = [w.info.name for w in workers]
    allowed = draw(st.one_of(st.none(), st.sets(st.sampled_from(names)).map(frozenset)))
    limits = Limits(
        max_cost_usd=draw(_BUDGETS),
        allowed_workers=allowed,
        sensitivity=draw(st.sampled_from(["public", "private"])),
        max_tokens=draw(st.sampled_from([1, 64, 100, 4096])),
        recursion_depth=draw(st.integers(0, 2)),
    )
    return workers, Workflow(steps=tuple(steps)), limits


async def test_settled_reservations_do_not_block_a_later_step() -> None:
    """Reservations of 0.1 and 0.2 leave float residue (0.1 + 0.2 - 0.1 - 0.2 > 0); a later step that
    cannot afford its call must be skipped, not wait forever for a sibling that does not exist."""
    a = _worker("a", price_in=0.0, price_out=1000.0, output_tokens=1)
    b = _worker("b", price_in=0.0, price_out=2000.0, output_tokens=1, latency_s=0.01)
    dear = _worker("dear", price_in=0.0, price_out=1e9)
    wf = Workflow(steps=(Step(0, "x", ()), Step(1, "y", ()), Step(2, "z", "all")))
    limits = Limits(max_cost_usd=1.0, max_tokens=100)
    trace = await asyncio.wait_for(execute(wf, TASK, _view(a, b, dear), limits), timeout=5)
    assert [s.status for s in trace.steps] == ["ok", "ok", "skipped_budget"]
    assert trace.final_answer == "answer from b"


def _flatten(trace_steps: list[StepRecord]) -> list[StepRecord]:
    out: list[StepRecord] = []
    for s in trace_steps:
        out.append(s)
        out.extend(_flatten(s.substeps))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_limits_are_never_violated(scenario: tuple[list[FakeWorker], Workflow, Limits]) -> None:
    workers, wf, limits = scenario
    view = _view(*workers)
    inner = Workflow(steps=(Step(0, "verify", "all"), Step(len(view), "again", "all")))

    async def hook(req: RecursionRequest) -> Trace:
        return await execute(inner, req.task, view, req.limits, recursion=hook, depth=req.depth)

    async def go() -> Trace:
        return await asyncio.wait_for(execute(wf, TASK, view, limits, recursion=hook), timeout=2)

    trace = asyncio.run(go())
    if limits.max_cost_usd is not None:
        assert trace.cost_usd <= limits.max_cost_usd
    for w in workers:
        if not limits.permits(w.info.name, w.info.hosting):
            assert w.calls == [], (
                f"{w.info.name} ({w.info.hosting}) was called on a {limits.sensitivity} request"
            )
        for call in w.calls:
            assert 1 <= int(call["max_tokens"]) <= limits.max_tokens  # type: ignore[call-overload]
    by_name = {w.info.name: w for w in workers}
    for rec in _flatten(trace.steps):
        assert rec.status in ("ok", "skipped_budget", "skipped_forbidden", "failed", "recursed")
        if rec.status == "ok":
            w = by_name[rec.worker]
            assert limits.permits(w.info.name, w.info.hosting)
            assert rec.cost_usd == pytest.approx(w.info.cost(rec.input_tokens, rec.output_tokens))
    answered = [r for r in trace.steps if r.status in ("ok", "recursed") and r.answer]
    assert trace.final_answer == (answered[-1].answer if answered else "")
    assert trace.cost_usd >= 0 and math.isfinite(trace.cost_usd)


# ----------------------------------------------------------------------------- budgets and skipping


async def test_budget_skips_unaffordable_step_and_its_dependents() -> None:
    free = _worker("free", price_in=0.0, price_out=0.0)
    dear = _worker("dear", price_in=100.0, price_out=1000.0)
    wf = Workflow(steps=(Step(0, "draft", ()), Step(1, "improve", "all"), Step(0, "polish", (1,))))
    trace = await execute(wf, TASK, _view(free, dear), Limits(max_cost_usd=0.01))
    assert [s.status for s in trace.steps] == ["ok", "skipped_budget", "skipped_budget"]
    assert dear.calls == []
    assert len(free.calls) == 1
    assert trace.final_answer == "answer from free"
    assert trace.stopped_reason == "skipped_budget"
    assert trace.cost_usd == 0.0


async def test_budget_caps_output_tokens_to_what_it_affords() -> None:
    w = _worker("w", price_in=0.0, price_out=10.0, output_tokens=4096)
    trace = await execute(Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(w), Limits(max_cost_usd=0.001))
    assert trace.steps[0].status == "ok"
    # $0.001 buys 100 tokens at $10 / 1M (99 when float rounding falls below)
    assert 99 <= int(w.calls[0]["max_tokens"]) <= 100  # type: ignore[call-overload]
    assert trace.cost_usd <= 0.001


async def test_parallel_siblings_share_the_budget() -> None:
    ws = [
        _worker(f"w{i}", price_in=0.0, price_out=10.0, output_tokens=4096, latency_s=0.01) for i in range(3)
    ]
    wf = Workflow(steps=tuple(Step(i, "solve", ()) for i in range(3)))
    trace = await execute(wf, TASK, _view(*ws), Limits(max_cost_usd=0.003, max_tokens=150))
    assert trace.cost_usd <= 0.003
    assert sum(s.status == "ok" for s in trace.steps) == 2  # 150 tokens each, 300 affordable in all
    assert sum(s.status == "skipped_budget" for s in trace.steps) == 1


# ----------------------------------------------------------------------------- privacy and allowed workers


async def test_private_request_substitutes_a_self_hosted_worker() -> None:
    ext = _worker("ext", hosting="external", price_out=10.0)
    cheap_self = _worker("self-cheap", hosting="self", price_out=1.0)
    close_self = _worker("self-close", hosting="self", price_out=9.0)
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)),
        TASK,
        _view(ext, cheap_self, close_self),
        Limits(sensitivity="private"),
    )
    assert ext.calls == []
    assert trace.steps[0].worker == "self-close"  # the permitted worker closest in price
    assert "not permitted" in trace.steps[0].note


async def test_private_request_without_self_workers_is_skipped() -> None:
    ext = _worker("ext")
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(ext), Limits(sensitivity="private")
    )
    assert ext.calls == []
    assert trace.steps[0].status == "skipped_forbidden"
    assert trace.final_answer == ""


async def test_allowed_workers_are_respected() -> None:
    a, b, c = _worker("a", price_out=1.0), _worker("b", price_out=5.0), _worker("c", price_out=6.0)
    wf = Workflow(steps=(Step(0, "x", ()), Step(1, "y", ()), Step(2, "z", "all")))
    trace = await execute(wf, TASK, _view(a, b, c), Limits(allowed_workers=frozenset({"c"})))
    assert a.calls == [] and b.calls == []
    assert [s.worker for s in trace.steps] == ["c", "c", "c"]


# ----------------------------------------------------------------------------- failures


async def test_failing_worker_falls_back_to_same_hosting_class() -> None:
    bad = _worker("bad", hosting="external", price_out=10.0, fail_times=10)
    self_near = _worker("self-near", hosting="self", price_out=10.0)
    ext_far = _worker("ext-far", hosting="external", price_out=50.0)
    trace = await execute(Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(bad, self_near, ext_far))
    rec = trace.steps[0]
    assert rec.status == "ok"
    assert rec.worker == "ext-far"
    assert "fallback to ext-far" in rec.note and "scripted failure" in rec.note
    assert self_near.calls == []
    assert trace.final_answer == "answer from ext-far"


async def test_failure_without_fallback_fails_and_dependents_run_without_it() -> None:
    bad = _worker("bad", hosting="external", fail_times=10)
    good = _worker("good", hosting="self", responder=_step_answer)
    wf = Workflow(steps=(Step(0, "solve", ()), Step(1, "check", "all")))
    trace = await execute(wf, TASK, _view(bad, good))
    assert [s.status for s in trace.steps] == ["failed", "ok"]
    assert trace.steps[1].visible == []
    assert "Earlier steps" not in _message(good.calls[0])
    assert trace.final_answer == "ANSWER-1"


async def test_hanging_worker_times_out_and_fallback_answers() -> None:
    hung = _worker("hung", hang=True, price_out=2.0)
    backup = _worker("backup", price_out=3.0)
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(hung, backup), Limits(step_timeout_s=0.1)
    )
    assert trace.steps[0].status == "ok"
    assert trace.steps[0].worker == "backup"
    assert "timed out" in trace.steps[0].note
    assert trace.final_answer == "answer from backup"
    assert trace.wall_s < 1.0


async def test_empty_answer_counts_as_failure() -> None:
    mute = _worker("mute", answer="   ")
    trace = await execute(Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(mute))
    assert trace.steps[0].status == "failed"
    assert "empty answer" in trace.steps[0].note


@pytest.mark.timeout(10)
@pytest.mark.parametrize("access", [((1,), (0,)), ((0,), ())], ids=["cycle", "self"])
async def test_cyclic_workflow_is_rejected(access: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    w = _worker("w")
    wf = Workflow(steps=(Step(0, "a", access[0]), Step(0, "b", access[1])))
    with pytest.raises(ValueError, match="earlier"):
        await execute(wf, TASK, _view(w))
    assert w.calls == []


async def test_out_of_view_worker_id_is_rejected() -> None:
    with pytest.raises(ValueError, match="outside the view"):
        await execute(Workflow(steps=(Step(5, "a", ()),)), TASK, _view(_worker("w")))


async def test_workflow_is_truncated_to_max_steps() -> None:
    w = _worker("w", responder=_step_answer)
    wf = Workflow(steps=tuple(Step(0, f"s{i}", ()) for i in range(4)))
    trace = await execute(wf, TASK, _view(w), Limits(max_steps=2))
    assert len(trace.steps) == 2 and len(w.calls) == 2
    assert trace.final_answer == "ANSWER-1"
    assert any("truncated" in n for n in trace.notes)


# ----------------------------------------------------------------------------- recursion


class _Recorder:
    """A recursion hook that runs a fixed inner workflow (which itself recurses again)."""

    def __init__(self, view: PoolView, inner: Workflow) -> None:
        self.view, self.inner = view, inner
        self.requests: list[RecursionRequest] = []

    async def __call__(self, req: RecursionRequest) -> Trace:
        self.requests.append(req)
        return await execute(self.inner, req.task, self.view, req.limits, recursion=self, depth=req.depth)


@pytest.mark.parametrize("depth_limit", [0, 1, 2])
async def test_recursion_hook_and_depth_limit(depth_limit: int) -> None:
    w = _worker("w", responder=lambda m, ctx: f"ANSWER-{ctx.step_index}-nonce{ctx.nonce}")  # type: ignore[union-attr]
    view = _view(w)
    me = len(view)
    outer = Workflow(steps=(Step(0, "solve", ()), Step(me, "reconsider", "all")))
    inner = Workflow(steps=(Step(0, "verify", "all"), Step(me, "reconsider again", "all")))
    hook = _Recorder(view, inner)
    trace = await execute(outer, TASK, view, Limits(recursion_depth=depth_limit), recursion=hook)

    assert len(hook.requests) == depth_limit
    for d, req in enumerate(hook.requests, start=1):
        assert req.depth == d
        assert req.step_index == 1
    if hook.requests:
        first = hook.requests[0]
        assert first.parent is outer
        assert first.answer_so_far == "ANSWER-0-nonce0"
        assert first.visible == ((0, "solve", "ANSWER-0-nonce0"),)
    if len(hook.requests) > 1:
        assert hook.requests[-1].parent is inner
    rec = trace.steps[1]
    assert rec.status == "recursed"
    # each level adds one call; beyond the limit the previous answer is kept
    assert len(w.calls) == 1 + depth_limit
    assert trace.calls == 1 + depth_limit
    expected = "ANSWER-0-nonce0" if depth_limit == 0 else f"ANSWER-0-nonce{100 * depth_limit}"
    assert trace.final_answer == expected
    if depth_limit == 0:
        assert "depth reached" in rec.note and rec.substeps == []
    else:
        assert len(rec.substeps) == 2
    assert trace.cost_usd == pytest.approx(
        sum(w.info.cost(c.input_tokens, c.output_tokens) for c in _flatten(trace.steps) if c.status == "ok")
    )


async def test_recursion_that_keeps_the_answer() -> None:
    w = _worker("w")
    view = _view(w)

    async def keep(req: RecursionRequest) -> Trace:
        return Trace(task_id=req.task.id)  # an empty inner workflow

    wf = Workflow(steps=(Step(0, "solve", ()), Step(len(view), "reconsider", "all")))
    trace = await execute(wf, TASK, view, recursion=keep)
    assert trace.steps[1].status == "recursed"
    assert trace.final_answer == "answer from w"
    assert "kept the previous answer" in trace.steps[1].note


async def test_recursion_inherits_the_remaining_budget() -> None:
    w = _worker("w", price_in=0.0, price_out=10.0, output_tokens=4096)
    view = _view(w)
    seen: list[float | None] = []

    async def hook(req: RecursionRequest) -> Trace:
        seen.append(req.limits.max_cost_usd)
        return await execute(
            Workflow(steps=(Step(0, "verify", ()),)), req.task, view, req.limits, depth=req.depth
        )

    wf = Workflow(steps=(Step(0, "solve", ()), Step(len(view), "reconsider", "all")))
    trace = await execute(wf, TASK, view, Limits(max_cost_usd=0.01, max_tokens=200), recursion=hook)
    assert seen == [pytest.approx(0.01 - 200 * 10 / 1e6)]
    assert trace.cost_usd <= 0.01
    assert trace.cost_usd == pytest.approx(2 * 200 * 10 / 1e6)
