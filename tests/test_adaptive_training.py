"""A Conductor trained to use rounds (training/adaptive.py): first plans valued with their best
review, review prompts in the SFT records, and a trained folder that reviews.

The hand-built pool: two cheap workers agree on the easy questions (both right) and disagree on the
hard ones (both wrong, apart); a dear worker is right on both. Keeping after agreement and
escalating to the dear worker after disagreement is then optimal, and the pair with that review
is worth more than the dear worker alone.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rl_conductor.limits import RequestLimits
from rl_conductor.prompting import cut
from rl_conductor.reward import REWARD_PRESETS
from rl_conductor.tasks.base import Task
from rl_conductor.training.candidates import build_table
from rl_conductor.training.config import TrainConfig
from rl_conductor.training.data import PromptSpec, warm_sft_records
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool
from rl_conductor.workflow import parse, render

AGREE = "The answers so far agree."
DISAGREE = "The answers so far disagree."


def _answer(name: str) -> Any:
    def reply(messages: Any, ctx: Any) -> str:
        hard = ctx.task.id.startswith("hard")
        off = {"a": 2, "b": 1}.get(name, 0) if hard else 0
        return f"\\boxed{{{int(ctx.task.answer) + off}}}"

    return reply


def _pool(answer: Any = _answer, name: str = "hand-built-rounds") -> Pool:
    """Two cheap workers, right on the easy questions and wrong apart on the hard ones, and a dear
    one right on both (``answer(worker name)`` writes each worker's replies)."""
    workers = [
        FakeWorker(info=fake_info(n, price_in=p, price_out=p), responder=answer(n))
        for n, p in (("a", 0.1), ("b", 0.1), ("dear", 50.0))
    ]
    return Pool(name=name, workers=list(workers))


def _tasks(numbers: range = range(1, 7), *, kinds: tuple[str, ...] = ("easy", "hard")) -> list[Task]:
    """``easy/i`` and ``hard/i`` (one per ``kinds``): 'What is i + i?' for each i of ``numbers``."""
    return [
        Task(
            id=f"{kind}/{i}",
            question=f"What is {i} + {i}?",
            answer=str(2 * i),
            domain="math",
            source="t",
            grader="math",
        )
        for kind in kinds
        for i in numbers
    ]


def _cfg(tmp_path: Path, **kw: Any) -> TrainConfig:
    return TrainConfig(
        pool="unused",
        warm_items_per_domain=100,
        warm_top_k=2,
        warm_cheap_k=1,
        warm_pair_k=2,
        max_steps_per_workflow=2,
        budgets_usd=[],
        warm_cache_dir=str(tmp_path / "cache"),
        **kw,
    )


def rounds_micro_config(tmp_path: Path, **kw: Any) -> TrainConfig:
    """The micro Conductor (tests/_tiny.py) trained for two rounds on gsm8k-six with the
    expected-best warm start: the slow tests of trained reviewing Conductors."""
    from _tiny import micro_config

    return micro_config(
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        pool="gsm8k-six",
        sft_targets="expected-best",
        max_rounds=2,
        warm_items_per_domain=48,
        warm_top_k=2,
        warm_cheap_k=1,
        budgets_usd=[],
        budget_prob=0.0,
        random_pool_prob=0.0,
        grpo_steps=1,
        warm_cache_dir=str(tmp_path / "cache"),
        **kw,
    )


def _specs(tasks: list[Task], pool: Pool) -> list[PromptSpec]:
    return [PromptSpec(task=t, view=tuple(range(len(pool))), budget=None) for t in tasks]


def test_without_rounds_the_table_targets_and_sft_records_are_unchanged(tmp_path: Path) -> None:
    from rl_conductor.training.train import _warm_start
    from rl_conductor.training.warmstart import ExpectedRewards

    pool, tasks = _pool(), _tasks()
    targets, _, _, rule = _warm_start(_cfg(tmp_path), tasks, pool)
    assert rule is None
    table = build_table(tasks, pool, top_k=2, cheap_k=1, max_steps=2)
    direct = ExpectedRewards.fit(table, REWARD_PRESETS["cost-aware"], shrink=20.0)
    assert [c.name for c in targets.candidates] == [c.name for c in table.candidates]
    assert not any("|" in c.name for c in targets.candidates)  # no parallel pairs without rounds
    lim = RequestLimits(max_steps=2)
    specs = _specs(tasks, pool)
    assert warm_sft_records(specs, pool, lim, targets, max_question_chars=120) == warm_sft_records(
        specs, pool, lim, direct, max_question_chars=120
    )


def test_with_rounds_the_pair_is_the_target_and_reviews_keep_or_escalate(tmp_path: Path) -> None:
    from rl_conductor.training.adaptive import review_records
    from rl_conductor.training.train import _warm_start

    pool, tasks = _pool(), _tasks()
    targets, _, _, rule = _warm_start(_cfg(tmp_path, max_rounds=2), tasks, pool)
    assert rule == {
        ("math", "solve:b|solve:a", AGREE): "keep",
        ("math", "solve:b|solve:a", DISAGREE): "+dear",
    }
    names = pool.names()
    # valued with its review, the pair beats the dear worker alone (same accuracy, less cost)
    assert targets.best(tasks[0], names, None).name == "solve:b|solve:a"
    specs = _specs(tasks, pool)
    firsts = [targets.target(s.task, names, None) for s in specs]
    records = review_records(specs, pool, RequestLimits(max_steps=2), firsts, rule, max_question_chars=120)
    assert len(records) == len(tasks)  # 6 agree, 6 disagree: balanced already
    for rec in records:
        prompt = rec["prompt"][0]["content"]
        hard = DISAGREE in prompt
        assert "Workflow so far:" in prompt and (hard or AGREE in prompt)
        done = parse(rec["completion"][0]["content"], pool_size=3, allow_empty=True, first_index=2)
        assert done.workers() == ([2] if hard else [])
    # few-shot questions share their opening: the review cuts the question as the first round does
    shots = "Here are worked examples of sums. " * 10
    long = [
        PromptSpec(task=replace(s.task, question=shots + s.task.question), view=s.view, budget=None)
        for s in specs
    ]
    for how in ("head", "ends"):
        cut_records = review_records(
            long, pool, RequestLimits(max_steps=2), firsts, rule, max_question_chars=60, question_cut=how
        )
        assert cut_records
        for rec in cut_records:
            shown = rec["prompt"][0]["content"]
            assert any(cut(spec.task.question, 60, how) in shown for spec in long)
            assert ("What is" in shown) == (how == "ends")  # the item's own words


def test_review_records_teach_keep_and_escalate_equally_often(tmp_path: Path) -> None:
    """Two easy questions (the pair agrees: keep) against ten hard ones (it disagrees: escalate):
    the review records repeat the rarer decision until both are as common, so a small Conductor
    cannot score well on them by always escalating (it did, on gsm8k-six, where ~80 % disagree)."""
    from rl_conductor.training.adaptive import review_records
    from rl_conductor.training.train import _warm_start

    pool = _pool()
    tasks = [t for t in _tasks() if t.id.startswith("hard")] + _tasks(range(7, 11), kinds=("hard",))
    tasks += [t for t in _tasks() if t.id in ("easy/1", "easy/2")]
    targets, _, _, rule = _warm_start(_cfg(tmp_path, max_rounds=2), tasks, pool)
    names = pool.names()
    specs = _specs(tasks, pool)
    firsts = [targets.target(s.task, names, None) for s in specs]
    assert all(len(f.steps) == 2 for f in firsts)  # the pair, valued with its review
    records = review_records(specs, pool, RequestLimits(max_steps=2), firsts, rule, max_question_chars=120)
    kinds = [
        parse(r["completion"][0]["content"], pool_size=3, allow_empty=True, first_index=2).workers()
        for r in records
    ]
    assert kinds.count([]) == kinds.count([2]) == 10 and len(kinds) == 20
    agree = [r for r, k in zip(records, kinds, strict=True) if AGREE in r["prompt"][0]["content"]]
    assert len(agree) == 10 and all(k == [] for r, k in zip(records, kinds, strict=True) if r in agree)


def test_review_records_keep_after_first_plans_the_rule_does_not_cover(tmp_path: Path) -> None:
    """A chain, a single and a prompt with a budget were valued without a review, so their review
    target is keep. Before, they gave no review record at all, and a Conductor that had only seen
    reviews of pairs escalated after every chain (paper-sim code: 67 % -> 43 %)."""
    from rl_conductor.training.adaptive import pair, review_records
    from rl_conductor.training.train import _warm_start
    from rl_conductor.workflow import Step, Workflow

    pool, tasks = _pool(), _tasks()
    _, _, _, rule = _warm_start(_cfg(tmp_path, max_rounds=2), tasks, pool)
    assert rule
    hard = [t for t in tasks if t.id.startswith("hard")]
    chain = Workflow(steps=(Step(1, "Solve it.", ()), Step(0, "Check the answer.", "all")))
    alone = Workflow(steps=(Step(1, "Solve it.", ()),))
    budget = [PromptSpec(task=t, view=(0, 1, 2), budget=1.0) for t in hard]
    specs = _specs(hard, pool) * 2 + budget
    firsts = [chain] * len(hard) + [alone] * len(hard) + [chain] * len(budget)
    records = review_records(specs, pool, RequestLimits(max_steps=2), firsts, rule, max_question_chars=120)
    # the 6 singles' reviews, and as many of the 12 after chains (unlimited or under a budget)
    assert len(records) == 12
    after_chain = [r for r in records if "Check the answer." in r["prompt"][0]["content"]]
    assert len(after_chain) == 6
    for rec in records:
        assert "Workflow so far:" in rec["prompt"][0]["content"]
        done = parse(rec["completion"][0]["content"], pool_size=3, allow_empty=True, first_index=2)
        assert done.workers() == []
    # a ruled pair under a budget: the table valued it without a review, so keep, whatever the
    # rule would do after it unlimited (it escalates on these hard questions)
    pair_wf = pair("b", "a").workflow(pool.names())
    limited = review_records(
        budget, pool, RequestLimits(max_steps=2), [pair_wf] * 6, rule, max_question_chars=120
    )
    assert len(limited) == 6
    assert all(
        parse(r["completion"][0]["content"], pool_size=3, allow_empty=True, first_index=2).workers() == []
        for r in limited
    )
    only_chains = review_records(
        specs[:6], pool, RequestLimits(max_steps=2), firsts[:6], rule, max_question_chars=120
    )
    assert len(only_chains) == 6  # no ruled review to balance against: every keep


def test_grpo_rollouts_continue_by_the_review_rule(tmp_path: Path) -> None:
    """With the rule, a rollout of the pair pays for the escalation on hard questions only and
    is graded on the final answer after it (without the rule the hard questions are wrong)."""
    from rl_conductor.training.adaptive import pair
    from rl_conductor.training.grpo_reward import ConductorReward
    from rl_conductor.training.train import _warm_start

    pool, tasks = _pool(), _tasks()
    _, _, _, rule = _warm_start(_cfg(tmp_path, max_rounds=2), tasks, pool)
    rc = REWARD_PRESETS["cost-aware"]
    text = render(pair("b", "a").workflow(pool.names()))
    by_id = {t.id: t for t in tasks}
    plain = ConductorReward(pool, by_id, rc, RequestLimits(max_steps=2))
    ruled = ConductorReward(pool, by_id, rc, RequestLimits(max_steps=2), review_rule=rule)
    for t in tasks:
        one = asyncio.run(plain.score(text, t, range(3), None))
        two = asyncio.run(ruled.score(text, t, range(3), None))
        hard = t.id.startswith("hard")
        assert one["correct"] == (0.0 if hard else 1.0)
        assert two["correct"] == 1.0
        assert (two["cost"] > one["cost"]) == hard


@pytest.mark.slow
def test_a_micro_run_with_two_rounds_trains_a_conductor_that_reviews(tmp_path: Path) -> None:
    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.train import train
    from rl_conductor.workers.pool import load_pool

    # an unreachable fit target: one extra SFT pass (a fresh trainer on the warm start's weights)
    cfg = rounds_micro_config(tmp_path, sft_fit_target=1.0, sft_fit_max_passes=1, sft_fit_epochs=1.0)
    result = train(cfg, tmp_path / "out", progress=False)
    meta = json.loads((result.final_dir / "conductor.json").read_text())
    assert meta["max_rounds"] == 2
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    # the fit to its own decisions is measured per kind, before and after the extra pass
    fit = metrics["sft_fit"]
    assert fit["target"] == 1.0 and fit["passes"] == (1 if fit["before"]["all"] < 1.0 else 0)
    for when in ("before", "after"):
        assert set(fit[when]) == {"first", "review", "all", "n"}
        assert all(0.0 <= fit[when][k] <= 1.0 for k in ("first", "review", "all"))
    # the warm start taught reviews: a review prompt after first-round targets it has a rule for
    counts = metrics["sft_records"]
    # (balanced: up to twice the more common decision's count, adaptive.balance_decisions)
    assert counts["first_round"] == cfg.sft_examples and 0 < counts["review"] <= 2 * cfg.sft_examples
    policy = ConductorPolicy(result.final_dir)
    assert policy.reviews()
    pool = load_pool("gsm8k-six")
    task = load_tasks("gsm8k-six", split="validation", limit=1)[0]
    episode = asyncio.run(policy.run(task, pool.view(), RequestLimits(max_steps=2, max_rounds=2)))
    rounds = episode.trace.rounds
    # round 2 began with the trained Conductor's review (keep or continue) of what round 1 answered
    assert len(rounds) == 2 and rounds[1].decision in ("keep", "continue") and rounds[1].seen


def test_the_gsm8k_six_preset_weights_the_decision_of_plans_and_reviews() -> None:
    """The shipped adaptive preset trains two rounds with the decision tokens weighted: at weight
    1 its tiny model learnt the review's format and not its choice (it kept after 98.8 % of its test
    reviews, agreeing or not; configs/train/gsm8k-six.yaml has the validation figures)."""
    from rl_conductor.training.config import load_preset

    cfg = load_preset("gsm8k-six")
    assert cfg.max_rounds == 2 and cfg.evidence == "none"
    assert cfg.sft_decision_weight > 1.0


def test_a_given_plan_runs_as_an_episode_reviewed_by_its_hook_only_when_rounds_are_allowed() -> None:
    """``GivenPlan`` (the episode runner of training rollouts): the plan it is given runs, annotated;
    its hook decides round 2 when the request allows two rounds and is never called otherwise."""
    from rl_conductor.executor import Continuation, RoundRequest
    from rl_conductor.policies.base import GivenPlan, Plan
    from rl_conductor.training.adaptive import continuation_workflow, pair

    pool, task = _pool(), _tasks(range(1, 2))[1]  # hard/1: the pair disagrees, both wrong
    names = pool.names()
    first = pair("b", "a").workflow(names)
    asked: list[str] = []

    async def escalate(req: RoundRequest) -> Continuation:
        asked.append(req.task.id)
        return Continuation(workflow=continuation_workflow("+dear", names))

    policy = GivenPlan(review=escalate)
    plan = Plan(workflow=first, text="the completion")
    one = asyncio.run(policy.run(task, pool.view(), RequestLimits(max_steps=2), plan=plan))
    assert asked == [] and len(one.trace.rounds) <= 1 and one.trace.workflow_text == "the completion"
    two = asyncio.run(policy.run(task, pool.view(), RequestLimits(max_steps=2, max_rounds=2), plan=plan))
    assert asked == [task.id] and len(two.trace.rounds) == 2
    assert [s.worker for s in two.trace.steps] == ["b", "a", "dear"]
    with pytest.raises(TypeError, match="plan it is given"):
        asyncio.run(policy.plan(task, pool.view(), RequestLimits()))


def _one_group_rounds(keep_right: list[bool], dear_right: list[bool]) -> Any:
    """A rounds table of one (domain, pair, disagree) group: keep or escalate to ``dear``."""
    import numpy as np

    from rl_conductor.training.adaptive import RoundsTable

    n = len(keep_right)
    correct = np.array([[[k, d]] for k, d in zip(keep_right, dear_right, strict=True)], dtype=bool)
    return RoundsTable(
        task_ids=[f"q{i}" for i in range(n)],
        domains=["math"] * n,
        firsts=["solve:b|solve:a"],
        conts=["keep", "+dear"],
        signal=[[DISAGREE]] * n,
        correct=correct,
        cost=np.tile(np.array([[[0.002, 0.003]]]), (n, 1, 1)),
        stopped=np.zeros((n, 1, 2), dtype=bool),
        calls=np.tile(np.array([[[2, 3]]], dtype=np.int32), (n, 1, 1)),
        done=np.ones((n, 1, 2), dtype=bool),
    )


def test_the_review_rule_escalates_on_noise_only_without_a_standard_error_rule() -> None:
    from rl_conductor.reward import reward_config
    from rl_conductor.training.adaptive import fit_rule

    key = ("math", "solve:b|solve:a", DISAGREE)
    reward = reward_config(cost_weight=0.0)
    # escalating wins one question more of twenty, in a group where the two answer apart: noise
    noisy = _one_group_rounds([True, False] * 10, [False, True] * 10)
    noisy.correct[0, 0, 1] = True  # 11 right after escalating, 10 when keeping
    assert fit_rule(noisy, reward) == {key: "+dear"}
    assert fit_rule(noisy, reward, se_rule=0.5) == {key: "keep"}
    # escalating wins 15 questions of twenty: far beyond two standard errors
    clear = _one_group_rounds([False] * 15 + [True] * 5, [True] * 20)
    assert fit_rule(clear, reward, se_rule=2.0) == {key: "+dear"}
    # a worse escalation is never chosen, with or without the rule
    worse = _one_group_rounds([True] * 20, [False] * 20)
    assert fit_rule(worse, reward) == fit_rule(worse, reward, se_rule=1.0) == {key: "keep"}
    # one question is no evidence: the rule keeps
    lone = _one_group_rounds([False], [True])
    assert fit_rule(lone, reward) == {key: "+dear"}
    assert fit_rule(lone, reward, se_rule=2.0) == {key: "keep"}
    # keep not run on some questions: the gain is read where both were run (here noise: keep)
    holes = _one_group_rounds([True, False] * 10, [False, True] * 10)
    holes.correct[0, 0, 1] = True
    holes.done[1, 0, 0] = False
    assert fit_rule(holes, reward, se_rule=0.5) == {key: "keep"}
    # keep listed after the escalation: the same decisions, and a tie keeps
    swapped = _one_group_rounds([True, False] * 10, [False, True] * 10)
    swapped.conts = ["+dear", "keep"]
    for a in (swapped.correct, swapped.cost, swapped.calls):
        a[...] = a[..., ::-1].copy()
    swapped.cost[...] = 0.002  # same cost, same accuracy: a tie
    swapped.calls[...] = 2
    assert fit_rule(swapped, reward) == {key: "keep"}
    # nothing measured on every question: no rule for the group (the table's default is keep)
    unmeasured = _one_group_rounds([True, False], [False, True])
    unmeasured.done[0, 0, :] = False
    assert fit_rule(unmeasured, reward) == {}


def test_the_review_standard_error_rule_is_a_recipe_setting() -> None:
    assert TrainConfig(pool="unused").warm_review_se_rule == 0.0  # the rule as before
    with pytest.raises(ValueError, match="warm_review_se_rule"):
        TrainConfig(pool="unused", warm_review_se_rule=-1.0)


def test_the_fallback_worker_is_the_best_single_at_the_training_reward(tmp_path: Path) -> None:
    """``ExpectedRewards.best_single`` (conductor.json's ``fallback_worker``): the worker whose
    solve alone has the best mean training reward, which moves with the cost weight."""
    from rl_conductor.reward import RewardConfig
    from rl_conductor.training.train import _warm_start, conductor_meta
    from rl_conductor.training.warmstart import ExpectedRewards

    pool, tasks = _pool(), _tasks()
    table = build_table(tasks, pool, top_k=2, cheap_k=1, max_steps=2)
    # the dear worker is right everywhere, a and b on the easy half only
    assert ExpectedRewards.fit(table, RewardConfig(cost_weight=0.0)).best_single() == "dear"
    assert ExpectedRewards.fit(table, RewardConfig(cost_weight=5.0)).best_single() in ("a", "b")
    targets, _, _, _ = _warm_start(_cfg(tmp_path), tasks, pool)
    best = targets.best_single()
    assert best is not None
    assert conductor_meta(_cfg(tmp_path), pool.names(), None, best)["fallback_worker"] == best
    assert "fallback_worker" not in conductor_meta(_cfg(tmp_path), pool.names())


def test_neighbourhoods_per_question_split_a_group_by_what_its_questions_ask(tmp_path: Path) -> None:
    """``warm_neighbours``: one (domain, source) group mixes sums the cheap workers get right
    with remainders only the dear worker gets right. The group's mean gives every question one
    target; each question's nearest training questions (MiniLM, leave-one-out) give the sums a
    cheap worker and the remainders the dear one."""
    from rl_conductor.training.train import _warm_start

    def text(kind: str, i: str) -> str:
        if kind == "easy":
            return f"What is {i} + {i}?"
        return f"Find the remainder when {i} raised to the power 17 is divided by 13, modulo 13."

    tasks = [replace(t, question=text(*t.id.split("/"))) for t in _tasks(range(1, 9))]
    pool = _pool()
    names = [w.info.name for w in pool.workers]

    def targets_of(**kw: Any) -> dict[str, set[str]]:
        targets, *_ = _warm_start(_cfg(tmp_path, **kw), tasks, pool)
        return {t.id: set(targets.best(t, names, None).workers) for t in tasks}

    group = targets_of()
    assert len({frozenset(w) for w in group.values()}) == 1  # one target for the whole group
    own = targets_of(warm_neighbours=4, warm_shrink=0.0)
    assert all("dear" not in own[t.id] for t in tasks if t.id.startswith("easy"))
    assert all(own[t.id] == {"dear"} for t in tasks if t.id.startswith("hard"))
    # auto: decided on the training split and recorded; 15 neighbours of 16 questions are the
    # whole group, so they cannot beat its mean and the group means stay
    auto, *_ = _warm_start(_cfg(tmp_path, warm_neighbours="auto"), tasks, pool)
    assert auto.neighbour_choice["k"] == 0 and auto.neighbour_choice["n"] == len(tasks)
    assert {frozenset(auto.best(t, names, None).workers) for t in tasks} == {frozenset(group["easy/1"])}
    with pytest.raises(ValueError, match="sft_targets: expected-best"):
        TrainConfig(warm_neighbours="auto", sft_targets="random")
    for bad in (-1, 1.5, True, "sometimes"):
        with pytest.raises(ValueError, match="warm_neighbours"):
            TrainConfig(warm_neighbours=bad)  # type: ignore[arg-type]
