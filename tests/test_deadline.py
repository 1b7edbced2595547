"""A request's deadline (``RequestLimits.max_latency_s``), enforced by the executor (issue 13, first part).

The property runs random workflows on the simulated paper pool under random deadlines and checks
that no step ends after the deadline on the critical path (so ``trace.latency_s`` never exceeds
it), that steps the deadline stops are ``skipped_deadline`` and say so, and that a deadline far
away changes nothing. A worker that really sleeps checks that the time left is the call's
timeout (wall clock).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_conductor.executor import DEADLINE_MARGIN, execute
from rl_conductor.limits import MIN_OUTPUT_TOKENS, RequestLimits
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.trace import Trace
from rl_conductor.validation import InvalidValue
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.kinds import info_from_spec
from rl_conductor.workers.pool import Pool, load_pool
from rl_conductor.workflow import Step, Workflow

POOL = load_pool("paper-sim")
VIEW = POOL.view()
TASKS = load_tasks("paper-mix", split="test", limit=12, seed=3)
EPS = 1e-9


@st.composite
def _workflows(draw: st.DrawFn) -> Workflow:
    n = draw(st.integers(1, 5))
    steps = []
    for i in range(n):
        worker = draw(st.integers(0, len(VIEW) - 1))
        access = draw(st.sampled_from(["all", "none", "some"])) if i else "none"
        if access == "all":
            acc: str | tuple[int, ...] = "all"
        elif access == "none":
            acc = ()
        else:
            acc = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=i))))
        steps.append(Step(worker, f"subtask {i}", acc))
    return Workflow(steps=tuple(steps))


def _check(trace: Trace, deadline: float) -> None:
    assert trace.latency_s <= deadline + EPS
    for s in trace.steps:
        assert s.started_s + s.latency_s <= deadline + EPS, s
        if s.status == "skipped_deadline":
            assert "deadline" in s.note or "depends on" in s.note
        if s.status == "ok":
            assert all(a.latency_s <= deadline + EPS for a in s.attempts)
    if trace.steps and trace.steps[-1].status == "skipped_deadline":
        assert trace.stopped_reason == "skipped_deadline"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _workflows(),
    st.floats(0.2, 90.0, allow_nan=False),
    st.integers(0, len(TASKS) - 1),
    st.sampled_from([None, 0.01, 1.0]),
)
def test_critical_path_never_exceeds_the_deadline(
    workflow: Workflow, deadline: float, task_index: int, budget: float | None
) -> None:
    limits = RequestLimits(max_latency_s=deadline, max_cost_usd=budget)
    trace = asyncio.run(execute(workflow, TASKS[task_index], VIEW, limits))
    _check(trace, deadline)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_workflows(), st.integers(0, len(TASKS) - 1))
def test_a_distant_deadline_changes_nothing(workflow: Workflow, task_index: int) -> None:
    task = TASKS[task_index]
    free = asyncio.run(execute(workflow, task, VIEW, RequestLimits()))
    far = asyncio.run(execute(workflow, task, VIEW, RequestLimits(max_latency_s=3_600.0)))
    assert [(s.status, s.answer, s.latency_s) for s in far.steps] == [
        (s.status, s.answer, s.latency_s) for s in free.steps
    ]
    assert far.final_answer == free.final_answer


async def test_slow_step_and_its_dependents_are_skipped_while_an_independent_one_runs() -> None:
    names = VIEW.names()
    gemini, gpt5, claude = names.index("gemini-2.5-pro"), names.index("gpt-5"), names.index("claude-sonnet-4")
    wf = Workflow(steps=(Step(gemini, "solve", ()), Step(gpt5, "solve", ()), Step(claude, "use 0", (0,))))
    trace = await execute(wf, TASKS[0], VIEW, RequestLimits(max_latency_s=2.5))
    first, second, third = trace.steps
    assert first.status == "skipped_deadline" and "too little for gemini-2.5-pro" in first.note
    assert first.attempts == []  # never called: the latency model says it cannot answer in time
    assert third.status == "skipped_deadline" and third.note == "a step it depends on was skipped"
    assert second.attempts and second.attempts[0].worker == "gpt-5"  # the independent step ran
    _check(trace, 2.5)


async def test_output_is_capped_to_what_the_time_left_affords() -> None:
    gpt5 = VIEW.worker(VIEW.names().index("gpt-5"))
    step = Workflow(steps=(Step(VIEW.names().index("gpt-5"), "solve", ()),))
    trace = await execute(step, TASKS[1], VIEW, RequestLimits(max_latency_s=4.0))
    (rec,) = trace.steps
    assert "deadline: output capped at" in rec.note
    cap = int(rec.note.split("capped at ")[1].split(" ")[0])
    assert MIN_OUTPUT_TOKENS <= cap < 4096
    assert rec.attempts[0].output_tokens <= cap
    # the cap is what the median latency model fits into DEADLINE_MARGIN of the time left
    assert gpt5.info.estimate_latency_s(0, cap) is not None
    assert gpt5.info.estimate_latency_s(0, cap) <= 4.0 * DEADLINE_MARGIN + 1e-6  # type: ignore[operator]


async def test_time_left_is_the_calls_timeout_on_a_worker_that_really_waits() -> None:
    slow = FakeWorker(info=fake_info("slow"), latency_s=3.0)  # no latency model: only the timeout
    view = Pool(name="p", workers=[slow]).view()
    wf = Workflow(steps=(Step(0, "solve", ()),))
    t0 = time.perf_counter()
    trace = await execute(wf, TASKS[0], view, RequestLimits(max_latency_s=0.3))
    wall = time.perf_counter() - t0
    (rec,) = trace.steps
    assert rec.status == "skipped_deadline"
    assert rec.attempts[0].status == "timeout" and "deadline" in rec.attempts[0].error
    assert rec.latency_s == pytest.approx(0.3)
    assert wall < 2.0  # it stopped waiting at the deadline, not after the worker's 3 s
    assert trace.final_answer == ""


def test_pool_files_state_a_latency_model_and_limits_validate_the_deadline() -> None:
    info = info_from_spec(
        {"name": "w", "kind": "openai", "ttft_s": 0.5, "tokens_per_s": 100, "prefill_tokens_per_s": 1000}
    )
    assert info.estimate_latency_s(1000, 100) == pytest.approx(0.5 + 1.0 + 1.0)
    assert info.tokens_within(2.5, 1000) == 100
    assert fake_info("x").tokens_within(10.0, 0) is None  # unknown model: only timeouts apply
    assert VIEW.worker(0).info.ttft_s is not None  # simulated workers carry their profile's
    for bad in (0, -1.0, float("inf"), float("nan"), True):
        with pytest.raises(InvalidValue, match="max_latency_s"):
            RequestLimits(max_latency_s=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidValue, match="tokens_per_s"):
        info_from_spec({"name": "w", "kind": "openai", "tokens_per_s": 0})
