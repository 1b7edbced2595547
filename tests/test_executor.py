"""The executor: concurrency, dependencies, messages, budgets, privacy, failures and rounds.

Workers are the library's :class:`FakeWorker` (fixed latency, scripted answers and failures),
which record every call they receive, so the tests can check who was called, when, and with
what message. A hypothesis property runs random workflows on random pools under random limits
and checks the executor's guarantees: never over budget, never an external worker on a private
request, never a worker outside ``allowed_workers``, never more calls than ``max_calls`` — in
every round, whatever a review hook adds (or when it raises).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_conductor.executor import Continuation, RoundRequest, execute, reserve_input_tokens
from rl_conductor.limits import MIN_OUTPUT_TOKENS, RequestLimits
from rl_conductor.tasks.base import Task
from rl_conductor.trace import STEP_STATUSES, Trace
from rl_conductor.validation import InvalidValue
from rl_conductor.workers.base import CallContext, Completion, Hosting, Message
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.kinds import info_from_spec
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow, worker_message

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

# prices in USD per million tokens: free, cheap (<= $1, where a `> 1` price test would drop the
# output cap), mid and dear; input prices are drawn separately so reservations include input cost
_PRICES = st.sampled_from(
    [0.0, 0.01, 0.1, 0.5, 1.0, 1.25, 3.0, 10.0, 15.0, 60.0, 600.0, 1000.0, 2000.0, 3000.0]
)
_CHEAP = st.sampled_from([0.01, 0.1, 0.5, 1.0])
# budgets around the cost of one call: a step of ~300 input tokens and 64-4096 output tokens
# costs 1e-7..1e-2 at these prices, so most draws run some steps and stop others
_BUDGETS = st.one_of(
    st.none(),
    st.floats(min_value=1e-7, max_value=0.05, allow_nan=False, allow_infinity=False),
    st.sampled_from([1e-6, 3e-5, 1e-4, 2e-4, 1e-3, 0.01, 0.1, 1.0]),
)


@dataclass(frozen=True)
class _Scenario:
    workers: list[FakeWorker]
    workflow: Workflow
    limits: RequestLimits
    hook_raises: bool
    #: what the review hook adds after each round (worker, access) per step; global access
    added: tuple[tuple[tuple[int, str | tuple[int, ...]], ...], ...] = ()


def _scenario_worker(draw: st.DrawFn, i: int) -> FakeWorker:
    cheap = draw(st.booleans())
    price_in = draw(_CHEAP if cheap else _PRICES)
    price_out = draw(_CHEAP if cheap else _PRICES)
    mode = draw(st.sampled_from(["ok", "ok", "ok", "fail", "flaky", "empty", "hang"]))
    return FakeWorker(
        info=fake_info(
            f"w{i}",
            price_in=price_in,
            price_out=price_out,
            hosting=draw(st.sampled_from(["self", "external"])),
        ),
        answer="   " if mode == "empty" else f"answer from w{i}",
        output_tokens=draw(st.sampled_from([1, 50, 63, 64, 65, 700, 4096, 10_000])),
        fail_times={"fail": 100, "flaky": 1}.get(mode, 0),
        hang=mode == "hang",
        latency_s=draw(st.sampled_from([0.0, 0.0, 0.001])),
    )


@st.composite
def _scenarios(draw: st.DrawFn) -> _Scenario:
    n = draw(st.integers(1, 5))
    workers = [_scenario_worker(draw, i) for i in range(n)]
    rounds = draw(st.integers(1, 3))
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
        worker = draw(st.integers(0, n - 1))
        steps.append(Step(worker, draw(st.sampled_from(["solve", "check {x} [y]", "x" * 3000])), access))
    names = [w.info.name for w in workers]
    allowed = draw(st.one_of(st.none(), st.sets(st.sampled_from(names)).map(frozenset)))
    limits = RequestLimits(
        max_cost_usd=draw(_BUDGETS),
        allowed_workers=allowed,
        sensitivity=draw(st.sampled_from(["public", "private"])),
        max_tokens=draw(st.sampled_from([64, 65, 100, 4096])),
        max_rounds=rounds,
        max_calls=draw(st.one_of(st.none(), st.integers(1, 8))),
        step_timeout_s=0.05,
    )
    # per later round, the steps a review adds: workers of the view, access "all", none or a
    # reference to the step just before (always earlier in the whole workflow)
    added = draw(
        st.lists(
            st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(["all", (), "prev"])), max_size=3).map(
                tuple
            ),
            min_size=2,
            max_size=2,
        ).map(tuple)
    )
    return _Scenario(workers, Workflow(steps=tuple(steps)), limits, draw(st.booleans()), added)


async def test_settled_reservations_do_not_block_a_later_step() -> None:
    """Reservations of 0.1 and 0.2 leave float residue (0.1 + 0.2 - 0.1 - 0.2 > 0); a later step that
    cannot afford its call must be skipped, not wait forever for a sibling that does not exist."""
    a = _worker("a", price_in=0.0, price_out=1000.0, output_tokens=1)
    b = _worker("b", price_in=0.0, price_out=2000.0, output_tokens=1, latency_s=0.01)
    dear = _worker("dear", price_in=0.0, price_out=1e9)
    wf = Workflow(steps=(Step(0, "x", ()), Step(1, "y", ()), Step(2, "z", "all")))
    limits = RequestLimits(max_cost_usd=1.0, max_tokens=100)
    trace = await asyncio.wait_for(execute(wf, TASK, _view(a, b, dear), limits), timeout=5)
    assert [s.status for s in trace.steps] == ["ok", "ok", "skipped_budget"]
    assert trace.final_answer == "answer from b"


def _check_trace(trace: Trace, workers: list[FakeWorker], limits: RequestLimits) -> None:
    """The executor's promises, for any workflow, pool, failures and limits."""
    by_name = {w.info.name: w for w in workers}
    records = trace.steps
    # cost: what the budget was charged is exactly what the trace reports, within the limit
    assert trace.cost_usd == pytest.approx(trace.charged_usd, rel=1e-9, abs=1e-15)
    assert trace.cost_usd >= 0 and math.isfinite(trace.cost_usd)
    if limits.max_cost_usd is not None:
        assert trace.cost_usd <= limits.max_cost_usd
    if limits.max_calls is not None:
        assert len(trace.attempts) <= limits.max_calls
    # rounds: one record per round, the steps of all rounds in order, costs adding up
    if trace.rounds:
        assert [r.index for r in trace.rounds] == list(range(1, len(trace.rounds) + 1))
        assert len(trace.rounds) <= limits.max_rounds
        assert sorted(i for r in trace.rounds for i in r.steps) == list(range(len(trace.steps)))
        assert sum(r.cost_usd for r in trace.rounds) == pytest.approx(trace.cost_usd, rel=1e-9, abs=1e-15)
    else:
        assert limits.max_rounds == 1
    # every call a worker received is an attempt in the trace, and no other
    calls = sorted(name for name, w in by_name.items() for _ in w.calls)
    assert sorted(trace.workers_called) == calls
    for w in workers:
        if not limits.permits(w.info.name, w.info.hosting):
            assert w.calls == [], (
                f"{w.info.name} ({w.info.hosting}) was called on a {limits.sensitivity} request"
            )
        for call in w.calls:
            assert MIN_OUTPUT_TOKENS <= int(call["max_tokens"]) <= limits.max_tokens  # type: ignore[call-overload]
    for rec in records:
        assert rec.status in STEP_STATUSES
        assert rec.cost_usd == pytest.approx(sum(a.cost_usd for a in rec.attempts))
        for a in rec.attempts:
            info = by_name[a.worker].info
            # no attempt of any kind (first try, fallback, later round) names a forbidden worker
            assert limits.permits(info.name, info.hosting)
            if a.status in ("ok", "empty"):
                assert a.cost_usd == pytest.approx(info.cost(a.input_tokens, a.output_tokens))
        if rec.worker:
            assert rec.worker == rec.attempts[-1].worker  # the audit names who decided the step
        elif rec.status in ("ok", "failed"):
            raise AssertionError(f"step {rec.index} is {rec.status} without a worker")
        if rec.status == "ok":
            assert rec.attempts[-1].status == "ok"
    answered = [r for r in trace.steps if r.status == "ok" and r.answer]
    assert trace.final_answer == (answered[-1].answer if answered else "")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_limits_are_never_violated(scenario: _Scenario) -> None:
    workers, wf, limits = scenario.workers, scenario.workflow, scenario.limits
    view = _view(*workers)
    seen: list[RoundRequest] = []

    async def review(req: RoundRequest) -> Continuation:
        seen.append(req)
        if scenario.hook_raises and req.round == 3:
            raise RuntimeError("the policy broke in its second review")
        first = len(req.workflow.steps)
        steps = tuple(
            Step(w, "again", (first + k - 1,) if acc == "prev" else acc)  # type: ignore[arg-type]
            for k, (w, acc) in enumerate(scenario.added[req.round - 2])
        )
        return Continuation(workflow=Workflow(steps=steps), text="review")

    async def go() -> Trace:
        return await asyncio.wait_for(execute(wf, TASK, view, limits, review=review), timeout=10)

    trace = asyncio.run(go())
    for req in seen:
        # what a review is told is left: never more than the request has left
        if limits.max_cost_usd is not None:
            assert req.limits.max_cost_usd is not None and req.limits.max_cost_usd <= limits.max_cost_usd
        if limits.max_calls is not None:
            assert req.limits.max_steps <= limits.max_calls
    _check_trace(trace, workers, limits)


