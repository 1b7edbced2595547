"""``evidence: rank``: the shrunk estimate, the ranking line and its targets, and the agreement that
evaluation reports (policies/evidence.py, prompting.rank_line, training/data.py)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from tests.test_evidence import COST_AWARE, _tasks, replay_evidence_config
from tests.test_warmstart import EASY_HARD, PRICES, _table

from _pools import fake_pool
from rl_conductor.evaluation.runner import Record, summarize
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.evidence import EvidenceModel, Ranker, estimated_rewards, fit_evidence, ranking
from rl_conductor.prompting import conductor_prompt, rank_line
from rl_conductor.tasks.base import Task


def _domains(
    n_domains: int, per: int, seed: int = 0
) -> tuple[list[Task], np.ndarray, np.ndarray, np.ndarray]:
    """``n_domains`` domains of ``per`` questions whose embeddings are noise (the text says nothing
    of the outcome) and one worker whose rate of being right is 0.15 or 0.85 by domain."""
    rng = np.random.default_rng(seed)
    n = n_domains * per
    emb = rng.normal(size=(n, 64))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    tasks = [
        Task(
            id=f"d{i // per}/{i}",
            question=f"Q {i}?",
            answer="1",
            domain=f"d{i // per}",
            source="q",
            grader="math",
        )
        for i in range(n)
    ]
    rate = np.array([0.85 if d % 2 else 0.15 for d in range(n_domains)])
    truth = np.repeat(rate, per)
    return tasks, emb, (rng.random(n) < truth)[:, None], truth


def test_shrunk_estimate_leans_on_the_domain_rate_where_the_text_says_nothing() -> None:
    """Many small domains, no signal in the text: the shrunk estimate is each domain's rate (the
    domain-router's knowledge), closer to the truth on new questions than the probe alone."""
    tasks, emb, y, _ = _domains(12, 15)
    plain, _ = fit_evidence(tasks, emb, ["w"], y)
    shrunk, oof = fit_evidence(tasks, emb, ["w"], y, shrink=True)
    assert shrunk.alpha is not None and shrunk.alpha[0] <= 0.5
    new, new_emb, _, truth = _domains(12, 15, seed=1)
    err_plain = np.abs(plain.predict(new, new_emb)[:, 0] - truth).mean()
    err_shrunk = np.abs(shrunk.predict(new, new_emb)[:, 0] - truth).mean()
    assert err_shrunk < 0.1 and err_shrunk < err_plain - 0.015
    # out of fold the estimate follows the domain too (training prompts look like test prompts)
    assert np.abs(oof[:, 0] - np.repeat([0.15, 0.85] * 6, 15)).mean() < 0.15


def test_shrinkage_keeps_what_the_text_does_predict() -> None:
    tasks, emb, correct = _tasks(400)
    model, _ = fit_evidence(tasks, emb, ["readable", "noise", "always"], correct, shrink=True)
    assert model.alpha is not None and model.alpha[0] >= 0.75
    new, new_emb, new_correct = _tasks(200, seed=1)
    p = model.predict(new, new_emb)
    assert p[new_correct[:, 0], 0].mean() - p[~new_correct[:, 0], 0].mean() > 0.4


def test_costs_and_blend_survive_save_and_load(tmp_path: Path) -> None:
    tasks, emb, correct = _tasks(100)
    cost = np.tile([0.001, 0.01, 0.0001], (100, 1))
    model, _ = fit_evidence(tasks, emb, ["a", "b", "c"], correct, cost=cost, shrink=True)
    model.save(tmp_path)
    again = EvidenceModel.load(tmp_path)
    np.testing.assert_allclose(again.predict(tasks, emb), model.predict(tasks, emb))
    np.testing.assert_allclose(again.domain_cost(tasks[:1])[0], [0.001, 0.01, 0.0001])
    unknown = Task(id="z/1", question="?", answer="1", domain="other", source="z", grader="math")
    np.testing.assert_allclose(again.domain_cost([unknown])[0], [0.001, 0.01, 0.0001])


