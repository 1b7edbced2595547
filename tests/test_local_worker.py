"""``conductor worker serve`` end to end: two real worker processes (KServe ModelServer, OpenAI-
compatible routes) serving a tiny randomly initialised model, called over HTTP by the official
``openai`` SDK and by the executor through the ``local-live`` pool.

The tiny model is built once per module with the project's bootstrap (``build_tiny``); it
answers nonsense, quickly. What is checked is the protocol: real ``usage`` (the served
tokenizer's counts), ``max_tokens`` honoured, the executor's budget never exceeded, the privacy
rule keeping a private request off the worker that poses as external.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.pool import Pool, load_pool
from rl_conductor.workflow import Step, Workflow
from servers import local_live_env

pytestmark = pytest.mark.slow


@pytest.fixture
def live_pool(local_workers: dict[str, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Pool:
    for name, value in local_live_env(local_workers, tmp_path).items():
        monkeypatch.setenv(name, value)
    return load_pool("local-live")


def test_openai_sdk_sees_models_and_real_usage(local_workers: dict[str, int], tiny_worker_dir: Path) -> None:
    import openai

    from rl_conductor.workers.live.server import ChatModel

    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{local_workers['tiny-self']}/openai/v1", api_key="EMPTY"
    )
    assert [m.id for m in client.models.list().data] == ["tiny-self"]
    messages = [{"role": "user", "content": "Natalia sold clips to 48 of her friends."}]
    resp = client.chat.completions.create(model="tiny-self", messages=messages, max_tokens=7, temperature=0.0)
    local = ChatModel("tiny-self", tiny_worker_dir)  # the served model's own tokenizer and prompt format
    local.load()
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == len(local.prompt_ids(messages)) > 10
    assert 1 <= resp.usage.completion_tokens <= 7
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.choices[0].finish_reason in ("stop", "length")
    if resp.choices[0].finish_reason == "length":
        assert resp.usage.completion_tokens == 7
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-5", messages=messages, max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny-self", messages=[], max_tokens=4)


def test_worker_serve_answers_stream_true_in_the_streaming_wire_format(local_workers: dict[str, int]) -> None:
    import openai

    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{local_workers['tiny-self']}/openai/v1", api_key="EMPTY"
    )
    messages = [{"role": "user", "content": "Natalia sold clips to 48 of her friends."}]
    whole = client.chat.completions.create(
        model="tiny-self", messages=messages, max_tokens=6, temperature=0.0
    )
    chunks = list(
        client.chat.completions.create(
            model="tiny-self",
            messages=messages,
            max_tokens=6,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_two_step_workflow_over_http_reports_tokens_and_keeps_the_budget(
    live_pool: Pool, tiny_worker_dir: Path
) -> None:
    from rl_conductor.workers.live.server import ChatModel
    from rl_conductor.workflow import worker_message

    task = load_tasks("gsm8k", "test", limit=1)[0]
    view = live_pool.view()
    wf = Workflow([Step(0, "Solve the problem.", []), Step(1, "Check the answer above.", "all")])
    limits = RequestLimits(max_cost_usd=0.01, max_tokens=64, temperature=0.7)
    trace = await execute(wf, task, view, limits)
    assert [s.status for s in trace.steps] == ["ok", "ok"], [s.note for s in trace.steps]
    local = ChatModel("tiny-self", tiny_worker_dir)
    local.load()
    for i, step in enumerate(trace.steps):  # the trace carries the servers' own prompt token counts
        visible = [(0, wf.steps[0].instruction, trace.steps[0].answer)] if i else []
        sent = [{"role": "user", "content": worker_message(task.question, visible, step.instruction)}]
        assert step.input_tokens == len(local.prompt_ids(sent))
    assert [s.worker for s in trace.steps] == ["smol-self", "smol-external"]
    for step in trace.steps:
        info = live_pool.get(step.worker).info
        assert step.input_tokens > 0 and 1 <= step.output_tokens <= 64 and not step.tokens_estimated
        assert step.cost_usd == pytest.approx(info.cost(step.input_tokens, step.output_tokens))
        assert step.finish_reason in ("stop", "length") and not step.cached
    assert trace.steps[1].input_tokens > trace.steps[0].input_tokens  # it saw step 0's answer
    assert 0 < trace.cost_usd <= 0.01

    # a budget that affords the self-hosted step but not the external one: stop, never exceed it
    tight = 5e-5
    trace = await execute(wf, task, view, RequestLimits(max_cost_usd=tight, max_tokens=64, temperature=0.7))
    assert [s.status for s in trace.steps] == ["ok", "skipped_budget"]
    assert 0 < trace.cost_usd <= tight and trace.final_answer == trace.steps[0].answer

    # a private request never reaches the worker posing as external
    trace = await execute(
        wf, task, view, RequestLimits(sensitivity="private", max_tokens=64, temperature=0.7)
    )
    assert [s.worker for s in trace.steps] == ["smol-self", "smol-self"]


async def test_repeated_workflow_is_served_from_the_cache(live_pool: Pool) -> None:
    task = load_tasks("gsm8k", "test", limit=1)[0]
    wf = Workflow([Step(0, "Solve the problem.", [])])
    limits = RequestLimits(max_tokens=64, temperature=0.7)
    first = await execute(wf, task, live_pool.view(), limits)
    again = await execute(wf, task, load_pool("local-live").view(), limits)  # a new pool, same cache
    assert not first.steps[0].cached and again.steps[0].cached
    assert again.final_answer == first.final_answer and again.cost_usd == first.cost_usd


def test_conductor_eval_on_local_live(local_workers: dict[str, int], tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **local_live_env(local_workers, tmp_path)}
    out = tmp_path / "eval.json"
    cmd = [sys.executable, "-m", "rl_conductor.cli", "eval", "--pool", "local-live", "--limit", "2"]
    cmd += ["--policy", "single:smol-self", "--policy", "single:smol-external", "--json", str(out)]
    res = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    results = {r["policy"]: r for r in json.loads(out.read_text())["results"]}
    for name in ("single:smol-self", "single:smol-external"):
        assert (
            results[name]["n"] == 2 and results[name]["mean_tokens"] > 0 and results[name]["mean_calls"] >= 1
        )
    assert results["single:smol-external"]["mean_cost_usd"] > results["single:smol-self"]["mean_cost_usd"]


def test_kserve_v1_predict_and_readiness(local_workers: dict[str, int]) -> None:
    import urllib.request

    root = f"http://127.0.0.1:{local_workers['tiny-ext']}"
    with urllib.request.urlopen(f"{root}/v1/models/tiny-ext", timeout=30) as resp:
        assert json.loads(resp.read())["ready"] is True
    body = {"instances": [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}]}
    req = urllib.request.Request(
        f"{root}/v1/models/tiny-ext:predict",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        (pred,) = json.loads(resp.read())["predictions"]
    assert pred["object"] == "chat.completion" and 1 <= pred["usage"]["completion_tokens"] <= 3


def test_pool_check_on_local_live(local_workers: dict[str, int], tmp_path: Path) -> None:
    """`conductor pool check local-live` against the two real worker processes: one call each,
    the servers' own token counts, and a worker that is not running is named (exit 1)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **local_live_env(local_workers, tmp_path)}
    cmd = [sys.executable, "-m", "rl_conductor.cli", "pool", "check", "local-live", "--json", "-"]
    res = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = {w["name"]: w for w in json.loads(res.stdout)["workers"]}
    assert set(rows) == {"smol-self", "smol-external"}
    for row in rows.values():
        assert row["status"] == "ok" and row["input_tokens"] > 0 and 1 <= row["output_tokens"] <= 64
        assert row["latency_s"] > 0 and row["cost_usd"] > 0
    assert rows["smol-external"]["cost_usd"] > rows["smol-self"]["cost_usd"]  # priced as the pool says
    table = subprocess.run(cmd[:-2], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert table.returncode == 0 and "smol-self" in table.stdout and "smol-external" in table.stdout
    assert not (tmp_path / "cache.sqlite").exists()  # a check never answers from (or fills) the cache
    from servers import free_ports

    (idle,) = free_ports(1)
    down = subprocess.run(
        cmd, env={**env, "CONDUCTOR_EXTERNAL_PORT": str(idle)}, cwd=tmp_path, capture_output=True, text=True
    )
    assert down.returncode == 1
    rows = {w["name"]: w for w in json.loads(down.stdout)["workers"]}
    assert rows["smol-self"]["status"] == "ok" and rows["smol-external"]["status"] == "error"
    assert f"127.0.0.1:{idle}/openai/v1" in rows["smol-external"]["detail"]