# ----------------------------------------------------------------------------- budgets and skipping


async def test_budget_skips_unaffordable_step_and_its_dependents() -> None:
    free = _worker("free", price_in=0.0, price_out=0.0)
    dear = _worker("dear", price_in=100.0, price_out=1000.0)
    wf = Workflow(steps=(Step(0, "draft", ()), Step(1, "improve", "all"), Step(0, "polish", (1,))))
    trace = await execute(wf, TASK, _view(free, dear), RequestLimits(max_cost_usd=0.01))
    assert [s.status for s in trace.steps] == ["ok", "skipped_budget", "skipped_budget"]
    assert [s.note for s in trace.steps[1:]] == ["budget exhausted", "a step it depends on was skipped"]
    assert [s.worker for s in trace.steps[1:]] == ["", ""]  # nobody saw the request for them
    assert [s.requested_worker for s in trace.steps[1:]] == ["dear", "free"]
    assert dear.calls == []
    assert len(free.calls) == 1
    assert trace.final_answer == "answer from free"
    assert trace.stopped_reason == "skipped_budget"
    assert trace.cost_usd == 0.0


async def test_budget_caps_output_tokens_to_what_it_affords() -> None:
    w = _worker("w", price_in=0.0, price_out=10.0, output_tokens=4096)
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(w), RequestLimits(max_cost_usd=0.001)
    )
    assert trace.steps[0].status == "ok"
    # $0.001 buys 100 tokens at $10 / 1M (99 when float rounding falls below)
    assert 99 <= int(w.calls[0]["max_tokens"]) <= 100  # type: ignore[call-overload]
    assert trace.cost_usd <= 0.001


