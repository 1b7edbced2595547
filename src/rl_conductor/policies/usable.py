"""The workers a plan under a request's limits can use: one rule for every line a prompt shows.

Why a module of its own: the Conductor's fallback plan (:func:`rl_conductor.policies.conductor.
fallback_workflow`) and the ``Plan by estimate:`` line (:mod:`rl_conductor.policies.plan_hint`)
must agree on it, and the line's module sits below the Conductor's.
"""

from __future__ import annotations

from collections.abc import Sequence

from rl_conductor.limits import RequestLimits
from rl_conductor.prompting import over_budget, quantile_seconds, typical_cost
from rl_conductor.workers.pool import PoolView

#: A plan meets a deadline when its critical path does with every step at this quantile of its
#: worker's answer time (:func:`rl_conductor.policies.conductor.plan_seconds`), not at the median:
#: a chain whose typical time fits with little room is cut by the executor more often than not.
#: The quantile is of the worker's latency model, which has one typical answer length per worker:
#: on paper-sim, whose lengths differ by domain, "p90" is about p65-p75 for code answers and above
#: p99 for knowledge ones. Measured on paper-sim (validation split, the tiny Conductor), see
#: :meth:`rl_conductor.policies.conductor.ConductorPolicy._plan_requests`.
DEADLINE_QUANTILE = 0.9


def usable_workers(view: PoolView, limits: RequestLimits) -> list[int]:
    """The ids of the workers a plan under ``limits`` can use: those the limits permit (allow-list,
    private → self-hosted) and, under a budget, whose typical answer fits it (the prompt's
    ``over budget`` flag, :func:`~rl_conductor.prompting.over_budget`). When the budget affords
    none of the permitted ones, the cheapest of them (a typical answer's cost; ties all kept):
    the executor cuts the call's output to what the budget affords, and the cheapest worker is
    cut least (naming the dearest, as this rule once did, spent the budget on the shortest
    answer). When nothing is permitted, every worker (the executor then refuses the plan with
    its reason)."""
    infos = view.infos()
    permitted = [j for j, i in enumerate(infos) if limits.permits(i.name, i.hosting)] or list(
        range(len(view))
    )
    if limits.max_cost_usd is None:
        return permitted
    affordable = [j for j in permitted if not over_budget(infos[j], limits.max_cost_usd)]
    if affordable:
        return affordable
    least = min(typical_cost(infos[j]) for j in permitted)
    return [j for j in permitted if typical_cost(infos[j]) <= least]


def within_deadline(view: PoolView, ids: Sequence[int], deadline: float | None) -> list[int]:
    """Those of ``ids`` whose answer time at :data:`DEADLINE_QUANTILE` fits ``deadline``
    (a worker of unknown latency does not), or all of ``ids`` where none does or there is no
    deadline: the executor enforces the deadline either way."""
    if deadline is None:
        return list(ids)
    seconds = [quantile_seconds(view.worker(j).info, DEADLINE_QUANTILE) for j in ids]
    fast = [j for j, s in zip(ids, seconds, strict=True) if s is not None and s <= deadline]
    return fast or list(ids)