def _two_worker_model(names: list[str]) -> EvidenceModel:
    tasks, emb, correct = _tasks(100)
    cost = np.tile([0.0001, 0.01, 0.001], (100, 1))
    model, _ = fit_evidence(tasks, emb, names, correct, cost=cost)
    return model


def test_ranking_is_by_estimated_reward_and_the_prompt_ends_with_it() -> None:
    pool = fake_pool(3)
    view = pool.view()
    names = view.names()
    model = _two_worker_model(names)
    task = Task(id="x/1", question="What is 2 + 2?", answer="4", domain="math", source="x", grader="math")
    # equal estimates: the cost term decides (worker 0 is cheapest, then 2, then 1)
    est = np.array([[0.6, 0.6, 0.6]])
    r = estimated_rewards(model, [task], est, COST_AWARE)[0]
    assert ranking(model, r, view, RequestLimits()) == [0, 2, 1]
    # a much better estimate for the expensive worker outweighs its cost
    rank = Ranker(model, COST_AWARE)
    assert rank(task, {names[0]: 0.2, names[1]: 0.95, names[2]: 0.2}, view, RequestLimits())[0] == 1
    order = rank(task, dict(zip(names, [0.2, 0.95, 0.3], strict=True)), view, RequestLimits())
    plain = conductor_prompt(task, view, RequestLimits())
    shown = conductor_prompt(task, view, RequestLimits(), ranking=order)
    assert shown == plain + f"{rank_line(order)}\n"
    assert shown.splitlines()[-2:] == ["Ranked by estimate: 1, 2, 0", "Best by estimate: 1"]
    assert rank_line([4]) == "Best by estimate: 4"
    # three ids at most; the best one ends the prompt, a fixed number of tokens before the plan
    assert rank_line([3, 1, 5, 2]) == "Ranked by estimate: 3, 1, 5\nBest by estimate: 3"
    assert re.search(r"Best by estimate: \d\n$", shown)


def test_ranking_leaves_out_workers_over_the_budget_or_forbidden() -> None:
    from rl_conductor.prompting import over_budget, typical_cost

    pool = fake_pool(3)
    view = pool.view()
    infos = view.infos()
    names = view.names()
    model = _two_worker_model(names)
    r = np.array([0.1, 0.5, 0.9])  # worker 2 (the dearest) is best by estimate
    budget = typical_cost(infos[1]) + 1e-9  # the two cheapest are affordable
    order = ranking(model, r, view, RequestLimits(max_cost_usd=budget))
    assert order == [1, 0] and all(not over_budget(infos[i], budget) for i in order)
    assert ranking(model, r, view, RequestLimits()) == [2, 1, 0]
    allowed = [n for j, n in enumerate(names) if j != 2]
    assert ranking(model, r, view, RequestLimits(allowed_workers=frozenset(allowed))) == [1, 0]
    # nothing usable: every shown worker, best first
    assert ranking(model, r, view, RequestLimits(max_cost_usd=1e-12)) == [2, 1, 0]


def test_rank_targets_are_the_first_id_of_the_prompts_line() -> None:
    """Every warm-start record of ``evidence: rank``: its completion is the ranking line's first
    worker alone, under budgets and random subsets with remapped ids."""
    from rl_conductor.training.data import make_specs, warm_sft_records
    from rl_conductor.training.warmstart import ExpectedRewards
    from rl_conductor.workflow import parse

    pool = fake_pool(4)
    names = pool.names()
    tasks, emb, _ = _tasks(60)
    rng = np.random.default_rng(0)
    correct = rng.random((60, 4)) < [0.3, 0.5, 0.7, 0.9]
    cost = np.tile([0.0001, 0.001, 0.003, 0.02], (60, 1))
    model, oof = fit_evidence(tasks, emb, names, correct, cost=cost, shrink=True)
    evidence = {t.id: model.as_mapping(row) for t, row in zip(tasks, oof, strict=True)}
    rank = Ranker(model, COST_AWARE)
    specs = make_specs(
        tasks, pool, 120, rng=random.Random(0), budget_prob=0.5, budgets=[0.002, 0.01], random_pool_prob=0.5
    )
    table = _table(EASY_HARD, PRICES)
    records = warm_sft_records(
        specs,
        pool,
        RequestLimits(),
        ExpectedRewards.fit(table, COST_AWARE),
        max_question_chars=200,
        evidence=evidence,
        rank=rank,
    )
    firsts = []
    for spec, rec in zip(specs, records, strict=True):
        prompt = rec["prompt"][0]["content"]
        line = prompt.rstrip().splitlines()[-1]
        first = int(line.removeprefix("Best by estimate: ").split(",")[0])
        view = spec.pool_view(pool)
        wf = parse(rec["completion"][0]["content"], pool_size=len(view), max_steps=5)
        assert [s.worker for s in wf.steps] == [first]
        assert first == rank(spec.task, evidence[spec.task.id], view, spec.limits(RequestLimits()))[0]
        firsts.append(view.names()[first])
    assert len(set(firsts)) >= 2  # targets differ by question, not one worker for all


