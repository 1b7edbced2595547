"""The deadline beyond the executor: the Conductor's prompt carries it (and nothing changes without
one), training can draw deadlines, the reward penalises a workflow the deadline cut short, and
``conductor compare --deadlines`` shows accuracy under each deadline (table, JSON, PNG)."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from _compare import compare_grid
from rl_conductor.cli import app
from rl_conductor.errors import ConfigError
from rl_conductor.evaluation.report import (
    deadline_markdown,
    deadline_plot,
    deadline_rows,
    parse_deadlines,
)
from rl_conductor.evaluation.runner import evaluate
from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.baselines import SingleWorker
from rl_conductor.policies.catalog import make_policy
from rl_conductor.prompting import conductor_prompt, template
from rl_conductor.reward import (
    REWARD_PRESETS,
    RewardConfig,
    deadline_shortened,
    deadline_stopped,
    trace_reward,
)
from rl_conductor.tasks.base import Task
from rl_conductor.training.config import TrainConfig
from rl_conductor.training.deadlines import draw_deadline
from rl_conductor.workers.base import WorkerInfo
from rl_conductor.workers.fake import FakeWorker
from rl_conductor.workers.pool import Pool, load_pool
from rl_conductor.workflow import Step, Workflow

TASK = Task(id="t1", question="What is 6*7?", answer="42", domain="math", source="x", grader="math")


def _slow_pool() -> Pool:
    """Two fake workers taking 0.1 s and 0.4 s, each stating that latency model."""

    def worker(name: str, secs: float) -> FakeWorker:
        info = WorkerInfo(
            name=name, price_in=1, price_out=2, kind="fake", hosting="external", ttft_s=secs, tokens_per_s=1e6
        )
        return FakeWorker(info=info, answer="42", latency_s=secs)

    return Pool(name="slow", workers=[worker("fast", 0.1), worker("slow", 0.4)])


# -- prompt -------------------------------------------------------------------------------------


def _old_prompt(view_pool: Pool, limits: RequestLimits) -> str:
    """The prompt as it was before deadlines existed (what trained models saw)."""
    lines = []
    for i, info in enumerate(view_pool.view().infos()):
        where = "self-hosted" if info.hosting == "self" else "external"
        lines.append(f"{i}: {info.description or 'general assistant'} ({info.price_tier()}, {where})")
    budget = "" if limits.max_cost_usd is None else f"Budget: ${limits.max_cost_usd:.3f} for all calls.\n"
    return template().format(
        max_steps=limits.max_steps, workers="\n".join(lines), budget=budget, question=TASK.question
    )


@pytest.mark.parametrize(
    "limits", [RequestLimits(), RequestLimits(max_cost_usd=0.01), RequestLimits(max_rounds=2)]
)
def test_prompt_without_a_deadline_is_byte_identical_to_before(limits: RequestLimits) -> None:
    pool = load_pool("paper-sim")
    assert conductor_prompt(TASK, pool.view(), limits) == _old_prompt(pool, limits)


def test_prompt_carries_the_deadline_and_each_workers_typical_time() -> None:
    pool = load_pool("paper-sim")
    without = conductor_prompt(TASK, pool.view(), RequestLimits(max_cost_usd=0.01))
    with_deadline = conductor_prompt(TASK, pool.view(), RequestLimits(max_cost_usd=0.01, max_latency_s=15))
    assert "Deadline" not in without and "Deadline: 15 s for the whole workflow" in with_deadline
    assert (
        with_deadline.index("Budget:") < with_deadline.index("Deadline:") < with_deadline.index("Question:")
    )
    worker_lines = [ln for ln in with_deadline.splitlines() if ln[:1].isdigit() and ": " in ln]
    assert len(worker_lines) == len(pool.workers)
    assert all(", ~" in ln and ln.endswith((" s)", " s, too slow)")) for ln in worker_lines)


def test_prompt_flags_the_workers_a_budget_cannot_afford_a_typical_answer_of() -> None:
    from rl_conductor.prompting import typical_cost

    pool = load_pool("paper-sim")

    def flagged(limits: RequestLimits) -> set[int]:
        lines = [ln for ln in conductor_prompt(TASK, pool.view(), limits).splitlines() if ln[:1].isdigit()]
        return {int(ln.split(":")[0]) for ln in lines if ln.endswith(", over budget)")}

    infos = pool.view().infos()
    dear = {i for i, info in enumerate(infos) if typical_cost(info) > 0.002}
    assert flagged(RequestLimits()) == set() and flagged(RequestLimits(max_cost_usd=1.0)) == set()
    assert flagged(RequestLimits(max_cost_usd=0.002)) == dear
    assert dear and len(dear) < len(infos)  # the frontier workers, not the open ones
    both = conductor_prompt(TASK, pool.view(), RequestLimits(max_cost_usd=0.002, max_latency_s=15))
    assert any(ln.endswith(" s, over budget)") for ln in both.splitlines())


def test_prompt_flags_the_workers_too_slow_for_the_deadline() -> None:
    from rl_conductor.prompting import typical_seconds

    pool = load_pool("paper-sim")
    infos = pool.view().infos()

    def flagged(limits: RequestLimits) -> set[int]:
        lines = [ln for ln in conductor_prompt(TASK, pool.view(), limits).splitlines() if ln[:1].isdigit()]
        return {int(ln.split(":")[0]) for ln in lines if ", too slow" in ln}

    secs = [typical_seconds(i) or 0.0 for i in infos]
    assert flagged(RequestLimits()) == set() and flagged(RequestLimits(max_cost_usd=0.002)) == set()
    assert flagged(RequestLimits(max_latency_s=1000)) == set()
    assert flagged(RequestLimits(max_latency_s=0.5)) == set(range(len(infos)))
    assert flagged(RequestLimits(max_latency_s=15)) == {i for i, x in enumerate(secs) if x > 15}
    assert 0 < len(flagged(RequestLimits(max_latency_s=15))) < len(infos)  # the reasoning models only
    both = conductor_prompt(TASK, pool.view(), RequestLimits(max_cost_usd=0.002, max_latency_s=15))
    assert any(ln.endswith(" s, too slow)") for ln in both.splitlines())


# -- training draws ------------------------------------------------------------------------------


def test_draw_deadline_zero_fraction_draws_nothing_and_ranges_hold() -> None:
    rng = random.Random(1)
    state = rng.getstate()
    assert all(draw_deadline(rng, 0.0, [5, 60]) is None for _ in range(50))
    assert rng.getstate() == state  # the recipe without deadlines draws the same prompts as before
    draws = [draw_deadline(random.Random(i), 1.0, [5, 60]) for i in range(400)]
    assert all(d is not None and 5 <= d <= 60 for d in draws)
    short = sum(d is not None and d < 5 * (60 / 5) ** 0.5 for d in draws)
    assert 120 < short < 280  # log-uniform: half the draws below the geometric midpoint
    share = sum(draw_deadline(random.Random(i), 0.3, [5, 60]) is not None for i in range(1000))
    assert 220 < share < 380
    for bad in ([5], [60, 5], [0, 5], [5, float("inf")], ["a", 5]):
        with pytest.raises(ConfigError, match="deadline_range_s"):
            draw_deadline(random.Random(0), 0.5, bad)


def test_train_config_deadline_fields_default_off_and_are_checked() -> None:
    cfg = TrainConfig()
    assert cfg.deadline_fraction == 0.0 and cfg.deadline_range_s == [5.0, 60.0]
    with pytest.raises(ConfigError, match="deadline_fraction"):
        TrainConfig(deadline_fraction=1.5)
    with pytest.raises(ConfigError, match="deadline_range_s"):
        TrainConfig(deadline_range_s=[10.0, 1.0])


# -- reward --------------------------------------------------------------------------------------


def test_reward_penalises_a_workflow_the_deadline_cut() -> None:
    wf = Workflow(steps=[Step(1, "solve", ()), Step(0, "check", "all")])
    view = _slow_pool().view()
    cut = asyncio.run(execute(wf, TASK, view, RequestLimits(max_latency_s=0.51)))
    whole = asyncio.run(execute(wf, TASK, view, RequestLimits(max_latency_s=10)))
    assert [s.status for s in cut.steps] == ["ok", "skipped_deadline"] and deadline_stopped(cut)
    assert [s.status for s in whole.steps] == ["ok", "ok"] and not deadline_stopped(whole)
    cfg = RewardConfig()
    assert cfg.deadline_penalty == cfg.budget_penalty  # documented default
    # the cut trace without its skipped step: the same calls and cost, no deadline stop
    ran = replace(cut, steps=[s for s in cut.steps if s.status != "skipped_deadline"])
    assert ran.cost_usd == cut.cost_usd and not deadline_stopped(ran)
    assert trace_reward(cut, True, cfg) == pytest.approx(trace_reward(ran, True, cfg) - cfg.deadline_penalty)
    paper = REWARD_PRESETS["paper"]
    assert trace_reward(cut, True, paper) == trace_reward(ran, True, paper)


def test_a_capped_answer_counts_as_shortened_but_is_not_penalised_as_skipped() -> None:
    info = WorkerInfo(
        name="steady", price_in=1, price_out=2, hosting="external", kind="fake", ttft_s=0.1, tokens_per_s=1000
    )
    worker = FakeWorker(info=info, answer="42", latency_s=0.1, output_tokens=1000)
    view = Pool(name="one", workers=[worker]).view()
    wf = Workflow(steps=[Step(0, "solve", ())])
    capped = asyncio.run(execute(wf, TASK, view, RequestLimits(max_latency_s=1.0)))  # 0.7 s -> 700 tokens
    assert capped.steps[0].status == "ok" and "deadline: output capped at 700 tokens" in capped.steps[0].note
    assert capped.steps[0].output_tokens == 700  # the worker wanted more: the deadline cut its answer
    assert deadline_shortened(capped) and not deadline_stopped(capped)
    roomy = asyncio.run(execute(wf, TASK, view, RequestLimits(max_latency_s=2.0)))  # cap 1500, uses 1000
    assert "output capped at 1500" in roomy.steps[0].note and not deadline_shortened(roomy)
    free = asyncio.run(execute(wf, TASK, view, RequestLimits()))
    assert not deadline_shortened(free)


# -- evaluation views ----------------------------------------------------------------------------


def test_parse_deadlines() -> None:
    assert parse_deadlines("none,60,15s,5") == [None, 60.0, 15.0, 5.0]
    for bad in ("nan", "-1", "0", "inf", "soon", ","):
        with pytest.raises(ValueError):
            parse_deadlines(bad)


def test_deadline_views_side_by_side(tmp_path: Path) -> None:
    view = _slow_pool().view()
    tasks = [TASK]
    summaries = []
    for label, limits in (("none", RequestLimits()), ("0.2", RequestLimits(max_latency_s=0.2))):
        s = evaluate(SingleWorker("slow"), view, tasks, limits, progress=False).summary()
        s["deadline"] = label
        summaries.append(s)
    heads, rows = deadline_rows(summaries)
    assert heads == [
        "policy",
        "acc % @none",
        "p95 s @none",
        "cut % @none",
        "acc % @0.2",
        "p95 s @0.2",
        "cut % @0.2",
    ]
    (row,) = rows
    assert row[1:4] == ["100.0", "0.4", "0"] and row[4:] == ["0.0", "0.0", "100"]
    assert "| single:slow |" in deadline_markdown(summaries)
    assert deadline_plot(summaries, tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_runs_the_same_questions_under_each_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plot = ["--plot", str(tmp_path / "p.png"), "--no-behaviour"]
    _, rows = compare_grid(tmp_path, monkeypatch, "deadline", "5", *plot)
    assert all(r["p95_latency_s"] <= 5 for r in rows if r["deadline"] == "5")
    assert any(r["p95_latency_s"] > 5 for r in rows if r["deadline"] == "none")  # 5 s binds
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "p-latency.png").read_bytes()[:4] == b"\x89PNG"
    bad = CliRunner().invoke(app, ["compare", "--limit", "2", "--deadlines", "none,-3"])
    assert bad.exit_code != 0 and "deadline" in bad.output


def test_compare_builds_each_policy_once_for_the_whole_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget x deadline grid evaluates every point with the same policy objects: a Conductor's
    weights are read, and a router fitted, once per ``compare``, not once per grid point."""
    import rl_conductor.evaluation.suite as suite

    built: list[str] = []

    def counted(spec: str, pool: Any, **kw: Any) -> Any:
        built.append(spec)
        return make_policy(spec, pool, **kw)

    monkeypatch.setattr(suite, "baseline_specs", lambda pool: ["single:gpt-5", "moa"])
    monkeypatch.setattr(suite, "make_policy", counted)
    out = tmp_path / "cmp.json"
    args = ["compare", "--limit", "3", "--budgets", "none,0.01", "--deadlines", "none,5", "--json", str(out)]
    result = CliRunner().invoke(app, [*args, "--no-behaviour"])
    assert result.exit_code == 0, result.output
    assert built == ["single:gpt-5", "moa"]
    rows = json.loads(out.read_text())["results"]
    assert [(r["budget"], r["deadline"]) for r in rows[::2]] == [
        ("none", "none"),
        ("none", "5"),
        ("0.01", "none"),
        ("0.01", "5"),
    ]


