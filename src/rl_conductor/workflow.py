"""Workflows: the plan a Conductor writes, parsed safely, rendered back, and turned into messages.

The Conductor writes, after optional free-text reasoning, three equal-length Python lists
(the paper's format)::

    model_id = [2, 0]
    subtasks = ["Solve the problem step by step.", "Check the solution above and give the final answer."]
    access_list = [[], "all"]

``access_list`` entries are ``"all"`` (see every earlier step), ``[]`` (see none) or a list of
earlier step indices (an extension of the paper). Worker ids run from 0 to the pool size - 1.
Where the prompt ranked the workers (``evidence: rank``: ``Ranked by estimate: 3, 1, 5``), a
``model_id`` entry may also name a worker by its place in that ranking, ``@1`` for the first
(bare or quoted): :func:`parse` resolves it to the id with the ``ranking`` the prompt showed, and
refuses it when there was none or the place is beyond it. Why: following the evidence is then
one constant token sequence a tiny model can learn, where copying the id from the prompt was not
learnt (docs/recordings.md); an id still names any worker, so deviating stays possible. A
later round's continuation is parsed with ``first_index`` = the steps so far, so its steps are
numbered after them and may see any of them. Parsing uses ``ast.literal_eval`` on
bracket-matched list literals, never ``eval``; anything malformed raises :class:`ParseError`
with a message saying what is wrong. When a list name occurs several times (a model that
"thinks out loud"), the last occurrence wins; occurrences inside another list (an instruction
quoting the format) are not assignments.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Literal

from rl_conductor.limits import DEFAULT_MAX_STEPS

LIST_NAMES = ("model_id", "subtasks", "access_list")

Access = Literal["all"] | tuple[int, ...]


class ParseError(ValueError):
    """The Conductor's text is not a valid workflow; the message names what is wrong."""


@dataclass(frozen=True)
class Step:
    """One subtask: which worker, what instruction, which earlier steps it sees."""

    worker: int
    instruction: str
    access: Access = ()
    #: the place in the prompt's evidence ranking the plan named this worker by (``@rank``);
    #: None when it was named by id. ``worker`` is always the resolved id.
    rank: int | None = field(default=None, compare=False)

    def visible(self, index: int) -> tuple[int, ...]:
        """Indices of earlier steps this step (at position ``index``) sees."""
        if self.access == "all":
            return tuple(range(index))
        return tuple(self.access)


@dataclass(frozen=True)
class Workflow:
    """An ordered list of steps; the final answer is the last step's output."""

    steps: tuple[Step, ...]
    reasoning: str = field(default="", compare=False)

    def __len__(self) -> int:
        return len(self.steps)

    def dependencies(self) -> list[tuple[int, ...]]:
        return [s.visible(i) for i, s in enumerate(self.steps)]

    def workers(self) -> list[int]:
        return [s.worker for s in self.steps]

    def by_rank(self) -> bool:
        """Whether any step names its worker by its place in the evidence ranking (``@k``)."""
        return any(s.rank is not None for s in self.steps)


#: a bare rank reference in a ``model_id`` list (``@1``), quoted before the literal is evaluated
_BARE_RANK = re.compile(r"(?<![\w\"'@])@(\d+)")
#: a rank reference as a list entry (at most four digits: a longer one is refused as not a rank)
_RANK_ENTRY = re.compile(r"@([0-9]{1,4})")


LIST_ASSIGN = {name: re.compile(rf"\b{name}\s*(?:=|:)\s*\[") for name in LIST_NAMES}


def _extract_list_literal(text: str, start: int) -> str:
    """Return the bracket-matched list literal starting at ``text[start] == '['``.

    Tracks Python string literals (single, double, triple quotes, escapes) so that brackets
    inside instructions do not end the list early.
    """
    depth = 0
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c in "'\"":
            quote = text[i : i + 3] if text[i : i + 3] in ("'''", '"""') else c
            i += len(quote)
            while i < n and not text.startswith(quote, i):
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                raise ParseError("unterminated string literal inside a list")
            i += len(quote)
            continue
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1
    raise ParseError("unbalanced brackets: a list is not closed")


