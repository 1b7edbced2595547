"""Per-question evidence: the probes learn what the text predicts and nothing it does not, the
training prompts' estimates are out-of-fold, prompts show the estimates (and are unchanged without
them), targets follow a question's own evidence, and a trained Conductor reads the evidence it
was trained with from its folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from tests.test_warmstart import EASY_HARD, PRICES, _table

from _pools import fake_pool
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.evidence import EvidenceModel, evidence_for, fit_evidence
from rl_conductor.prompting import conductor_prompt, cut, percent
from rl_conductor.reward import REWARD_PRESETS
from rl_conductor.tasks.base import Task

if TYPE_CHECKING:
    from rl_conductor.training.config import TrainConfig

COST_AWARE = REWARD_PRESETS["cost-aware"]


def _tasks(n: int, seed: int = 0) -> tuple[list[Task], np.ndarray, np.ndarray]:
    """``n`` questions in one domain; worker 0 is right exactly on the questions whose embedding
    points one way (readable from the text's embedding), worker 1 at random (not readable),
    worker 2 always."""
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, 16))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    tasks = [
        Task(id=f"q/{i}", question=f"Question {i}?", answer="1", domain="math", source="q", grader="math")
        for i in range(n)
    ]
    correct = np.stack([emb[:, 0] > 0, rng.random(n) < 0.5, np.ones(n, dtype=bool)], axis=1)
    return tasks, emb, correct


def test_probe_learns_what_the_text_predicts_and_falls_back_to_the_rate_elsewhere() -> None:
    tasks, emb, correct = _tasks(400)
    model, oof = fit_evidence(tasks, emb, ["readable", "noise", "always"], correct)
    # out of fold, the readable worker's estimate separates its right answers from its wrong ones
    assert oof[correct[:, 0], 0].mean() - oof[~correct[:, 0], 0].mean() > 0.4
    # the noise worker's estimate stays near its rate: nothing to learn
    assert abs(oof[:, 1].mean() - correct[:, 1].mean()) < 0.05
    assert np.ptp(oof[:, 1]) < 0.35
    # a one-outcome worker gets its (slightly shrunk) rate, in and out of fold
    assert np.all(oof[:, 2] > 0.99)
    new_tasks, new_emb, new_correct = _tasks(200, seed=1)
    p = model.predict(new_tasks, new_emb)
    assert p[new_correct[:, 0], 0].mean() - p[~new_correct[:, 0], 0].mean() > 0.4
    assert np.all(p[:, 2] > 0.99)


def test_training_estimates_are_out_of_fold() -> None:
    """Each question has a feature of its own and random outcomes: a model that saw a question
    can memorise it; out-of-fold estimates cannot, so they carry no information about it."""
    n = 120
    rng = np.random.default_rng(3)
    emb = np.eye(n)  # one feature per question
    tasks = [
        Task(id=f"q/{i}", question="Same question?", answer="1", domain="math", source="q", grader="math")
        for i in range(n)
    ]
    y = rng.random(n) < 0.5
    model, oof = fit_evidence(tasks, emb, ["w"], y[:, None])
    in_sample = model.predict(tasks, emb)[:, 0]
    oof_gap = oof[y, 0].mean() - oof[~y, 0].mean()
    assert abs(oof_gap) < 0.05
    # the test can fail: in-sample estimates do memorise where the chosen C allows it, and they
    # never beat out-of-fold ones by less than nothing
    assert in_sample[y].mean() - in_sample[~y].mean() >= oof_gap - 1e-9


def test_save_and_load_give_the_same_estimates(tmp_path: Path) -> None:
    tasks, emb, correct = _tasks(100)
    model, _ = fit_evidence(tasks, emb, ["a", "b", "c"], correct)
    model.save(tmp_path)
    assert EvidenceModel.exists(tmp_path)
    again = EvidenceModel.load(tmp_path)
    np.testing.assert_allclose(again.predict(tasks, emb), model.predict(tasks, emb))
    assert evidence_for(again, tasks[:2], emb[:2])[0].keys() == {"a", "b", "c"}


def test_fit_rejects_mismatched_shapes() -> None:
    tasks, emb, correct = _tasks(20)
    with pytest.raises(ValueError, match="outcome rows"):
        fit_evidence(tasks[:10], emb, ["a", "b", "c"], correct)


def test_prompt_shows_the_evidence_and_is_unchanged_without_it() -> None:
    pool = fake_pool(3)
    view = pool.view()
    task = Task(id="x/1", question="What is 2 + 2?", answer="4", domain="math", source="x", grader="math")
    plain = conductor_prompt(task, view, RequestLimits())
    assert "right" not in plain
    names = view.names()
    shown = conductor_prompt(task, view, RequestLimits(), evidence={names[0]: 0.712, names[2]: 0.04})
    lines = shown.splitlines()
    assert lines[2].endswith("; ~70% right") and lines[4].endswith("; ~5% right")
    assert "right" not in lines[3]  # no estimate for this worker: no claim
    # the rest of the prompt is the same
    assert [ln.split("; ~")[0] for ln in lines] == plain.splitlines()
    assert percent(0.024) == 0 and percent(0.976) == 100 and percent(1.7) == 100


def test_ends_cut_keeps_the_start_and_the_item_at_the_end() -> None:
    head = "Here are examples. " * 40
    q = head + "Now the item: what is the capital of Peru?"
    assert "Peru" not in cut(q, 120)
    ends = cut(q, 120, "ends")
    assert len(ends) <= 120 and ends.startswith("Here are") and ends.endswith("capital of Peru?")
    with pytest.raises(ValueError, match="question cut"):
        cut(q, 120, "middle")


def test_targets_follow_each_questions_own_evidence() -> None:
    """Two questions of one group: the group mean prefers the strong worker; a question whose
    evidence says the cheap worker is surely right there gets the cheap worker."""
    from rl_conductor.training.warmstart import ExpectedRewards

    table = _table(EASY_HARD, PRICES)
    evidence = {f"t/{i}": {"cheap": 0.99 if i == 0 else 0.4, "strong": 0.8} for i in range(10)}
    plain = ExpectedRewards.fit(table, COST_AWARE)
    per_q = ExpectedRewards.fit(table, COST_AWARE, item_evidence=evidence)
    easy = Task(id="t/0", question="q0", answer="0", domain="math", source="t", grader="math")
    hard = Task(id="t/7", question="q7", answer="0", domain="math", source="t", grader="math")
    assert plain.best(easy, ["cheap", "strong"], None).name == "solve:strong"
    assert per_q.best(easy, ["cheap", "strong"], None).name == "solve:cheap"
    assert per_q.best(hard, ["cheap", "strong"], None).name == "solve:strong"
    # a question without evidence keeps its group's target
    other = Task(id="t/99", question="q", answer="0", domain="math", source="t", grader="math")
    assert per_q.best(other, ["cheap", "strong"], None).name == "solve:strong"


def test_targets_with_evidence_still_respect_budgets_and_subsets() -> None:
    from rl_conductor.training.warmstart import ExpectedRewards

    table = _table(EASY_HARD, PRICES, budgets=[None, 0.002], unaffordable={"solve:strong": [1]})
    evidence = {f"t/{i}": {"cheap": 0.1, "strong": 0.99} for i in range(10)}
    er = ExpectedRewards.fit(table, COST_AWARE, item_evidence=evidence)
    t = Task(id="t/3", question="q", answer="0", domain="math", source="t", grader="math")
    assert er.best(t, ["cheap", "strong"], None).name == "solve:strong"
    # under the budget the strong worker is unaffordable, whatever its evidence says
    assert er.best(t, ["cheap", "strong"], 0.002).name == "solve:cheap"
    # and a worker not shown is never a target
    assert er.best(t, ["cheap"], None).name == "solve:cheap"


def test_config_needs_the_warm_start_table_for_evidence() -> None:
    from rl_conductor.errors import ConfigError
    from rl_conductor.training.config import TrainConfig

    with pytest.raises(ConfigError, match="expected-best"):
        TrainConfig(evidence="probe", sft_targets="random")
    with pytest.raises(ConfigError, match="evidence must be one of"):
        TrainConfig(evidence="knn-magic")
    with pytest.raises(ConfigError, match="question_cut"):
        TrainConfig(question_cut="middle")


def test_prompt_evidence_reads_only_the_tables_training_questions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The evidence model is fitted on the candidate table's rows (training questions) only: the
    outcome matrix it is given has exactly the table's task ids, in order, and validation or test
    questions never reach the fit."""
    import rl_conductor.policies.evidence as ev
    import rl_conductor.policies.knn as knn
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.train import prompt_evidence

    train = load_tasks("paper-mix", split="train")[:12]
    test = load_tasks("paper-mix", split="test")[:4]
    table = _table(EASY_HARD | {"solve:extra": [False] * 10}, PRICES | {"solve:extra": 0.0}, budgets=[None])
    table.task_ids = [t.id for t in train[:10]]
    seen: list[list[str]] = []
    real_fit = ev.fit_evidence

    def spy(tasks, emb, names, correct, **kw):  # type: ignore[no-untyped-def]
        seen.append([t.id for t in tasks])
        return real_fit(tasks, emb, names, correct, **kw)

    monkeypatch.setattr(ev, "fit_evidence", spy)
    monkeypatch.setattr(knn, "cached_embeddings", lambda texts: np.eye(len(texts), 8))
    monkeypatch.setattr(ev, "evidence_for", lambda m, ts, e: [{"cheap": 0.5} for _ in ts])
    model, out = prompt_evidence(table, train[:10], train)
    assert seen == [table.task_ids]
    assert not {t.id for t in test} & set(seen[0])
    assert set(out) == {t.id for t in train}
    assert model.names == ["cheap", "strong", "extra"]


def replay_evidence_config(tmp_path: Path, evidence: str) -> TrainConfig:
    """The micro Conductor's training config on the replay pool with ``evidence`` in its prompts:
    expected-best warm start from a small table, one GRPO step (the trained-evidence tests')."""
    from tests._tiny import micro_config

    return micro_config(
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        pool="routellm-replay",
        dataset="routellm",
        sft_targets="expected-best",
        evidence=evidence,
        warm_items_per_domain=40,
        warm_top_k=1,
        warm_cheap_k=1,
        budgets_usd=[0.005],
        deadline_fraction=0.0,
        grpo_steps=1,
        sft_examples=64,
        warm_cache_dir=str(tmp_path / "cache"),
    )


@pytest.mark.slow
def test_trained_conductor_reads_its_evidence(tmp_path: Path) -> None:
    """A micro Conductor trained with ``evidence: probe`` on the replay pool: its folder holds the
    evidence model, conductor.json says so, and its prompts show an estimate per worker; a folder
    whose evidence files are missing fails to load with one line."""
    from tests._tiny import assert_refused_without

    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.train import train
    from rl_conductor.workers.pool import load_pool

    cfg = replay_evidence_config(tmp_path, "probe")
    res = train(cfg, tmp_path / "run", progress=False)
    final = res.final_dir
    meta = json.loads((final / "conductor.json").read_text())
    assert meta["evidence"] == "probe" and EvidenceModel.exists(final)
    policy = ConductorPolicy(final)
    pool = load_pool("routellm-replay", seed=0)
    task = load_tasks("routellm", split="test")[0]
    prompt = policy.prompt(task, pool.view(), RequestLimits())
    assert prompt.count("% right") == len(pool)
    assert_refused_without(final, "evidence.npz", "evidence", tmp_path)


def test_long_texts_are_embedded_by_their_start_and_their_end() -> None:
    """Few-shot prompts share a long start; what is embedded of them keeps the item at the end,
    so two items behind the same head embed apart (the kNN router and the evidence alike)."""
    from rl_conductor.policies.knn_embed import MAX_CHARS, embed, index_text

    head = "Example: 2 + 2 = 4. " * 60
    a, b = head + "What is the capital of Peru?", head + "How many legs has a spider?"
    assert index_text("short") == "short"
    assert index_text(a).endswith("capital of Peru?") and len(index_text(a)) <= MAX_CHARS + 5
    ea, eb = embed([a, b])
    assert float(ea @ eb) < 0.95