async def test_parallel_siblings_share_the_budget() -> None:
    ws = [
        _worker(f"w{i}", price_in=0.0, price_out=10.0, output_tokens=4096, latency_s=0.01) for i in range(3)
    ]
    wf = Workflow(steps=tuple(Step(i, "solve", ()) for i in range(3)))
    trace = await execute(wf, TASK, _view(*ws), RequestLimits(max_cost_usd=0.003, max_tokens=150))
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
        RequestLimits(sensitivity="private"),
    )
    assert ext.calls == []
    assert trace.steps[0].worker == "self-close"  # the permitted worker closest in price
    assert "not permitted" in trace.steps[0].note


async def test_private_request_without_self_workers_is_skipped() -> None:
    ext = _worker("ext")
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(ext), RequestLimits(sensitivity="private")
    )
    assert ext.calls == []
    assert trace.steps[0].status == "skipped_forbidden"
    assert trace.final_answer == ""


async def test_allowed_workers_are_respected() -> None:
    a, b, c = _worker("a", price_out=1.0), _worker("b", price_out=5.0), _worker("c", price_out=6.0)
    wf = Workflow(steps=(Step(0, "x", ()), Step(1, "y", ()), Step(2, "z", "all")))
    trace = await execute(wf, TASK, _view(a, b, c), RequestLimits(allowed_workers=frozenset({"c"})))
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
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(hung, backup), RequestLimits(step_timeout_s=0.1)
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


