"""Paired comparisons (evaluation/paired.py): one policy minus another on the same questions, with
a 95 % bootstrap interval, in ``conductor eval`` / ``compare`` and their JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rl_conductor.cli import app
from rl_conductor.evaluation.paired import (
    UnpairedError,
    paired_difference,
    paired_rows,
    question_columns,
    verdict,
)
from rl_conductor.evaluation.runner import Record

SIX = "gsm8k-six"


def _summary(
    policy: str, ids: list[str], correct: list[int], reward: list[float], cost: list[float]
) -> dict[str, Any]:
    return {
        "policy": policy,
        "questions": {"task_id": ids, "correct": correct, "reward": reward, "cost_usd": cost},
    }


def test_the_difference_is_taken_question_by_question_whatever_the_order() -> None:
    ids = [f"q{i}" for i in range(40)]
    rng = np.random.default_rng(3)
    hard = rng.random(40) < 0.5  # shared difficulty: both fail the hard questions
    a_right = (~hard).astype(int)
    a_right[:6] = 1  # a also gets six hard ones
    b_right = (~hard).astype(int)
    a = _summary("a", ids, a_right.tolist(), a_right.astype(float).tolist(), [0.001] * 40)
    order = rng.permutation(40)
    b = _summary(
        "b",
        [ids[i] for i in order],
        b_right[order].tolist(),
        b_right[order].astype(float).tolist(),
        [0.002] * 40,
    )
    row = paired_difference(a, b)
    won = int(((a_right == 1) & (b_right == 0)).sum())
    assert row["n"] == 40 and row["only_a_right"] == won and row["only_b_right"] == 0
    assert row["reward"]["diff"] == pytest.approx(won / 40)
    assert row["accuracy_points"]["diff"] == pytest.approx(100 * won / 40)
    assert row["cost_usd"]["diff"] == pytest.approx(-0.001)
    lo, hi = row["reward"]["ci95"]
    assert lo <= won / 40 <= hi
    # paired: the shared difficulty cancels, so the interval is far tighter than the unpaired one
    unpaired_se = np.sqrt(a_right.var() / 40 + b_right.var() / 40)
    assert hi - lo < 2 * 1.96 * unpaired_se
    assert paired_difference(a, b) == row  # seeded: reproducible


def test_a_tie_an_ahead_and_a_behind_are_told_apart() -> None:
    ids = [f"q{i}" for i in range(200)]
    same = _summary("same", ids, [1, 0] * 100, [1.0, 0.0] * 100, [0.0] * 200)
    better = _summary("better", ids, [1] * 200, [1.0] * 200, [0.0] * 200)
    noisy = _summary("noisy", ids, [0, 1] * 100, [0.0, 1.0] * 100, [0.0] * 200)
    assert verdict(paired_difference(better, same)) == "ahead"
    assert verdict(paired_difference(same, better)) == "behind"
    assert verdict(paired_difference(same, noisy)) == "tie"  # same mean, every question differs


def test_summaries_of_other_questions_are_refused() -> None:
    a = _summary("a", ["q1", "q2"], [1, 0], [1.0, 0.0], [0.0, 0.0])
    b = _summary("b", ["q1", "q3"], [1, 0], [1.0, 0.0], [0.0, 0.0])
    with pytest.raises(UnpairedError, match="not evaluated on the same questions"):
        paired_difference(a, b)
    with pytest.raises(UnpairedError, match="no per-question"):
        paired_difference(a, {"policy": "c"})
    dup = _summary("d", ["q1", "q1"], [1, 0], [1.0, 0.0], [0.0, 0.0])
    with pytest.raises(UnpairedError):
        paired_difference(dup, _summary("e", ["q1", "q2"], [1, 0], [1.0, 0.0], [0.0, 0.0]))


def test_rows_leave_out_the_reference_and_summaries_without_questions() -> None:
    ids = ["q1", "q2", "q3"]
    ref = _summary("ref", ids, [1, 1, 0], [1.0, 1.0, 0.0], [0.0] * 3)
    rows = paired_rows(
        [ref, _summary("x", ids, [1, 0, 0], [1.0, 0.0, 0.0], [0.0] * 3), {"policy": "y"}, ref], "ref"
    )
    assert [r["against"] for r in rows] == ["x"] and rows[0]["verdict"] == "too few questions"
    assert paired_rows([ref], "missing") == []


def test_no_verdict_on_a_handful_of_questions_and_none_on_no_question() -> None:
    # one question that A gets right and B wrong: a zero-width interval, not a win
    one = paired_difference(_summary("a", ["q"], [1], [1.0], [0.0]), _summary("b", ["q"], [0], [0.0], [0.0]))
    assert one["reward"]["ci95"] == [1.0, 1.0] and verdict(one) == "too few questions"
    none = paired_difference(_summary("a", [], [], [], []), _summary("b", [], [], [], []))
    assert none["n"] == 0 and verdict(none) == "too few questions"


def test_question_columns_keep_each_questions_outcome() -> None:
    recs = [
        Record("t1", "math", True, 10, 0.001, 1, 1, 0.1, reward=0.97),
        Record("t2", "code", False, 20, 0.002, 1, 1, 0.1, reward=-0.06),
    ]
    cols = question_columns(recs)
    assert cols == {
        "task_id": ["t1", "t2"],
        "correct": [1, 0],
        "reward": [0.97, -0.06],
        "cost_usd": [0.001, 0.002],
    }


def test_eval_with_two_policies_prints_and_writes_the_paired_difference(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    res = CliRunner().invoke(
        app,
        ["eval", "--pool", SIX, "--limit", "30", "--policy", "single:gpt-4-1106-preview",
         "--policy", "single:mixtral-8x7b-instruct", "--cost-weight", "0.13", "--json", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "single:gpt-4-1106-preview minus each policy" in res.output
    payload = json.loads(out.read_text())
    (row,) = payload["paired"]
    gpt4, mixtral = payload["results"]
    assert row["policy"] == gpt4["policy"] and row["against"] == mixtral["policy"] and row["n"] == 30
    assert len(gpt4["questions"]["task_id"]) == 30
    diff = np.mean(gpt4["questions"]["reward"]) - np.mean(mixtral["questions"]["reward"])
    assert row["reward"]["diff"] == pytest.approx(diff)
    assert row["reward"]["diff"] == pytest.approx(gpt4["mean_reward"] - mixtral["mean_reward"])


def _at(policy: str, n: int, right: int, cost: float) -> dict[str, Any]:
    ids = [f"q{i}" for i in range(n)]
    correct = [1] * right + [0] * (n - right)
    return _summary(policy, ids, correct, [float(c) for c in correct], [cost] * n)


def test_equal_cost_is_the_accuracy_above_the_frontier_at_the_same_cost() -> None:
    from rl_conductor.evaluation.paired import equal_cost_difference

    cheap, dear = _at("cheap", 100, 50, 0.0), _at("dear", 100, 90, 1.0)
    # halfway in cost the frontier (mixing cheap and dear) reaches 70 %: 80 % is 10 points above
    row = equal_cost_difference(_at("mine", 100, 80, 0.5), [cheap, dear], family="knn")
    assert row["hull_accuracy"] == pytest.approx(0.70) and row["points"] == 2 and row["against"] == "knn"
    assert row["accuracy_points"]["diff"] == pytest.approx(10.0)
    lo, hi = row["accuracy_points"]["ci95"]
    assert lo < 10.0 < hi and lo > 0  # ahead, and the interval is not a point
    # a point that dominates the reference puts it behind
    better = _at("better", 100, 95, 0.4)
    behind = equal_cost_difference(_at("mine", 100, 80, 0.5), [cheap, dear, better])
    assert behind["accuracy_points"]["diff"] < 0 and verdict(behind, "accuracy_points") == "behind"
    # cheaper than every point: compared with the cheapest point (the frontier's credit), and said
    alone = equal_cost_difference(_at("mine", 100, 80, 0.0), [_at("x", 100, 50, 0.1)])
    assert alone["below_frontier"] and alone["hull_accuracy"] == pytest.approx(0.5)
    assert alone["accuracy_points"]["diff"] == pytest.approx(30.0)


def test_every_bootstrap_draw_counts_when_the_reference_costs_about_the_cheapest_points_cost() -> None:
    """The reference's right answers are cheap and its wrong ones dear, and its mean cost is the
    cheapest point's: the draws with more right answers fall below every point. The first version
    dropped them, which cut the interval's top (48.3 for a point estimate of 40, bottom 22.5)."""
    from rl_conductor.evaluation.paired import equal_cost_difference

    n, right = 60, [1] * 48 + [0] * 12
    ids = [f"q{i}" for i in range(n)]
    mine = _summary("mine", ids, right, [0.0] * n, [0.5 if r else 3.0 for r in right])
    cheap = _summary("cheap", ids, [1] * 24 + [0] * 36, [0.0] * n, [1.0] * n)
    dear = _summary("dear", ids, [1] * 54 + [0] * 6, [0.0] * n, [3.0] * n)
    row = equal_cost_difference(mine, [cheap, dear])
    lo, hi = row["accuracy_points"]["ci95"]
    assert row["accuracy_points"]["diff"] == pytest.approx(40.0) and not row["below_frontier"]
    assert hi - 40.0 > 0.6 * (40.0 - lo)  # both tails: 51.7 and 24.3 here


