"""RouteLLM's recorded benchmarks: GSM8K and MMLU-STEM items that two real models answered.

lm-sys/RouteLLM published, per benchmark item, whether ``gpt-4-1106-preview`` and
``mistralai/Mixtral-8x7B-Instruct-v0.1`` got it right (and, for GSM8K, their full responses).
This module joins those recordings to the project's own Tasks so that the replay worker pool
(:mod:`rl_conductor.workers.replay`) can answer an item with what the real model said.

Registered datasets (every one in the catalog, :func:`rl_conductor.tasks.datasets.load_tasks`):

* ``routellm-gsm8k``: the ``gsm8k`` tasks with a recording. Joined by question text with
  whitespace normalised; all 1,319 recorded rows match.
* ``routellm-mmlu``: the ``mmlu_stem`` tasks with a recording. RouteLLM recorded all 57 MMLU
  subjects (14,042 questions) but without the gold letter, so only the 18 STEM subjects, whose
  gold ``mmlu_stem`` has, are usable; only their 18 CSVs ship. A row matches a task of the same
  subject whose question text (stem plus lettered options, whitespace normalised) is equal;
  identical duplicate questions are paired in file order. All 3,018 STEM rows match.
* ``routellm``: both.

The Tasks are the very Tasks of ``gsm8k`` / ``mmlu_stem`` (same ids, same split, same source),
so a replay pool also answers those datasets directly. Recordings are deliberately *not* put in
``Task.metadata`` (the policy sees Tasks): they live here, keyed by task id, and only the replay
worker reads them (:func:`recording`).

Simplifications: everything is loaded at first use and cached for the process; a recorded row
that matches no task is dropped and counted in :func:`join_stats`.
"""

from __future__ import annotations

import csv
import functools
import gzip
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.builtin import format_choices
from rl_conductor.tasks.registry import load_tasks, register_dataset

#: Project worker name -> the column name RouteLLM used for that model.
RECORDED_MODELS: dict[str, str] = {
    "gpt-4-1106-preview": "gpt-4-1106-preview",
    "mixtral-8x7b-instruct": "mistralai/Mixtral-8x7B-Instruct-v0.1",
}
GSM8K_FILE = "routellm_gsm8k_responses.csv.gz"
MMLU_DIR = "routellm_mmlu"
#: pandas wrote the literal option text "None" as "nan" in RouteLLM's MMLU CSVs.
_CSV_NAN = {"nan": "None"}
_LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class RecordedAnswer:
    """One model's recorded answer to one item.

    Attributes:
        correct: RouteLLM's correctness label (authoritative for replay).
        text: the full response (GSM8K); None where only the label was recorded (MMLU).
    """

    correct: bool
    text: str | None


@dataclass(frozen=True)
class JoinStats:
    """How many recorded rows were read and how many matched a task, per benchmark."""

    gsm8k_rows: int
    gsm8k_matched: int
    mmlu_rows: int
    mmlu_matched: int


def _norm(text: str) -> str:
    return " ".join(text.split())


def _recorded_path(*parts: str) -> Traversable:
    return resources.files("rl_conductor").joinpath("data", "recorded", *parts)


def _read_csv(ref: Traversable) -> list[dict[str, str]]:
    with ref.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _label(value: str, where: str) -> bool:
    if value not in ("True", "False"):
        raise ValueError(f"{where}: correctness must be True or False, got {value!r}")
    return value == "True"


def _answers(row: dict[str, str], where: str, *, with_text: bool) -> dict[str, RecordedAnswer]:
    return {
        name: RecordedAnswer(
            correct=_label(row[column], f"{where} {column}"),
            text=row[f"{column}_response"] if with_text else None,
        )
        for name, column in RECORDED_MODELS.items()
    }


