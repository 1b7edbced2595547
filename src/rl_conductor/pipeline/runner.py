"""Run, compile and submit the ``conductor-training`` Kubeflow pipeline.

Why: ``conductor pipeline run|compile|submit`` and ``make run`` need one place that finds the
pipeline definition, fills its parameters, runs it with kfp's local SubprocessRunner (or sends
it to a KFP API server) and collects what a person wants to see at the end: the comparison
table, the report's location, the registered version and its aliases.

The pipeline and its components live in the repository (``pipelines/``, ``components/``), not
in the installed package: :func:`repo_root` finds them from the working directory or from this
file (an editable install), and they are loaded from there by path (``sys.path`` is not changed).

Deliberate simplifications:
- Local runs execute every step in a subprocess of the current Python environment
  (``use_venv=False``) with no caching; step output is written to a log file unless
  ``verbose`` is set (kfp prints each step's full executor input otherwise).
- ``--quick`` is a fixed set of small parameters (:data:`QUICK_ARGUMENTS`) meant for tests and
  smoke runs, not a preset.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rl_conductor import validation
from rl_conductor.errors import InvalidArgument, MissingFile, UnknownName, UserError
from rl_conductor.pipeline import steps

__all__ = [
    "PARAMETER_RULES",
    "PIPELINE_MODULE",
    "QUICK_ARGUMENTS",
    "QUICK_TRAIN_OVERRIDES",
    "LocalRun",
    "PipelineRunFailed",
    "call_local",
    "check_parameter",
    "compile_pipeline",
    "default_package_path",
    "load_pipeline",
    "local_session",
    "pipeline_arguments",
    "pipeline_parameters",
    "repo_root",
    "run_local",
    "submit",
]

PIPELINE_MODULE = "pipelines.conductor_training"
PIPELINE_FUNCTION = "conductor_training"
PACKAGE_NAME = "conductor_training.yaml"

#: Training-config overrides of a quick run: a smaller tiny model, tiny groups, short prompts and
#: completions, few examples. It checks the plumbing; the Conductor it trains plans badly.
QUICK_TRAIN_OVERRIDES: dict[str, Any] = {
    "prompts_per_step": 2,
    "num_generations": 2,
    "max_completion_length": 24,
    "max_question_chars": 200,
    "sft_batch_size": 16,
    "logging_steps": 1,
    "save_steps": 1000,
    "tiny_hidden_size": 64,
    "tiny_layers": 2,
    # the tiny preset trains on two threads; at hidden size 64 a second thread only contends
    # (the test suite runs several quick pipelines side by side)
    "train_torch_threads": 1,
}
#: Pipeline arguments of ``--quick``: a handful of training steps on a small sample.
QUICK_ARGUMENTS: dict[str, Any] = {
    "grpo_steps": 2,
    "sft_examples": 32,
    "train_limit": 32,
    "eval_limit": 12,
    "train_overrides": json.dumps(QUICK_TRAIN_OVERRIDES, sort_keys=True),
}


def repo_root() -> Path:
    """The folder holding ``pipelines/`` and ``components/``: the working directory or one
    above it, else the checkout this package is installed from (editable install)."""
    here = Path.cwd().resolve()
    candidates = [here, *here.parents, Path(__file__).resolve().parents[3]]
    for folder in candidates:
        if (folder / "pipelines" / "conductor_training.py").is_file() and (folder / "components").is_dir():
            return folder
    raise FileNotFoundError(
        "pipelines/conductor_training.py not found: run this from the rl-conductor checkout"
    )


def _checkout_package(root: Path, name: str) -> None:
    """Make ``name`` (``pipelines`` or ``components``) the checkout's package, loaded from its
    file, so its modules import from ``root`` without ``root`` on ``sys.path``; an already
    imported package of that folder is kept."""
    folder = root / name
    loaded = sys.modules.get(name)
    if loaded is not None and folder in [Path(p).resolve() for p in getattr(loaded, "__path__", [])]:
        return
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        raise MissingFile(f"{folder / '__init__.py'}: not a Python package")
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)


def load_pipeline(module: str = PIPELINE_MODULE, function: str = PIPELINE_FUNCTION) -> Callable[..., Any]:
    """A pipeline function of ``pipelines/`` (default ``conductor_training``; the closed loop's
    ``conductor_retrain`` too), loaded from the checkout's files: ``pipelines`` and the
    ``components`` its modules import are registered by path (:func:`_checkout_package`), and
    ``sys.path`` is left as it was."""
    root = repo_root()
    for name in ("components", "pipelines"):
        _checkout_package(root, name)
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


def default_package_path(package: str = PACKAGE_NAME) -> Path:
    """The committed compiled pipeline in the checkout (default ``conductor_training.yaml``)."""
    return repo_root() / "pipelines" / package


def compile_pipeline(
    path: str | Path | None = None,
    *,
    module: str = PIPELINE_MODULE,
    function: str = PIPELINE_FUNCTION,
    package: str = PACKAGE_NAME,
) -> Path:
    """Compile a pipeline to ``path`` (default: its committed YAML); returns the path."""
    from kfp import compiler  # type: ignore[import-untyped]

    out = Path(path) if path is not None else default_package_path(package)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(load_pipeline(module, function), str(out))
    return out


def pipeline_parameters() -> dict[str, Any]:
    """The pipeline's parameters and their defaults, read from its signature."""
    import inspect

    fn = load_pipeline()
    target = getattr(fn, "pipeline_func", fn)
    return {name: p.default for name, p in inspect.signature(target).parameters.items()}


