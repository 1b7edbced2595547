"""A fixed escalation cascade: two cheap answers, and a stronger worker only when they disagree.

The honest baseline for adaptive rounds (FrugalGPT-style cascades, self-consistency): round 1
asks two cheap workers (or one cheap worker twice) to solve the question independently; after
it, the cascade reads their extracted answers (:mod:`rl_conductor.rounds`, the same summary the
Conductor's review prompt shows) and keeps the answer when they agree, else adds one step on the
escalation worker, which solves the question afresh (it sees no earlier answer); it never adds a
third round. A cascade is two rounds and a first pair of two steps by definition, so it runs with
``max_rounds`` and ``max_steps`` raised to at least 2 whatever the request says (self-consistency,
by contrast, keeps ``max_steps`` as its cap on samples); ``max_calls``, the budget, the deadline
and the privacy rule hold across both rounds as for every policy. A budget that cannot afford both
first answers gets one answer (:func:`rl_conductor.rounds.single_within_budget`), and an
escalation the budget or time left cannot afford is not added
(:func:`rl_conductor.rounds.continuation_within_limits`).

* ``cascade:a,b>c`` — ``a`` and ``b`` first, ``c`` on disagreement; ``cascade:a*2>c`` samples
  ``a`` twice; ``cascade:a,b`` never escalates.
* ``cascade`` or ``cascade:N`` — fitted: every worker answers N training questions (the
  evaluation's ``fit_limit``, as for the routers, else ``FIT_LIMIT``; ``cascade:all`` takes every
  training question) three times alone,
  and the (first pair, escalation) with the best mean reward at the evaluation's reward is kept.
  The fit replays the measured answers exactly (each step's call is the one measured: same
  message, same step index), so on a replay or simulated pool the fitted reward is the reward
  the cascade earns on those questions. The rule "escalate when the two answers disagree" is the
  only threshold two answers allow; an answer with nothing extractable disagrees with everything.
* ``cascade:domain`` — fitted per domain on every training question: in each domain the plan with
  the best mean reward there among every single worker and every cascade above (a domain-router
  whose domains may escalate). Why: on a file whose domains each have an owner, one cascade for
  every domain loses to the domain-router (a math specialist's domain escalates nowhere), while a
  cascade per domain beat the domain-router on test (an outside tester's file, issue 21): it is
  the stronger of the two baselines a team would ship there. A domain the training split lacks
  gets the plan fitted on every question; a plan whose workers the request does not permit (or
  the view lacks) falls back to the domain's best single among those it permits.

Measurements are cached under ``.conductor/routers/`` like the routers' (:func:`pool_key`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rl_conductor.executor import Continuation, RoundRequest
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import Episode, GivenPlan, Plan, Policy
from rl_conductor.policies.baselines import SOLVE, ordinal
from rl_conductor.policies.routers import (
    FIT_LIMIT,
    MeasuredOutcomes,
    choose_worker,
    pool_key,
    tally_replaced,
    training_tasks,
    warn_replaced,
)
from rl_conductor.progress import progress as progress_display
from rl_conductor.reward import RewardConfig, grade_trace, reward_from_options, reward_of
from rl_conductor.rounds import continuation_within_limits, single_within_budget, summarize
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.graders import extract_answer, keys_agree
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow, render

__all__ = [
    "SAMPLES",
    "Cascade",
    "CascadeFit",
    "DomainCascade",
    "SampleOutcomes",
    "fit_cascade",
    "sample_outcomes",
]

#: Samples per worker and question: the first pair's two steps and the escalation step.
SAMPLES = 3


@dataclass
class SampleOutcomes(MeasuredOutcomes):
    """Every worker alone, ``SAMPLES`` times, on every task (sample k is step k of a workflow of
    independent solves): ``correct[i, j, k]``, ``cost[i, j, k]`` and the extracted answer."""

    names: list[str]
    task_ids: list[str]
    correct: NDArray[np.bool_]
    cost: NDArray[np.float64]
    keys: list[list[list[str | None]]]

    META = ("names", "task_ids", "keys")


async def measure_samples(pool: Pool, tasks: Sequence[Task]) -> SampleOutcomes:
    """Run ``SAMPLES`` independent solves of every worker on every task and grade each (each
    worker's workflow of solves an episode of the one episode runner,
    :class:`~rl_conductor.policies.base.GivenPlan`, as evaluation runs it)."""
    view = pool.view()
    w = len(view)
    correct = np.zeros((len(tasks), w, SAMPLES), dtype=bool)
    cost = np.zeros((len(tasks), w, SAMPLES), dtype=np.float64)
    keys: list[list[list[str | None]]] = []
    replaced: dict[str, list[Any]] = {}
    names = view.names()
    limits = RequestLimits(max_steps=SAMPLES)
    wfs = [Workflow(steps=tuple(Step(j, SOLVE, ()) for _ in range(SAMPLES))) for j in range(w)]
    given = GivenPlan()
    with progress_display() as bar:  # minutes on a large pool: a log must show that work goes on
        pid = bar.add_task(f"sample {w} workers x{SAMPLES}", total=len(tasks))
        for start in range(0, len(tasks), 32):
            chunk = tasks[start : start + 32]
            runs = (given.run_workflow(wfs[j], t, view, limits) for t in chunk for j in range(w))
            traces = await asyncio.gather(*runs)
            for i, t in enumerate(chunk):
                row: list[list[str | None]] = []
                for j in range(w):
                    tr = traces[i * w + j]
                    row.append([])
                    for k, rec in enumerate(tr.steps):
                        # another worker's answer in this one's place is not its own: a fit may
                        # not credit it (routers.own_answer), and it agrees with nothing
                        own = not rec.replaced
                        text = rec.answer if rec.status == "ok" and own else ""
                        one = replace(tr, steps=[rec], final_answer=text)
                        correct[start + i, j, k] = own and grade_trace(t, one)
                        cost[start + i, j, k] = rec.cost_usd
                        readable = rec.readable_answer if own else ""
                        row[j].append(extract_answer(t, readable) if readable else None)
                        if not own:
                            tally_replaced(replaced, names[j], tr)
                keys.append(row)
            bar.advance(pid, len(chunk))
    warn_replaced(f"sampling the {w} workers for the fixed cascade", replaced, len(tasks) * SAMPLES)
    return SampleOutcomes(names, [t.id for t in tasks], correct, cost, keys)


def sample_outcomes(pool: Pool, tasks: Sequence[Task], *, cache: bool = True) -> SampleOutcomes:
    """:func:`measure_samples`, cached under ``.conductor/routers/``."""
    from rl_conductor.fingerprint import fingerprint
    from rl_conductor.tracking.mlflow_utils import conductor_home

    name = f"samples-{pool.name}-{pool_key(pool)}-{fingerprint(t.id for t in tasks)}"
    path = conductor_home() / ".conductor" / "routers" / name
    if cache and path.with_suffix(".json").exists() and path.with_suffix(".npz").exists():
        return SampleOutcomes.load(path)
    out = asyncio.run(measure_samples(pool, tasks))
    if cache:
        out.save(path)
    return out


@dataclass(frozen=True)
class CascadeFit:
    """One cascade's outcome on measured questions (see :func:`cascade_outcomes`)."""

    first: tuple[str, str]
    escalate: str | None
    mean_reward: float
    accuracy: float
    mean_cost_usd: float
    agree_rate: float


