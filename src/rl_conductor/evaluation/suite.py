"""Evaluate policy specs on one task set: the library entry behind ``conductor eval``/``compare``,
the KFP evaluation step and the benchmarks. A sweep (:func:`run_sweep`) runs them under several
budgets and deadlines, building each policy once; ``run_eval`` is a sweep of one point, and
:func:`sweep` is the loop both run (the retrain loop's comparison calls it with its own tasks).

Why here and not in the CLI: the pipeline and the benchmarks evaluate exactly as the CLI does, and
the CLI sits above the pipeline; so the evaluation entry lives in the evaluation layer and both
call it. Every policy of one evaluation is scored with one reward (:func:`eval_reward`: the
caller's options, else the reward the first ``conductor:DIR`` was trained with, as its
``conductor.json`` records it), and ``knn`` / ``domain-router`` are fitted at that reward.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rl_conductor import validation
from rl_conductor.errors import InvalidArgument
from rl_conductor.evaluation.paired import FRONTIER_WEIGHTS, question_columns
from rl_conductor.evaluation.runner import EvalResult, evaluate
from rl_conductor.limits import SENSITIVITIES, RequestLimits, Sensitivity
from rl_conductor.policies.catalog import make_policy
from rl_conductor.policies.conductor import model_source, read_conductor_meta
from rl_conductor.reward import RewardConfig, reward_config, trained_reward
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.pool import Pool, load_pool

__all__ = [
    "GridPoint",
    "baseline_specs",
    "dataset_for",
    "eval_limits",
    "eval_reward",
    "run_eval",
    "run_frontier",
    "run_sweep",
    "sweep",
    "trained_defaults",
    "trained_meta",
    "trained_reward",
    "trained_rounds",
]


def eval_limits(
    max_cost_usd: float | None,
    sensitivity: str,
    allowed: str | None,
    max_latency_s: float | None = None,
    max_rounds: int = 1,
    max_calls: int | None = None,
) -> RequestLimits:
    """The :class:`RequestLimits` of every question of an evaluation (``allowed``: comma-separated names)."""
    validation.one_of("sensitivity", sensitivity, SENSITIVITIES)
    if max_cost_usd is not None:
        validation.positive_finite("max_cost_usd", max_cost_usd)
    sens: Sensitivity = "private" if sensitivity == "private" else "public"
    return RequestLimits(
        max_cost_usd=max_cost_usd,
        max_latency_s=max_latency_s,
        sensitivity=sens,
        allowed_workers=frozenset(a for a in allowed.split(",") if a) if allowed else None,
        max_rounds=max_rounds,
        max_calls=max_calls,
    )


def dataset_for(pool: Pool, dataset: str | None) -> str:
    """``dataset``, else the pool's ``default_dataset`` option, else ``paper-mix``."""
    return dataset or pool.default_dataset()


def trained_meta(policies: list[str]) -> dict[str, Any]:
    """The ``conductor.json`` of the first ``conductor:DIR`` or ``evidence-rule:DIR`` policy (empty
    when none, or when the folder has none): what it was trained on and with which reward."""
    for spec in policies:
        kind, _, arg = spec.partition(":")
        if kind not in ("conductor", "evidence-rule") or not arg:
            continue
        src = model_source(arg)
        return read_conductor_meta(src) if isinstance(src, Path) else {}
    return {}


def own_rounds(spec: str) -> int:
    """The rounds policy ``spec`` was trained for: a ``conductor:DIR``'s ``max_rounds``, else 1."""
    return trained_rounds([spec])


def trained_rounds(policies: list[str]) -> int:
    """The rounds the first ``conductor:DIR`` policy was trained for (its ``conductor.json``'s
    ``max_rounds``), else 1."""
    return int(trained_meta(policies).get("max_rounds") or 1)


def eval_reward(policies: list[str], reward_preset: str | None, cost_weight: float | None) -> RewardConfig:
    """The reward every policy of an evaluation is scored (and every router fitted) with: the
    options where given, on top of the Conductor's own reward (the first ``conductor:DIR``'s
    ``conductor.json``), else the cost-aware preset."""
    if reward_preset is not None:
        return reward_config(reward_preset, cost_weight=cost_weight)
    own = trained_reward(trained_meta(policies))
    return reward_config(own, cost_weight=cost_weight)


def trained_defaults(policies: list[str], pool: str | None, dataset: str | None) -> tuple[str, str | None]:
    """``pool`` / ``dataset`` when not given: the Conductor's training pool and dataset (its
    ``conductor.json``), else ``paper-sim`` and the pool's default dataset."""
    meta = trained_meta(policies) if pool is None or dataset is None else {}
    if pool is None:
        pool = str(meta.get("pool") or "paper-sim")
        trained_on = str(meta.get("dataset") or "")
        # a pipeline's prepared-<id> dataset exists only inside that pipeline's steps
        if dataset is None and meta.get("pool") and trained_on and not trained_on.startswith("prepared-"):
            dataset = trained_on
    return pool, dataset


