"""Bring-your-own recordings: the file format, RouteLLM as one instance of it, the cache's export
into it, and a three-model recordings pool that trains and evaluates end to end."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_conductor.cli import app
from rl_conductor.evaluation.suite import run_eval
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.catalog import make_policy
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks, split_of
from rl_conductor.tasks.graders import grade
from rl_conductor.tasks.recordings_format import (
    RecordedResponse,
    RecordingsError,
    dataset_name,
    item_dict,
    load_recordings,
    write_recordings,
)
from rl_conductor.tasks.routellm import RECORDED_MODELS, recording
from rl_conductor.workers.base import CallContext
from rl_conductor.workers.live.testing import Reply, Request, ok, scripted_server
from rl_conductor.workers.pool import PoolConfigError, build_pool, load_pool
from rl_conductor.workers.replay import ReplayWorker

ROUTELLM_MODELS = ("gpt-4-1106-preview", "mixtral-8x7b-instruct")


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _item(i: int, **responses: Any) -> dict[str, Any]:
    return {"id": f"x/{i}", "question": f"What is {i} + 1?", "answer": str(i + 1), "grader": "math",
            "domain": "math", "responses": responses}  # fmt: skip


def test_format_errors_name_the_file_and_line(tmp_path: Path) -> None:
    good = _item(1, a={"text": "#### 2"})
    cases = {
        "not JSON": "{nope",
        "`question` is required": {**good, "question": ""},
        "unknown grader": {**good, "grader": "vibes"},
        "needs `text`, `correct`, or both": _item(1, a={}),
        "unknown response fields": _item(1, a={"text": "2", "tokens": 3}),
        "'splt' (did you mean 'split'?)": {**good, "splt": "test"},
        "'gold_answer' (did you mean 'answer'?)": {**good, "gold_answer": "2"},
        "'latency' (did you mean 'latency_s'?)": _item(1, a={"text": "2", "latency": 3}),
        "output_tokens must be an integer": _item(1, a={"text": "2", "output_tokens": -1}),
        "every response needs `correct`": {**_item(1, a={"text": "2"}), "answer": None},
        "at least one": _item(1),
        "`metadata.choices` must be a list of option texts": {**good, "metadata": {"choices": "A) 4 B) 5"}},
    }
    for message, row in cases.items():
        path = tmp_path / f"{abs(hash(message))}.jsonl"
        path.write_text((row if isinstance(row, str) else json.dumps(row)) + "\n", encoding="utf-8")
        with pytest.raises(RecordingsError, match=re.escape(message)) as info:
            load_recordings(path)
        assert f"{path}:1" in str(info.value)
    dup = _write(tmp_path / "dup.jsonl", [good, good])
    with pytest.raises(RecordingsError, match="duplicate item id"):
        load_recordings(dup)
    with pytest.raises(PoolConfigError, match="does not exist"):
        build_pool({"recordings": str(tmp_path / "none.jsonl"), "workers": [{"name": "a", "kind": "replay"}]})
    # misspelt pool fields: `recording` fell back to RouteLLM's file, `price_input` was a price of 0
    with pytest.raises(PoolConfigError, match="unknown field 'recording'; did you mean `recordings`"):
        build_pool({"recording": str(tmp_path / "x.jsonl"), "workers": [{"name": "a", "kind": "replay"}]})
    with pytest.raises(PoolConfigError, match=r"unknown price field\(s\) \['price_input'\]"):
        build_pool({"workers": [{"name": "gpt-4-1106-preview", "kind": "replay", "price_input": 1.0}]})
    with pytest.raises(PoolConfigError, match=r"unknown price field\(s\) \['Input_Price'\]"):
        build_pool({"workers": [{"name": "gpt-4-1106-preview", "kind": "replay", "Input_Price": 1.0}]})
    path = _write(tmp_path / "ok.jsonl", [good])
    with pytest.raises(PoolConfigError, match="no recordings of model 'b'"):
        build_pool({"recordings": str(path), "workers": [{"name": "b", "kind": "replay"}]})


async def test_label_only_text_only_and_recorded_usage(tmp_path: Path) -> None:
    rows = [
        _item(1, a={"text": "I think 2.\n#### 2", "correct": True, "input_tokens": 40, "output_tokens": 9,
                    "cost_usd": 0.0005, "latency_s": 2.5},
              b={"correct": True}, c={"text": "It is 7."}),
        _item(2, a={"text": "#### 3", "correct": False}, b={"correct": False}, c={"text": "#### 3"}),
    ]  # fmt: skip
    path = _write(tmp_path / "r.jsonl", rows)
    pool = build_pool({"recordings": str(path), "workers": [
        {"name": n, "kind": "replay", "price_in": 1.0, "price_out": 2.0} for n in "abc"]})  # fmt: skip
    assert pool.options["default_dataset"] == dataset_name(path)
    tasks = load_tasks(dataset_name(path))
    assert [t.id for t in tasks] == ["x/1", "x/2"]
    msgs = [{"role": "user", "content": "solve"}]
    got = {}
    for w in pool.workers:
        for t in tasks:
            got[w.info.name, t.id] = await w.complete(
                msgs, max_tokens=512, temperature=0, context=CallContext(t)
            )
    a1 = got["a", "x/1"]
    assert (a1.text, a1.input_tokens, a1.output_tokens, a1.cost_usd, a1.latency_s) == (
        "I think 2.\n#### 2", 40, 9, 0.0005, 2.5)  # fmt: skip
    assert grade(tasks[1], got["a", "x/2"].text) is False  # recorded wrong: a wrong-answer line appended
    assert grade(tasks[0], got["b", "x/1"].text) and not grade(tasks[1], got["b", "x/2"].text)  # synthesised
    assert got["c", "x/1"].text == "It is 7." and grade(tasks[1], got["c", "x/2"].text)  # text only: as is
    assert got["c", "x/1"].cost_usd == pytest.approx(
        pool.workers[2].info.cost(got["c", "x/1"].input_tokens, got["c", "x/1"].output_tokens)
    )


async def test_a_review_never_reads_a_label_only_answer(tmp_path: Path) -> None:
    """A label-only response replays as a stand-in made from its label (the gold when right, a line
    with no answer when wrong), so two stand-ins "agree" exactly when both are right: a review or a
    cascade that compared them would read the labels. The trace marks such steps ``synthesised``,
    the review sees no answer of theirs, and the cascade's fit extracts none."""
    from rl_conductor.policies.cascade import measure_samples

    rows = [
        _item(1, a={"correct": True}, b={"correct": True}, c={"correct": False}),
        _item(2, a={"text": "so #### 3", "correct": True}, b={"text": "#### 3"}, c={"correct": False}),
    ]
    path = _write(tmp_path / "r.jsonl", rows)
    pool = build_pool({"recordings": str(path), "workers": [
        {"name": n, "kind": "replay", "price_in": 1.0, "price_out": 2.0} for n in "abc"]})  # fmt: skip
    view = pool.view()
    tasks = load_tasks(dataset_name(path))
    cascade = make_policy("cascade:a,b>c", pool)
    labels = await cascade.run(tasks[0], view, RequestLimits(max_rounds=2))
    assert [(s.worker, s.synthesised) for s in labels.trace.steps] == [("a", True), ("b", True), ("c", True)]
    assert labels.trace.steps[0].answer == labels.trace.steps[1].answer  # the stand-ins would agree
    texts = await cascade.run(tasks[1], view, RequestLimits(max_rounds=2))
    assert [(s.worker, s.synthesised) for s in texts.trace.steps] == [("a", False), ("b", False)]  # kept
    assert texts.trace.to_dict()["steps"][0]["synthesised"] is False
    keys = (await measure_samples(pool, tasks)).keys
    assert keys[0] == [[None] * 3] * 3
    assert keys[1][0][0] == keys[1][1][0] is not None and keys[1][2] == [None] * 3


