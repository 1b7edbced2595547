"""What a local MLflow store prints through ``mlflow_utils.configure``: not the new store's
"Creating initial MLflow database tables" lines, but still a migration's and every warning."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_conductor.tracking import mlflow_utils


@pytest.fixture
def configured(tmp_path: Path) -> Iterator[None]:
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow_utils.configure(f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root=str(tmp_path / "art"))
    mlflow_utils.configure(f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root=str(tmp_path / "art"))
    yield
    mlflow_utils.reset()
    mlflow.set_tracking_uri(previous)
    mlflow.set_registry_uri(previous)


def test_only_the_new_store_lines_are_dropped(configured: None, caplog: pytest.LogCaptureFixture) -> None:
    db_log = logging.getLogger("mlflow.store.db.utils")
    assert sum(isinstance(f, mlflow_utils._NewStoreLine) for f in db_log.filters) == 1  # once
    caplog.set_level(logging.INFO, logger="mlflow.store.db.utils")
    db_log.info("Creating initial MLflow database tables...")  # a new store: both lines dropped
    db_log.info("Updating database tables")
    db_log.info("Updating database tables")  # an existing store migrated: shown
    db_log.warning("something is wrong with the store")
    assert [r.getMessage() for r in caplog.records] == [
        "Updating database tables",
        "something is wrong with the store",
    ]


def test_a_new_store_prints_nothing_and_an_old_one_being_migrated_says_so(
    tmp_path: Path, configured: None, caplog: pytest.LogCaptureFixture
) -> None:
    import sqlalchemy
    from mlflow.store.db.utils import _upgrade_db

    caplog.set_level(logging.INFO, logger="mlflow.store.db.utils")
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    mlflow_utils.configure(uri, artifact_root=str(tmp_path / "art"))
    mlflow_utils.ensure_experiment("fresh")  # MLflow creates the store
    assert not [r for r in caplog.records if r.name == "mlflow.store.db.utils"]
    _upgrade_db(sqlalchemy.create_engine(uri))  # what opening an older store runs
    assert [r.getMessage() for r in caplog.records if r.name == "mlflow.store.db.utils"] == [
        "Updating database tables"
    ]