# -- pipeline ------------------------------------------------------------------------------------


def test_pipeline_report_has_the_deadline_view_and_chart(tmp_path: Path) -> None:
    from rl_conductor.pipeline.report import write_reports

    view = _slow_pool().view()
    base = evaluate(SingleWorker("slow"), view, [TASK], RequestLimits(), progress=False).summary()
    under = evaluate(
        SingleWorker("slow"), view, [TASK], RequestLimits(max_latency_s=0.2), progress=False
    ).summary()
    under["deadline"] = "0.2"
    out = {k: tmp_path / k for k in ("md", "html", "pareto", "latency")}  # KFP paths have no suffix
    meta = {"pool": "slow", "n": 1, "run_tag": "t", "test_split_id": "x"}
    write_reports(
        [base],
        meta,
        md_path=out["md"],
        html_path=out["html"],
        png_path=out["pareto"],
        deadline_summaries=[under],
        latency_png_path=out["latency"],
    )
    md = out["md"].read_text()
    assert "## Under a deadline" in md and "acc % @0.2" in md and "](latency.png)" in md
    assert "Under a deadline" in out["html"].read_text() and out["latency"].read_bytes()[:4] == b"\x89PNG"


def test_pipeline_deadline_parameters_are_checked() -> None:
    from rl_conductor.pipeline import runner
    from rl_conductor.pipeline.steps import DEADLINES, deadline_parameters

    assert deadline_parameters(0.0, "") == (None, DEADLINES)
    assert deadline_parameters(30.0, "none") == (30.0, ())
    assert deadline_parameters(0.0, "60, 15,5") == (None, (60.0, 15.0, 5.0))
    assert (
        "eval_deadlines" in runner.pipeline_parameters()
        and "eval_max_latency_s" in runner.pipeline_parameters()
    )
    args = runner.pipeline_arguments(eval_deadlines="15,5", eval_max_latency_s=20.0)
    assert args["eval_deadlines"] == "15,5" and args["eval_max_latency_s"] == 20.0
    for bad in ({"eval_deadlines": "soon"}, {"eval_deadlines": "5,-1"}, {"eval_max_latency_s": -1.0}):
        with pytest.raises(ValueError, match="eval_"):
            runner.pipeline_arguments(**bad)
