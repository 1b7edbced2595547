"""The Conductor's prompt: one template (a file), used by training, evaluation and serving.

It shows the question, the workers by ordinal id only (names hidden, as in the paper) with a
one-line description, a price tier and where they run, the budget when there is one, and the
output format. A request's deadline (``Limits.max_latency_s``) is carried the same way: a
``Deadline:`` line after the budget, and each worker's typical answer time (from its latency
model) in its line, so the Conductor can plan fewer sequential steps or faster workers when time
is short. Without a deadline the prompt is byte-identical to the one trained models were trained
on. Under a budget, workers whose typical answer costs more than the budget say so
(``over budget``); under a deadline, workers whose typical answer takes longer say ``too slow``.
The "yourself" line (the Conductor's own id) appears only where the limits allow
recursion at that depth, so the prompt never offers an id that parsing would reject.
Questions are cut to ``max_question_chars`` so the prompt fits the tiny model's
context; the cut is marked.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from rl_conductor.tasks.base import Task
from rl_conductor.trace import Limits
from rl_conductor.workers.base import WorkerInfo
from rl_conductor.workers.pool import PoolView
from rl_conductor.workflow import Workflow, render

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
    recursion: bool,
    deadline: float | None = None,
    budget: float | None = None,
) -> str:
    """``i: description (price tier, self-hosted|external)`` per worker (with ``, ~N s`` — its
    typical answer time — under a ``deadline``, and ``, over budget`` when a typical answer of it
    costs more than ``budget``), then, when ``recursion`` is allowed, the Conductor.

    The flag says in words what the executor would do anyway (cap such a call's output to what
    the budget affords, or skip it): a small model learns "avoid the flagged workers" from a few
    examples, where comparing a dollar amount with price tiers took far more (measured: a tiny
    Conductor trained on 8 % of prompts at $0.002 still sent knowledge and math questions to a
    premium worker under that budget). In the same way, under a ``deadline`` (seconds), workers
    whose typical answer takes longer say ``too slow``."""
    lines = []
    for i, info in enumerate(view.infos()):
        where = "self-hosted" if info.hosting == "self" else "external"
        secs = typical_seconds(info) if deadline is not None else None
        speed = "" if secs is None else f", ~{secs:.0f} s" if secs >= 1 else f", ~{secs:.1f} s"
        slow = ", too slow" if secs is not None and deadline is not None and secs > deadline else ""
        over = ", over budget" if over_budget(info, budget) else ""
        what = info.description or "general assistant"
        lines.append(f"{i}: {what} ({info.price_tier()}, {where}{speed}{slow}{over})")
    if recursion:
        lines.append(f"{len(view)}: yourself (review the workflow)")
    return "\n".join(lines)


def budget_line(limits: Limits) -> str:
    """The limits' lines of the prompt: the budget, then the deadline (each only when set)."""
    out = "" if limits.max_cost_usd is None else f"Budget: ${limits.max_cost_usd:.3f} for all calls.\n"
    return out + deadline_line(limits)


def deadline_line(limits: Limits) -> str:
    if limits.max_latency_s is None:
        return ""
    return f"Deadline: {limits.max_latency_s:.3g} s for the whole workflow (chained steps add up).\n"


def cut(question: str, max_chars: int) -> str:
    q = question.strip()
    return q if len(q) <= max_chars else q[: max_chars - 5].rstrip() + " [...]"


def conductor_prompt(
    task: Task, view: PoolView, limits: Limits, *, max_question_chars: int = DEFAULT_MAX_QUESTION_CHARS
) -> str:
    """The user message the Conductor answers with a workflow."""
    return template().format(
        max_steps=limits.max_steps,
        workers=worker_lines(
            view,
            recursion=limits.allows_recursion(),
            deadline=limits.max_latency_s,
            budget=limits.max_cost_usd,
        ),
        budget=budget_line(limits),
        question=cut(task.question, max_question_chars),
    )


def recursive_prompt(
    task: Task,
    view: PoolView,
    limits: Limits,
    parent: Workflow,
    answer: str,
    *,
    depth: int = 1,
    max_question_chars: int = DEFAULT_MAX_QUESTION_CHARS,
) -> str:
    """The prompt of a recursive call at ``depth`` (1 = called from the top-level workflow): the
    parent workflow and the answer so far."""
    return template("conductor_recursive.txt").format(
        max_steps=limits.max_steps,
        workers=worker_lines(
            view,
            recursion=limits.allows_recursion(depth),
            deadline=limits.max_latency_s,
            budget=limits.max_cost_usd,
        ),
        budget=budget_line(limits),
        question=cut(task.question, max_question_chars),
        parent=render(parent, reasoning=""),
        answer=cut(answer, 400),
    )
