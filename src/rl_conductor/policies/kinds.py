"""What kind of question a request is when its label does not say: the kind of its nearest
training questions.

Why it exists: a served request carries no domain (``serving/request.py`` builds its task as
``unknown``), while evaluation reads each question's domain from its dataset. What a Conductor
is shown can depend on the domain: the evidence models' per-domain rates and costs
(:mod:`rl_conductor.policies.evidence`, the ``Best by estimate:`` line) and the plan line's
neighbourhood (:mod:`rl_conductor.policies.plan_hint`). Without this, a served Conductor is shown
other lines than the ones its evaluation measured (an outside attack found every served plan
line naming the one best worker overall). So a model saves, next to that evidence, the MiniLM
embeddings of its training questions with their domains and warm-start groups, and a question of
a domain the model does not know takes the most common kind among its
:data:`KIND_NEIGHBOURS` nearest training questions.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rl_conductor.tasks.base import Task

#: how many nearest training questions vote on a question's kind
KIND_NEIGHBOURS = 10
#: the domain of a served request (``serving/request.py``, ``conductor plan`` with free text)
UNKNOWN = "unknown"
ARRAYS = "kinds.npz"
META = "kinds.json"


def unit(v: np.ndarray) -> np.ndarray:
    """``v`` scaled to length 1 (rows of a matrix each; a zero vector stays zero)."""
    e = np.asarray(v, dtype=np.float32)
    if e.ndim == 1:
        return e / max(float(np.linalg.norm(e)), 1e-12)
    return e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)


def majority(labels: Sequence[str]) -> str:
    """The most common label, ties to the one that comes first (the nearer question)."""
    counts: dict[str, int] = {}
    for x in labels:
        counts[x] = counts.get(x, 0) + 1
    return max(counts, key=lambda x: (counts[x], -labels.index(x)))


class KindIndex:
    """Training questions' embeddings with their domains and groups (see module docstring)."""

    def __init__(self, embeddings: np.ndarray, domains: Sequence[str], groups: Sequence[str]) -> None:
        from rl_conductor.policies.knn_embed import EMBED_DIM

        e = np.asarray(embeddings, dtype=np.float32)
        if e.ndim != 2 or e.shape[0] != len(domains) or len(domains) != len(groups) or not len(domains):
            raise ValueError("a kind index needs one embedding, domain and group per training question")
        if e.shape[1] != EMBED_DIM or not np.isfinite(e).all():
            raise ValueError(f"its embeddings must be finite, {EMBED_DIM} wide (MiniLM's), not {e.shape[1]}")
        if not all(isinstance(x, str) and x for x in (*domains, *groups)):
            raise ValueError("its domains and groups must be names")
        self.embeddings = unit(e)
        self.domains = [str(d) for d in domains]
        self.groups = [str(g) for g in groups]
        self.known = frozenset(self.domains)

    @classmethod
    def of(cls, tasks: Sequence[Task], group_by: str = "source") -> KindIndex:
        """The index of ``tasks`` (training questions), embedded with the kNN router's cache."""
        from rl_conductor.policies.expected import group_of
        from rl_conductor.policies.knn import cached_embeddings

        emb = cached_embeddings([t.question for t in tasks])
        return cls(emb, [t.domain for t in tasks], [group_of(t, group_by) for t in tasks])

    def kind(self, embedding: np.ndarray) -> tuple[str, str]:
        """The (domain, group) of a question: the most common domain among its
        :data:`KIND_NEIGHBOURS` nearest training questions, and the most common group of those
        of that domain (ties to the nearer)."""
        sim = self.embeddings @ unit(embedding)
        near = np.argsort(-sim)[: min(KIND_NEIGHBOURS, len(sim))]
        domain = majority([self.domains[i] for i in near])
        return domain, majority([self.groups[i] for i in near if self.domains[i] == domain])

    def with_domains(self, tasks: Sequence[Task], embeddings: np.ndarray) -> list[Task]:
        """``tasks`` with each domain the index does not know (or ``unknown``, a served request's,
        even where a training file named a domain so) replaced by the kind's domain."""
        return [
            t if not self.infers(t) else _with_domain(t, self.kind(e)[0])
            for t, e in zip(tasks, embeddings, strict=True)
        ]

    def infers(self, task: Task) -> bool:
        """Whether ``task``'s kind is read from its neighbours (its label does not say it)."""
        return task.domain == UNKNOWN or task.domain not in self.known

    # -- files ------------------------------------------------------------------------------
    @staticmethod
    def exists(folder: str | Path) -> bool:
        return (Path(folder) / ARRAYS).is_file() and (Path(folder) / META).is_file()

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(folder / ARRAYS, embeddings=self.embeddings.astype(np.float16))
        (folder / META).write_text(json.dumps({"domains": self.domains, "groups": self.groups}))

    @classmethod
    def load(cls, folder: str | Path) -> KindIndex:
        """The index saved in ``folder``; ValueError naming the files where it does not load."""
        folder = Path(folder)
        try:
            meta = json.loads((folder / META).read_text(encoding="utf-8"))
            with np.load(folder / ARRAYS) as z:
                emb = z["embeddings"].astype(np.float32)
            return cls(emb, meta["domains"], meta["groups"])
        except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as exc:
            what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise ValueError(f"the kind index in {folder} ({ARRAYS}, {META}) does not load: {what}") from exc


def _with_domain(task: Task, domain: str) -> Task:
    from dataclasses import replace

    return replace(task, domain=domain)