def test_config_rank_plans_one_round() -> None:
    from rl_conductor.errors import ConfigError
    from rl_conductor.training.config import TrainConfig

    assert TrainConfig(evidence="rank").evidence == "rank"
    with pytest.raises(ConfigError, match="max_rounds: 1"):
        TrainConfig(evidence="rank", max_rounds=2)


def test_summary_reports_agreement_with_the_evidence_only_where_there_is_a_ranking() -> None:
    base = dict(domain="math", correct=True, tokens=1, cost_usd=0.0, calls=1, steps=1, latency_s=0.1)
    plain = [Record(task_id=f"t{i}", **base) for i in range(3)]  # type: ignore[arg-type]
    assert "evidence_agreement" not in summarize(plain)
    ranked = [
        Record(task_id=f"t{i}", follows_evidence=f, **base)  # type: ignore[arg-type]
        for i, f in enumerate([True, True, False, True])
    ]
    assert summarize(ranked)["evidence_agreement"] == pytest.approx(0.75)


@pytest.mark.slow
def test_trained_rank_conductor_shows_the_line_and_eval_measures_agreement(tmp_path: Path) -> None:
    """A micro Conductor trained with ``evidence: rank`` on the replay pool: conductor.json says
    so, its prompts end with the ranking line, and its evaluation reports how often the plan is
    the line's first worker."""
    from rl_conductor.evaluation.runner import evaluate
    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.train import train
    from rl_conductor.workers.pool import load_pool

    cfg = replay_evidence_config(tmp_path, "rank")
    final = train(cfg, tmp_path / "run", progress=False).final_dir
    meta = json.loads((final / "conductor.json").read_text())
    assert meta["evidence"] == "rank"
    policy = ConductorPolicy(final)
    pool = load_pool("routellm-replay", seed=0)
    tasks = load_tasks("routellm", split="test")[:6]
    assert (
        policy.prompt(tasks[0], pool.view(), RequestLimits())
        .rstrip()
        .splitlines()[-1]
        .startswith("Best by estimate: ")
    )
    # a served request says no domain: it is shown the evidence of its kind, as evaluation is
    from dataclasses import replace

    from rl_conductor.policies.kinds import KindIndex

    assert KindIndex.exists(final) and policy.kinds is not None
    served = [replace(t, id=f"request/{i}", domain="unknown", source="request") for i, t in enumerate(tasks)]
    view = pool.view()
    labelled = policy.plan_batch([(t, view, RequestLimits()) for t in tasks])
    assert [p.evidence_plan for p in policy.plan_batch([(t, view, RequestLimits()) for t in served])] == [
        p.evidence_plan for p in labelled
    ]
    assert policy.task_evidence(served) != policy.task_evidence(tasks)  # what it read without the kinds
    assert not {t.question for t in tasks} & set(policy._embedded)  # kept by hash, not by text
    # conductor.json says the index was saved: a folder that lost a file is refused, not served blind
    import shutil

    from rl_conductor.errors import ModelNotFound

    assert meta["kinds"] is True
    lost = tmp_path / "lost"
    shutil.copytree(final, lost)
    (lost / "kinds.npz").unlink()
    with pytest.raises(ModelNotFound, match=r"kinds\.npz or kinds\.json is missing"):
        ConductorPolicy(lost)
    res = evaluate(policy, pool.view(), tasks, RequestLimits(), progress=False, reward_config=COST_AWARE)
    share = res.summary()["evidence_agreement"]
    follows = [r.follows_evidence for r in res.records]
    assert None not in follows and share == pytest.approx(np.mean(follows))


