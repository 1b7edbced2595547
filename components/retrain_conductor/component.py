"""KFP component ``retrain_conductor``: the training step, warm-started from the champion.

Thin adapter over :func:`rl_conductor.loop.retrain.retrain_step` (which calls the training
pipeline's :func:`rl_conductor.pipeline.steps.train_step`); see docs/closed-loop.md.
"""

from components.images import cuda_component
from kfp import dsl


@cuda_component
def retrain_conductor(
    train_data: dsl.Input[dsl.Dataset],
    champion: dsl.Input[dsl.Model],
    observed_data: dsl.Input[dsl.Dataset],
    model: dsl.Output[dsl.Model],
    train_metrics: dsl.Output[dsl.Metrics],
    preset: str = "tiny",
    pool: str = "paper-sim",
    train_overrides: str = "{}",
    spend_cap_usd: float = 0.0,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    artifact_root: str = "",
    run_tag: str = "local",
) -> int:
    """Train from the champion's weights on ``train_data`` under ``pool``; returns the GRPO steps.
    ``spend_cap_usd`` caps what the warm-start table may pay live workers (0: the pool's own cap);
    ``observed_data``: the window's score-only requests, taught where they earned enough."""
    from rl_conductor.loop import retrain
    from rl_conductor.pipeline.steps import call_same_named

    outcome = call_same_named(
        retrain.retrain_step,
        locals(),
        train_path=train_data.path,
        champion_dir=champion.path,
        model_dir=model.path,
        overrides=train_overrides,
        observed_path=observed_data.path,
    )
    for name, value in outcome.metrics().items():
        train_metrics.log_metric(name, value)
    return outcome.global_step
