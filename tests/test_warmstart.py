"""Warm-start targets: the candidate table (executed through the real executor on fake workers),
neighbourhood averaging that picks the expected-best workflow rather than each item's own best,
and targets that respect the prompt's budget and worker subset (ids remapped as shown)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.reward import REWARD_PRESETS
from rl_conductor.tasks.base import Task
from rl_conductor.training.candidates import (
    Candidate,
    CandidateTable,
    build_table,
    cached_table,
    composed_candidates,
    select_items,
    single,
    unchanged_under_deadline,
)
from rl_conductor.training.data import PromptSpec, warm_sft_records
from rl_conductor.training.warmstart import ExpectedRewards, reward_array
from rl_conductor.workers.base import CallContext, Message
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool
from rl_conductor.workflow import parse, render

COST_AWARE = REWARD_PRESETS["cost-aware"]


def deadline_column(table: CandidateTable, k: int) -> int:
    """The condition column of ``table.deadlines[k]`` (after the budget columns)."""
    return len(table.budgets) + k


def _task(i: int, domain: str = "math", source: str = "t") -> Task:
    return Task(
        id=f"{source}/{i}",
        question=f"What is {i} + {i}?",
        answer=str(2 * i),
        domain=domain,
        source=source,
        grader="math",
    )


def _table(
    rows: dict[str, list[bool]],
    costs: dict[str, float],
    *,
    budgets: list[float | None] | None = None,
    unaffordable: dict[str, list[int]] | None = None,
) -> CandidateTable:
    """A hand-built table: candidate name -> correct per item (one group), a cost per candidate,
    and per candidate the budget columns where it was not affordable."""
    budgets = budgets or [None]
    cands = [Candidate.parse_name(n) for n in rows]
    n = len(next(iter(rows.values())))
    shape = (n, len(cands), len(budgets))
    correct = np.zeros(shape, dtype=bool)
    cost = np.zeros(shape)
    done = np.ones(shape, dtype=bool)
    for j, name in enumerate(rows):
        correct[:, j, :] = np.array(rows[name])[:, None]
        cost[:, j, :] = costs[name]
        for b in (unaffordable or {}).get(name, []):
            done[:, j, b] = False
    return CandidateTable(
        task_ids=[f"t/{i}" for i in range(n)],
        domains=["math"] * n,
        groups=["math/t"] * n,
        candidates=cands,
        budgets=budgets,
        correct=correct,
        cost=cost,
        stopped=np.zeros(shape, dtype=bool),
        tokens=np.zeros(shape, dtype=np.int32),
        done=done,
    )


# cheap is right on the 5 easy items, strong on 8 of 10; both wrong on the 2 hardest
EASY_HARD = {
    "solve:cheap": [True] * 5 + [False] * 5,
    "solve:strong": [True] * 8 + [False] * 2,
}
PRICES = {"solve:cheap": 0.0001, "solve:strong": 0.005}


def test_neighbourhood_mean_picks_the_expected_best_not_each_items_best() -> None:
    table = _table(EASY_HARD, PRICES)
    r = reward_array(table, COST_AWARE)[:, :, 0]
    per_item = Counter(table.candidates[int(np.argmax(row))].name for row in r)
    # per-item labels reward cheapness: the cheap worker wins most items (easy and hopeless ones)
    assert per_item.most_common(1)[0][0] == "solve:cheap"
    best = ExpectedRewards.fit(table, COST_AWARE).best(_task(0, source="t"), ["cheap", "strong"], None)
    assert best.name == "solve:strong"


def test_group_mean_is_shrunk_towards_the_domain() -> None:
    table = _table(EASY_HARD, PRICES)
    # items 0..4 form their own small source group "math/u"; the domain includes all ten
    table.groups = ["math/u"] * 5 + ["math/t"] * 5
    unshrunk = ExpectedRewards.fit(table, COST_AWARE, shrink=0.0)
    shrunk = ExpectedRewards.fit(table, COST_AWARE, shrink=1000.0)
    u = _task(1, source="u")
    # alone, the easy group prefers the cheap worker (both always right there)...
    assert unshrunk.best(u, ["cheap", "strong"], None).name == "solve:cheap"
    # ...leaning on its domain, it takes the worker that is better on questions like it
    assert shrunk.best(u, ["cheap", "strong"], None).name == "solve:strong"


def test_targets_respect_budgets() -> None:
    table = _table(EASY_HARD, PRICES, budgets=[None, 0.002, 0.01], unaffordable={"solve:strong": [1]})
    er = ExpectedRewards.fit(table, COST_AWARE)
    t = _task(0)
    assert er.best(t, ["cheap", "strong"], None).name == "solve:strong"
    assert er.best(t, ["cheap", "strong"], 0.002).name == "solve:cheap"
    # a budget between table budgets uses the largest one not above it
    assert er.best(t, ["cheap", "strong"], 0.005).name == "solve:cheap"
    assert er.best(t, ["cheap", "strong"], 0.05).name == "solve:strong"
    # below every table budget: the smallest budget's column, never the unbudgeted one
    assert er.best(t, ["cheap", "strong"], 0.0005).name == "solve:cheap"


def _deadline_table() -> CandidateTable:
    """Ten items; columns: no limit, budgets $0.002 and $0.01, deadlines 5 s and 40 s. slow (dear) is
    right on 8 items but 5 s cut it on every item; fast (cheap) is right on 5 everywhere. The
    5 s column was scored on items 0..5 only (a subset)."""
    table = _table(
        {"solve:fast": [True] * 5 + [False] * 5, "solve:slow": [True] * 8 + [False] * 2},
        {"solve:fast": 0.0001, "solve:slow": 0.005},
        budgets=[None, 0.002, 0.01, None, None],
        unaffordable={"solve:slow": [1]},
    )
    table.budgets = [None, 0.002, 0.01]
    table.deadlines = [5.0, 40.0]
    slow, short = table.index("solve:slow"), deadline_column(table, 0)
    table.cut = np.zeros_like(table.done)
    table.cut[:, slow, short] = True
    table.correct[:, slow, short] = False
    table.done[6:, :, short] = False
    return table


def test_targets_plan_for_the_deadline() -> None:
    table = _deadline_table()
    er = ExpectedRewards.fit(table, COST_AWARE)
    t, names = _task(0), ["fast", "slow"]
    r = reward_array(table, COST_AWARE)
    slow, short = table.index("solve:slow"), deadline_column(table, 0)
    # the cut is charged the deadline penalty (item 8: slow is wrong there without a deadline too)
    assert r[0, slow, short] == pytest.approx(r[8, slow, 0] - COST_AWARE.deadline_penalty)
    # without a deadline (or with a long one) the accurate slow worker; under 5 s the fast one
    assert er.best(t, names, None).name == "solve:slow"
    assert er.best(t, names, None, 60.0).name == "solve:slow"
    assert er.best(t, names, None, 40.0).name == "solve:slow"
    assert er.best(t, names, None, 5.0).name == "solve:fast"
    # the nearest table deadline on a log scale (5 | 14.1 | 40 s)
    assert er.best(t, names, None, 12.0).name == "solve:fast"
    assert er.best(t, names, None, 20.0).name == "solve:slow"
    assert er.best(t, names, None, 2.0).name == "solve:fast"  # below every one: the shortest
    assert er.deadline_index(5.0 * 8**0.5) == er.deadline_index(5.0)  # the geometric midpoint ties short
    # a subset-scored column is defined (over its scored items), not lost to the unscored ones
    assert not np.isnan(er.by_group["math/t"][:, short]).any()
    # budget and deadline: the deadline's column, among candidates affordable under the budget
    assert er.best(t, names, 0.002, 60.0).name == "solve:fast"
    assert er.best(t, names, 0.01, 60.0).name == "solve:slow"
    wf = er.target(t, ["slow", "fast"], None, 5.0)
    assert [s.worker for s in wf.steps] == [1]
    # a table without deadline columns ignores the deadline
    plain = ExpectedRewards.fit(_table(EASY_HARD, PRICES), COST_AWARE)
    assert plain.best(t, ["cheap", "strong"], None, 1.0).name == "solve:strong"


def test_targets_use_only_the_shown_workers_with_their_shown_ids() -> None:
    rows = {**EASY_HARD, "solve:cheap>verify:strong": [True] * 9 + [False]}
    table = _table(rows, {**PRICES, "solve:cheap>verify:strong": 0.0052})
    er = ExpectedRewards.fit(table, COST_AWARE)
    t = _task(3)
    wf = er.target(t, ["other", "strong", "cheap"], None)
    assert [s.worker for s in wf.steps] == [2, 1]
    assert wf.steps[1].access == "all" and wf.steps[0].access == ()
    wf = er.target(t, ["cheap", "other"], None)
    assert [s.worker for s in wf.steps] == [0]
    with pytest.raises(ValueError, match="no candidate"):
        er.best(t, ["other"], None)


def test_ties_go_to_fewer_steps_then_cheaper() -> None:
    rows = {"solve:a": [True, False], "solve:b": [True, False], "solve:a>verify:b": [True, False]}
    table = _table(rows, {"solve:a": 0.0, "solve:b": 0.0, "solve:a>verify:b": 0.0})
    assert ExpectedRewards.fit(table, COST_AWARE).best(_task(0), ["a", "b"], None).name == "solve:a"


def test_se_rule_keeps_a_composed_plan_only_when_it_beats_the_single_by_more_than_noise() -> None:
    """The one-standard-error rule: a plan whose edge over a simpler one is within the paired
    noise of the table is a tie, and the tie goes to fewer steps; a consistent edge is kept."""
    n = 200
    base = np.arange(n) < 120  # the single is right on 120 of 200
    noisy = base.copy()
    noisy[:10] = False  # the composed plan loses 10 of those...
    noisy[120:131] = True  # ...and wins 11 others: the best mean, by one item (noise)
    better = base.copy()
    better[120:170] = True  # right wherever the single is, and on 50 more (a real edge)
    prices = {"solve:a": 0.001, "plan:b>solve:a": 0.001}
    for rows, k, expected in (
        ({"solve:a": list(base), "plan:b>solve:a": list(noisy)}, 0.0, "plan:b>solve:a"),
        ({"solve:a": list(base), "plan:b>solve:a": list(noisy)}, 1.0, "solve:a"),
        ({"solve:a": list(base), "plan:b>solve:a": list(better)}, 1.0, "plan:b>solve:a"),
        ({"solve:a": list(base), "plan:b>solve:a": list(better)}, 2.0, "plan:b>solve:a"),
    ):
        table = _table(rows, prices)
        r = reward_array(table, COST_AWARE)[:, :, 0]
        assert r[:, 1].mean() > r[:, 0].mean()  # the composed plan has the best mean every time
        er = ExpectedRewards.fit(table, COST_AWARE, se_rule=k)
        assert er.best(_task(0, source="t"), ["a", "b"], None).name == expected, (k, expected)


def test_balanced_domains_give_every_domain_the_same_share() -> None:
    from rl_conductor.training.data import make_specs

    tasks = [_task(i, "math") for i in range(30)] + [_task(100 + i, "code", "c") for i in range(5)]
    pool = Pool(name="two", workers=[FakeWorker(info=fake_info("a")), FakeWorker(info=fake_info("b"))])
    kw: dict[str, Any] = dict(budget_prob=0.0, budgets=[], random_pool_prob=0.0)
    plain = Counter(s.task.domain for s in make_specs(tasks, pool, 120, rng=random.Random(0), **kw))
    even = Counter(
        s.task.domain for s in make_specs(tasks, pool, 120, rng=random.Random(0), balance_domains=True, **kw)
    )
    assert plain["code"] <= 20 and even["code"] == 60 and even["math"] == 60
    specs = make_specs(tasks, pool, 60, rng=random.Random(0), balance_domains=True, **kw)
    assert {s.task.id for s in specs if s.task.domain == "code"} == {t.id for t in tasks[30:]}


def test_composed_candidates_are_chains_of_at_most_five_steps() -> None:
    cands = composed_candidates(["t0", "t1", "t2"], ["c0", "c1"])
    assert len(cands) == len(set(cands))
    shapes = Counter(c.shape for c in cands)
    assert set(shapes) == {"SV", "PS", "PSV", "PPSV", "PSVV", "PPSVV"}
    for c in cands:
        assert 2 <= len(c.steps) <= 5
        wf = c.workflow(["t0", "t1", "t2", "c0", "c1"])
        assert all(s.access == "all" for s in wf.steps[1:])
        assert c.steps[-1][1] != "plan"  # a plan never gives the final answer
        assert Candidate.parse_name(c.name) == c
    with pytest.raises(ValueError, match="outside the view"):
        next(c for c in cands if "c0" in c.workers).workflow(["t0", "t1"])


# --------------------------------------------------------------------------- real execution


def _fake_pool() -> Pool:
    """cheap: right on even items only; dear: always right, 1000x the price; wrong: never right."""

    def responder(kind: str) -> Any:
        def answer(messages: list[Message] | Any, context: CallContext | None) -> str:
            assert context is not None
            i = int(context.task.id.split("/")[1])
            ok = kind == "dear" or (kind == "cheap" and i % 2 == 0)
            return f"\\boxed{{{context.task.answer if ok else 'wrong'}}}"

        return answer

    specs = [("cheap", 0.5), ("dear", 500.0), ("wrong", 0.5)]
    return Pool(
        name="fake-warm",
        workers=[
            FakeWorker(info=fake_info(n, price_in=p, price_out=p), responder=responder(n), output_tokens=40)
            for n, p in specs
        ],
    )


def test_build_table_executes_candidates_and_respects_budgets(tmp_path: Path) -> None:
    pool = _fake_pool()
    tasks = [_task(i) for i in range(8)] + [_task(i, domain="code", source="c") for i in range(8)]
    table = build_table(tasks, pool, budgets=[0.01], top_k=1, cheap_k=1)
    names = [c.name for c in table.candidates]
    assert {"solve:cheap", "solve:dear", "solve:wrong"} <= set(names)
    assert "solve:cheap>verify:dear" in names  # composed over the domain's strong and cheap workers
    dear, cheap = table.index("solve:dear"), table.index("solve:cheap")
    assert table.correct[:, dear, 0].all() and table.done[:, dear, 0].all()
    assert table.correct[:, cheap, 0].tolist() == [i % 2 == 0 for i in range(8)] * 2
    # dear costs ~0.02 a call: unaffordable under the $0.01 budget, never run there
    assert table.cost[:, dear, 0].min() > 0.01
    assert not table.done[:, dear, 1].any()
    assert table.done[:, cheap, 1].all()
    er = ExpectedRewards.fit(table, COST_AWARE)
    assert er.best(tasks[0], pool.names(), None).name == "solve:dear"
    assert "dear" not in er.best(tasks[0], pool.names(), 0.01).workers
    # the cache returns the same table without executing again
    first = cached_table(tasks, pool, tmp_path, budgets=[0.01], top_k=1, cheap_k=1)
    (path,) = tmp_path.glob("candidates-*.npz")
    again = cached_table(tasks, pool, tmp_path, budgets=[0.01], top_k=1, cheap_k=1)
    assert [c.name for c in again.candidates] == [c.name for c in first.candidates]
    assert np.array_equal(again.correct, first.correct) and np.array_equal(again.done, first.done)
    assert list(tmp_path.glob("candidates-*.npz")) == [path]


def _timed_pool() -> Pool:
    """_fake_pool with latency models: cheap answers within a second, dear's first token alone
    takes 30 s, so a 5 s deadline never lets dear start."""
    pool = _fake_pool()
    timing = {"cheap": (0.1, 1000.0), "dear": (30.0, 50.0), "wrong": (0.1, 1000.0)}
    for w in pool.workers:
        ttft, tps = timing[w.info.name]
        w.info = replace(w.info, ttft_s=ttft, tokens_per_s=tps)
    return pool


def test_build_table_executes_the_deadline_columns_under_the_deadline(tmp_path: Path) -> None:
    pool = _timed_pool()
    tasks = [_task(i) for i in range(8)]
    table = build_table(tasks, pool, deadlines=[5.0], deadline_items_per_domain=6, top_k=1, cheap_k=1)
    assert table.deadlines == [5.0] and table.cut is not None
    col = deadline_column(table, 0)
    dear, cheap = table.index("solve:dear"), table.index("solve:cheap")
    scored = {i for i, t in enumerate(tasks) if t.id in {x.id for x in select_items(tasks, 6)}}
    assert table.done[:, :, col].any(axis=1).tolist() == [i in scored for i in range(8)]
    rows = sorted(scored)
    # dear cannot start within 5 s: skipped for real (cut, no call, no answer), never without it
    assert table.cut[rows, dear, col].all() and not table.correct[rows, dear, col].any()
    assert (table.calls[rows, dear, col] == 0).all() and not table.cut[:, :, 0].any()
    assert table.correct[rows, dear, 0].all()
    # cheap is untouched by the deadline: its unconstrained runs are reused, outcome for outcome
    assert not table.cut[rows, cheap, col].any()
    assert table.correct[rows, cheap, col].tolist() == table.correct[rows, cheap, 0].tolist()
    assert table.meta["deadline_reused"] > 0
    # composed plans through dear are cut after cheap's answer
    j = table.index("solve:cheap>verify:dear")
    assert table.cut[rows, j, col].all() and (table.calls[rows, j, col] == 1).all()
    er = ExpectedRewards.fit(table, COST_AWARE)
    assert er.best(tasks[0], pool.names(), None).name == "solve:dear"
    assert "dear" not in er.best(tasks[0], pool.names(), None, 5.0).workers
    # the SFT records pair a deadline prompt with the deadline's target
    specs = [PromptSpec(task=tasks[0], view=(0, 1, 2), budget=None, deadline=d) for d in (None, 5.0)]
    recs = warm_sft_records(specs, pool, RequestLimits(), er, max_question_chars=100)
    plans = [parse(r["completion"][0]["content"], pool_size=3) for r in recs]
    assert {pool.names()[st.worker] for st in plans[0].steps} == {"dear"}
    assert 1 not in {st.worker for st in plans[1].steps}
    assert ["Deadline:" in r["prompt"][0]["content"] for r in recs] == [False, True]
    # the deadlines are part of the saved table and of the cache key
    path = tmp_path / "t.npz"
    table.save(path)
    back = CandidateTable.load(path)
    assert back.deadlines == [5.0] and np.array_equal(back.cut, table.cut)
    kw: dict[str, Any] = {"top_k": 1, "cheap_k": 1, "deadline_items_per_domain": 6}
    cached_table(tasks, pool, tmp_path / "c", **kw)
    cached_table(tasks, pool, tmp_path / "c", deadlines=[5.0], **kw)
    assert len(list((tmp_path / "c").glob("candidates-*.npz"))) == 2


def test_unchanged_under_deadline_replays_the_executors_check() -> None:
    pool = _timed_pool()
    view, t = pool.view(), _task(2)
    wf = Candidate((("cheap", "solve"), ("dear", "verify"))).workflow(view.names())
    trace = asyncio.run(execute(wf, t, view, RequestLimits()))
    assert unchanged_under_deadline(trace, t, view, 1000.0)
    assert not unchanged_under_deadline(trace, t, view, 5.0)  # dear could not start
    alone = asyncio.run(execute(single("cheap").workflow(view.names()), t, view, RequestLimits()))
    assert unchanged_under_deadline(alone, t, view, 5.0)
    assert not unchanged_under_deadline(alone, t, view, 0.1)  # it could not even start


def test_warm_sft_records_follow_budget_and_subset() -> None:
    pool = _fake_pool()
    tasks = [_task(i) for i in range(8)]
    er = ExpectedRewards.fit(build_table(tasks, pool, budgets=[0.01], top_k=1, cheap_k=1), COST_AWARE)
    specs = [
        PromptSpec(task=tasks[0], view=(0, 1, 2), budget=None),
        PromptSpec(task=tasks[1], view=(2, 1), budget=None),
        PromptSpec(task=tasks[2], view=(1, 0), budget=0.01),
        PromptSpec(task=tasks[3], view=(2, 0), budget=None),
    ]
    recs = warm_sft_records(specs, pool, RequestLimits(), er, max_question_chars=100)
    plans = [
        parse(r["completion"][0]["content"], pool_size=len(s.view)) for r, s in zip(recs, specs, strict=True)
    ]
    shown = [[pool.names()[i] for i in s.view] for s in specs]
    used = [{shown[k][st.worker] for st in p.steps} for k, p in enumerate(plans)]
    assert used[0] == {"dear"} and used[1] == {"dear"}
    assert "dear" not in used[2]  # the $0.01 budget cannot afford it
    assert used[3] == {"cheap"}  # dear is not shown
    assert "Budget: $0.010" in recs[2]["prompt"][0]["content"]


def test_select_items_caps_each_domain_stably() -> None:
    tasks = [_task(i) for i in range(30)] + [_task(i, domain="code", source="c") for i in range(5)]
    picked = select_items(tasks, 10)
    assert Counter(t.domain for t in picked) == {"math": 10, "code": 5}
    random.Random(0).shuffle(tasks)
    assert {t.id for t in select_items(tasks, 10)} == {t.id for t in picked}


def test_single_is_a_one_step_solve() -> None:
    assert single("x").steps == (("x", "solve"),)


def _paper_sim_targets(cache_dir: Path, max_steps: int) -> tuple[Pool, list[Task], ExpectedRewards]:
    """The simulated pool, paper-mix's training split and the warm start's targets on them at
    tiny sizes (a real candidate table, cached in ``cache_dir``; one budget, $0.002)."""
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.config import TrainConfig
    from rl_conductor.training.train import warm_start_targets
    from rl_conductor.workers.pool import load_pool

    cfg = TrainConfig(
        warm_items_per_domain=3,
        warm_top_k=1,
        warm_cheap_k=1,
        max_steps_per_workflow=max_steps,
        budgets_usd=[0.002],
        warm_cache_dir=str(cache_dir),
    )
    pool = load_pool("paper-sim", seed=0)
    tasks = load_tasks("paper-mix", split="train")
    return pool, tasks, warm_start_targets(cfg, tasks, pool)


def test_warm_start_targets_on_the_simulated_pool(tmp_path: Path) -> None:
    """The training entry point on the real simulated pool, at tiny sizes: a cached table, and
    targets that are valid plans within the step limit for every kind of question."""
    pool, tasks, er = _paper_sim_targets(tmp_path, max_steps=3)
    assert len(list(tmp_path.glob("candidates-paper-sim-*.npz"))) == 1
    names = pool.names()
    for domain in ("math", "knowledge", "reasoning", "code"):
        task = next(t for t in tasks if t.domain == domain)
        for budget in (None, 0.002):
            wf = er.target(task, names, budget)
            assert 1 <= len(wf.steps) <= 3
            parse(render(wf), pool_size=len(names), max_steps=3)


def test_warm_start_targets_get_deadline_columns_only_when_prompts_carry_deadlines(tmp_path: Path) -> None:
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.config import TrainConfig
    from rl_conductor.training.train import warm_start_targets
    from rl_conductor.workers.pool import load_pool

    common: dict[str, Any] = {
        "warm_items_per_domain": 3,
        "warm_top_k": 1,
        "warm_cheap_k": 1,
        "max_steps_per_workflow": 3,
        "budgets_usd": [0.002],
        "warm_deadlines_s": [5.0],
        "warm_deadline_items_per_domain": 2,
        "warm_cache_dir": str(tmp_path),
    }
    pool = load_pool("paper-sim", seed=0)
    tasks = load_tasks("paper-mix", split="train")
    assert warm_start_targets(TrainConfig(**common), tasks, pool).deadlines == []
    er = warm_start_targets(TrainConfig(deadline_fraction=0.3, **common), tasks, pool)
    assert er.deadlines == [5.0]
    names = pool.names()
    for domain in ("math", "knowledge", "reasoning", "code"):
        task = next(t for t in tasks if t.domain == domain)
        for budget in (None, 0.002):
            wf = er.target(task, names, budget, 5.0)
            assert 1 <= len(wf.steps) <= 3
            parse(render(wf), pool_size=len(names), max_steps=3)


def test_reward_array_pays_the_format_bonus_only_when_a_worker_was_called() -> None:
    table = _table(EASY_HARD, {"solve:cheap": 0.0, "solve:strong": 0.0}, budgets=[None, 0.001])
    table.calls = np.ones_like(table.correct, dtype=np.int32)
    table.calls[:, table.index("solve:strong"), 1] = 0  # the budget stopped it before any call
    table.correct[:, table.index("solve:strong"), 1] = False
    r = reward_array(table, COST_AWARE)
    assert r[0, table.index("solve:strong"), 1] == pytest.approx(0.0)
    assert r[0, table.index("solve:cheap"), 1] == pytest.approx(1.0)


def test_parallel_build_gives_the_serial_table_array_for_array(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    forks: list[str] = []
    real = multiprocessing.get_context

    def spy(method: str | None = None) -> Any:
        forks.append(str(method))
        return real(method)

    pool = _timed_pool()
    tasks = [_task(i) for i in range(10)] + [_task(i, domain="code", source="c") for i in range(10)]
    kw: dict[str, Any] = {
        "budgets": [0.01, 0.05],
        "deadlines": [5.0],
        "deadline_items_per_domain": 6,
        "top_k": 2,
        "cheap_k": 1,
    }
    serial = build_table(tasks, pool, workers=1, **kw)
    monkeypatch.setattr(multiprocessing, "get_context", spy)
    forked = build_table(tasks, pool, workers=2, parallel_min_jobs=1, **kw)
    assert forks and set(forks) == {"fork"}  # every stage with jobs ran in forked children
    assert [c.name for c in forked.candidates] == [c.name for c in serial.candidates]
    assert forked.meta == serial.meta and serial.meta["deadline_reused"] > 0
    for name in ("correct", "cost", "stopped", "tokens", "done", "calls", "cut"):
        assert np.array_equal(getattr(forked, name), getattr(serial, name)), name
    assert serial.done[:, :, 1].any() and serial.done[:, :, 3].any()


def _fresh_simulation(monkeypatch: pytest.MonkeyPatch, cache_max: int) -> None:
    """Empty simulation caches (models, grades, rendered texts, authors), the texts' and the
    authors' capped at ``cache_max`` entries: a build starts from nothing, as in a fresh process."""
    from rl_conductor import reward
    from rl_conductor.workers.simulated import answers, collaboration, skill

    for module, name in ((answers, "_GRADE_CACHE"), (answers, "_RENDERED")):
        monkeypatch.setattr(module, name, {})  # a pool file's workers get a fresh author registry
    monkeypatch.setattr(skill, "_MODELS", {})
    monkeypatch.setattr(reward, "_GRADES", type(reward._GRADES)(reward._GRADES.maxsize))
    monkeypatch.setattr(answers, "_CACHE_MAX", cache_max)
    monkeypatch.setattr(collaboration, "_AUTHORED_MAX", cache_max)


