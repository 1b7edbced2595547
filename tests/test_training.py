"""Training: the config and its presets, synthesised SFT data, the GRPO reward's TRL contract,
and one real micro training run (bootstrap → SFT → GRPO → final folder, MLflow, ``--resume``).

The micro run is trained once per session (``_tiny.trained_micro``); the resume test copies its
folder and continues it through the ``conductor train --resume`` CLI.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from _tiny import Micro, micro_config
from rl_conductor.limits import RequestLimits
from rl_conductor.reward import REWARD_PRESETS
from rl_conductor.tasks.base import Task
from rl_conductor.training.config import TrainConfig, available_presets, load_preset
from rl_conductor.training.data import (
    PromptSpec,
    grpo_records,
    make_specs,
    sft_records,
    synth_workflow,
)
from rl_conductor.training.grpo_reward import ConductorReward, completion_text
from rl_conductor.workers.base import CallContext, Message
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool
from rl_conductor.workflow import normalize, parse, render
from test_warmstart import _task  # "t/i": "What is i + i?"

# --------------------------------------------------------------------------- config and presets


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_generations": 1}, "num_generations"),
        ({"use_lora": True}, "LoRA"),
        ({"reward_preset": "generous"}, "reward_preset"),
        ({"budget_prob": 1.5}, "probabilities"),
        ({"random_pool_prob": -0.1}, "probabilities"),
        ({"max_steps_per_workflow": 0}, "max_steps_per_workflow"),
        ({"use_vllm": True, "vllm_mode": "remote"}, "vllm_mode"),
    ],
)
def test_config_rejects_bad_combinations(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**overrides)


def test_config_accepts_lora_on_other_models_and_roundtrips() -> None:
    cfg = TrainConfig(model="smol", use_lora=True, num_generations=2)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.completions_per_step == cfg.prompts_per_step * 2
    with pytest.raises(ValueError, match="unknown training config keys"):
        TrainConfig.from_dict({**cfg.to_dict(), "learning_rat": 1.0})
    assert set(TrainConfig.help()) == {f.name for f in fields(TrainConfig)}
    assert all(TrainConfig.help().values())  # every field documents itself


def test_presets_load_and_override(tmp_path: Path) -> None:
    assert {"tiny", "smol", "gpu"} <= set(available_presets())
    tiny, smol, gpu = load_preset("tiny"), load_preset("smol"), load_preset("gpu")
    assert (tiny.model, smol.model) == ("tiny", "smol")
    assert not tiny.bf16 and not tiny.use_vllm and not tiny.use_lora
    assert gpu.use_lora and gpu.bf16 and gpu.use_vllm and gpu.vllm_mode == "colocate"
    assert gpu.model not in ("tiny", "smol")
    # overrides apply, None means "keep the preset's value"
    assert load_preset("tiny", grpo_steps=7, seed=None).grpo_steps == 7
    assert load_preset("tiny", grpo_steps=7, seed=None).seed == tiny.seed
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"model": "tiny", "grpo_steps": 3}))
    assert load_preset(str(path)).grpo_steps == 3
    with pytest.raises(ValueError, match="no training preset"):
        load_preset("huge")
    path.write_text(yaml.safe_dump({"model": "tiny", "use_lora": True}))
    with pytest.raises(ValueError, match="LoRA"):
        load_preset(str(path))


def test_gpu_preset_builds_a_valid_grpo_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gpu preset through TRL's own GRPOConfig validation, offline.

    transformers refuses bf16 without a bf16-capable GPU; this machine has none, so that one
    probe is told a GPU is there. Every other check of GRPOConfig and TrainingArguments runs.
    """
    import transformers.training_args as training_args

    from rl_conductor.training.train import grpo_config

    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: True)
    cfg = load_preset("gpu")
    args = grpo_config(cfg, str(tmp_path))
    assert args.use_vllm and args.vllm_mode == "colocate" and args.bf16 and not args.use_cpu
    assert args.vllm_gpu_memory_utilization == cfg.vllm_gpu_memory_utilization
    assert args.num_generations == cfg.num_generations
    assert args.per_device_train_batch_size % args.num_generations == 0
    assert args.max_completion_length == cfg.max_completion_length
    assert args.gradient_checkpointing
    # the CPU preset builds as is, without vLLM or bf16
    tiny = grpo_config(load_preset("tiny"), str(tmp_path))
    assert not tiny.use_vllm and not tiny.bf16 and tiny.use_cpu