def float_parameters(module: str = PIPELINE_MODULE, function: str = PIPELINE_FUNCTION) -> set[str]:
    """The names of a pipeline's ``float`` parameters (from its signature's annotations)."""
    import inspect

    fn = load_pipeline(module, function)
    target = getattr(fn, "pipeline_func", fn)
    return {n for n, p in inspect.signature(target).parameters.items() if p.annotation in (float, "float")}


def _at_least(minimum: int) -> Callable[[str, Any], Any]:
    return lambda name, value: validation.integer_at_least(name, value, minimum)


#: What each numeric pipeline parameter accepts, as :mod:`rl_conductor.validation` rules: the
#: same functions check the CLI options and the gate's fields. 0 (counts) or a negative number
#: (cost_weight) means "the preset's value", as the pipeline's docstring says.
PARAMETER_RULES: dict[str, Callable[[str, Any], Any]] = {
    "grpo_steps": _at_least(0),
    "sft_examples": _at_least(0),
    "train_limit": _at_least(0),
    "eval_limit": _at_least(0),
    "train_gpus": _at_least(1),
    "seed": _at_least(0),
    "cost_weight": validation.finite,
    "eval_max_latency_s": validation.non_negative_finite,
    "eval_deadlines": lambda name, value: _deadlines(name, value),
    "min_accuracy_gain": validation.non_negative_finite,
    "max_cost_ratio": validation.positive_finite,
    "min_accuracy": validation.probability,
}


def _deadlines(name: str, value: Any) -> Any:
    """``eval_deadlines``: ``""``, ``"none"`` or seconds like ``"60,15,5"`` (each finite, > 0)."""
    from rl_conductor.pipeline.steps import deadline_parameters

    if not isinstance(value, str):
        raise validation.InvalidValue(name, value, 'a string like "60,15,5", "none" or ""')
    try:
        deadline_parameters(0.0, value)
    except ValueError as exc:
        raise validation.InvalidValue(name, value, f'seconds like "60,15,5" ({exc})') from None
    return value


def check_parameter(name: str, value: Any) -> Any:
    """``value`` if parameter ``name`` accepts it; else :class:`~rl_conductor.validation.InvalidValue`."""
    rule = PARAMETER_RULES.get(name)
    if rule is not None and value is not None:
        rule(name, value)
    return value


