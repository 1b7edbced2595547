"""Rank addresses (``model_id = [@1]``): a plan names a worker by its place in the prompt's
evidence ranking; one parser resolves it for training, evaluation and serving (workflow.parse,
ConductorPolicy, ConductorReward), refuses it where the prompt showed no ranking or the place is
beyond it, and the trace records the resolved ids and that they were named by rank."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tests.test_conductor_policy import Script
from tests.test_evidence import COST_AWARE, _tasks
from tests.test_warmstart import EASY_HARD, PRICES, _table

from _pools import fake_pool
from _tiny import Micro
from rl_conductor.limits import RequestLimits
from rl_conductor.lm.generate import ids_prefix_ok
from rl_conductor.policies.conductor import ConductorPolicy
from rl_conductor.policies.evidence import Ranker, fit_evidence
from rl_conductor.prompting import RANK_SHOWN, shown_ranking
from rl_conductor.tasks.base import Task
from rl_conductor.workflow import ParseError, Step, Workflow, model_ids, parse, render

PLAN = "model_id = [{ids}]\nsubtasks = [{subs}]\naccess_list = [{acc}]"


def _plan(*ids: str) -> str:
    subs = ", ".join(['"Solve it."'] * len(ids))
    acc = ", ".join(["[]"] + ['"all"'] * (len(ids) - 1))
    return PLAN.format(ids=", ".join(ids), subs=subs, acc=acc)


def test_rank_references_resolve_to_the_ids_the_prompt_ranked() -> None:
    wf = parse(_plan("@2", '"@1"', "0"), pool_size=6, ranking=[3, 1, 5])
    assert wf.workers() == [1, 3, 0]
    assert [s.rank for s in wf.steps] == [2, 1, None]
    assert wf.by_rank()
    again = parse(render(wf), pool_size=6, ranking=[3, 1, 5])
    assert again == wf and [s.rank for s in again.steps] == [2, 1, None]
    assert render(wf).startswith("model_id = [@2, @1, 0]")
    # an id-only plan is as before, with or without a ranking
    assert parse(_plan("4"), pool_size=6, ranking=[3]).steps == (Step(4, "Solve it.", ()),)
    assert not parse(_plan("4"), pool_size=6).by_rank()
    assert model_ids(_plan("@3", "2"), pool_size=6, ranking=[3, 1, 5]) == [5, 2]


@pytest.mark.parametrize(
    ("ids", "ranking", "why"),
    [
        (("@1",), None, "the prompt showed no ranking"),
        (("@1",), [], "the prompt showed no ranking"),
        (("@4",), [3, 1, 5], r"out of range @1..@3"),
        (("@0",), [3, 1, 5], r"out of range @1..@3"),
        (("1", "@2"), [3], r"model_id\[1\] = @2 is out of range @1..@1"),
        (('"@12345"',), [3], "must be an int"),
        (("@1",), [9], "out of range 0..5"),  # a ranking naming a worker the view lacks
    ],
)
def test_rank_references_without_a_ranking_or_beyond_it_are_refused(
    ids: tuple[str, ...], ranking: list[int] | None, why: str
) -> None:
    with pytest.raises(ParseError, match=why):
        parse(_plan(*ids), pool_size=6, ranking=ranking)
    with pytest.raises(ParseError, match=why):
        model_ids(_plan(*ids), pool_size=6, ranking=ranking)


def test_the_ranking_a_plan_may_name_is_the_shown_one() -> None:
    assert shown_ranking([4, 2, 0, 1, 3]) == [4, 2, 0][:RANK_SHOWN]
    assert shown_ranking(None) is None


def test_budget_mask_leaves_rank_digits_alone() -> None:
    """Under a budget decoding masks ids outside the allowed set; ``@1``'s digit is a rank."""
    assert ids_prefix_ok("@1", frozenset({0, 2}))
    assert ids_prefix_ok("@1, 2", frozenset({0, 2}))
    assert not ids_prefix_ok("@1, 1", frozenset({0, 2}))
    assert not ids_prefix_ok("1", frozenset({0, 2}))


