"""The first plan a question's nearest training questions scored best with, as a prompt line.

Why it exists: a Conductor trained with per-question first-plan targets
(``TrainConfig.warm_neighbours``, :func:`rl_conductor.policies.expected.neighbour_means`) must
otherwise learn from a question's first 120 characters which plan its neighbours in embedding
space favour: a rule over 2,000 questions that a tiny model reads only in part (on a simulated
eleven-worker file it reached about half of the targets' gain on the validation split). With
``plan_hint`` (``TrainConfig.plan_hint``) the prompt ends with ``Plan by estimate: 3, 5`` — the
workers, in plan order, of the plan that :meth:`ExpectedRewards.value` picks for this question
from the same neighbourhood lookup its training targets came from — and the target writes them by
their place in that line (``model_id = [@1, @2]``), so following it is a constant the model
learns; the review round still reads the answers and decides.

What is saved with the model (``plan_hint.npz`` / ``plan_hint.json``): the candidate table's
per-question rewards (training questions only), their MiniLM embeddings (the kNN router's index,
:func:`rl_conductor.policies.knn_embed.embed`), the per-group means and the lookup's settings.
For a training question the line is its leave-one-out target (what it was trained on); for any
other question (validation, test, serving) its ``k`` nearest training questions of its domain,
shrunk towards its group's mean (:meth:`ExpectedRewards.near_table`). With ``k = 0`` (the
training split chose the group means) the line is the group's target and no question is embedded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rl_conductor.limits import RequestLimits
from rl_conductor.policies.chains import Candidate
from rl_conductor.policies.expected import ExpectedRewards
from rl_conductor.tasks.base import Task
from rl_conductor.workers.pool import PoolView
from rl_conductor.workflow import Workflow

ARRAYS = "plan_hint.npz"
META = "plan_hint.json"


def plan_ids(candidate: Candidate, names: Sequence[str]) -> list[int]:
    """The ordinals (in ``names``) of ``candidate``'s workers, each once, in step order: what the
    prompt's ``Plan by estimate:`` line shows."""
    return [names.index(w) for w in dict.fromkeys(w for w, _ in candidate.steps)]


def by_place(workflow: Workflow, shown: Sequence[int]) -> Workflow:
    """``workflow`` with each step's worker written by its place in the line ``shown``
    (``model_id = [@1, @2]``; a worker the line lacks keeps its id)."""
    return Workflow(
        steps=tuple(
            s if s.worker not in shown else replace(s, rank=list(shown).index(s.worker) + 1)
            for s in workflow.steps
        ),
        reasoning=workflow.reasoning,
    )


class PlanHint:
    """The ``Plan by estimate:`` line of a question (module docstring)."""

    def __init__(
        self, targets: ExpectedRewards, embeddings: np.ndarray | None, k: int, shrink: float
    ) -> None:
        if targets.item_rewards is None:
            raise ValueError("a plan hint needs the table's per-question rewards")
        if k > 0:
            if embeddings is None or embeddings.shape[0] != targets.item_rewards.shape[0]:
                raise ValueError("a plan hint with neighbours needs one embedding per table question")
            e = np.asarray(embeddings, dtype=np.float32)
            embeddings = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        self.targets = targets
        self.embeddings = embeddings if k > 0 else None
        self.k = int(k)
        self.shrink = float(shrink)

    @property
    def needs_embedding(self) -> bool:
        return self.k > 0

    def candidate(
        self,
        task: Task,
        names: Sequence[str],
        limits: RequestLimits,
        embedding: np.ndarray | None = None,
    ) -> Candidate:
        """The plan the line names for ``task`` over the workers ``names`` under ``limits``."""
        own = None
        key = self.targets.key_of(task)
        if self.k > 0 and key is not None and task.id not in self.targets.item_means:
            if embedding is None:
                raise ValueError("this plan hint reads the question's embedding")
            rows = self.targets.rows_by_key.get(task.domain)
            if rows is not None and len(rows):
                assert self.embeddings is not None
                e = np.asarray(embedding, dtype=np.float32)
                sim = self.embeddings[rows] @ (e / max(float(np.linalg.norm(e)), 1e-12))
                kk = min(self.k, len(rows))
                near = rows[np.argpartition(-sim, kk - 1)[:kk]]
                own = self.targets.near_table(key, near, self.shrink)
        return self.targets.value(task, names, limits.max_cost_usd, limits.max_latency_s, own=own)[0]

    def __call__(
        self, task: Task, view: PoolView, limits: RequestLimits, embedding: np.ndarray | None = None
    ) -> list[int]:
        """The line's ids: the plan's workers as ordinals of ``view``, in step order."""
        names = view.names()
        return plan_ids(self.candidate(task, names, limits, embedding), names)

    # -- files ------------------------------------------------------------------------------
    @staticmethod
    def exists(folder: str | Path) -> bool:
        return (Path(folder) / ARRAYS).is_file() and (Path(folder) / META).is_file()

    def save(self, folder: str | Path) -> None:
        """Write the lookup next to a model (no per-question targets of training questions: a
        served question is never one of them by id)."""
        t = self.targets
        assert t.item_rewards is not None and t.scored is not None
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        keys = sorted(t.by_group)
        arrays: dict[str, np.ndarray] = {
            "by_group": np.stack([t.by_group[k] for k in keys]),
            "cost_by_group": np.stack([t.cost_by_group[k] for k in keys]),
            "item_rewards": t.item_rewards.astype(np.float32),
            "scored": t.scored,
        }
        if self.embeddings is not None:
            arrays["embeddings"] = self.embeddings.astype(np.float16)
        np.savez_compressed(folder / ARRAYS, **arrays)  # type: ignore[arg-type]
        meta: dict[str, Any] = {
            "k": self.k,
            "shrink": self.shrink,
            "candidates": [c.name for c in t.candidates],
            "budgets": t.budgets,
            "deadlines": t.deadlines,
            "se_rule": t.se_rule,
            "group_by": t.group_by,
            "keys": keys,
            "rows_by_key": {k: [int(i) for i in v] for k, v in t.rows_by_key.items()},
        }
        (folder / META).write_text(json.dumps(meta), encoding="utf-8")

    @classmethod
    def load(cls, folder: str | Path) -> PlanHint:
        folder = Path(folder)
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
        with np.load(folder / ARRAYS) as z:
            arrays = {k: z[k] for k in z.files}
        keys = list(meta["keys"])
        targets = ExpectedRewards(
            [Candidate.parse_name(n) for n in meta["candidates"]],
            list(meta["budgets"]),
            {k: arrays["by_group"][i].astype(np.float64) for i, k in enumerate(keys)},
            {k: arrays["cost_by_group"][i].astype(np.float64) for i, k in enumerate(keys)},
            list(meta["deadlines"]),
            se_rule=float(meta["se_rule"]),
            item_rewards=arrays["item_rewards"].astype(np.float64),
            scored=arrays["scored"].astype(bool),
            rows_by_key={k: np.asarray(v, dtype=int) for k, v in meta["rows_by_key"].items()},
            group_by=str(meta["group_by"]),
        )
        emb = arrays.get("embeddings")
        return cls(
            targets, None if emb is None else emb.astype(np.float32), int(meta["k"]), float(meta["shrink"])
        )

    def workers(self) -> set[str]:
        """Every worker a plan of the lookup may name (serving checks its pool has them)."""
        return {w for c in self.targets.candidates for w, _ in c.steps}