@functools.lru_cache(maxsize=1)
def _gsm8k() -> tuple[tuple[Task, ...], dict[str, dict[str, RecordedAnswer]], int]:
    by_question = {_norm(t.question): t for t in load_tasks("gsm8k")}
    tasks: list[Task] = []
    recs: dict[str, dict[str, RecordedAnswer]] = {}
    rows = _read_csv(_recorded_path(GSM8K_FILE))
    for i, row in enumerate(rows):
        task = by_question.get(_norm(row["prompt"]))
        if task is None or task.id in recs:
            continue
        recs[task.id] = _answers(row, f"{GSM8K_FILE} row {i}", with_text=True)
        tasks.append(task)
    return tuple(tasks), recs, len(rows)


def _mmlu_prompt(prompt: str) -> tuple[str, list[str]] | None:
    """Split RouteLLM's ``stem\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer:`` into stem and options."""
    body = prompt.rstrip()
    if not body.endswith("Answer:"):
        return None
    body = body[: -len("Answer:")].rstrip("\n")
    options: list[str] = []
    for letter in reversed(_LETTERS):
        head, sep, option = body.rpartition(f"\n{letter}. ")
        if not sep:
            return None
        options.append(_CSV_NAN.get(option.strip(), option.strip()))
        body = head
    return body, options[::-1]


def _mmlu_subjects() -> list[str]:
    names = [p.name for p in _recorded_path(MMLU_DIR).iterdir() if p.name.endswith(".csv.gz")]
    return sorted(n[len("mmlu_") : -len(".csv.gz")] for n in names)


@functools.lru_cache(maxsize=1)
def _mmlu() -> tuple[tuple[Task, ...], dict[str, dict[str, RecordedAnswer]], int]:
    base = load_tasks("mmlu_stem")
    queue: dict[tuple[str, str], list[Task]] = defaultdict(list)
    for task in base:
        queue[(str(task.metadata.get("subject", "")), _norm(task.question))].append(task)
    recs: dict[str, dict[str, RecordedAnswer]] = {}
    n_rows = 0
    for subject in _mmlu_subjects():
        filename = f"mmlu_{subject}.csv.gz"
        for i, row in enumerate(_read_csv(_recorded_path(MMLU_DIR, filename))):
            n_rows += 1
            parsed = _mmlu_prompt(row["prompt"])
            waiting = queue.get((subject, _norm(format_choices(*parsed)))) if parsed else None
            if waiting:  # identical duplicate questions are paired in file order
                recs[waiting.pop(0).id] = _answers(row, f"{filename} row {i}", with_text=False)
    tasks = tuple(t for t in base if t.id in recs)  # in the order of ``mmlu_stem``
    return tasks, recs, n_rows


@register_dataset("routellm-gsm8k")
def load_routellm_gsm8k() -> list[Task]:
    """GSM8K test items that RouteLLM recorded both models on (the ``gsm8k`` Tasks, same ids)."""
    return list(_gsm8k()[0])


@register_dataset("routellm-mmlu")
def load_routellm_mmlu() -> list[Task]:
    """MMLU STEM items that RouteLLM recorded both models on (the ``mmlu_stem`` Tasks, same ids)."""
    return list(_mmlu()[0])


@register_dataset("routellm")
def load_routellm() -> list[Task]:
    """``routellm-gsm8k`` followed by ``routellm-mmlu``."""
    return [*_gsm8k()[0], *_mmlu()[0]]


def recording(task_id: str, model: str) -> RecordedAnswer | None:
    """``model``'s recorded answer to the task ``task_id``, or None when there is none."""
    if model not in RECORDED_MODELS:
        raise KeyError(f"no recordings of model {model!r}; recorded: {sorted(RECORDED_MODELS)}")
    for loader in (_gsm8k, _mmlu):
        per_model = loader()[1].get(task_id)
        if per_model is not None:
            return per_model[model]
    return None


def join_stats() -> JoinStats:
    """Rows read from the shipped recordings and rows joined to a task, per benchmark."""
    g_tasks, _, g_rows = _gsm8k()
    m_tasks, _, m_rows = _mmlu()
    return JoinStats(
        gsm8k_rows=g_rows, gsm8k_matched=len(g_tasks), mmlu_rows=m_rows, mmlu_matched=len(m_tasks)
    )
