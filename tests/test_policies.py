"""Baseline policies and the evaluation runner, on pools of scripted fake workers.

Each baseline is checked for the workflow it writes and for what running it does: which workers
are called, what the aggregator sees, how the vote and the oracle choose. The runner is checked
for its summary schema and per-domain split.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rl_conductor.evaluation.report import markdown_table, pareto_front
from rl_conductor.evaluation.runner import evaluate
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.baselines import (
    AGGREGATE,
    SOLVE,
    MixtureOfAgents,
    Oracle,
    RandomWorkflow,
    SelfConsistency,
    SingleWorker,
)
from rl_conductor.policies.catalog import make_policy
from rl_conductor.tasks.base import Task
from rl_conductor.workers.base import CallContext, Hosting, Message, estimate_tokens
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool
from rl_conductor.workflow import normalize, parse


def _task(answer: str = "7", tid: str = "math/1", domain: str = "math") -> Task:
    return Task(id=tid, question="What is 3 + 4?", answer=answer, domain=domain, source="test", grader="math")


def _pool(*specs: tuple[str, float, str], hosting: Sequence[Hosting] | None = None) -> Pool:
    """Workers from ``(name, price_out, answer)``."""
    hs = list(hosting) if hosting else ["external"] * len(specs)
    workers = [
        FakeWorker(info=fake_info(name, price_in=price / 4, price_out=price, hosting=h), answer=answer)
        for (name, price, answer), h in zip(specs, hs, strict=True)
    ]
    return Pool(name="fake", workers=list(workers))


def _fake(pool: Pool, name: str) -> FakeWorker:
    w = pool.get(name)
    assert isinstance(w, FakeWorker)
    return w


def _message(call: dict[str, object]) -> str:
    messages = call["messages"]
    assert isinstance(messages, list)
    return str(messages[0]["content"])


POOL_SPECS = (
    ("cheap", 1.0, "\\boxed{8}"),
    ("mid", 5.0, "\\boxed{7}"),
    ("dear", 20.0, "\\boxed{7}"),
    ("top", 40.0, "\\boxed{9}"),
)


async def test_single_worker_calls_only_its_worker() -> None:
    pool = _pool(*POOL_SPECS)
    policy = make_policy("single:mid", pool)
    assert isinstance(policy, SingleWorker)
    ep = await policy.run(_task(), pool.view(), RequestLimits())
    assert ep.plan.workflow.workers() == [1]
    assert parse(ep.plan.text, pool_size=4) == ep.plan.workflow
    assert ep.trace.final_answer == "\\boxed{7}"
    assert [len(_fake(pool, n).calls) for n in pool.names()] == [0, 1, 0, 0]
    assert ep.trace.workflow_text == ep.plan.text
    with pytest.raises(ValueError, match="needs a worker"):
        make_policy("single", pool)
    with pytest.raises(KeyError):
        make_policy("single:nobody", pool)


async def test_single_worker_follows_the_name_in_a_reordered_view() -> None:
    pool = _pool(*POOL_SPECS)
    view = pool.view([3, 1])
    ep = await SingleWorker("mid").run(_task(), view, RequestLimits())
    assert ep.plan.workflow.workers() == [1]
    assert ep.trace.steps[0].worker == "mid"


async def test_random_workflow_is_deterministic_per_task_id() -> None:
    pool = _pool(*POOL_SPECS)
    view = pool.view()
    policy = make_policy("random", pool, seed=3)
    assert isinstance(policy, RandomWorkflow)
    plans = {}
    for i in range(30):
        t = _task(tid=f"math/{i}")
        a, b = await policy.plan(t, view, RequestLimits()), await policy.plan(t, view, RequestLimits())
        assert a.workflow == b.workflow and a.text == b.text
        assert 1 <= len(a.workflow) <= 3
        assert normalize(parse(a.text, pool_size=len(view))) == normalize(a.workflow)
        plans[t.id] = a.workflow
    assert len({str(w) for w in plans.values()}) > 5  # differs across tasks
    other = RandomWorkflow(seed=4)
    diff = [(await other.plan(_task(tid=k), view, RequestLimits())).workflow != w for k, w in plans.items()]
    assert any(diff)  # the seed matters too
    capped = await policy.plan(_task(tid="math/0"), view, RequestLimits(max_steps=1))
    assert len(capped.workflow) == 1


async def test_mixture_of_agents_aggregator_sees_all_proposers() -> None:
    specs = [(f"w{i}", float(i + 1), f"proposal-{i}") for i in range(5)]
    pool = _pool(*specs)
    ep = await MixtureOfAgents().run(_task(), pool.view(), RequestLimits())
    wf = ep.plan.workflow
    assert len(wf) == 4
    assert wf.workers() == [4, 3, 2, 4]  # three most expensive propose, the most expensive aggregates
    assert [s.access for s in wf.steps] == [(), (), (), "all"]
    assert [s.instruction for s in wf.steps] == [SOLVE, SOLVE, SOLVE, AGGREGATE]
    top = _fake(pool, "w4")
    agg_msg = _message(top.calls[-1])
    for i in (2, 3, 4):
        assert f"proposal-{i}" in agg_msg
    assert "proposal-0" not in agg_msg and "proposal-1" not in agg_msg


async def test_mixture_of_agents_from_spec() -> None:
    pool = _pool(*POOL_SPECS)
    named = make_policy("moa:cheap,mid>top", pool)
    assert named.name == "moa:cheap,mid>top"
    wf = (await named.plan(_task(), pool.view(), RequestLimits())).workflow
    assert wf.workers() == [0, 1, 3]
    no_agg = make_policy("moa:cheap,mid", pool)  # the aggregator defaults to the first proposer
    assert (await no_agg.plan(_task(), pool.view(), RequestLimits())).workflow.workers() == [0, 1, 0]
    with pytest.raises(KeyError):
        make_policy("moa:cheap,nobody>top", pool)


def _voter(sevens: set[int]) -> FakeWorker:
    def respond(messages: Sequence[Message], ctx: CallContext | None) -> str:
        assert ctx is not None
        return "so the answer is \\boxed{7}" if ctx.nonce in sevens else "I get \\boxed{8}."

    return FakeWorker(info=fake_info("voter", price_in=0.1, price_out=0.2), responder=respond)


@pytest.mark.parametrize(
    ("sevens", "winner"),
    [({0, 2, 4}, "7"), ({1, 3, 4}, "7"), ({0, 1}, "8"), ({4}, "8")],
)
async def test_self_consistency_majority_vote(sevens: set[int], winner: str) -> None:
    pool = Pool(name="one", workers=[_voter(sevens), FakeWorker(info=fake_info("other"))])
    policy = make_policy("self-consistency:voter", pool)
    assert isinstance(policy, SelfConsistency)
    ep = await policy.run(_task("7"), pool.view(), RequestLimits(max_steps=5))
    assert len(ep.trace.steps) == 5
    assert len({c["context"].nonce for c in _fake(pool, "voter").calls}) == 5  # type: ignore[union-attr]
    assert f"\\boxed{{{winner}}}" in ep.trace.final_answer
    assert ep.trace.calls == 5
    from rl_conductor.reward import grade_trace

    assert grade_trace(_task("7"), ep.trace) == (winner == "7")


async def test_self_consistency_tie_goes_to_the_earliest_sample() -> None:
    pool = Pool(name="one", workers=[_voter({1, 3})])
    policy = SelfConsistency("voter", samples=4)
    ep = await policy.run(_task("7"), pool.view(), RequestLimits())
    assert "\\boxed{8}" in ep.trace.final_answer  # 8 (samples 0, 2) ties 7 (1, 3); 8 came first
    assert make_policy("self-consistency:voter*3", pool).samples == 3  # type: ignore[attr-defined]


async def test_oracle_picks_the_cheapest_correct_worker() -> None:
    pool = _pool(*POOL_SPECS)
    ep = await Oracle().run(_task("7"), pool.view(), RequestLimits())
    assert ep.trace.final_answer == "\\boxed{7}"
    assert "oracle: answered with mid (correct" in ep.trace.notes[-1]
    assert all(len(_fake(pool, n).calls) == 1 for n in pool.names())
    # the trace holds every call it made: its cost and calls are the real ones
    assert ep.trace.calls == len(pool.names()) == len(ep.plan.workflow.steps)
    assert ep.trace.cost_usd == pytest.approx(sum(s.cost_usd for s in ep.trace.steps))
    assert ep.trace.cost_usd == pytest.approx(ep.trace.charged_usd)


async def test_oracle_shares_one_budget_across_every_worker_it_asks() -> None:
    """It used to run every worker with the whole budget each (issue 23: $0.0093 on $0.003)."""
    pool = _pool(*POOL_SPECS)
    budget = 3e-4  # "cheap" and "mid" each fit in it alone, not together
    ep = await Oracle().run(_task("7"), pool.view(), RequestLimits(max_cost_usd=budget))
    spent = 0.0
    for n in pool.names():
        w = _fake(pool, n)
        for c in w.calls:
            in_tok = sum(estimate_tokens(m["content"]) for m in c["messages"])  # type: ignore[attr-defined]
            spent += w.info.cost(in_tok, min(w.output_tokens, int(c["max_tokens"])))  # type: ignore[call-overload]
    assert ep.trace.cost_usd == pytest.approx(spent) and spent <= budget
    assert ep.trace.calls == sum(len(_fake(pool, n).calls) for n in pool.names())


async def test_oracle_without_a_correct_worker_reports_the_cheapest_attempt() -> None:
    pool = _pool(*POOL_SPECS)
    ep = await Oracle().run(_task("123"), pool.view(), RequestLimits())
    assert "oracle: answered with cheap (no worker correct" in ep.trace.notes[-1]
    assert ep.trace.final_answer == ep.trace.steps[0].answer and ep.trace.steps[0].worker == "cheap"


async def test_oracle_respects_privacy() -> None:
    pool = _pool(*POOL_SPECS, hosting=["external", "external", "self", "external"])
    ep = await Oracle().run(_task("7"), pool.view(), RequestLimits(sensitivity="private"))
    assert ep.trace.steps[0].worker == "dear" and len(ep.trace.steps) == 1
    assert [len(_fake(pool, n).calls) for n in pool.names()] == [0, 0, 1, 0]


async def test_self_consistency_respects_max_steps() -> None:
    """It used to lift max_steps to its five samples (issue 23, finding 10)."""
    pool = Pool(name="one", workers=[_voter({0})])
    ep = await make_policy("self-consistency:voter", pool).run(
        _task("7"), pool.view(), RequestLimits(max_steps=1)
    )
    assert len(ep.trace.steps) == 1 and len(_fake(pool, "voter").calls) == 1
    assert ep.trace.notes == ["self-consistency: 1 of 5 samples (max_steps)"]
    assert "\\boxed{7}" in ep.trace.final_answer


async def test_oracle_with_no_permitted_worker_returns_an_empty_answer() -> None:
    pool = _pool(*POOL_SPECS)
    ep = await Oracle().run(_task("7"), pool.view(), RequestLimits(sensitivity="private"))
    assert ep.trace.final_answer == ""
    assert ep.trace.steps[0].status == "skipped_forbidden"
    assert all(not _fake(pool, n).calls for n in pool.names())


def test_unknown_policy_kind() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope", _pool(*POOL_SPECS))


# ----------------------------------------------------------------------------- the evaluation runner

SUMMARY_KEYS = {
    "policy",
    "pool",
    "n",
    "accuracy",
    "mean_tokens",
    "mean_cost_usd",
    "mean_calls",
    "mean_steps",
    "p50_latency_s",
    "p95_latency_s",
    "parse_rate",
    "fallback_rate",
    "deadline_cut_rate",
    "mean_reward",
    "mean_rounds",
    "worker_fallback_rate",
    "failed_call_rate",
    "call_errors",
    "reward",
    "multi_round_rate",
    "multi_round_rate_agree",
    "multi_round_rate_disagree",
    "verify_rate",
    "worker_shares",
    "shapes",
    "by_domain",
}


def test_evaluate_summary_schema_and_by_domain() -> None:
    pool = _pool(*POOL_SPECS)
    tasks = [_task("7", "math/1"), _task("8", "math/2"), _task("7", "know/1", "knowledge")]
    result = evaluate(SingleWorker("mid"), pool.view(), tasks, progress=False)
    s = result.summary()
    assert set(s) == SUMMARY_KEYS
    assert s["policy"] == "single:mid" and s["pool"] == "fake" and s["n"] == 3
    assert s["accuracy"] == pytest.approx(2 / 3)
    assert s["mean_calls"] == 1.0 and s["mean_steps"] == 1.0
    assert s["parse_rate"] == 1.0 and s["fallback_rate"] == 0.0
    assert s["mean_cost_usd"] > 0 and s["mean_tokens"] > 0
    assert set(s["by_domain"]) == {"knowledge", "math"}
    assert s["by_domain"]["math"]["n"] == 2 and s["by_domain"]["math"]["accuracy"] == 0.5
    assert s["by_domain"]["knowledge"]["accuracy"] == 1.0
    assert set(s["by_domain"]["math"]) == SUMMARY_KEYS - {"policy", "pool", "by_domain", "reward"}
    assert [r.task_id for r in result.records] == ["math/1", "math/2", "know/1"]
    assert all(r.workers == ["mid"] for r in result.records)
    assert s["worker_shares"] == {"mid": 1.0} and s["shapes"] == {"mid": 1.0} and s["verify_rate"] == 0.0


def test_evaluate_moa_costs_more_and_report_tables() -> None:
    pool = _pool(*POOL_SPECS)
    tasks = [_task("7", f"math/{i}") for i in range(4)]
    single = evaluate(SingleWorker("mid"), pool.view(), tasks, progress=False).summary()
    moa = evaluate(MixtureOfAgents(), pool.view(), tasks, progress=False).summary()
    assert moa["mean_calls"] == 4.0 and moa["mean_steps"] == 4.0
    assert moa["mean_cost_usd"] > single["mean_cost_usd"]
    assert moa["accuracy"] == 0.0  # the aggregator ("top") answers 9
    assert pareto_front([single, moa]) == ["single:mid"]
    table = markdown_table([single, moa])
    assert table.count("\n") == 3 and "| single:mid | 4 | 100.0 |" in table


def test_a_policy_that_does_not_batch_plans_each_request_of_a_batch_on_its_own() -> None:
    """``plan_batch`` is every policy's: one that does not batch (``batches_plans`` False) plans
    each item as ``plan`` would, each with its own view and limits, and serving gives it no
    micro-batcher."""
    import asyncio

    from rl_conductor.serving.service import ConductorService

    pool = _pool(("cheap", 1.0, "4"), ("dear", 10.0, "4"))
    policy = make_policy("single:cheap", pool)
    task = Task(id="t/1", question="What is 2 + 2?", answer="4", domain="math", source="t", grader="math")
    full, reordered = pool.view(), pool.view([1, 0])
    items = [(task, full, RequestLimits()), (task, reordered, RequestLimits())]
    assert not policy.batches_plans
    batch = policy.plan_batch(items)
    alone = [asyncio.run(policy.plan(t, v, lim)) for t, v, lim in items]
    assert [p.workflow for p in batch] == [p.workflow for p in alone]
    assert [p.workflow.steps[0].worker for p in batch] == [0, 1]  # each in its own view
    assert ConductorService(policy, pool)._planner is None
