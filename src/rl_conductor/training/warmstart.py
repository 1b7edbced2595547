"""Warm-start targets: for a prompt, the candidate workflow with the best *expected* reward.

Why: per-item labels (each training question's own best workflow) reward cheapness — the
cheapest worker is right on the easy items and every worker is wrong on the hard ones, so such
targets send everything to the cheapest worker. What a Conductor can know before it calls
anyone is what kind of question it faces and which workers and budget it has. So the target of a
prompt is the workflow whose reward, averaged over the question's neighbourhood, is highest.

Neighbourhood: the question's (domain, source) group of the candidate table
(:mod:`rl_conductor.training.candidates`), shrunk towards its domain's mean with a weight of
``shrink`` items (a small group leans on its domain). The tiny Conductor sees ~120 characters of
a question: that tells it the kind of question, not the item's hidden difficulty, so finer
neighbourhoods would ask it to learn labels it cannot see.

Budgets and subsets: the target for a prompt with budget ``B`` and shown workers ``S`` is the
best candidate that uses only workers of ``S`` and whose expected reward was measured under the
largest table budget not above ``B`` (candidates unaffordable there are never targets); its
worker ids are remapped to the ordinals the prompt shows. Ties go to fewer steps, then the lower
mean cost, then the name, so targets are deterministic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rl_conductor.reward import RewardConfig
from rl_conductor.tasks.base import Task
from rl_conductor.training.candidates import Candidate, CandidateTable, group_of, single
from rl_conductor.workflow import Workflow


def reward_array(table: CandidateTable, config: RewardConfig) -> np.ndarray:
    """The reward of every executed cell (``compute_reward`` vectorised; NaN where not run): the
    format bonus only where a worker was called."""
    called = table.done if table.calls is None else table.calls > 0
    r = (
        config.format_bonus * called
        + config.correct_weight * table.correct
        - np.minimum(config.max_cost_penalty, config.cost_weight * table.cost / config.cost_scale)
        - config.budget_penalty * table.stopped
    )
    return np.where(table.done, r, np.nan)


@dataclass
class ExpectedRewards:
    """Mean reward (and cost) per neighbourhood, candidate and budget, with the lookup rules."""

    candidates: list[Candidate]
    budgets: list[float | None]
    by_group: dict[str, np.ndarray]  # group -> [candidates, budgets] expected reward (NaN = n/a)
    cost_by_group: dict[str, np.ndarray]

    @classmethod
    def fit(cls, table: CandidateTable, config: RewardConfig, *, shrink: float = 20.0) -> ExpectedRewards:
        r = reward_array(table, config)
        cost = np.where(table.done, table.cost, np.nan)
        dom_rows: dict[str, list[int]] = defaultdict(list)
        grp_rows: dict[str, list[int]] = defaultdict(list)
        for i, (d, g) in enumerate(zip(table.domains, table.groups, strict=True)):
            dom_rows[d].append(i)
            grp_rows[g].append(i)
        by_group: dict[str, np.ndarray] = {}
        cost_by_group: dict[str, np.ndarray] = {}

        def mean_all(x: np.ndarray) -> np.ndarray:
            # defined only where every item of the rows was run
            ok = ~np.isnan(x).any(axis=0)
            return np.where(ok, np.nan_to_num(x).mean(axis=0), np.nan)

        for d, rows in dom_rows.items():
            dom_mean = mean_all(r[rows])
            by_group[d] = dom_mean
            cost_by_group[d] = mean_all(cost[rows])
            for g in {table.groups[i] for i in rows}:
                gr = grp_rows[g]
                n = len(gr)
                by_group[g] = (mean_all(r[gr]) * n + shrink * dom_mean) / (n + shrink)
                cost_by_group[g] = mean_all(cost[gr])
        return cls(list(table.candidates), list(table.budgets), by_group, cost_by_group)

    def budget_index(self, budget: float | None) -> int:
        """The column of the largest table budget not above ``budget`` (0 = no budget)."""
        if budget is None:
            return 0
        fitting = [(b, j) for j, b in enumerate(self.budgets) if b is not None and b <= budget + 1e-12]
        if fitting:
            return max(fitting)[1]
        return min((b, j) for j, b in enumerate(self.budgets) if b is not None)[1]

    def best(self, task: Task, names: Sequence[str], budget: float | None) -> Candidate:
        """The expected-best candidate for ``task`` over the workers ``names`` under ``budget``."""
        shown = set(names)
        b = self.budget_index(budget)
        for key in (group_of(task), task.domain):
            table = self.by_group.get(key)
            if table is None:
                continue
            costs = self.cost_by_group[key]
            options = [
                (-float(table[j, b]), len(c.steps), float(costs[j, b]), c.name, j)
                for j, c in enumerate(self.candidates)
                if c.workers <= shown and not np.isnan(table[j, b])
            ]
            if options:
                return self.candidates[min(options)[-1]]
        # an unknown kind of question (or nothing affordable): the best-scoring single overall
        means = {
            c.steps[0][0]: float(np.nanmean([t[j, 0] for t in self.by_group.values()]))
            for j, c in enumerate(self.candidates)
            if len(c.steps) == 1 and c.workers <= shown
        }
        if not means:
            raise ValueError(f"no candidate uses only the shown workers {sorted(shown)}")
        return single(max(means, key=lambda w: (means[w], w)))

    def target(self, task: Task, names: Sequence[str], budget: float | None) -> Workflow:
        """:meth:`best` as a workflow over the ordinals of ``names`` (the prompt's ids)."""
        return self.best(task, names, budget).workflow(names)
