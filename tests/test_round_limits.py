"""Rounds under budgets and deadlines: policies plan within what is left.

The executor enforces the budget and the deadline across rounds whatever a policy plans
(``test_rounds.py``, ``test_executor.py``). These tests check the plans themselves: a first plan of
parallel answers that the budget cannot afford is cut to one step before it starts, and a review
never adds steps past the budget or the time left, for the fixed cascade and for the trained
Conductor (its generation scripted; parsing, the cut and execution are real). Costs are the
prompt's typical costs (:func:`~rl_conductor.prompting.typical_cost`): w0, w1, w2 cost about
$0.00132, $0.00265 and $0.00397 per typical answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from _pools import rising_pool
from _tiny import Micro
from rl_conductor.executor import RoundRequest, execute
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.cascade import Cascade
from rl_conductor.prompting import quantile_seconds, typical_cost
from rl_conductor.rounds import REVIEW_QUANTILE, continuation_within_limits, single_within_budget
from rl_conductor.tasks.base import Task
from rl_conductor.workers.base import WorkerInfo
from rl_conductor.workers.fake import FakeWorker
from rl_conductor.workers.pool import Pool
from rl_conductor.workflow import Step, Workflow

TASK = Task(id="t/1", question="What is 6 * 7?", answer="42", domain="math", source="test", grader="math")


def _timed_pool() -> Pool:
    """w0 fast, w1 fast, w2 slow (a typical answer in ~1 s, ~1 s and ~10 s)."""
    specs = (("w0", 0.1, 500.0), ("w1", 0.1, 500.0), ("w2", 1.0, 50.0))
    workers = [
        FakeWorker(
            info=WorkerInfo(
                name=n, price_in=1.0, price_out=1.0, hosting="external", kind="fake", ttft_s=t, tokens_per_s=v
            ),
            answer=f"\\boxed{{{k}}}",
        )
        for k, (n, t, v) in enumerate(specs)
    ]
    return Pool(name="timed", workers=list(workers))


def _pair() -> Workflow:
    return Workflow(steps=(Step(0, "solve", ()), Step(1, "solve", ())))


def _typical(pool: Pool, *ids: int) -> float:
    return sum(typical_cost(pool.view().worker(j).info) for j in ids)


# --------------------------------------------------------------------------- the rules


def test_a_pair_the_budget_cannot_afford_is_cut_to_its_answering_step() -> None:
    pool = rising_pool("1", "2", "3")
    view = pool.view()
    both = _typical(pool, 0, 1)
    assert single_within_budget(_pair(), view, None) is None
    assert single_within_budget(_pair(), view, both) is None  # affordable: unchanged
    cut = single_within_budget(_pair(), view, both - 1e-6)
    assert cut is not None and [s.worker for s in cut.steps] == [1]  # the answer the pair keeps
    # the answering step alone does not fit: the dearest step that does
    flipped = Workflow(steps=(Step(0, "solve", ()), Step(2, "solve", ())))
    cut = single_within_budget(flipped, view, _typical(pool, 2) - 1e-6)
    assert cut is not None and [s.worker for s in cut.steps] == [0]
    # nothing fits alone, a single step, or a chain (its last step needs the first): left alone
    assert single_within_budget(_pair(), view, _typical(pool, 0) - 1e-6) is None
    assert single_within_budget(Workflow(steps=(Step(1, "solve", ()),)), view, 1e-6) is None
    chain = Workflow(steps=(Step(0, "plan", ()), Step(1, "solve", (0,))))
    assert single_within_budget(chain, view, both - 1e-6) is None


def test_a_continuation_keeps_only_what_the_limits_left_afford() -> None:
    pool = rising_pool("1", "2", "3")
    view = pool.view()
    three = Workflow(steps=tuple(Step(1, "solve", ()) for _ in range(3)))
    one_fits = RequestLimits(max_cost_usd=_typical(pool, 1) * 1.5)
    assert [s.worker for s in continuation_within_limits(three, view, one_fits, 2).steps] == [1]
    assert continuation_within_limits(three, view, RequestLimits(max_cost_usd=1e-6), 2).steps == ()
    assert continuation_within_limits(three, view, RequestLimits(), 2) == three
    timed = _timed_pool().view()
    slow = quantile_seconds(timed.worker(2).info, REVIEW_QUANTILE)
    fast = quantile_seconds(timed.worker(0).info, REVIEW_QUANTILE)
    assert slow is not None and fast is not None and fast < slow
    up = Workflow(steps=(Step(2, "solve", ()),))
    assert continuation_within_limits(up, timed, RequestLimits(max_latency_s=slow * 0.9), 2).steps == ()
    assert continuation_within_limits(up, timed, RequestLimits(max_latency_s=slow * 1.1), 2) == up
    # a chained step waits for the continuation step it sees: 2 fast steps in a row need 2x
    chained = Workflow(steps=(Step(0, "solve", ()), Step(1, "solve", (2,))))
    left = RequestLimits(max_latency_s=fast * 1.5)
    assert [s.worker for s in continuation_within_limits(chained, timed, left, 2).steps] == [0]
    parallel = Workflow(steps=(Step(0, "solve", ()), Step(1, "solve", ())))
    assert continuation_within_limits(parallel, timed, left, 2) == parallel


def test_the_review_quantile_is_the_conductors_deadline_quantile() -> None:
    from rl_conductor.policies.conductor import DEADLINE_QUANTILE

    assert REVIEW_QUANTILE == DEADLINE_QUANTILE


# --------------------------------------------------------------------------- the cascade


async def test_the_cascade_asks_one_worker_when_the_budget_cannot_afford_its_pair() -> None:
    pool = rising_pool("\\boxed{41}", "\\boxed{42}", "\\boxed{42}")
    budget = _typical(pool, 0, 1) - 1e-6
    ep = await Cascade(("w0", "w1"), "w2").run(TASK, pool.view(), RequestLimits(max_cost_usd=budget))
    assert [s.worker for s in ep.trace.steps] == ["w1"]
    assert ep.trace.final_answer == "\\boxed{42}" and ep.trace.cost_usd <= budget
    # one answer: nothing to compare, so the review keeps it
    assert ep.trace.rounds[1].decision == "keep"


async def _after_the_pair(pool: Pool, left: RequestLimits) -> RoundRequest:
    """What the executor hands the review after the pair (w0, w1), with ``left`` as the limits left."""
    trace = await execute(_pair(), TASK, pool.view(), RequestLimits())
    return RoundRequest(TASK, pool.view(), _pair(), tuple(trace.steps), trace.final_answer, 2, left)


async def test_the_cascade_does_not_escalate_past_the_budget_left() -> None:
    pool = rising_pool("\\boxed{41}", "\\boxed{42}", "\\boxed{7}")
    cascade = Cascade(("w0", "w1"), "w2")
    up = _typical(pool, 2)
    short = await cascade.review(await _after_the_pair(pool, RequestLimits(max_cost_usd=up * 0.9)))
    assert short.agree is False and short.workflow.steps == ()
    room = await cascade.review(await _after_the_pair(pool, RequestLimits(max_cost_usd=up * 1.1)))
    assert [s.worker for s in room.workflow.steps] == [2]
    # end to end with room: the disagreement escalates
    roomy = RequestLimits(max_cost_usd=_typical(pool, 0, 1, 2) * 1.2)
    ep = await cascade.run(TASK, pool.view(), roomy)
    assert [s.worker for s in ep.trace.steps] == ["w0", "w1", "w2"]


async def test_the_cascade_does_not_escalate_past_the_deadline() -> None:
    pool = _timed_pool()  # w0 and w1 disagree (0 vs 1); w2 answers 2
    cascade = Cascade(("w0", "w1"), "w2")
    slow = quantile_seconds(pool.view().worker(2).info, REVIEW_QUANTILE)
    assert slow is not None
    late = await cascade.review(await _after_the_pair(pool, RequestLimits(max_latency_s=slow * 0.8)))
    assert late.agree is False and late.workflow.steps == ()
    ep = await cascade.run(TASK, pool.view(), RequestLimits(max_latency_s=slow * 0.8))
    assert ep.trace.rounds[1].decision == "keep" and [s.worker for s in ep.trace.steps] == ["w0", "w1"]
    on_time = await cascade.review(await _after_the_pair(pool, RequestLimits(max_latency_s=slow * 1.2)))
    assert [s.worker for s in on_time.workflow.steps] == [2]


# --------------------------------------------------------------------------- the Conductor


class Script:
    """A stand-in for ``ConductorPolicy._generate``: the first plan, then the review's steps."""

    def __init__(self, first: str, review: str) -> None:
        self.first, self.review = first, review

    def __call__(self, prompts: Sequence[str], *, greedy: bool, seed: int, allowed: Any = None) -> list[str]:
        return [self.review if "Workflow so far:" in p else self.first for p in prompts]