async def test_a_review_never_reads_a_final_answer_line_made_from_a_label(tmp_path: Path) -> None:
    """A recorded text that grades against its label gets a final-answer line made from the label
    (the gold when labelled right): two such texts would "agree" on the gold whatever the models
    wrote (here 7 and 9), so they count as made from the label too, and a stored completion keeps
    that mark (a cache hit is no model's text either, and no export writes it as one)."""
    from rl_conductor.policies.cascade import measure_samples
    from rl_conductor.workers.cache import CachedWorker, SqliteCacheStore
    from rl_conductor.workers.cache_export import export_cache

    rows = [
        {
            **_item(
                2,
                a={"text": "I think it is 7. #### 7", "correct": True},
                b={"text": "Surely 9. #### 9", "correct": True},
                c={"text": "#### 3", "correct": False},
            )
        }
    ]
    path = _write(tmp_path / "r.jsonl", rows)  # fmt: skip
    pool = build_pool({"recordings": str(path), "workers": [
        {"name": n, "kind": "replay", "price_in": 1.0, "price_out": 2.0} for n in "abc"]})  # fmt: skip
    task = load_tasks(dataset_name(path))[0]
    ep = await make_policy("cascade:a,b>c", pool).run(task, pool.view(), RequestLimits(max_rounds=2))
    assert [(s.worker, s.synthesised) for s in ep.trace.steps] == [("a", True), ("b", True), ("c", True)]
    assert (await measure_samples(pool, [task])).keys == [[[None] * 3] * 3]
    store = SqliteCacheStore(tmp_path / "cache.sqlite")
    cached = CachedWorker(inner=pool.get("a"), store=store)
    msgs = [{"role": "user", "content": task.question}]
    for _ in range(2):  # a miss, then a hit
        comp = await cached.complete(msgs, max_tokens=256, temperature=0.0, context=CallContext(task))
        assert comp.synthesised
    assert cached.hits == 1
    assert export_cache(store, tmp_path / "out.jsonl")["items"] == 0


def routellm_recordings(dataset: str = "routellm") -> Iterator[dict[str, Any]]:
    """RouteLLM's recordings as items of the bring-your-own recordings format
    (:mod:`rl_conductor.tasks.recordings_format`; GSM8K: text and label; MMLU: label only)."""
    for task in load_tasks(dataset):
        responses = {}
        for model in RECORDED_MODELS:
            rec = recording(task.id, model)
            if rec is not None:
                responses[model] = RecordedResponse(text=rec.text, correct=rec.correct)
        if responses:
            yield item_dict(task, responses)


async def test_routellm_recordings_are_one_instance_of_the_format(tmp_path: Path) -> None:
    path = tmp_path / "routellm.jsonl.gz"
    assert write_recordings(path, routellm_recordings()) == len(load_tasks("routellm"))
    builtin = load_pool("routellm-replay")
    spec = yaml.safe_load(Path(builtin_pool_file()).read_text())
    from_file = build_pool({**spec, "recordings": str(path)})
    assert {t.id for t in load_tasks(from_file.options["default_dataset"])} == {
        t.id for t in load_tasks("routellm")
    }
    tasks = load_tasks("routellm", limit=600, seed=3)
    msgs = [{"role": "user", "content": "Answer this."}]
    for name in ROUTELLM_MODELS:
        a, b = builtin.get(name), from_file.get(name)
        assert isinstance(b, ReplayWorker) and b.source is not a.source
        for t in tasks:
            ca = await a.complete(msgs, max_tokens=4096, temperature=0.2, context=CallContext(t))
            cb = await b.complete(msgs, max_tokens=4096, temperature=0.2, context=CallContext(t))
            assert ca == cb, t.id  # same text, tokens, cost, latency: the same replay


def builtin_pool_file() -> str:
    from rl_conductor.workers.pool import builtin_pool_dir

    return str(builtin_pool_dir() / "routellm-replay.yaml")


# ------------------------------------------------------------------------------ cache -> export -> replay


