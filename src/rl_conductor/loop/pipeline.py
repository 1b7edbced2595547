"""Run and compile the ``conductor-retrain`` Kubeflow pipeline (``pipelines/retrain.py``).

Why beside :mod:`rl_conductor.pipeline.runner`: the same kfp local SubprocessRunner and the same
checkout lookup (:func:`rl_conductor.pipeline.runner.repo_root`), for the loop's pipeline; what a
run decided is read back from the registry (the gate tags the version it registered).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_conductor import validation
from rl_conductor.loop.retrain import LOOP_EXPERIMENT_SUFFIX
from rl_conductor.pipeline import runner
from rl_conductor.pipeline.runner import QUICK_TRAIN_OVERRIDES, PipelineRunFailed

PIPELINE_MODULE = "pipelines.retrain"
PIPELINE_FUNCTION = "conductor_retrain"
PACKAGE_NAME = "retrain.yaml"
#: Training overrides of ``--quick``: a few steps from the champion (checks the plumbing only).
QUICK_RETRAIN_OVERRIDES: dict[str, Any] = {
    **{k: v for k, v in QUICK_TRAIN_OVERRIDES.items() if not k.startswith("tiny_")},
    "grpo_steps": 2,
    "sft_examples": 32,
    "warm_items_per_domain": 16,
    "warm_deadline_items_per_domain": 8,
}


def load_pipeline() -> Any:
    """The ``conductor_retrain`` pipeline function (imports ``pipelines/`` from the checkout)."""
    return runner.load_pipeline(PIPELINE_MODULE, PIPELINE_FUNCTION)


def default_package_path() -> Path:
    return runner.default_package_path(PACKAGE_NAME)


def compile_pipeline(path: str | Path | None = None) -> Path:
    """Compile the pipeline to ``path`` (default: the committed ``pipelines/retrain.yaml``)."""
    return runner.compile_pipeline(
        path, module=PIPELINE_MODULE, function=PIPELINE_FUNCTION, package=PACKAGE_NAME
    )


@dataclass(frozen=True)
class RetrainRun:
    """What a local run did: whether it trained, why, and the gate's decision (if it trained)."""

    should_train: bool
    reason: str
    champion_before: int
    version: int | None
    promoted: bool
    gate_reason: str
    champion: int | None
    seconds: float
    log_path: str | None


#: Range of each numeric parameter (:mod:`rl_conductor.validation` rules), checked before a run.
PARAMETER_RULES: dict[str, Callable[[str, Any], Any]] = {
    "window_hours": validation.non_negative_finite,
    "holdout_fraction": validation.probability,
    "spend_cap_usd": validation.non_negative_finite,
    "min_reward_gain": validation.finite,
    **{name: (lambda n, v: validation.integer_at_least(n, v, 0)) for name in (
        "eval_limit", "base_train_limit", "min_train_tasks", "fit_limit", "seed")},
}  # fmt: skip


def retrain_arguments(**arguments: Any) -> dict[str, Any]:
    """``arguments`` checked against ``conductor_retrain``'s signature before anything runs.

    Why: kfp refuses an int for a float input (``--set spend_cap_usd=5`` failed the run with
    "NUMBER_INTEGER is incompatible with NUMBER_DOUBLE"), an unknown name failed it as a Python
    ``TypeError``, and a bad value or pool failed a step whose reason was only in the log. Here an
    int for a float parameter becomes that float, and an unknown name, a value of the wrong type or
    out of range, a pool that does not exist and a ``traffic_store`` that is neither an existing
    folder nor an ``s3://BUCKET`` URI raise a :class:`~rl_conductor.errors.UsageError` naming it.
    """
    import inspect

    from rl_conductor import storage
    from rl_conductor.errors import UnknownName
    from rl_conductor.workers.pool import available_pools

    fn = load_pipeline()
    params = inspect.signature(getattr(fn, "pipeline_func", fn)).parameters
    given = {k: v for k, v in arguments.items() if v is not None}
    unknown = sorted(set(given) - set(params))
    if unknown:
        raise UnknownName(f"unknown retrain parameters {unknown}; known: {', '.join(sorted(params))}")
    out: dict[str, Any] = {}
    for name, value in given.items():
        kind = params[name].annotation
        kind = {"float": float, "int": int, "bool": bool, "str": str}.get(kind, kind)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is bool and not isinstance(value, bool):
            raise validation.InvalidValue(name, value, "true or false")
        if kind is str and not isinstance(value, str):
            raise validation.InvalidValue(name, value, "a string")
        if kind is int:
            value = validation.integer_at_least(name, value, -(2**63))
        if kind is float:
            value = validation.finite(name, value)
        rule = PARAMETER_RULES.get(name)
        if rule is not None:
            rule(name, value)
        out[name] = value
    store = str(out.get("traffic_store", ""))
    if storage.is_s3(store):
        try:
            storage.split_s3(store)
        except ValueError:
            raise validation.InvalidValue("traffic_store", store, "an s3://BUCKET[/prefix] URI") from None
    elif not Path(store).is_dir():
        raise validation.InvalidValue(
            "traffic_store", store, "the predictor's --traffic_store: an existing folder or an s3:// URI"
        )
    pool = out.get("pool")
    if isinstance(pool, str) and not Path(pool).is_file() and pool not in available_pools():
        raise UnknownName(f"no pool named {pool!r} and no such file; built-in pools: {available_pools()}")
    return out