@pytest.mark.parametrize("blank", [" \n\t \u200b", "\u200b\u200c\ufeff", "\x00 \u2028"])
async def test_an_answer_of_invisible_characters_is_an_empty_answer(blank: str) -> None:
    """Whitespace plus zero-width or control characters is as blank as a blank question: the step
    is empty and falls back (before: a zero-width space made it an answer, served with a 200)."""
    mute = _worker("mute", answer=blank, hosting="self")
    backup = _worker("backup", hosting="self")
    trace = await execute(Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(mute, backup))
    assert [(a.worker, a.status) for a in trace.steps[0].attempts] == [("mute", "empty"), ("backup", "ok")]
    assert trace.final_answer == "answer from backup"


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
    trace = await execute(wf, TASK, _view(w), RequestLimits(max_steps=2))
    assert len(trace.steps) == 2 and len(w.calls) == 2
    assert trace.final_answer == "ANSWER-1"
    assert any("truncated" in n for n in trace.notes)


async def test_execute_cancelled_stops_steps_in_flight() -> None:
    slow = _worker("slow", latency_s=5.0)
    task = asyncio.ensure_future(
        execute(Workflow(steps=(Step(0, "a", ()), Step(0, "b", ()))), TASK, _view(slow))
    )
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not [t for t in pending if "_run_step" in repr(t.get_coro())]


# ----------------------------------------------------------------------------- the review's findings


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_cost_usd", float("nan")),
        ("max_cost_usd", float("inf")),
        ("max_cost_usd", 0.0),
        ("max_cost_usd", -1.0),
        ("max_cost_usd", True),
        ("max_cost_usd", "1"),
        ("max_tokens", 32),
        ("max_tokens", MIN_OUTPUT_TOKENS - 1),
        ("max_steps", 0),
        ("step_timeout_s", float("nan")),
        ("temperature", -0.1),
        ("max_rounds", 0),
        ("max_rounds", True),
        ("max_calls", 0),
        ("sensitivity", "secret"),
        ("allowed_workers", ["a"]),
    ],
)
def test_limits_reject_values_no_request_could_mean(field: str, value: object) -> None:
    """Findings 2 and 3: a NaN budget meant unlimited spending; max_tokens < 64 read as "exhausted"."""
    with pytest.raises(InvalidValue, match=field):
        RequestLimits(**{field: value})  # type: ignore[arg-type]


def test_limits_accept_the_boundaries() -> None:
    lim = RequestLimits(max_cost_usd=1e-9, max_tokens=MIN_OUTPUT_TOKENS, max_steps=1, temperature=0.0)
    assert lim.max_tokens == MIN_OUTPUT_TOKENS and lim.max_rounds == 1 and lim.max_calls is None
    assert RequestLimits(max_rounds=3, max_calls=1).max_rounds == 3


def test_pool_rejects_a_worker_that_cannot_start_a_call() -> None:
    """Finding 3: a pool worker with max_output_tokens < 64 could never run a step."""
    spec = {"name": "tiny", "kind": "fake", "max_output_tokens": 32}
    with pytest.raises(InvalidValue, match="max_output_tokens"):
        info_from_spec(spec)
    assert info_from_spec({**spec, "max_output_tokens": MIN_OUTPUT_TOKENS}).max_output_tokens == 64


async def test_blank_answer_cost_is_in_the_trace() -> None:
    """Finding 4: a blank answer was charged to the budget but missing from trace.cost_usd."""
    mute = _worker("mute", answer="  ", price_in=1.0, price_out=2.0)
    backup = _worker("backup", price_in=1.0, price_out=2.5)
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(mute, backup), RequestLimits(max_cost_usd=1.0)
    )
    rec = trace.steps[0]
    assert rec.status == "ok" and rec.worker == "backup"
    assert [(a.worker, a.status) for a in rec.attempts] == [("mute", "empty"), ("backup", "ok")]
    blank, good = rec.attempts
    assert blank.cost_usd > 0 and "empty answer" in blank.error
    assert trace.cost_usd == pytest.approx(blank.cost_usd + good.cost_usd)
    assert trace.cost_usd == pytest.approx(trace.charged_usd)
    assert rec.input_tokens == blank.input_tokens + good.input_tokens