def baseline_specs(pool: str) -> list[str]:
    """Every single worker, the domain and kNN routers (fitted on the training split), random,
    MoA, self-consistency of the strongest-priced worker, oracle.

    On a pool replayed from recordings (every worker ``kind: replay``) the fixed cascade fitted
    on the training split (``cascade:all``) takes the place of MoA and self-consistency: a
    recorded worker answers the same text whatever it is shown and however often it is asked,
    so those two only multiply a recorded answer's cost, while the cascade is the baseline that
    beat the Conductor on such files (an outside tester's, issue 21); with it, the cascade fitted
    per domain (``cascade:domain``), which beat the domain-router where each domain has an owner
    (another outside tester's file); and the kNN router with its neighbourhood chosen on the
    training split (``knn:k=auto``), stronger than the default where one domain's questions
    outnumber the rest (two outside testers' files)."""
    p = load_pool(pool)
    names = p.names()
    top = max(p.workers, key=lambda w: w.info.price_out).info.name
    replayed = all(w.info.kind == "replay" for w in p.workers)
    return [
        *(f"single:{n}" for n in names),
        "domain-router",
        "knn",
        *(["knn:k=auto"] if replayed else []),
        "random",
        *(["cascade:all", "cascade:domain"] if replayed else ["moa", f"self-consistency:{top}"]),
        "oracle",
    ]


@dataclass(frozen=True)
class GridPoint:
    """One set of request limits of a sweep: a budget, a deadline, the labels its summaries get
    (e.g. ``{"budget": "0.002"}``) and the policy specs that run under it (None: every one)."""

    max_cost_usd: float | None = None
    max_latency_s: float | None = None
    label: Mapping[str, str] = field(default_factory=dict)
    only: tuple[str, ...] | None = None


def run_sweep(
    policies: list[str],
    points: Sequence[GridPoint],
    *,
    pool: str,
    dataset: str | None,
    split: str,
    limit: int | None,
    seed: int,
    sensitivity: str = "public",
    allowed: str | None = None,
    concurrency: int = 32,
    progress: bool = True,
    reward_preset: str | None = None,
    cost_weight: float | None = None,
    fit_limit: int | None = None,
    max_rounds: int | None = 1,
    max_calls: int | None = None,
) -> list[dict[str, Any]]:
    """Evaluate policies on one task set under each of ``points``; their summaries, point by point
    in the order of ``policies``, each tagged with its point's ``label``. ``max_rounds`` None:
    each policy the rounds it was trained for (:func:`own_rounds`), so a two-round Conductor
    evaluated beside a one-round one keeps its review.

    The pool, the tasks and every policy are built once for the whole sweep (a Conductor's weights
    are read once, the routers fitted once), and every spec and every point's limits are checked
    before anything runs, so a bad one fails before minutes of evaluation. Every policy is scored
    with one reward (:func:`eval_reward`: the options, else the Conductor's own), and ``knn`` /
    ``domain-router`` are fitted at that reward on every training question (``fit_limit``: a
    seeded sample of that many)."""
    grid = [
        (pt, eval_limits(pt.max_cost_usd, sensitivity, allowed, pt.max_latency_s, max_rounds or 1, max_calls))
        for pt in points
    ]
    rounds = {spec: own_rounds(spec) for spec in policies} if max_rounds is None else None
    p = load_pool(pool, seed=seed)
    for name in sorted(a for a in (allowed or "").split(",") if a):
        p.index(name)  # an unknown name would silently allow nobody: UnknownWorker lists the pool's
    if not any(grid[0][1].permits(w.info.name, w.info.hosting) for w in p.workers):
        # every step would be skipped as forbidden: a 0 % with no call made, exit 0 (a server
        # answers such a request 4xx, serving.request.permitted_view)
        hosting = {w.info.name: w.info.hosting for w in p.workers}
        raise InvalidArgument(
            f"no worker of pool {p.name!r} is permitted by --sensitivity {sensitivity} and "
            f"--allowed-workers {allowed or '(all)'}; its workers' hosting: {hosting}"
        )
    ds = dataset_for(p, dataset)
    tasks = load_tasks(ds, split=split, limit=limit, seed=seed)
    if not tasks:  # a table of dashes with exit 0 would read as "evaluated"
        raise no_questions(ds, split)
    rc = eval_reward(policies, reward_preset, cost_weight)
    out: list[dict[str, Any]] = []
    keys: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    for pt, spec, res in sweep(
        policies, grid, p, tasks, fit_on=ds, reward_config=rc, seed=seed, fit_limit=fit_limit,
        concurrency=concurrency, progress=progress, rounds=rounds,
    ):  # fmt: skip
        summary = res.summary()
        summary.update(dataset=ds, split=split, **pt.label, questions=question_columns(res.records))
        out.append(summary)
        keys.append((spec, tuple(sorted(pt.label.items()))))
    # two policies of one name (conductor:final of two runs) would be two rows no one can tell
    # apart in the table, the JSON and the plot: those are named by their spec instead
    seen = Counter((s["policy"], point) for s, (_, point) in zip(out, keys, strict=True))
    for summary, (spec, point) in zip(out, keys, strict=True):
        if seen[(summary["policy"], point)] > 1:
            summary["policy"] = spec
    return out


