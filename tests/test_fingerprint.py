"""The comparability id the gate compares: equal only when the task ids, the pool file's contents,
the evaluation seed and the code that produces outcomes are all equal (issue 7: it used to hash
the pool's name and the task ids only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rl_conductor import fingerprint
from rl_conductor.fingerprint import code_version, evaluation_id, pool_fingerprint
from rl_conductor.pipeline import steps
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.pool import builtin_pool_dir

IDS = ["math/1", "code/7", "mmlu/3"]


def _copy_pool(tmp_path: Path, name: str, **changes: object) -> str:
    cfg = yaml.safe_load((builtin_pool_dir() / "paper-sim.yaml").read_text())
    cfg["workers"][0].update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_same_world_same_id_whatever_the_order() -> None:
    first = evaluation_id(IDS, "paper-sim", seed=0)
    assert first == evaluation_id(reversed(IDS), "paper-sim", seed=0)
    assert first.startswith("paper-sim-n3-")


def test_each_ingredient_changes_the_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = evaluation_id(IDS, "paper-sim", seed=0)
    assert evaluation_id(IDS[:2], "paper-sim", seed=0) != base  # task ids
    assert evaluation_id(IDS, "paper-sim", seed=1) != base  # evaluation seed
    assert evaluation_id(IDS, "routellm-replay", seed=0) != base  # another pool
    # the same file contents under another path hash alike; a changed price does not
    same = _copy_pool(tmp_path, "copy")
    dearer = _copy_pool(tmp_path, "dearer", price_out=99.0)
    assert pool_fingerprint(same) == pool_fingerprint("paper-sim")
    assert pool_fingerprint(dearer) != pool_fingerprint("paper-sim")
    assert evaluation_id(IDS, dearer, seed=0).startswith("dearer-n3-")
    # code that produces outcomes
    monkeypatch.setattr(fingerprint, "code_version", lambda: "0.0.0+other")
    assert evaluation_id(IDS, "paper-sim", seed=0) != base


def test_code_version_covers_the_simulated_workers_and_graders() -> None:
    version = code_version()
    assert version.startswith("0.") and "+" in version
    assert "workers" in fingerprint.OUTCOME_SOURCES and "tasks/graders.py" in fingerprint.OUTCOME_SOURCES


def test_pipeline_test_split_id_is_the_evaluation_id() -> None:
    tasks = load_tasks("paper-mix", "test", limit=5, seed=0)
    ids = [t.id for t in tasks]
    assert steps.test_split_id(tasks, "paper-sim") == evaluation_id(ids, "paper-sim", seed=0)
    assert steps.test_split_id(tasks, "paper-sim", seed=3) == evaluation_id(ids, "paper-sim", seed=3)
