"""Single-worker routers fitted on the training split: the floors a learned Conductor must clear.

Both routers here and the kNN router (:mod:`rl_conductor.policies.knn`) learn from one
measurement, :class:`SingleOutcomes`: every training question answered by every worker of the
pool alone, through the same episode runner as evaluation, with its correctness and its cost. From it
each predicts a worker's *expected reward* (the evaluation's reward preset: correct minus the
cost term, :func:`rl_conductor.reward.reward_of`) and sends the question to the best worker
the request permits and can afford, as RouterBench's and RouteLLM's similarity-weighted
routers do. Labelling each question with its cheapest correct worker instead (the old kNN
router) drifts to cheap workers: the cheapest worker is right on the easy questions and every
worker is wrong on the hard ones.

* ``domain-router`` — the worker with the best mean reward in the question's domain (all of the
  training questions of that domain weigh alike). It only reads the domain: the floor any
  learned policy must clear.

Budgets: a worker is affordable when its mean cost on the questions the estimate used is within
``max_cost_usd``; with none affordable, the cheapest (by that mean) is sent and the executor
enforces the budget. Measurements are cached under ``.conductor/routers/`` keyed by the pool
(name, options, worker facts), the code that produces outcomes
(:func:`rl_conductor.fingerprint.code_version`) and the task ids.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import NDArray

from rl_conductor.errors import InvalidArgument
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import GivenPlan, Plan, Policy
from rl_conductor.policies.baselines import SOLVE
from rl_conductor.progress import progress as progress_display
from rl_conductor.reward import RewardConfig, grade_trace, reward_config, reward_from_options, reward_of
from rl_conductor.tasks.base import Task
from rl_conductor.trace import ANSWERED, Trace
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow, render

__all__ = [
    "FIT_LIMIT",
    "DomainRouter",
    "MeasuredOutcomes",
    "SingleOutcomes",
    "choose_worker",
    "fit_limit",
    "measure_singles",
    "reward_matrix",
    "single_outcomes",
]

log = logging.getLogger(__name__)

#: A moderate number of training questions to measure, for policies that sample by default. The
#: kNN and domain routers fit on every training question (what the Conductor trained on) unless
#: given ``:N`` or ``fit_limit``; the kNN router embeds them too (~20-40 questions/s, cached).
FIT_LIMIT = 500


class MeasuredOutcomes:
    """Saving and loading measured outcomes: the ``correct`` and ``cost`` arrays go to
    ``<path>.npz``, the fields named by ``META`` to ``<path>.json``."""

    META: ClassVar[tuple[str, ...]]
    correct: NDArray[np.bool_]
    cost: NDArray[np.float64]

    def save(self, path: Path) -> None:
        # atomic writes, arrays first (readers need both files): parallel test workers and
        # pipeline steps may measure the same key at once and must never read a torn file
        from rl_conductor.storage import write_bytes

        buf = io.BytesIO()
        np.savez(buf, correct=self.correct, cost=self.cost)
        write_bytes(str(path.with_suffix(".npz")), buf.getvalue())
        meta = {name: getattr(self, name) for name in self.META}
        write_bytes(str(path.with_suffix(".json")), json.dumps(meta).encode())

    @classmethod
    def load(cls, path: Path) -> Self:
        arrays = np.load(path.with_suffix(".npz"))
        meta = json.loads(path.with_suffix(".json").read_text())
        # a field added later (``replaced``) is absent from older files: its default
        fields: dict[str, Any] = {name: meta[name] for name in cls.META if name in meta}
        fields |= {"correct": arrays["correct"].astype(bool), "cost": arrays["cost"].astype(np.float64)}
        return cls(**fields)


@dataclass
class SingleOutcomes(MeasuredOutcomes):
    """Every worker alone on every task: ``correct[i, j]`` and ``cost[i, j]`` (USD)."""

    names: list[str]
    task_ids: list[str]
    domains: list[str]
    correct: NDArray[np.bool_]
    cost: NDArray[np.float64]
    #: per worker another worker answered in its place on some tasks: [how many, the first reason]
    replaced: dict[str, list[Any]] = field(default_factory=dict)

    META = ("names", "task_ids", "domains", "replaced")


#: A worker answered through a replacement on at least this share of the measured tasks is named
#: in a warning (:func:`warn_replaced`)
REPLACED_WARN_SHARE = 0.05
#: the warnings :func:`warn_replaced` gave in this process
_WARNED: set[tuple[str, str, int, int]] = set()


def replacement_reason(trace: Trace) -> str:
    """Why a step's named worker did not answer it itself: its first failed attempt's error."""
    return next((a.error or a.status for a in trace.attempts if a.status != "ok"), "no answer of its own")


def tally_replaced(tally: dict[str, list[Any]], name: str, trace: Trace) -> None:
    """Count ``trace`` in ``tally`` (worker -> [count, first reason]) when another worker answered
    for ``name`` (:func:`own_answer`)."""
    if not own_answer(trace):
        entry = tally.setdefault(name, [0, replacement_reason(trace)])
        entry[0] += 1


def warn_replaced(what: str, tally: Mapping[str, Sequence[Any]], n: int) -> None:
    """Name each worker another answered for on at least :data:`REPLACED_WARN_SHARE` of ``n``
    measured tasks, with the first reason. Why: a fit credits such a worker with nothing there
    (:func:`own_answer`), so a worker whose every call fails (a price per 1K tokens where the
    pool means per 1M: every recorded cost is above the call's worst case) silently dropped out
    of the routers and the Conductor's targets (an outside tester's report, issue 21)."""
    for name, (count, why) in sorted(tally.items()):
        if n and count >= REPLACED_WARN_SHARE * n and (what, name, count, n) not in _WARNED:
            _WARNED.add((what, name, count, n))  # once per process (each router measures)
            log.warning(
                "%s: worker %r did not answer %d of %d calls itself (another worker answered in its "
                "place, or none did; no fit credits it there); the first reason: %s",
                what,
                name,
                count,
                n,
                why,
            )


def own_answer(trace: Trace) -> bool:
    """Whether the workers a plan named answered it themselves: what a fit may credit them with.

    A worker that did not answer (no recording of the item, or every call failed) is replaced by
    another of its class, and the plan's answer is then that worker's. A fit that graded it as
    the named worker's (the routers' single outcomes, the warm start's candidate and rounds
    tables) would credit a model with another's accuracy at its own price: a model recorded only
    on test looked as good as its stand-in, and both routers sent it most test questions.
    Evaluation still grades what came back (and warns about the replacement share)."""
    return trace.worker_fallbacks == 0


def own_final_answer(trace: Trace) -> bool:
    """Whether the trace's final answer is the named workers' own: the last answered step (whose
    answer is the final one, ``executor._answer_so_far``) and every step it saw, directly or
    through others, were answered by the workers the plan named. A replaced step the final
    answer never read (the other half of a pair that answers in parallel) does not count.

    Why: a two-round table (``training/adaptive.py``) valued a pair of which one worker has no
    recording of an item as wrong there (:func:`own_answer`), though the answer kept is the other
    worker's own: on an outside tester's file, where deepseek-v3 lacks 70 items, that put the
    pair ``deepseek-v3 | gpt-4o`` 0.008 below the cascade of the same workers on science and out
    of the targets. What :func:`own_answer` guards against, crediting a worker with another's
    answer, still holds: a replaced step whose answer is final, or read by the final step, is
    not credited."""
    steps = trace.steps
    answered = [k for k, s in enumerate(steps) if s.status in ANSWERED and s.answer]
    if not answered:
        return own_answer(trace)
    read, todo = {answered[-1]}, [answered[-1]]
    while todo:
        for v in steps[todo.pop()].visible:
            if 0 <= v < len(steps) and v not in read:
                read.add(v)
                todo.append(v)
    return not any(steps[k].replaced for k in read)


async def measure_singles(
    pool: Pool, tasks: Sequence[Task], limits: RequestLimits | None = None, *, progress: bool = True
) -> SingleOutcomes:
    """Run every worker of ``pool`` alone on every task (64 tasks at a time) and grade it. Each
    run is an episode of the one episode runner (:class:`~rl_conductor.policies.base.GivenPlan`:
    the single-worker plan, executed and annotated), as evaluation runs it."""
    limits = limits or RequestLimits()
    view = pool.view()
    given = GivenPlan()
    w = len(view)
    correct = np.zeros((len(tasks), w), dtype=bool)
    cost = np.zeros((len(tasks), w), dtype=np.float64)
    names = view.names()
    replaced: dict[str, list[Any]] = {}
    # minutes on a large pool: a log must show that work goes on
    with progress_display(enabled=progress) as bar:
        pid = bar.add_task(f"measure {w} workers alone", total=len(tasks))
        for start in range(0, len(tasks), 64):
            chunk = tasks[start : start + 64]
            runs = [
                given.run_workflow(Workflow(steps=(Step(j, SOLVE, ()),)), t, view, limits)
                for t in chunk
                for j in range(w)
            ]
            traces = await asyncio.gather(*runs)
            for i, t in enumerate(chunk):
                for j in range(w):
                    tr = traces[i * w + j]
                    correct[start + i, j] = grade_trace(t, tr) and own_answer(tr)
                    cost[start + i, j] = tr.cost_usd
                    tally_replaced(replaced, names[j], tr)
            bar.advance(pid, len(chunk))
    return SingleOutcomes(
        names=names,
        task_ids=[t.id for t in tasks],
        domains=[t.domain for t in tasks],
        correct=correct,
        cost=cost,
        replaced=replaced,
    )


#: Task lists shorter than this are measured in process (forking costs more than it saves).
FORK_MIN_TASKS = 256
#: Worker kinds answered in memory, which forked children may call (:func:`_forked`).
FORKABLE_KINDS = frozenset({"simulated", "replay"})


def _run_sync(pool: Pool, tasks: Sequence[Task]) -> SingleOutcomes:
    """``measure_singles`` from synchronous code, also when an event loop is running here; a
    long task list on a pool of in-memory workers in forked processes (:func:`_forked`)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _measure(pool, tasks)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(_measure, pool, tasks).result()


