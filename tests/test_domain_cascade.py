"""``cascade:domain``: a plan per domain (a single worker, or a pair that escalates when it
disagrees), fitted on every training question at the evaluation's reward; the stronger of the
domain-router and the fixed cascade on a file whose domains have owners (issue 21)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_conductor.evaluation.suite import baseline_specs, run_eval
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.cascade import DomainCascade
from rl_conductor.policies.catalog import make_policy
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.pool import load_pool

# a: cheap, b: cheap, m: math owner (mid price), s: strong and dear, hosted outside
PRICES = {"a": 0.1, "b": 0.1, "m": 2.0, "s": 40.0}


def _row(i: int, split: str, domain: str) -> dict[str, Any]:
    gold = str(i + 1)
    wrong_a, wrong_b = str(i + 100), str(i + 200)  # different wrong answers: a disagreement
    if domain == "math":  # m always right; the cheap pair right a third of the time, else wrong alike
        right = i % 3 == 0
        answers = {"a": gold if right else wrong_a, "b": gold if right else wrong_a, "m": gold, "s": gold}
    else:  # qa: the cheap pair agrees and is right on 3 of 4, disagrees (both wrong) on 1; m weak
        right = i % 4 != 0
        answers = {"a": gold if right else wrong_a, "b": gold if right else wrong_b,
                   "m": gold if i % 2 else wrong_a, "s": gold}  # fmt: skip
    return {
        "id": f"{domain}/{split}/{i}",
        "question": f"{domain} question {i}: what is {i} + 1?",
        "answer": gold,
        "grader": "math",
        "domain": domain,
        "split": split,
        "responses": {k: {"text": f"The answer is {v}.\n#### {v}"} for k, v in answers.items()},
    }


@pytest.fixture
def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    rows = [_row(i, split, d) for split, n in (("train", 48), ("test", 24)) for d in ("math", "qa")
            for i in range(n)]  # fmt: skip
    rec = tmp_path / "two.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    path = tmp_path / "two.yaml"
    workers = [{"name": k, "kind": "replay", "price_in": p, "price_out": p,
                "hosting": "external" if k == "s" else "self"} for k, p in PRICES.items()]  # fmt: skip
    path.write_text(yaml.safe_dump({"name": "two", "recordings": str(rec), "workers": workers}))
    return path


def _fit(pool: Path) -> DomainCascade:
    policy = make_policy("cascade:domain", load_pool(str(pool)), cost_weight=0.13, reward_preset="cost-aware")
    assert isinstance(policy, DomainCascade)
    return policy


def test_each_domain_gets_its_own_plan_and_the_review_escalates_only_on_disagreement(pool: Path) -> None:
    policy = _fit(pool)
    assert policy.describe() == {"math": "single:m", "qa": "cascade:a,b>s"}
    [run] = run_eval(["cascade:domain"], pool=str(pool), dataset=None, split="test", limit=None, seed=0,
                     progress=False, cost_weight=0.13, reward_preset="cost-aware")  # fmt: skip
    assert run["accuracy"] == pytest.approx(1.0)  # m on math; the pair or s on qa
    # qa questions 0, 4, 8, ... of 24 disagree: 6 escalations of 48 questions
    assert run["multi_round_rate"] == pytest.approx(6 / 48)


def test_it_is_at_least_the_domain_router_and_the_one_cascade_on_training_questions(pool: Path) -> None:
    """In-sample the fit is the best of both families' plans in every domain, so its training
    reward is at least each one's (ties allowed); the run replays the fit exactly."""
    runs = run_eval(["cascade:domain", "domain-router", "cascade:all"], pool=str(pool), dataset=None,
                    split="train", limit=None, seed=0, progress=False, cost_weight=0.13,
                    reward_preset="cost-aware")  # fmt: skip
    reward = {r["policy"]: r["mean_reward"] for r in runs}
    mine = reward["cascade:domain"]
    assert all(mine >= v - 1e-9 for v in reward.values()), reward
    one = next(v for k, v in reward.items() if k not in ("cascade:domain", "domain-router"))
    assert mine > reward["domain-router"] + 0.01 and mine > one + 0.01, reward
    policy = _fit(pool)
    tasks = load_tasks(load_pool(str(pool)).default_dataset(), split="train")
    n = {d: sum(t.domain == d for t in tasks) for d in ("math", "qa")}
    fitted = sum(policy.plans[d].mean_reward * n[d] for d in n) / sum(n.values())
    assert mine == pytest.approx(fitted)


