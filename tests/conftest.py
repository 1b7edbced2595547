"""Shared pytest fixtures: real servers on loopback (see servers.py), started once per session,
and MLflow stores that use them."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from servers import (
    MlflowServer,
    S3Server,
    build_tiny_worker_model,
    mlflow_server,
    seaweedfs_s3,
    worker_serve_processes,
)

if TYPE_CHECKING:  # mlflow is imported by the fixtures that need it: it takes seconds
    from _tiny import Micro
    from rl_conductor.tracking.mlflow_utils import TrackingConfig


class _OneTorchThread(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs torch on one thread from its first import in this process: two threads on a loaded
    2-core machine are many times slower than one. Test files import torch lazily (tests/_lazy.py),
    so this happens when a test first needs it rather than at collection."""

    def __init__(self) -> None:
        self._loader: Any = None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.set_num_threads(1)

    def __getattr__(self, name: str) -> Any:  # resource readers etc. of the real loader
        return getattr(self._loader, name)


if "torch" in sys.modules:
    sys.modules["torch"].set_num_threads(1)
else:
    sys.meta_path.insert(0, _OneTorchThread())

# One BLAS/OpenMP thread per process, for this process and the servers it starts: pytest-xdist
# already runs a worker per core, and OpenBLAS's extra threads spin while they wait. On 2 cores
# the non-slow tests of test_evidence_rank/_select/test_evidence/test_knn took 56 CPU s with
# the default threads and 18.6 with one (the sklearn probe fits spent most of it in L-BFGS's BLAS
# calls). The libraries read these at load, and nothing imports numpy before this conftest.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
if "numpy" in sys.modules:  # loaded already (another plugin): limit its pools now
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One SeaweedFS S3 gateway (SigV4 enforced) for the whole session."""
    with seaweedfs_s3() as server:
        yield server


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """Point the standard AWS variables (and MLFLOW_S3_ENDPOINT_URL) at the session S3 server."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env: S3Server) -> str:
    """A fresh, empty bucket for one test, as ``s3://name``."""
    return s3_env.create_bucket(f"test-{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def mlflow_db_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty, fully migrated MLflow sqlite file; copies of it skip the slow schema creation.

    Tests only copy it. Under pytest-xdist the workers share one, made by the first to ask in the
    session's common temporary folder under a file lock (the migration costs about 2 CPU s)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        path = tmp_path_factory.mktemp("mlflow-template") / "template.db"
        _migrated_mlflow_db(path)
        return path
    from filelock import FileLock

    path = tmp_path_factory.getbasetemp().parent / "mlflow-template.db"
    with FileLock(f"{path}.lock"):
        if not path.is_file():
            part = path.with_name(f"{path.name}.part")
            part.unlink(missing_ok=True)
            _migrated_mlflow_db(part)
            part.replace(path)
    return path


def _migrated_mlflow_db(path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{path}"
    MlflowClient(tracking_uri=uri, registry_uri=uri).search_experiments()


@pytest.fixture(scope="session")
def micro(tmp_path_factory: pytest.TempPathFactory, mlflow_db_template: Path) -> Micro:
    """The session's one trained micro Conductor (tests/_tiny.py), for every test that asks."""
    from _tiny import trained_micro

    return trained_micro(tmp_path_factory, mlflow_db_template)


@pytest.fixture(scope="session")
def mlflow_sqlite_uri(mlflow_db_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The session's sqlite tracking store (shared by tests: use unique model names)."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    shutil.copyfile(mlflow_db_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def tiny_worker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny randomly initialised chat model folder that ``conductor worker serve`` loads."""
    return build_tiny_worker_model(tmp_path_factory.mktemp("worker-model") / "tiny")


@pytest.fixture(scope="module")
def local_workers(
    tiny_worker_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, int]]:
    """Two ``conductor worker serve`` processes of it, ``tiny-self`` and ``tiny-ext`` (the workers
    of the ``local-live`` pool, see :func:`servers.local_live_env`); yields {served name: port}."""
    names = ("tiny-self", "tiny-ext")
    with worker_serve_processes(tiny_worker_dir, names, tmp_path_factory.mktemp("worker-logs")) as ports:
        yield ports


@pytest.fixture
def mlflow_local(mlflow_db_template: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    """MLflow configured on a fresh sqlite store in ``tmp_path`` (artifacts in ``tmp_path/mlruns``),
    restored afterwards; yields the environment a predictor process needs to reach the same store."""
    import mlflow

    from rl_conductor.tracking import mlflow_utils

    db = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_db_template, db)
    uri = f"sqlite:///{db}"
    previous = mlflow.get_tracking_uri()
    mlflow_utils.configure(uri, artifact_root=str(tmp_path / "mlruns"))
    yield {"MLFLOW_TRACKING_URI": uri, "CONDUCTOR_ARTIFACT_ROOT": str(tmp_path / "mlruns")}
    mlflow_utils.reset()
    mlflow.set_tracking_uri(previous)
    mlflow.set_registry_uri(previous)


@pytest.fixture(scope="session")
def mlflow_artifacts_bucket(s3_server: S3Server) -> str:
    """One bucket for the MLflow artifacts of the whole session, as ``s3://name``."""
    return s3_server.create_bucket(f"mlruns-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def mlflow_tracking(
    mlflow_sqlite_uri: str, mlflow_artifacts_bucket: str, s3_env: S3Server
) -> Iterator[TrackingConfig]:
    """MLflow without a server: the session's sqlite store, artifacts on the S3 server."""
    import mlflow

    from rl_conductor.tracking import mlflow_utils

    previous = mlflow.get_tracking_uri()
    cfg = mlflow_utils.configure(mlflow_sqlite_uri, artifact_root=f"{mlflow_artifacts_bucket}/mlruns")
    yield cfg
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow_utils.reset()
    mlflow.set_tracking_uri(previous)
    mlflow.set_registry_uri(previous)


@pytest.fixture(scope="session")
def mlflow_server_s3(
    s3_server: S3Server, mlflow_db_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MlflowServer]:
    """An ``mlflow server`` (sqlite backend) that proxies artifacts to a bucket on the S3 server."""
    bucket = s3_server.create_bucket(f"mlflow-{uuid.uuid4().hex[:12]}")
    workdir: Path = tmp_path_factory.mktemp("mlflow-server")
    shutil.copyfile(mlflow_db_template, workdir / "server.db")
    with mlflow_server(
        artifacts_destination=f"{bucket}/artifacts",
        env=s3_server.env(),
        workdir=workdir,
        backend_store_uri=f"sqlite:///{workdir / 'server.db'}",
    ) as server:
        yield server
