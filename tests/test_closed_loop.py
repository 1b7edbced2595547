"""The closed loop (rl_conductor.loop): traffic → feedback → retrain → gate, and its rules.

The end-to-end test serves the session's micro Conductor as the registered champion (the real
KServe predictor on loopback, loading ``models:/NAME@champion`` from sqlite MLflow), sends it 200
requests, gives feedback on each, runs ``conductor-retrain`` on kfp's local runner and checks the
gate's decision and the traffic in MLflow. The unit tests pin the rules the loop adds: the gate by
reward at the new prices, the paired interval against churn, pool-change detection, the window's
splits, the spend-capped pool and the compiled YAML.
"""

from __future__ import annotations

import json
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from _tiny import Micro
from predictor import predictor
from rl_conductor.loop import pool_change
from rl_conductor.loop.retrain import Comparison, decide, paired_gain, spend_capped_pool
from rl_conductor.tracking import gate

# --------------------------------------------------------------------------- rules


def _summary(reward: float, acc: float, cost: float, split: str = "s1") -> dict[str, Any]:
    return {"mean_reward": reward, "accuracy": acc, "mean_cost_usd": cost, "test_split_id": split}


def test_gate_by_reward_prefers_a_cheaper_challenger_at_new_prices() -> None:
    challenger = {**_summary(0.80, 0.70, 0.001), "baseline_accuracy": 0.6, "baseline_mean_reward": 0.7}
    champion = _summary(0.75, 0.72, 0.02)
    by_accuracy = gate.decide(challenger, champion)
    assert not by_accuracy.promote and "accuracy" in by_accuracy.reason
    by_reward = gate.decide(challenger, champion, gate.GateThresholds(versus_champion="reward"))
    assert by_reward.promote and "mean reward 0.8000 vs champion 0.7500" in by_reward.reason
    worse = gate.decide(
        {**challenger, "mean_reward": 0.74}, champion, gate.GateThresholds(versus_champion="reward")
    )
    assert not worse.promote and "at this pool's prices" in worse.reason
    with pytest.raises(ValueError, match="versus_champion"):
        gate.GateThresholds(versus_champion="vibes")


def _comparison(gains: list[float]) -> Comparison:
    low_high = paired_gain([0.5 + g for g in gains], [0.5] * len(gains))
    mean = low_high[0]
    return Comparison(
        n=len(gains),
        test_split_id="s1",
        challenger={
            **_summary(0.5 + mean, 0.7, 0.001),
            "baseline_accuracy": 0.1,
            "baseline_mean_reward": 0.1,
        },
        champion=_summary(0.5, 0.7, 0.001),
        baseline={"baseline_accuracy": 0.1, "baseline_mean_reward": 0.1, "baseline_policy": "single:x"},
        reward_gain=mean,
        ci_low=low_high[1],
        ci_high=low_high[2],
    )


def test_a_gain_within_noise_keeps_the_champion_a_clear_gain_promotes() -> None:
    noisy = _comparison([0.3, -0.3, 0.25, -0.2, 0.01, 0.0] * 5)  # mean +0.01, interval spans 0
    kept = decide(noisy)
    assert not kept.promote and "not above 0 with confidence" in kept.reason
    assert decide(noisy, require_significant=False).promote  # the plain gate would churn
    clear = _comparison([0.1, 0.12, 0.08, 0.11, 0.09] * 6)
    promoted = decide(clear)
    assert promoted.promote and "95 % CI" in promoted.reason
    assert not decide(clear, min_reward_gain=0.2).promote


def test_pool_changes_name_new_removed_and_repriced_workers(tmp_path: Path) -> None:
    before = pool_change.snapshot("paper-sim")
    cfg = yaml.safe_load((Path(pool_change.__file__).parents[1] / "configs/pools/paper-sim.yaml").read_text())
    for w in cfg["workers"]:
        if w["name"] == "gemini-2.5-pro":
            w["price_in"], w["price_out"] = w["price_in"] * 4, w["price_out"] * 4
    cfg["workers"] = [w for w in cfg["workers"] if w["name"] != "gemma-3-27b-it"]
    cfg["workers"].append({**cfg["workers"][0], "name": "new-model"})
    path = tmp_path / "drift.yaml"
    path.write_text(yaml.safe_dump(cfg))
    found = pool_change.changes(before, pool_change.snapshot(str(path)))
    assert "new worker new-model" in found and "removed worker gemma-3-27b-it" in found
    assert "re-priced worker gemini-2.5-pro: price_in 1.25 -> 5.0" in found
    assert pool_change.changes(before, pool_change.snapshot("paper-sim")) == []


