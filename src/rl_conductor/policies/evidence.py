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

Shrinkage (``fit_evidence(shrink=True)``, the ``evidence: rank`` recipe): on a pool with few
training questions or many workers the probe's per-question signal can be weaker than its
noise, and a probe regularised to a constant lands on the *overall* rate, below what a
domain-router knows. So each worker's estimate is a blend ``a x probe + (1 - a) x its domain's
rate``, with ``a`` in :data:`ALPHAS` chosen with the regularisation strength by the same
out-of-fold log-loss (``a = 0`` is the domain rate itself: where the probe predicts nothing, the
estimate is the domain-router's).

Ranking (:func:`estimated_rewards`, :func:`ranking`): the estimate turned into the reward the
Conductor is trained for (its chance of being right, minus the cost term at the worker's mean
cost on the domain's training questions), and the workers the request may use ordered by it. The
prompt's ``Best by estimate:`` line and the warm-start targets of ``evidence: rank`` are both made
by these two functions, so the target is the line's first id.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from rl_conductor.errors import InvalidArgument
from rl_conductor.limits import RequestLimits
from rl_conductor.prompting import over_budget, percent
from rl_conductor.reward import RewardConfig, reward_of
from rl_conductor.tasks.base import Task
from rl_conductor.workers.pool import PoolView

__all__ = [
    "EvidenceModel",
    "Ranker",
    "check_known_workers",
    "estimated_rewards",
    "evidence_for",
    "fit_evidence",
    "percent",
    "ranking",
]

log = logging.getLogger(__name__)

FILE = "evidence.npz"
META = "evidence.json"
#: regularisation strengths tried per worker (inverse L2 weight; cross-validated log-loss)
CS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
#: weights of the probe against the domain's rate tried per worker with ``shrink`` (see docstring)
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
FOLDS = 5
#: neighbourhood sizes of the kNN candidates of ``fit_evidence(select=...)``
KNN_KS = (10, 25, 50, 100, 200)
#: the kNN sizes whose logits the stacked candidate combines (with the domain rate and the probe)
STACK_KS = (10, 50, 200)
#: pseudo-questions at the domain's rate added to every kNN neighbourhood (a neighbourhood of ten
#: is not certain; empirical-Bayes shrinkage towards the domain-router's knowledge)
KNN_PRIOR = 2.0
#: the candidates of ``select``, simplest first (a tie within the rule's tolerance goes to the earlier)
CANDIDATES = ("domain", *(f"knn-{k}" for k in KNN_KS), "shrunk", "probe", "stack")
#: how ``select`` picks among them: the best out-of-fold reward, the simplest within one standard
#: error of it, or the lowest out-of-fold log-loss summed over workers (smoother than a reward
#: that only counts each question's first worker)
RULES = ("best", "1se", "logloss")
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
    #: [workers] weight of the probe against the domain's rate (1 = the probe alone, as unshrunk)
    alpha: NDArray[np.float64] | None = None
    #: [groups + 1, workers] training rate of being right per domain (last row: every domain)
    rate: NDArray[np.float64] | None = None
    #: [groups + 1, workers] mean training cost (USD) per domain (last row: every domain); NaN
    #: where not measured (a model saved before costs were kept)
    cost: NDArray[np.float64] | None = None
    #: the estimator chosen by ``fit_evidence(select=...)`` (:data:`CANDIDATES`); None: the probe
    #: (blended by :attr:`alpha` where set), as before selection existed
    estimator: str | None = None
    #: [train questions, dim] and [train questions, workers]: the kNN candidates' index and outcomes
    knn_emb: NDArray[np.float32] | None = None
    knn_y: NDArray[np.float32] | None = None
    #: [workers, 1 + len(STACK_KS) + 2] the stacked candidate's logistic weights (first: intercept)
    stack: NDArray[np.float64] | None = None
    #: out-of-fold mean training reward of every candidate (what ``select`` chose by)
    selection: dict[str, float] | None = None
    #: per candidate, the standard error of the best candidate's out-of-fold reward minus its own
    #: (paired over training questions; what ``rule="1se"`` compares with)
    selection_se: dict[str, float] | None = None
    #: per candidate, its out-of-fold log-loss summed over workers (what ``rule="logloss"`` minimises)
    selection_logloss: dict[str, float] | None = None

    def group_rows(self, tasks: Sequence[Task]) -> NDArray[np.int64]:
        """Each task's row of :attr:`rate` / :attr:`cost` (an unknown domain: the last row)."""
        index = {g: i for i, g in enumerate(self.groups)}
        return np.array([index.get(t.domain, len(self.groups)) for t in tasks], dtype=np.int64)

    def domain_cost(self, tasks: Sequence[Task]) -> NDArray[np.float64]:
        """``[tasks, workers]`` mean training cost of each worker on the task's domain."""
        if self.cost is None:
            raise ValueError("this evidence model was saved without worker costs; train it again")
        return self.cost[self.group_rows(tasks)]

    def features(self, tasks: Sequence[Task], embeddings: NDArray[np.floating]) -> NDArray[np.float64]:
        s = (np.array([surface(t.question) for t in tasks], dtype=np.float64) - self.mean) / self.std
        g = np.array([[t.domain == name for name in self.groups] for t in tasks], dtype=np.float64)
        g = g.reshape(len(tasks), len(self.groups))
        return np.hstack([np.asarray(embeddings, dtype=np.float64), s, g])

    def predict(self, tasks: Sequence[Task], embeddings: NDArray[np.floating]) -> NDArray[np.float64]:
        """``[tasks, workers]`` estimated probability that each worker alone is right."""
        if not len(tasks):
            return np.zeros((0, len(self.names)))
        kind = self.estimator
        if kind is None or kind in ("probe", "shrunk", "stack"):
            z = self.features(tasks, embeddings) @ self.coef.T + self.intercept
            p = 1.0 / (1.0 + np.exp(-z))
            if kind in (None, "shrunk") and self.alpha is not None and self.rate is not None:
                p = self.alpha * p + (1.0 - self.alpha) * self.rate[self.group_rows(tasks)]
        if kind is not None and kind not in ("probe", "shrunk"):
            assert self.rate is not None, "a selected estimator keeps the domain rates"
            prior = self.rate[self.group_rows(tasks)]
            if kind == "domain":
                p = prior
            else:
                assert self.knn_emb is not None and self.knn_y is not None
                ks = STACK_KS if kind == "stack" else (int(kind.split("-")[1]),)
                near = knn_means(np.asarray(embeddings), self.knn_emb, self.knn_y, ks, prior)
                if kind == "stack":
                    assert self.stack is not None
                    p = stacked(self.stack, stack_features(prior, near, p))
                else:
                    p = near[ks[0]]
        return np.where(np.isnan(self.constant), p, self.constant)

    def as_mapping(self, row: NDArray[np.floating]) -> dict[str, float]:
        return {n: float(v) for n, v in zip(self.names, row, strict=True)}

    def save(self, folder: str | Path) -> None:
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        optional = {k: v for k, v in self._arrays().items() if v is not None}
        np.savez(
            d / FILE,
            coef=self.coef,
            intercept=self.intercept,
            mean=self.mean,
            std=self.std,
            constant=self.constant,
            **optional,
        )
        meta: dict[str, object] = {"names": self.names, "groups": self.groups, "chosen_c": self.chosen_c}
        if self.estimator is not None:
            meta.update(
                estimator=self.estimator,
                selection=self.selection,
                selection_se=self.selection_se,
                selection_logloss=self.selection_logloss,
            )
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
            estimator=meta.get("estimator"),
            selection=meta.get("selection"),
            selection_se=meta.get("selection_se"),
            selection_logloss=meta.get("selection_logloss"),
            **{k: arrays[k] for k in OPTIONAL_ARRAYS if k in arrays.files},
        )

    def _arrays(self) -> dict[str, NDArray[np.generic] | None]:
        return {k: getattr(self, k) for k in OPTIONAL_ARRAYS}

    @staticmethod
    def exists(folder: str | Path) -> bool:
        return (Path(folder) / FILE).is_file() and (Path(folder) / META).is_file()


#: the model's arrays saved only where set
OPTIONAL_ARRAYS = ("alpha", "rate", "cost", "knn_emb", "knn_y", "stack")


def knn_means(
    query: NDArray[np.floating],
    index: NDArray[np.floating],
    outcomes: NDArray[np.floating],
    ks: Sequence[int],
    prior: NDArray[np.floating],
) -> dict[int, NDArray[np.float64]]:
    """Per k in ``ks``, ``[queries, workers]``: each worker's rate of being right on the k most
    cosine-similar ``index`` questions, with :data:`KNN_PRIOR` pseudo-questions at ``prior`` (the
    query's domain rate, ``[queries, workers]``) added."""
    q = np.asarray(query, dtype=np.float32)
    base = np.asarray(index, dtype=np.float32)
    y = np.asarray(outcomes, dtype=np.float64)
    kmax = min(max(ks), len(base))
    out: dict[int, NDArray[np.float64]] = {}
    if kmax == 0:
        return {k: np.asarray(prior, dtype=np.float64) for k in ks}
    sums = {k: np.zeros((len(q), y.shape[1])) for k in ks}
    for start in range(0, len(q), 512):  # [512, index] similarities at a time
        sims = q[start : start + 512] @ base.T
        top = np.argpartition(-sims, kmax - 1, axis=1)[:, :kmax]
        order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1, kind="stable")
        top = np.take_along_axis(top, order, axis=1)
        for k in ks:
            sums[k][start : start + len(top)] = y[top[:, : min(k, kmax)]].sum(axis=1)
    for k in ks:
        kk = min(k, kmax)
        out[k] = (sums[k] + KNN_PRIOR * prior) / (kk + KNN_PRIOR)
    return out