def cascade_outcomes(
    outcomes: SampleOutcomes,
    tasks: Sequence[Task],
    first: tuple[int, int],
    escalate: int | None,
    config: RewardConfig,
) -> dict[str, NDArray[Any]]:
    """Per question: whether the first pair agrees, and the cascade's correctness, cost, reward."""
    a, b = first
    agree = np.array(
        [keys_agree(t, outcomes.keys[i][a][0], outcomes.keys[i][b][1]) for i, t in enumerate(tasks)],
        dtype=bool,
    )
    correct = outcomes.correct[:, b, 1].copy()
    cost = outcomes.cost[:, a, 0] + outcomes.cost[:, b, 1]
    if escalate is not None:
        up = ~agree
        correct[up] = outcomes.correct[up, escalate, 2]
        cost = cost + np.where(up, outcomes.cost[:, escalate, 2], 0.0)
    reward = reward_of(config, correct=correct, cost=cost)
    return {"agree": agree, "correct": correct, "cost": cost, "reward": reward}


def fit_cascade(
    outcomes: SampleOutcomes, tasks: Sequence[Task], config: RewardConfig, *, cheap_only: bool = True
) -> list[CascadeFit]:
    """Every (first pair, escalation) on the measured questions, best mean reward first (ties: the
    cheaper). The pair is ordered by mean cost (the cheaper asks first); with ``cheap_only`` the
    escalation worker costs more on average than either of the pair (what makes it a cascade)."""
    if [t.id for t in tasks] != outcomes.task_ids:
        raise ValueError("the tasks are not the measured ones")
    w = len(outcomes.names)
    mean_cost = outcomes.cost[:, :, 0].mean(axis=0)
    fits: list[CascadeFit] = []
    for a in range(w):
        for b in range(w):
            if (mean_cost[a], a) > (mean_cost[b], b):
                continue
            ups: list[int | None] = [None]
            ups += [e for e in range(w) if not cheap_only or mean_cost[e] > max(mean_cost[a], mean_cost[b])]
            for e in ups:
                out = cascade_outcomes(outcomes, tasks, (a, b), e, config)
                fits.append(
                    CascadeFit(
                        first=(outcomes.names[a], outcomes.names[b]),
                        escalate=None if e is None else outcomes.names[e],
                        mean_reward=float(out["reward"].mean()),
                        accuracy=float(out["correct"].mean()),
                        mean_cost_usd=float(out["cost"].mean()),
                        agree_rate=float(out["agree"].mean()),
                    )
                )
    fits.sort(key=lambda f: (-f.mean_reward, f.mean_cost_usd))
    return fits