# --------------------------------------------------------------------------- synthesised data


def _pool(n: int) -> Pool:
    workers = [
        FakeWorker(info=fake_info(f"w{i}", price_in=0.5 * (i + 1), price_out=2.0 * (i + 1))) for i in range(n)
    ]
    return Pool(name="fake", workers=list(workers))


def _tasks(n: int) -> list[Task]:
    return [_task(i) for i in range(n)]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), pool_size=st.integers(1, 12), max_steps=st.integers(1, 6))
def test_synth_workflow_always_renders_to_a_parseable_plan(seed: int, pool_size: int, max_steps: int) -> None:
    wf = synth_workflow(random.Random(seed), pool_size, max_steps=max_steps)
    assert 1 <= len(wf.steps) <= max_steps
    assert all(0 <= s.worker < pool_size for s in wf.steps)
    parsed = parse(render(wf), pool_size=pool_size, max_steps=max_steps)
    assert normalize(parsed) == normalize(wf)


def test_synth_workflow_varies_length_workers_and_access() -> None:
    rng = random.Random(0)
    wfs = [synth_workflow(rng, 7, max_steps=5) for _ in range(400)]
    assert {len(w.steps) for w in wfs} == {1, 2, 3, 4, 5}
    assert {s.worker for w in wfs for s in w.steps} == set(range(7))
    kinds = {
        ("all" if s.access == "all" else ("none" if not s.access else "list"))
        for w in wfs
        for s in w.steps[1:]
    }
    assert kinds == {"all", "none", "list"}


def test_make_specs_honours_probability_extremes() -> None:
    pool, tasks, rng = _pool(6), _tasks(5), random.Random(1)
    budgets = [0.01, 0.02]
    common: dict[str, Any] = {"rng": rng, "budgets": budgets, "min_pool_size": 2}
    never = make_specs(tasks, pool, 40, budget_prob=0.0, random_pool_prob=0.0, **common)
    assert len(never) == 40
    assert all(s.budget is None and s.view == tuple(range(6)) for s in never)
    assert {s.task.id for s in never} == {t.id for t in tasks}  # cycles through every task
    always = make_specs(tasks, pool, 40, budget_prob=1.0, random_pool_prob=1.0, **common)
    assert all(s.budget in budgets for s in always)
    assert all(len(s.view) >= 2 and len(set(s.view)) == len(s.view) for s in always)
    assert all(set(s.view) <= set(range(6)) for s in always)
    assert any(s.view != tuple(range(6)) for s in always)  # subsets and orders really vary
    with pytest.raises(ValueError, match="at least one task"):
        make_specs([], pool, 1, budget_prob=0.0, random_pool_prob=0.0, rng=rng, budgets=budgets)
    assert make_specs([], pool, 0, budget_prob=0.0, random_pool_prob=0.0, rng=rng, budgets=budgets) == []
    # no budgets to draw from: no budget, whatever the probability
    assert all(
        s.budget is None
        for s in make_specs(tasks, pool, 10, budget_prob=1.0, random_pool_prob=0.0, rng=rng, budgets=[])
    )


