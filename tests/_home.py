"""A test's own CONDUCTOR_HOME for the pipeline's steps, shared by test_pipeline.py and
test_components.py: a fresh home (sqlite MLflow, kNN cache, kfp root) and no MLflow settings
inherited from the machine, so a step's registry and artifacts are the test's alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from _lazy import lazy

mlflow_utils = lazy("rl_conductor.tracking.mlflow_utils")


def isolate_home(mp: pytest.MonkeyPatch, home: Path) -> None:
    """A fresh CONDUCTOR_HOME at ``home`` and no inherited MLflow settings."""
    mp.setenv("CONDUCTOR_HOME", str(home))
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", mlflow_utils.ARTIFACT_ROOT_ENV):
        mp.delenv(var, raising=False)
    mp.setenv("TOKENIZERS_PARALLELISM", "false")
    mp.setenv("MLFLOW_ENABLE_TELEMETRY", "false")
