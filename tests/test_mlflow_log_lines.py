"""What a local MLflow store prints through ``mlflow_utils``: nothing when a new store is created,
MLflow's own lines when a store from an older MLflow is migrated (the same two lines MLflow logs
for a new store: "Creating initial MLflow database tables", "Updating database tables")."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_conductor.tracking import mlflow_utils

DB_LOG = "mlflow.store.db.utils"


@pytest.fixture
def restore_tracking() -> Iterator[None]:
    import mlflow

    previous = mlflow.get_tracking_uri()
    yield
    mlflow_utils.reset()
    mlflow.set_tracking_uri(previous)
    mlflow.set_registry_uri(previous)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == DB_LOG]


def _old_store(path: Path) -> str:
    """A store as an older MLflow left it: the schema at revision 0584bdc529eb (before the
    logged-model tables)."""
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    uri = f"sqlite:///{path}"
    engine = sqlalchemy.create_engine(uri)
    InitialBase.metadata.create_all(engine)
    command.upgrade(_get_alembic_config(uri), "0584bdc529eb")
    engine.dispose()
    return uri


def _revision(uri: str) -> str:
    import sqlalchemy

    with sqlalchemy.create_engine(uri).connect() as c:
        return str(c.execute(sqlalchemy.text("select version_num from alembic_version")).scalar())


def test_a_new_store_prints_nothing(
    tmp_path: Path, restore_tracking: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=DB_LOG)
    for _ in range(2):  # configured twice: one filter
        mlflow_utils.configure(f"sqlite:///{tmp_path / 'new.db'}", artifact_root=str(tmp_path / "art"))
    assert logging.getLogger(DB_LOG).filters.count(mlflow_utils._NEW_STORE) == 1
    mlflow_utils.ensure_experiment("fresh")
    assert (tmp_path / "new.db").is_file() and _lines(caplog) == []
    logging.getLogger(DB_LOG).warning("something is wrong with the store")  # warnings still show
    assert _lines(caplog) == ["something is wrong with the store"]


def test_a_store_from_an_older_mlflow_says_it_is_migrated(
    tmp_path: Path, restore_tracking: None, caplog: pytest.LogCaptureFixture
) -> None:
    uri = _old_store(tmp_path / "old.db")
    assert _revision(uri) == "0584bdc529eb"
    caplog.set_level(logging.INFO, logger=DB_LOG)
    mlflow_utils.configure(uri, artifact_root=str(tmp_path / "art"))
    mlflow_utils.ensure_experiment("old")
    assert _revision(uri) != "0584bdc529eb"  # migrated in process
    assert "Updating database tables" in _lines(caplog)
