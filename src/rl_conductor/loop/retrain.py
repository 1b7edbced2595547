"""The retraining loop's steps as plain functions: what ``pipelines/retrain.py``'s components call.

Why plain functions: as with the training pipeline (:mod:`rl_conductor.pipeline.steps`), the
KFP components are thin adapters, so the loop runs and is tested without Kubeflow, and the
cluster and the local runner execute the same code. Nothing here trains, evaluates or gates by
itself: it calls the existing steps.

1. :func:`collect_step` — read a window of the traffic log and its feedback
   (:mod:`rl_conductor.loop.data`), write the training tasks, the held-out recent traffic and the
   standing test split, fetch the champion, and say what changed in the pool since it was
   trained (:mod:`rl_conductor.loop.pool_change`); logs the window to MLflow (experiment
   ``<model name>-loop``).
2. :func:`retrain_step` — :func:`rl_conductor.pipeline.steps.train_step`, warm-started from the
   champion's weights (``model`` = the champion's folder): the warm-start table executes the
   candidate workflows on the traffic's tasks through the pool, so a live pool with a response
   cache (pool option ``cache``) replays every recorded answer without a new call, and the calls
   that are missing are paid up to ``spend_cap_usd`` (the pool's ``max_usd`` spend guard; a call
   it refuses fails, and its workflow earns nothing in the table).
3. :func:`gate_step` — evaluate the challenger and the champion on the same questions (the
   held-out recent traffic plus the standing test split) *under the current pool* (its prices),
   with the training pipeline's baseline floor (every single worker, the ``domain-router`` and
   the ``knn`` router, fitted at the challenger's reward on the retrain's training tasks under the
   same pool: :data:`rl_conductor.tracking.gate.GATE_BASELINES`); apply
   :func:`rl_conductor.tracking.gate.decide` by mean reward (``versus_champion="reward"``), and
   in addition require the paired per-question reward gain's confidence interval to lie above
   ``min_reward_gain`` (no churn on noise); register
   the challenger (``challenger`` alias, the window's and the champion's numbers on its run) and
   move ``champion`` if it passed.

What the served workflows earned reaches the trainer two ways: a question that is a task (a
dataset item, or gold feedback) is re-executed through the candidate table (which is where a
re-priced pool shows); a request with only a score is an observed example, its executed workflow
taught when it earned at least the table's expectation (:mod:`rl_conductor.training.observed`).
The interval is the normal approximation of the paired mean.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_conductor.pipeline import steps
from rl_conductor.tasks.base import Task

LOOP_EXPERIMENT_SUFFIX = "-loop"
Z95 = 1.959964


# --------------------------------------------------------------------------- collect


@dataclass(frozen=True)
class CollectOutcome:
    """What :func:`collect_step` found."""

    should_train: bool
    reason: str
    champion_version: int
    pool_changes: list[str]
    summary: dict[str, float]
    worker_share: dict[str, float]
    n_train: int
    n_holdout: int
    n_test: int
    mlflow_run_id: str = ""
    #: requests with a score and no gold answer written to ``outputs["observed"]``
    n_observed: int = 0


def download_champion(model_name: str, dst: str) -> tuple[int, str]:
    """The ``champion`` version of ``model_name`` copied to ``dst`` (replaced if it exists):
    (version, ``dst``); a one-line UserError when the model has no champion."""
    from rl_conductor.errors import UserError
    from rl_conductor.tracking import registry

    version = registry.get_alias_version(model_name, registry.CHAMPION)
    if version is None:
        raise UserError(f"{model_name} has no champion: train one first (conductor pipeline run --local)")
    out = Path(dst)
    if out.exists():
        shutil.rmtree(out)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="conductor-champion-") as tmp:
        shutil.copytree(registry.load_model_dir(f"models:/{model_name}/{version}", tmp), out)
    return version, str(out)


def collect_step(
    *,
    traffic_store: str,
    outputs: Mapping[str, str],
    pool: str = "paper-sim",
    model_name: str = steps.DEFAULT_MODEL_NAME,
    window_hours: float = 0.0,
    until: float | None = None,
    holdout_fraction: float = 0.3,
    eval_limit: int = 200,
    base_train_limit: int = 0,
    min_train_tasks: int = 8,
    only_on_pool_change: bool = False,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    run_tag: str = "local",
) -> CollectOutcome:
    """Write ``outputs["train"|"holdout"|"test"]`` (task files), ``outputs["champion"]`` (the
    champion's folder) and, when given, ``outputs["observed"]`` (the window's requests with a
    score and no gold answer, :mod:`rl_conductor.training.observed`; their mean reward at the
    champion's reward config is ``traffic/observed_reward``); see the module docstring.
    ``window_hours`` 0 reads the whole log; ``base_train_limit`` adds that many standing training
    tasks to the traffic's (a seeded sample). Training is skipped (``should_train`` false, with
    the reason) with fewer than ``min_train_tasks`` tasks, or when ``only_on_pool_change`` and the
    pool did not change."""
    import mlflow

    from rl_conductor import validation
    from rl_conductor.loop import data as loop_data
    from rl_conductor.loop import pool_change
    from rl_conductor.policies.conductor import read_conductor_meta
    from rl_conductor.reward import trained_reward
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.tracking import mlflow_utils
    from rl_conductor.training.observed import write_observed

    validation.non_negative_finite("window_hours", window_hours)
    missing = [k for k in ("train", "holdout", "test", "champion") if k not in outputs]
    if missing:
        raise ValueError(f"outputs lacks {missing}")
    dataset = steps.dataset_of_pool(pool)
    tests = load_tasks(dataset, "test", limit=eval_limit or None, seed=seed)
    end = until if until is not None else time.time() + 1.0
    since = end - window_hours * 3600 if window_hours else None
    traffic = loop_data.collect(
        traffic_store,
        dataset=dataset,
        since=since,
        until=end,
        holdout_fraction=holdout_fraction,
        exclude_ids=[t.id for t in tests],
    )
    train = list(traffic.train)
    if base_train_limit:
        have = {t.id for t in train}
        train += [
            t for t in load_tasks(dataset, "train", limit=base_train_limit, seed=seed) if t.id not in have
        ]
    with steps.mlflow_tracking(mlflow_tracking_uri, ""):
        version, champion_dir = download_champion(model_name, outputs["champion"])
        before = pool_change.champion_snapshot(model_name, version, champion_dir)
        now_snapshot = pool_change.snapshot(pool)
        changed = pool_change.changes(before, now_snapshot) if before is not None else []
        if len(train) < min_train_tasks:
            should, reason = False, f"{len(train)} training tasks in the window (< {min_train_tasks})"
        elif only_on_pool_change and not changed:
            should, reason = False, "the pool did not change since the champion was trained"
        else:
            should = True
            reason = "; ".join(changed) if changed else "scheduled retrain (the pool did not change)"
        steps.write_tasks(outputs["train"], train)
        steps.write_tasks(outputs["holdout"], traffic.holdout)
        steps.write_tasks(outputs["test"], tests)
        summary = traffic.summary()
        if "observed" in outputs:
            write_observed(outputs["observed"], traffic.observed)
        if traffic.observed:
            rc = trained_reward(read_conductor_meta(champion_dir))
            summary["observed_reward"] = statistics.fmean(o.reward(rc) for o in traffic.observed)
        with mlflow_utils.start_run(
            model_name + LOOP_EXPERIMENT_SUFFIX,
            f"collect-{run_tag}",
            {
                "traffic_store": traffic_store,
                "pool": pool,
                "window_hours": window_hours,
                "holdout_fraction": holdout_fraction,
                "champion_version": version,
            },
            tags={
                "loop.step": "collect",
                "loop.should_train": str(should).lower(),
                "loop.reason": reason[:4000],
            },
        ) as run:
            mlflow_utils.log_metrics({f"traffic/{k}": v for k, v in summary.items()})
            mlflow_utils.log_metrics({f"traffic/share/{k}": v for k, v in traffic.worker_share().items()})
            mlflow.log_dict(
                {"pool_changes": changed, "summary": summary, "worker_share": traffic.worker_share()},
                "traffic/window.json",
            )
            run_id = run.info.run_id
    return CollectOutcome(
        should_train=should,
        reason=reason,
        champion_version=version,
        pool_changes=changed,
        summary=summary,
        worker_share=traffic.worker_share(),
        n_train=len(train),
        n_holdout=len(traffic.holdout),
        n_test=len(tests),
        mlflow_run_id=run_id,
        n_observed=len(traffic.observed),
    )


# --------------------------------------------------------------------------- retrain


def spend_capped_pool(pool: str, cap_usd: float, folder: str | Path) -> str:
    """A copy of the pool file with its run-wide spend guard at ``cap_usd`` (``max_usd``; the lower
    of the two when the pool has one), written to ``folder``; the pool itself when it has no live
    worker (nothing to pay) or ``cap_usd`` is 0."""
    import yaml

    from rl_conductor.workers.pool import load_pool_config

    cfg = load_pool_config(pool)
    live = [
        w for w in cfg["workers"] if str(w.get("kind", "")) not in ("simulated", "replay", "fake", "recorded")
    ]
    if not cap_usd or not live:
        return pool
    current = cfg.get("max_usd")
    cfg["max_usd"] = min(float(current), cap_usd) if current else cap_usd
    path = Path(folder) / f"{cfg.get('name', 'pool')}-capped.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return str(path)


#: The reward settings a retrain takes from the champion unless its overrides set them.
REWARD_KEYS = ("reward_preset", "cost_weight", "cost_scale")


def retrain_overrides(
    overrides: Mapping[str, Any] | str | None, champion_dir: str, observed_path: str = ""
) -> dict[str, Any]:
    """The training overrides of a retrain: ``overrides``, the champion's folder as the model (a
    warm start), the champion's reward settings where ``overrides`` leaves them unset (its
    ``conductor.json``'s ``train_config``: the challenger is trained, and the observed examples
    valued, at the reward the champion was trained with, which is also the one the gate compares
    at; a preset's default would silently change the objective), and ``observed_path`` when the
    file holds any example (``TrainConfig.observed_path``)."""
    from rl_conductor.policies.conductor import read_conductor_meta

    extra = steps.parse_overrides(overrides)
    extra["model"] = champion_dir
    meta = read_conductor_meta(champion_dir)
    trained = meta.get("train_config") or {}
    for key in REWARD_KEYS:
        if extra.get(key) is None and trained.get(key) is not None:
            extra[key] = trained[key]
    if observed_path and Path(observed_path).is_file() and Path(observed_path).stat().st_size:
        extra["observed_path"] = observed_path
    return extra


def retrain_step(
    *,
    train_path: str,
    champion_dir: str,
    model_dir: str,
    preset: str = "tiny",
    pool: str = "paper-sim",
    overrides: Mapping[str, Any] | str | None = None,
    spend_cap_usd: float = 0.0,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    artifact_root: str = "",
    run_tag: str = "local",
    observed_path: str = "",
) -> steps.TrainOutcome:
    """:func:`rl_conductor.pipeline.steps.train_step` from the champion's weights (see module
    docstring), with :func:`retrain_overrides`; ``observed_path``: :func:`collect_step`'s
    ``outputs["observed"]``, the window's score-only requests the warm start may teach."""
    extra = retrain_overrides(overrides, champion_dir, observed_path)
    train_pool = spend_capped_pool(pool, spend_cap_usd, Path(model_dir).parent / "pool")
    return steps.train_step(
        train_path=train_path,
        model_dir=model_dir,
        preset=preset,
        pool=train_pool,
        overrides=extra,
        seed=seed,
        mlflow_tracking_uri=mlflow_tracking_uri,
        artifact_root=artifact_root,
        run_tag=run_tag,
    )


