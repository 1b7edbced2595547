"""Graders: decide whether a free-text answer solves a Task, and extract a voting key from it.

Four graders, chosen by ``Task.grader``:

* ``math``: the answer is the last ``\\boxed{...}``, else the last ``#### N``, else the text after
  the last "answer is" / "Answer:", else a short final line, else the last number. Gold and
  prediction are parsed by ``math-verify`` and compared symbolically (``1/2 == 0.5 ==
  \\frac{1}{2}``, ``18 == 18.0 == $18``).
* ``choice``: a letter A-J from ``\\boxed{C}``, "answer is (C)", "Answer: C", a final line that
  is a lone letter, or, failing those, the last "(C)"; an answer that repeats one option's text
  maps to that option's letter. Compared with the gold letter.
* ``qa``: SQuAD-style normalisation (lower case, no punctuation, no articles, single spaces);
  correct when the extracted final answer, or the whole reply, equals a gold alias, or when a
  short final answer (at most ``QA_MAX_EXTRA_TOKENS`` words longer than the alias) contains the
  alias as a whole-word phrase. Aliases come from ``metadata["aliases"]`` (a list) or from
  ``Task.answer`` split on ``ALIAS_SEP``.
* ``code``: the last fenced Python block (the last one defining the entry point, if several),
  or the whole reply, is run with the task's tests in :mod:`rl_conductor.tasks.sandbox`; a pass
  is exit code 0.

Graders never raise on odd input (empty, huge, binary junk, unbalanced LaTeX): they return
False / None. Only an unknown grader name raises, because that is a programming error.

Deliberate simplifications: ``math-verify`` guards parsing with ``signal.alarm``, which only
works in the main thread; in other threads it runs without a timeout and the candidate length
cap (``MAX_CANDIDATE_CHARS``) is the only guard. Text is scanned only in its last
``MAX_SCAN_CHARS`` characters (answers come at the end).
"""

from __future__ import annotations

import functools
import re
import string
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.sandbox import run_python

#: Only the tail of a reply is scanned for an answer.
MAX_SCAN_CHARS = 20_000
#: Longer extracted math answers are rejected before math-verify sees them.
MAX_CANDIDATE_CHARS = 300
#: Seconds math-verify may spend parsing or comparing (main thread only).
MATH_TIMEOUT_S = 2
#: Delimiter between gold aliases in ``Task.answer`` for the ``qa`` grader.
ALIAS_SEP = "|||"
#: A qa answer may be this many words longer than the alias it contains.
QA_MAX_EXTRA_TOKENS = 6
#: Default sandbox limits for code tasks (``metadata["timeout_s"]`` overrides the timeout).
CODE_TIMEOUT_S = 6.0
CODE_MEMORY_MB = 1024

LETTERS = "ABCDEFGHIJ"


class Grader(Protocol):
    """One way of checking answers: ``grade`` decides, ``extract`` gives a voting key."""

    @property
    def name(self) -> str: ...

    def grade(self, task: Task, text: str) -> bool: ...

    def extract(self, task: Task, text: str) -> str | None: ...


# --------------------------------------------------------------------------- shared helpers

_ANSWER_IS = re.compile(
    r"(?:final\s+answer|correct\s+answer|the\s+answer|answer)\s*(?:is|:|：|=)\s*[:：]?\s*(.+)",
    re.IGNORECASE,
)


