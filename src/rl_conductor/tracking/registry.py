"""The Conductor in the MLflow model registry: log, register, alias, promote, fetch back.

Why: the registry is the hand-off between training and serving. A pipeline run logs the
trained model folder as a new version and marks it ``challenger``; the evaluation gate
(``gate.py``) may move ``champion`` to it; the KServe predictor loads
``models:/conductor@champion``. Aliases, not stages, because stages are deprecated in MLflow.

The model is an MLflow pyfunc whose only artifact is the whole model folder (weights,
tokenizer, prompt template, config), so ``load_model_dir`` can hand serving a plain folder and
nothing here depends on how the folder is laid out. The pyfunc class is serving code
(:class:`rl_conductor.serving.pyfunc.ConductorPyfunc`, which answers through the KServe
predictor's service): the caller passes the "models from code" source that builds it
(``serving.pyfunc.MODEL_CODE``), so the dependency on serving is the caller's own import, which
the layer contract checks; no code of this module imports or names serving.

Deliberate simplifications:
- Metrics used to compare versions are read from the run that logged the version
  (``accuracy``, ``mean_cost_usd``, ...); ``test_split_id`` from the version's tags, the run's
  tags or the run's params, in that order.
- ``pip_requirements`` pins only the public packages found installed here; the serving image
  installs ``rl-conductor`` itself.
- Version numbers are ints here (MLflow uses strings).
"""

from __future__ import annotations

import atexit
import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import yaml
from mlflow.exceptions import MlflowException

from rl_conductor import storage
from rl_conductor.errors import UserError, model_not_found
from rl_conductor.tracking import mlflow_utils
from rl_conductor.tracking.keys import BASELINE_POLICY_KEY, TEST_SPLIT_KEY

__all__ = [
    "MODEL_DIR_ARTIFACT",
    "ModelVersionInfo",
    "VersionRow",
    "get_alias_version",
    "list_versions",
    "load_model_dir",
    "log_conductor_model",
    "promote",
    "set_alias",
    "tag_version",
    "version_metrics",
]

MODEL_DIR_ARTIFACT = "model_dir"
CHALLENGER = "challenger"
CHAMPION = "champion"
_PINNED_PACKAGES = ("mlflow", "torch", "transformers", "tokenizers", "safetensors")


@dataclass(frozen=True)
class ModelVersionInfo:
    """A registered version of the Conductor."""

    name: str
    version: int
    run_id: str
    model_uri: str
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class VersionRow:
    """One line of ``list_versions``: a version, its aliases and its run's metrics."""

    version: int
    aliases: list[str]
    metrics: dict[str, float]
    created: datetime
    run_id: str | None
    test_split_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