#: Only the last this-many list assignments are examined (bounds the work on adversarial text).
_MAX_CANDIDATES = 32


def _scan_lists(text: str) -> dict[str, tuple[list[object], int, int] | ParseError]:
    """For each name found, its last assignment that is not inside another list: the value and
    the literal's character span ``[start, end)``, or why it does not evaluate.

    Assignments are examined in text order; one whose literal evaluates to a list claims its
    span, so a later ``model_id = [`` that lies inside a claimed literal (an instruction that
    mentions the format) is not mistaken for the real list. Drafts that do not evaluate claim
    nothing, and the last unclaimed assignment of each name wins.
    """
    found = sorted((m.end() - 1, name) for name in LIST_NAMES for m in LIST_ASSIGN[name].finditer(text))
    results: dict[str, tuple[list[object], int, int] | ParseError] = {}
    claimed_until = -1
    for bracket, name in found[-_MAX_CANDIDATES:]:
        if bracket < claimed_until:
            continue
        try:
            literal = _extract_list_literal(text, bracket)
            quoted = _BARE_RANK.sub(r'"@\1"', literal) if name == "model_id" else literal
            results[name] = (_literal_list(quoted, name), bracket, bracket + len(literal))
        except ParseError as exc:
            results[name] = exc
            continue
        claimed_until = bracket + len(literal)
    return results


def _find_lists(text: str) -> dict[str, list[object]]:
    """The three lists as :func:`parse` reads them (:func:`_scan_lists`)."""
    results = _scan_lists(text)
    out: dict[str, list[object]] = {}
    for name in LIST_NAMES:
        got = results.get(name)
        if got is None:
            raise ParseError(f"missing `{name} = [...]`")
        if isinstance(got, ParseError):
            raise got
        out[name] = got[0]
    return out


def list_span(text: str, name: str = "model_id") -> tuple[int, int] | None:
    """The character span ``[start, end)`` of the ``name`` list literal (brackets included) that
    :func:`parse` reads, None when the text has no such list that evaluates. The ``model_id``
    list is where a plan decides which workers run, and where a review decides to keep (``[]``)
    or to add steps; the SFT loss can weight its tokens (``training/sft_loss.py``)."""
    got = _scan_lists(text).get(name)
    return None if got is None or isinstance(got, ParseError) else (got[1], got[2])


def _literal_list(literal: str, name: str) -> list[object]:
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise ParseError(f"`{name}` is not a Python list literal: {exc.__class__.__name__}") from None
    if not isinstance(value, list):
        raise ParseError(f"`{name}` must be a list")
    return value