# --------------------------------------------------------------------------- gate


@dataclass(frozen=True)
class Comparison:
    """Challenger vs champion on the same questions, at the current pool's prices."""

    n: int
    test_split_id: str
    challenger: dict[str, Any]
    champion: dict[str, Any]
    baseline: dict[str, Any] | None
    reward_gain: float
    ci_low: float
    ci_high: float
    #: the gate's floor on the same questions: every single worker, then the two routers
    singles: list[dict[str, Any]] = field(default_factory=list)


def paired_gain(challenger: Sequence[float], champion: Sequence[float]) -> tuple[float, float, float]:
    """Mean of the paired differences and its 95 % interval (normal approximation)."""
    diffs = [a - b for a, b in zip(challenger, champion, strict=True)]
    if not diffs:
        raise ValueError("no questions to compare on")
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.inf
    return mean, mean - Z95 * se, mean + Z95 * se


#: The routers of the gate's floor (:data:`rl_conductor.tracking.gate.GATE_BASELINES`).
ROUTERS = ("domain-router", "knn")


def evaluate_with_floor(
    conductor_dirs: Sequence[str],
    tasks: Sequence[Task],
    *,
    pool: str,
    seed: int = 0,
    train_path: str | None = None,
    fit_limit: int | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Run each Conductor of ``conductor_dirs``, every single worker and the two routers on
    ``tasks`` under ``pool``, at the first Conductor's reward; returns the evaluation results by
    policy spec (``conductor:DIR``, ``single:NAME``, ``knn`` …) and the floor's specs. The routers
    are fitted at that reward on the ``train`` split of ``train_path``'s tasks, else of the pool's
    dataset; ``fit_limit``: a seeded sample of that many. What :func:`compare` and the champion
    check (:mod:`rl_conductor.loop.monitor`) both measure."""
    from rl_conductor.evaluation.suite import GridPoint, eval_limits, eval_reward, own_rounds, sweep
    from rl_conductor.lm.generate import torch_threads, trained_threads
    from rl_conductor.policies.conductor import read_conductor_meta
    from rl_conductor.workers.pool import load_pool

    p = load_pool(pool, seed=seed)
    fit_on = steps.register_prepared([train_path]) if train_path else p.default_dataset()
    specs = [f"conductor:{d}" for d in conductor_dirs]
    rc = eval_reward(specs[:1], None, None)  # the first Conductor's reward
    meta = read_conductor_meta(conductor_dirs[0])
    limits = eval_limits(None, "public", None, None)  # rounds: each policy its own (below)
    floor = [*(f"single:{n}" for n in p.names()), *ROUTERS]
    with torch_threads(trained_threads(meta)):  # as the pipeline's evaluation step
        ran = sweep(
            [*specs, *floor], [(GridPoint(), limits)], p, tasks, fit_on=fit_on, reward_config=rc,
            seed=seed, fit_limit=fit_limit, progress=False,
            rounds={s: own_rounds(s) for s in [*specs, *floor]},  # a two-round champion keeps its review
        )  # fmt: skip
    return {spec: res for _pt, spec, res in ran}, floor


def compare(
    challenger_dir: str,
    champion_dir: str,
    tasks: Sequence[Task],
    *,
    pool: str,
    seed: int = 0,
    train_path: str | None = None,
    fit_limit: int | None = None,
) -> Comparison:
    """Run both Conductors, every single worker and the two routers on ``tasks`` under ``pool``
    (see module docstring), at the challenger's reward (the champion's, warm-started):
    :func:`evaluate_with_floor`."""
    from rl_conductor.tracking.gate import best_baseline

    specs = [f"conductor:{challenger_dir}", f"conductor:{champion_dir}"]
    results, floor = evaluate_with_floor(
        [challenger_dir, champion_dir],
        tasks,
        pool=pool,
        seed=seed,
        train_path=train_path,
        fit_limit=fit_limit,
    )
    split_id = steps.test_split_id(tasks, pool, seed)

    def summary(spec: str, label: str) -> dict[str, Any]:
        s = results[spec].summary()
        s["policy"] = label
        s["test_split_id"] = split_id
        return s

    chal, champ = summary(specs[0], "challenger"), summary(specs[1], "champion")
    singles = [summary(spec, spec) for spec in floor]
    by_task = [{r.task_id: r.reward for r in results[s].records} for s in specs]
    ids = [t.id for t in tasks]
    gain, low, high = paired_gain([by_task[0][i] for i in ids], [by_task[1][i] for i in ids])
    return Comparison(
        n=len(ids),
        test_split_id=split_id,
        challenger=chal,
        champion=champ,
        baseline=best_baseline(singles),
        reward_gain=gain,
        ci_low=low,
        ci_high=high,
        singles=singles,
    )


@dataclass(frozen=True)
class GateOutcome:
    """The loop's decision and the registered challenger."""

    promoted: bool
    reason: str
    version: int
    champion: int
    previous_champion: int
    reward_gain: float
    ci_low: float
    ci_high: float
    n: int
    challenger: dict[str, float]
    champion_metrics: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(comparison: Comparison, *, min_reward_gain: float = 0.0, require_significant: bool = True) -> Any:
    """The gate's rule (:func:`rl_conductor.tracking.gate.decide`, by reward, both measured
    again) and the loop's: the paired gain's interval above ``min_reward_gain``."""
    from rl_conductor.tracking import gate

    thresholds = gate.GateThresholds(versus_champion="reward", min_reward_gain=min_reward_gain)
    challenger = {**comparison.challenger, **(comparison.baseline or {})}
    decision = gate.decide(challenger, comparison.champion, thresholds)
    if decision.promote and require_significant and not comparison.ci_low > min_reward_gain:
        return gate.GateDecision(
            False,
            f"reward gain {comparison.reward_gain:+.4f} (95 % CI {comparison.ci_low:+.4f} to "
            f"{comparison.ci_high:+.4f}, n={comparison.n}) is not above {min_reward_gain:g} with "
            "confidence: the champion stays",
        )
    if decision.promote:
        return gate.GateDecision(
            True,
            f"{decision.reason}; paired gain {comparison.reward_gain:+.4f} "
            f"(95 % CI {comparison.ci_low:+.4f} to {comparison.ci_high:+.4f}, n={comparison.n})",
        )
    return decision


