"""Fixed strategies to compare the Conductor against (all run through the same executor).

* ``single:<worker>`` — one call to one worker.
* ``random`` — a random workflow (1–3 steps, random workers and access lists), seeded per task.
* ``moa`` — Mixture-of-Agents: three proposers answer independently, an aggregator sees all three.
  By default the three highest-priced workers propose and the highest-priced aggregates;
  ``moa:a,b,c>agg`` names them.
* ``self-consistency:<worker>`` — five independent samples of one worker and a majority vote over
  their extracted answers (ties go to the earliest sample).
* ``oracle`` — runs every worker alone and keeps the cheapest correct one (it reads the gold
  answer, so it is an upper bound for single-worker routing, not a usable policy); when no
  worker is right it reports the cheapest worker's attempt. Its cost is that of the chosen
  call only.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections import Counter
from typing import Any

from rl_conductor.executor import execute
from rl_conductor.policies.base import Episode, Plan, Policy
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Limits
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


def _ordinal(view: PoolView, name: str) -> int:
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

    async def plan(self, task: Task, view: PoolView, limits: Limits) -> Plan:
        return _plan(Workflow(steps=(Step(_ordinal(view, self.worker), SOLVE, ()),)))


class RandomWorkflow(Policy):
    name = "random"

    def __init__(self, *, seed: int = 0, max_steps: int = 3) -> None:
        self.seed = seed
        self.max_steps = max_steps

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **kw: Any) -> RandomWorkflow:
        return cls(seed=int(kw.get("seed", 0)), max_steps=int(arg) if arg else 3)

    async def plan(self, task: Task, view: PoolView, limits: Limits) -> Plan:
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

    async def plan(self, task: Task, view: PoolView, limits: Limits) -> Plan:
        if self.proposers is None:
            by_price = sorted(range(len(view)), key=lambda j: -view.worker(j).info.price_out)
            props, agg = by_price[:3], by_price[0]
        else:
            props = [_ordinal(view, n) for n in self.proposers]
            agg = _ordinal(view, self.aggregator or self.proposers[0])
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

    async def plan(self, task: Task, view: PoolView, limits: Limits) -> Plan:
        w = _ordinal(view, self.worker)
        return _plan(Workflow(steps=tuple(Step(w, SOLVE, ()) for _ in range(self.samples))))

    async def run(self, task: Task, view: PoolView, limits: Limits) -> Episode:
        from rl_conductor.tasks.graders import extract_answer

        plan = await self.plan(task, view, limits)
        # the vote is not a step: lift max_steps so all samples run
        run_limits = Limits(**{**limits.__dict__, "max_steps": max(limits.max_steps, self.samples)})
        trace = await execute(plan.workflow, task, view, run_limits)
        answers = [(s.answer, extract_answer(task, s.answer)) for s in trace.steps if s.status == "ok"]
        keyed = [key for _, key in answers if key is not None]
        if keyed:
            winner = Counter(keyed).most_common(1)[0][0]
            trace.final_answer = next(a for a, k in answers if k == winner)
        trace.workflow_text = plan.text
        return Episode(plan=plan, trace=trace)


class Oracle(Policy):
    name = "oracle"

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **_: Any) -> Oracle:
        return cls()

    async def plan(self, task: Task, view: PoolView, limits: Limits) -> Plan:
        cheapest = min(range(len(view)), key=lambda j: view.worker(j).info.price_out)
        return _plan(Workflow(steps=(Step(cheapest, SOLVE, ()),)))

    async def run(self, task: Task, view: PoolView, limits: Limits) -> Episode:
        from rl_conductor.reward import grade_trace

        permitted = [
            j
            for j in range(len(view))
            if limits.permits(view.worker(j).info.name, view.worker(j).info.hosting)
        ]
        if not permitted:  # nothing may see the request: the executor records the skipped step
            return await super().run(task, view, limits)
        wfs = [Workflow(steps=(Step(j, SOLVE, ()),)) for j in permitted]
        traces = await asyncio.gather(*(execute(wf, task, view, limits) for wf in wfs))
        graded = [(t, wf, grade_trace(task, t)) for t, wf in zip(traces, wfs, strict=True)]
        correct = [g for g in graded if g[2]]
        pick = min(correct or graded, key=lambda g: g[0].cost_usd)
        plan = _plan(pick[1])
        pick[0].workflow_text = plan.text
        return Episode(plan=plan, trace=pick[0])
