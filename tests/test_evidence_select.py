"""``fit_evidence(select=...)``: the estimator chosen per pool by out-of-fold training reward.

What must hold (issue 21): on a pool where neighbourhoods carry no signal the estimate is the
domain table (the domain-router's knowledge); where neighbourhoods do carry it (a pattern a linear
probe cannot read) the estimate follows the neighbours; the chosen estimator survives save and
load; and its fit reads training questions only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.test_evidence import COST_AWARE
from tests.test_warmstart import EASY_HARD, PRICES, _table

from rl_conductor.policies.evidence import CANDIDATES, EvidenceModel, estimated_rewards, fit_evidence
from rl_conductor.tasks.base import Task


def _task(i: int, domain: str) -> Task:
    return Task(id=f"{domain}/{i}", question=f"Q {i}?", answer="1", domain=domain, source="q", grader="math")


def _no_signal(seed: int, per: int = 40) -> tuple[list[Task], np.ndarray, np.ndarray, np.ndarray]:
    """Eight domains; embeddings are noise. Worker ``a`` is right with 0.85 on odd domains and
    0.15 on even ones, ``b`` the reverse, at one cost: the domain says which to ask, the text
    nothing. Returns tasks, embeddings, outcomes and the true rates."""
    rng = np.random.default_rng(seed)
    n = 8 * per
    emb = rng.normal(size=(n, 32))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    tasks = [_task(i, f"d{i // per}") for i in range(n)]
    odd = np.repeat(np.arange(8) % 2 == 1, per)
    truth = np.stack([np.where(odd, 0.85, 0.15), np.where(odd, 0.15, 0.85)], axis=1)
    return tasks, emb, rng.random((n, 2)) < truth, truth


def _xor(seed: int, n: int = 600) -> tuple[list[Task], np.ndarray, np.ndarray, np.ndarray]:
    """One domain; embeddings in four tight clusters at (±1, ±1, …). Worker ``a`` is right (0.9)
    where the two signs agree, ``b`` where they differ (an XOR: no linear probe reads it, the
    nearest neighbours do). Returns tasks, embeddings, outcomes and which worker is better."""
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0], size=(n, 2))
    emb = np.hstack([signs, np.zeros((n, 14))]) + rng.normal(scale=0.15, size=(n, 16))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    agree = signs[:, 0] == signs[:, 1]
    truth = np.stack([np.where(agree, 0.9, 0.1), np.where(agree, 0.1, 0.9)], axis=1)
    return [_task(i, "math") for i in range(n)], emb, rng.random((n, 2)) < truth, agree


def _cost(n: int) -> np.ndarray:
    return np.full((n, 2), 0.001)


def test_where_neighbours_carry_no_signal_the_estimate_is_the_domain_rate() -> None:
    tasks, emb, y, _ = _no_signal(0)
    model, oof = fit_evidence(tasks, emb, ["a", "b"], y, cost=_cost(len(tasks)), select=COST_AWARE)
    assert model.estimator in CANDIDATES and model.selection is not None
    assert set(model.selection) == set(CANDIDATES)
    # the neighbourhoods of noise embeddings mix domains: every kNN candidate routes worse
    assert max(model.selection[f"knn-{k}"] for k in (10, 25)) < model.selection["domain"] - 0.05
    new, new_emb, _, truth = _no_signal(1)
    p = model.predict(new, new_emb)
    assert model.rate is not None
    domain = model.rate[model.group_rows(new)]
    assert np.abs(p - domain).mean() < 0.08 and np.abs(p - truth).mean() < 0.1
    first = estimated_rewards(model, new, p, COST_AWARE).argmax(axis=1)
    assert (first == truth.argmax(axis=1)).mean() > 0.95
    # the one-standard-error rule keeps the simplest candidate: the domain table itself
    simplest, oof_1se = fit_evidence(
        tasks, emb, ["a", "b"], y, cost=_cost(len(tasks)), select=COST_AWARE, rule="1se"
    )
    assert simplest.estimator == "domain"
    np.testing.assert_allclose(simplest.predict(new, new_emb), domain)
    # by log-loss: nothing beats the domain's rate by more than noise, so the estimate stays near it
    by_loss, _ = fit_evidence(
        tasks, emb, ["a", "b"], y, cost=_cost(len(tasks)), select=COST_AWARE, rule="logloss"
    )
    assert not str(by_loss.estimator).startswith("knn")
    assert np.abs(by_loss.predict(new, new_emb) - domain).mean() < 0.08
    assert oof.shape == oof_1se.shape == (len(tasks), 2)


def test_where_neighbours_carry_the_signal_the_estimate_follows_them() -> None:
    tasks, emb, y, _ = _xor(0)
    model, oof = fit_evidence(tasks, emb, ["a", "b"], y, cost=_cost(len(tasks)), select=COST_AWARE)
    assert model.estimator is not None and (model.estimator.startswith("knn") or model.estimator == "stack")
    assert model.selection is not None
    assert model.selection[model.estimator] > model.selection["domain"] + 0.2
    assert model.selection[model.estimator] > model.selection["probe"] + 0.1
    new, new_emb, _, agree = _xor(1, 300)
    p = model.predict(new, new_emb)
    first = estimated_rewards(model, new, p, COST_AWARE).argmax(axis=1)
    assert (first == np.where(agree, 0, 1)).mean() > 0.9
    by_loss, _ = fit_evidence(
        tasks, emb, ["a", "b"], y, cost=_cost(len(tasks)), select=COST_AWARE, rule="logloss"
    )
    assert str(by_loss.estimator).startswith("knn") or by_loss.estimator == "stack"
    # out of fold on the training questions too (training prompts look like test prompts)
    _, _, _, agree_train = _xor(0)
    assert (oof.argmax(axis=1) == np.where(agree_train, 0, 1)).mean() > 0.85


@pytest.mark.parametrize("make", [_no_signal, _xor])
def test_a_selected_estimator_survives_save_and_load(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    tasks, emb, y, _ = make(0)
    model, _ = fit_evidence(tasks, emb, ["a", "b"], y, cost=_cost(len(tasks)), select=COST_AWARE)
    model.save(tmp_path)
    again = EvidenceModel.load(tmp_path)
    assert again.estimator == model.estimator and again.selection == model.selection
    assert again.selection_se == model.selection_se
    new, new_emb, _, _ = make(1)
    np.testing.assert_allclose(again.predict(new, new_emb), model.predict(new, new_emb))


def test_select_needs_costs_and_a_known_rule() -> None:
    tasks, emb, y, _ = _no_signal(0, per=10)
    with pytest.raises(ValueError, match="cost"):
        fit_evidence(tasks, emb, ["a", "b"], y, select=COST_AWARE)
    with pytest.raises(ValueError, match="rule"):
        fit_evidence(tasks, emb, ["a", "b"], y, cost=_cost(len(tasks)), select=COST_AWARE, rule="worst")


def test_selection_is_fitted_on_the_tables_training_questions_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the training path (``prompt_evidence``): the selected model's neighbour index holds
    exactly the candidate table's training questions, and no validation or test question."""
    import rl_conductor.policies.knn as knn
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.train import prompt_evidence

    train = load_tasks("paper-mix", split="train")[:12]
    held = load_tasks("paper-mix", split="validation")[:3] + load_tasks("paper-mix", split="test")[:3]
    vectors = {t.question: v for t, v in zip(train + held, np.eye(len(train) + len(held), 24), strict=True)}
    monkeypatch.setattr(knn, "cached_embeddings", lambda texts: np.array([vectors[t] for t in texts]))
    table = _table(EASY_HARD | {"solve:extra": [False] * 10}, PRICES | {"solve:extra": 0.0}, budgets=[None])
    table.task_ids = [t.id for t in train[:10]]
    model, out = prompt_evidence(table, train[:10], train, select=COST_AWARE)
    assert model.estimator in CANDIDATES and model.selection is not None
    assert set(out) == {t.id for t in train}
    assert model.knn_emb is not None and model.knn_y is not None
    index = [tuple(r) for r in np.asarray(model.knn_emb)]
    assert index == [tuple(np.asarray(vectors[t.question], dtype=np.float32)) for t in train[:10]]
    assert not {tuple(np.asarray(vectors[t.question], dtype=np.float32)) for t in held} & set(index)


def test_config_names_the_selection_rule() -> None:
    from rl_conductor.errors import ConfigError
    from rl_conductor.training.config import TrainConfig

    assert TrainConfig(evidence="rank", evidence_select="1se").evidence_select == "1se"
    with pytest.raises(ConfigError, match="evidence_select must be one of"):
        TrainConfig(evidence="rank", evidence_select="oracle")
