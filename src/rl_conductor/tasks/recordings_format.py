"""Bring-your-own recordings: one file format for what real models answered to benchmark items.

A recordings file is JSON Lines (optionally gzipped: ``.jsonl.gz``), one item per line::

    {"id": "support/0042",                   # unique item id (required)
     "question": "How many ...?",            # the text workers see (required)
     "answer": "18",                         # gold answer (required unless every response has `correct`)
     "grader": "math",                       # math | choice | qa | code (default qa)
     "domain": "math",                       # math | knowledge | reasoning | code (default reasoning)
     "source": "my-logs",                    # optional (default: the file's name)
     "metadata": {"choices": ["..."]},       # optional: what the grader needs (choices, tests, ...)
     "split": "train",                       # optional: train | validation | test (default: id hash)
     "responses": {                          # per model, at least one
        "gpt-4o": {"text": "... #### 18",    # the response (optional if `correct` is given)
                   "correct": true,           # correctness label (optional if `text` is given)
                   "input_tokens": 80,        # optional; estimated when absent
                   "output_tokens": 120,      # optional; estimated from the text when absent
                   "cost_usd": 0.0012,        # optional; priced from the pool file when absent
                   "latency_s": 1.3}}}        # optional; nominal latency model when absent

A pool YAML names the file and the models (see ``docs/recordings.md``); the file's items become
the dataset ``recordings:<path>`` (the pool's default dataset). An item's ``split`` field puts it
in that split; items without one are split 70/10/20 by id hash like every other dataset
(:func:`rl_conductor.tasks.datasets.split_of_task`). A path ``package:<file>`` names a file
shipped under ``rl_conductor/data/recorded/`` (the built-in ``gsm8k-six`` pool's), so its dataset
name is the same on every machine. RouteLLM's recordings (:mod:`rl_conductor.tasks.routellm`) are one instance
of this shape: text and label for GSM8K, label only for MMLU (``tests/test_recordings.py`` writes
them out in this format and checks that a pool over that file answers as the built-in one).

Items the project cannot grade itself — no gold ``answer``, or a ``code`` item without
``metadata.tests`` — replay as recorded: every response must then carry ``correct`` (else the
load fails with one line saying what to add), and the item's grader becomes ``recorded``
(:class:`rl_conductor.tasks.graders.RecordedGrader`), which returns the recorded label of the
text a worker answered (``metadata.recorded_labels``: a digest of each recorded text, or of its
stand-in where only a label was recorded, :func:`stand_in`; the original grader is kept as
``metadata.recorded_grader``). A text no model recorded (for example one cut by ``max_tokens``)
grades wrong.

Validation is strict and early: a malformed line is an error naming the file and line.
Simplification: the whole file is read at first use and cached for the process (by path and
modification time).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_conductor.tasks.base import Task
from rl_conductor.validation import DATA_SPLITS

PREFIX = "recordings:"
#: The grader of items the file gives no way to grade (no gold answer; code without tests):
#: their recorded ``correct`` labels are the grades (:class:`rl_conductor.tasks.graders.RecordedGrader`).
RECORDED_GRADER = "recorded"
#: A recordings path ``package:<file>`` names ``rl_conductor/data/recorded/<file>``.
PACKAGE_PREFIX = "package:"
DEFAULT_GRADER = "qa"
DEFAULT_DOMAIN = "reasoning"
_RESPONSE_KEYS = {"text", "correct", "input_tokens", "output_tokens", "cost_usd", "latency_s"}
#: an item's fields (anything else of the user's goes under ``metadata``): a misspelt one
#: (``splt``, ``gold_answer``) had been ignored, putting held-out items in training or making
#: every item gold-less without a word
_ITEM_KEYS = {"id", "question", "answer", "grader", "domain", "source", "split", "metadata", "responses"}
#: the loader's own metadata keys: an item's split, and the split it stated where its validation
#: split was carved from train (:func:`rl_conductor.tasks.registry.carve_validation`)
CARVED_FROM = "rl_conductor.carved_from"
_LOADER_METADATA = ("split", CARVED_FROM, "recorded_labels", "recorded_wrong_texts")


class RecordingsError(ValueError):
    """A recordings file is malformed; the message names the file and line."""


@dataclass(frozen=True)
class RecordedResponse:
    """One model's recorded response to one item (see the module docstring for the fields)."""

    text: str | None
    correct: bool | None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True, eq=False)
class Recordings:
    """The items of one recordings file and every model's responses, keyed by item id."""

    path: str
    tasks: tuple[Task, ...]
    responses: dict[str, dict[str, RecordedResponse]]
    models: tuple[str, ...]

    def get(self, task_id: str, model: str) -> RecordedResponse | None:
        return self.responses.get(task_id, {}).get(model)