@pytest.mark.slow
def test_parallel_build_on_the_simulated_pool_is_the_serial_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """paper-sim, whose workers grade answers themselves with the real graders (code in the
    sandbox), every domain, budget and deadline columns, the simulation's caches small enough to
    fill several times during the build: two forked workers give the serial table array for
    array, even where a grade could come out otherwise in a child. Here it does, on purpose: a
    forked child grades every simulated code and math answer the other way, as the sandbox's
    and math-verify's wall-clock limits can under the children's load. Before, the children
    graded what they met on their own (1 to 5 of 24 items' code cells differed on the real
    graders)."""
    import os

    from rl_conductor.tasks import graders
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.workers.pool import load_pool
    from rl_conductor.workers.simulated import answers

    parent, real = os.getpid(), graders.settled_grade

    def load_dependent(task: Task, text: str) -> tuple[bool, bool]:
        verdict, settled = real(task, text)
        flips = task.grader in ("code", "math") and answers.simulated_value(text) is not answers.NOT_RENDERED
        return (not verdict if flips and os.getpid() != parent else verdict), settled

    monkeypatch.setattr(graders, "settled_grade", load_dependent)
    monkeypatch.setenv("RL_CONDUCTOR_GRADE_CACHE", "0")  # each build grades for itself

    tasks = select_items(load_tasks("paper-mix", "train"), 4)
    kw: dict[str, Any] = {
        "budgets": [0.002],
        "deadlines": [5.0, 40.0],
        "deadline_items_per_domain": 4,
        "top_k": 2,
        "cheap_k": 1,
        "max_steps": 3,
    }
    tables = []
    for workers in (1, 2):
        _fresh_simulation(monkeypatch, cache_max=4000)
        tables.append(build_table(tasks, load_pool("paper-sim"), workers=workers, parallel_min_jobs=1, **kw))
    serial, forked = tables
    assert len({t.domain for t in tasks}) == 4 and serial.done[:, :, 1:].any()
    assert [c.name for c in forked.candidates] == [c.name for c in serial.candidates]
    for name in ("correct", "cost", "stopped", "tokens", "done", "calls", "cut"):
        assert np.array_equal(getattr(forked, name), getattr(serial, name)), name


