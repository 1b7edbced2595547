"""``conductor compare`` over a grid of one extra point, as the budget and deadline tests run it
(tests/test_report.py, tests/test_deadline_planning.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rl_conductor.cli import app


def compare_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, axis: str, point: str, *extra: str
) -> tuple[Any, list[dict[str, Any]]]:
    """Run ``compare`` on 6 paper-sim questions with two baselines (single:gpt-5, moa) at
    ``--{axis}s none,{point}`` (plus ``extra`` options); check that it succeeded and that its
    rows hold each policy at each point, in order. Returns the CLI result and the rows."""
    monkeypatch.setattr("rl_conductor.evaluation.suite.baseline_specs", lambda pool: ["single:gpt-5", "moa"])
    out = tmp_path / "cmp.json"
    grid = [f"--{axis}s", f"none,{point}"]
    args = ["compare", "--pool", "paper-sim", "--limit", "6", *grid, "--json", str(out), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"the same questions under each {axis}" in result.output
    rows: list[dict[str, Any]] = json.loads(out.read_text())["results"]
    assert [(r["policy"], r[axis]) for r in rows] == [
        ("single:gpt-5", "none"),
        ("moa", "none"),
        ("single:gpt-5", point),
        ("moa", point),
    ]
    return result, rows