def test_grpo_and_sft_records_carry_what_the_reward_and_trainer_need() -> None:
    pool, tasks = _pool(4), _tasks(2)
    specs = [
        PromptSpec(task=tasks[0], view=(3, 1), budget=0.02),
        PromptSpec(task=tasks[1], view=(0, 1, 2, 3), budget=None),
    ]
    base = RequestLimits(max_steps=3)
    grpo = grpo_records(specs, pool, base, max_question_chars=200)
    assert [set(r) for r in grpo] == [{"prompt", "task_id", "view", "budget", "deadline", "ranking"}] * 2
    assert [r["ranking"] for r in grpo] == [[], []]  # no evidence: no ranking line, no @k to resolve
    assert [r["task_id"] for r in grpo] == ["t/0", "t/1"]
    assert [r["view"] for r in grpo] == [[3, 1], [0, 1, 2, 3]]
    assert [r["budget"] for r in grpo] == [0.02, -1.0]
    first, second = (r["prompt"][0]["content"] for r in grpo)
    assert [r["prompt"][0]["role"] for r in grpo] == ["user", "user"]
    assert "Budget: $0.020" in first and "Budget" not in second
    # the prompt lists the view's ids and nothing beyond them
    assert "1: general" in first and "3: " in second and "yourself" not in first + second
    assert "at most 3 steps" in first and "What is 0 + 0?" in first
    sft = sft_records(specs, pool, base, rng=random.Random(0), max_question_chars=200)
    for spec, rec in zip(specs, sft, strict=True):
        assert rec["completion"][0]["role"] == "assistant"
        wf = parse(rec["completion"][0]["content"], pool_size=len(spec.view), max_steps=3)
        assert all(s.worker < len(spec.view) for s in wf.steps)


def _old_make_specs(tasks: list[Task], pool: Pool, n: int, rng: random.Random) -> list[tuple[Any, ...]]:
    """The spec loop as it was before deadlines (budget_prob 0.5, random_pool_prob 0.5): the
    reference the deadline-free recipe must still reproduce draw for draw."""
    order, out = list(tasks), []
    while len(out) < n:
        rng.shuffle(order)
        for t in order:
            if len(out) >= n:
                break
            view = (
                pool.random_view(rng, min_size=2).indices if rng.random() < 0.5 else tuple(range(len(pool)))
            )
            budget = rng.choice([0.01, 0.02]) if rng.random() < 0.5 else None
            out.append((t.id, view, budget))
    return out


def test_make_specs_without_deadlines_draws_exactly_as_before() -> None:
    pool, tasks = _pool(5), _tasks(7)
    kw: dict[str, Any] = {"budget_prob": 0.5, "budgets": [0.01, 0.02], "random_pool_prob": 0.5}
    rng_old, rng_new = random.Random(3), random.Random(3)
    old = _old_make_specs(tasks, pool, 60, rng_old)
    new = make_specs(tasks, pool, 60, rng=rng_new, deadline_fraction=0.0, deadline_range_s=[5, 60], **kw)
    assert [(s.task.id, s.view, s.budget) for s in new] == old
    assert all(s.deadline is None for s in new)
    assert rng_new.random() == rng_old.random()  # the stream is left where it was, too
    base = RequestLimits(max_steps=3)
    assert all(s.limits(base).max_latency_s is None for s in new)
    assert all(r["deadline"] == -1.0 for r in grpo_records(new, pool, base, max_question_chars=100))


def test_make_specs_draws_deadlines_into_limits_prompts_and_columns() -> None:
    pool, tasks = _pool(4), _tasks(5)
    specs = make_specs(
        tasks,
        pool,
        200,
        rng=random.Random(0),
        budget_prob=0.0,
        budgets=[],
        random_pool_prob=0.0,
        deadline_fraction=0.5,
        deadline_range_s=[5.0, 60.0],
    )
    drawn = [s.deadline for s in specs if s.deadline is not None]
    assert 60 < len(drawn) < 140  # about half
    assert all(5.0 <= d <= 60.0 for d in drawn) and len(set(drawn)) > 20
    base = RequestLimits(max_steps=3)
    grpo = grpo_records(specs, pool, base, max_question_chars=100)
    for s, r in zip(specs, grpo, strict=True):
        assert s.limits(base).max_latency_s == s.deadline
        assert r["deadline"] == (-1.0 if s.deadline is None else s.deadline)
        assert ("Deadline:" in r["prompt"][0]["content"]) == (s.deadline is not None)
    sft = sft_records(specs[:20], pool, base, rng=random.Random(0), max_question_chars=100)
    assert all(
        ("Deadline:" in r["prompt"][0]["content"]) == (s.deadline is not None)
        for s, r in zip(specs, sft, strict=False)
    )


