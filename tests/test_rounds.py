"""Rounds (``RequestLimits.max_rounds``): a one-round request behaves exactly as before rounds existed,
later rounds keep the deadline and the privacy rule, see what came before and are recorded; the
cascade baseline escalates only on disagreement, compared by the project's answer extraction.

The budget, privacy and call-cap property over random workflows and reviews is in
``test_executor.py`` (``test_limits_are_never_violated``); the Conductor's own review is in
``test_conductor_policy.py``.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _pools import rising_pool
from _tasks import choice_task
from one_round_cases import golden_lines, run_cases
from rl_conductor.errors import UserError
from rl_conductor.executor import Continuation, RoundRequest, execute
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.cascade import Cascade, cascade_outcomes, fit_cascade, measure_samples
from rl_conductor.policies.catalog import make_policy
from rl_conductor.rounds import summarize
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.tasks.graders import answers_agree
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool, load_pool
from rl_conductor.workflow import Step, Workflow

TASK = Task(id="t/1", question="What is 6 * 7?", answer="42", domain="math", source="test", grader="math")
EPS = 1e-9


# --------------------------------------------------------------------------- one round = before


def test_one_round_traces_are_byte_identical_to_before_rounds() -> None:
    """Every (pool, policy, limits, task) case of ``one_round_cases`` gives, with rounds in the
    code and ``max_rounds: 1``, the trace today's code gave before rounds existed, byte for byte
    in everything it recorded then."""
    got, want = run_cases(), golden_lines()
    assert len(got) == len(want) == 256
    differ = [
        json.loads(g)["policy"] + "/" + json.loads(g)["limits"]
        for g, w in zip(got, want, strict=True)
        if g != w
    ]
    assert differ == []
    pool = rising_pool("1", "2", "3")
    one = asyncio.run(make_policy("single:w0", pool).run(TASK, pool.view(), RequestLimits()))
    assert one.trace.rounds == []  # the projection drops the field: a one-round trace records none
    ep = asyncio.run(make_policy("cascade:w0,w1>w2", pool).run(TASK, pool.view(), RequestLimits()))
    assert ep.trace.rounds  # (a cascade is two rounds by definition, so it does record them)


async def test_a_one_round_request_never_calls_the_review() -> None:
    pool = rising_pool("\\boxed{1}")
    calls: list[int] = []

    async def review(req: RoundRequest) -> Continuation:
        calls.append(req.round)
        return Continuation(workflow=Workflow(steps=(Step(0, "again", ()),)))

    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)), TASK, pool.view(), RequestLimits(), review=review
    )
    assert calls == [] and trace.rounds == [] and len(trace.steps) == 1


# --------------------------------------------------------------------------- what a round sees and does


async def test_a_later_round_sees_the_earlier_answers_and_starts_after_them() -> None:
    w0 = FakeWorker(info=fake_info("w0"), answer="\\boxed{41}", latency_s=0.01)
    w1 = FakeWorker(info=fake_info("w1", price_out=20.0), answer="\\boxed{42}", latency_s=0.01)
    view = Pool(name="p", workers=[w0, w1]).view()
    seen: list[RoundRequest] = []

    async def review(req: RoundRequest) -> Continuation:
        seen.append(req)
        if req.round == 2:
            added = (Step(1, "check both", "all"), Step(0, "fresh", ()))
            return Continuation(workflow=Workflow(steps=added), text="t", seen="p")
        return Continuation(workflow=Workflow(steps=()))

    first = Workflow(steps=(Step(0, "a", ()), Step(0, "b", ())))
    trace = await execute(first, TASK, view, RequestLimits(max_rounds=3, max_cost_usd=1.0), review=review)
    assert [r.round for r in seen] == [2, 3]
    assert seen[0].answer == "\\boxed{41}" and len(seen[0].records) == 2
    assert seen[0].limits.max_cost_usd == pytest.approx(1.0 - trace.rounds[0].cost_usd, rel=1e-6)
    assert len(seen[1].workflow.steps) == 4  # the second review sees every step so far
    msg = w1.calls[0]["messages"][0]["content"]  # type: ignore[index]
    assert "[Step 0] Answer:\n\\boxed{41}" in msg and "[Step 1] Answer:\n\\boxed{41}" in msg
    third, fourth = trace.steps[2:]
    round_one_end = max(s.started_s + s.latency_s for s in trace.steps[:2])
    assert third.visible == [0, 1] and third.started_s >= round_one_end > 0
    assert fourth.visible == [] and fourth.started_s >= round_one_end  # it waited for the review too
    assert [(r.index, r.decision, r.steps) for r in trace.rounds] == [
        (1, "plan", [0, 1]),
        (2, "continue", [2, 3]),
        (3, "keep", []),
    ]
    assert trace.rounds[1].seen and len(trace.rounds[1].seen) == 16 and trace.rounds[1].plan_text == "t"
    assert trace.final_answer == "\\boxed{41}" and trace.rounds_run == 2  # the last answered step
    assert sum(r.cost_usd for r in trace.rounds) == pytest.approx(trace.cost_usd)


async def test_no_review_when_the_budget_or_the_calls_are_spent() -> None:
    pool = rising_pool("\\boxed{1}")
    called: list[int] = []

    async def review(req: RoundRequest) -> Continuation:
        called.append(req.round)
        return Continuation(workflow=Workflow(steps=tuple(Step(0, f"again {k}", ()) for k in range(3))))

    one = Workflow(steps=(Step(0, "solve", ()),))
    capped = await execute(one, TASK, pool.view(), RequestLimits(max_rounds=3, max_calls=1), review=review)
    assert called == [] and [r.decision for r in capped.rounds] == ["plan", "stop"]
    assert "call cap" in capped.rounds[1].reason and len(capped.attempts) == 1
    # a continuation longer than the calls left is cut to them
    cut = await execute(one, TASK, pool.view(), RequestLimits(max_rounds=2, max_calls=2), review=review)
    assert len(cut.steps) == 2 and len(cut.attempts) == 2 and "truncated to 1" in cut.rounds[1].reason


async def test_a_failing_or_invalid_review_keeps_the_answer() -> None:
    pool = rising_pool("\\boxed{1}")

    async def broken(req: RoundRequest) -> Continuation:
        raise RuntimeError("no")

    async def invalid(req: RoundRequest) -> Continuation:
        return Continuation(workflow=Workflow(steps=(Step(5, "x", ()),)))

    one = Workflow(steps=(Step(0, "solve", ()),))
    for hook, why in ((broken, "review failed"), (invalid, "invalid continuation")):
        trace = await execute(one, TASK, pool.view(), RequestLimits(max_rounds=2), review=hook)
        assert trace.rounds[1].decision == "stop" and why in trace.rounds[1].reason
        assert trace.final_answer == "\\boxed{1}" and len(trace.steps) == 1


async def test_a_later_round_on_a_private_request_calls_no_external_worker() -> None:
    inside = FakeWorker(info=fake_info("inside", hosting="self"), answer="\\boxed{1}")
    outside = FakeWorker(info=fake_info("outside", hosting="external", price_out=50.0), answer="\\boxed{2}")
    view = Pool(name="p", workers=[inside, outside]).view()

    async def escalate(req: RoundRequest) -> Continuation:
        return Continuation(workflow=Workflow(steps=(Step(1, "escalate", ()),)))

    trace = await execute(
        Workflow(steps=(Step(0, "solve", ()),)),
        TASK,
        view,
        RequestLimits(max_rounds=2, sensitivity="private"),
        review=escalate,
    )
    assert outside.calls == [] and trace.workers_called == ["inside", "inside"]


POOL = load_pool("paper-sim")
VIEW = POOL.view()
TASKS = load_tasks("paper-mix", split="test", limit=8, seed=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.floats(0.5, 60.0, allow_nan=False),
    st.integers(0, len(TASKS) - 1),
    st.lists(st.lists(st.integers(0, len(VIEW) - 1), min_size=1, max_size=3), min_size=1, max_size=3),
    st.sampled_from([None, 0.002, 0.05]),
)
def test_the_deadline_holds_across_rounds(
    deadline: float, task_index: int, rounds: list[list[int]], budget: float | None
) -> None:
    """Whatever the reviews add, no step of any round ends after the deadline on the critical
    path and the budget is never exceeded (the simulated pool's latency model)."""

    left: list[float | None] = []  # asserted after the run: an assert in the hook is a failed review

    async def review(req: RoundRequest) -> Continuation:
        left.append(req.limits.max_latency_s)
        workers = rounds[(req.round - 2) % len(rounds)]
        return Continuation(workflow=Workflow(steps=tuple(Step(w, "check", "all") for w in workers)))

    limits = RequestLimits(max_latency_s=deadline, max_cost_usd=budget, max_rounds=1 + len(rounds))
    first = Workflow(steps=(Step(rounds[0][0], "solve", ()),))
    trace = asyncio.run(execute(first, TASKS[task_index], VIEW, limits, review=review))
    assert all(t is not None and 0 < t <= deadline for t in left), left
    assert trace.latency_s <= deadline + EPS
    for s in trace.steps:
        assert s.started_s + s.latency_s <= deadline + EPS
    if budget is not None:
        assert trace.cost_usd <= budget
    assert trace.rounds and trace.rounds[0].decision == "plan"


# --------------------------------------------------------------------------- agreement and the cascade


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("so \\boxed{0.5}", "The answer is 1/2.", True),
        ("\\boxed{42}", "#### 42", True),
        ("\\boxed{42}", "\\boxed{41}", False),
        ("no answer here at all", "no answer here at all", False),
    ],
)
def test_answers_agree_compares_extracted_answers(a: str, b: str, same: bool) -> None:
    assert answers_agree(a, b, TASK) is same


