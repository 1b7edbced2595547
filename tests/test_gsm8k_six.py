"""The six-model GSM8K recordings pool: the shipped file is what its builder makes from the sources,
joins every question, keeps every response text, states a fixed split that every consumer
honours, and replays each model's recorded accuracy exactly."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.tasks.graders import grade
from rl_conductor.tasks.gsm8k_six import DATASET, OPENAI_SYSTEMS, RECORDINGS, build_items, split_for
from rl_conductor.tasks.recordings_format import dataset_name, load_recordings
from rl_conductor.tasks.routellm import RECORDED_MODELS, recording
from rl_conductor.workers.base import CallContext
from rl_conductor.workers.pool import load_pool, load_pool_config
from rl_conductor.workers.replay import ReplayWorker

MODELS = (*RECORDED_MODELS, *OPENAI_SYSTEMS)


def test_the_file_has_every_gsm8k_question_six_texts_and_a_fixed_split() -> None:
    rec = load_recordings(RECORDINGS)
    gsm8k = {t.id: t for t in load_tasks("gsm8k")}
    assert len(rec.tasks) == len(gsm8k) == 1319
    assert set(rec.models) == set(MODELS)
    for t in rec.tasks:
        base = gsm8k[t.id]
        assert (t.question, t.answer, t.grader, t.domain) == (base.question, base.answer, "math", "math")
        assert t.metadata["split"] == split_for(t.id)
        for m in MODELS:
            r = rec.get(t.id, m)
            assert r is not None and r.text and r.correct is not None and r.output_tokens
        for m in RECORDED_MODELS:  # RouteLLM's texts and labels, unchanged
            routellm = recording(t.id, m)
            assert routellm is not None and (rec.get(t.id, m).text, rec.get(t.id, m).correct) == (
                routellm.text,
                routellm.correct,
            )
    counts = Counter(t.metadata["split"] for t in rec.tasks)
    assert 0.55 < counts["train"] / 1319 < 0.65 and 0.20 < counts["test"] / 1319 < 0.30


def test_every_split_consumer_reads_the_files_split() -> None:
    rec = load_recordings(RECORDINGS)
    for split in ("train", "validation", "test"):
        want = [t.id for t in rec.tasks if t.metadata["split"] == split]
        assert [t.id for t in load_tasks(DATASET, split)] == want
        assert [t.id for t in load_tasks(dataset_name(RECORDINGS), split)] == want
    pool = load_pool("gsm8k-six")
    assert pool.options["default_dataset"] == DATASET
    # the hash split of the ids is another partition: the file's field is what decides
    from rl_conductor.tasks.datasets import split_of

    assert any(split_of(t.id) != t.metadata["split"] for t in rec.tasks)


def test_builder_reproduces_the_shipped_file_from_the_sources(tmp_path: Path) -> None:
    """The OpenAI source is rebuilt here from the shipped file itself (the original lives outside
    the package); a question the builder cannot join is counted, not silently dropped."""
    rec = load_recordings(RECORDINGS)
    src = tmp_path / "example_model_solutions.jsonl"
    lines = []
    for t in rec.tasks:
        row = {"question": t.question, "ground_truth": f"...\nA: {t.answer}"}
        for name, key in OPENAI_SYSTEMS.items():
            r = rec.get(t.id, name)
            row[key] = {"is_correct": r.correct, "solution": r.text}
        lines.append(json.dumps(row))
    lines.append(
        json.dumps({"question": "Not a GSM8K question?", **{k: {} for k in OPENAI_SYSTEMS.values()}})
    )
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    items, stats = build_items(src)
    assert stats == {"openai_rows": 1320, "openai_unmatched": 1, "gsm8k_questions": 1319, "items": 1319,
                     "routellm_missing": 0}  # fmt: skip
    shipped = [json.loads(line) for line in _lines(rec.path)]
    assert items == shipped


def _lines(path: str) -> list[str]:
    import gzip

    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [line for line in fh if line.strip()]


def test_project_grader_agrees_with_openais_labels() -> None:
    """OpenAI's systems end with "A: <number>"; the math grader reads that as the answer (it read
    "A: 18" as the ratio a/18 before, and agreed with 577 of 1,319 labels of the 175B verifier)."""
    rec = load_recordings(RECORDINGS)
    tasks = rec.tasks[::4]
    for name in OPENAI_SYSTEMS:
        disagree = [t.id for t in tasks if grade(t, rec.get(t.id, name).text) != rec.get(t.id, name).correct]
        assert disagree == [], name


@pytest.mark.parametrize("name", MODELS)
async def test_replay_gives_each_models_recorded_accuracy_and_keeps_the_text(name: str) -> None:
    pool = load_pool("gsm8k-six")
    worker = pool.get(name)
    assert isinstance(worker, ReplayWorker)
    rec = load_recordings(RECORDINGS)
    tasks = load_tasks(DATASET, "test")
    msgs = [{"role": "user", "content": "Solve it."}]
    correct = 0
    for t in tasks:
        c = await worker.complete(msgs, max_tokens=4096, temperature=0.0, context=CallContext(t))
        raw = rec.get(t.id, name).text
        assert c.text.startswith(raw.rstrip())  # the full recorded text (a final line at most added)
        correct += grade(t, c.text)
        assert c.cost_usd == pytest.approx(worker.info.cost(c.input_tokens, c.output_tokens))
    assert correct == sum(bool(rec.get(t.id, name).correct) for t in tasks)


def test_pool_prices_follow_the_documented_rule() -> None:
    workers = {w["name"]: w for w in load_pool_config("gsm8k-six")["workers"]}
    prices = json.loads(
        (Path(__file__).parents[1] / "src/rl_conductor/data/calibration/worker_prices.json").read_text()
    )["workers"]
    for name in RECORDED_MODELS:
        assert (workers[name]["price_in"], workers[name]["price_out"]) == (
            prices[name]["input"],
            prices[name]["output"],
        )
    for size in ("6b", "175b"):  # best of 100 samples, each scored by a verifier of the same size
        base = workers[f"gpt3-{size}-finetuned"]
        verifier = workers[f"gpt3-{size}-verifier"]
        assert verifier["price_in"] == pytest.approx(200 * base["price_in"])
        assert verifier["price_out"] == pytest.approx(100 * base["price_out"] + 100 * base["price_in"])
        assert verifier["hosting"] == base["hosting"]


def test_a_task_of_the_file_is_a_plain_task() -> None:
    t = load_tasks(DATASET, "test", limit=1)[0]
    assert isinstance(t, Task) and Task.from_dict(t.to_dict()).metadata["split"] == "test"
