"""Is the serving champion still above the gate's floor on recent traffic? The loop's alert.

Why: a retrain starts on a schedule or when the pool file changes (:mod:`.pool_change`), but an
endpoint can get worse without any file changing, and a champion that a fixed router now beats
should page someone before the next scheduled retrain. This check measures what the gate would:
the champion and the gate's floor (every single worker, the ``domain-router`` and the ``knn``
router fitted at the champion's reward on the pool's training split:
:func:`rl_conductor.loop.retrain.evaluate_with_floor`) on the same questions — the window's
requests that got feedback and stand for a task (:mod:`.data`) — re-executed under the current
pool, as the gate re-executes its held-out traffic (a live pool's response cache replays them).

It fires when the per-question paired gap (champion minus the best floor policy on these
questions) has its whole 95 % interval below 0: a champion merely level with a router, or below
it within noise, does not page. The best of several floor policies is chosen on the same
questions, so the gap leans against the champion; the interval requirement is the guard.

What a platform engineer can page on (one check, several outputs):

* the exit status of ``conductor retrain check``: 3 when the champion is below the floor, 0 when
  it is not, 1 when there is no verdict (too few tasks with feedback in the window, MLflow or
  storage unreachable), 2 for bad arguments;
* the verdict line, once: ``ALERT champion ...`` (or ``ok: ...``) on the CLI's stdout; a library
  caller of :func:`check_champion` gets it as a log record on ``rl_conductor.loop.monitor`` (the
  alert at WARNING) instead;
* Prometheus gauges (:func:`metrics_registry`): ``conductor_champion_below_floor`` (0/1),
  ``conductor_champion_floor_gap`` and its interval's ends, the questions compared and the
  check's time (so a stale check can alert too), written to a node-exporter textfile and/or
  pushed to a Pushgateway (a batch job has no ``/metrics`` route of its own);
* MLflow: a run ``check-<tag>`` in ``<model name>-loop`` (tag ``loop.step=check``,
  ``check.below_floor``, metrics ``check/*``) and tags ``check.*`` on the champion's version.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway, write_to_textfile

from rl_conductor.pipeline import steps

log = logging.getLogger(__name__)

#: ``conductor retrain check``'s exit status when the champion is below the floor
BELOW_FLOOR_EXIT = 3
PUSH_JOB = "conductor-champion-check"


@dataclass(frozen=True)
class CheckOutcome:
    """The check's verdict and its figures (mean rewards on the same ``n`` questions)."""

    below_floor: bool
    reason: str
    model_name: str
    champion_version: int
    n: int
    champion_reward: float
    floor_policy: str
    floor_reward: float
    gap: float
    ci_low: float
    ci_high: float
    #: what the served answers earned by their feedback (score, else grade), when any
    earned_reward: float | None
    checked_at: float
    floor_rewards: dict[str, float]
    mlflow_run_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def line(self) -> str:
        """The verdict line the CLI and the pipeline step print: ``ALERT …`` or ``ok: …``."""
        return ("ALERT " if self.below_floor else "ok: ") + self.reason


def verdict(
    champion: dict[str, float], floor: dict[str, dict[str, float]]
) -> tuple[str, float, float, float, float]:
    """The best floor policy (by mean reward over the same questions) and the paired gap of the
    champion below it: ``(policy, floor mean, gap, ci_low, ci_high)``; rewards by task id."""
    from rl_conductor.loop.retrain import paired_gain

    if not champion:
        raise ValueError("no questions to compare on")
    ids = sorted(champion)
    best = max(floor, key=lambda spec: statistics.fmean(floor[spec][i] for i in ids))
    gap, low, high = paired_gain([champion[i] for i in ids], [floor[best][i] for i in ids])
    return best, statistics.fmean(floor[best][i] for i in ids), gap, low, high


