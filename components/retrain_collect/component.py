"""KFP component ``collect_traffic``: a window of served traffic + feedback as retraining data.

Thin adapter over :func:`rl_conductor.loop.retrain.collect_step`; see docs/closed-loop.md.
"""

from components.images import base_component
from kfp import dsl


@base_component
def collect_traffic(
    traffic_store: str,
    train_data: dsl.Output[dsl.Dataset],
    holdout_data: dsl.Output[dsl.Dataset],
    test_data: dsl.Output[dsl.Dataset],
    champion: dsl.Output[dsl.Model],
    observed_data: dsl.Output[dsl.Dataset],
    window_metrics: dsl.Output[dsl.Metrics],
    pool: str = "paper-sim",
    model_name: str = "conductor",
    window_hours: float = 0.0,
    holdout_fraction: float = 0.3,
    eval_limit: int = 200,
    base_train_limit: int = 0,
    min_train_tasks: int = 8,
    only_on_pool_change: bool = False,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    run_tag: str = "local",
) -> bool:
    """Read the last ``window_hours`` (0: all) of ``traffic_store``; write the training tasks, the
    held-out recent traffic, the standing test split, the champion's folder and the requests with
    a score and no gold answer (``observed_data``); return whether to retrain. Why (a pool
    change names what changed) and the champion's version go into the held-out data's metadata
    (``reason``, ``champion_version``) and the MLflow ``collect`` run. (One plain output: kfp's
    local runner resolves a ``dsl.If`` on a single ``Output`` only.)"""
    from rl_conductor.loop import retrain
    from rl_conductor.pipeline.steps import call_same_named

    outcome = call_same_named(
        retrain.collect_step,
        locals(),
        outputs={
            "train": train_data.path,
            "holdout": holdout_data.path,
            "test": test_data.path,
            "champion": champion.path,
            "observed": observed_data.path,
        },
    )
    for name, value in outcome.summary.items():
        window_metrics.log_metric(name, value)
    holdout_data.metadata.update({"reason": outcome.reason, "champion_version": outcome.champion_version})
    print(f"collect: {'retrain' if outcome.should_train else 'no retrain'}: {outcome.reason}")
    return outcome.should_train