def pair_plan(first: tuple[str, str], view: PoolView, limits: RequestLimits) -> Plan:
    """Round 1 of a cascade: ``first``'s two workers solve in parallel (one of them where the
    budget cannot afford both, :func:`rl_conductor.rounds.single_within_budget`)."""
    a, b = (ordinal(view, n) for n in first)
    wf = Workflow(steps=(Step(a, SOLVE, ()), Step(b, SOLVE, ())))
    wf = single_within_budget(wf, view, limits.max_cost_usd) or wf
    return Plan(workflow=wf, text=render(wf))


def pair_review(request: RoundRequest, up: str | None, keep: bool = False) -> Continuation:
    """A cascade's review: keep the answer where the first answers agree (or ``keep``, or there
    is no escalation worker, or this is not the first review), else one fresh solve on ``up``
    that the budget and time left can afford."""
    summary = summarize(request)
    if keep or summary.agree or up is None or request.round > 2:
        return Continuation(
            workflow=Workflow(steps=()), seen=summary.line(), answers=summary.answers, agree=summary.agree
        )
    wf = Workflow(steps=(Step(ordinal(request.view, up), SOLVE, ()),))
    # no escalation the budget or time left cannot afford (it would be stopped part way)
    wf = continuation_within_limits(wf, request.view, request.limits, len(request.workflow.steps))
    return Continuation(
        workflow=wf, text=render(wf), seen=summary.line(), answers=summary.answers, agree=summary.agree
    )