def check_champion(
    *,
    traffic_store: str,
    pool: str = "paper-sim",
    model_name: str = steps.DEFAULT_MODEL_NAME,
    window_hours: float = 24.0,
    until: float | None = None,
    min_tasks: int = 30,
    fit_limit: int | None = None,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    run_tag: str = "local",
    log_verdict: bool = True,
) -> CheckOutcome:
    """Measure the champion against the gate's floor on the window's tasks with feedback (module
    docstring); logs the outcome to MLflow. Raises ``UserError`` with fewer than ``min_tasks``.
    ``log_verdict`` false: no ``ALERT``/ok log record, for a caller that prints the verdict
    itself (``conductor retrain check``: with no logging configured the record went to Python's
    last-resort stderr handler beside the CLI's stdout line, so a pod log showed the alert twice)."""
    import mlflow

    from rl_conductor import validation
    from rl_conductor.errors import UserError
    from rl_conductor.loop import data as loop_data
    from rl_conductor.loop.retrain import LOOP_EXPERIMENT_SUFFIX, download_champion, evaluate_with_floor
    from rl_conductor.tracking import mlflow_utils, registry

    validation.non_negative_finite("window_hours", window_hours)
    # as the CLI's options: the pipeline's root inputs reach here unchecked, and min_tasks 0 gave
    # a verdict step over no question (a traceback after the champion's download)
    validation.integer_at_least("min_tasks", min_tasks, 2)
    if fit_limit is not None:
        validation.integer_at_least("fit_limit", fit_limit, 1)
    end = until if until is not None else time.time() + 1.0
    since = end - window_hours * 3600 if window_hours else None
    dataset = steps.dataset_of_pool(pool)
    window = loop_data.collect(traffic_store, dataset=dataset, since=since, until=end, holdout_fraction=1.0)
    with_feedback = {e.task.id for e in window.examples if e.task is not None and e.feedback is not None}
    tasks = [t for t in window.holdout if t.id in with_feedback]
    if not window.examples:
        raise UserError(
            f"no traffic records in the window of {traffic_store}: no verdict on the champion (is it "
            "the predictor's --traffic_store? widen --window-hours)"
        )
    if len(tasks) < min_tasks:
        raise UserError(
            f"{len(tasks)} requests with feedback that stand for a task in the window of "
            f"{traffic_store} (< {min_tasks}): no verdict on the champion (widen --window-hours "
            "or collect more feedback)"
        )
    summary = window.summary()
    with (
        steps.mlflow_tracking(mlflow_tracking_uri, ""),
        tempfile.TemporaryDirectory(prefix="conductor-check-") as tmp,
    ):
        version, champion_dir = download_champion(model_name, f"{tmp}/champion")
        results, floor = evaluate_with_floor([champion_dir], tasks, pool=pool, seed=seed, fit_limit=fit_limit)
        rewards = {spec: {r.task_id: r.reward for r in res.records} for spec, res in results.items()}
        best, floor_mean, gap, low, high = verdict(
            rewards[f"conductor:{champion_dir}"], {s: rewards[s] for s in floor}
        )
        champion_mean = statistics.fmean(rewards[f"conductor:{champion_dir}"].values())
        below = high < 0.0
        figures = (
            f"mean reward {champion_mean:.4f} vs {best} {floor_mean:.4f}, paired gap {gap:+.4f} "
            f"(95 % CI {low:+.4f} to {high:+.4f}, n={len(tasks)}) under pool {pool}"
        )
        reason = (
            f"champion v{version} of {model_name} is below the gate's floor: {figures}; retrain "
            "(conductor retrain run) or roll back"
            if below
            else f"champion v{version} of {model_name} is not below the gate's floor: {figures}"
        )
        outcome = CheckOutcome(
            below_floor=below,
            reason=reason,
            model_name=model_name,
            champion_version=version,
            n=len(tasks),
            champion_reward=champion_mean,
            floor_policy=best,
            floor_reward=floor_mean,
            gap=gap,
            ci_low=low,
            ci_high=high,
            earned_reward=summary.get("earned_reward"),
            checked_at=time.time(),
            floor_rewards={s: statistics.fmean(rewards[s].values()) for s in floor},
        )
        with mlflow_utils.start_run(
            model_name + LOOP_EXPERIMENT_SUFFIX,
            f"check-{run_tag}",
            {"traffic_store": traffic_store, "pool": pool, "window_hours": window_hours},
            tags={
                "loop.step": "check",
                "check.below_floor": str(below).lower(),
                "check.reason": reason[:4000],
                "check.champion_version": str(version),
            },
        ) as run:
            mlflow_utils.log_metrics(
                {
                    "check/below_floor": float(below),
                    "check/champion_reward": champion_mean,
                    "check/floor_reward": floor_mean,
                    "check/gap": gap,
                    "check/gap_ci_low": low,
                    "check/gap_ci_high": high,
                    "check/n": float(len(tasks)),
                }
                | {f"check/{s.replace(':', '_')}/mean_reward": v for s, v in outcome.floor_rewards.items()}
                | {f"traffic/{k}": v for k, v in summary.items()}
            )
            mlflow.log_dict(outcome.to_dict(), "check/outcome.json")
            run_id = run.info.run_id
        registry.tag_version(
            model_name,
            version,
            {
                "check.below_floor": str(below).lower(),
                "check.reason": reason[:4000],
                "check.time": str(round(outcome.checked_at, 3)),
            },
        )
    if log_verdict and below:
        log.warning("ALERT %s", reason)
    elif log_verdict:
        log.info("%s", reason)
    return CheckOutcome(**{**outcome.to_dict(), "mlflow_run_id": run_id})


