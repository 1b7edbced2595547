"""A policy that always writes the same workflow: a chain over given worker ordinals.

Why: serving tests and the serving load benchmark need a plan that costs nothing to make, so
that what they measure is the predictor and the executor, not the Conductor's generation.

``FixedPlan.from_text("0,1")`` plans two steps, on the view's worker 0 then worker 1, the second
seeing the first. Ordinals index the view the request permits and wrap around (``k % len(view)``),
so one spec works whatever a request's ``sensitivity`` or ``allowed_workers`` leave in the view.
"""

from __future__ import annotations

from typing import Any

from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import Plan, Policy
from rl_conductor.tasks.base import Task
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow, render

INSTRUCTION = "Solve the problem completely and give the final answer."


class FixedPlan(Policy):
    """The same chain of steps for every task (see module docstring)."""

    def __init__(self, ordinals: list[int]) -> None:
        if not ordinals or any(o < 0 for o in ordinals):
            raise ValueError(f"a fixed plan needs one or more worker ordinals >= 0, got {ordinals}")
        self.ordinals = list(ordinals)
        self.name = "fixed:" + ",".join(map(str, ordinals))

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **_: Any) -> FixedPlan:
        """``fixed:0,1`` as :func:`~rl_conductor.policies.catalog.make_policy` parses it."""
        return cls.from_text(arg)

    @classmethod
    def from_text(cls, text: str) -> FixedPlan:
        """``"0,1,2"`` -> a chain over view ordinals 0, 1, 2."""
        try:
            return cls([int(part) for part in text.split(",") if part.strip()])
        except ValueError:
            raise ValueError(
                f"a fixed plan is comma-separated worker ordinals such as '0,1', got {text!r}"
            ) from None

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        n = min(len(self.ordinals), limits.max_steps)
        steps = tuple(Step(o % len(view), INSTRUCTION, "all") for o in self.ordinals[:n])
        wf = Workflow(steps=steps)
        return Plan(workflow=wf, text=render(wf))
