"""The replay worker pool: real recorded outputs of real models, answered offline.

A replay worker answers a benchmark item with what a real model once answered to it
(lm-sys/RouteLLM's recordings of ``gpt-4-1106-preview`` and ``Mixtral-8x7B-Instruct``, see
:mod:`rl_conductor.tasks.routellm`). It reads the item from ``CallContext.task``; the messages
are only counted for input tokens.

What it deliberately simplifies, and why:

* **Context is ignored.** The recording is one answer to the bare question, so the earlier
  steps a workflow shows a worker, and the step's own instruction, change nothing: a replay
  worker answers every call on an item the same way (``nonce`` too). Multi-step plans therefore
  only add cost on a replay pool; it measures routing (which model for which item), not
  collaboration. The simulated pool models collaboration; only live workers reward good
  instructions.
* **The recorded label is authoritative.** A replayed answer grades as RouteLLM recorded it, so
  a single-worker baseline reproduces the recorded accuracy exactly. GSM8K: the recorded text
  is returned, and where the project's grader disagrees with the label one final-answer line
  is appended (:data:`CORRECT_LINE` with the gold for a recorded-correct text whose answer we do
  not extract, :data:`WRONG_LINE` for a recorded-wrong text we would grade correct; RouteLLM's
  grader read ``#### $20.00`` as 2000 and ``#### 0.84`` as 84, ours reads 20 and 0.84). A pool
  option ``normalise: false`` returns the raw text instead. MMLU (no text was recorded): the
  answer is synthesised as ``Answer: X``, the gold letter when recorded correct, else a wrong
  letter chosen by a hash of (task id, model).
* **Tokens are estimated**, with :func:`rl_conductor.workers.base.estimate_tokens` (about 4
  characters per token), for both models, so their costs stay on one scale. No tokenizer of
  GPT-4 (cl100k) works offline: tiktoken's wheel ships no encoding file. Mixtral's does (the
  ``mistral-common`` wheel) and counts 1.75x more tokens on these texts (131.7 vs 75.3 per
  GSM8K answer: it splits digits), so Mixtral's token counts here are low by that factor.
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

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.routellm import RECORDED_MODELS, recording
from rl_conductor.workers.base import (
    CallContext,
    Completion,
    Message,
    WorkerError,
    WorkerInfo,
    estimate_tokens,
    offline_completion,
)
from rl_conductor.workers.pool import PoolConfigError, info_from_spec, register_kind

#: Appended to a recorded-correct GSM8K text whose final answer the project's grader misses.
CORRECT_LINE = "\n\n#### {gold}"
#: Appended to a recorded-wrong GSM8K text that the project's grader would accept.
WRONG_LINE = "\n\n#### [no valid final answer]"
#: Output tokens charged for a synthesised multiple-choice answer.
MMLU_OUTPUT_TOKENS = 16
#: Characters per token, as in :func:`estimate_tokens`; used to cut text at ``max_tokens``.
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class ReplayAnswer:
    """The text a replay worker returns for one item, before any ``max_tokens`` cut.

    Attributes:
        text: recorded text (possibly with a final-answer line appended) or a synthesised one.
        recorded_correct: RouteLLM's label for this item and model.
        normalised: whether a final-answer line was appended so the grader agrees with the label.
        synthesised: whether the text was made up from the label (no text was recorded).
    """

    text: str
    recorded_correct: bool
    normalised: bool = False
    synthesised: bool = False


def wrong_letter(task: Task, model: str) -> str:
    """A deterministic wrong option letter for ``task`` (a hash of task id and model)."""
    n = len(task.metadata.get("choices") or ()) or 4
    letters = [chr(ord("A") + i) for i in range(n) if chr(ord("A") + i) != task.answer.strip().upper()]
    digest = hashlib.sha256(f"{task.id}|{model}".encode()).digest()
    return letters[int.from_bytes(digest[:8], "big") % len(letters)]


@functools.lru_cache(maxsize=16384)
def replay_answer(task: Task, model: str, normalise: bool = True) -> ReplayAnswer:
    """What ``model`` (a key of ``RECORDED_MODELS``) answers to ``task``, graded as recorded.

    Raises:
        WorkerError: no recording of this item for this model.
    """
    from rl_conductor.tasks.graders import grade

    rec = recording(task.id, model)
    if rec is None:
        raise WorkerError(
            f"replay worker {model!r}: no recording of task {task.id!r} (source {task.source!r}); "
            "recorded datasets: routellm-gsm8k, routellm-mmlu (routellm = both)"
        )
    if rec.text is None:
        letter = task.answer.strip().upper() if rec.correct else wrong_letter(task, model)
        return ReplayAnswer(text=f"Answer: {letter}", recorded_correct=rec.correct, synthesised=True)
    if not normalise or grade(task, rec.text) == rec.correct:
        return ReplayAnswer(text=rec.text, recorded_correct=rec.correct)
    line = CORRECT_LINE.format(gold=task.answer) if rec.correct else WRONG_LINE
    text = rec.text.rstrip() + line
    if grade(task, text) != rec.correct:
        raise WorkerError(f"replay worker {model!r}: could not make task {task.id!r} grade as recorded")
    return ReplayAnswer(text=text, recorded_correct=rec.correct, normalised=True)


@dataclass
class ReplayWorker:
    """Answers an item with ``model``'s recorded response (see the module docstring).

    Attributes:
        info: static facts (name, prices, hosting) from the pool file.
        model: which recorded model this worker replays (a key of ``RECORDED_MODELS``).
        normalise: make the project's grader agree with the recorded label (default).
        mmlu_output_tokens: output tokens charged for a synthesised multiple-choice answer.
        ttft_s, tokens_per_s: nominal latency model.
        latency_scale: 0 reports latency without sleeping; > 0 sleeps ``latency_s * scale``.
    """

    info: WorkerInfo
    model: str
    normalise: bool = True
    mmlu_output_tokens: int = MMLU_OUTPUT_TOKENS
    ttft_s: float = 0.5
    tokens_per_s: float = 50.0
    latency_scale: float = 0.0

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float,
        context: CallContext | None = None,
    ) -> Completion:
        if context is None:
            raise WorkerError(
                f"replay worker {self.info.name!r} needs CallContext(task=...): it answers benchmark "
                "items, not free text"
            )
        answer = replay_answer(context.task, self.model, self.normalise)
        text = answer.text
        output_tokens = self.mmlu_output_tokens if answer.synthesised else estimate_tokens(text)
        cap = max(1, max_tokens)
        if output_tokens > cap:
            text, output_tokens = text[: cap * CHARS_PER_TOKEN], cap
        input_tokens = sum(estimate_tokens(m.get("content", "")) for m in messages)
        latency = round(self.ttft_s + output_tokens / self.tokens_per_s, 4)
        return await offline_completion(
            self.info,
            text,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            latency_s=latency,
            latency_scale=self.latency_scale,
        )


def _positive(spec: dict[str, Any], key: str, default: float) -> float:
    value = float(spec.get(key, default))
    if value <= 0:
        raise PoolConfigError(f"replay worker {spec['name']!r}: {key} must be > 0")
    return value


@register_kind("replay")
def build_replay(spec: dict[str, Any], options: dict[str, Any]) -> ReplayWorker:
    """Builder for ``kind: replay``.

    Worker entries: ``model`` (a key of ``RECORDED_MODELS``; defaults to the worker's name),
    ``mmlu_output_tokens`` (16), ``ttft_s`` (0.5), ``tokens_per_s`` (50). Pool options (a worker
    entry may override them): ``normalise`` (true), ``latency_scale`` (0).
    """
    model = str(spec.get("model", spec["name"]))
    if model not in RECORDED_MODELS:
        raise PoolConfigError(
            f"replay worker {spec['name']!r}: no recordings of model {model!r}; "
            f"recorded: {sorted(RECORDED_MODELS)}"
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
    return ReplayWorker(
        info=info_from_spec(spec),
        model=model,
        normalise=normalise,
        mmlu_output_tokens=mmlu_tokens,
        ttft_s=_positive(spec, "ttft_s", 0.5),
        tokens_per_s=_positive(spec, "tokens_per_s", 50.0),
        latency_scale=scale,
    )