def _open_lines(path: Path) -> Iterator[str]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8-sig") as fh:  # -sig: a byte-order mark is read past
            yield from fh
    else:
        with path.open(encoding="utf-8-sig") as fh:
            yield from fh


def _int(value: Any, where: str, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RecordingsError(f"{where}: {key} must be an integer >= 0, got {value!r}")
    return value


def _float(value: Any, where: str, key: str) -> float | None:
    if value is None:
        return None
    # NaN and Infinity parse as JSON numbers in Python; neither is a cost or a latency
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise RecordingsError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
    return float(value)


def _nearest(unknown: list[str], known: set[str]) -> str:
    """``: 'splt' (did you mean 'split'?)`` for each unknown field close to a known one."""
    import difflib

    hints = [
        f"{k!r} (did you mean {m[0]!r}?)"
        for k in unknown
        if (
            m := difflib.get_close_matches(str(k), known, 1)
            or difflib.get_close_matches(str(k).lower(), known, 1)
        )
    ]
    return f": {', '.join(hints)}" if hints else ""


def parse_response(raw: Any, where: str) -> RecordedResponse:
    if not isinstance(raw, dict):
        raise RecordingsError(f"{where}: a response must be an object")
    unknown = sorted(set(raw) - _RESPONSE_KEYS)
    if unknown:
        raise RecordingsError(
            f"{where}: unknown response fields {unknown}{_nearest(unknown, _RESPONSE_KEYS)}; "
            f"known: {sorted(_RESPONSE_KEYS)}"
        )
    text, correct = raw.get("text"), raw.get("correct")
    if text is not None and not isinstance(text, str):
        raise RecordingsError(f"{where}: text must be a string")
    if correct is not None and not isinstance(correct, bool):
        raise RecordingsError(f"{where}: correct must be true or false")
    if text is None and correct is None:
        raise RecordingsError(f"{where}: a response needs `text`, `correct`, or both")
    return RecordedResponse(
        text=text,
        correct=correct,
        input_tokens=_int(raw.get("input_tokens"), where, "input_tokens"),
        output_tokens=_int(raw.get("output_tokens"), where, "output_tokens"),
        cost_usd=_float(raw.get("cost_usd"), where, "cost_usd"),
        latency_s=_float(raw.get("latency_s"), where, "latency_s"),
    )


def _why_not_gradable(
    grader: str, answer: Any, metadata: dict[str, Any], responses: dict[str, RecordedResponse]
) -> str | None:
    """Why the item's own grader cannot grade it (None when it can). A code item with tests but
    no reference solution cannot replay a label-only "right": no text that passes them can be made."""
    if grader == "code":
        if not metadata.get("tests"):
            return "a code item without `metadata.tests`"
        if not str(answer or "").strip() and any(r.text is None and r.correct for r in responses.values()):
            return "a code item without a reference solution (`answer`) and with label-only right answers"
        return None
    return None if answer is not None and str(answer).strip() else "an item without a gold `answer`"


def choice_gold(answer: Any, metadata: dict[str, Any], where: str) -> str:
    """A multiple-choice item's gold as the option letter the grader compares with: ``C``, ``c``,
    ``(C)``, ``C.``, ``C)`` or the text of one of ``metadata.choices``. Anything else would grade
    every answer wrong, a label-only "right" included: a one-line error naming the item instead."""
    from rl_conductor.tasks.graders import option_letters

    choices = metadata.get("choices")
    texts = [str(c).strip() for c in choices] if isinstance(choices, list | tuple) else []
    letters = option_letters(len(texts))
    gold = str(answer).strip()
    m = re.fullmatch(r"\(?([A-Za-z])\)?[.:)]?", gold)
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    if gold in texts:
        return letters[texts.index(gold)]
    raise RecordingsError(
        f"{where}: grader 'choice' needs `answer` to be an option letter ({letters[0]}-{letters[-1]}"
        f"{' for its ' + str(len(texts)) + ' choices' if texts else ''}) or one of `metadata.choices`, "
        f"got {answer!r}"
    )


def _what_to_add(grader: str) -> str:
    return "its tests (`metadata.tests`)" if grader == "code" else "a gold `answer`"


def stand_in(task_id: str, model: str) -> str:
    """The text a replay worker answers with where only a label was recorded and no gold exists:
    an opaque line that says nothing about the label (a Conductor reading answers must not learn
    it from the text); :data:`RECORDED_GRADER` grades it as recorded."""
    from rl_conductor.tasks.graders import STAND_IN_PREFIX

    digest = hashlib.sha256(f"{task_id}|{model}".encode()).hexdigest()[:12]
    return f"{STAND_IN_PREFIX}{digest}]"


def _labels(task_id: str, parsed: dict[str, RecordedResponse], where: str | None = None) -> dict[str, bool]:
    """``text_key(text) -> label`` for every labelled response's text (its stand-in when it has
    none, :func:`stand_in`, which a replay worker answers with where no text grading as its label
    can be made). A text two models recorded with different labels fails at ``where`` (no gold:
    the text must decide); with ``where`` None it is left out (a code item: its tests decide)."""
    from rl_conductor.tasks.graders import text_key

    labels: dict[str, bool] = {}
    clash: set[str] = set()
    for model, r in parsed.items():
        if r.correct is None:
            continue
        key = text_key(r.text if r.text is not None else stand_in(task_id, model))
        if labels.get(key, r.correct) != r.correct:
            if where is not None:
                raise RecordingsError(
                    f"{where}: two models recorded the same text with different `correct` labels; "
                    "without a gold answer the text must decide"
                )
            clash.add(key)
        labels[key] = r.correct
    return {k: v for k, v in labels.items() if k not in clash}


def parse_item(row: Any, where: str, *, default_source: str) -> tuple[Task, dict[str, RecordedResponse]]:
    """One line of a recordings file as a Task and its responses."""
    from rl_conductor.tasks.graders import GRADERS

    if not isinstance(row, dict):
        raise RecordingsError(f"{where}: each line must be a JSON object")
    unknown = sorted(set(row) - _ITEM_KEYS)
    if unknown:
        raise RecordingsError(
            f"{where}: unknown item fields {unknown}{_nearest(unknown, _ITEM_KEYS)}; "
            f"known: {sorted(_ITEM_KEYS)} (put anything else under `metadata`)"
        )
    for key in ("id", "question"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise RecordingsError(f"{where}: `{key}` is required and must be a non-empty string")
    grader = row.get("grader", DEFAULT_GRADER)
    if grader == RECORDED_GRADER:
        raise RecordingsError(
            f"{where}: grader {RECORDED_GRADER!r} is the loader's: give the item's own grader and leave "
            "`answer` out to replay the `correct` labels as recorded"
        )
    if grader not in GRADERS:
        raise RecordingsError(
            f"{where}: unknown grader {grader!r}; known: {sorted(set(GRADERS) - {RECORDED_GRADER})}"
        )
    responses = row.get("responses")
    if not isinstance(responses, dict) or not responses:
        raise RecordingsError(f"{where}: `responses` must map model names to responses (at least one)")
    parsed = {str(m): parse_response(r, f"{where} model {m!r}") for m, r in responses.items()}
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise RecordingsError(f"{where}: metadata must be an object")
    taken = [k for k in _LOADER_METADATA if k in metadata]
    if taken:  # `metadata.split` had silently been the item's split (and written back as one)
        raise RecordingsError(
            f"{where}: metadata field(s) {taken} are the loader's; give the item's split as the "
            "top-level `split` field and each response's label as its `correct`"
        )
    for key in ("domain", "source"):  # an empty label fails later, after minutes of training
        if key in row and (not isinstance(row[key], str) or not row[key].strip()):
            raise RecordingsError(f"{where}: `{key}`, when given, must be a non-empty string")
    choices = metadata.get("choices")
    named = isinstance(choices, list) and all(
        isinstance(c, str | int | float) and not isinstance(c, bool) for c in choices
    )
    if choices is not None and not named:  # a string would silently be no choices: nothing to grade by
        shown = repr(choices)[:80]
        raise RecordingsError(f"{where}: `metadata.choices` must be a list of option texts, got {shown}")
    split = row.get("split")
    if split is not None:
        if split not in DATA_SPLITS:
            raise RecordingsError(f"{where}: split must be one of {', '.join(DATA_SPLITS)}, got {split!r}")
        metadata = {**metadata, "split": split}
    answer = row.get("answer")
    if grader == "choice" and answer is not None and str(answer).strip():
        answer = choice_gold(answer, metadata, where)
    gradable = _why_not_gradable(grader, answer, metadata, parsed)
    if gradable is not None:  # no gold to grade against: the recorded labels are the grades
        unlabelled = sorted(m for m, r in parsed.items() if r.correct is None)
        if unlabelled:
            raise RecordingsError(
                f"{where}: {gradable}, so every response needs `correct` (missing for "
                f"{', '.join(map(repr, unlabelled))}); add {_what_to_add(grader)} or those labels"
            )
        metadata = {
            **metadata,
            "recorded_grader": grader,
            "recorded_labels": _labels(row["id"], parsed, where),
        }
        grader = RECORDED_GRADER
    elif grader == "code" and any(r.correct is not None for r in parsed.values()):
        # a recorded code text grades as its label: a program whose tests disagree with its label
        # here (another harness, a timeout) could not replay as recorded, and labels are
        # authoritative; other texts (unlabelled responses, live answers) run the tests
        metadata = {
            **metadata,
            "recorded_labels": _labels(row["id"], parsed),
            "recorded_wrong_texts": tuple(
                r.text for r in parsed.values() if r.text is not None and r.correct is False
            ),
        }
    task = Task(
        id=row["id"],
        question=row["question"],
        answer="" if answer is None else str(answer),
        domain=str(row.get("domain", DEFAULT_DOMAIN)),
        source=str(row.get("source", default_source)),
        grader=grader,
        metadata=metadata,
    )
    return task, parsed


@functools.lru_cache(maxsize=32)
def _load(path: str, mtime_ns: int) -> Recordings:
    p = Path(path)
    tasks: list[Task] = []
    responses: dict[str, dict[str, RecordedResponse]] = {}
    models: dict[str, None] = {}
    source = p.name.split(".")[0]
    for n, line in enumerate(_open_lines(p), start=1):
        if not line.strip():
            continue
        where = f"{p}:{n}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise RecordingsError(f"{where}: not JSON ({exc})") from None
        task, parsed = parse_item(row, where, default_source=source)
        if task.id in responses:
            raise RecordingsError(f"{where}: duplicate item id {task.id!r}")
        tasks.append(task)
        responses[task.id] = parsed
        models.update(dict.fromkeys(parsed))
    if not tasks:
        raise RecordingsError(f"{p}: no items")
    return Recordings(path=str(p), tasks=tuple(tasks), responses=responses, models=tuple(models))


def resolve_path(path: str | Path) -> Path:
    """The file a recordings path names: ``package:<file>`` under ``rl_conductor/data/recorded/``,
    anything else relative to the working directory."""
    text = str(path)
    if text.startswith(PACKAGE_PREFIX):
        from importlib import resources

        name = text[len(PACKAGE_PREFIX) :]
        return Path(str(resources.files("rl_conductor").joinpath("data", "recorded", name)))
    return Path(text).expanduser().resolve()


def load_recordings(path: str | Path) -> Recordings:
    """Read (and cache) a recordings file (a path, or ``package:<file>``).

    Raises:
        FileNotFoundError: no such file. RecordingsError: a malformed line.
    """
    p = resolve_path(path)
    if not p.is_file():
        raise FileNotFoundError(f"recordings file {path} does not exist")
    return _load(str(p), p.stat().st_mtime_ns)


def text_share(path: str | Path) -> float | None:
    """The share of a recordings file's responses that keep their text: what decides whether a
    Conductor can read answers there (``train``'s note)."""
    rec = load_recordings(path)
    kept = [r.text is not None for by_model in rec.responses.values() for r in by_model.values()]
    return sum(kept) / len(kept) if kept else None


def dataset_name(path: str | Path) -> str:
    """The dataset name under which a recordings file's items load: ``recordings:<abs path>``,
    or ``recordings:package:<file>`` for a shipped file (the same name on every machine)."""
    text = str(path)
    if text.startswith(PACKAGE_PREFIX):
        return PREFIX + text
    return PREFIX + str(Path(text).expanduser().resolve())


def recordings_tasks(name: str) -> list[Task]:
    """The Tasks of dataset ``recordings:<path>`` (the loader behind :func:`load_tasks`)."""
    return list(load_recordings(name[len(PREFIX) :]).tasks)


def write_recordings(path: str | Path, items: Iterable[dict[str, Any]]) -> int:
    """Write items (dicts in the file format) as JSON Lines (gzipped for ``.gz``); returns the count."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "wt", encoding="utf-8") as fh:
        for item in items:
            fh.write(json.dumps(item, ensure_ascii=False) + "\n")
            n += 1
    return n


def item_dict(task: Task, responses: dict[str, RecordedResponse]) -> dict[str, Any]:
    """One line of a recordings file for ``task`` (its ``split`` field when the task has one)."""
    metadata = dict(task.metadata)
    split = metadata.pop("split", None)
    if CARVED_FROM in metadata:  # a validation split carved from train: what the file said
        split = metadata.pop(CARVED_FROM)
    grader, answer = task.grader, task.answer
    if grader == RECORDED_GRADER:  # back to what the file said: the labels are the responses'
        grader = str(metadata.pop("recorded_grader", DEFAULT_GRADER))
    for key in ("recorded_labels", "recorded_wrong_texts"):  # the loader's (a code item's too)
        metadata.pop(key, None)
    item: dict[str, Any] = {
        "id": task.id,
        "question": task.question,
        "answer": answer or None,
        "grader": grader,
        "domain": task.domain,
        "source": task.source,
        "metadata": metadata,
    }
    if split is not None:
        item["split"] = split
    item["responses"] = {m: r.to_dict() for m, r in responses.items()}
    return item
