"""The RouteLLM replay pool reproduces the recorded accuracies exactly, with the real graders.

The expected accuracies are computed here from the shipped CSVs with the csv module alone, not
through the code under test; the worker is called as the executor calls it and its answers are
graded by ``rl_conductor.tasks.graders.grade``.
"""

from __future__ import annotations

import csv
import gzip
import json
from importlib import resources
from typing import Any

import pytest

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks, split_of
from rl_conductor.tasks.graders import grade
from rl_conductor.tasks.routellm import RECORDED_MODELS, join_stats
from rl_conductor.workers.base import CallContext, Completion, WorkerError, estimate_tokens
from rl_conductor.workers.pool import Pool, PoolConfigError, build_pool, load_pool, load_pool_config
from rl_conductor.workers.replay import (
    CORRECT_LINE,
    WRONG_LINE,
    ReplayWorker,
    replay_answer,
    wrong_letter,
)

MODELS = ("gpt-4-1106-preview", "mixtral-8x7b-instruct")
COLUMNS = {
    "gpt-4-1106-preview": "gpt-4-1106-preview",
    "mixtral-8x7b-instruct": "mistralai/Mixtral-8x7B-Instruct-v0.1",
}
RECORDED = resources.files("rl_conductor").joinpath("data", "recorded")


def _csv_rows(*parts: str) -> list[dict[str, str]]:
    with (
        RECORDED.joinpath(*parts).open("rb") as raw,
        gzip.open(raw, "rt", encoding="utf-8", newline="") as fh,
    ):
        return list(csv.DictReader(fh))


def _recorded_correct(rows: list[dict[str, str]], model: str) -> int:
    return sum(r[COLUMNS[model]] == "True" for r in rows)


def _mmlu_rows() -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for ref in sorted(RECORDED.joinpath("routellm_mmlu").iterdir(), key=lambda p: p.name):
        rows += _csv_rows("routellm_mmlu", ref.name)
    return rows


def _messages(task: Task) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Solve this.\n\n{task.question}"}]


async def _run(worker: ReplayWorker, tasks: list[Task], **ctx: Any) -> list[tuple[Task, Completion]]:
    out = []
    for t in tasks:
        c = await worker.complete(
            _messages(t), max_tokens=4096, temperature=0.2, context=CallContext(task=t, **ctx)
        )
        out.append((t, c))
    return out


@pytest.fixture(scope="module")
def pool() -> Pool:
    return load_pool("routellm-replay")


def _worker(pool: Pool, name: str) -> ReplayWorker:
    worker = pool.get(name)
    assert isinstance(worker, ReplayWorker)
    return worker


def test_join_matches_every_recorded_row_to_the_base_datasets() -> None:
    stats = join_stats()
    assert (stats.gsm8k_rows, stats.gsm8k_matched) == (1319, 1319)
    assert (stats.mmlu_rows, stats.mmlu_matched) == (3018, 3018)
    gsm, mmlu, both = load_tasks("routellm-gsm8k"), load_tasks("routellm-mmlu"), load_tasks("routellm")
    assert [t.id for t in both] == [t.id for t in gsm] + [t.id for t in mmlu]
    base = {t.id: t for t in load_tasks("gsm8k") + load_tasks("mmlu_stem")}
    for t in both:  # the very same items: same id, text, gold and metadata (no recordings leak in)
        assert t.to_dict() == base[t.id].to_dict()
    test_ids = {t.id for t in load_tasks("routellm", "test")}
    assert test_ids == {t.id for t in both if split_of(t.id) == "test"}
    assert 0.15 < len(test_ids) / len(both) < 0.25


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
async def test_gsm8k_replay_gives_the_recorded_accuracy_exactly(pool: Pool, name: str) -> None:
    rows = _csv_rows("routellm_gsm8k_responses.csv.gz")
    by_text = {" ".join(r["prompt"].split()): r for r in rows}
    tasks = load_tasks("routellm-gsm8k")  # all splits
    worker = _worker(pool, name)
    results = await _run(worker, tasks)
    correct = sum(grade(t, c.text) for t, c in results)
    assert correct == _recorded_correct(rows, name), f"{name}: {correct}/{len(tasks)}"

    normalised = 0
    for t, c in results:
        raw = by_text[" ".join(t.question.split())][f"{COLUMNS[name]}_response"]
        if c.text == raw:
            continue
        normalised += 1  # only ever the recorded text plus one documented final-answer line
        label = by_text[" ".join(t.question.split())][COLUMNS[name]] == "True"
        line = CORRECT_LINE.format(gold=t.answer) if label else WRONG_LINE
        assert c.text == raw.rstrip() + line
        assert replay_answer(t, worker.model, False).text == raw
    assert 0 < normalised <= 0.05 * len(tasks)

    for t, c in results:
        assert c.output_tokens == estimate_tokens(c.text) > 0
        assert c.input_tokens == estimate_tokens(_messages(t)[0]["content"]) > 0
        assert c.cost_usd == pytest.approx(worker.info.cost(c.input_tokens, c.output_tokens))
        assert c.latency_s == pytest.approx(worker.ttft_s + c.output_tokens / worker.tokens_per_s, abs=1e-4)
        assert c.worker == name