# --------------------------------------------------------------------------- the GRPO reward


def _responder(right: bool) -> Any:
    def answer(messages: list[Message] | Any, context: CallContext | None) -> str:
        assert context is not None
        return f"\\boxed{{{context.task.answer if right else 'wrong'}}}"

    return answer


def _reward_pool() -> Pool:
    """cheap (right), dear (right, 100x the price), wrong (cheap, always wrong)."""
    specs = [("cheap", 1.0, True), ("dear", 100.0, True), ("wrong", 1.0, False)]
    workers = [
        FakeWorker(info=fake_info(n, price_in=p, price_out=p), responder=_responder(ok)) for n, p, ok in specs
    ]
    return Pool(name="reward", workers=list(workers))


def _plan(*workers: int) -> str:
    ids = ", ".join(map(str, workers))
    subs = ", ".join(["'Solve it.'"] * len(workers))
    acc = ", ".join(["[]"] + ['"all"'] * (len(workers) - 1))
    return f"I will route.\nmodel_id = [{ids}]\nsubtasks = [{subs}]\naccess_list = [{acc}]"


def _call(
    reward: ConductorReward, texts: list[str], *, budget: float = -1.0, view: list[int] | None = None
) -> Any:
    """Call the reward exactly as TRL's GRPOTrainer does (conversational prompts/completions)."""
    n = len(texts)
    logged: dict[str, float] = {}
    out = asyncio.run(
        reward(
            prompts=[[{"role": "user", "content": "plan"}]] * n,
            completions=[[{"role": "assistant", "content": t}] for t in texts],
            completion_ids=[[1, 2, 3]] * n,
            task_id=["t/3"] * n,
            view=[view if view is not None else [0, 1, 2]] * n,
            budget=[budget] * n,
            trainer_state=None,
            log_extra=lambda *a, **k: None,
            log_metric=lambda k, v: logged.__setitem__(k, v),
        )
    )
    return out, logged


def _reward(preset: str) -> ConductorReward:
    tasks = {t.id: t for t in _tasks(4)}
    return ConductorReward(_reward_pool(), tasks, REWARD_PRESETS[preset], RequestLimits(max_steps=5))


def test_reward_follows_trls_contract() -> None:
    from trl.trainer.utils import get_callable_name, is_async_callable

    reward = _reward("cost-aware")
    assert is_async_callable(reward)  # TRL awaits it instead of calling it synchronously
    assert get_callable_name(reward) == "conductor_reward"
    texts = [_plan(0), "lorem ipsum", _plan(1), _plan(2), _plan(0, 1)]
    out, logged = _call(reward, texts)
    assert isinstance(out, list) and len(out) == len(texts)
    assert all(isinstance(r, float) for r in out)
    assert out[1] == 0.0  # unparseable
    assert out[0] > out[2] > out[3] > out[1]  # correct cheap > correct dear > wrong cheap > garbage
    assert {"conductor/correct", "conductor/parsed", "conductor/cost", "conductor/steps"} <= set(logged)
    assert logged["conductor/parsed"] == pytest.approx(4 / 5)
    assert logged["conductor/correct"] == pytest.approx(3 / 5)
    assert reward.history[-1]["reward"] == pytest.approx(sum(out) / len(out))
    # a view remaps ids: in view [1, 0], id 0 is "dear"
    remapped, _ = _call(reward, [_plan(0)], view=[1, 0])
    assert remapped[0] == pytest.approx(out[2])