def _tail(text: str) -> str:
    return text[-MAX_SCAN_CHARS:]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces, or None."""
    for macro in ("\\boxed", "\\fbox"):
        pos = text.rfind(macro)
        if pos < 0:
            continue
        i = pos + len(macro)
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth, start = 0, i + 1
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[start:j].strip()
            return None
        m = re.match(r"[^\s$]+", text[i:])
        return m.group(0) if m else None
    return None


def _last_answer_is(text: str) -> str | None:
    found = None
    for m in _ANSWER_IS.finditer(text):
        found = m.group(1)
    if found is None:
        return None
    found = found.strip().strip("*").strip()
    return found or None


def _final_line(text: str) -> str | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line:
            return line
    return None


# --------------------------------------------------------------------------- math

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_PLAIN_NUMBER = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_NUMBER_WITH_UNIT = re.compile(r"^(-?\d[\d,]*(?:\.\d+)?)\s+[A-Za-z][A-Za-z ]*$")


def _clean_math(s: str) -> str | None:
    s = s.strip()
    for left, right in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left) : len(s) - len(right)].strip()
    s = s.rstrip(" .;")
    s = s.replace("\\$", "").replace("\\!", "")
    s = re.sub(r"^\$\s*(?=[-\d.])", "", s).strip()
    m = _NUMBER_WITH_UNIT.match(s)
    if m:
        s = m.group(1)
    if _PLAIN_NUMBER.match(s):
        s = s.replace(",", "")
    if not s or len(s) > MAX_CANDIDATE_CHARS:
        return None
    return s


def _math_candidate(text: str) -> str | None:
    text = _tail(text)
    boxed = last_boxed(text)
    if boxed is not None:
        return _clean_math(boxed)
    hashes = re.findall(r"####\s*([^\n]+)", text)
    if hashes:
        return _clean_math(hashes[-1])
    said = _last_answer_is(text)
    if said is not None:
        said = said.split("\n", 1)[0]
        # "The answer is 18 because ..." keeps "18"; a sentence ending ends the answer.
        said = re.split(r"(?<=[^\d\\])\.\s|\s+(?:because|since|as)\s", said, maxsplit=1)[0]
        return _clean_math(said)
    final = _final_line(text)
    if final is not None and _looks_like_math(final) and _parse_math(_clean_math(final) or ""):
        return _clean_math(final)
    numbers = _NUMBER.findall(text)
    if numbers:
        return _clean_math(numbers[-1])
    return None


def _looks_like_math(line: str) -> bool:
    """A short line with no prose words once LaTeX commands (and their text arguments) are removed."""
    if len(line) > 80:
        return False
    bare = re.sub(r"\\(?:text|mbox|mathrm|textbf|begin|end|operatorname)\{[^{}]*\}|\\[A-Za-z]+", " ", line)
    return re.search(r"[A-Za-z]{3,}", bare) is None


def _math_timeout() -> int | None:
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_math(s: str) -> tuple[Any, ...]:
    if not s or len(s) > MAX_CANDIDATE_CHARS:
        return ()
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse
    from math_verify.errors import TimeoutException

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    for wrapped in ("\\boxed{" + s + "}", "$" + s + "$"):
        try:
            parsed = parse(wrapped, extraction_config=config, parsing_timeout=_math_timeout())
        except (Exception, TimeoutException):
            parsed = []
        if parsed:
            return tuple(parsed)
    return ()


def _math_verify(gold: tuple[Any, ...], pred: tuple[Any, ...]) -> bool:
    if not gold or not pred:
        return False
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        return bool(verify(list(gold), list(pred), timeout_seconds=_math_timeout()))
    except (Exception, TimeoutException):
        return False


def _math_key(cand: str) -> str:
    parsed = _parse_math(cand)
    if not parsed:
        return " ".join(cand.split())
    expr = parsed[0]
    try:
        import sympy

        if isinstance(expr, sympy.Basic) and expr.is_Number:
            return str(sympy.nsimplify(expr, rational=True))
        return str(expr)
    except Exception:
        return " ".join(cand.split())


@dataclass(frozen=True)
class MathGrader:
    """Symbolic equivalence of the extracted answer and the gold answer (math-verify)."""

    name: str = "math"

    def extract(self, task: Task, text: str) -> str | None:
        if not isinstance(text, str):
            return None
        try:
            cand = _math_candidate(text)
            return _math_key(cand) if cand else None
        except Exception:
            return None

    def grade(self, task: Task, text: str) -> bool:
        if not isinstance(text, str):
            return False
        try:
            cand = _math_candidate(text)
            if cand is None:
                return False
            gold = _clean_math(last_boxed(task.answer) or task.answer)
            return _math_verify(_parse_math(gold or ""), _parse_math(cand))
        except (Exception, RecursionError):
            return False


# --------------------------------------------------------------------------- multiple choice


def choice_texts(task: Task) -> list[str]:
    """The options of a multiple-choice task, in letter order (empty when unknown)."""
    choices = task.metadata.get("choices") or []
    return [str(c) for c in choices] if isinstance(choices, list | tuple) else []


def _letters_for(task: Task) -> str:
    n = len(choice_texts(task))
    return LETTERS[:n] if 0 < n <= len(LETTERS) else LETTERS


def _choice_letter(task: Task, text: str) -> str | None:
    text = _tail(text)
    letters = _letters_for(task)
    cls = f"[{letters}]"
    boxed = last_boxed(text)
    if boxed is not None:
        m = re.fullmatch(
            rf"\s*(?:\\text(?:bf)?\{{)?\s*\(?({cls})\)?\s*\}}?\s*[.:)]?.*", boxed, flags=re.DOTALL
        )
        if m:
            return m.group(1)
    said = None
    for m in re.finditer(
        rf"answer\s*(?:is|:|：)?\s*[:：]?\s*\**\s*(?:option\s+|choice\s+)?\(?({cls})\)?(?![A-Za-z0-9])",
        text,
        flags=re.IGNORECASE,
    ):
        if m.group(1) in letters:
            said = m.group(1)
    if said is not None:
        return said
    final = _final_line(text)
    if final is not None:
        m = re.fullmatch(rf"[*\s]*\(?({cls})\)?[.:)]?[*\s]*", final)
        if m:
            return m.group(1)
    opts = choice_texts(task)
    if opts:
        spoken = _last_answer_is(text) or final
        if spoken is not None:
            norm = normalize_text(spoken.split("\n", 1)[0])
            hits = [i for i, o in enumerate(opts) if normalize_text(o) == norm and norm]
            if len(hits) == 1:
                return letters[hits[0]]
    paren = re.findall(rf"\(({cls})\)", text)
    if paren:
        return paren[-1]
    return None


@dataclass(frozen=True)
class ChoiceGrader:
    """Letter extracted from the reply equals the gold letter."""

    name: str = "choice"

    def extract(self, task: Task, text: str) -> str | None:
        if not isinstance(text, str):
            return None
        try:
            return _choice_letter(task, text)
        except Exception:
            return None

    def grade(self, task: Task, text: str) -> bool:
        letter = self.extract(task, text)
        return letter is not None and letter == task.answer.strip().upper()


# --------------------------------------------------------------------------- short-answer QA


def normalize_text(s: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def gold_aliases(task: Task) -> list[str]:
    """Accepted answers of a qa task: ``metadata["aliases"]`` or ``answer`` split on ALIAS_SEP."""
    aliases = task.metadata.get("aliases")
    if isinstance(aliases, list | tuple) and aliases:
        return [str(a) for a in aliases]
    return [a for a in (p.strip() for p in task.answer.split(ALIAS_SEP)) if a]


def _qa_candidate(text: str) -> str | None:
    text = _tail(text)
    boxed = last_boxed(text)
    if boxed is not None:
        boxed = re.sub(r"\\text\{([^{}]*)\}", r"\1", boxed)
        return boxed
    said = _last_answer_is(text)
    if said is not None:
        return said.split("\n", 1)[0]
    return _final_line(text)


def _contains_phrase(hay: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(hay[i : i + n] == needle for i in range(len(hay) - n + 1))


@dataclass(frozen=True)
class QAGrader:
    """Normalised exact match against gold aliases, with a bounded containment rule."""

    name: str = "qa"

    def extract(self, task: Task, text: str) -> str | None:
        if not isinstance(text, str):
            return None
        try:
            cand = _qa_candidate(text)
            norm = normalize_text(cand) if cand else ""
            return norm or None
        except Exception:
            return None

    def grade(self, task: Task, text: str) -> bool:
        if not isinstance(text, str):
            return False
        try:
            cand = self.extract(task, text)
            whole = normalize_text(_tail(text)) if len(text) <= 2000 else ""
            for alias in gold_aliases(task):
                gold = normalize_text(alias)
                if not gold:
                    continue
                if gold in (cand, whole):
                    return True
                if cand:
                    ctoks, gtoks = cand.split(), gold.split()
                    if len(ctoks) <= len(gtoks) + QA_MAX_EXTRA_TOKENS and _contains_phrase(ctoks, gtoks):
                        return True
            return False
        except Exception:
            return False


# --------------------------------------------------------------------------- code

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The program in a reply: the last fenced python block (preferring one that defines
    ``entry_point``), else the whole text with stray fence lines removed."""
    blocks = [
        body for lang, body in _FENCE.findall(text) if lang.lower() in ("", "python", "py", "python3", "py3")
    ]
    if blocks:
        if entry_point:
            defining = [b for b in blocks if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", b)]
            if defining:
                return defining[-1]
        return blocks[-1]
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith("```"))


