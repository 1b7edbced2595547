"""The workers a plan under a request's limits can use: one rule for every line a prompt shows.

Why a module of its own: the Conductor's decoding mask (:func:`rl_conductor.policies.conductor.
allowed_ids`) and the ``Plan by estimate:`` line (:mod:`rl_conductor.policies.plan_hint`) must
agree on it, and the line's module sits below the Conductor's.
"""

from __future__ import annotations

from rl_conductor.limits import RequestLimits
from rl_conductor.prompting import over_budget
from rl_conductor.workers.pool import PoolView


def usable_workers(view: PoolView, limits: RequestLimits) -> list[int]:
    """The ids of the workers a plan under ``limits`` can use: those the limits permit (allow-list,
    private → self-hosted) and, under a budget, whose typical answer fits it (the prompt's
    ``over budget`` flag, :func:`~rl_conductor.prompting.over_budget`). When the budget affords
    none of the permitted ones, the permitted ones; when nothing is permitted, every worker (the
    executor then refuses the plan with its reason)."""
    infos = view.infos()
    permitted = [j for j, i in enumerate(infos) if limits.permits(i.name, i.hosting)] or list(
        range(len(view))
    )
    if limits.max_cost_usd is None:
        return permitted
    affordable = [j for j in permitted if not over_budget(infos[j], limits.max_cost_usd)]
    return affordable or permitted