def test_paper_preset_scores_0_half_1() -> None:
    out, _ = _call(_reward("paper"), ["no lists here", _plan(2), _plan(0), _plan(1)])
    assert out == [0.0, 0.5, 1.0, 1.0]


def test_budget_column_stops_an_expensive_plan_and_penalises_it() -> None:
    reward = _reward("cost-aware")
    cfg = reward.config
    free, _ = _call(reward, [_plan(1), _plan(0, 1)])
    # $0.001 cannot pay 64 output tokens of "dear" (100 USD/1M): the step is skipped
    stopped, logged = _call(reward, [_plan(1), _plan(0, 1)], budget=0.001)
    assert logged["conductor/budget_stop"] == 1.0
    assert logged["conductor/cost"] <= 0.001
    # alone, "dear" never runs: no worker call, so no format bonus, and the budget penalty
    assert stopped[0] == pytest.approx(-cfg.budget_penalty)
    assert stopped[0] < free[0]
    # cheap then dear: the cheap answer is kept (correct), still penalised for the stop
    cheap_alone, _ = _call(reward, [_plan(0)])
    assert stopped[1] == pytest.approx(cheap_alone[0] - cfg.budget_penalty)
    # a budget that affords the plan is no penalty
    roomy, logged = _call(reward, [_plan(1)], budget=10.0)
    assert roomy[0] == pytest.approx(free[0]) and logged["conductor/budget_stop"] == 0.0


def test_deadline_column_runs_the_rollout_under_the_deadline_and_penalises_a_cut() -> None:
    """fast: answers within a second; slow: its first token alone takes 30 s (latency model)."""
    right = _responder(True)
    fast = replace(fake_info("fast", price_in=1.0, price_out=1.0), ttft_s=0.1, tokens_per_s=1000.0)
    slow = replace(fake_info("slow", price_in=1.0, price_out=1.0), ttft_s=30.0, tokens_per_s=50.0)
    pool = Pool(
        name="deadline",
        workers=[FakeWorker(info=fast, responder=right), FakeWorker(info=slow, responder=right)],
    )
    cfg = REWARD_PRESETS["cost-aware"]
    reward = ConductorReward(pool, {t.id: t for t in _tasks(4)}, cfg, RequestLimits(max_steps=5))

    def call(texts: list[str], deadline: float | None) -> Any:
        n, logged = len(texts), {}
        out = asyncio.run(
            reward(
                prompts=[[{"role": "user", "content": "plan"}]] * n,
                completions=[[{"role": "assistant", "content": t}] for t in texts],
                task_id=["t/3"] * n,
                view=[[0, 1]] * n,
                budget=[-1.0] * n,
                deadline=[-1.0 if deadline is None else deadline] * n,
                log_metric=lambda k, v: logged.__setitem__(k, v),
            )
        )
        return out, logged

    free, logged = call([_plan(1), _plan(0, 1), _plan(0)], None)
    assert logged["conductor/deadline_stop"] == 0.0 and logged["conductor/correct"] == 1.0
    cut, logged = call([_plan(1), _plan(0, 1), _plan(0)], 5.0)
    assert logged["conductor/deadline_stop"] == pytest.approx(2 / 3)
    # slow alone never starts (no worker call, no format bonus): only the penalty
    assert cut[0] == pytest.approx(-cfg.deadline_penalty)
    # fast then slow: the fast answer stands (correct), the cut is penalised
    assert cut[1] == pytest.approx(free[2] - cfg.deadline_penalty)
    assert cut[2] == pytest.approx(free[2])  # a plan the deadline does not touch is not charged
    # the column is optional (prompts without deadlines, as before)
    out, _ = _call(_reward("cost-aware"), [_plan(0)])
    assert out[0] > 0


def test_completion_text_accepts_both_trl_formats() -> None:
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "xyz"}]) == "xyz"