def test_evidence_rule_policy_sends_each_question_to_the_lines_first_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``evidence-rule:DIR`` reads a rank Conductor's folder (no weights) and plans the first
    worker of the ranking the Conductor is shown; a folder of another kind fails with one line."""
    import asyncio

    import rl_conductor.policies.knn_embed as knn_embed
    from rl_conductor.errors import ModelNotFound
    from rl_conductor.policies.catalog import make_policy
    from rl_conductor.reward import reward_config

    pool = fake_pool(3)
    names = pool.names()
    tasks, emb, correct = _tasks(100)
    cost = np.tile([0.0001, 0.01, 0.001], (100, 1))
    model, _ = fit_evidence(tasks, emb, names, correct, cost=cost, shrink=True)
    model.save(tmp_path)
    meta = {"evidence": "rank", "reward": COST_AWARE.to_dict()}
    (tmp_path / "conductor.json").write_text(json.dumps(meta))
    by_text = {t.question: e for t, e in zip(tasks, emb, strict=True)}
    monkeypatch.setattr(knn_embed, "embed", lambda texts: np.array([by_text[t] for t in texts]))
    rule = make_policy(f"evidence-rule:{tmp_path}", pool)
    rank = Ranker(model, COST_AWARE)
    for task, e in zip(tasks[:20], emb[:20], strict=True):
        plan = asyncio.run(rule.plan(task, pool.view(), RequestLimits()))
        expected = rank(
            task, model.as_mapping(model.predict([task], e[None])[0]), pool.view(), RequestLimits()
        )[0]
        assert [s.worker for s in plan.workflow.steps] == [expected] == list(plan.evidence_plan or ())
    # evaluation's path: the batch is embedded at once, the plans are the same
    calls: list[int] = []
    monkeypatch.setattr(
        rule, "_embed", lambda texts: calls.append(len(texts)) or np.array([by_text[t] for t in texts])
    )
    rule._embedded.clear()
    episodes = asyncio.run(rule.run_many(tasks[20:26], pool.view(), RequestLimits()))
    assert calls == [6]
    for task, ep in zip(tasks[20:26], episodes, strict=True):
        alone = asyncio.run(rule.plan(task, pool.view(), RequestLimits()))
        assert ep.plan.workflow == alone.workflow and ep.plan.evidence_plan == alone.evidence_plan
    # an evaluation's reward ranks it, as the routers are fitted at it: at a cost weight of 0 the
    # dear worker's estimate is no longer held against it
    free = reward_config("cost-aware", cost_weight=0.0)
    at_zero = make_policy(f"evidence-rule:{tmp_path}", pool, reward_config=free)
    assert at_zero.ranker.config == free and rule.ranker.config == COST_AWARE
    (tmp_path / "conductor.json").write_text(json.dumps({**meta, "evidence": "probe"}))
    with pytest.raises(ModelNotFound, match="evidence: rank"):
        make_policy(f"evidence-rule:{tmp_path}", pool)


def test_tables_show_agreement_only_when_a_policy_has_it() -> None:
    from rl_conductor.evaluation.report import markdown_table

    plain = {"policy": "knn", "n": 3, "accuracy": 0.5}
    assert "follows evidence" not in markdown_table([plain])
    ranked = {"policy": "conductor:x", "n": 3, "accuracy": 0.5, "evidence_agreement": 0.975}
    table = markdown_table([ranked, plain])
    assert "follows evidence %" in table.splitlines()[0]
    assert table.splitlines()[2].endswith("| 97.5 |") and table.splitlines()[3].endswith("| - |")
