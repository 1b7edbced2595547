"""The replay worker pool: real recorded outputs of real models, answered offline.

A replay worker answers a benchmark item with what a real model once answered to it. It reads
the item from ``CallContext.task``; the messages are only counted for input tokens. Recordings
come from a :class:`RecordingSource`:

* a bring-your-own recordings file (pool option ``recordings: path.jsonl``; the format is in
  :mod:`rl_conductor.tasks.recordings_format` and ``docs/recordings.md``): any models, any items, a
  response text and/or a correctness label per model, optional tokens, cost and latency;
* RouteLLM's recordings of ``gpt-4-1106-preview`` and ``Mixtral-8x7B-Instruct`` (the default
  when a pool names no file, :mod:`rl_conductor.tasks.routellm`), one instance of that shape:
  text and label for GSM8K, label only for MMLU.

Recorded tokens, cost and latency are used where a file gives them; the rules below fill in
what it does not (RouteLLM records none of them).

What it deliberately simplifies, and why:

* **Context is ignored.** The recording is one answer to the bare question, so the earlier
  steps a workflow shows a worker, and the step's own instruction, change nothing: a replay
  worker answers every call on an item the same way (``nonce`` too). Multi-step plans therefore
  only add cost on a replay pool; it measures routing (which model for which item), not
  collaboration. The simulated pool models collaboration; only live workers reward good
  instructions.
* **The recorded label is authoritative.** A replayed answer grades as recorded, so a
  single-worker baseline reproduces the recorded accuracy exactly. With text and label: the
  recorded text is returned, and where the project's grader disagrees with the label one
  final-answer line is appended (:data:`CORRECT_LINE` with the gold for a recorded-correct text
  whose answer we do not extract, else ``Answer: gold`` or ``\\boxed{gold}`` when the grader
  reads those; :data:`WRONG_LINE` for a recorded-wrong text we would grade correct; RouteLLM's
  grader read ``#### $20.00`` as 2000 and ``#### 0.84`` as 84, ours reads 20 and 0.84). A pool
  option ``normalise: false`` returns the raw text instead. Label only (RouteLLM's MMLU): the
  answer is synthesised — for multiple choice ``Answer: X``, the gold letter when recorded
  correct, else a wrong letter chosen by a hash of (task id, model); for other graders a final
  answer line with the gold, or :data:`WRONG_LINE`. Text only: returned as is and graded. An
  item with no way to grade it (no gold, code without tests; grader ``recorded``): the recorded
  text, or an opaque stand-in where only a label was recorded
  (:func:`rl_conductor.tasks.recordings_format.stand_in`), graded by the recorded label.
* **Tokens are estimated** where not recorded, with :func:`rl_conductor.workers.base.estimate_tokens` (about 4
  characters per token), for both models, so their costs stay on one scale. No tokenizer of
  GPT-4 (cl100k) works offline: tiktoken's wheel ships no encoding file. Mixtral's does (the
  ``mistral-common`` wheel) and counts more tokens on these texts (it splits digits), so
  Mixtral's token counts here are low (the factor: benchmarks/README.md, measured design
  choices).
  Output tokens: of the returned GSM8K text; for MMLU, where the synthesised text is a stand-in,
  a fixed ``mmlu_output_tokens`` (16 by default: a letter and a short justification). Input
  tokens: of the messages.
* **Latency is nominal**, ``ttft_s + output_tokens / tokens_per_s`` from the pool file, reported
  without sleeping unless the pool option ``latency_scale`` is > 0 (as in the simulated pool).
* **``max_tokens`` cuts** a longer answer to ``max_tokens`` (about 4 characters a token), as a
  real model would stop; the label then no longer applies and the cut text is graded as it is.
  ``temperature`` is ignored (one recorded sample per item).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from dataclasses import dataclass, replace
from typing import Any, Protocol

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.recordings_format import (
    RECORDED_GRADER,
    RecordedResponse,
    RecordingsError,
    dataset_name,
    load_recordings,
    stand_in,
)
from rl_conductor.tasks.routellm import RECORDED_MODELS, recording
from rl_conductor.workers.base import (
    CallWorker,
    Completion,
    WorkerCall,
    WorkerError,
    WorkerInfo,
    estimate_tokens,
    offline_completion,
)
from rl_conductor.workers.kinds import PoolConfigError, info_from_spec, register_kind

#: Appended to a recorded-correct GSM8K text whose final answer the project's grader misses.
CORRECT_LINE = "\n\n#### {gold}"
#: Appended to a recorded-wrong GSM8K text that the project's grader would accept.
WRONG_LINE = "\n\n#### [no valid final answer]"
#: Output tokens charged for a synthesised multiple-choice answer.
MMLU_OUTPUT_TOKENS = 16
#: Characters per token, as in :func:`estimate_tokens`; used to cut text at ``max_tokens``.
CHARS_PER_TOKEN = 4


class RecordingSource(Protocol):
    """Where a replay worker finds recorded responses (a recordings file, RouteLLM's CSVs)."""

    @property
    def models(self) -> tuple[str, ...]: ...

    def get(self, task_id: str, model: str) -> RecordedResponse | None: ...

    def __hash__(self) -> int: ...  # sources key the answer cache (identity hash)


@dataclass(frozen=True, eq=False)
class RouteLLMSource:
    """RouteLLM's shipped recordings (:mod:`rl_conductor.tasks.routellm`) as a source."""

    name: str = "routellm"

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(RECORDED_MODELS)

    def get(self, task_id: str, model: str) -> RecordedResponse | None:
        rec = recording(task_id, model)
        return None if rec is None else RecordedResponse(text=rec.text, correct=rec.correct)


#: The default source of a replay pool that names no recordings file.
ROUTELLM = RouteLLMSource()


@dataclass(frozen=True)
class ReplayAnswer:
    """The text a replay worker returns for one item, before any ``max_tokens`` cut.

    Attributes:
        text: recorded text (possibly with a final-answer line appended) or a synthesised one.
        recorded_correct: the recorded label for this item and model (None: text only).
        normalised: whether a final-answer line was appended so the grader agrees with the label.
        synthesised: whether the text was made up from the label (no text was recorded).
    """

    text: str
    recorded_correct: bool | None
    normalised: bool = False
    synthesised: bool = False


def wrong_letter(task: Task, model: str) -> str:
    """A deterministic wrong option letter for ``task`` (a hash of task id and model)."""
    n = len(task.metadata.get("choices") or ()) or 4
    letters = [chr(ord("A") + i) for i in range(n) if chr(ord("A") + i) != task.answer.strip().upper()]
    digest = hashlib.sha256(f"{task.id}|{model}".encode()).digest()
    return letters[int.from_bytes(digest[:8], "big") % len(letters)]


def _correct_lines(task: Task) -> tuple[str, ...]:
    """Final-answer lines that make a text grade correct, tried in order."""
    gold = task.answer
    return (CORRECT_LINE.format(gold=gold), f"\n\nAnswer: {gold}", f"\n\n\\boxed{{{gold}}}", f"\n\n{gold}")


def _synthesise(task: Task, model: str, correct: bool) -> str:
    from rl_conductor.tasks.graders import grade

    if task.grader == "choice":
        letter = task.answer.strip().upper() if correct else wrong_letter(task, model)
        return f"Answer: {letter}"
    candidates = [line.lstrip() for line in _correct_lines(task)] if correct else [WRONG_LINE.strip()]
    for text in candidates:
        if grade(task, text) == correct:
            return text
    raise WorkerError(
        f"replay worker {model!r}: cannot synthesise an answer to {task.id!r} that grades "
        f"{'correct' if correct else 'wrong'}; record its text"
    )


@functools.lru_cache(maxsize=16384)
def replay_answer(
    task: Task, model: str, normalise: bool = True, source: RecordingSource = ROUTELLM
) -> ReplayAnswer:
    """What ``model`` answers to ``task`` in ``source`` (RouteLLM's recordings by default),
    graded as recorded.

    Raises:
        WorkerError: no recording of this item for this model.
    """
    from rl_conductor.tasks.graders import grade

    rec = source.get(task.id, model)
    if rec is None:
        where = (
            "recorded datasets: routellm-gsm8k, routellm-mmlu (routellm = both)"
            if isinstance(source, RouteLLMSource)
            else f"recordings file {getattr(source, 'path', '?')}"
        )
        raise WorkerError(
            f"replay worker {model!r}: no recording of task {task.id!r} (source {task.source!r}); {where}"
        )
    if task.grader == RECORDED_GRADER:  # no gold: the text (or its stand-in) grades as recorded
        text = rec.text if rec.text is not None else stand_in(task.id, model)
        return ReplayAnswer(text=text, recorded_correct=rec.correct, synthesised=rec.text is None)
    if rec.text is None:
        assert rec.correct is not None  # the file loader requires text or a label
        try:
            text = _synthesise(task, model, rec.correct)
        except WorkerError:
            if task.grader != "code" or "recorded_labels" not in task.metadata:
                raise
            # a code item whose reference solution fails its tests here: the stand-in the loader
            # labelled (recordings_format._labels), graded by its label
            text = stand_in(task.id, model)
        return ReplayAnswer(text=text, recorded_correct=rec.correct, synthesised=True)
    if rec.correct is None or not normalise or grade(task, rec.text) == rec.correct:
        return ReplayAnswer(text=rec.text, recorded_correct=rec.correct)
    lines = _correct_lines(task) if rec.correct else (WRONG_LINE,)
    for line in lines:
        text = rec.text.rstrip() + line
        if grade(task, text) == rec.correct:
            return ReplayAnswer(text=text, recorded_correct=rec.correct, normalised=True)
    raise WorkerError(
        f"replay worker {model!r}: could not make task {task.id!r} grade as recorded "
        "(set `normalise: false` to replay the raw text)"
    )


@dataclass
class ReplayWorker(CallWorker):
    """Answers an item with ``model``'s recorded response (see the module docstring).

    Attributes:
        info: static facts (name, prices, hosting) from the pool file.
        model: which recorded model this worker replays (a model of ``source``).
        normalise: make the project's grader agree with the recorded label (default).
        mmlu_output_tokens: output tokens charged for a synthesised answer (label only).
        ttft_s, tokens_per_s: nominal latency model (where no latency was recorded).
        latency_scale: 0 reports latency without sleeping; > 0 sleeps ``latency_s * scale``.
        source: the recordings (RouteLLM's by default).
    """

    info: WorkerInfo
    model: str
    normalise: bool = True
    mmlu_output_tokens: int = MMLU_OUTPUT_TOKENS
    ttft_s: float = 0.5
    tokens_per_s: float = 50.0
    latency_scale: float = 0.0
    source: RecordingSource = ROUTELLM

    def answer_tokens(self, task: Task) -> int:
        """Output tokens of this worker's whole answer to ``task`` before any ``max_tokens`` cut:
        recorded, else estimated from its text (a fixed count for a synthesised answer). A call
        whose cap is below this is cut. Raises :class:`WorkerError` as :meth:`call` does."""
        answer = replay_answer(task, self.model, self.normalise, self.source)
        rec = self.source.get(task.id, self.model)
        assert rec is not None  # replay_answer raised otherwise
        return self._whole_tokens(answer, rec)

    def _whole_tokens(self, answer: ReplayAnswer, rec: RecordedResponse) -> int:
        if rec.output_tokens is not None:
            return rec.output_tokens
        return self.mmlu_output_tokens if answer.synthesised else estimate_tokens(answer.text)

    async def call(self, call: WorkerCall) -> Completion:
        messages, max_tokens, context = call.messages, call.max_tokens, call.context
        if context is None:
            raise WorkerError(
                f"replay worker {self.info.name!r} needs CallContext(task=...): it answers benchmark "
                "items, not free text"
            )
        answer = replay_answer(context.task, self.model, self.normalise, self.source)
        rec = self.source.get(context.task.id, self.model)
        assert rec is not None  # replay_answer raised otherwise
        text = answer.text
        output_tokens = self._whole_tokens(answer, rec)  # the answer and record fetched above
        cap = max(1, max_tokens)
        cut = output_tokens > cap
        if cut:
            text, output_tokens = text[: cap * CHARS_PER_TOKEN], cap
        if rec.input_tokens is not None:
            input_tokens = rec.input_tokens
        else:
            input_tokens = sum(estimate_tokens(m.get("content", "")) for m in messages)
        if rec.latency_s is not None and not cut:
            latency = rec.latency_s
        else:
            latency = round(self.ttft_s + output_tokens / self.tokens_per_s, 4)
        cost = self.info.cost(input_tokens, output_tokens) if rec.cost_usd is None or cut else rec.cost_usd
        # The executor reserves this call's worst case at the pool's prices (the messages' input
        # bound + max_tokens of output) and a budget holds only if no call costs more: a recorded
        # cost (or recorded token count) above it cannot be replayed within the call's limits.
        worst = self.info.cost(self.info.input_token_bound(messages), cap)
        if cost > worst * (1 + 1e-9):
            raise WorkerError(
                f"replay worker {self.info.name!r}: task {context.task.id!r} was recorded at "
                f"${cost:.6g}, above this call's worst case of ${worst:.6g} at the pool's prices "
                f"(max_tokens {cap}); the pool's prices and the recordings' cost_usd / tokens disagree"
            )
        if rec.cost_usd is None or cut:
            return await offline_completion(
                self.info,
                text,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                latency_s=latency,
                latency_scale=self.latency_scale,
                synthesised=answer.synthesised or answer.normalised,
            )
        if self.latency_scale > 0:
            await asyncio.sleep(latency * self.latency_scale)
        return Completion(
            text=text,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=rec.cost_usd,
            latency_s=latency,
            worker=self.info.name,
            synthesised=answer.synthesised or answer.normalised,
        )


def _positive(spec: dict[str, Any], key: str, default: float) -> float:
    value = float(spec.get(key, default))
    if value <= 0:
        raise PoolConfigError(f"replay worker {spec['name']!r}: {key} must be > 0")
    return value


def _source(spec: dict[str, Any], options: dict[str, Any]) -> RecordingSource:
    path = spec.get("recordings", options.get("recordings"))
    if path is None:
        import difflib

        # `recording:` had fallen back to RouteLLM's recordings and failed on a model name
        near = [k for k in (*spec, *options) if difflib.get_close_matches(str(k), ["recordings"], 1, 0.75)]
        if near:
            raise PoolConfigError(
                f"replay worker {spec['name']!r}: unknown field {near[0]!r}; did you mean `recordings` "
                "(the recordings file, for the pool or the worker)?"
            )
        return ROUTELLM
    try:
        source = load_recordings(str(path))
    except FileNotFoundError as exc:
        raise PoolConfigError(f"replay worker {spec['name']!r}: {exc}") from None
    except RecordingsError as exc:  # it names the file, line and model: not this worker's fault
        raise PoolConfigError(str(exc)) from None
    options.setdefault("default_dataset", dataset_name(str(path)))
    return source


@register_kind("replay")
def build_replay(spec: dict[str, Any], options: dict[str, Any]) -> ReplayWorker:
    """Builder for ``kind: replay``.

    Worker entries: ``model`` (a model of the recordings; defaults to the worker's name),
    ``mmlu_output_tokens`` (16), ``ttft_s`` (0.5), ``tokens_per_s`` (50). Pool options (a worker
    entry may override them): ``recordings`` (a recordings file; RouteLLM's when absent — the
    file's items then become the pool's ``default_dataset``, ``recordings:<path>``),
    ``normalise`` (true), ``latency_scale`` (0).
    """
    source = _source(spec, options)
    model = str(spec.get("model", spec["name"]))
    if model not in source.models:
        raise PoolConfigError(
            f"replay worker {spec['name']!r}: no recordings of model {model!r}; "
            f"recorded: {sorted(source.models)}"
        )
    scale = float(spec.get("latency_scale", options.get("latency_scale", 0.0)))
    if scale < 0:
        raise PoolConfigError("latency_scale must be >= 0")
    mmlu_tokens = int(spec.get("mmlu_output_tokens", MMLU_OUTPUT_TOKENS))
    if mmlu_tokens < 1:
        raise PoolConfigError(f"replay worker {spec['name']!r}: mmlu_output_tokens must be >= 1")
    normalise = spec.get("normalise", options.get("normalise", True))
    if not isinstance(normalise, bool):
        raise PoolConfigError(f"replay worker {spec['name']!r}: normalise must be true or false")
    ttft_s, tokens_per_s = _positive(spec, "ttft_s", 0.5), _positive(spec, "tokens_per_s", 50.0)
    return ReplayWorker(
        info=replace(info_from_spec(spec), ttft_s=ttft_s, tokens_per_s=tokens_per_s),
        model=model,
        normalise=normalise,
        mmlu_output_tokens=mmlu_tokens,
        ttft_s=ttft_s,
        tokens_per_s=tokens_per_s,
        latency_scale=scale,
        source=source,
    )