def test_table_workers_default_to_every_core_and_read_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from rl_conductor.training.candidates import WORKERS_ENV, table_workers

    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert table_workers() == min(len(os.sched_getaffinity(0)), 16) and table_workers(3) == 3
    monkeypatch.setenv(WORKERS_ENV, "1")
    assert table_workers() == 1
    monkeypatch.setenv(WORKERS_ENV, "2")
    assert table_workers() == 2
    monkeypatch.setenv(WORKERS_ENV, "auto")
    assert table_workers() >= 1
    monkeypatch.setenv(WORKERS_ENV, "many")
    with pytest.raises(ValueError, match=WORKERS_ENV):
        table_workers()
    with pytest.raises(ValueError, match=">= 1"):
        table_workers(0)


def _two_clusters(n: int, split: int) -> np.ndarray:
    """Embeddings: items below ``split`` on one axis, the rest on another."""
    e = np.zeros((n, 2), dtype=np.float32)
    e[:split, 0] = 1.0
    e[split:, 1] = 1.0
    return e


def test_neighbourhoods_per_question_give_each_cluster_its_own_target() -> None:
    # the group's mean prefers strong (test above); the easy half alone prefers cheap
    table = _table(EASY_HARD, PRICES)
    emb = _two_clusters(10, 5)
    workers = ["cheap", "strong"]
    per_q = ExpectedRewards.fit(table, COST_AWARE, shrink=0.0, neighbours=4, embeddings=emb)
    assert [per_q.best(_task(i), workers, None).name for i in range(10)] == ["solve:cheap"] * 5 + [
        "solve:strong"
    ] * 5
    # shrunk hard towards the group, every question takes the group's target again
    shrunk = ExpectedRewards.fit(table, COST_AWARE, shrink=1e6, neighbours=4, embeddings=emb)
    assert {shrunk.best(_task(i), workers, None).name for i in range(10)} == {"solve:strong"}
    # off (the default) or a question the table lacks: the group's mean
    assert ExpectedRewards.fit(table, COST_AWARE, neighbours=0, embeddings=emb).item_means == {}
    assert per_q.best(_task(99), workers, None).name == "solve:strong"
    # budget columns are per question too, and the value is the neighbourhood's mean
    cand, value = per_q.value(_task(0), workers, None)
    r = reward_array(table, COST_AWARE)
    assert cand.name == "solve:cheap"
    assert value == pytest.approx(float(r[1:5, 0, 0].mean()))


