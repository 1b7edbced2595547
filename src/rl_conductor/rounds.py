"""What a policy knows after a round: each answered step's extracted answer and whether they agree.

One summary for every reviewer, so the fixed cascade and the Conductor's review prompt read the
same facts: answers are extracted by the task's grader (math through math-verify) and compared
with :func:`rl_conductor.tasks.graders.answers_agree`. Only steps that answered count; a step
with nothing extractable shows as ``None`` and agrees with nothing.

It also says what a round may still afford (:func:`single_within_budget` for a first plan of
parallel solves, :func:`continuation_within_limits` for a review's steps), for every policy that
plans rounds to cut its plan before the executor would stop it part way.
"""

from __future__ import annotations

from dataclasses import replace

from rl_conductor.executor import RoundRequest
from rl_conductor.limits import RequestLimits
from rl_conductor.prompting import RoundSummary, quantile_seconds, typical_cost
from rl_conductor.tasks.graders import agreement, extract_answer
from rl_conductor.workers.pool import PoolView
from rl_conductor.workflow import Step, Workflow


def summarize(request: RoundRequest) -> RoundSummary:
    """The :class:`RoundSummary` of ``request``'s steps so far."""
    answered = [r for r in request.records if r.readable_answer]
    texts = [r.answer for r in answered]
    return RoundSummary(
        steps=tuple(r.index for r in answered),
        answers=tuple(extract_answer(request.task, t) for t in texts),
        agree=agreement(request.task, texts),
    )


def independent(workflow: Workflow) -> bool:
    """Whether no step of ``workflow`` sees another (parallel fresh solves, e.g. a cascade's pair)."""
    return all(not step.visible(i) for i, step in enumerate(workflow.steps))


def single_within_budget(workflow: Workflow, view: PoolView, budget: float | None) -> Workflow | None:
    """A first plan of independent steps cut to one step when the budget cannot afford them all.

    Why: two cheap workers solving in parallel are worth their cost only because a review can
    compare their answers; under a budget that a typical answer of each does not fit (the sum of
    :func:`~rl_conductor.prompting.typical_cost`), the executor would run the first, stop the
    second and keep an answer the plan never meant to keep, with the budget penalty on top. So the
    plan is cut, before it starts, to its answering step (the last: what the plan keeps when the
    answers agree) when a typical answer of it fits, else to the dearest step that fits. None when
    nothing is cut: no budget, one step, a step that sees another (a chain's later step needs the
    earlier one), the whole plan fits, or no step fits alone (left to the executor)."""
    steps = workflow.steps
    if budget is None or len(steps) < 2 or not independent(workflow):
        return None
    costs = [typical_cost(view.worker(s.worker).info) for s in steps]
    if sum(costs) <= budget:
        return None
    fits = [i for i, c in enumerate(costs) if c <= budget]
    if not fits:
        return None
    keep = len(steps) - 1 if costs[-1] <= budget else max(fits, key=lambda i: (costs[i], i))
    return Workflow(steps=(replace(steps[keep], access=()),))


#: The answer-time quantile a review's step must fit the time left at: the Conductor's own
#: ``policies.conductor.DEADLINE_QUANTILE`` (a test keeps them equal; that module loads the LM).
REVIEW_QUANTILE = 0.9


def continuation_within_limits(
    workflow: Workflow,
    view: PoolView,
    limits: RequestLimits,
    first_index: int,
    quantile: float = REVIEW_QUANTILE,
) -> Workflow:
    """The longest prefix of a review's continuation that what is left of the limits affords:
    the typical answers' cost (:func:`~rl_conductor.prompting.typical_cost`) within the budget
    left, and each step's answer time at ``quantile`` (after the continuation steps it sees)
    within the time left. Why: a step the executor would skip for the budget or the deadline adds
    nothing but the penalty of a stopped workflow; the review keeps the answer it has instead. A
    step whose time is unknown is kept (the executor decides)."""
    budget, left = limits.max_cost_usd, limits.max_latency_s
    spent = 0.0
    finish: dict[int, float] = {}
    kept: list[Step] = []
    for k, step in enumerate(workflow.steps):
        info = view.worker(step.worker).info
        spent += typical_cost(info)
        if budget is not None and spent > budget:
            break
        if left is not None:
            secs = quantile_seconds(info, quantile)
            if secs is not None:
                index = first_index + k
                start = max((finish.get(j, 0.0) for j in step.visible(index)), default=0.0)
                finish[index] = start + secs
                if finish[index] > left:
                    break
        kept.append(step)
    return workflow if len(kept) == len(workflow.steps) else Workflow(steps=tuple(kept))
