"""Rewards: the paper preset (0 / 0.5 / 1), the cost term and its cap, the budget penalty,
and grading of real traces produced by the executor on fake workers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_conductor import reward as reward_module
from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.prompting import conductor_prompt
from rl_conductor.reward import REWARD_PRESETS, RewardConfig, budget_stopped, grade_trace, trace_reward
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Attempt, StepRecord, Trace
from rl_conductor.training.grpo_reward import ConductorReward
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool
from rl_conductor.workflow import Step, Workflow

PAPER = REWARD_PRESETS["paper"]
COST_AWARE = REWARD_PRESETS["cost-aware"]
TASK = Task(id="m/1", question="What is 6 * 7?", answer="42", domain="math", source="test", grader="math")


def _reward(
    config: RewardConfig,
    *,
    parsed: bool = True,
    correct: bool = False,
    cost: float = 0.0,
    over: bool = False,
    calls: int = 1,
    late: bool = False,
) -> float:
    """:func:`trace_reward` of a trace with that cost, ``calls`` worker calls, a step the budget
    skipped when ``over`` and one the deadline skipped when ``late``."""
    steps = [
        StepRecord(
            index=0,
            worker="w",
            instruction="solve",
            visible=[],
            cost_usd=cost,
            attempts=[Attempt(worker="w", status="ok") for _ in range(calls)],
        )
    ]
    if over:
        steps.append(
            StepRecord(index=1, worker="w", instruction="check", visible=[0], status="skipped_budget")
        )
    if late:
        steps.append(
            StepRecord(index=2, worker="w", instruction="check", visible=[0], status="skipped_deadline")
        )
    return trace_reward(Trace(task_id="t", steps=steps), correct, config, parsed=parsed)


@pytest.mark.parametrize("cost", [0.0, 0.02, 5.0])
@pytest.mark.parametrize("over", [False, True])
def test_paper_preset_gives_0_half_1(cost: float, over: bool) -> None:
    assert _reward(PAPER, parsed=False, correct=True, cost=cost, over=over) == 0.0
    assert _reward(PAPER, correct=False, cost=cost, over=over) == 0.5
    assert _reward(PAPER, correct=True, cost=cost, over=over) == 1.0


def test_cost_term_reduces_reward_and_is_capped() -> None:
    c = COST_AWARE
    assert _reward(c, correct=True) == 1.0
    assert _reward(c, correct=True, cost=c.cost_scale) == pytest.approx(1.0 - c.cost_weight)
    assert _reward(c, correct=True, cost=c.cost_scale / 2) == pytest.approx(1.0 - c.cost_weight / 2)
    # far beyond the scale the penalty stops at max_cost_penalty
    assert _reward(c, correct=True, cost=100.0) == pytest.approx(1.0 - c.max_cost_penalty)
    assert _reward(c, correct=False, cost=100.0) == pytest.approx(0.5 - c.max_cost_penalty)
    # an unparseable plan scores 0 whatever it cost
    assert _reward(c, parsed=False, cost=100.0, over=True) == 0.0


@given(st.floats(0, 10), st.floats(0, 10), st.booleans(), st.booleans())
def test_reward_is_monotone_in_cost_and_correct_never_loses_at_equal_cost(
    a: float, b: float, correct: bool, over: bool
) -> None:
    lo, hi = sorted((a, b))
    assert _reward(COST_AWARE, correct=correct, cost=lo, over=over) >= _reward(
        COST_AWARE, correct=correct, cost=hi, over=over
    )
    assert _reward(COST_AWARE, correct=True, cost=a, over=over) > _reward(
        COST_AWARE, correct=False, cost=a, over=over
    )


def test_budget_penalty_applies_when_budget_stopped() -> None:
    ran = Trace(task_id="x", steps=[StepRecord(0, "w", "s", [], status="ok", answer="1")])
    stopped = Trace(
        task_id="x",
        steps=[
            StepRecord(0, "w", "s", [], status="ok", answer="1"),
            StepRecord(1, "w", "s", [0], status="skipped_budget"),
        ],
    )
    failed = Trace(task_id="x", steps=[StepRecord(0, "w", "s", [], status="failed")])
    assert not budget_stopped(ran) and budget_stopped(stopped) and not budget_stopped(failed)
    c = COST_AWARE
    assert _reward(c, correct=True, over=budget_stopped(stopped)) == pytest.approx(1.0 - c.budget_penalty)
    assert _reward(c, correct=True, over=budget_stopped(ran)) == 1.0


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="cost_scale"):
        RewardConfig(cost_scale=0.0)
    with pytest.raises(ValueError, match="budget_penalty"):
        RewardConfig(budget_penalty=-1.0)
    assert RewardConfig().to_dict()["format_bonus"] == 0.5


async def test_grade_and_reward_real_traces() -> None:
    right = FakeWorker(
        info=fake_info("right", price_in=0.0, price_out=10.0), answer="so \\boxed{42}", output_tokens=500
    )
    wrong = FakeWorker(info=fake_info("wrong", price_in=0.0, price_out=0.0), answer="\\boxed{41}")
    view = Pool(name="p", workers=[right, wrong]).view()
    ok = await execute(Workflow(steps=(Step(0, "solve", ()),)), TASK, view)
    assert grade_trace(TASK, ok) and not budget_stopped(ok)
    assert ok.cost_usd == pytest.approx(500 * 10 / 1e6)
    r = _reward(COST_AWARE, correct=grade_trace(TASK, ok), cost=ok.cost_usd, over=budget_stopped(ok))
    assert r == pytest.approx(1.0 - COST_AWARE.cost_weight * 0.005 / COST_AWARE.cost_scale)

    # a budget too small for the right worker: its step is skipped, the cheap wrong answer stands
    limited = await execute(
        Workflow(steps=(Step(1, "draft", ()), Step(0, "solve", "all"))),
        TASK,
        view,
        RequestLimits(max_cost_usd=1e-4),
    )
    assert budget_stopped(limited) and not grade_trace(TASK, limited)
    assert limited.final_answer == "\\boxed{41}"
    assert _reward(COST_AWARE, correct=False, cost=limited.cost_usd, over=True) == pytest.approx(0.25)

    empty = Trace(task_id=TASK.id)
    assert not grade_trace(TASK, empty)


def test_no_worker_call_earns_no_format_bonus() -> None:
    """Finding 1: a plan that called nobody (0.5) out-earned a real wrong plan (0.4995)."""
    for config in (PAPER, COST_AWARE):
        nothing = _reward(config, correct=False, calls=0)
        real_wrong = _reward(config, correct=False, cost=5e-4, calls=1)
        assert nothing == 0.0 < real_wrong
    assert _reward(COST_AWARE, correct=False, over=True, calls=0) < 0  # budget-stopped before any call


def test_grade_cache_is_bounded_and_keys_on_a_digest() -> None:
    cache = reward_module._GradeCache(maxsize=3)
    for i in range(10):
        assert cache.grade(TASK, f"\\boxed{{{40 + i}}}") == (i == 2)
    assert len(cache) == 3
    assert all(isinstance(k[1], bytes) and len(k[1]) == 32 for k in cache._grades)
    assert cache.grade(TASK, "\\boxed{42}")  # evicted, graded again, still right


def _paper_sim_reward(tmp_pool: Pool) -> ConductorReward:
    return ConductorReward(tmp_pool, {TASK.id: TASK}, PAPER, RequestLimits(max_steps=5))


async def test_training_reward_gives_an_out_of_view_id_nothing() -> None:
    """Finding 1 end to end: ``model_id = [size]`` (once the Conductor's own id) is unparseable
    (reward 0), and a real wrong call earns more than doing nothing; rollouts run one round."""
    wrong = FakeWorker(info=fake_info("wrong", price_in=1.0, price_out=2.0), answer="\\boxed{41}")
    pool = Pool(name="p", workers=[wrong, FakeWorker(info=fake_info("other"), answer="\\boxed{40}")])
    reward = _paper_sim_reward(pool)
    beyond = 'model_id = [2]\nsubtasks = ["review"]\naccess_list = [[]]'
    real = 'model_id = [0]\nsubtasks = ["solve"]\naccess_list = [[]]'
    got = await reward(
        [None, None], [beyond, real], task_id=[TASK.id] * 2, view=[[0, 1]] * 2, budget=[-1.0] * 2
    )
    assert got[0] == 0.0
    assert got[1] == pytest.approx(0.5)
    assert wrong.calls and len(wrong.calls) == 1
    with pytest.raises(ValueError, match="max_rounds=2"):
        ConductorReward(pool, {}, PAPER, RequestLimits(max_rounds=2))


def test_prompt_never_offers_an_id_beyond_the_view() -> None:
    view = Pool(name="p", workers=[FakeWorker(info=fake_info("a")), FakeWorker(info=fake_info("b"))]).view()
    for limits in (RequestLimits(), RequestLimits(max_rounds=3)):
        text = conductor_prompt(TASK, view, limits)
        assert "1: " in text and "2: " not in text and "yourself" not in text


#: One plan's outcome: correct, an estimated probability, cost, budget stop, deadline stop, calls.
CELL = st.tuples(
    st.booleans(), st.floats(0, 1), st.floats(0, 10), st.booleans(), st.booleans(), st.integers(0, 3)
)


@given(
    st.lists(CELL, min_size=1, max_size=30),
    st.sampled_from([PAPER, COST_AWARE, RewardConfig(cost_weight=5.0, max_cost_penalty=0.1)]),
)
def test_one_formula_over_scalars_and_arrays(cells: list[tuple], config: RewardConfig) -> None:
    """reward_of over arrays (the routers', the cascade's, the warm start's tables) is, cell by
    cell and to the bit, trace_reward of one plan (evaluation, training): one formula."""
    import numpy as np

    from rl_conductor.reward import reward_of

    correct, p, cost, over, late, calls = (np.array(c) for c in zip(*cells, strict=True))
    got = reward_of(
        config, correct=correct, cost=cost, called=calls > 0, budget_stopped=over, deadline_stopped=late
    )
    for i, (ok, _, c, o, d, n) in enumerate(cells):
        one = _reward(config, correct=ok, cost=c, over=o, calls=n, late=d)
        assert got[i] == one and isinstance(one, float)
        assert (
            reward_of(config, correct=ok, cost=c, called=n > 0, budget_stopped=o, deadline_stopped=d) == one
        )
    # an estimated probability of being correct scores like the expected reward
    expected = reward_of(config, correct=p, cost=cost)
    both = p * reward_of(config, correct=True, cost=cost) + (1 - p) * reward_of(
        config, correct=False, cost=cost
    )
    assert np.allclose(expected, both)


def test_reward_config_overrides_any_term_of_a_preset() -> None:
    from rl_conductor.reward import reward_config

    assert reward_config("paper", correct_weight=2.0, cost_weight=None) == RewardConfig(
        cost_weight=0.0, budget_penalty=0.0, deadline_penalty=0.0, correct_weight=2.0
    )
    assert reward_config(cost_weight=0.25, cost_scale=0.02) == RewardConfig(cost_weight=0.25, cost_scale=0.02)
    with pytest.raises(ValueError, match="unknown reward terms"):
        reward_config("paper", cost_wieght=1.0)
    with pytest.raises(ValueError, match="unknown reward preset"):
        reward_config("cheap")
    # a model's own reward as the base: only the named term moves
    own = RewardConfig(cost_weight=0.25, cost_scale=0.02, budget_penalty=0.1)
    assert reward_config(own, cost_weight=0.13) == RewardConfig(
        cost_weight=0.13, cost_scale=0.02, budget_penalty=0.1
    )
    assert reward_config(own, cost_weight=None) == own
    with pytest.raises(ValueError, match="unknown reward terms"):
        reward_config(own, weight=1.0)