def _logit(p: NDArray[np.floating]) -> NDArray[np.float64]:
    q = np.clip(np.asarray(p, dtype=np.float64), 0.01, 0.99)
    return np.log(q / (1.0 - q))


def stack_features(
    prior: NDArray[np.floating], near: Mapping[int, NDArray[np.floating]], probe: NDArray[np.floating]
) -> NDArray[np.float64]:
    """``[questions, workers, features]``: the logits the stacked candidate combines per worker
    (domain rate, kNN means at :data:`STACK_KS`, the probe)."""
    return np.stack([_logit(prior), *(_logit(near[k]) for k in STACK_KS), _logit(probe)], axis=-1)


def stacked(weights: NDArray[np.floating], features: NDArray[np.floating]) -> NDArray[np.float64]:
    """Per worker ``j``: ``sigmoid(weights[j, 0] + features[:, j] @ weights[j, 1:])``."""
    z = weights[None, :, 0] + np.einsum("qwf,wf->qw", features, weights[:, 1:])
    return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)


def _rates(
    rows: NDArray[np.int64], y: NDArray[np.floating], n_groups: int, prior: float = 1.0
) -> NDArray[np.float64]:
    """``[n_groups + 1]`` mean of ``y`` per group row (last: all), each shrunk towards the overall
    mean with a weight of ``prior`` items (a domain of one question is not certain)."""
    overall = float(y.mean()) if len(y) else 0.5
    sums = np.bincount(rows, weights=y, minlength=n_groups)[:n_groups]
    counts = np.bincount(rows, minlength=n_groups)[:n_groups]
    return np.append((sums + prior * overall) / (counts + prior), overall)


