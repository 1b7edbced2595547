"""Fixed strategies to compare the Conductor against (all run through the same executor).

* ``single:<worker>`` — one call to one worker.
* ``random`` — a random workflow (1–3 steps, random workers and access lists), seeded per task.
* ``moa`` — Mixture-of-Agents: three proposers answer independently, an aggregator sees all three.
  By default the three highest-priced workers propose and the highest-priced aggregates;
  ``moa:a,b,c>agg`` names them.
* ``self-consistency:<worker>`` — five independent samples of one worker and a majority vote over
  their extracted answers (ties go to the earliest sample). The samples are steps: a request's
  ``max_steps`` caps them (``max_steps: 1`` is one sample, and the trace notes it).
* ``oracle`` — runs every permitted worker alone and answers with the cheapest correct one (it
  reads the gold answer, so it is an upper bound for single-worker routing, not a usable
  policy); when no worker is right it answers with the cheapest worker's attempt. Its trace
  holds every call it made, so its cost is what all of them cost (the chosen call's cost is in
  the trace's notes). Each worker runs as a single-worker call (its own step 0, as ``single``
  would); under a ``max_cost_usd`` they run one after another, cheapest first, each on what the
  earlier ones left, so all of them together stay within the one budget. It is a reference
  bound, so ``max_steps`` does not limit how many workers it asks.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections import Counter
from dataclasses import replace
from typing import Any

from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import Episode, Plan, Policy
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Trace
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow, render

SOLVE = "Solve the problem completely and give the final answer."
AGGREGATE = (
    "You see several candidate solutions above. Critically compare them, correct any mistakes, "
    "and give the single best final answer."
)


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


def _plan(workflow: Workflow) -> Plan:
    return Plan(workflow=workflow, text=render(workflow))


def ordinal(view: PoolView, name: str) -> int:
    """The index of worker ``name`` in ``view``; ``ValueError`` when the view lacks it."""
    names = view.names()
    if name not in names:
        raise ValueError(f"worker {name!r} is not in the pool view {names}")
    return names.index(name)


class SingleWorker(Policy):
    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.name = f"single:{worker}"

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **_: Any) -> SingleWorker:
        if not arg:
            raise ValueError("single needs a worker name: single:<worker>")
        pool.index(arg)
        return cls(arg)

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        return _plan(Workflow(steps=(Step(ordinal(view, self.worker), SOLVE, ()),)))


class RandomWorkflow(Policy):
    name = "random"

    def __init__(self, *, seed: int = 0, max_steps: int = 3) -> None:
        self.seed = seed
        self.max_steps = max_steps

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **kw: Any) -> RandomWorkflow:
        return cls(seed=int(kw.get("seed", 0)), max_steps=int(arg) if arg else 3)

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        rng = random.Random(_seed("random", self.seed, task.id))
        n = rng.randint(1, min(self.max_steps, limits.max_steps))
        steps = []
        for i in range(n):
            access: Any = () if i == 0 or rng.random() < 0.5 else "all"
            instr = SOLVE if i == 0 or access == () else AGGREGATE
            steps.append(Step(rng.randrange(len(view)), instr, access))
        return _plan(Workflow(steps=tuple(steps)))


class MixtureOfAgents(Policy):
    def __init__(self, proposers: list[str] | None = None, aggregator: str | None = None) -> None:
        self.proposers = proposers
        self.aggregator = aggregator
        self.name = "moa" if proposers is None else f"moa:{','.join(proposers)}>{aggregator}"

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **_: Any) -> MixtureOfAgents:
        if not arg:
            return cls()
        props, _sep, agg = arg.partition(">")
        names = [p for p in props.split(",") if p]
        for n in [*names, agg] if agg else names:
            pool.index(n)
        return cls(names, agg or names[0])

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        if self.proposers is None:
            by_price = sorted(range(len(view)), key=lambda j: -view.worker(j).info.price_out)
            props, agg = by_price[:3], by_price[0]
        else:
            props = [ordinal(view, n) for n in self.proposers]
            agg = ordinal(view, self.aggregator or self.proposers[0])
        steps = [Step(p, SOLVE, ()) for p in props]
        steps.append(Step(agg, AGGREGATE, "all"))
        return _plan(Workflow(steps=tuple(steps)))


class SelfConsistency(Policy):
    def __init__(self, worker: str, samples: int = 5) -> None:
        self.worker = worker
        self.samples = samples
        self.name = f"self-consistency:{worker}"

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **_: Any) -> SelfConsistency:
        name, _sep, n = arg.partition("*")
        if not name:
            raise ValueError("self-consistency needs a worker: self-consistency:<worker>[*N]")
        pool.index(name)
        return cls(name, int(n) if n else 5)

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        w = ordinal(view, self.worker)
        n = min(self.samples, limits.max_steps)  # each sample is a step the request pays for
        return _plan(Workflow(steps=tuple(Step(w, SOLVE, ()) for _ in range(n))))

    async def execute_plan(self, plan: Plan, task: Task, view: PoolView, limits: RequestLimits) -> Episode:
        from rl_conductor.tasks.graders import extract_answer

        trace = (await super().execute_plan(plan, task, view, limits)).trace
        if len(plan.workflow.steps) < self.samples:
            trace.notes.append(
                f"self-consistency: {len(plan.workflow.steps)} of {self.samples} samples (max_steps)"
            )
        answers = [(s.answer, extract_answer(task, s.answer)) for s in trace.steps if s.status == "ok"]
        keyed = [key for _, key in answers if key is not None]
        if keyed:
            winner = Counter(keyed).most_common(1)[0][0]
            trace.final_answer = next(a for a, k in answers if k == winner)
        return Episode(plan=plan, trace=trace)


class Oracle(Policy):
    name = "oracle"

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **_: Any) -> Oracle:
        return cls()

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        cheapest = min(range(len(view)), key=lambda j: view.worker(j).info.price_out)
        return _plan(Workflow(steps=(Step(cheapest, SOLVE, ()),)))

    async def execute_plan(self, plan: Plan, task: Task, view: PoolView, limits: RequestLimits) -> Episode:
        """Asks every permitted worker (``plan`` is only what it would run without the answers)."""
        from rl_conductor.reward import grade_trace

        permitted = sorted(
            (
                j
                for j in range(len(view))
                if limits.permits(view.worker(j).info.name, view.worker(j).info.hosting)
            ),
            key=lambda j: (view.worker(j).info.price_out, view.worker(j).info.price_in, j),
        )
        if not permitted:  # nothing may see the request: the executor records the skipped step
            return await super().execute_plan(plan, task, view, limits)
        wfs = [Workflow(steps=(Step(j, SOLVE, ()),)) for j in permitted]

        async def ask(wf: Workflow, lim: RequestLimits) -> Trace:  # one worker, as any plan runs
            return (await super(Oracle, self).execute_plan(_plan(wf), task, view, lim)).trace

        if limits.max_cost_usd is None:
            traces = list(await asyncio.gather(*(ask(wf, limits) for wf in wfs)))
        else:
            # one budget for every call: each worker spends only what the earlier ones left (and,
            # under a deadline, runs in the time they left)
            traces = []
            for wf in wfs:
                left = limits.max_cost_usd - sum(t.cost_usd for t in traces)
                elapsed = sum(t.latency_s for t in traces)
                if left <= 0 or (limits.max_latency_s is not None and elapsed >= limits.max_latency_s):
                    break
                sub = replace(limits, max_cost_usd=left)
                if limits.max_latency_s is not None:
                    sub = replace(sub, max_latency_s=limits.max_latency_s - elapsed)
                t = await ask(wf, sub)
                for rec in t.steps:
                    rec.started_s += elapsed
                traces.append(t)
        graded = [(t, wf, grade_trace(task, t)) for t, wf in zip(traces, wfs, strict=False)]
        correct = [g for g in graded if g[0].final_answer and g[2]]
        answered = [g for g in graded if g[0].final_answer]
        pick = min(correct or answered or graded, key=lambda g: g[0].cost_usd)
        asked = Workflow(steps=tuple(wf.steps[0] for wf in wfs[: len(traces)]))
        plan = _plan(asked)
        trace = Trace(task_id=task.id)
        trace.steps = [replace(t.steps[0], index=i) for i, t in enumerate(traces)]
        trace.final_answer = pick[0].final_answer
        trace.stopped_reason = pick[0].stopped_reason
        trace.charged_usd = sum(t.charged_usd for t in traces)
        sequential = limits.max_cost_usd is not None
        trace.wall_s = (sum if sequential else max)(t.wall_s for t in traces)
        chosen = pick[0].steps[0]
        trace.notes.append(
            f"oracle: answered with {chosen.worker or chosen.requested_worker} "
            f"({'correct' if pick[2] else 'no worker correct'}; that call cost ${pick[0].cost_usd:.6g})"
        )
        trace.workflow_text = plan.text
        return Episode(plan=plan, trace=trace)