def _degraded_pool(tmp_path: Path) -> Path:
    """paper-sim with deepseek-r1-distill-qwen-32b degraded in place: same name, same prices."""
    cfg = yaml.safe_load((Path(pool_change.__file__).parents[1] / "configs/pools/paper-sim.yaml").read_text())
    for w in cfg["workers"]:
        if w["name"] == "deepseek-r1-distill-qwen-32b":
            w["accuracy"] = {"math": 0.3, "knowledge": 0.4, "reasoning": 0.12, "code": 0.08}
    path = tmp_path / "degraded.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_worker_degraded_in_place_is_a_pool_change_and_not_a_cached_router_fit(tmp_path: Path) -> None:
    from rl_conductor.policies.routers import pool_key
    from rl_conductor.workers.pool import load_pool

    path = _degraded_pool(tmp_path)
    found = pool_change.changes(pool_change.snapshot("paper-sim"), pool_change.snapshot(str(path)))
    assert len(found) == 1 and found[0].startswith(
        "changed worker deepseek-r1-distill-qwen-32b: accuracy None -> {"
    ), found
    # the gate's routers measure the single workers once per pool key: a degraded worker with the
    # same name and prices must not reuse the measurements of the pool before it degraded
    assert pool_key(load_pool(str(path))) != pool_key(load_pool("paper-sim"))


def test_a_retrain_keeps_the_champions_reward_unless_told_otherwise(tmp_path: Path) -> None:
    from rl_conductor.loop.retrain import retrain_overrides
    from rl_conductor.reward import reward_config
    from rl_conductor.training.config import load_preset

    champion = tmp_path / "champion"
    champion.mkdir()
    trained = {"reward_preset": "cost-aware", "cost_weight": 0.25, "cost_scale": None}
    (champion / "conductor.json").write_text(json.dumps({"train_config": trained}))
    extra = retrain_overrides(None, str(champion))
    assert extra == {"model": str(champion), "reward_preset": "cost-aware", "cost_weight": 0.25}
    cfg = load_preset("tiny", **extra)  # the preset's 0.03 would have changed the objective
    assert reward_config(cfg.reward_preset, cost_weight=cfg.cost_weight).cost_weight == 0.25
    assert retrain_overrides('{"cost_weight": 0.1}', str(champion))["cost_weight"] == 0.1
    empty, some = tmp_path / "none.jsonl", tmp_path / "some.jsonl"
    empty.write_text("")
    some.write_text('{"request_id": "r"}\n')
    assert "observed_path" not in retrain_overrides(None, str(champion), str(empty))
    assert retrain_overrides(None, str(champion), str(some))["observed_path"] == str(some)


def test_the_spend_cap_applies_only_to_live_pools(tmp_path: Path) -> None:
    assert spend_capped_pool("paper-sim", 5.0, tmp_path) == "paper-sim"  # simulated: nothing to pay
    capped = spend_capped_pool("local-live", 2.5, tmp_path)
    assert capped != "local-live" and yaml.safe_load(Path(capped).read_text())["max_usd"] == 2.5
    assert spend_capped_pool("local-live", 0.0, tmp_path) == "local-live"