def pipeline_arguments(*, quick: bool = False, **arguments: Any) -> dict[str, Any]:
    """Arguments for a run: :data:`QUICK_ARGUMENTS` if ``quick``, then ``arguments`` (None = default).

    Unknown names raise :class:`~rl_conductor.errors.UnknownName` listing the pipeline's
    parameters; values outside :data:`PARAMETER_RULES` raise ``InvalidValue`` before anything runs.
    """
    known = pipeline_parameters()
    given = {k: v for k, v in arguments.items() if v is not None}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise UnknownName(f"unknown pipeline parameters {unknown}; known: {', '.join(sorted(known))}")
    for name, value in given.items():
        check_parameter(name, value)
    # kfp refuses an int for a float input ("NUMBER_INTEGER is incompatible with NUMBER_DOUBLE"):
    # `--set cost_weight=1` is the float
    floats = float_parameters()
    given = {
        k: float(v) if k in floats and isinstance(v, int) and not isinstance(v, bool) else v
        for k, v in given.items()
    }
    if isinstance(given.get("train_overrides"), Mapping):
        given["train_overrides"] = json.dumps(given["train_overrides"], sort_keys=True)
    return {**(QUICK_ARGUMENTS if quick else {}), **given}


class PipelineRunFailed(UserError, RuntimeError):
    """A step of a local run failed; the message names the log holding its output (exit 1)."""


@dataclass
class LocalRun:
    """The result of :func:`run_local`."""

    model_name: str
    version: int
    aliases: list[str]
    promoted: bool
    gate_reason: str
    champion: int
    run_folder: str
    summaries: list[dict[str, Any]]
    meta: dict[str, Any]
    report_uri: str
    results_path: str
    seconds: float
    log_path: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def conductor(self) -> dict[str, Any]:
        return next(s for s in self.summaries if s["policy"] == steps.CONDUCTOR_LABEL)


def _local_root() -> Path:
    from rl_conductor.tracking.mlflow_utils import conductor_home

    return conductor_home() / ".conductor" / "kfp"


@contextlib.contextmanager
def local_session(root: str | Path) -> Iterator[Path]:
    """kfp's local SubprocessRunner writing under ``root``, for the ``with`` block; yields the
    block's kfp workspace folder, removed when the block ends.

    Why: ``kfp.local.init`` without a workspace makes a ``/tmp/kfp-workspace-*`` folder on every
    call and removes it only when a whole pipeline finishes in that process, so every component
    run on its own (the tests) and every run stopped midway left one in ``/tmp``. Here it is a
    fresh folder under ``root`` (runs that share a root do not share it), removed at the end.
    """
    from kfp import local  # type: ignore[import-untyped]

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    workspace = Path(tempfile.mkdtemp(prefix="kfp-workspace-", dir=root))
    try:
        local.init(
            runner=local.SubprocessRunner(use_venv=False),
            pipeline_root=str(root),
            workspace_root=str(workspace),
            raise_on_error=True,
        )
        yield workspace
    finally:
        shutil.rmtree(workspace, ignore_errors=True)  # a finished pipeline has removed it already


def call_local(
    pipeline: Callable[..., Any],
    arguments: dict[str, Any],
    *,
    root: Path,
    verbose: bool,
    what: str,
    log_prefix: str = "",
) -> tuple[Any, Path | None]:
    """Call a loaded pipeline function in a :func:`local_session` under ``root``; returns its task
    and the log file its step output went to (``<root>/logs/<prefix><timestamp>.log``; None when
    ``verbose``). A failing step raises :class:`PipelineRunFailed` ("``what`` failed: …", with the
    log's path). The one way the training, retraining and champion-check pipelines run locally."""
    log_path: Path | None = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(local_session(root))
        if not verbose:
            log_path = root / "logs" / f"{log_prefix}{datetime.now(UTC):%Y%m%d-%H%M%S-%f}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = stack.enter_context(open(log_path, "w", encoding="utf-8"))
            stack.enter_context(contextlib.redirect_stdout(log))
        try:
            task = pipeline(**arguments)
        except Exception as exc:
            where = f"; step output in {log_path}" if log_path else ""
            raise PipelineRunFailed(f"{what} failed: {exc}{where}") from exc
    return task, log_path


