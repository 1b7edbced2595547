"""The Policy interface (``plan(task, view, limits) -> Plan``) and the one episode runner.

An episode is plan → execute → annotate, written once: :meth:`Policy.run` plans (or takes a plan
made already) and hands it to :meth:`Policy.execute_plan`, which runs it through
:func:`rl_conductor.executor.execute` and records on the trace how the plan was made. Every
caller — evaluation (``run_many``), the CLI's ``plan --execute``, the serving engine (KServe,
the OpenAI route and the MLflow pyfunc alike) — goes through it, so budgets, privacy rules and
accounting are identical for every policy.

Batched planning is an option of the policy: :meth:`Policy.plan_many` plans each task on its own
by default, and a policy that generates (the LM Conductor) overrides it to plan a batch in one
generation; ``run_many`` plans through it. A policy whose answer is not simply the workflow's
(self-consistency votes; the oracle asks every worker; the cascade always reviews) overrides
``execute_plan``, never ``run``.

Rounds: a policy that can look at its workflow's answers and add steps implements :meth:`review`;
``execute_plan`` hands it to the executor as the review hook when the request allows more than
one round (``RequestLimits.max_rounds``). A policy without ``review`` runs one round whatever the request
allows.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from rl_conductor.executor import Continuation, ReviewHook, RoundRequest, execute
from rl_conductor.limits import RequestLimits
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Trace
from rl_conductor.workers.pool import PoolView
from rl_conductor.workflow import Workflow


@dataclass
class Plan:
    """A policy's decision: the workflow, the raw text it came from, and how it was obtained."""

    workflow: Workflow
    text: str = ""
    fallback: bool = False
    parse_error: str | None = None
    #: how the plan was made, for the trace (e.g. that a deadline made the Conductor plan again)
    notes: tuple[str, ...] = ()
    #: the deadline cut the plan to its answering step before it ran
    deadline_cut: bool = False
    #: the worker ids, in step order, of the plan the question's evidence names: the worker it
    #: ranks first, alone (a Conductor trained with ``evidence: rank``), or the prompt's ``Plan by
    #: estimate:`` line (``plan_hint``); None otherwise. Evaluation reports how often the plan's
    #: workers are these (``follows evidence %``, :func:`follows`)
    evidence_plan: tuple[int, ...] | None = None
    #: whether the plan as the model wrote it followed ``evidence_plan`` (:func:`follows`), set
    #: before a deadline or a budget cut it to one step (the cut is the policy's, not the
    #: model's choice); None: evaluation compares the workflow that ran
    follows_evidence: bool | None = None
    #: the workflow's workers are not the model's choice: its completion did not parse and named
    #: no usable workers, so the policy's fixed fallback ran (which never counts as following)
    fixed_fallback: bool = False

    def annotate(self, trace: Trace) -> Trace:
        """Record on the executed ``trace`` how this plan was made (raw text, fallback, notes)."""
        trace.workflow_text, trace.fallback_plan = self.text, self.fallback
        trace.plan_cut = self.deadline_cut
        trace.notes[:0] = self.notes
        if trace.rounds:
            trace.rounds[0].plan_text = self.text
        return trace


def follows(workflow: Workflow, evidence_plan: Sequence[int]) -> bool:
    """Whether ``workflow``'s workers, each once in step order, are ``evidence_plan``: what the
    ``Plan by estimate:`` line shows of a plan (a solve and a check by one worker is one id)."""
    return tuple(dict.fromkeys(s.worker for s in workflow.steps)) == tuple(evidence_plan)


@dataclass
class Episode:
    """One task run by one policy: its plan and what executing it did."""

    plan: Plan
    trace: Trace