def test_neighbourhoods_leave_the_question_itself_out() -> None:
    # two questions the embedding cannot tell apart: each one's target is the *other's* best,
    # never its own outcome (which the Conductor cannot see)
    table = _table({"solve:cheap": [True, False], "solve:strong": [True, True]}, PRICES)
    er = ExpectedRewards.fit(table, COST_AWARE, shrink=0.0, neighbours=1, embeddings=np.ones((2, 3)))
    assert er.best(_task(0), ["cheap", "strong"], None).name == "solve:strong"
    assert er.best(_task(1), ["cheap", "strong"], None).name == "solve:cheap"
    # nor through the shrinkage (H23: the group mean it leaned on held the question's own row)
    three = {"solve:cheap": [False, True, False], "solve:strong": [True, True, True]}
    flipped = {**three, "solve:cheap": [True, True, False]}  # only question 0's own outcome differs
    means = [
        ExpectedRewards.fit(
            _table(rows, PRICES), COST_AWARE, shrink=20.0, neighbours=2, embeddings=np.ones((3, 3))
        ).item_means["t/0"]
        for rows in (three, flipped)
    ]
    np.testing.assert_allclose(means[0], means[1], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="3 embeddings for 2 table items"):
        ExpectedRewards.fit(table, COST_AWARE, neighbours=1, embeddings=np.ones((3, 3)))


def test_auto_neighbourhoods_only_where_they_beat_group_means_out_of_sample() -> None:
    """``warm_neighbours: auto`` (training/neighbours.py): a group whose two halves want different
    workers gets neighbourhoods; a group whose questions are all alike keeps its group mean."""
    from rl_conductor.training.neighbours import choose_neighbours, target_rewards

    n, prices = 40, {"solve:cheap": 0.0001, "solve:strong": 0.02}  # strong is dear enough to matter
    mixed = _table({"solve:cheap": [True] * 20 + [False] * 20, "solve:strong": [True] * n}, prices)
    items = [_task(i) for i in range(n)]
    mixed.task_ids = [t.id for t in items]
    emb = _two_clusters(n, 20)
    workers = ["cheap", "strong"]
    split = choose_neighbours(mixed, items, workers, COST_AWARE, emb, k=10, shrink=1.0)
    assert split["k"] == 10 and split["gain"] > split["gain_se"] > 0
    assert split["neighbour_reward"] > split["group_reward"] and split["n"] == n
    _, chosen = target_rewards(mixed, items, workers, COST_AWARE, k=10, embeddings=emb, shrink=1.0)
    assert chosen == ["solve:cheap"] * 20 + ["solve:strong"] * 20
    alike = _table({"solve:cheap": [True, False] * 20, "solve:strong": [True] * n}, prices)
    alike.task_ids = mixed.task_ids
    same = choose_neighbours(alike, items, workers, COST_AWARE, emb, k=10, shrink=1.0)
    assert same["k"] == 0 and same["candidate_k"] == 10
    with pytest.raises(ValueError, match="row order"):
        target_rewards(mixed, items[::-1], workers, COST_AWARE, k=0, embeddings=None)


def test_auto_is_not_fooled_by_questions_alone_in_their_domain() -> None:
    """H24: a question alone in its domain has no neighbours; scored by the full table's group mean
    (its own row) in the neighbour arm and out of fold in the group arm, forty such questions made
    auto choose neighbours on a file where they gained nothing."""
    from rl_conductor.training.neighbours import choose_neighbours

    n, rng = 40, np.random.default_rng(3)
    rows = {"solve:cheap": list(rng.random(n) < 0.5), "solve:strong": list(rng.random(n) < 0.9)}
    table = _table(rows, {"solve:cheap": 0.0001, "solve:strong": 0.02})
    table.domains = [f"d{i}" for i in range(n)]  # every question its own domain
    table.groups = [f"d{i}/t" for i in range(n)]
    items = [replace(_task(i), domain=f"d{i}") for i in range(n)]
    got = choose_neighbours(table, items, ["cheap", "strong"], COST_AWARE, np.eye(n), k=10, shrink=1.0)
    assert got["k"] == 0 and got["gain"] == 0.0