@pytest.fixture(scope="module")
def policy(micro: Micro) -> ConductorPolicy:
    return ConductorPolicy(micro.final_dir)


def _ranked_policy(policy: ConductorPolicy, order: list[int] | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Give the micro policy a ranking line (``evidence: rank``) without refitting evidence."""
    monkeypatch.setattr(policy, "ranker", object() if order is not None else None)
    monkeypatch.setattr(policy, "task_evidence", lambda tasks: [{} for _ in tasks])
    monkeypatch.setattr(
        policy, "evidence_ranking", lambda t, v, lim, e: None if order is None else list(order)
    )


TASK = Task(id="m/1", question="What is 2 + 2?", answer="4", domain="math", source="t", grader="math")


async def test_the_conductor_resolves_ranks_with_its_prompts_ranking_and_the_trace_says_so(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = fake_pool(4)
    view = pool.view()
    _ranked_policy(policy, [2, 0, 1], monkeypatch)
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: _plan("@1")))
    plan = await policy.plan(TASK, view, RequestLimits())
    assert not plan.fallback and plan.workflow.workers() == [2]
    assert plan.evidence_plan == (2,)
    assert any("named by evidence rank: @1 -> 2" in n for n in plan.notes)
    ep = await policy.run(TASK, view, RequestLimits(), plan=plan)
    assert ep.trace.notes[0].endswith("@1 -> 2")
    assert [a.worker for a in ep.trace.attempts] == [view.names()[2]]
    from rl_conductor.serving.request import response_document

    doc = response_document(view, ep)
    assert doc["workflow"][0]["worker"] == view.names()[2] and doc["workflow"][0]["evidence_rank"] == 1
    assert doc["raw_plan"].startswith("model_id = [@1]")
    assert any(n.endswith("@1 -> 2") for n in doc["notes"])


async def test_a_rank_without_a_ranking_falls_back_with_the_reason(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = fake_pool(4)
    _ranked_policy(policy, None, monkeypatch)
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: _plan("@1")))
    plan = await policy.plan(TASK, pool.view(), RequestLimits())
    assert plan.fallback and "showed no ranking" in (plan.parse_error or "")
    _ranked_policy(policy, [1, 0], monkeypatch)
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: _plan("@3")))
    plan = await policy.plan(TASK, pool.view(), RequestLimits())
    assert plan.fallback and "out of range @1..@2" in (plan.parse_error or "")


async def test_a_rank_resolving_to_a_worker_over_budget_is_refused_like_its_id(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a budget the resolved id meets the same check as a written id: a ranking that (all
    workers being over budget, say) names a masked worker does not slip past it."""
    from rl_conductor.policies.conductor import allowed_ids

    pool = fake_pool(4)
    view = pool.view()
    from rl_conductor.prompting import typical_cost

    costs = sorted(typical_cost(i) for i in view.infos())
    limits = RequestLimits(max_cost_usd=(costs[0] + costs[-1]) / 2)
    mask = allowed_ids(view, limits)
    assert mask is not None and len(mask) < len(view)
    banned = next(j for j in range(len(view)) if j not in mask)
    _ranked_policy(policy, [banned], monkeypatch)
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: _plan("@1")))
    plan = await policy.plan(TASK, view, limits)
    assert plan.fallback and banned not in plan.workflow.workers()


