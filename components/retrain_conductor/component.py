"""KFP component ``retrain_conductor``: the training step, warm-started from the champion.

Thin adapter over :func:`rl_conductor.loop.retrain.retrain_step` (which calls the training
pipeline's :func:`rl_conductor.pipeline.steps.train_step`); see docs/closed-loop.md.
"""

from components.images import CUDA_IMAGE
from kfp import dsl


@dsl.component(base_image=CUDA_IMAGE, packages_to_install=[], install_kfp_package=False)
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

    outcome = retrain.retrain_step(
        train_path=train_data.path,
        champion_dir=champion.path,
        model_dir=model.path,
        preset=preset,
        pool=pool,
        overrides=train_overrides,
        spend_cap_usd=spend_cap_usd,
        seed=seed,
        mlflow_tracking_uri=mlflow_tracking_uri,
        artifact_root=artifact_root,
        run_tag=run_tag,
        observed_path=observed_data.path,
    )
    for name, value in outcome.metrics().items():
        train_metrics.log_metric(name, value)
    return outcome.global_step
