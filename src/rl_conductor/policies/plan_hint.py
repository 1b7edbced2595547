"""The first plan a question's nearest training questions scored best with, as a prompt line.

Why it exists: a Conductor trained with per-question first-plan targets
(``TrainConfig.warm_neighbours``, :func:`rl_conductor.policies.expected.neighbour_means`) must
otherwise learn from a question's first 120 characters which plan its neighbours in embedding
space favour: a rule over thousands of questions that a tiny model reads only in part. With
``plan_hint`` (``TrainConfig.plan_hint``) the prompt ends with ``Plan by estimate: 3, 5`` — the
workers, in plan order, of the plan that :meth:`ExpectedRewards.value` picks for this question
from the same neighbourhood lookup its training targets came from — and the target writes them by
their place in that line (``model_id = [@1, @2]``), so following it is a constant the model
learns; the review round still reads the answers and decides. Measured on two simulated files
with the ``recordings-text`` recipe: the trained model followed the line on every validation
question and tied the model that reads the text (docs/recordings.md, "The plan line"). On an
outside tester's unseen file the model without it did not write its own targets (test 0.9096
against their 0.9328) and with it scored them, so the ``recordings-text`` preset turns it on.

What is saved with the model (``plan_hint.npz`` / ``plan_hint.json``): the candidate table's
per-question rewards (training questions only), their MiniLM embeddings (the kNN router's index,
:func:`rl_conductor.policies.knn_embed.embed`), the per-group means and the lookup's settings.
For a training question the line is its leave-one-out target (what it was trained on); for any
other question (validation, test, serving) its ``k`` nearest training questions of its domain,
shrunk towards its group's mean (:meth:`ExpectedRewards.near_table`). With ``k = 0`` (the
training split chose the group means) the line is the group's target. A served request carries no
domain (``unknown``): its kind (domain and group) is the most common among its nearest
training questions (:class:`~rl_conductor.policies.kinds.KindIndex`), as evaluation reads a
question's label, so a served Conductor is shown the line its evaluation measured (without
that, every served line would be the one best worker overall).
"""

from __future__ import annotations

import json
import logging
import zipfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rl_conductor.errors import InvalidArgument
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.chains import Candidate
from rl_conductor.policies.expected import ExpectedRewards
from rl_conductor.policies.kinds import KindIndex, unit
from rl_conductor.policies.usable import usable_workers, within_deadline
from rl_conductor.tasks.base import Task
from rl_conductor.workers.pool import PoolView
from rl_conductor.workflow import Workflow

log = logging.getLogger(__name__)