def _measure(pool: Pool, tasks: Sequence[Task]) -> SingleOutcomes:
    from rl_conductor.tasks.forked import fork_workers

    offline = all(w.info.kind in FORKABLE_KINDS for w in pool.workers)
    workers = min(fork_workers(), len(tasks) // 64 or 1)
    if offline and workers > 1 and len(tasks) >= FORK_MIN_TASKS:
        return _forked(pool, tasks, workers)
    return asyncio.run(measure_singles(pool, tasks))


def _forked(pool: Pool, tasks: Sequence[Task], workers: int) -> SingleOutcomes:
    """:func:`measure_singles` on contiguous chunks of ``tasks`` in ``workers`` forked processes
    (``tasks.forked``), the same arrays as in one process: a worker alone on a task answers the
    same whichever process asks (simulated and replayed answers are functions of the task, the
    worker and the call, and a simulated answer is graded by its value); 1,671 paper-sim
    questions in about half the time on two cores. Only pools of in-memory workers: a live
    worker's client would be shared with the children."""
    from rl_conductor.tasks.forked import chunk_bounds, fork_map

    def chunk(lo: int, hi: int) -> tuple[NDArray[np.bool_], NDArray[np.float64], dict[str, list[Any]]]:
        part = asyncio.run(measure_singles(pool, tasks[lo:hi], progress=False))
        return part.correct, part.cost, part.replaced

    bounds = chunk_bounds(len(tasks), workers * 4)
    correct, cost = [], []
    replaced: dict[str, list[Any]] = {}
    with progress_display() as bar:
        pid = bar.add_task(f"measure {len(pool.workers)} workers alone", total=len(tasks))
        for (lo, hi), (c, k, r) in zip(bounds, fork_map(chunk, bounds, workers), strict=True):
            correct.append(c)
            cost.append(k)
            for name, (count, why) in r.items():
                replaced.setdefault(name, [0, why])[0] += count
            bar.advance(pid, hi - lo)
    view = pool.view()
    return SingleOutcomes(
        names=view.names(),
        task_ids=[t.id for t in tasks],
        domains=[t.domain for t in tasks],
        correct=np.concatenate(correct),
        cost=np.concatenate(cost),
        replaced=replaced,
    )


def pool_key(pool: Pool) -> str:
    """What a measurement on ``pool`` depends on: its name, the code, and its options, worker facts
    and recordings (:func:`rl_conductor.fingerprint.loaded_pool_parts`)."""
    from rl_conductor.fingerprint import code_version, fingerprint, loaded_pool_parts

    return fingerprint([pool.name, code_version(), *loaded_pool_parts(pool)])


def single_outcomes(pool: Pool, tasks: Sequence[Task], *, cache: bool = True) -> SingleOutcomes:
    """:func:`measure_singles`, cached under ``.conductor/routers/`` (see module docstring)."""
    from rl_conductor.fingerprint import fingerprint
    from rl_conductor.tracking.mlflow_utils import conductor_home

    path = (
        conductor_home()
        / ".conductor"
        / "routers"
        / f"singles-{pool.name}-{pool_key(pool)}-{fingerprint(t.id for t in tasks)}"
    )
    if cache and path.with_suffix(".json").exists() and path.with_suffix(".npz").exists():
        out = SingleOutcomes.load(path)
    else:
        out = _run_sync(pool, tasks)
        if cache:
            out.save(path)
    warn_replaced(f"measuring the {len(out.names)} workers alone", out.replaced, len(tasks))
    return out


def reward_matrix(outcomes: SingleOutcomes, config: RewardConfig) -> NDArray[np.float64]:
    """Per task and worker, the evaluation's reward of that worker alone (parsed, no budget stop)."""
    return np.asarray(reward_of(config, correct=outcomes.correct, cost=outcomes.cost), dtype=np.float64)


def choose_worker(
    expected: Mapping[str, float],
    mean_cost: Mapping[str, float],
    view: PoolView,
    limits: RequestLimits,
    prior: Sequence[str] = (),
) -> int:
    """The view ordinal of the worker to send the question to.

    Among the workers of ``view`` the request permits (every worker when it permits none: the
    executor then records the refusal), keep those with an estimate and, under a budget, those
    whose ``mean_cost`` fits it (if none fits: the cheapest). Pick the highest ``expected``
    reward; ties go to the cheaper, then to the earlier in the view. Without any estimate, the
    first permitted worker of ``prior``, else the first permitted one.
    """
    infos = view.infos()
    permitted = [j for j, info in enumerate(infos) if limits.permits(info.name, info.hosting)]
    permitted = permitted or list(range(len(infos)))
    known = [j for j in permitted if infos[j].name in expected]
    if not known:
        for name in prior:
            for j in permitted:
                if infos[j].name == name:
                    return j
        return permitted[0]
    if limits.max_cost_usd is not None:
        fits = [j for j in known if mean_cost.get(infos[j].name, 0.0) <= limits.max_cost_usd]
        if not fits:
            return min(known, key=lambda j: (mean_cost.get(infos[j].name, 0.0), j))
        known = fits
    return min(known, key=lambda j: (-expected[infos[j].name], mean_cost.get(infos[j].name, 0.0), j))


def fit_limit(arg: str, kw: Mapping[str, Any], kind: str) -> int | None:
    """How many training questions a router is fitted on: the spec's ``:N``, else
    ``kw["fit_limit"]``, else None (every training question)."""
    if arg and not arg.isdigit():
        raise ValueError(f"{kind} takes a number of training tasks, got {arg!r}")
    if arg:
        return int(arg)
    given = kw.get("fit_limit")
    return None if given is None else int(given)


def training_tasks(pool: Pool, kw: Mapping[str, Any], limit: int | None) -> list[Task]:
    """The training tasks of the dataset named in ``kw`` (or the pool's): all of them, or a
    seeded sample of ``limit``."""
    from rl_conductor.tasks.datasets import load_tasks, split_counts

    dataset = str(kw.get("dataset") or pool.default_dataset())
    tasks = load_tasks(dataset, split="train", limit=limit, seed=int(kw.get("seed", 0)))
    if not tasks:  # fitted on nothing, a router sends every question to the pool's first worker
        raise InvalidArgument(
            f"a router is fitted on the training split, and dataset {dataset!r} has none "
            f"({split_counts(dataset)}); give some items `split: train` (or no `split`: the id's "
            "hash picks one)"
        )
    return tasks


class DomainRouter(Policy):
    """See module docstring: the best worker by mean reward in the question's domain."""

    name = "domain-router"

    def __init__(
        self,
        table: Mapping[str, Mapping[str, float]],
        costs: Mapping[str, Mapping[str, float]],
        prior: Sequence[str] = (),
    ) -> None:
        self.table = {d: dict(v) for d, v in table.items()}  # domain -> worker -> mean reward
        self.costs = {d: dict(v) for d, v in costs.items()}  # domain -> worker -> mean cost
        self.prior = list(prior)  # workers by overall mean reward, best first

    @classmethod
    def from_outcomes(cls, outcomes: SingleOutcomes, config: RewardConfig | None = None) -> DomainRouter:
        rewards = reward_matrix(outcomes, config or reward_config())
        domains = np.asarray(outcomes.domains)
        table: dict[str, dict[str, float]] = {}
        costs: dict[str, dict[str, float]] = {}
        for d in sorted(set(outcomes.domains)):
            rows = domains == d
            table[d] = {n: float(rewards[rows, j].mean()) for j, n in enumerate(outcomes.names)}
            costs[d] = {n: float(outcomes.cost[rows, j].mean()) for j, n in enumerate(outcomes.names)}
        overall = rewards.mean(axis=0) if len(rewards) else np.zeros(len(outcomes.names))
        prior = [outcomes.names[j] for j in np.argsort(-overall, kind="stable")]
        return cls(table, costs, prior)

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **kw: Any) -> DomainRouter:
        """``domain-router`` (fit on every training task, or ``kw["fit_limit"]`` of them) or
        ``domain-router:N``, at ``kw``'s reward (:func:`rl_conductor.reward.reward_from_options`)."""
        limit = fit_limit(arg, kw, "domain-router")
        return cls.from_outcomes(
            single_outcomes(pool, training_tasks(pool, kw, limit)), reward_from_options(kw)
        )

    def choose(self, domain: str, view: PoolView, limits: RequestLimits) -> int:
        expected = self.table.get(domain, {})
        return choose_worker(expected, self.costs.get(domain, {}), view, limits, self.prior)

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        wf = Workflow(steps=(Step(self.choose(task.domain, view, limits), SOLVE, ()),))
        return Plan(workflow=wf, text=render(wf))
