"""Per-question evidence for the Conductor: how likely each worker is to answer *this* question right.

Why it exists: a Conductor that sees only the first words of a question can learn no more than
a table per kind of question (a domain-router with extra steps). What a router knows that the
question's surface does not say is how each worker did on questions like this one. This module
turns the training split's single-worker outcomes (every training question answered by every
worker alone: the candidate table's single rows, or
:class:`~rl_conductor.policies.routers.SingleOutcomes`) into one number per worker and question:
the estimated probability that the worker alone answers it correctly. The prompt shows it per
worker (``~70% right``, :func:`rl_conductor.prompting.worker_lines`), and the warm start's
targets are made per question from the same numbers (:mod:`rl_conductor.training.warmstart`), so
what the Conductor is taught to do is a function of what it is shown.

The estimator: per worker, an L2-regularised logistic regression (scikit-learn) on the
question's all-MiniLM-L6-v2 embedding (the kNN router's index, :func:`~rl_conductor.policies.knn.
cached_embeddings`), a few surface features (log length, how many numbers, how many lines) and
its domain. The regularisation strength is chosen
per worker by cross-validated log-loss, so on a pool whose item difficulty cannot be read from the
text (the simulated pool draws it from a hash of the item id) the estimate falls back to the
group's rate, and on real recordings it uses what the text does predict. Why a probe and not the
kNN mean: on ``routellm-replay`` (validation split, chosen there) it ranks questions better than
any neighbourhood size, see ``benchmarks/evidence_rules.py``.

Leakage: the training prompts' evidence is *out-of-fold* (5 folds: each question's estimate comes
from a model that never saw it), so training prompts look like test prompts; the model saved
with the Conductor is fitted on every training question and never on a validation or test one.
Workers with one outcome only in training (always right, or always wrong) get that rate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from rl_conductor.prompting import percent
from rl_conductor.tasks.base import Task

__all__ = ["EvidenceModel", "evidence_for", "fit_evidence", "percent"]

FILE = "evidence.npz"
META = "evidence.json"
#: regularisation strengths tried per worker (inverse L2 weight; cross-validated log-loss)
CS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
FOLDS = 5
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")


def surface(question: str) -> list[float]:
    """Length, numbers and lines of a question: what its embedding (first 128 word pieces, topic
    rather than size) does not carry about how hard it is."""
    return [
        float(np.log1p(len(question))),
        min(len(_NUMBER.findall(question)), 40) / 10.0,
        min(question.count("\n"), 40) / 10.0,
    ]


@dataclass
class EvidenceModel:
    """Fitted per-worker correctness probes (see module docstring)."""

    names: list[str]
    groups: list[str]
    coef: NDArray[np.float64]  # [workers, features]
    intercept: NDArray[np.float64]  # [workers]
    mean: NDArray[np.float64]  # surface feature standardisation
    std: NDArray[np.float64]
    constant: NDArray[np.float64]  # [workers]: the rate of a one-outcome worker, NaN otherwise
    chosen_c: list[float]

    def features(self, tasks: Sequence[Task], embeddings: NDArray[np.floating]) -> NDArray[np.float64]:
        s = (np.array([surface(t.question) for t in tasks], dtype=np.float64) - self.mean) / self.std
        g = np.array([[t.domain == name for name in self.groups] for t in tasks], dtype=np.float64)
        g = g.reshape(len(tasks), len(self.groups))
        return np.hstack([np.asarray(embeddings, dtype=np.float64), s, g])

    def predict(self, tasks: Sequence[Task], embeddings: NDArray[np.floating]) -> NDArray[np.float64]:
        """``[tasks, workers]`` estimated probability that each worker alone is right."""
        if not len(tasks):
            return np.zeros((0, len(self.names)))
        z = self.features(tasks, embeddings) @ self.coef.T + self.intercept
        p = 1.0 / (1.0 + np.exp(-z))
        return np.where(np.isnan(self.constant), p, self.constant)

    def as_mapping(self, row: NDArray[np.floating]) -> dict[str, float]:
        return {n: float(v) for n, v in zip(self.names, row, strict=True)}

    def save(self, folder: str | Path) -> None:
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        np.savez(
            d / FILE,
            coef=self.coef,
            intercept=self.intercept,
            mean=self.mean,
            std=self.std,
            constant=self.constant,
        )
        meta = {"names": self.names, "groups": self.groups, "chosen_c": self.chosen_c}
        (d / META).write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, folder: str | Path) -> EvidenceModel:
        d = Path(folder)
        arrays = np.load(d / FILE)
        meta = json.loads((d / META).read_text())
        return cls(
            names=list(meta["names"]),
            groups=list(meta["groups"]),
            coef=arrays["coef"],
            intercept=arrays["intercept"],
            mean=arrays["mean"],
            std=arrays["std"],
            constant=arrays["constant"],
            chosen_c=[float(c) for c in meta["chosen_c"]],
        )

    @staticmethod
    def exists(folder: str | Path) -> bool:
        return (Path(folder) / FILE).is_file() and (Path(folder) / META).is_file()


def fit_evidence(
    tasks: Sequence[Task],
    embeddings: NDArray[np.floating],
    names: Sequence[str],
    correct: NDArray[np.bool_],
    *,
    seed: int = 0,
) -> tuple[EvidenceModel, NDArray[np.float64]]:
    """Fit the probes on training questions and return them with the out-of-fold estimates.

    ``correct[i, j]``: worker ``names[j]`` alone answered ``tasks[i]`` correctly. Returns the
    model fitted on every question and the ``[tasks, workers]`` out-of-fold estimates.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    n, w = correct.shape
    if n != len(tasks) or len(names) != w:
        raise ValueError(f"{n} outcome rows for {len(tasks)} tasks, {w} columns for {len(names)} workers")
    groups = sorted({t.domain for t in tasks})
    raw = np.array([surface(t.question) for t in tasks], dtype=np.float64).reshape(n, 3)
    mean = raw.mean(axis=0) if n else np.zeros(3)
    std = np.maximum(raw.std(axis=0), 1e-6) if n else np.ones(3)
    model = EvidenceModel(
        names=list(names),
        groups=groups,
        coef=np.zeros((w, 0)),
        intercept=np.zeros(w),
        mean=mean,
        std=std,
        constant=np.full(w, np.nan),
        chosen_c=[0.0] * w,
    )
    x = model.features(tasks, embeddings)
    model.coef = np.zeros((w, x.shape[1]))
    oof = np.zeros((n, w))
    for j in range(w):
        y = correct[:, j].astype(int)
        counts = np.bincount(y, minlength=2)
        if counts.min() < FOLDS:  # (nearly) one outcome: its rate, shrunk a little towards 1/2
            rate = (counts[1] + 0.5) / (n + 1.0)
            model.constant[j] = rate
            oof[:, j] = rate
            continue
        folds = list(StratifiedKFold(FOLDS, shuffle=True, random_state=seed).split(x, y))
        best: tuple[float, float, NDArray[np.float64]] | None = None
        for c in CS:
            pred = np.zeros(n)
            for train, held in folds:
                clf = LogisticRegression(C=c, max_iter=1000).fit(x[train], y[train])
                pred[held] = clf.predict_proba(x[held])[:, 1]
            p = np.clip(pred, 1e-6, 1 - 1e-6)
            loss = float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())
            if best is None or loss < best[0] - 1e-12:
                best = (loss, c, pred)
        assert best is not None
        _, c, pred = best
        oof[:, j] = pred
        full = LogisticRegression(C=c, max_iter=1000).fit(x, y)
        model.coef[j] = full.coef_[0]
        model.intercept[j] = full.intercept_[0]
        model.chosen_c[j] = c
    return model, oof


def evidence_for(
    model: EvidenceModel, tasks: Sequence[Task], embeddings: NDArray[np.floating] | None = None
) -> list[dict[str, float]]:
    """The estimates for ``tasks`` (embedded here when ``embeddings`` is None, uncached)."""
    from rl_conductor.policies.knn_embed import embed

    if not tasks:
        return []
    emb = embed([t.question for t in tasks]) if embeddings is None else embeddings
    return [model.as_mapping(r) for r in model.predict(tasks, emb)]
