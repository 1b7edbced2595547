"""The GRPO reward: execute each completion's workflow on the pool and grade it.

``ConductorReward`` follows TRL's reward-function contract ``(prompts, completions, **columns) ->
list[float | None]`` and is async (TRL gathers async reward functions), so the rollouts of a batch
execute concurrently. Each completion goes through the same ``parse`` → episode
(:class:`~rl_conductor.policies.base.GivenPlan`: plan → execute → annotate) → ``grade_trace`` →
``trace_reward`` path as evaluation and serving, under the prompt's budget and deadline (the
``budget`` and ``deadline`` columns, -1 for none), so ``budget_penalty`` and ``deadline_penalty``
apply to plans those limits cut. Besides the reward it reports accuracy, cost, parse rate, steps,
budget and deadline stops per batch through TRL's ``log_metric`` hook (and keeps running totals
for the caller).

Rounds: TRL's reward function sees completions, not the model, so a rollout cannot ask the
Conductor being trained to review its own plan. With ``review_rule`` (``max_rounds > 1``) a
rollout's first plan is continued by the review rule fitted on the training questions
(:mod:`rl_conductor.training.adaptive`): GRPO then learns first plans for the review the warm
start taught, and the review itself is learnt in SFT only.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import GivenPlan, Plan
from rl_conductor.reward import (
    RewardConfig,
    budget_stopped,
    deadline_stopped,
    grade_trace,
    trace_reward,
)
from rl_conductor.tasks.base import Task
from rl_conductor.workers.pool import Pool
from rl_conductor.workflow import ParseError, parse


def completion_text(completion: Any) -> str:
    """TRL passes strings (standard format) or message lists (conversational format)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


class ConductorReward:
    """Reward function for GRPOTrainer over a worker pool (see module docstring)."""

    def __init__(
        self,
        pool: Pool,
        tasks: Mapping[str, Task],
        config: RewardConfig,
        base_limits: RequestLimits,
        *,
        concurrency: int = 64,
        review_rule: Mapping[tuple[str, str, str], str] | None = None,
        review_text: Any = None,
    ) -> None:
        if base_limits.max_rounds != 1:
            # a rollout scores one plan: a later round would need the policy being trained
            raise ValueError(
                f"training rollouts run one round, got max_rounds={base_limits.max_rounds}: "
                "a rollout cannot ask the Conductor that is being trained to review"
            )
        #: with rounds, a rollout's first plan is continued by the review rule fitted on the
        #: training questions (training/adaptive.py), not by the model being trained
        self.review_rule = dict(review_rule) if review_rule is not None else None
        #: with ``review_evidence: text``, the text rule instead (training/review_text.py)
        self.review_text = review_text
        self.pool = pool
        self.tasks = tasks
        self.config = config
        self.base_limits = base_limits
        self.concurrency = concurrency
        self.__name__ = "conductor_reward"  # TRL names the logged reward after this
        self.history: list[dict[str, float]] = []

    async def score(
        self,
        text: str,
        task: Task,
        view_idx: Sequence[int],
        budget: float | None,
        deadline: float | None = None,
        ranking: Sequence[int] | None = None,
    ) -> dict[str, float]:
        view = self.pool.view(view_idx)
        limits = RequestLimits(
            **{**self.base_limits.__dict__, "max_cost_usd": budget, "max_latency_s": deadline}
        )
        try:
            wf = parse(text, pool_size=len(view), max_steps=limits.max_steps, ranking=ranking or None)
        except ParseError:
            return {
                "reward": 0.0,
                "parsed": 0.0,
                "correct": 0.0,
                "cost": 0.0,
                "steps": 0.0,
                "budget_stop": 0.0,
                "deadline_stop": 0.0,
            }
        hook = None
        if self.review_rule is not None:
            from rl_conductor.training.adaptive import rule_hook

            hook = (
                rule_hook(self.review_rule, max_question_chars=0)
                if self.review_text is None
                else self.review_text.hook(max_question_chars=0)
            )
            limits = replace(limits, max_rounds=2)
        episode = await GivenPlan(review=hook).run(task, view, limits, plan=Plan(workflow=wf, text=text))
        trace = episode.trace
        correct = grade_trace(task, trace)
        stopped = budget_stopped(trace)
        cut = deadline_stopped(trace)
        r = trace_reward(trace, correct, self.config)
        return {
            "reward": r,
            "parsed": 1.0,
            "correct": float(correct),
            "cost": trace.cost_usd,
            "steps": float(len(wf.steps)),
            "budget_stop": float(stopped),
            "deadline_stop": float(cut),
        }

    async def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        *,
        task_id: Sequence[str],
        view: Sequence[Sequence[int]],
        budget: Sequence[float],
        deadline: Sequence[float] | None = None,
        ranking: Sequence[Sequence[int] | None] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **_: Any,
    ) -> list[float | None]:
        sem = asyncio.Semaphore(self.concurrency)

        async def one(i: int) -> dict[str, float]:
            async with sem:
                b = None if budget[i] is None or budget[i] < 0 else float(budget[i])
                d = None if deadline is None or deadline[i] is None or deadline[i] < 0 else float(deadline[i])
                shown = None if ranking is None or not ranking[i] else list(ranking[i])
                return await self.score(
                    completion_text(completions[i]), self.tasks[task_id[i]], view[i], b, d, shown
                )

        results = await asyncio.gather(*(one(i) for i in range(len(completions))))
        means: dict[str, float] = defaultdict(float)
        for res in results:
            for k, v in res.items():
                means[k] += v / len(results)
        self.history.append(dict(means))
        if log_metric is not None:
            for k in ("correct", "parsed", "cost", "steps", "budget_stop", "deadline_stop"):
                log_metric(f"conductor/{k}", means[k])
        return [res["reward"] for res in results]
