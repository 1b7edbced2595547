"""Where MLflow runs go, and small helpers to open runs and log params and metrics.

Why: training, evaluation and the KFP components all log to MLflow; they should agree on
the tracking URI and experiment layout without repeating setup code. Without configuration
everything lands in ``<root>/.conductor/`` (``mlflow.db`` sqlite store, ``mlruns/``
artifacts), where ``<root>`` is ``$CONDUCTOR_HOME`` or the current directory. On a cluster
``MLFLOW_TRACKING_URI`` (or ``configure(tracking_uri=...)``) points at an MLflow server.

Deliberate simplifications:
- Configuration is process-global, like MLflow's own (``mlflow.set_tracking_uri``).
- The artifact root only applies when this module creates an experiment; an existing
  experiment keeps its location, and an MLflow server chooses its own (``--artifacts-destination``).
- Nested params are flattened to dotted keys and stringified; non-finite or non-numeric metric
  values are dropped rather than failing a long run at its end.
- A local sqlite store is created (or upgraded) under a file lock beside it: MLflow migrates a
  new sqlite file on first touch, and two processes doing so at once on one fresh file fail
  ("duplicate column name"), e.g. predictor replicas, or a server and a training run, started
  together on a fresh ``CONDUCTOR_HOME``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow

from rl_conductor import storage

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.tracking.fluent import ActiveRun

__all__ = [
    "TrackingConfig",
    "client",
    "conductor_home",
    "configure",
    "default_artifact_root",
    "default_tracking_uri",
    "ensure_experiment",
    "flatten_params",
    "log_metrics",
    "reset",
    "start_run",
    "tracking_config",
]

ARTIFACT_ROOT_ENV = "CONDUCTOR_ARTIFACT_ROOT"
HOME_ENV = storage.HOME_ENV


@dataclass(frozen=True)
class TrackingConfig:
    """The resolved MLflow locations this process uses."""

    tracking_uri: str
    registry_uri: str
    artifact_root: str | None


_config: TrackingConfig | None = None


def conductor_home() -> Path:
    """``$CONDUCTOR_HOME`` or the current directory: the root that holds ``.conductor/``."""
    return storage.conductor_home()


def default_tracking_uri() -> str:
    """``sqlite:///<root>/.conductor/mlflow.db``."""
    return f"sqlite:///{conductor_home() / '.conductor' / 'mlflow.db'}"


def default_artifact_root() -> str:
    """``<root>/.conductor/mlruns``."""
    return str(conductor_home() / ".conductor" / "mlruns")


def _is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://", "databricks"))


def configure(
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
    *,
    artifact_root: str | None = None,
) -> TrackingConfig:
    """Point MLflow at a tracking store and registry; returns what was chosen.

    ``tracking_uri``: argument, else ``$MLFLOW_TRACKING_URI``, else the local sqlite default.
    ``registry_uri``: argument, else ``$MLFLOW_REGISTRY_URI``, else the tracking URI.
    ``artifact_root`` (local path or ``s3://…``, for experiments created here): argument, else
    ``$CONDUCTOR_ARTIFACT_ROOT``, else ``.conductor/mlruns`` unless the tracking URI is a server.
    """
    global _config
    tracking = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    registry = registry_uri or os.environ.get("MLFLOW_REGISTRY_URI") or tracking
    artifacts = artifact_root or os.environ.get(ARTIFACT_ROOT_ENV)
    if artifacts is None and not _is_server(tracking):
        artifacts = default_artifact_root()
    for uri in (tracking, registry):
        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(tracking)
    mlflow.set_registry_uri(registry)
    _config = TrackingConfig(tracking_uri=tracking, registry_uri=registry, artifact_root=artifacts)
    return _config


class _NewStoreLine(logging.Filter):
    """Drops MLflow's "Creating initial MLflow database tables" and "Updating database tables"
    lines in a thread that is creating a new local store (:func:`_ensure_schema`). MLflow logs the
    same two lines when it migrates an existing store (one from an older MLflow): those show."""

    def __init__(self) -> None:
        super().__init__()
        self.creating = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        new_store_line = msg.startswith(
            ("Creating initial MLflow database tables", "Updating database tables")
        )
        return not (new_store_line and getattr(self.creating, "on", False))