def test_a_private_request_falls_back_to_the_domains_best_self_hosted_single(pool: Path) -> None:
    """The qa plan escalates to ``s``, hosted outside: a private request gets the domain's best
    single among the workers it permits, never a plan it would refuse part way."""
    policy = _fit(pool)
    p = load_pool(str(pool))
    task = next(t for t in load_tasks(p.default_dataset(), split="test") if t.domain == "qa")
    private = RequestLimits(max_rounds=2, sensitivity="private")
    plan = asyncio.run(policy.plan(task, p.view(), private))
    names = p.view().names()
    assert [names[s.worker] for s in plan.workflow.steps] == ["a"]  # a and b tie: the earlier
    ep = asyncio.run(policy.run(task, p.view(), private))
    assert all(rec.worker != "s" for rec in ep.trace.steps)


def test_an_unseen_domain_gets_the_plan_fitted_on_every_question(pool: Path) -> None:
    policy = _fit(pool)
    assert policy.plan_for("poetry") == policy.default
    assert policy.plan_for("math").first == ("m",)


def test_a_replay_pool_compares_with_it_by_default(pool: Path) -> None:
    specs = baseline_specs(str(pool))
    assert "cascade:domain" in specs and "cascade:all" in specs
    assert "cascade:domain" not in baseline_specs("paper-sim")


def test_a_single_plan_the_budget_cannot_afford_goes_to_the_best_affordable_single(pool: Path) -> None:
    """math's plan is ``m`` alone; under a budget below m's cost the executor would skip the call
    (no answer on every math question, H40): the plan is the domain's best affordable single."""
    policy = _fit(pool)
    p = load_pool(str(pool))
    cheap = RequestLimits(max_cost_usd=0.0001)
    math = [t for t in load_tasks(p.default_dataset(), split="test") if t.domain == "math"]
    names = p.view().names()
    for task in math:
        plan = asyncio.run(policy.plan(task, p.view(), cheap))
        assert [names[s.worker] for s in plan.workflow.steps] in (["a"], ["b"])
    runs = run_eval(["cascade:domain", "domain-router"], pool=str(pool), dataset=None, split="test",
                    limit=None, seed=0, progress=False, cost_weight=0.13, reward_preset="cost-aware",
                    max_cost_usd=0.0001)  # fmt: skip
    acc = {r["policy"]: r["accuracy"] for r in runs}
    assert acc["cascade:domain"] >= acc["domain-router"] > 0


def test_an_unseen_domain_falls_back_to_the_best_single_on_every_question(pool: Path) -> None:
    """The plan fitted on every question needs ``s`` (external); a private request of a domain the
    training split lacks gets the best permitted single on every question, not the view's first."""
    import dataclasses

    policy = _fit(pool)
    p = load_pool(str(pool))
    private = RequestLimits(sensitivity="private")
    task = dataclasses.replace(load_tasks(p.default_dataset(), split="test")[0], domain="poetry")
    plan = asyncio.run(policy.plan(task, p.view(), private))
    from rl_conductor.policies.cascade import ALL

    best = max(("a", "b", "m"), key=lambda n: (policy.singles[ALL][n], -policy.costs[ALL][n]))
    assert p.view().names()[plan.workflow.steps[0].worker] == best == "m"
