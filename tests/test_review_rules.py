"""The review rules a two-round Conductor's targets follow, per domain: the text probes' rule, a
domain's own, or the agreement rule (``SignalRule``) where it earns more out of fold; and the
rounds table's credit for a pair whose other half was answered by a replacement (issue 21)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import GivenPlan
from rl_conductor.policies.baselines import SOLVE
from rl_conductor.policies.routers import own_answer, own_final_answer
from rl_conductor.review_evidence import ReviewEvidence, SignalRule
from rl_conductor.reward import reward_config
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.training.adaptive import RoundsTable
from rl_conductor.training.review_text import fit_text_rule
from rl_conductor.workers.pool import load_pool
from rl_conductor.workflow import Step, Workflow

AGREE, DISAGREE = "The answers so far agree.", "The answers so far disagree."
PAIR = "solve:a|solve:b"


def _table(seed: int = 0) -> tuple[RoundsTable, dict[tuple[str, str], np.ndarray]]:
    """Two domains of 200 questions, one pair first plan, keep or escalate to ``s`` (always right,
    dear). In ``x`` the pair is right exactly where it agrees (escalate on disagreement pays); in
    ``y`` it agrees on a shared wrong answer half the time (only escalating always pays). The
    texts' rows are noise: the probes can only learn the mix of both domains."""
    rng = np.random.default_rng(seed)
    n = 400
    domains = ["x"] * 200 + ["y"] * 200
    agree = rng.random(n) < 0.8
    keep_right = np.where(np.array(domains) == "x", agree, agree & (rng.random(n) < 0.5))
    correct = np.zeros((n, 1, 2), dtype=bool)
    correct[:, 0, 0] = keep_right
    correct[:, 0, 1] = True
    cost = np.zeros((n, 1, 2))
    cost[:, 0, 0] = 0.0002
    cost[:, 0, 1] = 0.0032
    table = RoundsTable(
        task_ids=[f"q{i}" for i in range(n)],
        domains=domains,
        firsts=[PAIR],
        conts=["keep", "+s"],
        signal=[[AGREE if a else DISAGREE] for a in agree],
        correct=correct,
        cost=cost,
        stopped=np.zeros((n, 1, 2), dtype=bool),
        calls=np.full((n, 1, 2), 2, dtype=np.int32),
        done=np.ones((n, 1, 2), dtype=bool),
    )
    rows = {(f"q{i}", PAIR): rng.normal(size=6) for i in range(n)}
    return table, rows


def test_each_domain_reviews_by_the_agreement_rule_where_it_earns_more_out_of_fold() -> None:
    table, rows = _table()
    config = reward_config("cost-aware", cost_weight=0.13)
    rule = fit_text_rule(table, rows, config)
    # in y the shared rule escalates always, as y's own would: a tie keeps the shared rule
    assert rule.domain_rules[PAIR] == {"x": "agreement"}
    x = rule.evidence.estimator("x", ["a", "b"])
    assert isinstance(x, SignalRule)
    assert x.by_signal[AGREE][0] is None and x.by_signal[DISAGREE][0] == "s"  # the cascade
    assert rule.evidence.estimator("y", ["a", "b"]) is rule.evidence.plans["a|b"]
    # a domain training never saw reads the shared rule
    assert rule.evidence.estimator("z", ["a", "b"]) is rule.evidence.plans["a|b"]
    for i, tid in enumerate(table.task_ids):
        want = "keep" if table.domains[i] == "x" and table.signal[i][0] == AGREE else "+s"
        assert rule.choice[(tid, PAIR)] == want, (tid, table.domains[i], table.signal[i][0])
        # x's training prompts show the agreement rule's line, y's the probes' out-of-fold estimates
        assert ((tid, PAIR) in rule.oof) is (table.domains[i] == "y")
    r = table.rewards(config)[:, 0, :]
    best = np.where(np.array([rule.choice[(t, PAIR)] == "+s" for t in table.task_ids]), r[:, 1], r[:, 0])
    assert rule.summary[PAIR]["reward_rule_oof"] <= best.mean() + 1e-12  # out of fold: never above