_NEW_STORE = _NewStoreLine()
# a new local store's "Creating initial MLflow database tables" INFO lines opened every first
# command's output (dropped while _ensure_schema creates one); a migration of an existing store,
# warnings and errors still show
logging.getLogger("mlflow.store.db.utils").addFilter(_NEW_STORE)


@contextmanager
def _creating_store() -> Iterator[None]:
    _NEW_STORE.creating.on = True
    try:
        yield
    finally:
        _NEW_STORE.creating.on = False


def reset() -> None:
    """Forget the configuration, so the next use resolves the defaults again (for tests)."""
    global _config
    _config = None


def tracking_config() -> TrackingConfig:
    """The current configuration, applying the defaults on first use."""
    return _config if _config is not None else configure()


_schema_ready: set[str] = set()


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def _ensure_schema(cfg: TrackingConfig) -> None:
    """Create or upgrade the schema of each local sqlite store of ``cfg`` once per process, one
    process at a time (see the module's docstring)."""
    from filelock import FileLock
    from mlflow import MlflowClient

    for uri in dict.fromkeys((cfg.tracking_uri, cfg.registry_uri)):
        path = _sqlite_path(uri)
        if path is None or uri in _schema_ready:
            continue
        try:
            with FileLock(f"{path}.lock"):
                new = not path.is_file() or path.stat().st_size == 0
                with _creating_store() if new else nullcontext():
                    MlflowClient(tracking_uri=uri, registry_uri=uri).search_experiments(max_results=1)
        except OSError:
            # no lock file possible beside it (a read-only home): an existing store is read as it
            # is, as plain MLflow would; a missing one could not be created there anyway
            if not path.is_file():
                raise
        _schema_ready.add(uri)


def client() -> MlflowClient:
    """An MlflowClient for the configured tracking store and registry (a new local sqlite store
    is created first, under its lock)."""
    from mlflow import MlflowClient

    cfg = tracking_config()
    _ensure_schema(cfg)
    return MlflowClient(tracking_uri=cfg.tracking_uri, registry_uri=cfg.registry_uri)


def ensure_experiment(name: str) -> str:
    """The id of experiment ``name``, creating it under the artifact root if it is new."""
    cfg = tracking_config()
    c = client()
    found = c.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    location = None
    if cfg.artifact_root:
        location = f"{cfg.artifact_root.rstrip('/')}/{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}"
    try:
        return str(c.create_experiment(name, artifact_location=location))
    except mlflow.exceptions.MlflowException:
        found = c.get_experiment_by_name(name)  # created concurrently by another process
        if found is None:
            raise
        return str(found.experiment_id)


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists and other values are stringified."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, prefix=f"{name}."))
        else:
            flat[name] = "" if value is None else str(value)
    return flat


_METRIC_NAME = re.compile(r"[^A-Za-z0-9_\-. :/]")


def log_metrics(metrics: Mapping[str, Any], *, step: int | None = None) -> dict[str, float]:
    """Log the finite numeric entries of ``metrics`` to the active run; returns what was logged.

    Names are sanitised to MLflow's alphabet; booleans become 0/1; None, NaN, infinities and
    non-numbers are skipped.
    """
    clean: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, int | float) or not math.isfinite(value):
            continue
        clean[_METRIC_NAME.sub("_", str(key))] = float(value)
    if clean:
        mlflow.log_metrics(clean, step=step)
    return clean


@contextmanager
def start_run(
    experiment: str,
    run_name: str | None = None,
    params: Mapping[str, Any] | None = None,
    *,
    tags: Mapping[str, str] | None = None,
) -> Iterator[ActiveRun]:
    """Open a run in ``experiment`` (nested when a run is already active) and log ``params``."""
    experiment_id = ensure_experiment(experiment)
    nested = mlflow.active_run() is not None
    with mlflow.start_run(
        experiment_id=experiment_id, run_name=run_name, nested=nested, tags=dict(tags or {})
    ) as run:
        if params:
            mlflow.log_params(flatten_params(params))
        yield run
