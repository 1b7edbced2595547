"""Warm-start targets for the Conductor's second round: after a first plan, keep or escalate.

The data an adaptive Conductor learns *when* to continue from (issue 22, item 2): for each
training question and each first plan, round 1 is executed and the review prompt the Conductor
would then see is rendered (:func:`rl_conductor.prompting.review_prompt`, with the answers' agreement
from :mod:`rl_conductor.rounds`); then every candidate continuation — keep the answer, or one
more step on one worker, solving afresh — is executed after it through the same executor, on the
same budget and deadline. A prompt's target is the continuation with the best mean reward over
the training questions that share its first plan and what its answers looked like (agree /
disagree / one answer), the signal the prompt shows — not the question's own best continuation,
which only the gold answer reveals (a target the Conductor could not infer from its prompt
teaches it noise).

What it deliberately simplifies: continuations are single steps that see nothing earlier (on a
replay pool, where context is ignored, that is every continuation there is); groups are the
signal alone, without the per-question evidence of the first round's prompt; one review (two
rounds). The records are TRL conversational prompt/completion pairs like
:func:`rl_conductor.training.data.warm_sft_records`, for the SFT stage to mix in.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from rl_conductor.executor import Continuation, RoundRequest
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import GivenPlan
from rl_conductor.policies.baselines import SOLVE
from rl_conductor.prompting import DEFAULT_MAX_QUESTION_CHARS, review_prompt
from rl_conductor.reward import RewardConfig, grade_trace, trace_reward
from rl_conductor.rounds import summarize
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Trace
from rl_conductor.training.data import chat
from rl_conductor.workers.pool import PoolView
from rl_conductor.workflow import Step, Workflow, render

__all__ = [
    "KEEP",
    "ReviewExample",
    "continuations",
    "review_examples",
    "review_sft_records",
    "review_targets",
]

#: The label of the continuation that keeps the answer (three empty lists).
KEEP = "keep"


@dataclass
class ReviewExample:
    """One (question, first plan): the review prompt, its signal and each continuation's reward."""

    task_id: str
    first: int
    signal: str
    prompt: str
    rewards: dict[str, float] = field(default_factory=dict)


def continuations(view: PoolView) -> dict[str, Workflow]:
    """Keep, or one fresh solve on each worker of ``view`` (steps are numbered by the executor)."""
    out = {KEEP: Workflow(steps=())}
    for j, name in enumerate(view.names()):
        out[f"+{name}"] = Workflow(steps=(Step(j, SOLVE, ()),))
    return out


async def run_continued(
    task: Task,
    view: PoolView,
    first: Workflow,
    cont: Workflow,
    limits: RequestLimits,
    *,
    max_question_chars: int | None = None,
) -> tuple[Trace, tuple[str, str] | None]:
    """Run ``first`` as an episode, then, at its review, ``cont`` whatever the answers were: one
    cell of a table of continuations (this module's, ``training/adaptive.py``'s rounds table).
    Returns the trace and, where a review was reached, (the review prompt — "" unless
    ``max_question_chars`` is given — and its agreement line), both taken when the review ran."""
    seen: list[tuple[str, str]] = []

    async def review(req: RoundRequest) -> Continuation:
        summary = summarize(req)
        prompt = (
            ""
            if max_question_chars is None
            else review_prompt(req, summary, max_question_chars=max_question_chars)
        )
        seen.append((prompt, summary.line()))
        return Continuation(workflow=cont)  # fresh solves: they see no earlier step

    limits = replace(limits, max_rounds=2)
    trace = await GivenPlan(review=review).run_workflow(first, task, view, limits)
    return trace, (seen[0] if seen else None)


async def _run(
    task: Task,
    view: PoolView,
    first: Workflow,
    cont: Workflow,
    limits: RequestLimits,
    config: RewardConfig,
    max_question_chars: int,
) -> tuple[str, str, float]:
    """(review prompt, its agreement line, the reward of ``first`` then ``cont``)."""
    trace, seen = await run_continued(task, view, first, cont, limits, max_question_chars=max_question_chars)
    reward = trace_reward(trace, grade_trace(task, trace), config)
    prompt, line = seen if seen is not None else ("", "no review")
    return prompt, line, reward


async def review_examples(
    tasks: Sequence[Task],
    view: PoolView,
    firsts: Sequence[Workflow],
    config: RewardConfig,
    limits: RequestLimits | None = None,
    *,
    max_question_chars: int = DEFAULT_MAX_QUESTION_CHARS,
) -> list[ReviewExample]:
    """Every (task, first plan) executed with every continuation (module docstring). A first plan
    whose review never started (budget, deadline or calls spent) yields no example."""
    limits = limits or RequestLimits()
    conts = continuations(view)
    out: list[ReviewExample] = []
    for task in tasks:
        for k, first in enumerate(firsts):
            runs = await asyncio.gather(
                *(_run(task, view, first, wf, limits, config, max_question_chars) for wf in conts.values())
            )
            prompt, line, _ = runs[0]
            if not prompt:
                continue
            rewards = {label: r for label, (_, _, r) in zip(conts, runs, strict=True)}
            out.append(ReviewExample(task.id, k, line, prompt, rewards))
    return out


def review_targets(examples: Sequence[ReviewExample]) -> dict[tuple[int, str], str]:
    """(first plan, signal) -> the continuation with the best mean reward in that group (ties:
    keep first, then the continuation's label order)."""
    groups: dict[tuple[int, str], list[ReviewExample]] = defaultdict(list)
    for ex in examples:
        groups[(ex.first, ex.signal)].append(ex)
    best: dict[tuple[int, str], str] = {}
    for key, rows in groups.items():
        labels = list(rows[0].rewards)
        means = [float(np.mean([r.rewards[label] for r in rows])) for label in labels]
        best[key] = labels[int(np.argmax(means))]
    return best


def review_sft_records(examples: Sequence[ReviewExample], view: PoolView) -> list[dict[str, object]]:
    """SFT prompt/completion pairs: each example's review prompt and its group's target
    continuation (three empty lists for keep), rendered as the Conductor writes it."""
    targets = review_targets(examples)
    conts = continuations(view)
    return [
        {
            "prompt": chat(ex.prompt),
            "completion": [{"role": "assistant", "content": render(conts[targets[(ex.first, ex.signal)]])}],
        }
        for ex in examples
    ]
