"""What the pipelines share: the Secrets' keys, the GPU resource, and how a step is wired.

A step takes the pipeline parameter or the upstream output of the same name for every input
that has one (:func:`same_named`); what is wired otherwise (a renamed parameter or output) is
written at the call. Every step may read S3 (artifacts, MLflow's store) and the steps that call
workers need their API keys (:func:`use_secrets`); both Secrets are optional, so a run on the
simulated pool needs neither.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from kfp import dsl, kubernetes

GPU_RESOURCE = "nvidia.com/gpu"
#: Defaults the pipelines' parameters share (kfp writes them into each compiled YAML).
POOL = "paper-sim"
PRESET = "tiny"
MODEL_NAME = "conductor"
#: The Secrets of the worker API keys and the S3 credentials (manifests/secrets/*.template.yaml).
API_KEYS_SECRET = "conductor-api-keys"
S3_SECRET = "conductor-s3"
#: Secret data key -> environment variable, for the live workers' SDKs.
API_KEY_ENV = {
    "OPENAI_API_KEY": "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY": "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY": "GEMINI_API_KEY",
}
#: Secret data key -> environment variable, for boto3 (rl_conductor.storage) and MLflow's S3 store.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
    "AWS_ENDPOINT_URL": "AWS_ENDPOINT_URL",
    "MLFLOW_S3_ENDPOINT_URL": "MLFLOW_S3_ENDPOINT_URL",
}


def same_named(
    component: Any, parameters: Mapping[str, Any], *upstream: dsl.PipelineTask, **inputs: Any
) -> dict[str, Any]:
    """The arguments of a ``component`` step, in the component's order: each of its inputs that
    names one of the pipeline's ``parameters`` or an output of an ``upstream`` task takes it
    (a name that two of them have raises); then ``inputs``, which win."""
    names = component.component_spec.inputs or {}
    sources = {name: parameters[name] for name in names if name in parameters}
    for task in upstream:
        if clash := sources.keys() & task.outputs.keys():
            raise ValueError(f"{task.name}: {sorted(clash)} named twice; wire them at the call")
        sources |= {name: task.outputs[name] for name in names if name in task.outputs}
    return {name: sources[name] for name in names if name in sources} | inputs


def use_secrets(
    tasks: Iterable[dsl.PipelineTask], *, s3_secret: Any, api_keys_secret: Any | None = None
) -> None:
    """Mount the S3 credentials of ``s3_secret`` on every task, after the worker API keys of
    ``api_keys_secret`` where one is given (both Secrets optional; the local runner ignores them)."""
    for task in tasks:
        if api_keys_secret is not None:
            kubernetes.use_secret_as_env(
                task, secret_name=api_keys_secret, secret_key_to_env=API_KEY_ENV, optional=True
            )
        kubernetes.use_secret_as_env(task, secret_name=s3_secret, secret_key_to_env=S3_ENV, optional=True)