def test_per_domain_rules_survive_saving_and_loading(tmp_path: Path) -> None:
    table, rows = _table()
    rule = fit_text_rule(table, rows, reward_config("cost-aware", cost_weight=0.13))
    rule.evidence.save(tmp_path)
    doc = json.loads((tmp_path / "review_evidence.json").read_text())
    assert doc["domain_plans"]["x"]["a|b"]["kind"] == "signal"
    back = ReviewEvidence.load(tmp_path)
    assert back.domain_plans.keys() == rule.evidence.domain_plans.keys()
    again = back.estimator("x", ["a", "b"])
    assert (
        isinstance(again, SignalRule) and again.by_signal == rule.evidence.domain_plans["x"]["a|b"].by_signal
    )
    # a file written before per-domain rules loads with none
    del doc["domain_plans"]
    assert ReviewEvidence.from_dict(doc).domain_plans == {}


def test_a_single_domain_pair_keeps_the_text_rule_where_the_texts_say_more() -> None:
    """The probes see the answer's correctness in the rows here (a feature equal to it): their
    rule beats the agreement rule out of fold, so no per-domain rule replaces them."""
    table, rows = _table()
    keep_right = table.correct[:, 0, 0]
    for i, tid in enumerate(table.task_ids):
        rows[(tid, PAIR)][0] = 3.0 if keep_right[i] else -3.0
    table.domains = ["x"] * len(table.domains)
    rule = fit_text_rule(table, rows, reward_config("cost-aware", cost_weight=0.13))
    assert PAIR not in rule.domain_rules
    assert rule.evidence.estimator("x", ["a", "b"]) is rule.evidence.plans["a|b"]


def _pool(tmp_path: Path) -> Path:
    """``a`` has no recording of the one item; ``b`` and ``c`` answer it."""
    row = {"id": "m/0", "question": "What is 1 + 1?", "answer": "2", "grader": "math", "domain": "math",
           "split": "test", "responses": {"b": {"text": "#### 2"}, "c": {"text": "#### 2"}}}  # fmt: skip
    rec = tmp_path / "r.jsonl"
    other = {**row, "id": "m/1", "responses": {m: {"text": "#### 2"} for m in "abc"}}
    rec.write_text(json.dumps(row) + "\n" + json.dumps(other) + "\n")
    path = tmp_path / "p.yaml"
    workers = [{"name": m, "kind": "replay", "price_in": 1.0, "price_out": 1.0} for m in "abc"]
    path.write_text(yaml.safe_dump({"name": "p", "recordings": str(rec), "workers": workers}))
    return path


def test_a_pair_is_credited_with_its_own_final_answer_whatever_replaced_the_other_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    pool = load_pool(str(_pool(tmp_path)))
    view = pool.view()
    task = next(t for t in load_tasks(pool.default_dataset(), split="test") if t.id == "m/0")
    names = view.names()
    a, b, c = (names.index(m) for m in "abc")

    def run(wf: Workflow) -> object:
        return asyncio.run(GivenPlan().run_workflow(wf, task, view, RequestLimits(max_steps=4)))

    # a (replaced) and b in parallel, b's answer final: b's own
    pair = run(Workflow(steps=(Step(a, SOLVE, ()), Step(b, SOLVE, ()))))
    assert pair.steps[0].replaced and not own_answer(pair) and own_final_answer(pair)
    # b and then a (replaced) in parallel: the final answer is the replacement's
    last = run(Workflow(steps=(Step(b, SOLVE, ()), Step(a, SOLVE, ()))))
    assert not own_final_answer(last)
    # c reads a's (replaced) answer: the final answer rests on another worker's
    chain = run(Workflow(steps=(Step(a, SOLVE, ()), Step(c, "Check the answer above.", (0,)))))
    assert not own_final_answer(chain)
    # nothing replaced: both rules credit it
    clean = run(Workflow(steps=(Step(b, SOLVE, ()), Step(c, SOLVE, ()))))
    assert own_answer(clean) and own_final_answer(clean)