ARRAYS = "plan_hint.npz"
META = "plan_hint.json"


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


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
        self,
        targets: ExpectedRewards,
        embeddings: np.ndarray,
        k: int,
        shrink: float,
        domains: Sequence[str],
        groups: Sequence[str],
        table_ids: Sequence[str] = (),
    ) -> None:
        if targets.item_rewards is None:
            raise ValueError("a plan hint needs the table's per-question rewards")
        if isinstance(k, bool) or int(k) != k or k < 0 or not (np.isfinite(shrink) and shrink >= 0):
            raise ValueError(
                f"its neighbourhood must be an integer >= 0 and its shrink a number >= 0, not {k}, {shrink}"
            )
        n = targets.item_rewards.shape[0]
        if embeddings is None or embeddings.shape[0] != n or len(domains) != n or len(groups) != n:
            raise ValueError("a plan hint needs one embedding, domain and group per table question")
        self.embeddings = unit(embeddings)
        self.targets = targets
        self.k = int(k)
        self.shrink = float(shrink)
        self.domains = list(domains)
        self.groups = list(groups)
        self.kinds = KindIndex(self.embeddings, self.domains, self.groups)
        if not {*self.domains, *self.groups} <= set(targets.by_group) or not set(self.domains) <= set(
            targets.rows_by_key
        ):
            raise ValueError("its questions' domains and groups are not all in its tables")
        for labels in (self.domains, self.groups):
            for key in set(labels):
                rows = targets.rows_by_key.get(key)
                if rows is not None and set(rows.tolist()) != {i for i, x in enumerate(labels) if x == key}:
                    raise ValueError(f"its rows of {key!r} are not its questions of {key!r}")
        #: the table's own questions (in training only; not saved): their line is their target,
        #: never a lookup that could read their own row (a domain of one question has no
        #: leave-one-out neighbourhood)
        self.table_ids = frozenset(table_ids)

    def needs_embedding(self, task: Task) -> bool:
        """Whether :meth:`candidate` reads ``task``'s embedding: with neighbourhoods, for any
        question the table lacks, and always for a question whose domain the table does not know
        (a served request is ``unknown``: its kind is that of its nearest training questions)."""
        if task.id in self.targets.item_means or task.id in self.table_ids:
            return False
        return self.k > 0 or self.kinds.infers(task) or self.targets.key_of(task) is None

    def kind(self, embedding: np.ndarray) -> tuple[str, str]:
        """The (domain, group) of a question whose label says neither (:class:`KindIndex`)."""
        return self.kinds.kind(embedding)

    def candidate(
        self,
        task: Task,
        names: Sequence[str],
        limits: RequestLimits,
        embedding: np.ndarray | None = None,
    ) -> Candidate:
        """The plan the line names for ``task`` over the workers ``names`` under ``limits``."""
        budget, deadline = limits.max_cost_usd, limits.max_latency_s
        if not self.needs_embedding(task):  # a training question, or group means of a known kind
            return self.targets.value(task, names, budget, deadline)[0]
        if embedding is None:
            raise ValueError("this plan hint reads the question's embedding")
        kind: str | None = None
        if self.kinds.infers(task) or self.targets.key_of(task) is None:
            domain, kind = self.kind(embedding)
            task = replace(task, domain=domain)
        own = None
        key = kind or self.targets.key_of(task)
        rows = self.targets.rows_by_key.get(task.domain)
        if self.k > 0 and key is not None and rows is not None and len(rows):
            sim = self.embeddings[rows] @ unit(embedding)
            kk = min(self.k, len(rows))
            own = self.targets.near_table(key, rows[np.argpartition(-sim, kk - 1)[:kk]], self.shrink)
        return self.targets.value(task, names, budget, deadline, own=own, kind=kind)[0]

    def usable(self, view: PoolView, limits: RequestLimits) -> list[str]:
        """The names of the workers the line may name: those the request may use
        (:func:`~rl_conductor.policies.usable.usable_workers`: its allow-list, private requests on
        self-hosted workers, no worker flagged over its budget, the cheapest where the budget
        affords none). Under a deadline, where the lookup has no deadline columns to value plans
        by, only the workers that answer within it (:func:`~rl_conductor.policies.usable.
        within_deadline`, as the fallback plan): a line naming a worker the deadline cuts would
        teach a plan that loses its answer."""
        names = view.names()
        ids = usable_workers(view, limits)
        if not self.targets.deadlines:
            ids = within_deadline(view, ids, limits.max_latency_s)
        return [names[j] for j in ids]

    def plan(
        self, task: Task, view: PoolView, limits: RequestLimits, embedding: np.ndarray | None = None
    ) -> Candidate:
        """The plan the line names for a request: :meth:`candidate` over its usable workers."""
        return self.candidate(task, self.usable(view, limits), limits, embedding)

    def __call__(
        self, task: Task, view: PoolView, limits: RequestLimits, embedding: np.ndarray | None = None
    ) -> list[int]:
        """The line's ids: the plan's workers as ordinals of ``view``, in step order."""
        return plan_ids(self.plan(task, view, limits, embedding), view.names())

    def workers(self) -> set[str]:
        """Every worker a plan of the lookup may name."""
        return {w for c in self.targets.candidates for w, _ in c.steps}

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
            "domains": self.domains,
            "groups": self.groups,
        }
        (folder / META).write_text(json.dumps(meta), encoding="utf-8")

    @classmethod
    def load(cls, folder: str | Path) -> PlanHint:
        """The lookup saved in ``folder``; ValueError naming the file where it is unreadable,
        incomplete or inconsistent (a model must not plan from a line it cannot make)."""
        folder = Path(folder)
        try:
            return cls._load(folder)
        except (OSError, KeyError, TypeError, ValueError, IndexError, zipfile.BadZipFile) as exc:
            what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise ValueError(f"the plan hint in {folder} ({ARRAYS}, {META}) does not load: {what}") from exc

    @classmethod
    def _load(cls, folder: Path) -> PlanHint:
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
        with np.load(folder / ARRAYS) as z:
            arrays = {k: z[k] for k in z.files}
        keys = list(meta["keys"])
        n, c = arrays["item_rewards"].shape[:2]
        if (
            arrays["by_group"].shape[:2] != (len(keys), c)
            or arrays["cost_by_group"].shape != arrays["by_group"].shape
            or len(meta["candidates"]) != c
            or arrays["scored"].shape[0] != n
            or any(not all(0 <= int(i) < n for i in v) for v in meta["rows_by_key"].values())
            or len(set(keys)) != len(keys)
            or len(set(meta["candidates"])) != len(meta["candidates"])
            or not (_number(meta["se_rule"]) and meta["se_rule"] >= 0)
            or not (isinstance(meta["k"], int) and not isinstance(meta["k"], bool))
            or np.isinf(arrays["by_group"]).any()
            or np.isinf(arrays["item_rewards"]).any()
            or (np.nan_to_num(arrays["cost_by_group"], nan=0.0) < 0).any()
            or np.isinf(arrays["cost_by_group"]).any()
            or not all(b is None or (_number(b) and b > 0) for b in meta["budgets"])
            or not all(_number(d) and d > 0 for d in meta["deadlines"])
            or not np.isfinite(arrays["embeddings"]).all()
        ):
            raise ValueError("its arrays and its index do not match")
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
        return cls(
            targets,
            arrays["embeddings"].astype(np.float32),
            int(meta["k"]),
            float(meta["shrink"]),
            meta["domains"],
            meta["groups"],
        )


def check_plan_workers(hint: PlanHint, names: Sequence[str], trained: Sequence[str], what: str) -> None:
    """Refuse a lookup that names a worker the model was not trained with (``trained``: its
    ``conductor.json`` ``pool_workers``; a tampered file), or a pool that has none of its workers
    (every line would be missing); log the workers the pool lacks (no line names them)."""
    ghosts = sorted(hint.workers() - set(trained)) if trained else []
    if ghosts:
        raise ValueError(f"{what}: its plan hint names workers it was not trained with: {ghosts}")
    if names and not hint.workers() & set(names):
        raise InvalidArgument(
            f"{what}: its plan hint names workers {sorted(hint.workers())}, and this pool has none of "
            f"them ({list(names)}); evaluate it on the pool it was trained on, or train it on this one"
        )
    missing = sorted(hint.workers() - set(names)) if names else []
    if missing:
        log.warning("%s: this pool lacks workers %s; no plan line names them", what, missing)