class Cascade(Policy):
    """See module docstring."""

    def __init__(
        self, first: tuple[str, str], escalate: str | None, *, fitted: CascadeFit | None = None
    ) -> None:
        self.first = first
        self.escalate = escalate
        self.fitted = fitted
        up = f">{escalate}" if escalate else ""
        pair = f"{first[0]}*2" if first[0] == first[1] else f"{first[0]},{first[1]}"
        self.name = f"cascade:{pair}{up}"

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **kw: Any) -> Cascade | DomainCascade:
        if arg == "domain":
            return DomainCascade.fit(pool, kw)
        if not arg or arg.isdigit() or arg == "all":
            fit_limit = kw.get("fit_limit", FIT_LIMIT)
            limit = None if arg == "all" else int(arg) if arg else fit_limit
            return cls.fit(pool, kw, limit)
        pair, _, up = arg.partition(">")
        name, star, n = pair.partition("*")
        if star:
            if n != "2":
                raise ValueError(f"a cascade samples a worker twice: {name}*2, got {pair!r}")
            first = (name, name)
        else:
            parts = [p for p in pair.split(",") if p]
            if len(parts) != 2:
                raise ValueError(f"a cascade starts with two workers, a,b or a*2, got {pair!r}")
            first = (parts[0], parts[1])
        for worker in [*first, *([up] if up else [])]:
            pool.index(worker)
        return cls(first, up or None)

    @classmethod
    def fit(cls, pool: Pool, kw: Mapping[str, Any], limit: int | None) -> Cascade:
        """Fitted on ``limit`` training questions (None: all) at the evaluation's reward."""
        config = reward_from_options(kw)
        tasks = training_tasks(pool, kw, limit) if limit is not None else _all_training(pool, kw)
        best = fit_cascade(sample_outcomes(pool, tasks), tasks, config)[0]
        return cls(best.first, best.escalate, fitted=best)

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        return pair_plan(self.first, view, limits)

    async def review(self, request: RoundRequest) -> Continuation:
        return pair_review(request, self.escalate)

    async def execute_plan(self, plan: Plan, task: Task, view: PoolView, limits: RequestLimits) -> Episode:
        # two rounds by definition (module docstring); at least two steps for the first pair
        lifted = replace(limits, max_rounds=max(limits.max_rounds, 2), max_steps=max(limits.max_steps, 2))
        return await super().execute_plan(plan, task, view, lifted)


@dataclass(frozen=True)
class DomainPlan:
    """One domain's fitted plan: ``first`` (one worker, or a pair asked in parallel), the worker
    a disagreeing pair escalates to (None: keep), and its training figures."""

    first: tuple[str, ...]
    escalate: str | None
    mean_reward: float
    n: int

    def label(self) -> str:
        up = f">{self.escalate}" if self.escalate else ""
        return f"single:{self.first[0]}" if len(self.first) == 1 else f"cascade:{','.join(self.first)}{up}"


def subset(outcomes: SampleOutcomes, rows: Sequence[int]) -> SampleOutcomes:
    """The measured outcomes of the questions at ``rows`` (their order kept)."""
    idx = np.asarray(rows, dtype=int)
    return SampleOutcomes(
        names=list(outcomes.names),
        task_ids=[outcomes.task_ids[i] for i in idx],
        correct=outcomes.correct[idx],
        cost=outcomes.cost[idx],
        keys=[outcomes.keys[i] for i in idx],
    )


def single_tables(
    outcomes: SampleOutcomes, config: RewardConfig
) -> tuple[dict[str, float], dict[str, float]]:
    """Worker -> mean reward and mean cost alone on these questions (each worker's first sample,
    as the domain-router measures it)."""
    rew = np.asarray(reward_of(config, correct=outcomes.correct[:, :, 0], cost=outcomes.cost[:, :, 0]))
    cost = outcomes.cost[:, :, 0]
    names = outcomes.names
    return (
        {n: float(rew[:, j].mean()) for j, n in enumerate(names)},
        {n: float(cost[:, j].mean()) for j, n in enumerate(names)},
    )


def fit_plan(outcomes: SampleOutcomes, tasks: Sequence[Task], config: RewardConfig) -> DomainPlan:
    """The best plan on these questions by mean reward: every single worker (:func:`single_tables`)
    and every cascade of :func:`fit_cascade`. Ties go to the single (fewer calls), then to the
    cheaper cascade."""
    singles, cost = single_tables(outcomes, config)
    k = min(
        range(len(outcomes.names)), key=lambda j: (-singles[outcomes.names[j]], cost[outcomes.names[j]], j)
    )
    w = outcomes.names[k]
    best = DomainPlan((w,), None, singles[w], len(tasks))
    fits = fit_cascade(outcomes, tasks, config)
    if fits and fits[0].mean_reward > best.mean_reward:
        f = fits[0]
        best = DomainPlan(f.first, f.escalate, f.mean_reward, len(tasks))
    return best