def run_local(
    *, quick: bool = False, verbose: bool = False, pipeline_root: str | Path | None = None, **arguments: Any
) -> RetrainRun:
    """Run ``conductor-retrain`` with kfp's local SubprocessRunner (``arguments``: its parameters)."""
    import json

    from rl_conductor.errors import UserError
    from rl_conductor.tracking import mlflow_utils, registry
    from rl_conductor.tracking.mlflow_utils import conductor_home

    arguments = retrain_arguments(**arguments)
    if quick and "train_overrides" not in arguments:
        arguments["train_overrides"] = json.dumps(QUICK_RETRAIN_OVERRIDES, sort_keys=True)
    pipeline = load_pipeline()
    root = Path(pipeline_root) if pipeline_root is not None else conductor_home() / ".conductor" / "kfp"
    model_name = str(arguments.get("model_name") or "conductor")
    mlflow_utils.configure(str(arguments.get("mlflow_tracking_uri") or "") or None)
    if registry.get_alias_version(model_name, registry.CHAMPION) is None:
        raise UserError(f"{model_name} has no champion: train one first (conductor pipeline run --local)")
    before_versions = {r.version for r in registry.list_versions(model_name)}
    t0 = time.perf_counter()
    task, log_path = runner.call_local(
        pipeline, arguments, root=root, verbose=verbose, what="local retrain run", log_prefix="retrain-"
    )
    should_train = bool(task.output)
    mlflow_utils.configure(str(arguments.get("mlflow_tracking_uri") or "") or None)
    client = mlflow_utils.client()
    exp = client.get_experiment_by_name(model_name + LOOP_EXPERIMENT_SUFFIX)
    collected = client.search_runs(
        [exp.experiment_id] if exp else [],
        "tags.`loop.step` = 'collect'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not collected:
        raise PipelineRunFailed(f"the retrain run left no collect run in MLflow experiment {model_name}-loop")
    new = [r for r in registry.list_versions(model_name) if r.version not in before_versions]
    version = new[-1].version if new else None
    tags: dict[str, str] = {}
    if version is not None:
        tags = dict(client.get_model_version(model_name, str(version)).tags)
    return RetrainRun(
        should_train=should_train,
        reason=str(collected[0].data.tags.get("loop.reason", "")),
        champion_before=int(collected[0].data.params.get("champion_version", 0)),
        version=version,
        promoted=tags.get("gate.promoted") == "true",
        gate_reason=tags.get("gate.reason", ""),
        champion=registry.get_alias_version(model_name, registry.CHAMPION),
        seconds=time.perf_counter() - t0,
        log_path=str(log_path) if log_path else None,
    )


CHECK_PIPELINE_MODULE = "pipelines.champion_check"
CHECK_PIPELINE_FUNCTION = "conductor_champion_check"
CHECK_PACKAGE_NAME = "champion_check.yaml"


def compile_check_pipeline(path: str | Path | None = None) -> Path:
    """Compile ``conductor-champion-check`` (``pipelines/champion_check.py``: the alert of
    :mod:`rl_conductor.loop.monitor` as a pipeline step) to ``path`` (default: the committed
    ``pipelines/champion_check.yaml``)."""
    return runner.compile_pipeline(
        path, module=CHECK_PIPELINE_MODULE, function=CHECK_PIPELINE_FUNCTION, package=CHECK_PACKAGE_NAME
    )


def run_check_local(*, pipeline_root: str | Path, verbose: bool = False, **arguments: Any) -> bool:
    """Run ``conductor-champion-check`` with kfp's local SubprocessRunner (``arguments``: its
    parameters); returns whether the champion is below the floor (the verdict's figures are in
    MLflow and the gauges, as the CLI's)."""
    pipeline = runner.load_pipeline(CHECK_PIPELINE_MODULE, CHECK_PIPELINE_FUNCTION)
    task, _ = runner.call_local(
        pipeline,
        arguments,
        root=Path(pipeline_root),
        verbose=verbose,
        what="local champion check",
        log_prefix="check-",
    )
    return bool(task.output)


__all__ = [
    "CHECK_PACKAGE_NAME",
    "PARAMETER_RULES",
    "QUICK_RETRAIN_OVERRIDES",
    "RetrainRun",
    "compile_check_pipeline",
    "compile_pipeline",
    "load_pipeline",
    "retrain_arguments",
    "run_check_local",
    "run_local",
]