def _answering_server(tasks: list[Task]) -> Any:
    """Answers each question right or wrong by a hash of its id, like a model of middling skill."""

    def reply(req: Request) -> Reply:
        content = json.dumps(req.body)
        for t in tasks:
            if json.dumps(t.question)[1:-1] in content:
                right = hashlib.sha256(t.id.encode()).digest()[0] % 2 == 0
                text = f"Let me think.\n#### {t.answer if right else t.answer + '1'}"
                return ok("openai", text, input_tokens=len(content) // 4, output_tokens=12)
        return ok("openai", "I do not know this question.", input_tokens=5, output_tokens=7)

    return reply


def test_second_eval_makes_no_http_call_and_the_export_replays_it(tmp_path: Path) -> None:
    tasks = load_tasks("gsm8k", "test", limit=12, seed=1)
    cache = tmp_path / "cache.sqlite"
    with scripted_server("openai", default=_answering_server(tasks)) as srv:
        pool_yaml = tmp_path / "live.yaml"
        pool_yaml.write_text(yaml.safe_dump({
            "name": "live", "default_dataset": "gsm8k", "cache": str(cache),
            "workers": [{"name": "remote", "kind": "openai", "model": "m", "base_url": srv.base_url,
                         "price_in": 1.0, "price_out": 4.0, "hosting": "external"}],
        }))  # fmt: skip
        kw: dict[str, Any] = dict(pool=str(pool_yaml), dataset="gsm8k", split="test", limit=12, seed=1,
                                  progress=False)  # fmt: skip
        first = run_eval(["single:remote"], **kw)[0]
        calls = len(srv.requests)
        second = run_eval(["single:remote"], **kw)[0]
        assert calls == 12 and len(srv.requests) == calls  # the second run made no HTTP call
        assert {k: first[k] for k in ("accuracy", "mean_cost_usd", "mean_tokens")} == {
            k: second[k] for k in ("accuracy", "mean_cost_usd", "mean_tokens")
        }
        assert 0 < first["accuracy"] < 1
        live_pool = load_pool(pool_yaml)
        live = _answers(live_pool, tasks)
        assert len(srv.requests) == calls

    from typer.testing import CliRunner

    out, replay_yaml = tmp_path / "recorded.jsonl", tmp_path / "replay.yaml"
    res = CliRunner().invoke(
        app, ["record", "export", "--cache", str(cache), "--out", str(out), "--pool-out", str(replay_yaml)]
    )
    assert res.exit_code == 0, res.output
    assert "12 items, 12 responses of 1 workers (remote)" in " ".join(res.output.split())
    replay_pool = load_pool(replay_yaml)
    assert replay_pool.get("remote").info.price_out == 4.0
    replayed = _answers(replay_pool, tasks)
    for t in tasks:
        assert replayed[t.id][0] == live[t.id][0]  # the recorded answer
        assert replayed[t.id][1] == live[t.id][1] == grade(t, live[t.id][0])  # and its grade
        assert replayed[t.id][2] == pytest.approx(live[t.id][2])  # and its cost
    rec = load_recordings(out)
    assert all(rec.get(t.id, "remote").correct == grade(t, live[t.id][0]) for t in tasks)


def _answers(pool: Any, tasks: list[Task]) -> dict[str, tuple[str, bool, float]]:
    import asyncio

    policy = make_policy("single:remote", pool, seed=1, dataset="gsm8k")
    episodes = asyncio.run(policy.run_many(tasks, pool.view(), RequestLimits()))
    return {t.id: (e.trace.final_answer, grade(t, e.trace.final_answer), e.trace.cost_usd)
            for t, e in zip(tasks, episodes, strict=True)}  # fmt: skip


# ------------------------------------------------------------------------------ three models train end to end


def _three_model_file(path: Path) -> tuple[Path, dict[str, float]]:
    """Recordings of three made-up models over 120 GSM8K items: text+label, label only, text only."""
    tasks = load_tasks("gsm8k", limit=120, seed=7)
    rows = []
    for t in tasks:
        h = hashlib.sha256(t.id.encode()).digest()
        strong, medium, weak = h[0] % 10 < 8, h[1] % 10 < 5, h[2] % 10 < 2
        rows.append({
            "id": t.id, "question": t.question, "answer": t.answer, "grader": t.grader, "domain": t.domain,
            "responses": {
                "strong": {"text": f"Working.\n#### {t.answer if strong else '-1'}", "correct": strong,
                           "output_tokens": 300, "cost_usd": 0.003},
                "medium": {"correct": medium},
                "weak": {"text": f"#### {t.answer if weak else '0.5'}"},
            },
        })  # fmt: skip
    _write(path, rows)
    test = [r for r in rows if split_of(r["id"]) == "test"]
    acc = {
        "strong": sum(r["responses"]["strong"]["correct"] for r in test) / len(test),
        "medium": sum(r["responses"]["medium"]["correct"] for r in test) / len(test),
    }
    return path, acc


@pytest.mark.slow
def test_three_model_recordings_train_and_evaluate_end_to_end(tmp_path: Path) -> None:
    rec, acc = _three_model_file(tmp_path / "three.jsonl")
    pool = tmp_path / "three.yaml"
    pool.write_text(yaml.safe_dump({"name": "three", "recordings": str(rec), "workers": [
        {"name": "strong", "kind": "replay", "price_in": 2.0, "price_out": 8.0, "hosting": "external",
         "description": "strong and expensive"},
        {"name": "medium", "kind": "replay", "price_in": 0.3, "price_out": 0.6, "hosting": "self",
         "description": "middling"},
        {"name": "weak", "kind": "replay", "price_in": 0.1, "price_out": 0.1, "hosting": "self",
         "description": "cheap and weak"},
    ]}))  # fmt: skip
    preset = tmp_path / "micro.yaml"
    preset.write_text(yaml.safe_dump({
        "model": "tiny", "tiny_hidden_size": 64, "tiny_layers": 2, "tiny_intermediate_size": 128,
        "tiny_vocab_size": 1024, "max_question_chars": 120, "max_steps_per_workflow": 2,
        "sft_examples": 64, "sft_epochs": 1.0, "sft_learning_rate": 0.01, "sft_batch_size": 16,
        "grpo_steps": 2, "prompts_per_step": 2, "num_generations": 4, "temperature": 0.7,
        "max_completion_length": 48, "save_steps": 2, "logging_steps": 1, "torch_threads": 1,
        "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }))  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CONDUCTOR_HOME": str(tmp_path)}
    cli = [sys.executable, "-m", "rl_conductor.cli"]
    out = tmp_path / "out"
    train = subprocess.run([*cli, "train", "--out", str(out), "--preset", str(preset), "--pool", str(pool),
                            "--cost-weight", "0.2"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert (out / "final" / "config.json").is_file()
    meta = json.loads((out / "final" / "conductor.json").read_text())  # what it was trained on and for
    assert (meta["pool"], meta["dataset"]) == (str(pool), dataset_name(rec))
    assert meta["reward"]["cost_weight"] == 0.2
    assert "SFT warm start" in train.stderr or "SFT warm start" in train.stdout  # progress lines, no terminal
    summary = tmp_path / "eval.json"
    # no --pool: the Conductor's own pool, dataset and reward
    ev = subprocess.run([*cli, "eval", "--policy", f"conductor:{out / 'final'}",
                         "--policy", "single:strong", "--policy", "single:medium", "--json", str(summary)],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
    results = {r["policy"]: r for r in json.loads(summary.read_text())["results"]}
    assert all(r["reward"]["cost_weight"] == 0.2 and r["pool"] == "three" for r in results.values())
    plan = subprocess.run([*cli, "plan", str(out / "final"), "What is 2 + 2?"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    named = re.findall(r"^step \d+: (\S+) sees", plan.stdout, flags=re.M)
    assert named and set(named) <= {"strong", "medium", "weak"}  # the pool it was trained for
    conductor = next(r for name, r in results.items() if name.startswith("conductor"))
    assert conductor["n"] == results["single:strong"]["n"] > 10
    assert 0 <= conductor["accuracy"] <= 1 and conductor["parse_rate"] >= 0
    # the recorded labels replay exactly on the test split
    assert results["single:strong"]["accuracy"] == pytest.approx(acc["strong"])
    assert results["single:medium"]["accuracy"] == pytest.approx(acc["medium"])


# ------------------------------------------------------------------------------ files a user can bring


def _byo_pool(tmp_path: Path, rows: list[dict[str, Any]], models: str = "ab") -> Path:
    rec = _write(tmp_path / "byo.jsonl", rows)
    pool = tmp_path / "byo.yaml"
    pool.write_text(yaml.safe_dump({"name": "byo", "recordings": str(rec), "workers": [
        {"name": m, "kind": "replay", "price_in": 1.0, "price_out": 1.0} for m in models]}))  # fmt: skip
    return pool


def test_labels_without_gold_replay_as_recorded(tmp_path: Path) -> None:
    """Labels but no gold answer (a support log graded by people): every policy's accuracy is the
    recorded one, not 0 % ("could not make task ... grade as recorded" inside every trace)."""
    rows = [{"id": f"s/{i}", "question": f"Ticket {i}: how do I reset my router?", "grader": g,
             "domain": "reasoning", "split": "test",
             "responses": {"a": {"text": f"Hold the button for {i} seconds.", "correct": i % 2 == 0},
                           "b": {"correct": i % 3 == 0}}}
            for i, g in enumerate(["qa", "math", "choice"] * 4)]  # fmt: skip
    pool = _byo_pool(tmp_path, rows)
    tasks = load_tasks(load_pool(str(pool)).options["default_dataset"], "test")
    assert len(tasks) == 12 and {t.grader for t in tasks} == {"recorded"}
    runs = {s["policy"]: s for s in run_eval(["single:a", "single:b"], pool=str(pool), dataset=None,
                                              split="test", limit=None, seed=0, progress=False)}  # fmt: skip
    assert runs["single:a"]["accuracy"] == pytest.approx(6 / 12)
    assert runs["single:b"]["accuracy"] == pytest.approx(4 / 12)
    assert runs["single:a"]["failed_call_rate"] == runs["single:b"]["failed_call_rate"] == 0.0
    # a label-only answer is an opaque stand-in: it does not tell a reader (a reviewing Conductor) the label
    worker = load_pool(str(pool)).get("b")
    for t in tasks:
        text = asyncio.run(worker.complete([], max_tokens=64, temperature=0, context=CallContext(t))).text
        assert "correct" not in text.lower() and "wrong" not in text.lower()
        assert grade(t, text) is (int(t.id.split("/")[1]) % 3 == 0)
    assert not grade(tasks[0], "Hold the button for 0 seconds, then unplug it.")  # not what was recorded


def test_code_items_without_tests_replay_as_recorded_or_fail_at_load(tmp_path: Path) -> None:
    rows = [{"id": f"c/{i}", "question": f"Write f{i}.", "grader": "code", "domain": "code", "split": "test",
             "responses": {"a": {"text": f"```python\ndef f{i}():\n    return {i}\n```", "correct": i < 3},
                           "b": {"correct": False}}}
            for i in range(5)]  # fmt: skip
    pool = _byo_pool(tmp_path, rows)
    runs = run_eval(["single:a", "single:b"], pool=str(pool), dataset=None, split="test", limit=None, seed=0,
                    progress=False)  # fmt: skip
    assert [s["accuracy"] for s in runs] == [pytest.approx(3 / 5), 0.0]
    assert all(s["failed_call_rate"] == 0.0 for s in runs)  # graded, not failed: no sandbox, no tests needed
    rows[0]["responses"]["b"] = {"text": "def f0(): return 0"}  # no label, and no tests to grade it by
    bad = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(RecordingsError) as info:
        load_recordings(bad)
    message = str(info.value)
    assert "\n" not in message and f"{bad}:1" in message
    assert "without `metadata.tests`" in message and "add its tests (`metadata.tests`)" in message
    assert "'b'" in message


def test_a_split_field_decides_every_split_consumer(tmp_path: Path) -> None:
    from rl_conductor.pipeline.steps import read_tasks, register_prepared, write_tasks
    from rl_conductor.policies.routers import training_tasks

    rows = [{**_item(i, a={"text": f"#### {i + 1}", "correct": True}), "split": s}
            for i, s in enumerate(["train"] * 6 + ["validation"] * 2 + ["test"] * 4)]  # fmt: skip
    pool = _byo_pool(tmp_path, rows, models="a")
    name = load_pool(str(pool)).options["default_dataset"]
    want = {s: [r["id"] for r in rows if r["split"] == s] for s in ("train", "validation", "test")}
    for split, ids in want.items():
        assert [t.id for t in load_tasks(name, split)] == ids
    assert any(split_of(r["id"]) != r["split"] for r in rows)  # the id hash alone would split otherwise
    assert [t.id for t in training_tasks(load_pool(str(pool)), {"dataset": name}, None)] == want["train"]
    runs = run_eval(
        ["single:a"], pool=str(pool), dataset=None, split="test", limit=None, seed=0, progress=False
    )
    assert runs[0]["n"] == 4
    # the pipeline's prepared files keep it: a prepared train file loads whole as "train"
    write_tasks(tmp_path / "train.jsonl", load_tasks(name, "train"))
    prepared = register_prepared([tmp_path / "train.jsonl"])
    assert [t.id for t in load_tasks(prepared, "train")] == want["train"]
    assert [t.id for t in read_tasks(tmp_path / "train.jsonl")] == want["train"]
    rows[0]["split"] = "dev"
    with pytest.raises(RecordingsError, match=r"split must be one of train, validation, test, got 'dev'"):
        load_recordings(_write(tmp_path / "bad.jsonl", rows))


def test_a_file_of_train_and_test_items_gets_a_validation_split_carved_from_train(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file whose items say only train or test (issue 21's file was 70/30): an eighth of its
    training items, by a salted hash of the id, are its validation split, in every command
    (never also training items, never test items), with one warning; written back, each item
    says what the file said. A file that names validation items is as written."""
    import logging

    from rl_conductor.tasks.recordings_format import item_dict
    from rl_conductor.tasks.registry import CARVED_VALIDATION

    rows = [{**_item(i, a={"text": f"#### {i + 1}", "correct": True}),
             "split": "test" if i % 10 >= 7 else "train"} for i in range(400)]  # fmt: skip
    pool = _byo_pool(tmp_path, rows, models="a")
    name = load_pool(str(pool)).options["default_dataset"]
    with caplog.at_level(logging.WARNING, logger="rl_conductor.tasks.registry"):
        train, val, test = (load_tasks(name, s) for s in ("train", "validation", "test"))
        load_tasks(name, "all")
    stated = {r["id"]: r["split"] for r in rows}
    assert [t.id for t in test] == [i for i, s in stated.items() if s == "test"]  # untouched
    assert {t.id for t in train} | {t.id for t in val} == {i for i, s in stated.items() if s == "train"}
    assert not {t.id for t in train} & {t.id for t in val}
    assert abs(len(val) / 280 - CARVED_VALIDATION) < 0.06  # about an eighth of the 280
    said = [r.getMessage() for r in caplog.records if "names no validation item" in r.getMessage()]
    assert len(said) == 1 and f"{len(val)} of its 280 training items" in said[0]
    assert load_tasks(name, "validation") == val  # the same items in every call
    assert {item_dict(t, {})["split"] for t in val} == {"train"}  # what the file said
    # two unlabelled items (one hashes into validation) do not undo the carve: the file's own
    # fields name no validation item (a validation split of one question had been left)
    extra = [_item(1000 + i, a={"text": "#### 1", "correct": True}) for i in range(40)]
    assert any(split_of(r["id"]) == "validation" for r in extra)
    (tmp_path / "mixed").mkdir()
    mixed = load_pool(str(_byo_pool(tmp_path / "mixed", rows + extra, models="a"))).options["default_dataset"]
    assert len(load_tasks(mixed, "validation")) > len(val)
    # the loader's metadata keys are refused in a file (metadata.split had silently been the split)
    for taken in ("split", "rl_conductor.carved_from"):
        bad = [{**rows[0], "metadata": {taken: "test"}}]
        with pytest.raises(RecordingsError, match="are the loader's"):
            load_recordings(_write(tmp_path / f"taken-{taken}.jsonl", bad))
    with pytest.raises(RecordingsError, match="`domain`, when given, must be a non-empty string"):
        load_recordings(_write(tmp_path / "empty-domain.jsonl", [{**rows[0], "domain": " "}]))
    # a file that names its validation items keeps them, and carves nothing
    rows[0]["split"] = "validation"
    (tmp_path / "named").mkdir()
    named = _byo_pool(tmp_path / "named", rows, models="a")
    name = load_pool(str(named)).options["default_dataset"]
    assert [t.id for t in load_tasks(name, "validation")] == [rows[0]["id"]]


def test_a_file_that_states_only_its_test_items_keeps_the_hashs_validation_split(tmp_path: Path) -> None:
    """Items of one source say ``test``, the rest say nothing (H39): the hash already puts a tenth
    of the unlabelled items in validation. Carving an eighth of training on top had made
    validation 52 % the size of training, and the warning named only the carved part."""
    from rl_conductor.tasks.registry import ENOUGH_HASHED_VALIDATION

    rows = [{**_item(i, a={"text": f"#### {i + 1}", "correct": True}),
             **({"split": "test"} if i < 300 else {})} for i in range(1300)]  # fmt: skip
    hashed = sum(split_of(r["id"]) == "validation" for r in rows[300:])
    assert hashed >= ENOUGH_HASHED_VALIDATION
    pool = _byo_pool(tmp_path, rows, models="a")
    name = load_pool(str(pool)).options["default_dataset"]
    val, train = load_tasks(name, "validation"), load_tasks(name, "train")
    assert len(val) == hashed  # as the hash put them, nothing carved
    assert len(train) == sum(split_of(r["id"]) == "train" for r in rows[300:])


def test_eval_exits_non_zero_when_every_call_of_a_policy_failed(tmp_path: Path) -> None:
    """A replay pool asked about items it has no recordings of: every call fails inside the traces.
    That is exit 1 with the reason, not 0 % with exit 0; the share of failed calls is reported."""
    from typer.testing import CliRunner

    out = tmp_path / "eval.json"
    args = ["eval", "--pool", "gsm8k-six", "--dataset", "mmlu_stem", "--limit", "3",
            "--policy", "single:gpt3-6b-finetuned", "--json", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1, res.output
    assert "every worker call failed on all 3 questions" in res.output
    assert "no recording of task 'mmlu_stem/" in res.output
    assert json.loads(out.read_text())["failed_call_rate"] == 1.0  # the summary is still written
    ok = CliRunner().invoke(app, ["eval", "--pool", "gsm8k-six", "--limit", "3",
                                  "--policy", "single:gpt3-6b-finetuned", "--json", str(out)])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert json.loads(out.read_text())["failed_call_rate"] == 0.0
    assert "failed calls %" in ok.output


def test_a_preset_never_overrides_the_pools_dataset(tmp_path: Path) -> None:
    from rl_conductor.training.config import load_preset

    pool = _byo_pool(tmp_path, [_item(1, a={"text": "#### 2"})], models="a")
    assert load_preset("routellm").dataset == "routellm"
    cfg = load_preset("routellm", pool=str(pool))
    assert cfg.pool == str(pool) and cfg.dataset is None  # train() takes the pool's default dataset
    assert load_preset("routellm", pool=str(pool), dataset="gsm8k").dataset == "gsm8k"
    assert load_preset("routellm", pool="routellm-replay").dataset == "routellm"  # its own pool: kept


def test_train_help_lists_every_preset() -> None:
    from typer.testing import CliRunner

    from rl_conductor.cli.train import preset_names
    from rl_conductor.training.config import available_presets

    assert preset_names() == available_presets() and "routellm" in preset_names()
    res = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    assert " | ".join(available_presets()) in res.output


def test_progress_lines_when_output_is_not_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = _byo_pool(tmp_path, [_item(i, a={"text": f"#### {i + 1}"}) for i in range(40)], models="a")
    run_eval(["single:a"], pool=str(pool), dataset=None, split="all", limit=None, seed=0, concurrency=8)
    err = capsys.readouterr().err
    assert "eval single:a: 40/40 (100 %)," in err  # a plain line, not a bar drawn for nobody
    # and the warm start's tables, the first minutes of a training run (they showed nothing)
    from rl_conductor.training.adaptive import build_rounds_table
    from rl_conductor.training.candidates import build_table

    cost = {"a": 0.003, "b": 0.0003, "c": 0.0003}  # a the dearest: b and c a pair (a review) below it
    text = {"a": "#### {}", "b": "#### 0", "c": "#### {}"}
    rows = [_item(i, **{w: {"text": text[w].format(i + 1 if w == "a" or i % 2 else 0), "cost_usd": cost[w]}
                        for w in cost}) for i in range(40)]  # fmt: skip
    two = _byo_pool(tmp_path, rows, models="abc")
    p2 = load_pool(str(two))
    tasks = load_tasks(p2.default_dataset(), split="all")
    table = build_table(tasks, p2, top_k=1, cheap_k=1, progress=True, workers=1)
    rounds = build_rounds_table(tasks, p2, table, top_k=1, pair_k=2, progress=True)
    from rl_conductor.limits import RequestLimits
    from rl_conductor.training.review_text import review_rows

    review_rows(tasks, p2, rounds, RequestLimits(), progress=True)
    err = capsys.readouterr().err
    assert "candidate table, every worker alone: 120/120 (100 %)," in err
    assert re.search(r"rounds table: (\d+)/\1 \(100 %\),", err)
    assert re.search(r"review rows: (\d+)/\1 \(100 %\),", err)
    build_table(tasks, p2, top_k=1, cheap_k=1, workers=1)  # without progress: silent
    assert "candidate table" not in capsys.readouterr().err


def _choice_item(i: int, gold: Any, **responses: Any) -> dict[str, Any]:
    return {"id": f"q/{i}", "question": f"Which colour is {i}?", "answer": gold, "grader": "choice",
            "domain": "knowledge", "split": "test", "metadata": {"choices": ["red", "green", "blue", "pink"]},
            "responses": responses}  # fmt: skip


def test_a_choice_gold_is_an_option_letter_or_fails_at_load(tmp_path: Path) -> None:
    """Golds written as "(C)", "c", "C." or the option's text are the letter C; a label-only
    "right" then grades right. A gold that names no option ("E" of four, "2") would grade every
    answer wrong: a one-line error naming the line instead."""
    golds = ["C", "c", "(C)", "C.", "blue"]
    rows = [_choice_item(i, g, a={"correct": True}, b={"text": "The answer is C.", "correct": True})
            for i, g in enumerate(golds)]  # fmt: skip
    pool = _byo_pool(tmp_path, rows)
    assert {t.answer for t in load_tasks(load_pool(str(pool)).options["default_dataset"], "test")} == {"C"}
    runs = run_eval(["single:a", "single:b"], pool=str(pool), dataset=None, split="test", limit=None, seed=0,
                    progress=False)  # fmt: skip
    assert [s["accuracy"] for s in runs] == [1.0, 1.0]
    assert all(s["failed_call_rate"] == 0.0 for s in runs)
    for bad in ("E", "2", "blue-ish"):
        path = _write(tmp_path / "bad.jsonl", [rows[0], _choice_item(9, bad, a={"correct": True})])
        with pytest.raises(RecordingsError) as info:
            load_recordings(path)
        assert f"{path}:2" in str(info.value) and "option letter (A-D for its 4 choices)" in str(info.value)


def test_code_with_tests_but_no_solution_replays_label_only_answers_as_recorded(tmp_path: Path) -> None:
    """Tests but no reference solution: no text passing them can be made for a label-only
    "right", so the item's labels are its grades (before: every such call failed and another
    worker answered in its place)."""
    tests = ["assert f() == 1"]
    wrong_f = "def f():\n    return 2\n"
    rows = [{"id": f"c/{i}", "question": f"Write f returning 1 ({i}).", "grader": "code", "domain": "code",
             "split": "test", "metadata": {"tests": tests},
             "responses": {"a": {"correct": True}, "b": {"text": wrong_f, "correct": False}}}
            for i in range(3)]  # fmt: skip
    pool = _byo_pool(tmp_path, rows)
    tasks = load_tasks(load_pool(str(pool)).options["default_dataset"], "test")
    assert {t.grader for t in tasks} == {"recorded"}
    runs = run_eval(["single:a", "single:b"], pool=str(pool), dataset=None, split="test", limit=None, seed=0,
                    progress=False)  # fmt: skip
    assert [s["accuracy"] for s in runs] == [1.0, 0.0]
    assert all(s["failed_call_rate"] == 0.0 for s in runs)
    # with a reference solution the tests grade, as before
    rows[0]["answer"] = "def f():\n    return 1\n"
    path = _write(tmp_path / "solved.jsonl", rows)
    assert load_recordings(path).tasks[0].grader == "code"


def test_a_recorded_program_grades_as_its_label_even_where_its_tests_disagree(tmp_path: Path) -> None:
    """A code item with tests whose recorded label disagrees with the tests here (another harness,
    a timeout, a reference solution that fails them): no final-answer line can make a program
    pass or fail, so every call failed with "could not make task ... grade as recorded" and
    another worker answered instead (an outside tester's MBPP file: 9 of 2,570 texts). A recorded
    text now grades as its label without running the tests; a text nobody labelled runs them."""
    from rl_conductor.tasks.recordings_format import item_dict
    from rl_conductor.workers.replay import replay_answer

    tests = ["assert f(1) == 2"]
    right_f, wrong_f = "def f(x):\n    return x + 1\n", "def f(x):\n    return x * 3\n"
    rows = [{"id": f"c/{i}", "question": f"Write f adding one ({i}).", "grader": "code", "domain": "code",
             "split": "test", "answer": right_f, "metadata": {"tests": tests},
             # a passes the tests but was recorded wrong; b fails them but was recorded right
             "responses": {"a": {"text": right_f, "correct": False}, "b": {"text": wrong_f, "correct": True},
                           "c": {"text": f"def f(x):  # c\n    return x + {1 + i % 2}\n"}}}
            for i in range(4)]  # fmt: skip
    pool = _byo_pool(tmp_path, rows, models="abc")
    recs = load_recordings(tmp_path / "byo.jsonl")
    task = recs.tasks[0]
    assert task.grader == "code" and len(task.metadata["recorded_labels"]) == 2  # c's text has no label
    assert grade(task, right_f) is False and grade(task, wrong_f) is True  # the labels, not the tests
    assert grade(task, "def f(x):\n    return x + 1  # another text\n") is True  # not recorded: tested
    assert replay_answer(task, "b", True, recs).text == wrong_f  # raw: no line appended, no error
    singles = ["single:a", "single:b", "single:c"]
    runs = {s["policy"]: s for s in run_eval(singles, pool=str(pool), dataset=None, split="test", limit=None,
                                              seed=0, progress=False)}  # fmt: skip
    assert runs["single:a"]["accuracy"] == 0.0 and runs["single:b"]["accuracy"] == 1.0
    assert runs["single:c"]["accuracy"] == pytest.approx(0.5)  # unlabelled: its tests decide
    assert all(s["failed_call_rate"] == 0.0 for s in runs.values())
    # the labels are the loader's: an exported item carries its responses' labels, not a digest
    assert "recorded_labels" not in item_dict(task, recs.responses[task.id])["metadata"]
    # two models that recorded one text with different labels: the tests decide it
    rows[0]["responses"]["c"] = {"text": wrong_f, "correct": False}
    clash = load_recordings(_write(tmp_path / "clash.jsonl", rows)).tasks[0]
    assert grade(clash, wrong_f) is False and grade(clash, right_f) is False


def test_recorded_program_labels_hold_for_cuts_shared_code_and_label_only_answers(tmp_path: Path) -> None:
    """H35's attacks on the labels of recorded programs: the candidate table's grade memo keyed two
    texts with one code block by the code (the first graded set both); a wrong program cut by
    max_tokens ran its tests and could pass; a label-only right answer on an item whose reference
    fails its tests still failed every call; a user's own ``recorded_labels`` was trusted."""
    from rl_conductor.workers.replay import replay_answer
    from rl_conductor.workers.simulated.answers import answer_key

    tests = ["assert f(1) == 2"]
    right_f = "def f(x):\n    return x + 1\n"
    prose = "Here is my solution.\n```python\n" + right_f + "```\n"
    rows = [{"id": "c/0", "question": "Write f adding one.", "grader": "code", "domain": "code",
             "split": "test",
             "answer": "def f(x):\n    return x + 2\n",  # a reference solution that fails the tests here
             "metadata": {"tests": tests},
             "responses": {"a": {"text": prose + "It passes, I think. " * 20, "correct": False},
                           "b": {"text": "```python\n" + right_f + "```", "correct": True},
                           "c": {"correct": True}}}]  # fmt: skip
    recs = load_recordings(_write(tmp_path / "c.jsonl", rows))
    task = recs.tasks[0]
    a, b = (recs.get(task.id, m).text for m in "ab")
    assert grade(task, a) is False and grade(task, b) is True
    assert answer_key(task, a) != answer_key(task, b)  # one code block, two labels: two memo keys
    assert grade(task, a[: len(prose)]) is False  # the wrong program cut short: still wrong
    assert grade(task, prose) is False
    assert grade(task, "```python\n" + right_f + "```\n# a new text\n") is True  # the tests decide
    c = replay_answer(task, "c", True, recs)  # no text grading right can be made: its stand-in
    assert c.synthesised and grade(task, c.text) is True
    rows[0]["metadata"]["recorded_labels"] = {"x": True}
    with pytest.raises(RecordingsError, match="recorded_labels"):
        load_recordings(_write(tmp_path / "own.jsonl", rows))


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_text("\ufeff" + json.dumps(_item(1, a={"text": "#### 2"})) + "\n", encoding="utf-8")
    assert [t.id for t in load_recordings(path).tasks] == ["x/1"]


def test_routers_and_training_refuse_a_file_without_training_items(tmp_path: Path) -> None:
    """Every item `split: test`: a router fitted on nothing would send every question to the
    first worker (0 %, exit 0), and training raised a traceback; both are one-line errors."""
    from typer.testing import CliRunner

    rows = [{**_item(i, a={"text": f"#### {i + 1}", "correct": True}, b={"correct": False}), "split": "test"}
            for i in range(4)]  # fmt: skip
    pool = _byo_pool(tmp_path, rows)
    for router in ("knn", "domain-router"):
        res = CliRunner().invoke(app, ["eval", "--pool", str(pool), "--policy", router])
        assert res.exit_code == 2, res.output
        assert "fitted on the training split" in res.output and "Traceback" not in res.output
    args = ["train", "--preset", "recordings", "--pool", str(pool), "--out", str(tmp_path / "run"),
            "--sft-examples", "4", "--grpo-steps", "1"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "has no training tasks" in res.output and "Traceback" not in res.output


def test_a_worker_whose_calls_all_fail_is_named_by_the_routers_and_the_warm_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool file that prices a worker per 1K tokens where its recordings' costs mean per 1M:
    every recorded cost is above the call's worst case, every call fails and another worker
    answers in its place. No fit credits it (own_answer), so it had dropped out of the routers
    and the Conductor's targets without a word (an outside tester's report); now the
    measurement names it and the reason."""
    import logging

    from rl_conductor.policies.routers import single_outcomes
    from rl_conductor.training.candidates import build_table

    rows = [{**_item(i, a={"text": f"#### {i + 1}", "correct": True, "cost_usd": 0.002},
                     b={"text": f"#### {i + 1}", "correct": True, "cost_usd": 0.01}),
             "split": "train" if i < 12 else "validation"} for i in range(14)]  # fmt: skip
    rec = _write(tmp_path / "priced.jsonl", rows)
    pool_file = tmp_path / "priced.yaml"
    pool_file.write_text(yaml.safe_dump({"name": "priced", "recordings": str(rec), "workers": [
        {"name": "a", "kind": "replay", "price_in": 1.0, "price_out": 1.0},
        {"name": "b", "kind": "replay", "price_in": 0.001, "price_out": 0.001}]}))  # fmt: skip
    pool = load_pool(str(pool_file))
    tasks = load_tasks(pool.default_dataset(), split="train")
    from rl_conductor.policies.cascade import SAMPLES, sample_outcomes

    with caplog.at_level(logging.WARNING):
        out = single_outcomes(pool, tasks, cache=False)
        build_table(tasks, pool, top_k=1, cheap_k=1)
        samples = sample_outcomes(pool, tasks, cache=False)
    assert not out.correct[:, 1].any() and out.replaced["b"][0] == len(tasks)
    # the fixed cascade's fit credited b with a's answers (cascade:b*2 fitted best)
    assert not samples.correct[:, 1].any() and samples.correct[:, 0].all()
    assert all(k is None for row in samples.keys for k in row[1])
    said = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(said) == 3 and all("'b' did not answer" in m for m in said)
    assert sum("12 of 12 calls" in m for m in said) == 2 and f"{12 * SAMPLES} of {12 * SAMPLES}" in said[2]
    assert all("above this call's worst case" in m for m in said)
    assert not any("'a'" in m for m in said)

    # a table read from the warm start's cache says it too (it was silent: the build had warned
    # in some earlier process)
    from rl_conductor.policies import routers
    from rl_conductor.training import candidates

    cache = tmp_path / "cache"
    candidates.cached_table(tasks, pool, cache, top_k=1, cheap_k=1)  # built and saved
    routers._WARNED.clear()  # a later process
    with monkeypatch.context() as m:
        m.setattr(candidates, "build_table", lambda *a, **k: pytest.fail("the cached table was rebuilt"))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            candidates.cached_table(tasks, pool, cache, top_k=1, cheap_k=1)
    said = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(said) == 1 and "candidate table: worker 'b' did not answer 12 of 12 calls" in said[0]
    assert "above this call's worst case" in said[0]


def test_routers_never_credit_a_worker_with_a_replacements_answers(tmp_path: Path) -> None:
    """A model recorded on none of the training items (only on test): its training calls are
    answered by a replacement worker. Before, the routers' measurement counted those answers as
    the missing model's, so at the cheap model's price it looked as good as the replacement and
    the domain-router and kNN sent most test questions to it (an outside attack: 60 % and 75 %).
    A replaced answer is not the worker's: it never counts as its success."""
    from rl_conductor.policies.routers import measure_singles

    rows = []
    for i in range(8):  # train: b has no recording; a is right. test: both recorded, b wrong
        resp = {"a": {"text": f"#### {i + 1}", "correct": True}}
        if i >= 4:
            resp["b"] = {"text": "#### 0", "correct": False}
        rows.append({**_item(i, **resp), "split": "train" if i < 4 else "test"})
    pool = load_pool(str(_byo_pool(tmp_path, rows)))
    tasks = load_tasks(pool.default_dataset(), split="train")
    out = asyncio.run(measure_singles(pool, tasks, progress=False))
    assert out.names == ["a", "b"]
    assert out.correct[:, 0].all() and not out.correct[:, 1].any()  # b was answered by a: not b's
    from rl_conductor.training.candidates import build_table

    table = build_table(tasks, pool, top_k=1, cheap_k=1)  # the Conductor's warm-start targets too
    singles = {c.name: j for j, c in enumerate(table.candidates) if len(c.steps) == 1}
    assert table.correct[:, singles["solve:a"], 0].all() and not table.correct[:, singles["solve:b"], 0].any()
    from rl_conductor.training.adaptive import KEEP, build_rounds_table

    rounds = build_rounds_table(tasks, pool, table, top_k=1, pair_k=2)  # and the review's targets
    b_alone = rounds.firsts.index("solve:b")
    assert not rounds.correct[:, b_alone, rounds.conts.index(KEEP)].any()


def test_eval_warns_when_a_policy_row_is_partly_another_workers(tmp_path: Path) -> None:
    """A worker whose calls fail (no recording of half the items): its ``single:`` row is answered
    partly by a replacement worker. The table says so under it (a warning), exit 0."""
    from typer.testing import CliRunner

    half = {"b": {"text": "#### 0"}}
    rows = [
        _item(i, a={"text": f"#### {i + 1}", "correct": True}, **(half if i % 2 else {})) for i in range(6)
    ]
    for r in rows:
        r["split"] = "test"
    pool = _byo_pool(tmp_path, rows)
    res = CliRunner().invoke(
        app, ["eval", "--pool", str(pool), "--policy", "single:b", "--policy", "single:a"]
    )
    assert res.exit_code == 0, res.output
    assert re.search(
        r"warning: policy 'single:b': 33\.3 % of its worker calls failed, and on 50\.0 % of questions a "
        r"replacement worker answered .*; e\.g\. b: .*no recording",
        " ".join(res.output.split()),
    )
    assert res.output.count("warning: policy 'single:b'") == 1  # one line: one fact
    assert "warning: policy 'single:a'" not in res.output


def test_measurement_warnings_name_what_the_row_hides() -> None:
    from rl_conductor.evaluation.runner import measurement_warnings

    clean = {"policy": "knn", "failed_call_rate": 0.0, "worker_fallback_rate": 0.0, "parse_rate": 1.0}
    assert measurement_warnings(clean) == []
    unparsed = {"policy": "conductor:final", "parse_rate": 0.0, "fallback_rate": 1.0, "failed_call_rate": 0.0}
    assert measurement_warnings(unparsed) == [
        "policy 'conductor:final': 100.0 % of its plans did not parse; the fallback plan answered 100.0 % "
        "of questions"
    ]


def test_evidence_fitted_for_other_workers_is_refused_by_name() -> None:
    """An evidence-rule or Conductor asked to rank a pool none of whose workers it has estimates
    for would send every question to the pool's first worker; some unknown ones rank last."""
    from types import SimpleNamespace

    from rl_conductor.errors import InvalidArgument
    from rl_conductor.policies.evidence import check_known_workers

    model: Any = SimpleNamespace(names=["gpt-4o", "mixtral"])
    check_known_workers(model, ["gpt-4o", "new-worker"], "evidence-rule:final")  # a warning only
    with pytest.raises(InvalidArgument, match=r"evidence-rule:final: its evidence was fitted for workers"):
        check_known_workers(model, ["claude", "gemini"], "evidence-rule:final")


def test_texts_without_gold_agree_by_their_stated_answers(tmp_path: Path) -> None:
    """A file with texts and labels but no gold (RouterBench-style logs) replays as recorded, and
    two texts that state one answer agree, as on a gradable item: a cascade keeps them and asks the
    strong worker only where they differ. Before, every pair of recorded texts "disagreed" (their
    digests were their answers), so every review escalated and a cascade cost as much as both."""
    from rl_conductor.tasks.graders import agreement, extract_answer

    words = {"math": ("So she pays $8 in all.\nThe answer is 8.", "12 / 3 * 2 = 8\n#### 8", "#### 9"),
             "choice": ("The answer is (C).", "Answer: C", "Answer: B"),
             None: ("The answer is Paris.", "Final answer: paris", "The answer is Lyon.")}  # fmt: skip
    rows = []
    for i in range(12):
        grader = [*words][i % 3]
        same_a, same_b, other = words[grader]
        agree = i % 2 == 0
        rows.append({"id": f"t/{i}", "question": f"Question {i}?", "domain": "mixed", "split": "test",
                     **({"grader": grader} if grader else {}),
                     **({"metadata": {"choices": ["w", "x", "y", "z"]}} if grader == "choice" else {}),
                     "responses": {"a": {"text": same_a, "correct": agree},
                                   "b": {"text": same_b if agree else other, "correct": agree},
                                   "c": {"correct": True}}})  # fmt: skip
    pool = _byo_pool(tmp_path, rows, models="abc")
    tasks = load_tasks(load_pool(str(pool)).options["default_dataset"], "test")
    assert {t.grader for t in tasks} == {"recorded"}
    by_id = {r["id"]: r for r in rows}
    for t in tasks:
        a, b = (by_id[t.id]["responses"][m]["text"] for m in "ab")
        assert agreement(t, [a, b]) is (int(t.id.split("/")[1]) % 2 == 0), (t.id, a, b)
    worker = load_pool(str(pool)).get("c")
    call = worker.complete([], max_tokens=64, temperature=0, context=CallContext(tasks[0]))
    stand_in = asyncio.run(call).text
    assert extract_answer(tasks[0], stand_in) is not None and agreement(tasks[0], [stand_in, "8"]) is False
    [run] = run_eval(["cascade:a,b>c"], pool=str(pool), dataset=None, split="test", limit=None, seed=0,
                     progress=False, max_rounds=2)  # fmt: skip
    assert run["multi_round_rate"] == pytest.approx(0.5)  # escalated exactly where the answers differ
    assert run["accuracy"] == pytest.approx(1.0)  # agreeing pairs were right here; c answered the rest


def test_no_gold_tables_grade_each_text_by_its_own_label_and_an_edited_file_is_rebuilt(
    tmp_path: Path,
) -> None:
    """Outside attack on the agreement rule: (1) the candidate table memoised grades per answer
    key, so once two texts stating one answer could share a key, one text's label graded the
    other (37 such items in gsm8k-six without gold); (2) the default ``qa`` key read a shared
    last line ("Hope this helps!") as one answer; (3) a recorded math item lost symbolic
    equivalence; (4) the tables' cache key ignored the file's labels and graders, so an edited
    file was read from a stale table; (5) a real text that began like a stand-in was one."""
    from rl_conductor.tasks.graders import agreement, extract_answer
    from rl_conductor.training.candidates import cached_table

    def rows(b_right: bool) -> list[dict[str, Any]]:
        return [{"id": f"p/{i}", "question": f"Pens {i}?", "grader": "math", "domain": "m", "split": "train",
                 "responses": {"a": {"text": "12/3*2 = 8\n#### 8", "correct": True},
                               "b": {"text": "12 pens = $8.00\n#### $8.00", "correct": b_right}}}
                for i in range(4)]  # fmt: skip

    pool = _byo_pool(tmp_path, rows(False))
    tasks = load_tasks(load_pool(str(pool)).options["default_dataset"], "train")
    for names in ("ab", "ba"):  # either order: each text keeps its own label
        p = tmp_path / f"{names}.yaml"
        p.write_text(yaml.safe_dump({**yaml.safe_load(pool.read_text()),
                                     "workers": [{"name": m, "kind": "replay"} for m in names]}))  # fmt: skip
        table = cached_table(tasks, load_pool(str(p)), tmp_path / f"cache-{names}", top_k=2, cheap_k=1)
        by = {c.name: j for j, c in enumerate(table.candidates)}
        assert table.correct[:, by["solve:a"], 0].all() and not table.correct[:, by["solve:b"], 0].any()
    # (4) the same file with b's label fixed: the cache is not reused
    _write(tmp_path / "byo.jsonl", rows(True))
    tasks = load_tasks(load_pool(str(pool)).options["default_dataset"], "train")
    table = cached_table(
        tasks, load_pool(str(tmp_path / "ab.yaml")), tmp_path / "cache-ab", top_k=2, cheap_k=1
    )
    assert table.correct[:, [c.name for c in table.candidates].index("solve:b"), 0].all()
    # (2) qa: only a stated answer is a key; (3) math keys agree symbolically; (5) stand-in look-alikes
    qa = Task("q", "?", "", "qa", "t", "recorded", {"recorded_grader": "qa"})
    assert (
        agreement(qa, ["It is Canberra.\n\nHope this helps!", "It is Sydney.\n\nHope this helps!"]) is False
    )
    assert agreement(qa, ["The answer is Canberra.\nHope this helps!", "Answer: canberra"]) is True
    worked = ["So she makes 9 * $2 = $18 every day.", "9*2=<<9*2=18>>18\nA: 18", "#### 18.0"]
    assert agreement(qa, worked) is True  # unmarked worked solutions: the last line's number, by value
    assert agreement(qa, ["So she makes $18 every day.", "She makes $1,800 in all."]) is False
    # a second attack's false agreements: sign-offs, headings, citations, lost signs, options
    for one, other in [
        ("Paris.\nI hope this answer is helpful!", "Lyon.\nI hope this answer is helpful!"),
        ("#### Final Answer\nIt is **Paris**.", "#### Final Answer\nIt is **Lyon**."),
        ("It is 8.\n[1] en.wikipedia.org", "It is 9.\n[1] en.wikipedia.org"),
        ("The answer is -1/2", "The answer is 1/2"),
        ("Answer: (C) 42", "Answer: (D) 42"),
        ("The answer is 12,5", "The answer is 125"),
        ("It opens at 9:30 am.", "It opens at 10:30 am."),
    ]:
        assert agreement(qa, [one, other]) is False, (one, other)
    # and its false disagreements: one value, written differently
    for one, other in [
        ("The answer is 18 dollars.", "#### 18"),
        ("**The answer is 18**.", "\\boxed{\\$18}"),
        ("The answer is 42, since 6 x 7 = 42.", "A: 42"),
        ("The answer is \u22125", "Answer: -5"),
        ("Answer: (C) 42", "The answer is C."),
        ("So it takes Carlos 12 years.", "#### 12"),
    ]:
        assert agreement(qa, [one, other]) is True, (one, other)
    math = Task("m", "?", "", "math", "t", "recorded", {"recorded_grader": "math"})
    assert agreement(math, ["\\boxed{2\\sqrt{2}}", "\\boxed{\\sqrt{8}}"]) is True
    assert extract_answer(math, "[recorded answer abc] #### 5") == extract_answer(math, "#### 5")


def test_train_says_when_a_one_round_recipe_ignores_recorded_texts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rl_conductor.cli.train import _hint_texts
    from rl_conductor.training.config import load_preset

    written = [_item(i, a={"text": f"#### {i + 1}"}, b={"text": "#### 0"}) for i in range(4)]
    texts = _byo_pool(tmp_path, written)
    _hint_texts(load_preset("recordings", pool=str(texts)))
    assert "note: 100 % of these recordings keep their response text; --preset recordings-text" in (
        capsys.readouterr().err.replace("\n", " ")
    )
    _hint_texts(load_preset("recordings-text", pool=str(texts)))  # already two rounds: nothing to say
    (tmp_path / "labels").mkdir()
    only = [_item(i, a={"correct": True}, b={"correct": False}) for i in range(4)]
    labels = _byo_pool(tmp_path / "labels", only)
    _hint_texts(load_preset("recordings", pool=str(labels)))
    _hint_texts(load_preset("tiny"))  # not a recordings pool
    assert capsys.readouterr().err == ""
    _hint_texts(load_preset("recordings", pool="gsm8k-six"))  # the shipped pool's file, by its alias
    assert "note: 100 % of these recordings keep their response text" in capsys.readouterr().err
    _hint_texts(load_preset("recordings-text", pool=str(labels)))  # the reverse mismatch
    assert "note: only 0 % of these recordings keep their response text" in capsys.readouterr().err
    (tmp_path / "tests-only").mkdir()  # no training item: train's own error says so, no note first
    tested = _byo_pool(tmp_path / "tests-only", [{**row, "split": "test"} for row in written])
    _hint_texts(load_preset("recordings", pool=str(tested)))
    assert capsys.readouterr().err == ""


def test_the_tables_caches_are_rebuilt_when_the_grading_code_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rounds table cached before an answer-key change kept its old agreements (measured: a
    retrained Conductor escalated on every question); the keys now carry ``code_version``."""
    from rl_conductor.training import adaptive, candidates

    rows = [{**_item(i, a={"text": f"#### {i + 1}"}, b={"text": "#### 0"}), "split": "train"}
            for i in range(4)]  # fmt: skip
    pool = load_pool(str(_byo_pool(tmp_path, rows)))
    tasks = load_tasks(pool.options["default_dataset"], "train")
    cache = tmp_path / "cache"

    def build() -> set[str]:
        table = candidates.cached_table(tasks, pool, cache, top_k=2, cheap_k=1)
        adaptive.cached_rounds_table(tasks, pool, table, cache, top_k=2, pair_k=2)
        return {p.name for p in cache.iterdir()}

    first = build()
    assert build() == first and len(first) == 2
    monkeypatch.setattr(candidates, "code_version", lambda: "other-graders")
    monkeypatch.setattr(adaptive, "code_version", lambda: "other-graders")
    assert len(build() - first) == 2  # both tables rebuilt under new keys


def test_the_routers_key_changes_when_the_recordings_file_is_edited(tmp_path: Path) -> None:
    """The routers' and cascade fits' caches (``pool_key``) keyed on the file's path only: an edited
    file (a label flipped on every training item) was read from the stale fit."""
    from rl_conductor.policies.routers import pool_key

    rows = [_item(i, a={"text": f"#### {i + 1}", "correct": True}) for i in range(3)]
    pool = _byo_pool(tmp_path, rows, models="a")
    before = pool_key(load_pool(str(pool)))
    assert pool_key(load_pool(str(pool))) == before
    rows[0]["responses"]["a"]["correct"] = False
    _write(tmp_path / "byo.jsonl", rows)
    assert pool_key(load_pool(str(pool))) != before


def test_rounds_table_adds_the_pairs_of_the_best_fitted_cascades(tmp_path: Path, monkeypatch: Any) -> None:
    """``warm_cascade_pairs``: the two most accurate cheap workers here copy each other (their
    agreement says nothing), so the pairs of the ``pair_k`` most accurate miss what pays under a
    review; the fitted cascade's pair, of workers whose wrong answers differ, is added."""
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    rows = []
    for i in range(60):
        right = {"big": i % 20 != 0, "copy": i % 4 != 0, "x": i % 3 != 0, "y": i % 3 != 1}
        wrong = {"big": "-9", "copy": "-1", "x": "-2", "y": "-3"}
        text = {w: f"#### {i + 1 if ok else wrong[w]}" for w, ok in right.items()}
        cost = {"big": 0.01, "copy": 0.0005, "x": 0.0003, "y": 0.0003}
        replies = {w: {"text": text[w], "cost_usd": cost[w]} for w in ("big", "x", "y")}
        replies |= {c: {"text": text["copy"], "cost_usd": cost["copy"]} for c in ("copy-a", "copy-b")}
        rows.append({**_item(i), "split": "train", "responses": replies})
    rec = _write(tmp_path / "casc.jsonl", rows)
    pool_file = tmp_path / "casc.yaml"
    pool_file.write_text(yaml.safe_dump({"name": "casc", "recordings": str(rec), "workers": [
        {"name": m, "kind": "replay", "price_in": 100.0, "price_out": 100.0}  # worst cases above the costs
        for m in ("big", "copy-a", "copy-b", "x", "y")]}))  # fmt: skip
    pool = load_pool(str(pool_file))
    tasks = load_tasks(pool.default_dataset(), split="train")
    from rl_conductor.policies.cascade import fit_cascade, sample_outcomes
    from rl_conductor.reward import RewardConfig
    from rl_conductor.training.adaptive import build_rounds_table, pair
    from rl_conductor.training.candidates import build_table

    config = RewardConfig(cost_weight=0.1)
    table = build_table(tasks, pool, top_k=1, cheap_k=1)
    best = next(f for f in fit_cascade(sample_outcomes(pool, tasks), tasks, config) if len(set(f.first)) == 2)
    assert "copy-a" not in best.first or "copy-b" not in best.first  # not the copies' pair
    wanted = {pair(*best.first).name, pair(*reversed(best.first)).name}
    plain = build_rounds_table(tasks, pool, table, top_k=1, pair_k=2)
    assert [f for f in plain.firsts if "|" in f] == ["solve:copy-b|solve:copy-a"]  # accuracy alone
    nominated = build_rounds_table(tasks, pool, table, top_k=1, pair_k=2, cascade_pairs=1, config=config)
    assert wanted & set(nominated.firsts)
    assert f"+{best.escalate}" in nominated.conts
    with pytest.raises(ValueError, match="reward"):
        build_rounds_table(tasks, pool, table, top_k=1, pair_k=2, cascade_pairs=1)
    from rl_conductor.training.config import ConfigError, TrainConfig

    for bad in (1.5, -1, True):
        with pytest.raises(ConfigError, match="warm_cascade_pairs"):
            TrainConfig(warm_cascade_pairs=bad)  # type: ignore[arg-type]


def test_a_pairs_continuations_are_the_same_in_every_domain(tmp_path: Path, monkeypatch: Any) -> None:
    """The same cheap pair is a first plan in two domains whose strongest workers differ: for the
    text rule (fitted per first plan across domains) it is run with both domains' escalations on all
    of its questions, so the rule can weigh either. Before, it saw only the escalations every domain shared
    (none here), and on a latent-difficulty file it never weighed the one that paid."""
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    rows = []
    for i in range(40):
        dom = "math" if i % 2 else "stem"
        right = {"big-m": dom == "math" or i % 4 == 0, "big-s": dom == "stem" or i % 4 == 0,
                 "c1": i % 3 != 0, "c2": i % 5 != 0}  # fmt: skip
        cost = {"big-m": 0.01, "big-s": 0.01, "c1": 0.0003, "c2": 0.0004}
        text = {w: f"#### {i + 1 if ok else -1 - len(w)}" for w, ok in right.items()}
        replies = {w: {"text": text[w], "cost_usd": cost[w]} for w in right}
        rows.append({**_item(i), "domain": dom, "split": "train", "responses": replies})
    rec = _write(tmp_path / "two.jsonl", rows)
    pool_file = tmp_path / "two.yaml"
    pool_file.write_text(yaml.safe_dump({"name": "two", "recordings": str(rec), "workers": [
        {"name": m, "kind": "replay", "price_in": 100.0, "price_out": 100.0}
        for m in ("big-m", "big-s", "c1", "c2")]}))  # fmt: skip
    pool = load_pool(str(pool_file))
    tasks = load_tasks(pool.default_dataset(), split="train")
    from rl_conductor.limits import RequestLimits
    from rl_conductor.reward import RewardConfig
    from rl_conductor.training.adaptive import build_rounds_table, domain_sets
    from rl_conductor.training.candidates import build_table
    from rl_conductor.training.review_text import fit_text_rule, review_rows

    table = build_table(tasks, pool, top_k=1, cheap_k=1)
    sets = domain_sets(table, 1, 2)
    assert sets["math"][0] == ["big-m"] and sets["stem"][0] == ["big-s"]  # each domain's escalation
    rounds = build_rounds_table(tasks, pool, table, top_k=1, pair_k=2, shared_continuations=True)
    pairs = [f for f, name in enumerate(rounds.firsts) if "|" in name]
    assert pairs and {"+big-m", "+big-s"} <= set(rounds.conts)
    for f in pairs:
        for label in ("+big-m", "+big-s"):
            assert rounds.done[:, f, rounds.conts.index(label)].all(), (rounds.firsts[f], label)
    # without it (the agreement rule, fitted per domain), each domain's own as before
    own = build_rounds_table(tasks, pool, table, top_k=1, pair_k=2)
    stem_rows = [i for i, d in enumerate(own.domains) if d == "stem"]
    assert not own.done[stem_rows][:, pairs, own.conts.index("+big-m")].any()
    assert own.done[stem_rows][:, pairs, own.conts.index("+big-s")].all()
    singles = [f for f, name in enumerate(rounds.firsts) if "|" not in name]
    math_rows = [i for i, d in enumerate(rounds.domains) if d == "math"]
    assert not rounds.done[math_rows][:, singles, rounds.conts.index("+big-s")].any()  # singles as before
    rows_ = review_rows(tasks, pool, rounds, RequestLimits())
    rule = fit_text_rule(rounds, rows_, RewardConfig(cost_weight=0.1))
    assert {"big-m", "big-s"} <= {w for est in rule.evidence.plans.values() for w in est.workers}


def test_eval_json_has_one_shape_whatever_the_number_of_policies(tmp_path: Path) -> None:
    """``results`` always (a script reads the same key for one policy or several); one policy's
    summary stays at the top level too, as before."""
    from typer.testing import CliRunner

    rows = [{**_item(i, a={"text": f"#### {i + 1}", "correct": True}, b={"correct": False}), "split": "test"}
            for i in range(4)]  # fmt: skip
    pool = _byo_pool(tmp_path, rows)
    for policies in (["single:a"], ["single:a", "single:b"]):
        out = tmp_path / f"{len(policies)}.json"
        args = ["eval", "--pool", str(pool), "--json", str(out)]
        res = CliRunner().invoke(app, [*args, *(x for p in policies for x in ("--policy", p))])
        assert res.exit_code == 0, res.output
        doc = json.loads(out.read_text())
        assert [r["policy"] for r in doc["results"]] == policies
        assert (doc.get("policy") == "single:a") is (len(policies) == 1)
