"""The Conductor's prompt: one template (a file), used by training, evaluation and serving.

It shows the question, the workers by ordinal id only (names hidden, as in the paper) with a
one-line description, a price tier and where they run, the budget when there is one, and the
output format. The "yourself" line (the Conductor's own id) appears only where the limits allow
recursion at that depth, so the prompt never offers an id that parsing would reject.
Questions are cut to ``max_question_chars`` so the prompt fits the tiny model's
context; the cut is marked.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from rl_conductor.tasks.base import Task
from rl_conductor.trace import Limits
from rl_conductor.workers.pool import PoolView
from rl_conductor.workflow import Workflow, render

DEFAULT_MAX_QUESTION_CHARS = 700


@cache
def template(name: str = "conductor.txt") -> str:
    return resources.files("rl_conductor.prompts").joinpath(name).read_text(encoding="utf-8")


def worker_lines(view: PoolView, *, recursion: bool) -> str:
    """``i: description (price tier, self-hosted|external)`` per worker, then, when ``recursion``
    is allowed, the Conductor itself."""
    lines = []
    for i, info in enumerate(view.infos()):
        where = "self-hosted" if info.hosting == "self" else "external"
        lines.append(f"{i}: {info.description or 'general assistant'} ({info.price_tier()}, {where})")
    if recursion:
        lines.append(f"{len(view)}: yourself (review the workflow)")
    return "\n".join(lines)


def budget_line(limits: Limits) -> str:
    if limits.max_cost_usd is None:
        return ""
    return f"Budget: ${limits.max_cost_usd:.3f} for all calls.\n"


def cut(question: str, max_chars: int) -> str:
    q = question.strip()
    return q if len(q) <= max_chars else q[: max_chars - 5].rstrip() + " [...]"


def conductor_prompt(
    task: Task, view: PoolView, limits: Limits, *, max_question_chars: int = DEFAULT_MAX_QUESTION_CHARS
) -> str:
    """The user message the Conductor answers with a workflow."""
    return template().format(
        max_steps=limits.max_steps,
        workers=worker_lines(view, recursion=limits.allows_recursion()),
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
        workers=worker_lines(view, recursion=limits.allows_recursion(depth)),
        budget=budget_line(limits),
        question=cut(task.question, max_question_chars),
        parent=render(parent, reasoning=""),
        answer=cut(answer, 400),
    )