def run_local(
    *,
    quick: bool = False,
    verbose: bool = False,
    pipeline_root: str | Path | None = None,
    **arguments: Any,
) -> LocalRun:
    """Run the pipeline with kfp's local SubprocessRunner; returns what it produced.

    ``arguments`` are pipeline parameters (see :func:`pipeline_parameters`). Step output goes
    to ``<pipeline_root>/logs/<timestamp>.log`` unless ``verbose``. Raises RuntimeError (with the
    log's path) when a step fails.
    """
    from rl_conductor.tracking import mlflow_utils, registry

    args = pipeline_arguments(quick=quick, **arguments)
    pipeline = load_pipeline()
    root = Path(pipeline_root) if pipeline_root is not None else _local_root()
    t0 = time.perf_counter()
    task, log_path = call_local(pipeline, args, root=root, verbose=verbose, what="local pipeline run")
    seconds = time.perf_counter() - t0
    out = task.outputs
    meta, summaries = steps.read_results(out["results"].path)
    model_name = str(args.get("model_name") or pipeline_parameters()["model_name"])
    mlflow_utils.configure(str(args.get("mlflow_tracking_uri") or "") or None)
    version = int(out["version"])
    row = next((r for r in registry.list_versions(model_name) if r.version == version), None)
    from rl_conductor import storage

    return LocalRun(
        model_name=model_name,
        version=version,
        aliases=list(row.aliases) if row else [],
        promoted=bool(out["promoted"]),
        gate_reason=str(out["gate_reason"]),
        champion=int(out["champion"]),
        run_folder=str(out["run_folder"]),
        summaries=summaries,
        meta=meta,
        report_uri=storage.join(str(out["run_folder"]), "reports", "report.md"),
        results_path=str(out["results"].path),
        seconds=seconds,
        log_path=str(log_path) if log_path else None,
        arguments=args,
    )


def submit(
    host: str,
    *,
    package_path: str | Path | None = None,
    run_name: str | None = None,
    experiment: str = "conductor",
    namespace: str | None = None,
    quick: bool = False,
    **arguments: Any,
) -> str:
    """Submit the compiled pipeline to the KFP API server at ``host``; returns the run id.

    On a cluster the artifact root must be ``s3://…`` and the MLflow tracking URI a server
    (``http(s)://…``): a pod's local disk and sqlite file vanish with the pod.
    """
    import kfp  # type: ignore[import-untyped]

    args = pipeline_arguments(quick=quick, **arguments)
    root = str(args.get("artifact_root") or "")
    if not root.startswith("s3://"):
        raise InvalidArgument("on a cluster, pass artifact_root=s3://bucket/prefix (pod disks are not kept)")
    tracking = str(args.get("mlflow_tracking_uri") or "")
    if not tracking.startswith(("http://", "https://")):
        raise InvalidArgument("on a cluster, pass mlflow_tracking_uri=http(s)://<mlflow server>")
    package = Path(package_path) if package_path is not None else default_package_path()
    if not package.is_file():
        raise MissingFile(f"{package} not found: run `conductor pipeline compile` first")
    client = kfp.Client(host=host, namespace=namespace)
    result = client.create_run_from_pipeline_package(
        str(package),
        arguments=args,
        run_name=run_name or f"conductor-training-{datetime.now(UTC):%Y%m%d-%H%M%S}",
        experiment_name=experiment,
        namespace=namespace,
        enable_caching=False,
    )
    return str(result.run_id)