async def test_timed_out_call_is_recorded_at_its_reservation() -> None:
    """Finding 4: a timed-out call was charged its reservation but recorded as $0."""
    hung = _worker("hung", hang=True, price_in=1.0, price_out=2.0)
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)),
        TASK,
        _view(hung),
        RequestLimits(max_cost_usd=1.0, max_tokens=100, step_timeout_s=0.05),
    )
    rec = trace.steps[0]
    assert rec.status == "failed" and rec.worker == "hung"
    (attempt,) = rec.attempts
    assert attempt.status == "timeout" and attempt.latency_s == 0.05
    message = _message(hung.calls[0])
    reserved = (math.ceil(len(message) / 2.5) + 16) * 1.0 / 1e6 + 100 * 2.0 / 1e6
    assert attempt.cost_usd == pytest.approx(reserved)
    assert trace.cost_usd == pytest.approx(trace.charged_usd) == pytest.approx(reserved)


async def test_private_audit_never_names_an_external_worker() -> None:
    """Finding 5: the record kept the requested external worker's name when the substitute failed."""
    ext = _worker("ext", hosting="external", price_out=10.0)
    local = _worker("local", hosting="self", price_out=9.0, fail_times=10)
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(ext, local), RequestLimits(sensitivity="private")
    )
    rec = trace.steps[0]
    assert ext.calls == []
    assert rec.status == "failed"
    assert rec.worker == "local" and rec.requested_worker == "ext"
    assert trace.workers_called == ["local"]
    forbidden = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(ext), RequestLimits(sensitivity="private")
    )
    assert forbidden.steps[0].worker == "" and forbidden.workers_called == []


async def test_cheap_output_price_still_caps_tokens() -> None:
    """Mutant `price_out > 0` -> `> 1`: a worker at <= $1/M output tokens got no cap."""
    cheap = _worker("cheap", price_in=0.0, price_out=0.5, output_tokens=10_000)
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(cheap), RequestLimits(max_cost_usd=1e-4)
    )
    assert int(cheap.calls[0]["max_tokens"]) in (199, 200)  # type: ignore[call-overload]
    assert trace.cost_usd <= 1e-4


async def test_reservation_covers_input_cost() -> None:
    """Mutant halving the input reservation: a long question at a high input price overspent."""
    w = _worker("w", price_in=10.0, price_out=10.0, output_tokens=10_000)
    task = Task(id="t/long", question="y" * 6000, answer="", domain="qa", source="test", grader="qa")
    budget = 0.03  # the input reservation (~$0.025) leaves ~500 output tokens; half of it, ~1750
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), task, _view(w), RequestLimits(max_cost_usd=budget)
    )
    assert trace.steps[0].status == "ok"
    assert trace.cost_usd <= budget
    assert int(w.calls[0]["max_tokens"]) < 600  # type: ignore[call-overload]


async def test_fallback_picks_the_closest_price_among_several() -> None:
    """Mutant: the fallback after a failure picked the furthest-priced worker (one candidate before)."""
    bad = _worker("bad", price_out=10.0, fail_times=10)
    far_low = _worker("far-low", price_out=1.0)
    near = _worker("near", price_out=12.0)
    far_high = _worker("far-high", price_out=60.0)
    trace = await execute(Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(bad, far_low, near, far_high))
    assert trace.steps[0].worker == "near"
    assert far_low.calls == [] and far_high.calls == []


async def test_step_that_affords_exactly_the_minimum_runs() -> None:
    """Mutant `cap >= MIN_OUTPUT_TOKENS` -> `>`: the boundary was untested."""
    w = _worker("w", price_in=0.0, price_out=10.0, output_tokens=4096)
    exact = MIN_OUTPUT_TOKENS * 10.0 / 1e6 * (1 + 2e-9)  # the executor keeps 1e-9 of slack
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(w), RequestLimits(max_cost_usd=exact)
    )
    assert trace.steps[0].status == "ok"
    assert int(w.calls[0]["max_tokens"]) == MIN_OUTPUT_TOKENS  # type: ignore[call-overload]
    below = MIN_OUTPUT_TOKENS * 10.0 / 1e6 * (1 - 1e-6)
    skipped = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(w), RequestLimits(max_cost_usd=below)
    )
    assert skipped.steps[0].status == "skipped_budget" and len(w.calls) == 1