def metrics_registry(outcome: CheckOutcome) -> CollectorRegistry:
    """The check's Prometheus gauges (module docstring), labelled by model name, in a registry of
    their own (a batch job's, not the predictor's process-wide one)."""
    reg = CollectorRegistry()
    labels = ["model"]

    def gauge(name: str, doc: str, value: float) -> None:
        Gauge(name, doc, labels, registry=reg).labels(outcome.model_name).set(value)

    gauge(
        "conductor_champion_below_floor",
        "1 when the serving champion is below the gate's floor on recent traffic with feedback",
        float(outcome.below_floor),
    )
    gauge(
        "conductor_champion_floor_gap",
        "Champion minus the best floor policy, mean reward per question",
        outcome.gap,
    )
    gauge("conductor_champion_floor_gap_ci_low", "Lower end of the gap's 95 % interval", outcome.ci_low)
    gauge("conductor_champion_floor_gap_ci_high", "Upper end of the gap's 95 % interval", outcome.ci_high)
    gauge("conductor_champion_check_questions", "Questions the check compared on", float(outcome.n))
    gauge("conductor_champion_version", "Registry version of the champion checked", outcome.champion_version)
    gauge("conductor_champion_check_timestamp_seconds", "When the check ran (Unix time)", outcome.checked_at)
    return reg


def export_metrics(outcome: CheckOutcome, *, textfile: str = "", pushgateway: str = "") -> None:
    """Write the gauges to a node-exporter ``textfile`` and/or push them to ``pushgateway``
    (job ``conductor-champion-check``); raises ``UserError`` when the push fails."""
    from rl_conductor.errors import UserError

    reg = metrics_registry(outcome)
    if textfile:
        try:
            write_to_textfile(textfile, reg)
        except OSError as exc:
            raise UserError(f"cannot write the check's metrics to {textfile}: {exc}") from exc
    if pushgateway:
        try:
            push_to_gateway(pushgateway, job=PUSH_JOB, registry=reg, timeout=30)
        except OSError as exc:
            raise UserError(f"cannot push the check's metrics to {pushgateway}: {exc}") from exc


__all__ = [
    "BELOW_FLOOR_EXIT",
    "CheckOutcome",
    "check_champion",
    "export_metrics",
    "metrics_registry",
    "verdict",
]