@pytest.mark.parametrize("name", MODELS)
async def test_mmlu_replay_gives_the_recorded_accuracy_exactly(pool: Pool, name: str) -> None:
    rows = _mmlu_rows()
    tasks = load_tasks("routellm-mmlu")
    assert len(tasks) == len(rows)
    worker = _worker(pool, name)
    results = await _run(worker, tasks)
    correct = sum(grade(t, c.text) for t, c in results)
    assert correct == _recorded_correct(rows, name)
    for t, c in results:
        assert c.text in {f"Answer: {letter}" for letter in "ABCD"}
        assert c.output_tokens == worker.mmlu_output_tokens
        assert (
            c.cost_usd == pytest.approx(worker.info.cost(c.input_tokens, c.output_tokens)) and c.cost_usd > 0
        )
        if not grade(t, c.text):
            assert c.text == f"Answer: {wrong_letter(t, worker.model)}"


async def test_gpt4_costs_more_than_mixtral_on_the_same_items(pool: Pool) -> None:
    tasks = load_tasks("routellm", limit=40, seed=3)
    costs = {}
    for name in MODELS:
        costs[name] = sum(c.cost_usd for _, c in await _run(_worker(pool, name), tasks))
    assert costs["gpt-4-1106-preview"] > 10 * costs["mixtral-8x7b-instruct"] > 0


async def test_context_from_earlier_steps_is_ignored(pool: Pool) -> None:
    worker = _worker(pool, "mixtral-8x7b-instruct")
    tasks = load_tasks("routellm", limit=10, seed=1)
    plain = await _run(worker, tasks)
    busy = await _run(worker, tasks, step_index=3, instruction="verify", visible_answers=("#### 7",), nonce=5)
    assert [c.text for _, c in plain] == [c.text for _, c in busy]


async def test_an_item_without_a_recording_raises_a_clear_worker_error(pool: Pool) -> None:
    worker = _worker(pool, "gpt-4-1106-preview")
    unrecorded = load_tasks("math500")[0]
    with pytest.raises(WorkerError, match=r"no recording of task 'math500/0'.*routellm-gsm8k"):
        await worker.complete(
            _messages(unrecorded), max_tokens=256, temperature=0.2, context=CallContext(task=unrecorded)
        )
    with pytest.raises(WorkerError, match="needs CallContext"):
        await worker.complete(_messages(unrecorded), max_tokens=256, temperature=0.2)


async def test_max_tokens_cuts_the_answer_like_a_real_model(pool: Pool) -> None:
    worker = _worker(pool, "gpt-4-1106-preview")
    task = load_tasks("routellm-gsm8k")[0]
    full = await worker.complete(
        _messages(task), max_tokens=4096, temperature=0.2, context=CallContext(task=task)
    )
    cut = await worker.complete(
        _messages(task), max_tokens=8, temperature=0.2, context=CallContext(task=task)
    )
    assert full.output_tokens > 8 and cut.output_tokens == 8
    assert full.text.startswith(cut.text) and len(cut.text) <= 32
    assert cut.cost_usd < full.cost_usd


def test_wrong_letter_is_deterministic_and_never_the_gold() -> None:
    for t in load_tasks("routellm-mmlu", limit=200, seed=0):
        for model in RECORDED_MODELS:
            letter = wrong_letter(t, model)
            assert letter != t.answer and letter in "ABCD" and letter == wrong_letter(t, model)


def test_pool_file_uses_the_list_prices_and_hosting(pool: Pool) -> None:
    ref = resources.files("rl_conductor").joinpath("data", "calibration", "worker_prices.json")
    prices = json.loads(ref.read_text(encoding="utf-8"))["workers"]
    assert pool.names() == list(MODELS)
    for name in MODELS:
        info = pool.get(name).info
        assert (info.price_in, info.price_out, info.hosting, info.kind) == (
            prices[name]["input"], prices[name]["output"], prices[name]["hosting"], "replay",
        )  # fmt: skip


def test_pool_config_errors_name_the_problem() -> None:
    cfg = load_pool_config("routellm-replay")
    bad_model = {**cfg, "workers": [{**cfg["workers"][0], "model": "gpt-5"}]}
    with pytest.raises(PoolConfigError, match="no recordings of model 'gpt-5'"):
        build_pool(bad_model)
    with pytest.raises(PoolConfigError, match="normalise must be true or false"):
        build_pool({**cfg, "normalise": "no"})
    with pytest.raises(PoolConfigError, match="tokens_per_s must be > 0"):
        build_pool({**cfg, "workers": [{**cfg["workers"][1], "tokens_per_s": 0}]})
    raw = build_pool(cfg, normalise=False)
    assert all(isinstance(w, ReplayWorker) and not w.normalise for w in raw.workers)