def run_frontier(
    families: Sequence[str],
    weights: Sequence[float] = FRONTIER_WEIGHTS,
    point: GridPoint | None = None,
    **options: Any,
) -> dict[str, list[dict[str, Any]]]:
    """Each router family (``knn``, ``domain-router``, ``cascade:all``…) fitted at each cost
    weight and run on the questions :func:`run_sweep` with the same ``options`` runs (pool,
    dataset, split, limit, seed: the same ids, in the same order); per family, one summary per
    weight, tagged ``frontier_weight``, under ``point``'s budget and deadline (none by default):
    the limits the policy compared with them ran under. Only their measured accuracy and cost
    matter: the points of the family's cost-accuracy frontier
    (``evaluation.paired.equal_cost_difference``)."""
    from rl_conductor.progress import progress as progress_display

    at = GridPoint() if point is None else GridPoint(point.max_cost_usd, point.max_latency_s)
    out: dict[str, list[dict[str, Any]]] = {}
    for w in weights:
        validation.non_negative_finite("frontier weight", w)
    # one line per fit: minutes on a large file, where a log showed nothing after "tracing" (H39)
    with progress_display(bool(options.get("progress", True))) as bar:
        pid = bar.add_task("frontier fits", total=len(families) * len(weights))
        for family in families:
            runs = []
            for w in weights:
                (summary,) = run_sweep([family], [at], **{**options, "cost_weight": w, "progress": False})
                summary["frontier_weight"] = w
                runs.append(summary)
                bar.advance(pid, 1)
            out[family] = runs
    return out


def sweep(
    policies: Sequence[str],
    grid: Sequence[tuple[GridPoint, RequestLimits]],
    pool: Pool,
    tasks: Sequence[Task],
    *,
    fit_on: str,
    reward_config: RewardConfig,
    seed: int = 0,
    fit_limit: int | None = None,
    concurrency: int = 32,
    progress: bool = True,
    rounds: Mapping[str, int] | None = None,
) -> list[tuple[GridPoint, str, EvalResult]]:
    """The one sweep: each policy of ``policies`` built once (``knn`` / ``domain-router`` /
    ``cascade`` fitted at ``reward_config`` on the training split of dataset ``fit_on``), then run
    on ``tasks`` under each grid point's limits (a point's ``only``: the specs it runs), scored
    with ``reward_config``; (point, spec, result) in grid order, then ``policies``' order.
    ``rounds``: spec -> the rounds that policy may use, in place of the point's.
    :func:`run_sweep` (``conductor eval`` / ``compare``, the pipeline's evaluation) and the retrain
    loop's champion comparison (``loop.retrain.evaluate_with_floor``) both call it."""
    view = pool.view()
    built = {
        spec: make_policy(
            spec, pool, seed=seed, dataset=fit_on, reward_config=reward_config, fit_limit=fit_limit
        )
        for spec in dict.fromkeys(policies)
    }
    out = []
    for pt, lim in grid:
        for spec in policies:
            if pt.only is not None and spec not in pt.only:
                continue
            own = lim if rounds is None else replace(lim, max_rounds=rounds[spec])
            res = evaluate(
                built[spec], view, list(tasks), own, concurrency=concurrency, progress=progress,
                reward_config=reward_config,
            )  # fmt: skip
            out.append((pt, spec, res))
    return out


def no_questions(dataset: str, split: str) -> InvalidArgument:
    """The error of an evaluation whose split has no question, with every split's count."""
    from rl_conductor.tasks.datasets import split_counts

    return InvalidArgument(
        f"split {split!r} of dataset {dataset!r} has no questions ({split_counts(dataset)}); "
        "choose another --split"
    )


def run_eval(
    policies: list[str],
    *,
    max_cost_usd: float | None = None,
    max_latency_s: float | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Evaluate policies on one task set under one budget and deadline: :func:`run_sweep` with
    one point (``options``: its keyword arguments, ``pool``, ``dataset``, ``split``, ``limit`` and
    ``seed`` among them); returns their summaries."""
    return run_sweep(policies, [GridPoint(max_cost_usd, max_latency_s)], **options)