def test_answers_agree_on_multiple_choice() -> None:
    mc = choice_task("m", "Q?\nA. x\nB. y", "knowledge", "t", {"choices": ["x", "y"]}, answer="B")
    assert answers_agree("The answer is B", "B", mc) and not answers_agree("A", "B", mc)


async def test_the_cascade_escalates_only_when_the_cheap_answers_disagree() -> None:
    agree = rising_pool("\\boxed{42}", "so 42 it is: \\boxed{42}", "\\boxed{7}")
    cascade = Cascade(("w0", "w1"), "w2")
    ep = await cascade.run(TASK, agree.view(), RequestLimits())
    assert [s.worker for s in ep.trace.steps] == ["w0", "w1"] and ep.trace.rounds[1].decision == "keep"
    assert ep.trace.rounds[1].agree is True
    differ = rising_pool("\\boxed{41}", "\\boxed{42}", "\\boxed{42}")
    ep = await Cascade(("w0", "w1"), "w2").run(TASK, differ.view(), RequestLimits())
    assert [s.worker for s in ep.trace.steps] == ["w0", "w1", "w2"] and ep.trace.rounds[
        1
    ].decision == "continue"
    assert ep.trace.rounds[1].agree is False and ep.trace.final_answer == "\\boxed{42}"
    # the summary the cascade read is the one a review prompt shows
    assert (
        summarize(
            RoundRequest(
                TASK, differ.view(), Workflow(steps=()), tuple(ep.trace.steps[:2]), "", 2, RequestLimits()
            )
        ).line()
        == "The answers so far disagree."
    )