# --------------------------------------------------------------------------- the micro training run


def test_train_writes_a_servable_final_folder(micro: Micro) -> None:
    final = micro.final_dir
    assert micro.result.final_dir == final
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "conductor.json",
    ):
        assert (final / name).is_file(), name
    assert sorted(p.name for p in (final / "prompts").iterdir()) == [
        "conductor.txt",
        "conductor_review.txt",
        "worker.txt",
    ]
    meta = json.loads((final / "conductor.json").read_text())
    assert meta["pool"] == "paper-sim" and len(meta["pool_workers"]) == 7
    assert meta["max_steps"] == 2 and meta["max_question_chars"] == 120 and meta["max_rounds"] == 1
    assert TrainConfig.from_dict(meta["train_config"]) == micro.config
    assert not (final / "optimizer.pt").exists()  # training state stays in grpo/
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(final)
    text = "model_id = [1]\nsubtasks = ['Solve it.']\naccess_list = [[]]"
    assert tok.decode(tok(text)["input_ids"]) == text


def _weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_sft_and_grpo_steps_change_the_parameters(micro: Micro) -> None:
    import torch

    base, sft, grpo = (_weights(micro.out / d) for d in ("base", "sft", "grpo/last"))
    assert set(sft) == set(grpo)
    assert any(not torch.equal(base[k], sft[k]) for k in base)
    assert _changed(micro.out / "sft", micro.out / "grpo" / "last"), "GRPO left every parameter as SFT had it"
    assert micro.result.global_step == 3


def test_grpo_saw_parseable_and_unparseable_completions(micro: Micro) -> None:
    """The warm start taught the format: some rollouts parse, so rewards differ within groups."""
    curve = micro.result.reward_curve
    assert len(curve) == 3
    assert max(h["conductor/parsed"] for h in curve) > 0
    assert max(h["reward_std"] for h in curve) > 0
    assert curve[-1]["epoch"] == pytest.approx(1.0)  # the prompts were made for exactly these steps


def test_metrics_reach_mlflow_and_metrics_json(micro: Micro) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=micro.tracking_uri)
    run = client.get_run(micro.result.mlflow_run_id)
    metrics = run.data.metrics
    for key in (
        "grpo/reward",
        "grpo/entropy",
        "grpo/conductor/correct",
        "grpo/conductor/parsed",
        "grpo/conductor/cost",
        "grpo/conductor/steps",
        "sft/loss",
        "seconds_total",
        "cpu_seconds_sft",
        "cpu_seconds_total",
    ):
        assert key in metrics, key
    history = client.get_metric_history(run.info.run_id, "grpo/reward")
    assert sorted(m.step for m in history) == [1, 2, 3]
    assert run.data.params["grpo_steps"] == "3"
    saved = json.loads((micro.out / "metrics.json").read_text())
    assert saved["global_step"] == 3
    assert [h["step"] for h in saved["reward_curve"]] == [1.0, 2.0, 3.0]
    assert [h["reward"] for h in saved["reward_curve"]] == [
        m.value for m in sorted(history, key=lambda m: m.step)
    ]
    assert {"bootstrap", "sft", "grpo", "total"} <= set(saved["seconds"])
    # CPU seconds per stage too (wall time on a shared machine says little): SFT and GRPO computed
    assert set(saved["cpu_seconds"]) == set(saved["seconds"])
    assert saved["cpu_seconds"]["sft"] > 0 and saved["cpu_seconds"]["grpo"] > 0
    assert saved["cpu_seconds"]["total"] >= saved["cpu_seconds"]["sft"] + saved["cpu_seconds"]["grpo"]
    assert "metrics.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.fixture
