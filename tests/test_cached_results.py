"""The stored results of long computations (tests/cached_results.py) are reused only while every
input they were computed from is unchanged; any change means the test computes in full."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import cached_results
from cached_results import load, refresh

EXECUTOR = "src/rl_conductor/executor.py"


def _store(tmp_path: Path, doc: dict[str, Any]) -> None:
    (tmp_path / "demo.json").write_text(json.dumps(doc))


def _doc() -> dict[str, Any]:
    files = sorted({EXECUTOR, *cached_results.EXTRA, *cached_results._data_files()})
    return {
        "environment": cached_results.environment(),
        "distributions": {"sympy": cached_results.installed()["sympy"]},
        "inputs": cached_results.hashes(files),
        "result": {"x": 1},
    }


def test_a_stored_result_is_reused_only_while_every_input_is_unchanged(tmp_path: Path) -> None:
    doc = _doc()
    _store(tmp_path, doc)
    assert load("demo", tmp_path) == ({"x": 1}, "every input unchanged")

    edited = json.loads(json.dumps(doc))
    edited["inputs"][EXECUTOR] = "0" * 64  # the executor changed since the result was stored
    _store(tmp_path, edited)
    got, why = load("demo", tmp_path)
    assert got is None and EXECUTOR in why

    new_data = json.loads(json.dumps(doc))
    first_data = cached_results._data_files()[0]
    del new_data["inputs"][first_data]  # a data file the stored result did not see
    _store(tmp_path, new_data)
    got, why = load("demo", tmp_path)
    assert got is None and first_data in why

    other_python = json.loads(json.dumps(doc))
    other_python["environment"]["python"] = "3.99.0"
    _store(tmp_path, other_python)
    got, why = load("demo", tmp_path)
    assert got is None and "python" in why

    other_sympy = json.loads(json.dumps(doc))
    other_sympy["distributions"]["sympy"] = "0.0.1"  # computed with another sympy
    _store(tmp_path, other_sympy)
    got, why = load("demo", tmp_path)
    assert got is None and "sympy" in why

    assert load("absent", tmp_path)[0] is None


def test_refresh_records_the_modules_the_computation_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def demo() -> dict[str, Any]:
        import rl_conductor.workflow  # noqa: F401 - imported as the computation would

        return {"v": 1}

    monkeypatch.setitem(cached_results.COMPUTATIONS, "demo", demo)
    path = refresh("demo", tmp_path)
    inputs = json.loads(path.read_text())["inputs"]
    assert "src/rl_conductor/workflow.py" in inputs and "src/rl_conductor/tasks/sandbox_harness.py" in inputs
    assert any(f.startswith("src/rl_conductor/data/") for f in inputs)
    assert set(cached_results.EXTRA_DISTS) <= set(json.loads(path.read_text())["distributions"])
    assert load("demo", tmp_path) == ({"v": 1}, "every input unchanged")


def test_refresh_refuses_when_an_input_changes_while_it_computes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file edited during a refresh (minutes long) must not be recorded as what the result was
    computed from: nothing is stored."""
    package = tmp_path / "src" / "rl_conductor"
    for rel in (*cached_results.EXTRA, "src/rl_conductor/data/items.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("before\n")
    for name in cached_results.DATA_DIRS:
        (package / name).mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(cached_results, "ROOT", tmp_path)
    monkeypatch.setattr(cached_results, "PACKAGE", package)

    def edits_its_data() -> dict[str, Any]:
        (package / "data" / "items.jsonl").write_text("after\n")
        return {"v": 1}

    monkeypatch.setitem(cached_results.COMPUTATIONS, "demo", edits_its_data)
    with pytest.raises(SystemExit, match="changed while computing"):
        refresh("demo", tmp_path / "store")
    assert not (tmp_path / "store" / "demo.json").exists()
