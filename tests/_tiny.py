"""One trained micro Conductor per test session, shared by the training, policy and serving tests.

Why it exists: even the smallest Conductor takes tens of seconds to bootstrap, warm-start and
GRPO-train on two CPU cores, so the whole test session trains exactly one (cached in this
module, whichever test file asks first) and every test reads the folder it produced.

What it deliberately simplifies: the micro model (64 hidden units, 2 layers, a 1024-token
vocabulary) learns only the output format. Its workflows have at most 2 steps (short enough
for 48 completion tokens) and GRPO samples at temperature 0.5, so that a few of each group's
completions parse and the rewards of a group differ: with identical rewards GRPO's advantages
are all zero and no parameter would move, whatever the code did. Tests that must not mutate the
shared folder copy it first.
"""

from __future__ import annotations

import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rl_conductor.training.config import MICRO_SETTINGS, TrainConfig

#: The micro training run (see module docstring); ``micro_config`` adds paths and overrides.
MICRO: dict[str, Any] = {
    **MICRO_SETTINGS,
    # random-workflow SFT: varied plans keep GRPO's group rewards apart (see module docstring);
    # the expected-best warm start is tested in test_warmstart.py
    "sft_targets": "random",
    "mlflow_experiment": "micro-training",
}


def micro_config(tracking_uri: str, **overrides: Any) -> TrainConfig:
    return TrainConfig(**{**MICRO, "mlflow_tracking_uri": tracking_uri, **overrides})


def assert_refused_without(final: Path, file: str, match: str, tmp_path: Path) -> None:
    """A copy of the trained folder ``final`` (under ``tmp_path``) without ``file`` fails to load
    as a Conductor with ModelNotFound, its message matching ``match``."""
    from rl_conductor.errors import ModelNotFound
    from rl_conductor.policies.conductor import ConductorPolicy

    broken = tmp_path / "broken"
    shutil.copytree(final, broken)
    (broken / file).unlink()
    with pytest.raises(ModelNotFound, match=match):
        ConductorPolicy(broken)


@dataclass(frozen=True)
class Micro:
    """Where the session's micro training run landed."""

    out: Path
    config: TrainConfig
    result: Any  # rl_conductor.training.train.TrainResult
    tracking_uri: str
    home: Path  # CONDUCTOR_HOME during training (MLflow artifacts went under it)

    @property
    def final_dir(self) -> Path:
        return self.out / "final"


_CACHE: dict[str, Micro] = {}


def trained_micro(tmp_path_factory: pytest.TempPathFactory, mlflow_db_template: Path) -> Micro:
    """Train the micro Conductor once per session (later calls return the cached run).

    The run logs to its own sqlite copy of the migrated MLflow template, with ``CONDUCTOR_HOME``
    pointed at a temporary folder; MLflow's global tracking URI is restored afterwards. Under
    pytest-xdist the workers share one run: the first to ask trains it in the session's common
    temporary folder under a file lock, the others wait for it and read the same folder.
    """
    if "micro" in _CACHE:
        return _CACHE["micro"]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        from filelock import FileLock

        shared = tmp_path_factory.getbasetemp().parent / "micro-shared"
        with FileLock(f"{shared}.lock"):
            done = shared / "micro.pickle"
            if not done.is_file():
                micro = _train_micro(shared, mlflow_db_template)
                done.write_bytes(pickle.dumps(micro))
            _CACHE["micro"] = pickle.loads(done.read_bytes())
        return _CACHE["micro"]
    _CACHE["micro"] = _train_micro(tmp_path_factory.mktemp("micro"), mlflow_db_template)
    return _CACHE["micro"]


def _train_micro(root: Path, mlflow_db_template: Path) -> Micro:
    import mlflow

    from rl_conductor.tracking import mlflow_utils
    from rl_conductor.training.train import train

    root.mkdir(parents=True, exist_ok=True)
    db = root / "mlflow.db"
    shutil.copyfile(mlflow_db_template, db)
    uri = f"sqlite:///{db}"
    cfg = micro_config(uri)
    previous_uri, previous_registry = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    previous_home = os.environ.get(mlflow_utils.HOME_ENV)
    os.environ[mlflow_utils.HOME_ENV] = str(root / "home")
    try:
        result = train(cfg, root / "out", progress=False)
    finally:
        if previous_home is None:
            os.environ.pop(mlflow_utils.HOME_ENV, None)
        else:
            os.environ[mlflow_utils.HOME_ENV] = previous_home
        mlflow_utils.reset()
        mlflow.set_tracking_uri(previous_uri)
        mlflow.set_registry_uri(previous_registry)
    return Micro(out=root / "out", config=cfg, result=result, tracking_uri=uri, home=root / "home")