def _show(value: object, limit: int = 80) -> str:
    """``repr`` for error messages: shortened, and safe for ints too long to print."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        text = f"<{type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_access(entry: object, index: int) -> Access:
    if entry == "all":
        return "all" if index > 0 else ()
    if isinstance(entry, (list, tuple)):
        out: list[int] = []
        for ref in entry:
            if isinstance(ref, bool) or not isinstance(ref, int):
                raise ParseError(f"access_list[{index}] must hold step indices (ints), got {_show(ref)}")
            if ref < 0:
                raise ParseError(f"access_list[{index}] has a negative step index {_show(ref)}")
            if ref >= index:
                raise ParseError(
                    f"access_list[{index}] refers to step {_show(ref)}, "
                    f"which is not earlier than step {index}"
                )
            if ref not in out:
                out.append(ref)
        return tuple(sorted(out))
    raise ParseError(
        f'access_list[{index}] must be "all" or a list of earlier step indices, got {_show(entry)}'
    )


def parse(
    text: str,
    *,
    pool_size: int,
    max_steps: int = DEFAULT_MAX_STEPS,
    allow_empty: bool = False,
    first_index: int = 0,
    ranking: Sequence[int] | None = None,
) -> Workflow:
    """Parse a Conductor completion into a :class:`Workflow`.

    Args:
        text: the completion: optional reasoning, then the three lists.
        pool_size: number of workers shown to the Conductor (ids ``0 .. pool_size - 1``).
        max_steps: upper bound on the number of steps.
        allow_empty: accept three empty lists (a later round's review that keeps the answer).
        first_index: the index of the first step (a later round's continuation: the number of
            steps so far); access lists may name any step before each step's own index.
        ranking: the worker ids the prompt's ranking line showed, best first
            (:func:`rl_conductor.prompting.shown_ranking`); ``@k`` in ``model_id`` is its k-th.
            None: the prompt showed none, and a rank reference is refused.

    Raises:
        ParseError: with a message naming the problem.
    """
    if not isinstance(text, str):
        raise ParseError("completion is not text")
    lists = _find_lists(text)
    ids, subtasks, access = lists["model_id"], lists["subtasks"], lists["access_list"]
    if not (len(ids) == len(subtasks) == len(access)):
        raise ParseError(
            f"lists have unequal lengths: model_id={len(ids)}, subtasks={len(subtasks)}, "
            f"access_list={len(access)}"
        )
    if not ids and not allow_empty:
        raise ParseError("the workflow has no steps")
    if len(ids) > max_steps:
        raise ParseError(f"the workflow has {len(ids)} steps; at most {max_steps} are allowed")
    steps: list[Step] = []
    for i, (wid, sub, acc) in enumerate(zip(ids, subtasks, access, strict=True)):
        wid, rank = _resolve(i, wid, pool_size, ranking)
        if not isinstance(sub, str):
            raise ParseError(f"subtasks[{i}] must be a string, got {type(sub).__name__}")
        if not sub.strip():
            raise ParseError(f"subtasks[{i}] is empty")
        access = _parse_access(acc, first_index + i)
        steps.append(Step(worker=wid, instruction=sub.strip(), access=access, rank=rank))
    reasoning = text[: min(m.start() for n in LIST_NAMES for m in [LIST_ASSIGN[n].search(text)] if m)].strip()
    return Workflow(steps=tuple(steps), reasoning=reasoning)


def _check_id(i: int, wid: object, pool_size: int) -> int:
    if isinstance(wid, bool) or not isinstance(wid, int):
        raise ParseError(f"model_id[{i}] must be an int, got {_show(wid)}")
    if not 0 <= wid < pool_size:
        raise ParseError(f"model_id[{i}] = {_show(wid)} is out of range 0..{pool_size - 1}")
    return wid


def _resolve(i: int, wid: object, pool_size: int, ranking: Sequence[int] | None) -> tuple[int, int | None]:
    """``model_id[i]`` as a worker id and the rank it was named by (None: named by id)."""
    m = _RANK_ENTRY.fullmatch(wid.strip()) if isinstance(wid, str) else None
    if m is None:
        return _check_id(i, wid, pool_size), None
    rank = int(m.group(1))
    if not ranking:
        raise ParseError(
            f"model_id[{i}] = @{rank} names a worker by its evidence rank, "
            "but the prompt showed no ranking: name it by id"
        )
    if not 1 <= rank <= len(ranking):
        raise ParseError(
            f"model_id[{i}] = @{rank} is out of range @1..@{len(ranking)} (the ranking the prompt showed)"
        )
    return _check_id(i, ranking[rank - 1], pool_size), rank


def model_ids(
    text: str,
    *,
    pool_size: int,
    max_steps: int = DEFAULT_MAX_STEPS,
    ranking: Sequence[int] | None = None,
) -> list[int]:
    """The ``model_id`` list alone, checked as :func:`parse` checks it (ints in range, at least
    one and at most ``max_steps``), whatever the other two lists hold: which workers a plan whose
    ``subtasks`` or ``access_list`` is broken meant to run (the Conductor's fallback salvages
    them); rank references resolve as in :func:`parse`. Raises :class:`ParseError` when that list
    is missing, does not evaluate or fails a check."""
    got = _scan_lists(text).get("model_id") if isinstance(text, str) else None
    if got is None:
        raise ParseError("missing `model_id = [...]`")
    if isinstance(got, ParseError):
        raise got
    ids = got[0]
    if not ids:
        raise ParseError("the workflow has no steps")
    if len(ids) > max_steps:
        raise ParseError(f"the workflow has {len(ids)} steps; at most {max_steps} are allowed")
    return [_resolve(i, wid, pool_size, ranking)[0] for i, wid in enumerate(ids)]


def access_entries(text: str, count: int) -> tuple[Access, ...] | None:
    """The ``access_list`` of ``text`` read as :func:`parse` reads it, for a plan of ``count``
    steps; None when it is missing, does not evaluate, has another length or an invalid entry."""
    got = _scan_lists(text).get("access_list") if isinstance(text, str) else None
    if got is None or isinstance(got, ParseError) or len(got[0]) != count:
        return None
    try:
        return tuple(_parse_access(entry, i) for i, entry in enumerate(got[0]))
    except ParseError:
        return None


def _access_literal(step: Step) -> str:
    # spelled exactly as held: an explicit list of every earlier step stays a list, so it parses
    # back to the same Step (``normalize`` is what makes the two spellings compare equal)
    if step.access == "all":
        return '"all"'
    return "[" + ", ".join(str(i) for i in step.access) + "]"


def render(workflow: Workflow, *, reasoning: str | None = None) -> str:
    """Render a workflow in the Conductor's output format.

    ``parse(render(w)) == w`` for every workflow ``parse`` can return (stripped, non-empty
    instructions; a first step whose access is ``()``, which is how ``parse`` reads a first step's
    ``"all"``; a step named by rank is written ``@k`` and parses back with the same ranking)."""
    r = workflow.reasoning if reasoning is None else reasoning
    ids = "[" + ", ".join(str(s.worker) if s.rank is None else f"@{s.rank}" for s in workflow.steps) + "]"
    subs = "[" + ", ".join(repr(s.instruction) for s in workflow.steps) + "]"
    acc = "[" + ", ".join(_access_literal(s) for s in workflow.steps) + "]"
    body = f"model_id = {ids}\nsubtasks = {subs}\naccess_list = {acc}"
    return f"{r.strip()}\n{body}" if r and r.strip() else body


def normalize(workflow: Workflow) -> Workflow:
    """Canonical form: ``"all"`` spelled as explicit indices (so equality ignores spelling)."""
    steps = tuple(
        Step(worker=s.worker, instruction=s.instruction, access=s.visible(i), rank=s.rank)
        for i, s in enumerate(workflow.steps)
    )
    return Workflow(steps=steps, reasoning=workflow.reasoning)


def _template(name: str) -> str:
    return resources.files("rl_conductor.prompts").joinpath(name).read_text(encoding="utf-8")


_WORKER_TEMPLATE: str | None = None


def worker_message(question: str, visible: Sequence[tuple[int, str, str]], instruction: str) -> str:
    """The single user message a worker receives (paper, Appendix): preamble, the original
    question, the visible earlier subtasks with their answers, then its own subtask.

    Args:
        question: the original question.
        visible: ``(step_index, subtask, answer)`` for each earlier step this step may see.
        instruction: this step's subtask.
    """
    global _WORKER_TEMPLATE
    if _WORKER_TEMPLATE is None:
        _WORKER_TEMPLATE = _template("worker.txt")
    if visible:
        parts = [f"[Step {i}] Subtask: {sub}\n[Step {i}] Answer:\n{ans}" for i, sub, ans in visible]
        context = "Earlier steps of this workflow:\n\n" + "\n\n".join(parts) + "\n\n"
    else:
        context = ""
    return _WORKER_TEMPLATE.format(question=question, context=context, instruction=instruction)