async def test_a_waiting_sibling_starts_when_a_settled_call_frees_budget() -> None:
    """A settled reservation is released at once: a step waiting for budget starts while a hung
    sibling is still in flight, not only once every sibling has settled (here: timed out)."""
    quick = _worker("quick", price_in=0.0, price_out=10.0, output_tokens=1, latency_s=0.01)
    hung = _worker("hung", price_in=0.0, price_out=10.0, hang=True, hosting="self")  # no fallback
    waiting = _worker("waiting", price_in=0.0, price_out=10.0, output_tokens=1)
    wf = Workflow(steps=(Step(0, "a", ()), Step(1, "b", ()), Step(2, "c", ())))
    # room for two 100-token reservations, not three; quick's call costs 1 token and frees 99
    limits = RequestLimits(max_cost_usd=2 * 100 * 10 / 1e6 * 1.01, max_tokens=100, step_timeout_s=2.0)
    trace = await execute(wf, TASK, _view(quick, hung, waiting), limits)
    assert [s.status for s in trace.steps] == ["ok", "failed", "ok"]
    # the waiting call began before the hung call's timeout settled it (2 s after it began)
    assert float(waiting.calls[0]["t"]) < float(hung.calls[0]["t"]) + 2.0  # type: ignore[arg-type]


async def test_free_output_worker_runs_when_the_budget_equals_its_input_reservation() -> None:
    """Boundary of `avail < in_cost` for a worker with free output: equal is affordable."""
    limit = 1e-3
    w = _worker("w", price_in=_price_reserving_everything(limit, "solve"), price_out=0.0)
    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, _view(w), RequestLimits(max_cost_usd=limit)
    )
    assert trace.steps[0].status == "ok"
    assert trace.cost_usd <= limit


def _price_reserving_everything(limit: float, instruction: str) -> float:
    """The input price at which a first step's input reservation is exactly ``limit``'s budget."""
    in_tok = reserve_input_tokens(
        [{"role": "user", "content": worker_message(TASK.question, [], instruction)}]
    )
    avail = limit * (1 - 1e-9)  # the executor keeps 1e-9 of the budget as slack
    price = avail * 1e6 / in_tok
    for _ in range(10_000):  # the float price whose reservation is exactly what is left
        cost = in_tok * price / 1e6
        if cost == avail:
            return price
        price = math.nextafter(price, math.inf if cost < avail else -math.inf)
    raise AssertionError("no float price reserves exactly the budget")


class _LengthWorker:
    """Reports a truncated answer with estimated token counts (as a live worker may)."""

    def __init__(self) -> None:
        self.info = fake_info("cut", price_in=1.0, price_out=2.0)

    async def complete(
        self, messages: object, *, max_tokens: int, temperature: float, context: object = None
    ) -> Completion:
        return Completion(
            text="partial",
            input_tokens=10,
            output_tokens=max_tokens,
            cost_usd=self.info.cost(10, max_tokens),
            latency_s=0.0,
            worker="cut",
            finish_reason="length",
            tokens_estimated=True,
        )


async def test_truncation_and_estimated_tokens_are_recorded() -> None:
    view = Pool(name="p", workers=[_LengthWorker()]).view()  # type: ignore[list-item]
    trace = await execute(Workflow(steps=(Step(0, "solve", ()),)), TASK, view, RequestLimits(max_tokens=100))
    rec = trace.steps[0]
    assert rec.finish_reason == "length" and rec.tokens_estimated
    assert "output truncated at max_tokens" in rec.note


async def test_a_run_that_completes_has_no_stopped_reason() -> None:
    w = _worker("w")
    trace = await execute(Workflow(steps=(Step(0, "a", ()), Step(0, "b", "all"))), TASK, _view(w))
    assert trace.stopped_reason == "" and trace.final_answer == "answer from w"
    empty = await execute(Workflow(steps=()), TASK, _view(w))
    assert empty.stopped_reason == "" and empty.final_answer == "" and w.calls[2:] == []


def test_a_worker_fallback_is_the_executors_own_note_not_a_workers_error_text() -> None:
    """``Trace.worker_fallbacks`` counts a step the executor turned to another worker for (called
    or not), never one whose worker merely said "fallback to" in its error."""
    from rl_conductor.trace import StepRecord, Trace

    def step(note: str) -> StepRecord:
        return StepRecord(index=0, worker="gpt-5", instruction="", visible=[], status="failed", note=note)

    fell_back = Trace("t", steps=[step("gpt-5: HTTP 503; fallback to claude-sonnet-4")])
    assert fell_back.worker_fallbacks == 1
    said_it = Trace("t", steps=[step("gpt-5: HTTP 400: set fallback to true in your request")])
    assert said_it.worker_fallbacks == 0
