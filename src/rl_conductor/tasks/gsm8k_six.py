"""The six-model GSM8K recordings: six real systems' full solutions to the same 1,319 questions.

Why: a replay pool measures routing on real outputs, and an adaptive policy (one that reads
the first answers and decides whether to ask again) needs the response *texts* of several
models on the same items to compare them. This joins two public recordings of GSM8K test:

* lm-sys/RouteLLM's responses of ``gpt-4-1106-preview`` and ``Mixtral-8x7B-Instruct``
  (already in the package, :mod:`rl_conductor.tasks.routellm`);
* openai/grade-school-math's ``example_model_solutions.jsonl`` (MIT): GPT-3-family models of
  6B and 175B parameters, each fine-tuned on GSM8K (one sample) and verifier-reranked (100
  samples scored by a trained verifier, the best one kept), Cobbe et al. 2021.

The shipped file (``data/recorded/gsm8k_six_responses.jsonl.gz``, built by :func:`main`) is in
the bring-your-own recordings format (:mod:`rl_conductor.tasks.recordings_format`): items are the
``gsm8k`` Tasks (same ids, questions and gold), joined by question text with whitespace
normalised; every response keeps its recorded text and its source's correctness label, and
``output_tokens`` estimated from the text by :func:`rl_conductor.trace.estimate_tokens`
(about 4 characters a token: no tokenizer of these models runs offline). Each item carries a
fixed ``split`` (60/15/25 train/validation/test from a seeded SHA-256 of its id), so every
consumer sees the same partition. Prices live in the pool file (``configs/pools/gsm8k-six.yaml``;
their reasoning in ``docs/recordings.md``), not in the recordings.

Registered dataset: ``gsm8k-six`` (the pool's default dataset).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.recordings_format import (
    PACKAGE_PREFIX,
    RecordedResponse,
    item_dict,
    load_recordings,
    write_recordings,
)
from rl_conductor.tasks.registry import hash_fraction, load_tasks, register_dataset
from rl_conductor.tasks.routellm import RECORDED_MODELS, recording
from rl_conductor.trace import estimate_tokens

FILE = "gsm8k_six_responses.jsonl.gz"
#: The recordings path of the shipped file (``package:`` = ``rl_conductor/data/recorded/``).
RECORDINGS = PACKAGE_PREFIX + FILE
DATASET = "gsm8k-six"
#: Worker name -> the key of that system in OpenAI's example_model_solutions.jsonl.
OPENAI_SYSTEMS: dict[str, str] = {
    "gpt3-6b-finetuned": "6b_finetuning",
    "gpt3-6b-verifier": "6b_verification",
    "gpt3-175b-finetuned": "175b_finetuning",
    "gpt3-175b-verifier": "175b_verification",
}
#: Cumulative bounds of train and validation (the rest is test): 60/15/25.
SPLIT_BOUNDS = (0.60, 0.75)
SPLIT_SALT = "gsm8k-six/0"


def _norm(text: str) -> str:
    return " ".join(text.split())


def split_for(task_id: str) -> str:
    """The fixed split written into the file: a seeded hash of the id, 60/15/25."""
    h = hash_fraction(f"{SPLIT_SALT}:{task_id}")
    return "train" if h < SPLIT_BOUNDS[0] else "validation" if h < SPLIT_BOUNDS[1] else "test"


def _response(text: str, correct: bool) -> RecordedResponse:
    return RecordedResponse(text=text, correct=correct, output_tokens=estimate_tokens(text))


def build_items(openai_solutions: Path) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Items of the six-model file from OpenAI's solutions file and RouteLLM's package copy;
    returns them and the join's counts (rows read, rows that matched no GSM8K question)."""
    gsm8k = load_tasks("gsm8k")
    by_question = {_norm(t.question): t for t in gsm8k}
    openai: dict[str, dict[str, Any]] = {}
    rows = unmatched = 0
    with openai_solutions.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            rows += 1
            row = json.loads(line)
            task = by_question.get(_norm(row["question"]))
            if task is None or task.id in openai:
                unmatched += 1
                continue
            openai[task.id] = row
    items, missing_routellm = [], 0
    for task in gsm8k:
        row = openai.get(task.id)
        if row is None:
            continue
        responses: dict[str, RecordedResponse] = {}
        for model in RECORDED_MODELS:
            rec = recording(task.id, model)
            if rec is None or rec.text is None:
                missing_routellm += 1
                continue
            responses[model] = _response(rec.text, rec.correct)
        for name, key in OPENAI_SYSTEMS.items():
            responses[name] = _response(str(row[key]["solution"]), bool(row[key]["is_correct"]))
        item_task = Task(**{**task.to_dict(), "metadata": {**task.metadata, "split": split_for(task.id)}})
        items.append(item_dict(item_task, responses))
    stats = {
        "openai_rows": rows,
        "openai_unmatched": unmatched,
        "gsm8k_questions": len(gsm8k),
        "items": len(items),
        "routellm_missing": missing_routellm,
    }
    return items, stats


@register_dataset(DATASET)
def load_gsm8k_six() -> list[Task]:
    """The shipped six-model file's items (each with its fixed ``split``)."""
    return list(load_recordings(RECORDINGS).tasks)


def _default_out() -> Path:
    from importlib import resources

    return Path(str(resources.files("rl_conductor").joinpath("data", "recorded", FILE)))


def main(argv: list[str] | None = None) -> None:
    """``python -m rl_conductor.tasks.gsm8k_six SOLUTIONS [--out FILE]``: (re)build the file."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("solutions", type=Path, help="openai/grade-school-math example_model_solutions.jsonl")
    parser.add_argument("--out", type=Path, default=_default_out())
    args = parser.parse_args(argv)
    items, stats = build_items(args.solutions)
    write_recordings(args.out, items)
    print(json.dumps({**stats, "out": str(args.out)}))


if __name__ == "__main__":
    main()