def test_rank_targets_are_rank_addresses_of_the_lines_first_worker() -> None:
    """``evidence: rank`` warm-start targets with ``by_rank``: the completion is ``@1``, which
    parses (with the prompt's ranking) to the line's first worker and does not parse without it."""
    from rl_conductor.training.data import grpo_records, make_specs, warm_sft_records
    from rl_conductor.training.warmstart import ExpectedRewards

    pool = fake_pool(4)
    tasks, emb, _ = _tasks(60)
    correct = np.random.default_rng(0).random((60, 4)) < [0.3, 0.5, 0.7, 0.9]
    cost = np.tile([0.0001, 0.001, 0.003, 0.02], (60, 1))
    model, oof = fit_evidence(tasks, emb, pool.names(), correct, cost=cost, shrink=True)
    evidence = {t.id: model.as_mapping(row) for t, row in zip(tasks, oof, strict=True)}
    rank = Ranker(model, COST_AWARE)
    specs = make_specs(
        tasks, pool, 80, rng=random.Random(0), budget_prob=0.5, budgets=[0.002, 0.01], random_pool_prob=0.5
    )
    targets = ExpectedRewards.fit(_table(EASY_HARD, PRICES), COST_AWARE)
    kw = dict(max_question_chars=200, evidence=evidence, rank=rank)
    records = warm_sft_records(specs, pool, RequestLimits(), targets, by_rank=True, **kw)  # type: ignore[arg-type]
    grpo = grpo_records(specs, pool, RequestLimits(), **kw)  # type: ignore[arg-type]
    for spec, rec, g in zip(specs, records, grpo, strict=True):
        text = rec["completion"][0]["content"]
        assert text.startswith("model_id = [@1]")
        view, lim = spec.pool_view(pool), spec.limits(RequestLimits())
        order = rank(spec.task, evidence[spec.task.id], view, lim)
        assert g["ranking"] == shown_ranking(order)
        wf = parse(text, pool_size=len(view), ranking=g["ranking"])
        assert wf.workers() == [order[0]]
        with pytest.raises(ParseError):
            parse(text, pool_size=len(view))


async def test_grpo_scores_a_rank_address_with_the_prompts_ranking() -> None:
    """The GRPO reward parses through the same function: ``@1`` runs the ranked worker where the
    record carries the ranking, and scores as unparseable (reward 0) where it carries none."""
    from rl_conductor.reward import RewardConfig
    from rl_conductor.training.grpo_reward import ConductorReward

    pool = fake_pool(3)
    task = TASK
    reward = ConductorReward(pool, {task.id: task}, RewardConfig(), RequestLimits())
    got = await reward(
        [""] * 2,
        [_plan("@1")] * 2,
        task_id=[task.id] * 2,
        view=[[0, 1, 2]] * 2,
        budget=[-1.0] * 2,
        ranking=[[2, 0], []],
    )
    assert reward.history[-1]["parsed"] == pytest.approx(0.5)
    assert got[0] is not None and got[0] > 0 and got[1] == 0.0


def test_the_tiny_tokenizer_trained_on_rank_targets_encodes_them_and_round_trips() -> None:
    from rl_conductor.lm.tokenizer import train_bpe

    corpus = [render(Workflow(steps=(Step(i % 4, "Solve it.", (), rank=1 + i % 3),))) for i in range(200)]
    tok = train_bpe(corpus, vocab_size=300)
    text = "model_id = [@1]"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert len(ids) <= len(tok.encode("model_id = [3]", add_special_tokens=False)) + 1


PAIR = "model_id = [@1, @2]\nsubtasks = ['Solve it.', 'Solve it.']\naccess_list = [[], []]"
SOLVE_CHECK = "model_id = [@1, @1]\nsubtasks = ['Solve it.', 'Check it.']\naccess_list = [[], [0]]"