def test_compare_traces_a_frontier_and_checks_its_options(tmp_path: Path) -> None:
    runner = CliRunner()
    alone = runner.invoke(app, ["compare", "--pool", SIX, "--limit", "5", "--frontier", "knn"])
    assert alone.exit_code == 2 and "needs a --policy" in alone.output
    bad = runner.invoke(app, ["compare", "--pool", SIX, "--limit", "5", "--policy", "knn",
                              "--frontier", "knn", "--frontier-weights", "0,-1"])  # fmt: skip
    assert bad.exit_code == 2 and "--frontier-weights" in bad.output
    typo = runner.invoke(app, ["compare", "--pool", SIX, "--policy", "knn", "--frontier", "knnn"])
    assert typo.exit_code == 2 and "unknown policy 'knnn'" in typo.output
    oracle = runner.invoke(app, ["compare", "--pool", SIX, "--policy", "knn", "--frontier", "oracle"])
    assert oracle.exit_code == 2 and "does not change with the cost weight" in " ".join(oracle.output.split())
    # a family that fails only once built (no saved router there) loses none of the comparison's results
    kept = tmp_path / "kept.json"
    lost = runner.invoke(app, ["compare", "--pool", SIX, "--limit", "3", "--policy",
                               "single:mixtral-8x7b-instruct", "--frontier", f"knn:{tmp_path / 'nope'}",
                               "--frontier-weights", "0", "--no-behaviour", "--json", str(kept)])  # fmt: skip
    assert lost.exit_code == 2 and "no saved router at" in " ".join(lost.output.split())
    assert json.loads(kept.read_text())["results"][-1]["policy"] == "single:mixtral-8x7b-instruct"
    out = tmp_path / "c.json"
    res = runner.invoke(app, ["compare", "--pool", SIX, "--limit", "20", "--policy", "domain-router",
                              "--frontier", "knn", "--frontier-weights", "0,0.13,1", "--cost-weight", "0.13",
                              "--no-behaviour", "--json", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "accuracy at equal cost" in res.output
    payload = json.loads(out.read_text())
    (row,) = payload["equal_cost"]
    assert row["against"] == "knn (+ single workers)" and row["points"] == 3 + 6 and row["n"] == 20
    assert [s["frontier_weight"] for s in payload["frontier"]["knn"]] == [0.0, 0.13, 1.0]
    ids = payload["results"][0]["questions"]["task_id"]
    assert all(s["questions"]["task_id"] == ids for s in payload["frontier"]["knn"])  # the same questions


def test_under_budgets_the_frontier_runs_at_the_budget_its_reference_ran_at(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    res = CliRunner().invoke(app, ["compare", "--pool", SIX, "--limit", "20", "--budgets", "0.0003,none",
                                   "--policy", "domain-router", "--frontier", "knn", "--frontier",
                                   "domain-router", "--frontier-weights", "0,1", "--cost-weight", "0.13",
                                   "--no-behaviour", "--json", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "domain-router (at budget 0.0003) minus each policy" in " ".join(res.output.split())
    payload = json.loads(out.read_text())
    assert [r["against"] for r in payload["equal_cost"]] == [
        "knn (+ single workers)",
        "domain-router (+ single workers)",
    ]
    for runs in payload["frontier"].values():
        for s in runs:  # run under the reference's budget, as the singles of its point were
            assert max(s["questions"]["cost_usd"]) <= 0.0003 + 1e-12 and s["budget"] == "0.0003"
    assert all(r["budget"] == "0.0003" for r in [*payload["paired"], *payload["equal_cost"]])
    old = CliRunner().invoke(
        app, ["compare", "--pool", SIX, "--policy", "knn", "--frontier", "knn,domain-router"]
    )
    assert old.exit_code == 2 and "give --frontier once per family" in " ".join(old.output.split())


def test_a_title_naming_a_policy_is_not_read_as_an_emoji() -> None:
    from rich.console import Console

    from rl_conductor.evaluation.report import paired_table

    ids = [f"q{i}" for i in range(3)]
    rows = paired_rows([_summary("single:b", ids, [1, 1, 0], [1.0, 1.0, 0.0], [0.0] * 3),
                        _summary("x", ids, [1, 0, 0], [1.0, 0.0, 0.0], [0.0] * 3)], "single:b")  # fmt: skip
    console = Console(record=True, width=200)
    console.print(paired_table(rows, "single:b:"))
    assert "single:b:" in console.export_text()


def test_compare_help_shows_the_frontier_weights_it_uses_without_loading_numpy() -> None:
    import subprocess
    import sys

    from rl_conductor.cli.core import FRONTIER_WEIGHTS_HELP
    from rl_conductor.evaluation.paired import FRONTIER_WEIGHTS

    assert ",".join(f"{w:g}" for w in FRONTIER_WEIGHTS) == FRONTIER_WEIGHTS_HELP
    code = "import sys, rl_conductor.cli.core; print('numpy' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )
