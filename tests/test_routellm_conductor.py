"""The bar arithmetic of benchmarks/routellm_conductor.py (evaluation/frontier.py) on known
numbers, the routellm preset's cost weight against the training split's crossovers, and the
warm start's subject neighbourhoods (``warm_group_by``) on a hand-made table."""

from __future__ import annotations

import numpy as np
import pytest

from _tasks import choice_task
from rl_conductor.errors import ConfigError
from rl_conductor.evaluation.frontier import (
    Point,
    cost_share,
    crossover_weight,
    gap_recovered,
    hull_accuracy,
    line_accuracy,
    mean_rewards,
)
from rl_conductor.policies.routers import SingleOutcomes
from rl_conductor.reward import REWARD_PRESETS
from rl_conductor.tasks.base import Task
from rl_conductor.training.candidates import Candidate, CandidateTable, group_of
from rl_conductor.training.config import TrainConfig
from rl_conductor.training.warmstart import ExpectedRewards

WEAK = Point("mixtral", 0.0001, 0.58)
STRONG = Point("gpt-4", 0.0026, 0.72)


def outcomes(correct: list[list[bool]], cost: list[list[float]], domains: list[str]) -> SingleOutcomes:
    return SingleOutcomes(
        names=["strong", "weak"],
        task_ids=[f"t{i}" for i in range(len(correct))],
        domains=domains,
        correct=np.array(correct, dtype=bool),
        cost=np.array(cost, dtype=np.float64),
    )


def test_line_share_and_gap_on_known_numbers() -> None:
    mid = (WEAK.cost + STRONG.cost) / 2
    assert line_accuracy(mid, WEAK, STRONG) == pytest.approx(0.65)
    assert line_accuracy(WEAK.cost, WEAK, STRONG) == pytest.approx(0.58)
    assert line_accuracy(STRONG.cost, WEAK, STRONG) == pytest.approx(0.72)
    assert cost_share(0.0006, WEAK, STRONG) == pytest.approx(0.2)
    assert gap_recovered(0.65, WEAK, STRONG) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="same cost"):
        line_accuracy(0.001, WEAK, Point("x", WEAK.cost, 0.9))


def test_hull_mixes_points_and_ignores_dominated_ones() -> None:
    router = Point("knn", 0.0011, 0.68)  # above the line (0.636 there)
    dominated = Point("bad", 0.0020, 0.60)
    pts = [WEAK, STRONG, router, dominated]
    assert hull_accuracy(router.cost, pts) == pytest.approx(0.68)
    # halfway between the router and GPT-4: the mix of the two
    assert hull_accuracy((router.cost + STRONG.cost) / 2, pts) == pytest.approx(0.70)
    # between Mixtral and the router
    assert hull_accuracy(0.0006, pts) == pytest.approx(0.58 + 0.10 * 0.5)
    # above the dearest point: the best point affordable
    assert hull_accuracy(0.01, pts) == pytest.approx(0.72)
    # a point below the line is not on the hull: the line itself is
    assert hull_accuracy(0.00135, [WEAK, STRONG, Point("below", 0.00135, 0.60)]) == pytest.approx(0.65)
    with pytest.raises(ValueError, match="below the cheapest"):
        hull_accuracy(0.00001, pts)


def test_crossover_weight_on_a_hand_made_table() -> None:
    base = REWARD_PRESETS["cost-aware"]  # correct_weight 0.5, cost_scale $0.01
    # strong: always right at $0.002; weak: right on half, free. Gap 0.25 = w * 0.2 -> w = 1.25
    o = outcomes([[True, True], [True, False]], [[0.002, 0.0], [0.002, 0.0]], ["math", "math"])
    assert crossover_weight(o, base, "strong", "weak") == pytest.approx(1.25, abs=1e-5)
    rewards = mean_rewards(o, base, [1.0, 1.5])
    assert rewards[1.0]["strong"] > rewards[1.0]["weak"]
    assert rewards[1.5]["strong"] < rewards[1.5]["weak"]
    # on the row where weak is right too, weak wins as soon as cost counts at all
    assert crossover_weight(o, base, "strong", "weak", rows=np.array([0])) == pytest.approx(0.0, abs=1e-5)
    # a strong worker that costs nothing is never out-earned
    free = outcomes([[True, True], [True, False]], [[0.0, 0.0], [0.0, 0.0]], ["math", "math"])
    assert crossover_weight(free, base, "strong", "weak") is None
    with pytest.raises(ValueError, match="not measured"):
        crossover_weight(o, base, "strong", "nobody")


def test_routellm_preset_weight_makes_gpt4_alone_suboptimal_yet_routing_pay() -> None:
    """On the training split: above the overall crossover, below GSM8K's (else Mixtral
    everywhere is optimal and the Conductor would sit on the line's end)."""
    from rl_conductor.policies.routers import measure_singles
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.config import load_preset
    from rl_conductor.workers.pool import load_pool

    cfg = load_preset("routellm")
    assert cfg.pool == "routellm-replay" and cfg.cost_weight is not None
    pool = load_pool(cfg.pool, seed=cfg.seed)
    tasks = load_tasks("routellm", split="train")
    import asyncio

    o = asyncio.run(measure_singles(pool, tasks))
    base = REWARD_PRESETS[cfg.reward_preset]
    strong, weak = "gpt-4-1106-preview", "mixtral-8x7b-instruct"
    overall = crossover_weight(o, base, strong, weak)
    math = crossover_weight(o, base, strong, weak, rows=np.flatnonzero(np.array(o.domains) == "math"))
    assert overall is not None and math is not None
    assert overall < cfg.cost_weight < math


# -- subject neighbourhoods of the warm start (TrainConfig.warm_group_by) ---------------------


def _mmlu(i: int, subject: str) -> Task:
    return choice_task(f"mmlu_stem/{i}", f"Question {i}?", "knowledge", "mmlu_stem", {"subject": subject})


def test_group_of_by_subject_and_bad_grouping() -> None:
    t = _mmlu(1, "astronomy")
    assert group_of(t) == "knowledge/mmlu_stem"
    assert group_of(t, "subject") == "knowledge/mmlu_stem/astronomy"
    gsm = Task(id="gsm8k/1", question="q", answer="1", domain="math", source="gsm8k", grader="math")
    assert group_of(gsm, "subject") == "math/gsm8k"  # no subject: the source group
    assert group_of(t, "domain") == "knowledge" and group_of(gsm, "domain") == "math"
    assert group_of(t, "task") == "knowledge/*" and group_of(gsm, "task") == "math/*"  # no task type
    grid = choice_task(
        "llmrouter/7",
        "Q: There are 3 houses in a row ...",
        "reasoning",
        "llmrouter",
        {"task_name": "agentverse-logicgrid"},
        answer="2",
    )
    assert group_of(grid, "task") == "reasoning/agentverse-logicgrid"
    assert group_of(grid, "domain") == "reasoning" and group_of(grid) == "reasoning/llmrouter"
    with pytest.raises(ValueError, match="group_by"):
        group_of(t, "topic")
    with pytest.raises(ConfigError, match="warm_group_by"):
        TrainConfig(warm_group_by="topic")


def _table(
    tasks: list[Task], cands: list[Candidate], correct: np.ndarray, cost: np.ndarray, by: str
) -> CandidateTable:
    """A one-condition (no budget) candidate table over ``tasks``, grouped ``by``."""
    shape = correct.shape
    return CandidateTable(
        task_ids=[t.id for t in tasks],
        domains=[t.domain for t in tasks],
        groups=[group_of(t, by) for t in tasks],
        candidates=cands,
        budgets=[None],
        correct=correct,
        cost=cost,
        stopped=np.zeros(shape, dtype=bool),
        tokens=np.zeros(shape, dtype=np.int32),
        done=np.ones(shape, dtype=bool),
    )


def test_subject_groups_route_each_subject_to_its_own_best_worker() -> None:
    """Subject A: only the strong worker is right; subject B: both are. By source the strong
    worker wins the whole domain; by subject the cheap one takes B."""
    tasks = [_mmlu(i, "A") for i in range(4)] + [_mmlu(i, "B") for i in range(4, 8)]
    cands = [Candidate.parse_name("solve:strong"), Candidate.parse_name("solve:weak")]
    shape = (len(tasks), 2, 1)
    correct = np.zeros(shape, dtype=bool)
    correct[:, 0, 0] = True  # strong always right
    correct[4:, 1, 0] = True  # weak right on subject B only
    cost = np.zeros(shape)
    cost[:, 0, 0] = 0.01

    rc = REWARD_PRESETS["cost-aware"]
    names = ["strong", "weak"]
    by_source = ExpectedRewards.fit(_table(tasks, cands, correct, cost, "source"), rc, shrink=0.0)
    assert {by_source.best(t, names, None).name for t in tasks} == {"solve:strong"}
    by_subject = ExpectedRewards.fit(
        _table(tasks, cands, correct, cost, "subject"), rc, shrink=0.0, group_by="subject"
    )
    assert by_subject.best(tasks[0], names, None).name == "solve:strong"
    assert by_subject.best(tasks[5], names, None).name == "solve:weak"


def test_domain_groups_pool_sources_the_conductor_cannot_tell_apart() -> None:
    """Two code sources: on the first the strong worker edges the cheap one (3 of 4 vs 2 of 4),
    on the second they tie. By source the second source's target is the cheap worker; by domain
    both sources get the strong one, so prompts that look alike learn one plan."""
    he = [
        Task(id=f"he/{i}", question="def f():", answer="", domain="code", source="he", grader="code")
        for i in range(4)
    ]
    mb = [
        Task(id=f"mb/{i}", question="def f():", answer="", domain="code", source="mb", grader="code")
        for i in range(4)
    ]
    tasks = he + mb
    cands = [Candidate.parse_name("solve:strong"), Candidate.parse_name("solve:cheap")]
    shape = (len(tasks), 2, 1)
    correct = np.zeros(shape, dtype=bool)
    correct[[0, 1, 2], 0, 0] = True
    correct[[0, 1], 1, 0] = True
    correct[[4, 5], :, 0] = True
    cost = np.zeros(shape)
    cost[:, 0, 0] = 0.001

    rc = REWARD_PRESETS["cost-aware"]
    names = ["strong", "cheap"]
    by_source = ExpectedRewards.fit(_table(tasks, cands, correct, cost, "source"), rc, shrink=0.0)
    assert [by_source.best(t, names, None).name for t in (he[0], mb[0])] == ["solve:strong", "solve:cheap"]
    by_domain = ExpectedRewards.fit(
        _table(tasks, cands, correct, cost, "domain"), rc, shrink=0.0, group_by="domain"
    )
    assert {by_domain.best(t, names, None).name for t in tasks} == {"solve:strong"}
    assert TrainConfig(warm_group_by="domain").warm_group_by == "domain"


def _reasoning(i: int, task_name: str | None) -> Task:
    return choice_task(f"lr/{i}", f"Q{i}?", "reasoning", "lr", {"task_name": task_name} if task_name else {})


def test_task_groups_route_each_task_type_and_keep_the_domain_whole() -> None:
    """Six logic-grid puzzles only the strong worker solves, two untyped questions both solve, two
    commonsense questions both solve. By task the puzzles get the strong worker and the others
    the cheap one; a task type never seen in training gets the plan of the whole domain (the
    strong one), not that of the untyped questions, whose group has a key of its own."""
    tasks = (
        [_reasoning(i, "grid") for i in range(6)]
        + [_reasoning(i, None) for i in (6, 7)]
        + [_reasoning(i, "commonsense") for i in (8, 9)]
    )
    cands = [Candidate.parse_name("solve:strong"), Candidate.parse_name("solve:weak")]
    shape = (len(tasks), 2, 1)
    correct = np.zeros(shape, dtype=bool)
    correct[:, 0, 0] = True
    correct[6:, 1, 0] = True
    cost = np.zeros(shape)
    cost[:, 0, 0] = 0.01
    rc = REWARD_PRESETS["cost-aware"]
    names = ["strong", "weak"]
    by_task = ExpectedRewards.fit(
        _table(tasks, cands, correct, cost, "task"), rc, shrink=0.0, group_by="task"
    )
    assert [by_task.best(t, names, None).name for t in (tasks[0], tasks[6], tasks[8])] == [
        "solve:strong",
        "solve:weak",
        "solve:weak",
    ]
    assert sorted(by_task.rows_by_key["reasoning"]) == list(range(10))
    unseen = _reasoning(10, "arithmetic")
    assert by_task.best(unseen, names, None).name == "solve:strong"
    by_domain = ExpectedRewards.fit(
        _table(tasks, cands, correct, cost, "domain"), rc, shrink=0.0, group_by="domain"
    )
    assert {by_domain.best(t, names, None).name for t in tasks} == {"solve:strong"}
