"""The Conductor's prompt: one template (a file), used by training, evaluation and serving.

It shows the question, the workers by ordinal id only (names hidden, as in the paper) with a
one-line description, a price tier and where they run, the budget when there is one, and the
output format. A request's deadline (``RequestLimits.max_latency_s``) is carried the same way: a
``Deadline:`` line after the budget, and each worker's typical answer time (from its latency
model) in its line, so the Conductor can plan fewer sequential steps or faster workers when time
is short. Without a deadline the prompt is byte-identical to the one trained models were trained
on. Under a budget, workers whose typical answer costs more than the budget say so
(``over budget``); under a deadline, workers whose typical answer takes longer say ``too slow``.
After a round (a request with ``max_rounds > 1``), the review prompt
(``conductor_review.txt``) shows the same lines, the budget and time that are left, and the
workflow so far with each step's extracted answer and whether the answers agree
(:mod:`rl_conductor.rounds`).
Questions are cut to ``max_question_chars`` so the prompt fits the tiny model's
context; the cut is marked. With a ``ranking`` (``evidence: rank``,
:func:`rl_conductor.policies.evidence.ranking`) the prompt ends with two lines, ``Ranked by
estimate: 3, 1, 5`` (the workers the request may use, ordered by their estimated reward for this
question) and ``Best by estimate: 3``. The best id comes last, right before the plan the model
writes, so following it is copying the token a fixed number of tokens back whatever the pool's
size (a tiny model trained on targets made from per-worker percentages alone did not learn to
compare them: benchmarks/README.md, measured design choices). The plan may name a shown worker
by its place in that line (``model_id = [@1]``, :mod:`rl_conductor.workflow`): the Conductor
parses with
:func:`shown_ranking`, the ids the line showed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from rl_conductor.limits import RequestLimits
from rl_conductor.tasks.base import Task
from rl_conductor.workers.base import WorkerInfo
from rl_conductor.workers.pool import PoolView

if TYPE_CHECKING:
    from rl_conductor.executor import RoundRequest

DEFAULT_MAX_QUESTION_CHARS = 700


@cache
def template(name: str = "conductor.txt") -> str:
    return resources.files("rl_conductor.prompts").joinpath(name).read_text(encoding="utf-8")


#: Input tokens assumed for the typical answer time shown under a deadline (a question plus a
#: short instruction; what the prompt can state without knowing the step).
TYPICAL_INPUT_TOKENS = 300


def typical_seconds(info: WorkerInfo) -> float | None:
    """Median seconds of a typical answer of this worker (None when its latency is unknown)."""
    return info.estimate_latency_s(TYPICAL_INPUT_TOKENS, info.typical_output_tokens)


def quantile_seconds(info: WorkerInfo, quantile: float) -> float | None:
    """Seconds within which a typical call of this worker answers with probability ``quantile``
    (its output length spread, :meth:`WorkerInfo.quantile_latency_s`); None when unknown."""
    return info.quantile_latency_s(TYPICAL_INPUT_TOKENS, info.typical_output_tokens, quantile)


def typical_cost(info: WorkerInfo) -> float:
    """USD of a typical answer of this worker (the same typical call as :func:`typical_seconds`)."""
    return info.cost(TYPICAL_INPUT_TOKENS, info.typical_output_tokens)


def over_budget(info: WorkerInfo, budget: float | None) -> bool:
    """Whether a typical answer of this worker costs more than ``budget`` (the prompt's
    ``over budget`` flag; the Conductor's decoding masks the same workers)."""
    return budget is not None and typical_cost(info) > budget


def worker_lines(
    view: PoolView,
    *,
    deadline: float | None = None,
    budget: float | None = None,
    evidence: Mapping[str, float] | None = None,
) -> str:
    """``i: description (price tier, self-hosted|external)`` per worker (with ``, ~N s`` — its
    typical answer time — under a ``deadline``, and ``, over budget`` when a typical answer of it
    costs more than ``budget``). With ``evidence`` (worker name → estimated probability that it
    alone answers this question right, :mod:`rl_conductor.policies.evidence`) each worker it
    covers ends with ``; ~N% right`` (a multiple of 5); without, the lines are as before.

    The flag says in words what the executor would do anyway (cap such a call's output to what
    the budget affords, or skip it): a small model learns "avoid the flagged workers" from a few
    examples, where comparing a dollar amount with price tiers took far more (benchmarks/README.md,
    measured design choices). In the same way, under a ``deadline`` (seconds), workers
    whose typical answer takes longer say ``too slow``."""
    lines = []
    for i, info in enumerate(view.infos()):
        where = "self-hosted" if info.hosting == "self" else "external"
        secs = typical_seconds(info) if deadline is not None else None
        speed = "" if secs is None else f", ~{secs:.0f} s" if secs >= 1 else f", ~{secs:.1f} s"
        slow = ", too slow" if secs is not None and deadline is not None and secs > deadline else ""
        over = ", over budget" if over_budget(info, budget) else ""
        what = info.description or "general assistant"
        seen = (
            ""
            if evidence is None or info.name not in evidence
            else f"; ~{percent(evidence[info.name])}% right"
        )
        lines.append(f"{i}: {what} ({info.price_tier()}, {where}{speed}{slow}{over}){seen}")
    return "\n".join(lines)


def percent(p: float) -> int:
    """An evidence estimate as the prompt shows it: a whole multiple of 5 %."""
    return int(5 * round(20 * min(max(float(p), 0.0), 1.0)))


def budget_line(limits: RequestLimits) -> str:
    """The limits' lines of the prompt: the budget, then the deadline (each only when set)."""
    out = "" if limits.max_cost_usd is None else f"Budget: ${limits.max_cost_usd:.3f} for all calls.\n"
    return out + deadline_line(limits)


def deadline_line(limits: RequestLimits) -> str:
    if limits.max_latency_s is None:
        return ""
    return f"Deadline: {limits.max_latency_s:.3g} s for the whole workflow (chained steps add up).\n"


#: How a long question is cut to ``max_question_chars``: ``head`` keeps its start (the topic);
#: ``ends`` keeps its first two fifths and its last three (on few-shot prompts the start is a head
#: shared by every item, and the item itself is at the end).
QUESTION_CUTS = ("head", "ends")


def cut(question: str, max_chars: int, how: str = "head") -> str:
    q = question.strip()
    if len(q) <= max_chars:
        return q
    if how == "ends":
        head = (max_chars - 7) * 2 // 5
        tail = max_chars - 7 - head
        return q[:head].rstrip() + " [...] " + q[len(q) - tail :].lstrip()
    if how != "head":
        raise ValueError(f"question cut must be one of {QUESTION_CUTS}, not {how!r}")
    return q[: max_chars - 5].rstrip() + " [...]"


#: how many ids the ``Best by estimate:`` line names
RANK_SHOWN = 3


def shown_ranking(order: Sequence[int] | None) -> list[int] | None:
    """The ids of a ranking the prompt's line shows (its first :data:`RANK_SHOWN`), best first:
    what ``@1``, ``@2`` … in a plan refer to (``workflow.parse(ranking=...)``); None for None."""
    return None if order is None else [int(i) for i in list(order)[:RANK_SHOWN]]


def rank_line(order: Sequence[int]) -> str:
    """``Ranked by estimate: 3, 1, 5`` (the first :data:`RANK_SHOWN` ids of ``order``; only with
    two or more) and ``Best by estimate: 3``, the best id last (see the module docstring)."""
    ids = [str(i) for i in shown_ranking(order) or []]
    if not ids:
        raise ValueError("a ranking needs at least one worker")
    ranked = f"Ranked by estimate: {', '.join(ids)}\n" if len(ids) > 1 else ""
    return f"{ranked}Best by estimate: {ids[0]}"


def plan_line(ids: Sequence[int]) -> str:
    """``Plan by estimate: 3, 5``: the workers of the plan the question's nearest training
    questions scored best with, in plan order (``TrainConfig.plan_hint``,
    :mod:`rl_conductor.policies.plan_hint`); a plan names them ``@1``, ``@2`` … by place."""
    if not ids:
        raise ValueError("a plan line needs at least one worker")
    return f"Plan by estimate: {', '.join(str(int(i)) for i in ids)}"


def conductor_prompt(
    task: Task,
    view: PoolView,
    limits: RequestLimits,
    *,
    max_question_chars: int = DEFAULT_MAX_QUESTION_CHARS,
    evidence: Mapping[str, float] | None = None,
    question_cut: str = "head",
    ranking: Sequence[int] | None = None,
    plan: Sequence[int] | None = None,
) -> str:
    """The user message the Conductor answers with a workflow (``evidence``: see
    :func:`worker_lines`; ``question_cut``: see :data:`QUESTION_CUTS`; ``ranking``: the view's
    ordinals best first, shown as a last line, :func:`rank_line`; ``plan``: the ordinals of the
    plan the question's neighbours scored best with, shown as a last line, :func:`plan_line`)."""
    if ranking is not None and plan is not None:
        raise ValueError("a prompt shows a ranking line or a plan line, not both")
    text = template().format(
        max_steps=limits.max_steps,
        workers=worker_lines(
            view,
            deadline=limits.max_latency_s,
            budget=limits.max_cost_usd,
            evidence=evidence,
        ),
        budget=budget_line(limits),
        question=cut(task.question, max_question_chars, question_cut),
    )
    if plan is not None:
        return f"{text.rstrip()}\n{plan_line(plan)}\n"
    return text if ranking is None else f"{text.rstrip()}\n{rank_line(ranking)}\n"


@dataclass(frozen=True)
class RoundSummary:
    """The answered steps of the rounds so far (indices), their extracted answers and agreement,
    as a review prompt shows them (:func:`rl_conductor.rounds.summarize` makes one)."""

    steps: tuple[int, ...]
    answers: tuple[str | None, ...]
    agree: bool | None

    def line(self) -> str:
        """The sentence a review prompt shows."""
        if self.agree is None:
            return "One answer so far." if self.steps else "No answer so far."
        return "The answers so far agree." if self.agree else "The answers so far disagree."


def review_prompt(
    request: RoundRequest,
    summary: RoundSummary,
    *,
    max_question_chars: int = DEFAULT_MAX_QUESTION_CHARS,
    signals: Sequence[str] | None = None,
    estimate: str | None = None,
    question_cut: str = "head",
) -> str:
    """The prompt of a review after a round: the workers, what is left of the limits, the
    question, each step so far (its worker id, what it saw, its subtask, its extracted answer or
    what became of it) and whether the answers agree. For a model trained with ``review_evidence:
    text`` also each step's text signals (``signals``, one phrase per step, shown in brackets
    after its answer) and the estimate's lines last (``estimate``,
    :meth:`rl_conductor.review_evidence.Estimate.line`); without them the prompt is as before.
    ``question_cut`` cuts the question as the first round's prompt does (:func:`cut`): a model
    trained on few-shot prompts that share their opening reads the item's end in both."""
    view, limits = request.view, request.limits
    answers = dict(zip(summary.steps, summary.answers, strict=True))
    lines = []
    for i, (step, rec) in enumerate(zip(request.workflow.steps, request.records, strict=True)):
        sees = "all" if step.access == "all" and i else str(list(step.visible(i)))
        if i in answers:
            got = "no answer found" if answers[i] is None else cut(str(answers[i]), 80)
        else:
            got = rec.status
        shown = "" if signals is None or i >= len(signals) else f" [{signals[i]}]"
        lines.append(f"[{i}] model {step.worker}, sees {sees}: {cut(step.instruction, 80)} -> {got}{shown}")
    text = template("conductor_review.txt").format(
        max_steps=limits.max_steps,
        workers=worker_lines(view, deadline=limits.max_latency_s, budget=limits.max_cost_usd),
        budget=budget_line(limits),
        question=cut(request.task.question, max_question_chars, question_cut),
        so_far="\n".join(lines),
        agreement=summary.line(),
    )
    return text if estimate is None else f"{text.rstrip()}\n{estimate}\n"