class Policy(ABC):
    """Base class: subclasses implement :meth:`plan`; ``run`` plans and executes (module docstring)."""

    name: str = "policy"
    #: Whether :meth:`plan_batch` plans several requests in one call (an LM's batched generation):
    #: serving then micro-batches concurrent requests into it, and :meth:`plan_many` uses it.
    batches_plans: bool = False

    @abstractmethod
    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        """Write the workflow for ``task`` over the workers of ``view``."""

    def plan_batch(self, items: Sequence[tuple[Task, PoolView, RequestLimits]]) -> list[Plan]:
        """Plans of several requests, each with its own view and limits, in one synchronous call
        (serving's micro-batcher calls it from a worker thread, outside any event loop). Here each
        is planned on its own; a policy that ``batches_plans`` overrides it."""

        async def each() -> list[Plan]:
            return list(await asyncio.gather(*(self.plan(t, v, lim) for t, v, lim in items)))

        return asyncio.run(each())

    async def plan_many(self, tasks: Sequence[Task], view: PoolView, limits: RequestLimits) -> list[Plan]:
        """Plans for several tasks under one view and limits: one :meth:`plan_batch` where the
        policy batches, else each on its own."""
        if self.batches_plans:
            return self.plan_batch([(t, view, limits) for t in tasks])
        return list(await asyncio.gather(*(self.plan(t, view, limits) for t in tasks)))

    async def run(
        self, task: Task, view: PoolView, limits: RequestLimits, *, plan: Plan | None = None
    ) -> Episode:
        """One episode: ``plan`` (made now when None) → :meth:`execute_plan`."""
        if plan is None:
            plan = await self.plan(task, view, limits)
        return await self.execute_plan(plan, task, view, limits)

    async def run_many(self, tasks: Sequence[Task], view: PoolView, limits: RequestLimits) -> list[Episode]:
        """Episodes of several tasks, planned together (:meth:`plan_many`), executed concurrently."""
        plans = await self.plan_many(tasks, view, limits)
        runs = (self.run(t, view, limits, plan=p) for t, p in zip(tasks, plans, strict=True))
        return list(await asyncio.gather(*runs))

    async def execute_plan(self, plan: Plan, task: Task, view: PoolView, limits: RequestLimits) -> Episode:
        """Execute ``plan`` under ``limits`` (with :meth:`review` between rounds) and record on the
        trace how the plan was made."""
        trace = await execute(plan.workflow, task, view, limits, review=self.review_hook(limits))
        return Episode(plan=plan, trace=plan.annotate(trace))

    def executes_as_planned(self) -> bool:
        """Whether the answer is the planned workflow's own (no ``execute_plan`` of the policy's)."""
        return type(self).execute_plan is Policy.execute_plan

    async def review(self, request: RoundRequest) -> Continuation | None:
        """After a round: the steps to add (an empty workflow keeps the answer). None = this
        policy does not review (one round only); policies that can override it."""
        return None

    def reviews(self) -> bool:
        """Whether this policy implements :meth:`review`."""
        return type(self).review is not Policy.review

    def review_hook(self, limits: RequestLimits) -> ReviewHook | None:
        """The executor's review hook for a request under ``limits`` (None for one round)."""
        if limits.max_rounds <= 1 or not self.reviews():
            return None

        async def hook(request: RoundRequest) -> Continuation:
            cont = await self.review(request)
            return cont if cont is not None else Continuation(workflow=Workflow(steps=()))

        return hook


class GivenPlan(Policy):
    """A plan made elsewhere, run as an episode: a GRPO completion, a warm-start target. It never
    plans; :meth:`run` takes the plan (``plan=``). Its later rounds, when the request allows
    them, are decided by ``review`` (a fitted rule's hook; None: one round), so training rollouts
    go through the same plan → execute → annotate as every policy."""

    name = "given-plan"

    def __init__(self, review: ReviewHook | None = None) -> None:
        self.hook = review

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        raise TypeError("GivenPlan runs the plan it is given: call run(task, view, limits, plan=...)")

    def review_hook(self, limits: RequestLimits) -> ReviewHook | None:
        return self.hook if limits.max_rounds > 1 else None

    async def run_workflow(
        self, workflow: Workflow, task: Task, view: PoolView, limits: RequestLimits
    ) -> Trace:
        """The trace of ``workflow`` run as this policy's episode: what the table builders and
        measurements that execute workflows of their own (not a policy's plans) call."""
        return (await self.run(task, view, limits, plan=Plan(workflow=workflow))).trace