#: the key of every training question's single-worker tables (no domain is named with NUL)
ALL = "\0all"


class DomainCascade(Cascade):
    """``cascade:domain``: see the module docstring."""

    def __init__(
        self,
        plans: Mapping[str, DomainPlan],
        default: DomainPlan,
        singles: Mapping[str, Mapping[str, float]],
        costs: Mapping[str, Mapping[str, float]],
    ) -> None:
        self.plans = dict(plans)
        self.default = default
        self.singles = {d: dict(v) for d, v in singles.items()}  # domain -> worker -> mean reward
        self.costs = {d: dict(v) for d, v in costs.items()}
        self.name = "cascade:domain"

    @classmethod
    def fit(cls, pool: Pool, kw: Mapping[str, Any], limit: int | None = None) -> DomainCascade:
        """Fitted on every training question at the evaluation's reward (``limit`` is not used:
        every domain needs its own questions)."""
        config = reward_from_options(kw)
        tasks = _all_training(pool, kw)
        outcomes = sample_outcomes(pool, tasks)
        return cls.from_outcomes(outcomes, tasks, config)

    @classmethod
    def from_outcomes(
        cls, outcomes: SampleOutcomes, tasks: Sequence[Task], config: RewardConfig
    ) -> DomainCascade:
        plans: dict[str, DomainPlan] = {}
        singles: dict[str, dict[str, float]] = {}
        costs: dict[str, dict[str, float]] = {}
        domains = [t.domain for t in tasks]
        for d in sorted(set(domains)):
            rows = [i for i, x in enumerate(domains) if x == d]
            part = subset(outcomes, rows)
            plans[d] = fit_plan(part, [tasks[i] for i in rows], config)
            singles[d], costs[d] = single_tables(part, config)
        singles[ALL], costs[ALL] = single_tables(outcomes, config)
        return cls(plans, fit_plan(outcomes, tasks, config), singles, costs)

    def _usable(self, plan: DomainPlan, view: PoolView, limits: RequestLimits) -> bool:
        infos = {i.name: i for i in view.infos()}
        needed = [*plan.first, *([plan.escalate] if plan.escalate else [])]
        return all(n in infos and limits.permits(n, infos[n].hosting) for n in needed)

    def plan_for(self, domain: str) -> DomainPlan:
        return self.plans.get(domain, self.default)

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        chosen = self.plan_for(task.domain)
        usable = self._usable(chosen, view, limits)
        if usable and len(chosen.first) == 2:
            return pair_plan((chosen.first[0], chosen.first[1]), view, limits)
        # the tables of the plan's questions: the domain's, or every question's for a domain the
        # training split lacks
        key = task.domain if task.domain in self.plans else ALL
        budget = limits.max_cost_usd
        if usable and (budget is None or self.costs[key].get(chosen.first[0], 0.0) <= budget):
            j = ordinal(view, chosen.first[0])
        else:  # the best single among the workers the request permits and its budget affords
            j = choose_worker(self.singles[key], self.costs[key], view, limits)
        wf = Workflow(steps=(Step(j, SOLVE, ()),))
        return Plan(workflow=wf, text=render(wf))

    async def review(self, request: RoundRequest) -> Continuation:
        chosen = self.plan_for(request.task.domain)
        # a single planned (one step), or a plan the request cannot run whole: no escalation
        alone = len(request.workflow.steps) < 2 or not self._usable(chosen, request.view, request.limits)
        return pair_review(request, chosen.escalate, keep=alone)

    def describe(self) -> dict[str, str]:
        """Domain -> the fitted plan's label (``single:w`` or ``cascade:a,b>c``)."""
        return {d: p.label() for d, p in self.plans.items()}


def _all_training(pool: Pool, kw: Mapping[str, Any]) -> list[Task]:
    from rl_conductor.tasks.datasets import load_tasks

    dataset = str(kw.get("dataset") or pool.default_dataset())
    return load_tasks(dataset, split="train")
