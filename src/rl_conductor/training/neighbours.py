"""Whether a file's warm-start targets should come from per-question neighbourhoods: decided on its
training split (``TrainConfig.warm_neighbours: auto``).

Why: per-question neighbourhoods (:func:`rl_conductor.training.warmstart.neighbour_means`) pay
where a (domain, source) group mixes questions that different plans serve best and only add noise
where a group is homogeneous. Measured with the ``recordings-text`` recipe (training split, each
rule scored out of sample as below): on two simulated three-domain files whose reasoning domain
mixes commonsense questions with logic puzzles, 50 neighbours earned 0.831 and 0.833 against the
group means' 0.817 and 0.818; on ``gsm8k-six`` (one homogeneous domain) 0.8616 against 0.8617. A
user's file is neither, so the recipe measures it.

How: every training question's target is scored by the reward its own row of the candidate table
records for that plan, and neither rule sees that row: the neighbours leave the question out by
construction, and the group means are fitted on the other folds of a five-fold split (in-sample,
the best of some fifty plans by a group's mean is partly picked by the outcomes it is then scored
on: 0.827 against 0.817 out of fold on the first file). The neighbourhood wins only where its mean
gain over the group means exceeds ``se`` paired standard errors; else the group means stay (fewer
distinct targets for a small model to learn).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from rl_conductor.reward import RewardConfig
from rl_conductor.tasks.base import Task
from rl_conductor.training.candidates import CandidateTable
from rl_conductor.training.warmstart import ExpectedRewards, reward_array

__all__ = ["AUTO_K", "FOLDS", "choose_neighbours", "subset", "target_rewards"]

#: the neighbourhood ``auto`` weighs against the group means
AUTO_K = 50
FOLDS = 5


def subset(table: CandidateTable, rows: np.ndarray) -> CandidateTable:
    """The candidate table's rows ``rows`` (every per-item array and list cut alike)."""
    arrays = {
        name: getattr(table, name)[rows]
        for name in ("correct", "cost", "stopped", "tokens", "done", "calls", "cut")
        if getattr(table, name) is not None
    }
    lists = {name: [getattr(table, name)[i] for i in rows] for name in ("task_ids", "domains", "groups")}
    return replace(table, **arrays, **lists)


def target_rewards(
    table: CandidateTable,
    items: Sequence[Task],
    names: Sequence[str],
    config: RewardConfig,
    *,
    k: int,
    embeddings: np.ndarray | None,
    seed: int = 0,
    **fit: Any,
) -> tuple[np.ndarray, list[str]]:
    """Per table item (``items`` in the table's row order), the reward its own row records for its
    target and the target's name, out of sample (module docstring): ``k`` = 0 group means fitted
    on the other folds, else ``k`` neighbours (``fit``: ExpectedRewards.fit's other options)."""
    if [t.id for t in items] != list(table.task_ids):
        raise ValueError("items must be the table's questions in its row order")
    r = reward_array(table, config)[:, :, 0]
    pos = {c.name: j for j, c in enumerate(table.candidates)}
    fold = np.arange(len(items)) % FOLDS
    np.random.default_rng(seed).shuffle(fold)
    groups: dict[int, ExpectedRewards] = {}  # fold -> group means fitted on the other folds, as needed

    def group_fit(f: int) -> ExpectedRewards:
        if f not in groups:
            groups[f] = ExpectedRewards.fit(subset(table, np.flatnonzero(fold != f)), config, **fit)
        return groups[f]

    near = ExpectedRewards.fit(table, config, neighbours=k, embeddings=embeddings, **fit) if k > 0 else None
    out = np.zeros(len(items))
    chosen: list[str] = []
    for i, t in enumerate(items):
        # a question without neighbours (alone in its domain) is scored as the group arm scores it:
        # the full table's group mean would hold its own row (H24: forty one-item domains made auto
        # choose neighbours on a file where they gained nothing)
        rule = near if near is not None and t.id in near.item_means else group_fit(int(fold[i]))
        c = rule.best(t, names, None)
        out[i] = float(np.nan_to_num(r[i, pos[c.name]]))
        chosen.append(c.name)
    return out, chosen


def choose_neighbours(
    table: CandidateTable,
    items: Sequence[Task],
    names: Sequence[str],
    config: RewardConfig,
    embeddings: np.ndarray,
    *,
    k: int = AUTO_K,
    se: float = 1.0,
    seed: int = 0,
    **fit: Any,
) -> dict[str, Any]:
    """``k`` where its out-of-sample training reward beats the group means' by more than ``se``
    paired standard errors, else 0; with both figures (what ``conductor.json`` records)."""
    group, _ = target_rewards(table, items, names, config, k=0, embeddings=None, seed=seed, **fit)
    near, _ = target_rewards(table, items, names, config, k=k, embeddings=embeddings, seed=seed, **fit)
    diff = near - group
    err = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("inf")
    gain = float(diff.mean()) if len(diff) else 0.0
    return {
        "k": int(k) if gain > se * err else 0,
        "candidate_k": int(k),
        "group_reward": float(group.mean()) if len(group) else None,
        "neighbour_reward": float(near.mean()) if len(near) else None,
        "gain": gain,
        "gain_se": err,
        "n": len(diff),
    }
