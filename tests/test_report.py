"""Report views: what a policy does (workers called, steps, verify rate, workflow shapes, per
domain), the same questions under budgets side by side, and ``conductor compare --budgets``."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from _compare import compare_grid
from rl_conductor.cli import app
from rl_conductor.evaluation.report import (
    behaviour_markdown,
    behaviour_rows,
    behaviour_table,
    budget_markdown,
    budget_plot,
    budget_rows,
    parse_budgets,
)
from rl_conductor.evaluation.runner import evaluate, workflow_shape
from rl_conductor.limits import RequestLimits
from rl_conductor.pipeline.report import markdown_report
from rl_conductor.policies.baselines import MixtureOfAgents, SelfConsistency, SingleWorker
from rl_conductor.tasks.base import Task
from rl_conductor.trace import StepRecord
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool


def _step(index: int, worker: str, visible: list[int]) -> StepRecord:
    return StepRecord(index=index, worker=worker, instruction="x", visible=visible)


def test_workflow_shape_names_workers_and_what_each_step_saw() -> None:
    assert workflow_shape([_step(0, "gemini", [])]) == "gemini"
    assert workflow_shape([_step(0, "gpt-5", []), _step(1, "claude", [0])]) == "gpt-5→claude(all)"
    moa = [_step(0, "a", []), _step(1, "b", []), _step(2, "c", []), _step(3, "a", [0, 1, 2])]
    assert workflow_shape(moa) == "a→b→c→a(all)"
    partial = [_step(0, "a", []), _step(1, "b", []), _step(2, "c", [1])]
    assert workflow_shape(partial) == "a→b→c(1)"
    assert workflow_shape([_step(i, "a", []) for i in range(5)]) == "5×a"
    assert workflow_shape([]) == "(none)"
    assert workflow_shape([_step(0, "", [])]) == "(skipped)"  # never reached a worker


def _pool() -> Pool:
    workers = [
        FakeWorker(info=fake_info(name, price_in=p / 4, price_out=p), answer=ans)
        for name, p, ans in (
            ("cheap", 1.0, "\\boxed{8}"),
            ("mid", 5.0, "\\boxed{7}"),
            ("dear", 20.0, "\\boxed{7}"),
        )
    ]
    return Pool(name="fake", workers=list(workers))


def _tasks() -> list[Task]:
    return [
        Task(id=f"{d}/{i}", question="What is 3 + 4?", answer="7", domain=d, source="t", grader="math")
        for d in ("math", "knowledge")
        for i in range(2)
    ]


def test_summary_shows_a_collapse_and_a_composition_at_a_glance() -> None:
    view = _pool().view()
    single = evaluate(SingleWorker("mid"), view, _tasks(), progress=False).summary()
    assert single["worker_shares"] == {"mid": 1.0} and single["shapes"] == {"mid": 1.0}
    assert single["verify_rate"] == 0.0 and single["by_domain"]["math"]["worker_shares"] == {"mid": 1.0}
    moa = evaluate(MixtureOfAgents(["cheap", "mid"], "dear"), view, _tasks(), progress=False).summary()
    assert moa["verify_rate"] == 1.0 and moa["mean_steps"] == 3.0
    assert moa["shapes"] == {"cheap→mid→dear(all)": 1.0}
    assert moa["worker_shares"] == pytest.approx({"cheap": 1 / 3, "mid": 1 / 3, "dear": 1 / 3})
    sc = evaluate(SelfConsistency("cheap", 3), view, _tasks(), progress=False).summary()
    assert sc["shapes"] == {"3×cheap": 1.0} and sc["verify_rate"] == 0.0

    rows = behaviour_rows([single, moa])
    assert [r[:2] for r in rows] == [
        ["single:mid", "all"],
        ["single:mid", "knowledge"],
        ["single:mid", "math"],
        ["moa:cheap,mid>dear", "all"],
        ["moa:cheap,mid>dear", "knowledge"],
        ["moa:cheap,mid>dear", "math"],
    ]
    assert rows[0][2:] == ["4", "100.0", "1.00", "0.0", "mid 100%", "mid 100%"]
    assert rows[3][5:] == ["100.0", "cheap 33%, mid 33%, dear 33%", "cheap→mid→dear(all) 100%"]
    text = behaviour_markdown([moa])
    assert text.startswith("| policy | domain | n | acc % | steps | verify % |")
    console = Console(width=200, record=True)
    console.print(behaviour_table([single]))
    assert "mid 100%" in console.export_text()


def test_parse_budgets() -> None:
    assert parse_budgets("none,0.002") == [None, 0.002]
    assert parse_budgets(" 0.01 , none, 0.01") == [0.01, None]
    for bad in ("nan", "-1", "0", "inf", "cheap", ","):
        with pytest.raises(ValueError):
            parse_budgets(bad)


def test_budget_views_side_by_side(tmp_path: Path) -> None:
    view = _pool().view()
    summaries = []
    for budget, limits in (("none", RequestLimits()), ("0.0001", RequestLimits(max_cost_usd=0.0001))):
        s = evaluate(SingleWorker("dear"), view, _tasks(), limits, progress=False).summary()
        s["budget"] = budget
        summaries.append(s)
    heads, rows = budget_rows(summaries)
    assert heads[:4] == ["policy", "acc % @none", "cost $ @none", "workers @none"]
    assert heads[4:] == ["acc % @0.0001", "cost $ @0.0001", "workers @0.0001"]
    (row,) = rows
    assert row[0] == "single:dear" and row[1] == "100.0" and row[3] == "dear 100%"
    assert float(row[5]) <= 0.0001  # the executor kept the budget
    assert "| single:dear |" in budget_markdown(summaries)
    png = budget_plot(summaries, tmp_path / "b.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    report = markdown_report(summaries[:1], {"pool": "fake", "n": 4}, budget_summaries=summaries[1:])
    assert "## What each policy does" in report and "## Under a budget" in report
    assert "acc % @0.0001" in report


def test_compare_runs_the_same_questions_under_each_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, rows = compare_grid(tmp_path, monkeypatch, "budget", "0.002", "--plot", str(tmp_path / "b.png"))
    assert "what each policy does" in result.output
    assert all(r["mean_cost_usd"] <= 0.002 for r in rows if r["budget"] == "0.002")
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    bad = CliRunner().invoke(app, ["compare", "--limit", "2", "--budgets", "none,nan"])
    assert bad.exit_code != 0 and "budget" in bad.output


def test_the_table_off_a_terminal_cuts_no_figure(capsys: pytest.CaptureFixture[str]) -> None:
    """Redirected to a file, a comparison with long policy names (a cascade's name is its workers)
    printed its figures as ``0.000…`` in a fixed 130 columns (an outside tester's eval log)."""
    from rl_conductor.evaluation.report import print_table

    row = {"n": 785, "accuracy": 0.8484, "mean_tokens": 1234, "mean_cost_usd": 0.000313, "mean_calls": 2.2,
           "p50_latency_s": 3.1, "p95_latency_s": 9.9, "mean_reward": 0.9201, "failed_call_rate": 0.008,
           "multi_round_rate": 0.2, "evidence_agreement": 0.5}  # fmt: skip
    names = ["cascade:qwen2.5-coder-32b,deepseek-v3>gpt-4.1", "conductor:/tmp/some/long/run/folder/final"]
    print_table([{**row, "policy": n} for n in names], title="pool / recordings / test")
    out = capsys.readouterr().out
    assert "…" not in out and all(n in out for n in names)
    assert "0.00031" in out and "0.9201" in out and "84.8" in out
