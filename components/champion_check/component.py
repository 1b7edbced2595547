"""KFP component ``check_champion``: is the serving champion below the gate's floor on recent traffic?

Thin adapter over :func:`rl_conductor.loop.monitor.check_champion` and
:func:`~rl_conductor.loop.monitor.export_metrics` (what ``conductor retrain check`` runs); see
docs/closed-loop.md, section 5.
"""

from components.images import base_component
from kfp import dsl


@base_component
def check_champion(
    traffic_store: str,
    check_metrics: dsl.Output[dsl.Metrics],
    pool: str = "paper-sim",
    model_name: str = "conductor",
    window_hours: float = 24.0,
    min_tasks: int = 30,
    fit_limit: int = 0,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    run_tag: str = "local",
    prom_textfile: str = "",
    pushgateway: str = "",
) -> bool:
    """Measure the champion and the gate's floor on the last ``window_hours`` of traffic with
    feedback under ``pool``; write the gauges (``prom_textfile`` / ``pushgateway``), the MLflow
    ``check`` run and the champion's ``check.*`` tags; return whether it is below the floor.
    Fewer than ``min_tasks`` requests with feedback, or an unreachable store, fails the step (no
    verdict: the CLI's exit 1)."""
    from rl_conductor.loop.monitor import check_champion as check
    from rl_conductor.loop.monitor import export_metrics
    from rl_conductor.pipeline.steps import call_same_named

    outcome = call_same_named(
        check,
        locals(),
        fit_limit=fit_limit or None,
        log_verdict=False,  # printed once below
    )
    export_metrics(outcome, textfile=prom_textfile, pushgateway=pushgateway)
    for name in ("n", "champion_version", "champion_reward", "floor_reward", "gap", "ci_low", "ci_high"):
        check_metrics.log_metric(name, float(getattr(outcome, name)))
    check_metrics.log_metric("below_floor", float(outcome.below_floor))
    print(outcome.line)
    return outcome.below_floor
