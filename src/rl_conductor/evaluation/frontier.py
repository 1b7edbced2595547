"""Cost-accuracy bars between two single workers: where a cost weight makes the cheap one win,
the straight line between them, and a router's accuracy at a given cost.

Why: on a two-worker pool (``routellm-replay``: GPT-4 vs Mixtral) a policy that spends a share
of the strong worker's extra cost should recover at least that share of its extra accuracy —
else randomly mixing the two singles does as well (RouteLLM's "call-performance threshold"
view). And a cost-aware reward only asks for routing once the cost weight makes the strong
worker alone no longer the reward-optimal single policy; :func:`crossover_weight` finds that
weight from measured single-worker outcomes (training split only).

Everything here is arithmetic on measured points; nothing runs a worker.

* :func:`mean_rewards` — each worker's mean evaluation reward at each cost weight (a sweep).
* :func:`crossover_weight` — the cost weight at which two workers' mean rewards are equal.
* :func:`line_accuracy` — the accuracy of the straight line between the two singles at a cost.
* :func:`hull_accuracy` — the accuracy reachable at a cost by randomly mixing measured policies
  (the upper concave hull of their points), e.g. a router swept over cost weights plus the two
  singles: "the router's accuracy at the same cost".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from rl_conductor.policies.routers import SingleOutcomes, reward_matrix
from rl_conductor.reward import RewardConfig, reward_config


@dataclass(frozen=True)
class Point:
    """A policy's measured mean cost per question (USD) and accuracy in [0, 1]."""

    name: str
    cost: float
    accuracy: float


def _column(outcomes: SingleOutcomes, worker: str) -> int:
    if worker not in outcomes.names:
        raise ValueError(f"worker {worker!r} was not measured; measured: {outcomes.names}")
    return outcomes.names.index(worker)


def mean_rewards(
    outcomes: SingleOutcomes, base: RewardConfig, weights: Iterable[float], *, rows: np.ndarray | None = None
) -> dict[float, dict[str, float]]:
    """Per cost weight, each worker's mean reward alone (``base`` with that ``cost_weight``) over
    ``rows`` of the outcomes (default: all)."""
    out: dict[float, dict[str, float]] = {}
    for w in weights:
        r = reward_matrix(outcomes, reward_config(base, cost_weight=float(w)))
        if rows is not None:
            r = r[rows]
        if not len(r):
            raise ValueError("no measured tasks to average over")
        out[float(w)] = {n: float(r[:, j].mean()) for j, n in enumerate(outcomes.names)}
    return out


def crossover_weight(
    outcomes: SingleOutcomes,
    base: RewardConfig,
    strong: str,
    weak: str,
    *,
    rows: np.ndarray | None = None,
    upper: float = 10.0,
    tol: float = 1e-6,
) -> float | None:
    """The smallest cost weight at which ``weak`` alone earns at least ``strong`` alone's mean
    reward on ``rows`` (default: all tasks), or None if it does not within ``[0, upper]``.

    0 when ``weak`` already wins without a cost term. Found by a scan of 400 steps for the first
    sign change of (strong − weak) and bisection inside it (the capped cost penalty makes the
    difference piecewise linear, not necessarily monotone)."""
    s, k = _column(outcomes, strong), _column(outcomes, weak)

    def gap(w: float) -> float:
        r = reward_matrix(outcomes, reward_config(base, cost_weight=w))
        if rows is not None:
            r = r[rows]
        if not len(r):
            raise ValueError("no measured tasks to average over")
        return float(r[:, s].mean() - r[:, k].mean())

    if gap(0.0) <= 0:
        return 0.0
    grid = np.linspace(0.0, upper, 401)
    prev = 0.0
    for w in grid[1:]:
        if gap(float(w)) <= 0:
            lo, hi = prev, float(w)
            while hi - lo > tol:
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if gap(mid) <= 0 else (mid, hi)
            return hi
        prev = float(w)
    return None


def line_accuracy(cost: float, weak: Point, strong: Point) -> float:
    """Accuracy of the straight line from ``weak`` to ``strong`` at ``cost`` (extrapolated
    outside the two costs): ``acc_w + (acc_s − acc_w)·(cost − cost_w)/(cost_s − cost_w)``."""
    if strong.cost == weak.cost:
        raise ValueError("the two points have the same cost: no line between them")
    share = (cost - weak.cost) / (strong.cost - weak.cost)
    return weak.accuracy + (strong.accuracy - weak.accuracy) * share


def cost_share(cost: float, weak: Point, strong: Point) -> float:
    """The share of the strong worker's extra cost that ``cost`` spends (0 at weak, 1 at strong)."""
    if strong.cost == weak.cost:
        raise ValueError("the two points have the same cost")
    return (cost - weak.cost) / (strong.cost - weak.cost)


def gap_recovered(accuracy: float, weak: Point, strong: Point) -> float:
    """The share of the accuracy gap between weak and strong that ``accuracy`` recovers."""
    if strong.accuracy == weak.accuracy:
        raise ValueError("the two points have the same accuracy: no gap to recover")
    return (accuracy - weak.accuracy) / (strong.accuracy - weak.accuracy)


def hull_accuracy(cost: float, points: Sequence[Point]) -> float:
    """The best accuracy reachable at mean cost at most ``cost`` by randomly mixing two of
    ``points`` (the upper concave hull of their Pareto front). Below the cheapest point nothing
    is reachable, so that raises; above the dearest front point its accuracy is returned."""
    if not points:
        raise ValueError("no points")
    pts = sorted({(p.cost, p.accuracy) for p in points})
    if cost < pts[0][0] - 1e-15:
        raise ValueError(f"cost {cost} is below the cheapest point ({pts[0][0]})")
    front: list[tuple[float, float]] = []
    for x, y in pts:  # Pareto front: strictly more accurate as cost grows
        if front and x == front[-1][0]:
            front[-1] = (x, max(y, front[-1][1]))
        elif not front or y > front[-1][1]:
            front.append((x, y))
    hull: list[tuple[float, float]] = []
    for p in front:  # upper concave hull, left to right (monotone chain)
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    for (x1, y1), (x2, y2) in pairwise(hull):
        if cost <= x2:
            return y1 + (y2 - y1) * (max(cost, x1) - x1) / (x2 - x1)
    return hull[-1][1]
