"""The Kubeflow pipeline ``conductor-training``: prepare → train → evaluate → register → promote.

Compiled to ``conductor_training.yaml`` next to this file (``conductor pipeline compile``; a
test fails when the committed YAML is stale). Run it locally with ``conductor pipeline run
--local`` (kfp's SubprocessRunner) or on a cluster with ``conductor pipeline submit --host URL``.

Cluster-only settings, which the local runner ignores: the training step asks for one
``nvidia.com/gpu`` and receives the worker API keys from the Kubernetes Secret named by
``api_keys_secret`` (evaluation too: live workers need them); every step receives S3
credentials from the Secret named by ``s3_secret``. Both Secrets are optional, so a run on
the simulated pool needs neither.

Every step gets the pipeline job name as ``run_tag``: it names the run's folder below the
artifact root and the MLflow run that registers the model.
"""

from typing import NamedTuple

from components.evaluate_conductor.component import evaluate_conductor
from components.prepare_data.component import prepare_data
from components.promote_conductor.component import promote_conductor
from components.register_conductor.component import register_conductor
from components.train_conductor.component import train_conductor
from kfp import dsl

from pipelines import wiring

PIPELINE_NAME = "conductor-training"


class PipelineOutputs(NamedTuple):
    """What a run returns (``conductor pipeline run`` prints it)."""

    version: int
    promoted: bool
    gate_reason: str
    champion: int
    run_folder: str
    results: dsl.Artifact
    report: dsl.Markdown


@dsl.pipeline(
    name=PIPELINE_NAME,
    description="Train a Conductor (SFT + GRPO), evaluate it against every baseline, register it "
    "in MLflow as challenger and promote it to champion behind an evaluation gate.",
)
def conductor_training(
    preset: str = wiring.PRESET,
    pool: str = wiring.POOL,
    dataset: str = "",
    reward_preset: str = "",
    cost_weight: float = -1.0,
    grpo_steps: int = 0,
    sft_examples: int = 0,
    train_limit: int = 0,
    eval_limit: int = 300,
    eval_max_latency_s: float = 0.0,
    eval_deadlines: str = "",
    train_overrides: str = "{}",
    train_gpus: int = 1,
    seed: int = 0,
    model_name: str = wiring.MODEL_NAME,
    min_accuracy_gain: float = 0.0,
    max_cost_ratio: float = 1.0,
    min_accuracy: float = 0.0,
    mlflow_tracking_uri: str = "",
    artifact_root: str = "",
    api_keys_secret: str = wiring.API_KEYS_SECRET,
    s3_secret: str = wiring.S3_SECRET,
) -> PipelineOutputs:
    """Parameters (empty string, 0 or a negative number: the preset's or the default value).

    preset: training preset (tiny | smol | gpu | a YAML path), a comma-separated list of them, or
    auto on a recordings pool (each trained, the best on the validation split kept).
    pool: worker pool for training and evaluation.
    dataset: task set (default: the pool's). reward_preset / cost_weight: reward shape.
    grpo_steps / sft_examples / train_limit / eval_limit / train_overrides (JSON): size of the
    run. train_gpus: GPUs of the training step (more than one: a training process per GPU).
    eval_max_latency_s: a deadline (seconds, 0 = none) for every request of the evaluation;
    eval_deadlines: extra deadlines for the latency-vs-accuracy view ("" default, "none", "60,15,5").
    min_accuracy_gain / max_cost_ratio / min_accuracy: the promotion gate.
    mlflow_tracking_uri: MLflow server (default: sqlite under .conductor/). artifact_root:
    local folder or s3://bucket/prefix for datasets, checkpoints and reports.
    """
    run_tag = dsl.PIPELINE_JOB_NAME_PLACEHOLDER
    parameters = dict(locals())  # the parameters and run_tag, which steps take by name (wiring.same_named)
    data = prepare_data(**wiring.same_named(prepare_data, parameters))
    train = train_conductor(
        **wiring.same_named(
            train_conductor, parameters, data, gpus=train_gpus, source_dataset=data.outputs["dataset"]
        )
    )
    train.set_accelerator_type(wiring.GPU_RESOURCE).set_accelerator_limit(train_gpus)
    evaluation = evaluate_conductor(
        **wiring.same_named(
            evaluate_conductor,
            parameters,
            data,
            train,
            max_latency_s=eval_max_latency_s,
            deadlines=eval_deadlines,
        )
    )
    register = register_conductor(**wiring.same_named(register_conductor, parameters, train, evaluation))
    promote = promote_conductor(**wiring.same_named(promote_conductor, parameters, register))
    for task in (register, promote):  # side effects on the registry: never reuse a cached result
        task.set_caching_options(enable_caching=False)
    wiring.use_secrets((train, evaluation), s3_secret=s3_secret, api_keys_secret=api_keys_secret)
    wiring.use_secrets((data, register, promote), s3_secret=s3_secret)
    return PipelineOutputs(
        version=register.outputs["version"],
        promoted=promote.outputs["promoted"],
        gate_reason=promote.outputs["reason"],
        champion=promote.outputs["champion"],
        run_folder=data.outputs["run_folder"],
        results=evaluation.outputs["results"],
        report=evaluation.outputs["report"],
    )