def keep_mlflow_uris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The CLI points MLflow's process-global URIs at the run's store: put them back after."""
    import mlflow

    from rl_conductor.tracking import mlflow_utils

    monkeypatch.setenv(mlflow_utils.HOME_ENV, str(tmp_path / "home"))
    tracking, registry = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    yield
    mlflow_utils.reset()
    mlflow.set_tracking_uri(tracking)
    mlflow.set_registry_uri(registry)


@pytest.mark.usefixtures("keep_mlflow_uris")
def test_resume_continues_the_step_count_without_redoing_sft(micro: Micro, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rl_conductor.cli import app

    out = tmp_path / "run"
    shutil.copytree(micro.out, out)  # copy2 keeps modification times
    sft_weights = out / "sft" / "model.safetensors"
    sft_mtime = sft_weights.stat().st_mtime_ns
    assert sorted(p.name for p in (out / "grpo").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    preset = tmp_path / "micro.yaml"
    preset.write_text(yaml.safe_dump(micro.config.to_dict()))
    result = CliRunner().invoke(
        app, ["train", "--preset", str(preset), "--out", str(out), "--grpo-steps", "5", "--resume"]
    )
    assert result.exit_code == 0, result.output
    assert "(5 GRPO steps)" in result.output
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["global_step"] == 5
    assert "sft" not in saved["seconds"] and "bootstrap" not in saved["seconds"]
    assert sft_weights.stat().st_mtime_ns == sft_mtime
    state = json.loads((out / "grpo" / "checkpoint-5" / "trainer_state.json").read_text())
    assert state["global_step"] == 5
    # the curve holds the first run's 3 logged steps, then steps 4 and 5 only
    assert [h["step"] for h in saved["reward_curve"]] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert _changed(out / "grpo" / "last", micro.out / "grpo" / "last")
    # another recipe in the same folder is refused before anything trains (H22: it finished
    # the old model and recorded the new recipe); only run control (steps, time, logs) may change
    before = sorted(p.name for p in (out / "grpo").glob("checkpoint-*"))
    other = CliRunner().invoke(
        app, ["train", "--preset", str(preset), "--out", str(out), "--cost-weight", "0.3", "--resume"]
    )
    assert other.exit_code == 2, other.output
    assert "another recipe (cost_weight" in other.output and "0.3 now" in other.output
    assert "Traceback" not in other.output
    assert sorted(p.name for p in (out / "grpo").glob("checkpoint-*")) == before
    assert json.loads((out / "recipe.json").read_text())["cost_weight"] == micro.config.cost_weight


def _changed(a: Path, b: Path) -> bool:
    import torch

    wa, wb = _weights(a), _weights(b)
    return any(not torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.usefixtures("keep_mlflow_uris")
def test_lora_training_leaves_a_self_contained_final_folder(micro: Micro, tmp_path: Path) -> None:
    """With LoRA (the gpu preset's mode), final/ must still be a whole model, not an adapter
    that points back at this run's sft/ folder."""
    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.training.train import train
    from rl_conductor.workers.pool import load_pool

    out = tmp_path / "lora"
    shutil.copytree(micro.out / "sft", out / "sft")  # warm start done: resume goes straight to GRPO
    cfg = micro_config(
        micro.tracking_uri, model=str(out / "sft"), use_lora=True, lora_r=4, lora_alpha=8, grpo_steps=1
    )
    result = train(cfg, out, resume=True, progress=False)
    assert "sft" not in result.seconds and result.global_step == 1
    final = result.final_dir
    assert (final / "config.json").is_file() and (final / "model.safetensors").is_file()
    assert not (final / "adapter_config.json").exists()
    assert set(_weights(final)) == set(_weights(micro.out / "sft"))  # merged: no lora_A/lora_B tensors
    shutil.rmtree(out / "sft")  # nothing may depend on it any more
    policy = ConductorPolicy(final, retries=0)
    task = Task(id="q", question="What is 1 + 1?", answer="2", domain="math", source="t", grader="math")
    plan = asyncio.run(policy.plan(task, load_pool("paper-sim").view(), RequestLimits(max_steps=2)))
    assert plan.workflow.steps