def _text(ids: Sequence[int]) -> str:
    subs = ", ".join(f"'step {i}'" for i in range(len(ids)))
    acc = ", ".join(["[]"] * len(ids))
    return f"model_id = [{', '.join(map(str, ids))}]\nsubtasks = [{subs}]\naccess_list = [{acc}]"


async def test_the_conductor_cuts_a_pair_the_budget_cannot_afford(
    micro: Micro, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_conductor.policies.conductor import ConductorPolicy

    policy = ConductorPolicy(micro.final_dir)
    pool = rising_pool("\\boxed{41}", "\\boxed{42}", "\\boxed{42}")
    monkeypatch.setattr(policy, "_generate", Script(_text([0, 1]), _text([])))
    budget = _typical(pool, 0, 1) - 1e-6
    plan = await policy.plan(TASK, pool.view(), RequestLimits(max_cost_usd=budget, max_rounds=2))
    assert [s.worker for s in plan.workflow.steps] == [1]
    assert any("cut to one step" in n for n in plan.notes)
    # an affordable pair stands
    plan = await policy.plan(TASK, pool.view(), RequestLimits(max_cost_usd=budget * 2, max_rounds=2))
    assert [s.worker for s in plan.workflow.steps] == [0, 1]


async def test_the_conductors_review_adds_only_what_the_budget_left_affords(
    micro: Micro, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_conductor.policies.conductor import ConductorPolicy

    policy = ConductorPolicy(micro.final_dir)
    policy.meta["max_rounds"] = 2  # stands for a model trained to review; its review is scripted
    pool = rising_pool("\\boxed{41}", "\\boxed{42}", "\\boxed{42}")
    # the review asks for three more answers of w1; the budget left affords about one
    monkeypatch.setattr(policy, "_generate", Script(_text([0]), _text([1, 1, 1])))
    budget = _typical(pool, 0) + 1.5 * _typical(pool, 1)
    ep = await policy.run(TASK, pool.view(), RequestLimits(max_cost_usd=budget, max_rounds=2))
    later = [ep.trace.steps[i] for i in ep.trace.rounds[1].steps]
    assert [(s.worker, s.status) for s in later] == [("w1", "ok")]
    assert ep.trace.cost_usd <= budget and ep.trace.final_answer == "\\boxed{42}"