def build_program(task: Task, code: str) -> str:
    """The candidate code followed by the task's tests, ready for the sandbox.

    ``metadata["tests"]`` is either a list of assert statements (MBPP) or HumanEval-style check
    code defining ``check(candidate)``, which is then called on ``metadata["entry_point"]``.
    A body-only HumanEval completion (no ``def entry_point``) is appended to the prompt.
    """
    meta = task.metadata
    entry = str(meta.get("entry_point") or "")
    imports = "\n".join(str(i) for i in meta.get("test_imports") or [])
    tests = meta.get("tests") or []
    prompt = str(meta.get("prompt") or "")
    check_style = isinstance(tests, str)
    if check_style and entry and prompt and not re.search(rf"\bdef\s+{re.escape(entry)}\s*\(", code):
        code = prompt + code
    parts = [imports, code]
    if check_style:
        parts += [str(tests), f"check({entry})" if entry else ""]
    else:
        parts.append("\n".join(str(t) for t in tests))
    return "\n\n".join(p for p in parts if p) + "\n"


@dataclass(frozen=True)
class CodeGrader:
    """Runs the extracted program with the task's tests; pass = exit code 0."""

    name: str = "code"

    def extract(self, task: Task, text: str) -> str | None:
        if not isinstance(text, str):
            return None
        try:
            code = extract_code(_tail(text), task.metadata.get("entry_point"))
            key = " ".join(code.split())
            return key or None
        except Exception:
            return None

    def grade(self, task: Task, text: str) -> bool:
        if not isinstance(text, str) or not text.strip():
            return False
        try:
            code = extract_code(_tail(text), task.metadata.get("entry_point"))
            if not code.strip() or "\x00" in code:
                return False
            timeout = float(task.metadata.get("timeout_s") or CODE_TIMEOUT_S)
            return run_python(build_program(task, code), timeout_s=timeout, memory_mb=CODE_MEMORY_MB).ok
        except Exception:
            return False


# --------------------------------------------------------------------------- registry

GRADERS: dict[str, Grader] = {g.name: g for g in (MathGrader(), ChoiceGrader(), QAGrader(), CodeGrader())}


def _grader_for(task: Task) -> Grader:
    try:
        return GRADERS[task.grader]
    except KeyError:
        raise KeyError(
            f"unknown grader {task.grader!r} for task {task.id}; known: {sorted(GRADERS)}"
        ) from None


def grade(task: Task, text: str) -> bool:
    """True when ``text`` (a worker's final answer) solves ``task``. Never raises on odd text."""
    return _grader_for(task).grade(task, text)


def extract_answer(task: Task, text: str) -> str | None:
    """A normalised answer key for majority voting (None when no answer is found)."""
    return _grader_for(task).extract(task, text)