def test_cascade_specs() -> None:
    pool = rising_pool("1", "2", "3")
    assert make_policy("cascade:w0*2>w2", pool).name == "cascade:w0*2>w2"
    assert make_policy("cascade:w0,w1", pool).name == "cascade:w0,w1"
    for bad in ("cascade:w0>w2", "cascade:w0*3>w2", "cascade:w0,w9>w2"):
        with pytest.raises(UserError, match=r"cascade|w9"):
            make_policy(bad, pool)


def test_the_fit_replays_what_the_cascade_earns(capsys) -> None:
    """The fitted (pair, escalation) on measured questions earns, run for real through the
    executor, exactly the accuracy and cost the fit computed (replay of the measured calls)."""
    from rl_conductor.evaluation.runner import evaluate
    from rl_conductor.reward import REWARD_PRESETS

    pool = load_pool("routellm-replay")
    tasks = load_tasks("routellm", split="train", limit=40, seed=1)
    outcomes = asyncio.run(measure_samples(pool, tasks))
    assert "sample 2 workers x" in capsys.readouterr().err  # progress off a terminal (attack 31 F11)
    config = REWARD_PRESETS["cost-aware"]
    fits = fit_cascade(outcomes, tasks, config, cheap_only=False)
    assert fits == sorted(fits, key=lambda f: (-f.mean_reward, f.mean_cost_usd))
    best = fits[0]
    names = outcomes.names
    pair = (names.index(best.first[0]), names.index(best.first[1]))
    up = None if best.escalate is None else names.index(best.escalate)
    out = cascade_outcomes(outcomes, tasks, pair, up, config)
    res = evaluate(
        Cascade(best.first, best.escalate),
        pool.view(),
        tasks,
        RequestLimits(),
        progress=False,
        reward_config=config,
    )
    s = res.summary()
    assert s["accuracy"] == pytest.approx(float(out["correct"].mean()))
    assert s["mean_cost_usd"] == pytest.approx(float(out["cost"].mean()), rel=1e-9)
    assert s["mean_reward"] == pytest.approx(best.mean_reward, rel=1e-9)


# --------------------------------------------------------------------------- round-2 warm-start targets


def test_review_targets_keep_where_answers_agree_and_escalate_where_they_disagree() -> None:
    """Two cheap workers agree on the easy questions (both right) and disagree on the hard ones
    (both wrong); the dear worker is right on both. The target keeps the answer after agreement and
    escalates to the dear worker after disagreement, and each record's prompt is the review prompt
    the Conductor would see, its completion a parseable continuation."""
    from tests.test_adaptive_training import _pool, _tasks

    from rl_conductor.reward import REWARD_PRESETS
    from rl_conductor.training.rounds import review_examples, review_sft_records, review_targets
    from rl_conductor.workflow import parse

    view, tasks = _pool().view(), _tasks(range(3))
    first = Workflow(steps=(Step(0, "solve", ()), Step(1, "solve", ())))
    rc = REWARD_PRESETS["cost-aware"]
    examples = asyncio.run(review_examples(tasks, view, [first], rc))
    assert {ex.signal for ex in examples} == {"The answers so far agree.", "The answers so far disagree."}
    targets = review_targets(examples)
    assert targets[(0, "The answers so far agree.")] == "keep"
    assert targets[(0, "The answers so far disagree.")] == "+dear"
    records = review_sft_records(examples, view)
    assert len(records) == len(tasks)
    for ex, rec in zip(examples, records, strict=True):
        prompt = rec["prompt"][0]["content"]  # type: ignore[index]
        assert "Workflow so far:" in prompt and ex.signal in prompt
        done = parse(rec["completion"][0]["content"], pool_size=3, allow_empty=True, first_index=2)  # type: ignore[index]
        assert done.workers() == ([] if ex.task_id.startswith("easy") else [2])