def _log_loss(y: NDArray[np.int64], pred: NDArray[np.floating]) -> float:
    p = np.clip(pred, 1e-6, 1 - 1e-6)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


def fit_evidence(
    tasks: Sequence[Task],
    embeddings: NDArray[np.floating],
    names: Sequence[str],
    correct: NDArray[np.bool_],
    *,
    seed: int = 0,
    cost: NDArray[np.floating] | None = None,
    shrink: bool = False,
    select: RewardConfig | None = None,
    rule: str = "best",
) -> tuple[EvidenceModel, NDArray[np.float64]]:
    """Fit the probes on training questions and return them with the out-of-fold estimates.

    With ``select`` (the reward the estimates will rank workers by; needs ``cost``) every
    candidate of :data:`CANDIDATES` is estimated out of fold and the one whose ranking earns the
    most training reward is kept (:func:`_select`; ``rule`` ``"1se"`` keeps the simplest within
    one standard error of the best instead); the returned estimates are that candidate's.

    ``correct[i, j]``: worker ``names[j]`` alone answered ``tasks[i]`` correctly; ``cost[i, j]``
    what that call cost (kept per domain for :func:`estimated_rewards`). With ``shrink`` each
    estimate is blended with the worker's domain rate by a weight chosen out of fold (module
    docstring). Returns the model fitted on every question and the ``[tasks, workers]``
    out-of-fold estimates.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    n, w = correct.shape
    if n != len(tasks) or len(names) != w:
        raise ValueError(f"{n} outcome rows for {len(tasks)} tasks, {w} columns for {len(names)} workers")
    if cost is not None and np.shape(cost) != (n, w):
        raise ValueError(f"cost has shape {np.shape(cost)}, outcomes {(n, w)}")
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
    rows = model.group_rows(tasks)
    if cost is not None:
        c = np.asarray(cost, dtype=np.float64)
        model.cost = np.stack([_rates(rows, c[:, j], len(groups), prior=0.0) for j in range(w)], axis=1)
    if select is not None and cost is None:
        raise ValueError("select needs the training costs (cost=...) to score rankings by reward")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, not {rule!r}")
    shrink = shrink or select is not None
    alphas = ALPHAS if shrink else (1.0,)
    if shrink:
        model.alpha = np.ones(w)
        model.rate = np.stack(
            [_rates(rows, correct[:, j].astype(float), len(groups)) for j in range(w)], axis=1
        )
    x = model.features(tasks, embeddings)
    model.coef = np.zeros((w, x.shape[1]))
    oof = np.zeros((n, w))
    probe_oof, probe_c = np.zeros((n, w)), [1.0] * w  # the probe alone (a = 1), for ``select``
    for j in range(w):
        y = correct[:, j].astype(int)
        counts = np.bincount(y, minlength=2)
        if counts.min() < FOLDS:  # (nearly) one outcome: its rate, shrunk a little towards 1/2
            rate = (counts[1] + 0.5) / (n + 1.0)
            model.constant[j] = rate
            oof[:, j] = probe_oof[:, j] = rate
            continue
        folds = list(StratifiedKFold(FOLDS, shuffle=True, random_state=seed).split(x, y))
        domain = np.zeros(n)  # out-of-fold domain rates (for the blend)
        for train, held in folds:
            domain[held] = _rates(rows[train], y[train].astype(float), len(groups))[rows[held]]
        best: tuple[float, float, float, NDArray[np.float64]] | None = None
        alone = np.inf
        for c in CS:
            pred = np.zeros(n)
            for train, held in folds:
                clf = LogisticRegression(C=c, max_iter=1000).fit(x[train], y[train])
                pred[held] = clf.predict_proba(x[held])[:, 1]
            if _log_loss(y, pred) < alone - 1e-12:
                alone, probe_oof[:, j], probe_c[j] = _log_loss(y, pred), pred, c
            for a in alphas:
                blend = a * pred + (1.0 - a) * domain
                loss = _log_loss(y, blend)
                if best is None or loss < best[0] - 1e-12:
                    best = (loss, c, a, blend)
        assert best is not None
        _, c, a, pred = best
        oof[:, j] = pred
        full = LogisticRegression(C=c, max_iter=1000).fit(x, y)
        model.coef[j] = full.coef_[0]
        model.intercept[j] = full.intercept_[0]
        model.chosen_c[j] = c
        if model.alpha is not None:
            model.alpha[j] = a
    if select is not None:
        assert cost is not None
        oof = _select(
            model, x, rows, embeddings, correct, np.asarray(cost, dtype=np.float64), select, seed, rule,
            shrunk=oof, probe=probe_oof, probe_c=probe_c,
        )  # fmt: skip
    return model, oof


def one_se_choice(score: Mapping[str, float], se: Mapping[str, float]) -> str:
    """The first of :data:`CANDIDATES` whose score is within ``se`` (its paired standard error
    against the best) of the best score: the one-standard-error rule, simplest first."""
    best = max(score.values())
    return next(c for c in CANDIDATES if best - score[c] <= se[c] + 1e-12)


def _select(
    model: EvidenceModel,
    x: NDArray[np.float64],
    rows: NDArray[np.int64],
    embeddings: NDArray[np.floating],
    correct: NDArray[np.bool_],
    cost: NDArray[np.float64],
    config: RewardConfig,
    seed: int,
    rule: str,
    *,
    shrunk: NDArray[np.float64],
    probe: NDArray[np.float64],
    probe_c: list[float],
) -> NDArray[np.float64]:
    """Choose the estimator of ``model`` among :data:`CANDIDATES` by out-of-fold training reward.

    Every candidate's out-of-fold estimates (the domain rates, kNN means at :data:`KNN_KS`
    shrunk towards them, the shrunk and the plain probe from :func:`fit_evidence`'s folds, and
    the stack: per worker a logistic regression on the logits of the domain rate, three kNN means
    and the probe, fitted on those out-of-fold logits and scored by a second 5-fold split of
    them) rank each training question's workers by estimated reward (:func:`estimated_rewards`);
    a candidate's score is the mean recorded reward of the workers it ranks first. ``best``
    keeps the highest score; ``1se`` the first candidate (simplest first) within one paired
    standard error of it. Sets ``model``'s estimator and the arrays it needs; returns the chosen
    candidate's out-of-fold estimates. Only training questions are read."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import KFold

    n, w = correct.shape
    assert model.rate is not None and model.cost is not None
    y = correct.astype(np.float64)
    emb = np.asarray(embeddings, dtype=np.float32)
    n_groups = len(model.groups)
    folds = list(KFold(FOLDS, shuffle=True, random_state=seed).split(np.arange(n)))
    domain = np.zeros((n, w))
    near: dict[int, NDArray[np.float64]] = {k: np.zeros((n, w)) for k in KNN_KS}
    for train, held in folds:
        rate = np.stack([_rates(rows[train], y[train, j], n_groups) for j in range(w)], axis=1)
        domain[held] = rate[rows[held]]
        for k, v in knn_means(emb[held], emb[train], y[train], KNN_KS, domain[held]).items():
            near[k][held] = v
    feats = stack_features(domain, near, probe)
    weights = np.zeros((w, feats.shape[2] + 1))
    stack = np.zeros((n, w))
    for j in range(w):
        if not np.isnan(model.constant[j]):
            stack[:, j] = model.constant[j]
            continue
        for train, held in folds:
            clf = LogisticRegression(C=1.0, max_iter=1000).fit(feats[train, j], correct[train, j])
            stack[held, j] = clf.predict_proba(feats[held, j])[:, 1]
        full = LogisticRegression(C=1.0, max_iter=1000).fit(feats[:, j], correct[:, j])
        weights[j] = np.append(full.intercept_[0], full.coef_[0])
    cands: dict[str, NDArray[np.float64]] = {
        "domain": domain,
        **{f"knn-{k}": near[k] for k in KNN_KS},
        "shrunk": shrunk,
        "probe": probe,
        "stack": stack,
    }
    one = np.isnan(model.constant)
    got = {}
    recorded = np.asarray(reward_of(config, correct=y, cost=cost), dtype=np.float64)
    mean_cost = model.cost[rows]
    for name, est in cands.items():
        est = np.where(one, est, model.constant)
        first = np.asarray(reward_of(config, correct=est, cost=mean_cost)).argmax(axis=1)
        got[name] = recorded[np.arange(n), first]
    score = {name: float(v.mean()) for name, v in got.items()}
    top = max(CANDIDATES, key=lambda c: (score[c], -CANDIDATES.index(c)))
    se = {c: float((got[top] - got[c]).std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0 for c in CANDIDATES}
    loss = {
        c: float(sum(_log_loss(correct[:, j].astype(int), cands[c][:, j]) for j in np.flatnonzero(one)))
        for c in CANDIDATES
    }
    chosen = {"best": top, "1se": one_se_choice(score, se), "logloss": min(CANDIDATES, key=loss.__getitem__)}[
        rule
    ]
    model.estimator, model.selection, model.selection_se = chosen, score, se
    model.selection_logloss = loss
    # the index the kNN candidates were scored on (the training questions), kept whatever is chosen
    model.knn_emb, model.knn_y = emb, y.astype(np.float32)
    if chosen in ("probe", "stack"):  # the probe alone at its own strength, not the blend's
        for j in np.flatnonzero(one):
            full = LogisticRegression(C=probe_c[j], max_iter=1000).fit(x, correct[:, j])
            model.coef[j], model.intercept[j], model.chosen_c[j] = (
                full.coef_[0],
                full.intercept_[0],
                probe_c[j],
            )
    if chosen == "stack":
        model.stack = weights
    return np.where(one, cands[chosen], model.constant)


def estimated_rewards(
    model: EvidenceModel, tasks: Sequence[Task], estimates: NDArray[np.floating], config: RewardConfig
) -> NDArray[np.float64]:
    """``[tasks, workers]`` the reward each worker alone is expected to earn on each task: the
    format bonus, ``correct_weight`` x its estimate (``estimates``, from :meth:`EvidenceModel.
    predict` or out of fold) and the cost term at its mean training cost on the task's domain."""
    return np.asarray(reward_of(config, correct=estimates, cost=model.domain_cost(tasks)), dtype=np.float64)


def ranking(
    model: EvidenceModel, rewards: NDArray[np.floating], view: PoolView, limits: RequestLimits
) -> list[int]:
    """The ordinals of ``view`` best first by one task's ``rewards`` (a row of
    :func:`estimated_rewards`, columns ``model.names``): only workers the request may use — not
    over its budget (:func:`~rl_conductor.prompting.over_budget`, what the Conductor's decoding
    masks) and permitted by its limits — unless none is, then every shown worker. Workers the
    model does not know come last; ties go to the lower ordinal."""
    col = {name: j for j, name in enumerate(model.names)}
    infos = view.infos()
    usable = [
        i
        for i, info in enumerate(infos)
        if not over_budget(info, limits.max_cost_usd) and limits.permits(info.name, info.hosting)
    ] or list(range(len(infos)))
    score = {i: float(rewards[col[infos[i].name]]) if infos[i].name in col else -np.inf for i in usable}
    return sorted(usable, key=lambda i: (-score[i], i))


def check_known_workers(model: EvidenceModel, names: Sequence[str], what: str) -> None:
    """Refuse a pool none of whose workers the evidence was fitted for (every estimate would be
    unknown and the ranking the pool's order: the first worker for every question), and log the
    workers it does not know (ranked last). ``what``: the policy, for the message."""
    unknown = [n for n in names if n not in model.names]
    if names and len(unknown) == len(names):
        raise InvalidArgument(
            f"{what}: its evidence was fitted for workers {model.names}, and this pool has none of "
            f"them ({list(names)}); evaluate it on the pool it was trained on, or train it on this one"
        )
    if unknown:
        log.warning("%s: no evidence for workers %s: they are ranked last", what, unknown)


def evidence_for(
    model: EvidenceModel, tasks: Sequence[Task], embeddings: NDArray[np.floating] | None = None
) -> list[dict[str, float]]:
    """The estimates for ``tasks`` (embedded here when ``embeddings`` is None, uncached)."""
    from rl_conductor.policies.knn_embed import embed

    if not tasks:
        return []
    emb = embed([t.question for t in tasks]) if embeddings is None else embeddings
    return [model.as_mapping(r) for r in model.predict(tasks, emb)]


@dataclass
class Ranker:
    """A question's ranking line (``evidence: rank``) from its estimates: the one function the
    warm-start targets (its first id), the training prompts and the Conductor's prompts all call."""

    model: EvidenceModel
    config: RewardConfig

    def __call__(
        self, task: Task, estimates: Mapping[str, float], view: PoolView, limits: RequestLimits
    ) -> list[int]:
        row = np.array([[estimates.get(n, np.nan) for n in self.model.names]], dtype=np.float64)
        rewards = estimated_rewards(self.model, [task], row, self.config)[0]
        return ranking(self.model, np.where(np.isnan(rewards), -np.inf, rewards), view, limits)
