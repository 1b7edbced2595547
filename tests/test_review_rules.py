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
    # in y the shared rule escalates always, as y's agreement rule does: a tie keeps the simpler
    assert rule.domain_rules[PAIR] == {"x": "agreement", "y": "agreement"}
    x = rule.evidence.estimator("x", ["a", "b"])
    y = rule.evidence.estimator("y", ["a", "b"])
    assert isinstance(x, SignalRule) and isinstance(y, SignalRule)
    # (worker, ..., escalates): the line names s either way; the rule takes it where it pays
    assert x.by_signal[AGREE][0] == x.by_signal[DISAGREE][0] == "s"
    assert not x.by_signal[AGREE][4] and x.by_signal[DISAGREE][4]  # the cascade
    assert y.by_signal[AGREE][4] and y.by_signal[DISAGREE][4]  # agreement says nothing
    # a domain training never saw reads the shared rule
    assert rule.evidence.estimator("z", ["a", "b"]) is rule.evidence.plans["a|b"]
    for i, tid in enumerate(table.task_ids):
        want = "keep" if table.domains[i] == "x" and table.signal[i][0] == AGREE else "+s"
        assert rule.choice[(tid, PAIR)] == want, (tid, table.domains[i], table.signal[i][0])
        assert (tid, PAIR) not in rule.oof  # its training prompts show the rule's line, not probes


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


def test_the_text_rule_is_compared_out_of_fold_with_its_tau_chosen_on_other_folds() -> None:
    """A text rule whose rows are noise chose ``tau`` on the rows it was scored on, so it beat the
    agreement rule (scored out of fold) on small domains by its own optimism (H40: 3 of 20 seeds
    at 60 questions, each losing about 0.02 of true reward). Compared on held-out ``tau``, and
    kept only by half a paired standard error over the simpler rule, it rarely does."""
    config = reward_config("cost-aware", cost_weight=0.13)
    kept = 0
    for seed in range(30):  # before: 3 of these 30 domains kept the noise
        rng = np.random.default_rng(seed)
        n = 60
        agree = rng.random(n) < 0.7
        right = np.where(agree, rng.random(n) < 0.97, rng.random(n) < 0.6)
        table, rows = _table(seed)
        table.task_ids, table.domains = table.task_ids[:n], ["x"] * n
        table.signal = [[AGREE if a else DISAGREE] for a in agree]
        table.correct, table.cost = table.correct[:n].copy(), table.cost[:n]
        table.correct[:, 0, 0] = right
        table.stopped, table.calls, table.done = table.stopped[:n], table.calls[:n], table.done[:n]
        rule = fit_text_rule(table, rows, config, seed=seed)
        kept += rule.domain_rules.get(PAIR, {}).get("x") != "agreement"
    assert kept <= 1


def test_a_served_review_reads_the_domain_the_plan_line_infers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``recordings-text`` Conductor has no evidence model, so no kind index of its own: a served
    request (domain ``unknown``) read the shared rule where evaluation read its domain's (H40).
    The plan line's index infers it."""
    from types import SimpleNamespace

    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.policies.kinds import KindIndex
    from rl_conductor.policies.knn_embed import EMBED_DIM
    from rl_conductor.tasks.base import Task

    emb = np.zeros((4, EMBED_DIM), dtype=np.float32)
    for i in range(4):
        emb[i, i] = 1.0
    policy = ConductorPolicy.__new__(ConductorPolicy)
    policy.kinds = None
    policy.plan_hint = SimpleNamespace(kinds=KindIndex(emb, ["x", "x", "y", "y"], ["x", "x", "y", "y"]))
    near_y = np.zeros((1, EMBED_DIM), dtype=np.float32)
    near_y[0, 2], near_y[0, 3] = 1.0, 0.9
    monkeypatch.setattr(policy, "_embeddings", lambda tasks: near_y)
    served = Task(id="serve/1", question="q", answer="", domain="unknown", source="serve", grader="qa")
    assert policy._review_task(served).domain == "y"
    labelled = Task(id="t/1", question="q", answer="", domain="x", source="t", grader="qa")
    assert policy._review_task(labelled) is labelled