def _flat(summary: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(summary[k])
        for k in steps.REGISTERED_METRICS
        if isinstance(summary.get(k), int | float) and not isinstance(summary.get(k), bool)
    }


def gate_step(
    *,
    challenger_dir: str,
    champion_dir: str,
    holdout_path: str,
    test_path: str,
    pool: str = "paper-sim",
    model_name: str = steps.DEFAULT_MODEL_NAME,
    champion_version: int = 0,
    min_reward_gain: float = 0.0,
    require_significant: bool = True,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    run_tag: str = "local",
    reason: str = "",
    train_path: str | None = None,
    fit_limit: int | None = None,
) -> GateOutcome:
    """Compare, decide, register the challenger and promote it if it passed (module docstring).
    ``train_path`` (the retrain's training tasks) and ``fit_limit``: what the routers of the floor
    are fitted on (:func:`compare`)."""
    import mlflow

    from rl_conductor.loop import pool_change
    from rl_conductor.serving.pyfunc import MODEL_CODE
    from rl_conductor.tracking import mlflow_utils, registry

    tasks: dict[str, Task] = {}
    for t in [*steps.read_tasks(holdout_path), *steps.read_tasks(test_path)]:
        tasks.setdefault(t.id, t)
    comparison = compare(
        challenger_dir,
        champion_dir,
        list(tasks.values()),
        pool=pool,
        seed=seed,
        train_path=train_path,
        fit_limit=fit_limit,
    )
    decision = decide(comparison, min_reward_gain=min_reward_gain, require_significant=require_significant)
    challenger_metrics = {**_flat(comparison.challenger), **(comparison.baseline or {})}
    challenger_metrics.pop(registry.BASELINE_POLICY_KEY, None)
    champion_metrics = _flat(comparison.champion)
    snapshot = json.dumps(pool_change.snapshot(pool), sort_keys=True)
    with steps.mlflow_tracking(mlflow_tracking_uri, ""):
        before = registry.get_alias_version(model_name, registry.CHAMPION) or 0
        with mlflow_utils.start_run(
            model_name + LOOP_EXPERIMENT_SUFFIX,
            f"gate-{run_tag}",
            {
                registry.TEST_SPLIT_KEY: comparison.test_split_id,
                "pool": pool,
                "champion_version": champion_version or before,
                "n_holdout": len(steps.read_tasks(holdout_path)),
                "n_compared": comparison.n,
                registry.BASELINE_POLICY_KEY: (comparison.baseline or {}).get(
                    registry.BASELINE_POLICY_KEY, ""
                ),
            },
            tags={"loop.step": "gate", "loop.trigger": reason[:4000]},
        ):
            mlflow_utils.log_metrics({f"champion/{k}": v for k, v in champion_metrics.items()})
            mlflow_utils.log_metrics(
                {"reward_gain": comparison.reward_gain, "reward_gain_ci_low": comparison.ci_low}
                | {"reward_gain_ci_high": comparison.ci_high}
            )
            for s in (
                comparison.singles
            ):  # "single:NAME" -> "single_NAME/mean_reward" (no colons in MLflow), "knn/…"
                mlflow_utils.log_metrics(
                    {f"{s['policy'].replace(':', '_')}/mean_reward": float(s["mean_reward"])}
                )
            mlflow.set_tags(
                {"gate.promoted": str(decision.promote).lower(), "gate.reason": decision.reason[:4000]}
            )
            mv = registry.log_conductor_model(
                challenger_dir,
                model_code=MODEL_CODE,
                name=model_name,
                metrics=challenger_metrics,
                params={"run_tag": run_tag},
                tags={"pipeline.run_tag": run_tag, "loop.retrain": "true"},
                alias=registry.CHALLENGER,
            )
        if decision.promote:
            registry.promote(model_name, mv.version)
        registry.tag_version(
            model_name,
            mv.version,
            {
                "gate.promoted": str(decision.promote).lower(),
                "gate.reason": decision.reason[:4000],
                "gate.champion_before": str(before) if before else "",
                pool_change.SNAPSHOT_TAG: snapshot,
            },
        )
        after = registry.get_alias_version(model_name, registry.CHAMPION) or 0
    return GateOutcome(
        promoted=decision.promote,
        reason=decision.reason,
        version=mv.version,
        champion=after,
        previous_champion=before,
        reward_gain=comparison.reward_gain,
        ci_low=comparison.ci_low,
        ci_high=comparison.ci_high,
        n=comparison.n,
        challenger=challenger_metrics,
        champion_metrics=champion_metrics,
    )


__all__ = [
    "CollectOutcome",
    "Comparison",
    "GateOutcome",
    "collect_step",
    "compare",
    "decide",
    "evaluate_with_floor",
    "gate_step",
    "paired_gain",
    "retrain_overrides",
    "retrain_step",
    "spend_capped_pool",
]
