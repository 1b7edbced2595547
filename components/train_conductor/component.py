"""KFP component ``train_conductor``: SFT warm start + GRPO on the prepared train split.

Thin adapter over :func:`rl_conductor.pipeline.steps.train_step`; see README.md. It runs on the
CUDA image; the pipeline asks for a GPU and mounts the API-key Secret on a cluster (both are
ignored by the local runner).
"""

from typing import NamedTuple

from components.images import cuda_component
from kfp import dsl


@cuda_component
def train_conductor(
    train_data: dsl.Input[dsl.Dataset],
    validation_data: dsl.Input[dsl.Dataset],
    model: dsl.Output[dsl.Model],
    train_metrics: dsl.Output[dsl.Metrics],
    preset: str = "tiny",
    pool: str = "",
    source_dataset: str = "",
    reward_preset: str = "",
    cost_weight: float = -1.0,
    grpo_steps: int = 0,
    sft_examples: int = 0,
    train_overrides: str = "{}",
    gpus: int = 1,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    artifact_root: str = "",
    run_tag: str = "local",
) -> NamedTuple("TrainOutputs", [("checkpoints", str), ("global_step", int)]):
    """Train a Conductor from ``preset`` (tiny | smol | gpu | a YAML path) on ``train_data``.

    A list of presets (``recordings,recordings-text``) or ``auto`` trains each and keeps the best
    on ``validation_data`` at one reward, as ``conductor train --preset`` does (``source_dataset``,
    the dataset ``prepare_data`` split, tells ``auto`` whether the recordings keep their texts);
    one preset never reads ``validation_data``.

    Empty strings, 0 and a negative ``cost_weight`` keep the preset's value;
    ``train_overrides`` is a JSON object of any other TrainConfig fields. ``model`` receives the
    servable folder (weights, tokenizer, ``conductor.json``, prompt templates); the whole
    training folder goes to ``<artifact_root>/<run_tag>/checkpoints``. ``gpus`` > 1 trains one
    process per GPU (``accelerate launch``) when the node gives the step that many.
    """
    from collections import namedtuple

    from rl_conductor.pipeline import steps

    outcome = steps.call_same_named(
        steps.train_step,
        locals(),
        train_path=train_data.path,
        validation_path=validation_data.path,
        dataset=source_dataset,
        model_dir=model.path,
        cost_weight=cost_weight if cost_weight >= 0 else None,
        grpo_steps=grpo_steps or None,
        sft_examples=sft_examples or None,
        overrides=train_overrides,
    )
    model.metadata.update(
        {
            "base_model": outcome.base_model,
            "preset": outcome.chosen_preset or preset,
            **({"preset_candidates": preset} if outcome.chosen_preset else {}),
            "checkpoints": outcome.checkpoints_uri,
            "mlflow_run_id": outcome.mlflow_run_id or "",
        }
    )
    for name, value in outcome.metrics().items():
        train_metrics.log_metric(name, value)
    TrainOutputs = namedtuple("TrainOutputs", ["checkpoints", "global_step"])
    return TrainOutputs(outcome.checkpoints_uri, outcome.global_step)