def _pip_requirements() -> list[str]:
    reqs = []
    for package in _PINNED_PACKAGES:
        try:
            reqs.append(f"{package}=={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return reqs


def _stage_artifacts(artifact_files: Mapping[str, str | os.PathLike[str]], into: Path) -> None:
    """Copy each source (file or folder) to ``into/<destination>``."""
    for dest, src in artifact_files.items():
        src_path = Path(src)
        target = into / dest.strip("/")
        if not target.resolve().is_relative_to(into.resolve()):
            raise ValueError(f"artifact destination escapes the run's folder: {dest!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        if src_path.is_dir():
            shutil.copytree(src_path, target, dirs_exist_ok=True)
        elif src_path.is_file():
            shutil.copy2(src_path, target)
        else:
            raise FileNotFoundError(f"artifact file not found: {src_path}")


def log_conductor_model(
    model_dir: str | os.PathLike[str],
    *,
    model_code: str,
    name: str = "conductor",
    metrics: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    artifact_files: Mapping[str, str | os.PathLike[str]] | None = None,
    tags: Mapping[str, str] | None = None,
    experiment: str = "conductor",
    run_name: str | None = None,
    alias: str | None = CHALLENGER,
) -> ModelVersionInfo:
    """Log ``model_dir`` as a pyfunc model, register it as a new version of ``name``, alias it.

    ``model_code`` is the source of the "models from code" file that builds the pyfunc model
    (``rl_conductor.serving.pyfunc.MODEL_CODE``); its artifact ``model_dir`` is the folder.

    Uses the active run if there is one, else opens a run in ``experiment``. ``metrics`` and
    ``params`` are logged on the run (a ``test_split_id`` param is also set as a run tag and a
    version tag, for the gate); ``artifact_files`` maps a destination path inside the run's
    artifacts (``"eval/report.json"``) to a local file or folder.
    """
    folder = Path(model_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    params = dict(params or {})
    split_id = params.get(TEST_SPLIT_KEY) or (metrics or {}).get(TEST_SPLIT_KEY)
    run_tags = dict(tags or {})
    if split_id is not None:
        run_tags[TEST_SPLIT_KEY] = str(split_id)

    with ExitStack() as stack:
        run = mlflow.active_run()
        if run is None:
            run = stack.enter_context(
                mlflow_utils.start_run(experiment, run_name or f"register-{name}", params, tags=run_tags)
            )
        else:
            if params:
                mlflow.log_params(mlflow_utils.flatten_params(params))
            if run_tags:
                mlflow.set_tags(run_tags)
        mlflow_utils.log_metrics(metrics or {})
        if artifact_files:
            with tempfile.TemporaryDirectory(prefix="conductor-artifacts-") as staging:
                _stage_artifacts(artifact_files, Path(staging))
                mlflow.log_artifacts(staging)
        with tempfile.TemporaryDirectory(prefix="conductor-pyfunc-") as code_dir:
            # "Models from code": the model is rebuilt by running this file, not by unpickling.
            code = Path(code_dir) / "conductor_model.py"
            code.write_text(model_code)
            model_info = mlflow.pyfunc.log_model(
                name="model",
                python_model=str(code),
                artifacts={MODEL_DIR_ARTIFACT: str(folder.resolve())},
                pip_requirements=_pip_requirements(),
            )
        run_id = run.info.run_id

    c = mlflow_utils.client()
    mv = mlflow.register_model(model_info.model_uri, name, tags=run_tags or None)
    version = int(mv.version)
    aliases: tuple[str, ...] = ()
    if alias:
        c.set_registered_model_alias(name, alias, str(version))
        aliases = (alias,)
    return ModelVersionInfo(
        name=name, version=version, run_id=run_id, model_uri=f"models:/{name}/{version}", aliases=aliases
    )


def set_alias(name: str, alias: str, version: int | str) -> None:
    """Point ``name@alias`` at ``version``."""
    mlflow_utils.client().set_registered_model_alias(name, alias, str(version))


def get_alias_version(name: str, alias: str) -> int | None:
    """The version ``name@alias`` points at, or None (no such alias or model)."""
    try:
        mv = mlflow_utils.client().get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise
    return int(mv.version)


def tag_version(name: str, version: int | str, tags: Mapping[str, str]) -> None:
    """Set tags on one model version (the gate records its decision this way)."""
    c = mlflow_utils.client()
    for key, value in tags.items():
        c.set_model_version_tag(name, str(version), key, value)


def promote(name: str, version: int | str, alias: str = CHAMPION) -> int | None:
    """Move ``alias`` (default ``champion``) to ``version``; returns the version it left, or None."""
    previous = get_alias_version(name, alias)
    set_alias(name, alias, version)
    return previous


def _split_id(version_tags: Mapping[str, str], run: Any) -> str | None:
    for source in (version_tags, run.data.tags if run else {}, run.data.params if run else {}):
        if source.get(TEST_SPLIT_KEY):
            return str(source[TEST_SPLIT_KEY])
    return None


def version_metrics(name: str, version: int | str) -> dict[str, Any]:
    """The metrics of the run that logged ``version``, plus its ``test_split_id`` and
    ``baseline_policy`` (if known)."""
    c = mlflow_utils.client()
    mv = c.get_model_version(name, str(version))
    run = c.get_run(mv.run_id) if mv.run_id else None
    out: dict[str, Any] = dict(run.data.metrics) if run else {}
    split = _split_id(mv.tags or {}, run)
    if split is not None:
        out[TEST_SPLIT_KEY] = split
    if run and run.data.params.get(BASELINE_POLICY_KEY):
        out[BASELINE_POLICY_KEY] = str(run.data.params[BASELINE_POLICY_KEY])
    return out


def list_versions(name: str) -> list[VersionRow]:
    """Every version of ``name`` (oldest first) with its aliases and its run's metrics."""
    c = mlflow_utils.client()
    try:
        alias_map = c.get_registered_model(name).aliases or {}
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return []
        raise
    by_version: dict[int, list[str]] = {}
    for alias, version in alias_map.items():
        by_version.setdefault(int(version), []).append(alias)
    rows = []
    for mv in c.search_model_versions(f"name = '{name}'"):
        run = c.get_run(mv.run_id) if mv.run_id else None
        rows.append(
            VersionRow(
                version=int(mv.version),
                aliases=sorted(by_version.get(int(mv.version), [])),
                metrics=dict(run.data.metrics) if run else {},
                created=datetime.fromtimestamp(mv.creation_timestamp / 1000, tz=UTC),
                run_id=mv.run_id,
                test_split_id=_split_id(mv.tags or {}, run),
                tags=dict(mv.tags or {}),
            )
        )
    return sorted(rows, key=lambda r: r.version)


def _process_temp_dir() -> str:
    """A new temporary folder that is removed when this process exits (a server's or a CLI
    command's downloaded model is its own: left behind, every run would add a copy to /tmp)."""
    path = tempfile.mkdtemp(prefix="conductor-model-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def load_model_dir(uri: str, dst: str | os.PathLike[str] | None = None) -> str:
    """A local folder holding the Conductor named by ``uri``.

    ``models:/conductor@champion``, ``models:/conductor/3`` or ``runs:/<id>/model``: download
    the MLflow model and return its model folder. ``s3://…``: download that folder. A local
    folder is returned as is. ``dst`` defaults to a new temporary folder that lasts as long as
    this process; pass ``dst`` to keep the copy.
    """
    if not uri.startswith(("models:/", "runs:/")):
        if storage.is_s3(uri):
            return storage.download_dir(uri, dst or _process_temp_dir())
        if not Path(uri).is_dir():
            raise model_not_found(uri, "model folder not found")
        return uri
    cfg = mlflow_utils.tracking_config()
    try:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=uri,
            dst_path=str(dst or _process_temp_dir()),
            tracking_uri=cfg.tracking_uri,
            registry_uri=cfg.registry_uri,
        )
    except MlflowException as exc:
        first = str(exc.message).strip().splitlines()[0] if str(exc.message).strip() else exc.error_code
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise model_not_found(uri, f"{first} (registry {cfg.registry_uri})") from exc
        raise UserError(f"could not load {uri} from MLflow at {cfg.registry_uri}: {first}") from exc
    mlmodel_path = Path(local) / "MLmodel"
    mlmodel = yaml.safe_load(mlmodel_path.read_text()) if mlmodel_path.is_file() else None
    try:
        rel = mlmodel["flavors"]["python_function"]["artifacts"][MODEL_DIR_ARTIFACT]["path"]
    except (KeyError, TypeError) as exc:
        raise model_not_found(uri, f"the MLflow model has no {MODEL_DIR_ARTIFACT!r} artifact") from exc
    return str(Path(local) / rel)