def test_compiled_retrain_yaml_is_not_stale_and_has_the_schedule_parameters(tmp_path: Path) -> None:
    from rl_conductor.loop.pipeline import compile_pipeline, default_package_path

    fresh = compile_pipeline(tmp_path / "retrain.yaml")
    committed = default_package_path()
    docs = list(yaml.safe_load_all(committed.read_text()))
    assert list(yaml.safe_load_all(fresh.read_text())) == docs, (
        "pipelines/retrain.yaml is stale: run `conductor retrain compile`"
    )
    params = docs[0]["root"]["inputDefinitions"]["parameters"]
    for name in ("traffic_store", "window_hours", "only_on_pool_change", "min_train_tasks", "spend_cap_usd"):
        assert name in params


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_served_traffic_and_feedback_retrain_on_the_local_runner_and_the_gate_decides(
    micro: Micro, mlflow_db_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow

    from rl_conductor.loop.pipeline import run_local
    from rl_conductor.loop.traffic import read_traffic
    from rl_conductor.serving.pyfunc import MODEL_CODE
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.tracking import mlflow_utils, registry

    db = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_db_template, db)
    uri = f"sqlite:///{db}"
    name = f"loop-{uuid.uuid4().hex[:8]}"
    home = tmp_path / "home"
    monkeypatch.setenv(mlflow_utils.HOME_ENV, str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    previous = mlflow.get_tracking_uri()
    mlflow_utils.configure(uri)
    try:
        registry.log_conductor_model(micro.final_dir, model_code=MODEL_CODE, name=name, alias="champion")
        store = tmp_path / "traffic"
        items = load_tasks("paper-mix", "train", limit=200, seed=3)
        env = {"MLFLOW_TRACKING_URI": uri, mlflow_utils.HOME_ENV: str(home)}
        args = ["--model", f"models:/{name}@champion", "--pool", "paper-sim", "--trace", "false"]
        args += ["--traffic_store", str(store), "--traffic_flush_interval_s", "0.5"]
        with (
            predictor(args, tmp_path, env=env, timeout_s=240, cli=True) as srv,  # the loop: conductor serve
            httpx.Client(base_url=srv.url, timeout=120) as http,
        ):

            def ask(task: Any) -> tuple[Any, dict[str, Any]]:
                resp = http.post(
                    "/v1/models/conductor:predict", json={"instances": [{"question": task.question}]}
                )
                assert resp.status_code == 200, resp.text
                return task, resp.json()["predictions"][0]

            with ThreadPoolExecutor(8) as ex:
                answered = list(ex.map(ask, items))
            assert len(answered) == 200
            import time

            deadline = time.monotonic() + 60
            while len(read_traffic(str(store))) < 200 and time.monotonic() < deadline:
                time.sleep(0.3)
            statuses = []
            for k, (task, doc) in enumerate(answered):
                body: dict[str, Any] = {"request_id": doc["request_id"]}
                if task.grader in ("math", "choice", "qa") and k % 5:
                    body |= {"answer": task.answer, "grader": task.grader}
                else:  # score-only feedback: observed examples (training/observed.py); the code
                    body["score"] = float(k % 2)  # items come last, in the held-out traffic
                statuses.append(http.post("/v1/feedback", json=body).status_code)
            assert statuses == [200] * 200
        assert len(read_traffic(str(store))) == 200
        overrides = {
            "grpo_steps": 2,
            "sft_examples": 32,
            "sft_batch_size": 16,
            "prompts_per_step": 2,
            "num_generations": 2,
            "max_completion_length": 48,
            "max_steps_per_workflow": 2,
            "max_question_chars": 120,
            "warm_items_per_domain": 12,
            "warm_deadline_items_per_domain": 4,
            "torch_threads": 1,
            "logging_steps": 1,
        }
        run = run_local(
            traffic_store=str(store),
            pool="paper-sim",
            model_name=name,
            window_hours=0.0,
            eval_limit=16,
            train_overrides=json.dumps(overrides),
            mlflow_tracking_uri=uri,
            pipeline_root=tmp_path / "kfp",
        )
        assert run.should_train, run.reason
        assert run.reason == "scheduled retrain (the pool did not change)"
        assert run.version == 2 and run.champion_before == 1
        assert run.gate_reason  # promoted or not, the decision says why
        assert run.champion == (2 if run.promoted else 1)
        c = mlflow_utils.client()
        tags = c.get_model_version(name, "2").tags
        assert tags["gate.promoted"] == str(run.promoted).lower() and tags["gate.reason"] == run.gate_reason
        assert pool_change.SNAPSHOT_TAG in tags and "loop.retrain" in tags
        exp = c.get_experiment_by_name(f"{name}-loop")
        runs = {r.data.tags["loop.step"]: r for r in c.search_runs([exp.experiment_id])}
        collect = runs["collect"].data.metrics
        assert collect["traffic/requests"] == 200 and collect["traffic/with_feedback"] == 200
        assert collect["traffic/holdout_tasks"] > 0 and collect["traffic/train_tasks"] > 100
        # the score-only requests reached the retrain's warm start, each taught or not by the rule
        assert collect["traffic/observed"] > 0 and "traffic/observed_reward" in collect
        training = c.get_experiment_by_name("conductor-training")
        [trained] = c.search_runs([training.experiment_id], "metrics.`sft/observed` >= 0")
        sft = trained.data.metrics
        assert sft["sft/observed"] == collect["traffic/observed"]
        assert (
            sft["sft/observed_taught"] + sft["sft/observed_below_baseline"] + sft["sft/observed_unusable"]
            == sft["sft/observed"]
        )
        gate_run = runs["gate"]
        assert gate_run.data.tags["gate.reason"] == run.gate_reason
        assert (
            "champion/mean_reward" in gate_run.data.metrics and "reward_gain_ci_low" in gate_run.data.metrics
        )
        # the floor is the training pipeline's: every single worker and both routers, fitted here
        for floor in ("single_gpt-5", "domain-router", "knn"):
            assert f"{floor}/mean_reward" in gate_run.data.metrics, floor
    finally:
        mlflow_utils.reset()
        mlflow.set_tracking_uri(previous)


def test_retrain_cli_needs_local_and_says_where_the_cluster_yaml_is() -> None:
    from typer.testing import CliRunner

    from rl_conductor.cli import app

    result = CliRunner().invoke(app, ["retrain", "run", "--traffic-store", "/nowhere"])
    assert result.exit_code == 2
    assert "only --local runs from here" in result.output and "pipelines/retrain.yaml" in result.output
