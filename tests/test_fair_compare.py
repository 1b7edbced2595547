"""Fair comparisons: every policy of an evaluation is scored, and the routers are fitted, at one
reward — the options' or the Conductor's own (its ``conductor.json``) — on every training
question; the pipeline's gate compares at that reward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from rl_conductor.cli import app
from rl_conductor.evaluation.suite import eval_reward, run_eval, trained_reward
from rl_conductor.policies.catalog import make_policy
from rl_conductor.policies.knn import KnnRouter
from rl_conductor.reward import RewardConfig, reward_config, reward_of
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.tracking.gate import GateThresholds, best_baseline, decide
from rl_conductor.workers.pool import load_pool

SIX = "gsm8k-six"
GPT4, MIXTRAL = "gpt-4-1106-preview", "mixtral-8x7b-instruct"


def _model_dir(tmp_path: Path, meta: dict[str, Any]) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "conductor.json").write_text(json.dumps(meta))
    return folder


def test_the_reward_defaults_to_the_conductors_own(tmp_path: Path) -> None:
    own = reward_config("cost-aware", cost_weight=0.13)
    new = _model_dir(tmp_path, {"pool": SIX, "reward": own.to_dict()})
    assert eval_reward([f"conductor:{new}", "knn"], None, None) == own
    assert eval_reward([f"conductor:{new}"], None, 0.5) == reward_config("cost-aware", cost_weight=0.5)
    assert eval_reward([f"conductor:{new}"], "paper", None) == reward_config("paper")
    assert eval_reward(["knn"], None, None) == RewardConfig()  # no Conductor: the cost-aware preset
    # a model trained before conductor.json recorded its reward: rebuilt from its training config
    old = {"train_config": {"reward_preset": "cost-aware", "cost_weight": 0.27, "cost_scale": None}}
    assert trained_reward(old) == reward_config("cost-aware", cost_weight=0.27)
    assert trained_reward({}) == reward_config("cost-aware")  # neither: the preset


def test_routers_are_fitted_at_the_evaluations_reward() -> None:
    """At the default cost weight GPT-4 earns most on GSM8K; at 1.0 its cost outweighs its extra
    accuracy and Mixtral does. The domain router must follow the reward it is scored with."""
    runs = {
        w: run_eval(["domain-router"], pool=SIX, dataset=None, split="test", limit=40, seed=0, progress=False,
                    cost_weight=w)[0]
        for w in (0.03, 1.0)
    }  # fmt: skip
    assert runs[0.03]["worker_shares"] == {GPT4: 1.0}
    assert runs[1.0]["worker_shares"] == {MIXTRAL: 1.0}
    assert runs[1.0]["reward"]["cost_weight"] == 1.0


def test_every_policy_is_scored_with_one_reward() -> None:
    rc = reward_config("cost-aware", cost_weight=0.2)
    runs = run_eval([f"single:{GPT4}", f"single:{MIXTRAL}"], pool=SIX, dataset=None, split="test", limit=30,
                    seed=0, progress=False, cost_weight=0.2)  # fmt: skip
    for s in runs:
        assert s["reward"] == rc.to_dict()
        # one call, parsed, no budget: the reward of each question is reward_of at that config
        expected = reward_of(rc, correct=True, cost=0.0, called=True)
        assert s["mean_reward"] <= expected
    gpt4, mixtral = runs
    per_q = rc.correct_weight * (gpt4["accuracy"] - mixtral["accuracy"])
    penalty = rc.cost_weight / rc.cost_scale * (gpt4["mean_cost_usd"] - mixtral["mean_cost_usd"])
    assert gpt4["mean_reward"] - mixtral["mean_reward"] == pytest.approx(per_q - penalty)


def test_routers_fit_on_every_training_question_unless_told(tmp_path: Path) -> None:
    rows = []
    for t in load_tasks(SIX)[:60]:  # 45 train, a validation item (nothing carved), 14 test
        split = "train" if len(rows) < 45 else "validation" if len(rows) == 45 else "test"
        rows.append({"id": t.id, "question": t.question, "answer": t.answer, "grader": "math",
                     "domain": "math", "split": split,
                     "responses": {"a": {"text": f"#### {t.answer}", "correct": True},
                                   "b": {"text": "#### -1", "correct": False}}})  # fmt: skip
    rec = tmp_path / "r.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool_file = tmp_path / "p.yaml"
    pool_file.write_text(yaml.safe_dump({"name": "p", "recordings": str(rec), "workers": [
        {"name": "a", "kind": "replay", "price_in": 1, "price_out": 1},
        {"name": "b", "kind": "replay", "price_in": 0.1, "price_out": 0.1}]}))  # fmt: skip
    pool = load_pool(str(pool_file))
    everything = make_policy("knn", pool, seed=0)
    assert isinstance(everything, KnnRouter) and everything.embeddings.shape[0] == 45
    some = make_policy("knn", pool, seed=0, fit_limit=20)
    assert isinstance(some, KnnRouter) and some.embeddings.shape[0] == 20
    spec = make_policy("knn:10", pool, seed=0, fit_limit=20)  # the spec's own size wins
    assert isinstance(spec, KnnRouter) and spec.embeddings.shape[0] == 10
    weighted = make_policy("knn", pool, seed=0, reward_config=reward_config("cost-aware", cost_weight=0.4))
    assert isinstance(weighted, KnnRouter) and weighted.reward.cost_weight == 0.4


def test_eval_and_compare_take_reward_options_and_say_which() -> None:
    res = CliRunner().invoke(app, ["eval", "--pool", SIX, "--limit", "5", "--policy", f"single:{MIXTRAL}",
                                   "--cost-weight", "0.13", "--fit-limit", "50"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "cost weight 0.13" in res.output
    bad = CliRunner().invoke(app, ["eval", "--pool", SIX, "--policy", "knn", "--reward-preset", "vibes"])
    assert bad.exit_code == 2 and "vibes" in bad.output
    neg = CliRunner().invoke(app, ["compare", "--pool", SIX, "--cost-weight", "-1"])
    assert neg.exit_code == 2


def _row(policy: str, acc: float, cost: float, reward: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"policy": policy, "accuracy": acc, "mean_cost_usd": cost}
    if reward is not None:
        row["mean_reward"] = reward
    return row


def test_the_gate_compares_at_the_trained_reward() -> None:
    """At a cost weight where the most accurate worker is not reward-optimal, a Conductor that
    earns more reward than every baseline passes though it is less accurate than GPT-4 alone; one
    that earns less is refused, naming the router and the reward."""
    rows = [
        _row(f"single:{GPT4}", 0.85, 0.0047, 0.86),
        _row(f"single:{MIXTRAL}", 0.60, 0.0001, 0.80),
        _row("domain-router", 0.85, 0.0047, 0.86),
        _row("knn", 0.80, 0.0015, 0.88),
        _row("oracle", 0.93, 0.0002, 0.96),  # reads the gold: never a baseline
    ]
    base = best_baseline(rows)
    assert base == {"baseline_policy": "knn", "baseline_accuracy": 0.80, "baseline_mean_cost_usd": 0.0015,
                    "baseline_mean_reward": 0.88}  # fmt: skip
    better = {"accuracy": 0.82, "mean_cost_usd": 0.0010, "mean_reward": 0.895, **base}
    assert decide(better, None).promote
    worse = {**better, "mean_reward": 0.87}
    decision = decide(worse, None)
    assert not decision.promote and "mean reward 0.8700 is below knn (0.8800)" in decision.reason
    margin = GateThresholds(min_reward_gain_over_baseline=0.02)
    assert not decide(better, None, margin).promote
    # without rewards (an old evaluation) the accuracy rule still applies
    old = best_baseline([_row(f"single:{GPT4}", 0.85, 0.0047, None), _row("knn", 0.80, 0.0015, None)])
    assert (
        old is not None and old["baseline_policy"] == f"single:{GPT4}" and "baseline_mean_reward" not in old
    )
    assert not decide({"accuracy": 0.82, "mean_cost_usd": 0.001, **old}, None).promote


def test_compare_defaults_to_the_conductors_pool_and_a_replay_pool_gets_the_fitted_cascade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compare --policy conductor:DIR`` without ``--pool`` ran on paper-sim, where 95 % of a
    recordings Conductor's plans did not parse (exit 0); it now takes the Conductor's pool, as
    ``eval`` does. On a replayed pool the baselines include the fitted cascade and leave out MoA
    and self-consistency (a recorded answer is the same whatever a worker is shown)."""
    from rl_conductor.evaluation import suite

    model = _model_dir(
        tmp_path, {"pool": SIX, "dataset": SIX, "reward": reward_config("cost-aware").to_dict()}
    )
    seen: dict[str, Any] = {}

    def stop(specs: list[str], points: Any, **kw: Any) -> Any:
        seen.update(kw, specs=specs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(suite, "run_sweep", stop)
    res = CliRunner().invoke(app, ["compare", "--policy", f"conductor:{model}", "--limit", "2"])
    assert isinstance(res.exception, RuntimeError), res.output
    assert seen["pool"] == SIX and seen["dataset"] == SIX
    assert "cascade:all" in seen["specs"] and f"conductor:{model}" in seen["specs"]
    assert not any(s == "moa" or s.startswith("self-consistency") for s in seen["specs"])
    sim = suite.baseline_specs("paper-sim")
    assert "moa" in sim and "cascade:all" not in sim


def test_compare_runs_a_baseline_given_as_a_policy_once_in_the_policys_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compare --policy domain-router --policy knn`` ran and showed both routers twice (once as
    baselines): minutes of fitting for duplicate rows. Each runs once, where the --policy put it,
    so the first --policy is still the reference of the paired table."""
    from rl_conductor.evaluation import suite

    seen: dict[str, Any] = {}

    def stop(specs: list[str], points: Any, **kw: Any) -> Any:
        seen.update(specs=specs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(suite, "run_sweep", stop)
    args = ["compare", "--pool", SIX, "--policy", "domain-router", "--policy", "knn", "--limit", "2"]
    res = CliRunner().invoke(app, args)
    assert isinstance(res.exception, RuntimeError), res.output
    specs = seen["specs"]
    assert len(specs) == len(set(specs)) and specs[-2:] == ["domain-router", "knn"]
    assert set(suite.baseline_specs(SIX)) <= set(specs)