def _hinted_policy(policy: ConductorPolicy, line: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Give the micro policy a ``Plan by estimate:`` line (``plan_hint``) without a lookup."""
    from types import SimpleNamespace

    monkeypatch.setattr(policy, "ranker", None)
    monkeypatch.setattr(policy, "plan_hint", SimpleNamespace(needs_embedding=lambda task: False))
    monkeypatch.setattr(policy, "plan_ids", lambda task, view, limits: list(line))
    monkeypatch.setattr(policy, "task_evidence", lambda tasks: [None for _ in tasks])


async def test_following_the_plan_line_is_judged_on_the_plan_the_model_wrote(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``follows evidence %`` counted a plan_hint model wrong in three cases: a solve and a check
    by the line's one worker; a pair the budget cut to one step; a plan made again under a
    deadline (not counted at all). Each is the model following its line."""
    from rl_conductor.evaluation.runner import evaluate_async
    from rl_conductor.prompting import typical_cost

    view = fake_pool(4).view()
    # 1. the line shows each worker once: a solve and a check by @1 follow "Plan by estimate: 2"
    _hinted_policy(policy, [2], monkeypatch)
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: SOLVE_CHECK))
    plan = await policy.plan(TASK, view, RequestLimits(max_steps=2))
    assert plan.workflow.workers() == [2, 2] and plan.follows_evidence is True
    result = await evaluate_async(policy, view, [TASK], RequestLimits(max_steps=2), progress=False)
    assert result.records[0].follows_evidence is True
    # 2. the pair the line names, cut to one step by a budget that affords one answer, not two
    _hinted_policy(policy, [0, 2], monkeypatch)
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: PAIR))
    costs = [typical_cost(view.worker(i).info) for i in (0, 2)]
    budget = RequestLimits(max_steps=2, max_cost_usd=0.5 * (costs[1] + sum(costs)))
    plan = await policy.plan(TASK, view, budget)
    assert plan.workflow.workers() == [2] and any("cut to one step" in n for n in plan.notes)
    assert plan.evidence_plan == (0, 2) and plan.follows_evidence is True
    # the plan the line did not name is still counted as not following it
    monkeypatch.setattr(
        policy, "_generate", Script(lambda p, c: "model_id = [@2]\nsubtasks = ['x']\naccess_list = [[]]")
    )
    assert (await policy.plan(TASK, view, budget)).follows_evidence is False
    # 3. a plan that misses its deadline is planned again; that plan is counted against its line
    slow = fake_pool(4, latency_s=5.0).view()
    _hinted_policy(policy, [0, 2], monkeypatch)
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: PAIR))
    plan = await policy.plan(TASK, slow, RequestLimits(max_steps=2, max_latency_s=1.0))
    assert any("planned again" in n for n in plan.notes), plan.notes
    assert plan.evidence_plan == (0, 2) and plan.follows_evidence is True


async def test_a_fixed_fallback_never_follows_the_evidence(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completion that does not parse and names no workers runs the policy's fallback worker,
    which may be the line's (or the ranking's first) worker: that is not the model following it."""
    from rl_conductor.evaluation.runner import evaluate_async

    view = fake_pool(4).view()
    limits = RequestLimits(max_steps=2)
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: "I cannot plan this."))
    fallback = (await policy.plan(TASK, view, limits)).workflow.workers()
    for give in (_hinted_policy, _ranked_policy):
        if give is _ranked_policy:  # a ranking line, no plan line
            monkeypatch.setattr(policy, "plan_hint", None)
            monkeypatch.setattr(policy, "plan_ids", lambda task, view, limits: None)
        give(policy, [fallback[0], 0] if give is _hinted_policy else [fallback[0], 1], monkeypatch)
        plan = await policy.plan(TASK, view, limits)
        assert plan.fallback and plan.fixed_fallback and plan.workflow.workers() == fallback
        assert plan.evidence_plan and plan.evidence_plan[0] == fallback[0]
        assert plan.follows_evidence is False
        result = await evaluate_async(policy, view, [TASK], limits, progress=False)
        assert result.records[0].follows_evidence is False
    # a salvaged plan is the model's own workers: judged as written
    _ranked_policy(policy, None, monkeypatch)
    _hinted_policy(policy, [2], monkeypatch)
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: "model_id = [2]\nsubtasks = oops"))
    plan = await policy.plan(TASK, view, limits)
    assert plan.fallback and not plan.fixed_fallback and plan.workflow.workers() == [2]
    assert plan.follows_evidence is True
