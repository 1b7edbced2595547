"""Graders: decide whether a free-text answer solves a Task, and extract a voting key from it.

Five graders, chosen by ``Task.grader``:

* ``math``: the answer is the last ``\\boxed{...}``, else the last ``#### N``, else the text after
  the last "answer is" / "Answer:" (or a last line "A: ..."), else a short final line, else the
  last number. Gold and
  prediction are parsed by ``math-verify`` and compared symbolically (``1/2 == 0.5 ==
  \\frac{1}{2}``, ``18 == 18.0 == $18``). An equation counts only as ``variable = value``
  or function application ``f(5) = value`` (``\\boxed{5 = 7}`` is not 7), a relation or arrow
  (``5 \\Rightarrow 9``, ``0 \\equiv 9``) is not its right-hand side, and "7 or 8" is wrong,
  unless the gold has that shape.
  math-verify runs in a helper process, so every call has a hard time limit in any thread;
  the limits count CPU time, so a grade does not depend on the machine's load.
* ``choice``: a letter A-J from ``\\boxed{C}``, "answer is (C)", "Answer: C", a final line that
  is a lone letter, or, failing those, the last "(C)"; an answer that repeats one option's text
  maps to that option's letter; a final line "B) text" is B. Compared with the gold letter. A
  reply that names several options ("A or B", "C A B D", "C (or possibly A)", ``\\boxed{A, B}``,
  "(A) (B) (C) (D)") has no answer. Options are upper-case letters standing alone: the article
  "a" is not option A, and "A. B is wrong because ..." is a remark after the answer A.
* ``qa``: SQuAD-style normalisation (lower case, no punctuation, no articles, single spaces);
  correct when the extracted final answer, or the whole reply, equals a gold alias, or when the
  final answer is the alias after a short neutral lead-in (at most ``QA_MAX_EXTRA_TOKENS`` words
  ending in a linking word: "It was sung by ...", "It is ...") and nothing after it. A list, an
  alternative, a negation or a hedge ("Paris London", "Paris | London", "not Paris", "Paris is
  incorrect", "it is unlikely to be Paris") is wrong. Aliases come from ``metadata["aliases"]``
  (a list) or from ``Task.answer`` split on ``ALIAS_SEP``.
* ``code``: the last fenced Python block (the last one defining the entry point, if several),
  or the whole reply, is loaded in a bubblewrap sandbox and the task's tests run against it from
  a second sandbox (:func:`rl_conductor.tasks.sandbox.run_tests`); a pass is the test runner's
  verdict that every test ran and passed, never the candidate's exit status. When no sandbox
  can be built, grading raises ``SandboxUnavailableError``.
* ``recorded``: items of a recordings file that give no way to grade (no gold answer, code
  without tests) carry each recorded text's label; the grade is that label (:class:`RecordedGrader`).

Graders never raise on odd input (empty, huge, binary junk, unbalanced LaTeX): they return
False / None. Only an unknown grader name, a missing sandbox or a math helper that cannot start
raise, because those are setup errors. The threat model is in ``docs/sandbox.md``.

Deliberate simplifications: text is scanned only in its last ``MAX_SCAN_CHARS`` characters
(answers come at the end); math calls are serialised through one helper process.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import itertools
import json
import math
import os
import re
import signal
import string
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.sandbox import TestSpec, readable, run_tests

#: Only the tail of a reply is scanned for an answer.
MAX_SCAN_CHARS = 20_000
#: Longer extracted math answers are rejected before math-verify sees them.
MAX_CANDIDATE_CHARS = 300
#: CPU seconds math-verify may spend on one parse or comparison (in the helper; the call then
#: counts as failed, as math-verify's own timeout would).
MATH_TIMEOUT_S = 2
#: CPU seconds the math helper may spend on one request before the kernel kills it (C code that
#: holds the interpreter lock; the answer is graded wrong and the helper restarted).
MATH_HARD_TIMEOUT_S = 6.0
#: Wall seconds a caller waits for one answer of the helper before killing it: only a helper
#: that is stuck without computing reaches it (the CPU limits above end any computation first,
#: unless the machine gives the helper less than a twentieth of a core).
MATH_WALL_BACKSTOP_S = 120.0
#: Seconds the math helper process may take to start (it imports sympy).
MATH_START_TIMEOUT_S = 120.0
#: Delimiter between gold aliases in ``Task.answer`` for the ``qa`` grader.
ALIAS_SEP = "|||"
#: A qa answer may have a lead-in of at most this many words before the alias ("It was sung by").
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
#: A final line "A: <answer>" states the answer (math-verify would read "A: 18" as the ratio a/18).
_QA_STYLE_ANSWER = re.compile(r"^A\s*:\s*(.+)$")
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
    if said is None:  # a last line "A: 18" (question/answer style, e.g. OpenAI's GSM8K samples)
        final = _final_line(text)
        qa_style = _QA_STYLE_ANSWER.match(final) if final is not None else None
        said = qa_style.group(1) if qa_style else None
    if said is not None:
        said = said.split("\n", 1)[0]
        # "The answer is 18 because ..." keeps "18"; a sentence ending ends the answer.
        said = re.split(r"(?<=[^\d\\])\.\s|\s+(?:because|since|as)\s", said, maxsplit=1)[0]
        return _clean_math(said)
    final = _final_line(text)
    if final is not None and _looks_like_math(final) and _parses(_clean_math(final) or ""):
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


@contextlib.contextmanager
def _cpu_time_limit(seconds: float) -> Iterator[None]:
    """Raise math-verify's ``TimeoutException`` once this process has spent ``seconds`` of CPU
    time (user + system, ``ITIMER_PROF``) inside the block; no limit outside the main thread.

    Why CPU time, not math-verify's own ``signal.alarm`` (wall time): on a loaded machine a
    parse or comparison that takes 0.3 s of CPU can take over 2 s of wall time, so the same
    answer was graded right on an idle machine and wrong on a busy one (the candidate table
    then depended on the load). The CPU time a computation needs does not depend on the load."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from math_verify.errors import TimeoutException

    def expired(_signum: int, _frame: object) -> None:
        raise TimeoutException("CPU time limit")

    previous = signal.signal(signal.SIGPROF, expired)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


class MathServiceError(RuntimeError):
    """The math-verify helper process cannot start (for example math-verify is not installed)."""


class _MathService:
    """math-verify in one long-lived helper process, so every call has a hard time limit.

    math-verify's own timeout is ``signal.alarm``: it works only in the main thread, cannot
    stop C code (sympy raising ``9^{9^{9}}`` holds the interpreter lock until done) and counts
    wall time, so a grade depended on the machine's load. Here the child runs the parse and
    comparison in its main thread under a CPU-time limit per call (:func:`_cpu_time_limit`,
    ``MATH_TIMEOUT_S``), and each request under a CPU-time kill (``ITIMER_VIRTUAL``, whose
    signal's default action ends the process even inside C code: ``MATH_HARD_TIMEOUT_S``); the
    answer is then graded wrong and the child started again on the next call. The caller, from
    any thread, waits at most ``MATH_WALL_BACKSTOP_S`` for a child stuck without computing.
    Calls are serialised by a lock (they were serialised by the interpreter lock before) and
    their answers cached.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""

    def _start(self) -> subprocess.Popen[bytes]:
        import rl_conductor

        root = os.path.dirname(os.path.dirname(os.path.abspath(rl_conductor.__file__)))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
        }
        proc = subprocess.Popen(
            [sys.executable, "-c", "from rl_conductor.tasks.graders import _math_service_main as m; m()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self._proc, self._buf = proc, b""
        if self._read_line(MATH_START_TIMEOUT_S) != b"ready":
            self._stop()
            raise MathServiceError("the math-verify helper process did not start (is math-verify installed?)")
        return proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if f is not None:
                        f.close()

    def _read_line(self, timeout: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not readable(fd, left):
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def ask(self, op: str, *args: str) -> Any:
        """The child's answer to ``op(*args)``, or None when it took too long or failed."""
        with self._lock:
            proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps([op, *args]).encode() + b"\n")
                proc.stdin.flush()
            except OSError:
                self._stop()
                return None
            line = self._read_line(MATH_WALL_BACKSTOP_S)
            if line is None:
                self._stop()
                return None
            return json.loads(line)[0]

    def close(self) -> None:
        with self._lock:
            self._stop()

    def forget(self) -> None:
        """In a forked child: drop the parent's helper (its pipes are shared) without killing it."""
        self._lock = threading.Lock()
        self._proc, self._buf = None, b""


_MATH = _MathService()
atexit.register(_MATH.close)
os.register_at_fork(after_in_child=_MATH.forget)


def close_math_helper() -> None:
    """Stop this process's math helper (the next math grade starts another). For a worker
    process about to end: ``atexit`` does not run in a ``multiprocessing`` worker."""
    _MATH.close()


def _math_service_main() -> None:
    """The helper process's loop: one JSON request per line on stdin, one reply per line."""
    out = sys.stdout.buffer
    _math_verify(_parse_math("1"), _parse_math("1"))  # import sympy and math-verify before "ready"
    out.write(b"ready\n")
    out.flush()
    for raw in sys.stdin.buffer:
        # the kernel ends this process (SIGVTALRM's default action) after MATH_HARD_TIMEOUT_S of
        # user CPU time in this request, even inside C code; the caller sees EOF
        signal.setitimer(signal.ITIMER_VIRTUAL, MATH_HARD_TIMEOUT_S)
        try:
            op, *args = json.loads(raw)
            if op == "verify":
                result: Any = _math_verify(_parse_math(args[0]), _parse_math(args[1]))
            elif op == "parses":
                result = bool(_parse_math(args[0]))
            elif op == "key":
                result = _math_key(args[0])
            else:
                result = None
        except Exception:
            result = None
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        out.write(json.dumps([result]).encode() + b"\n")
        out.flush()


@functools.lru_cache(maxsize=65536)
def _verify_strings(gold: str, cand: str) -> bool:
    return _MATH.ask("verify", gold, cand) is True


@functools.lru_cache(maxsize=65536)
def _parses(s: str) -> bool:
    return bool(s) and len(s) <= MAX_CANDIDATE_CHARS and _MATH.ask("parses", s) is True


@functools.lru_cache(maxsize=65536)
def _key_string(cand: str) -> str:
    key = _MATH.ask("key", cand)
    return key if isinstance(key, str) else " ".join(cand.split())


@functools.lru_cache(maxsize=4096)
def _parse_math(s: str) -> tuple[Any, ...]:
    if not s or len(s) > MAX_CANDIDATE_CHARS:
        return ()
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse
    from math_verify.errors import TimeoutException

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    for wrapped in ("\\boxed{" + s + "}", "$" + s + "$"):
        try:
            with _cpu_time_limit(MATH_TIMEOUT_S):
                parsed = parse(wrapped, extraction_config=config, parsing_timeout=None)
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

    # math-verify's verify: any pair (gold, prediction) equal, each comparison with its own
    # time limit (a comparison that runs out counts as unequal, and the next pair is tried)
    for g, p in itertools.product(gold, pred):
        try:
            with _cpu_time_limit(MATH_TIMEOUT_S):
                if verify([g], [p], timeout_seconds=None):
                    return True
        except (Exception, TimeoutException):
            continue
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


_VARIABLE = re.compile(
    r"^(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?[A-Za-z0-9]+\}?)?"
    r"(?:\s*(?:\(|\\left\()[^()=]*(?:\)|\\right\)))?$"  # f(5), a_{n}(x): a function application
)
#: Relations and arrows: ``5 \Rightarrow 9`` or ``0 \equiv 9`` is not the answer 9.
_RELATION = re.compile(
    r"\\(?:Rightarrow|rightarrow|Longrightarrow|longrightarrow|Leftarrow|leftarrow|Leftrightarrow"
    r"|leftrightarrow|implies|impliedby|iff|to|gets|mapsto|equiv|neq|ne|leq|geq|le|ge|lt|gt|sim|cong"
    r"|propto)(?![A-Za-z])|[<>→⇒⟹↦≡≠≤≥]|->|=>"
)


def _unhedged_math(cand: str, gold: str) -> str | None:
    """The candidate to compare, or None when it hedges: a relation or arrow (``5 \\to 9``), an
    equation whose left side is not a lone variable or function application (``5 = 7`` is not 7;
    ``x = 7`` and ``f(5) = 7`` are) or an "or" of alternatives, unless the gold answer itself has
    that shape."""
    if _RELATION.search(cand) and not _RELATION.search(gold):
        return None
    if "=" in cand and "=" not in gold:
        parts = cand.split("=")
        if len(parts) != 2 or not _VARIABLE.match(parts[0].strip()) or not parts[1].strip():
            return None
        cand = parts[1].strip()
    if re.search(r"\bor\b", cand) and not re.search(r"\bor\b", gold):
        return None
    return cand


def _lenient(fallback: Any) -> Any:
    """A grader method that answers ``fallback`` for a reply that is not text or that its parsing
    chokes on, instead of raising: an unreadable reply is a wrong one. A grading service's own
    failure (:class:`MathServiceError`) still raises: no service means no grading."""

    def wrap(method: Any) -> Any:
        @functools.wraps(method)
        def guarded(self: Any, task: Task, text: str) -> Any:
            if not isinstance(text, str):
                return fallback
            try:
                return method(self, task, text)
            except MathServiceError:
                raise
            except Exception:
                return fallback

        return guarded

    return wrap


@dataclass(frozen=True)
class MathGrader:
    """Symbolic equivalence of the extracted answer and the gold answer (math-verify, run in a
    helper process with a hard time limit)."""

    name: str = "math"

    @_lenient(None)
    def extract(self, task: Task, text: str) -> str | None:
        cand = _math_candidate(text)
        return _key_string(cand) if cand else None

    @_lenient(False)
    def grade(self, task: Task, text: str) -> bool:
        cand = _math_candidate(text)
        gold = _clean_math(last_boxed(task.answer) or task.answer)
        if cand is None or not gold:
            return False
        cand = _unhedged_math(cand, gold)
        return cand is not None and _verify_strings(gold, cand)


# --------------------------------------------------------------------------- multiple choice


def choice_texts(task: Task) -> list[str]:
    """The options of a multiple-choice task, in letter order (empty when unknown)."""
    choices = task.metadata.get("choices") or []
    return [str(c) for c in choices] if isinstance(choices, list | tuple) else []


def option_letters(n_choices: int) -> str:
    """The letters of ``n_choices`` options (every letter when the count is unknown or too many):
    what the grader reads an answer as, and what a recordings file's gold must be."""
    return LETTERS[:n_choices] if 0 < n_choices <= len(LETTERS) else LETTERS


def _letters_for(task: Task) -> str:
    return option_letters(len(choice_texts(task)))


def _another_option(after: str, cls: str, letter: str, *, remarks: bool = True) -> bool:
    """True when the text after a named option names another one: "A or B", "C A B D",
    "C (or possibly A)", "C, unless it is D", "C\\nA\\nB". An option is an upper-case letter
    standing alone (the article "a" is not option A); one that starts a sentence about it
    ("A. B is wrong because ...") is a remark, not a second answer, unless ``remarks`` is False."""
    for m in re.finditer(rf"(?<![A-Za-z0-9\\])\(?({cls})\)?(?![A-Za-z0-9'’])", after):
        if m.group(1) == letter:
            continue
        if remarks and re.match(r"[ \t]+[a-z]", after[m.end() :]):
            continue  # "B is wrong", "(A) refers to ..."
        return True
    return False


def _choice_letter(task: Task, text: str) -> str | None:
    """The one option the reply commits to, or None (no answer, or a hedge naming several)."""
    text = _tail(text)
    letters = _letters_for(task)
    cls = f"[{letters}]"
    boxed = last_boxed(text)
    if boxed is not None:
        named = set(re.findall(rf"(?<![A-Za-z0-9\\])({cls})(?![A-Za-z0-9])", boxed))
        if len(named) > 1:
            return None  # \boxed{A, B, C, D}
        m = re.fullmatch(
            rf"\s*(?:\\text(?:bf)?\{{)?\s*\(?({cls})\)?\s*\}}?\s*[.:)]?.*", boxed, flags=re.DOTALL
        )
        if m:
            return m.group(1)
    said = None
    for m in re.finditer(
        rf"answer\s*(?:is|:|：)?\s*[:：]?\s*\**\s*(?:option\s+|choice\s+|either\s+)?\(?({cls})\)?(?![A-Za-z0-9])",
        text,
        flags=re.IGNORECASE,
    ):
        if m.group(1) in letters:
            said = m
    if said is not None:
        if _another_option(text[said.end() :], cls, said.group(1)):
            return None  # "Answer: A or B", "The answer is A, B, C or D."
        return said.group(1)
    final = _final_line(text)
    if final is not None:
        m = re.fullmatch(rf"[*\s]*\(?({cls})\)?[.:)]?[*\s]*", final)
        if m:
            return m.group(1)
        # "B) mitochondrion", "(B) mitochondrion", "B. mitochondrion"
        m = re.match(rf"[*\s]*(?:\(({cls})\)|({cls})[.)])[*\s]+\S", final)
        if m:
            letter = m.group(1) or m.group(2)
            if not _another_option(final[m.end() - 1 :], cls, letter, remarks=False):
                return letter
    opts = choice_texts(task)
    if opts:
        spoken = _last_answer_is(text) or final
        if spoken is not None:
            norm = normalize_text(spoken.split("\n", 1)[0])
            hits = [i for i, o in enumerate(opts) if normalize_text(o) == norm and norm]
            if len(hits) == 1:
                return letters[hits[0]]
    paren = list(re.finditer(rf"\(({cls})\)", text))
    if paren:
        last = paren[-1]
        # "(A) (B) (C) (D)": a list of options, not a choice
        if re.search(
            rf"\({cls}\)\s*(?:[,/&;]|\bor\b|\band\b)?\s*$", text[: last.start()], flags=re.IGNORECASE
        ):
            return None
        return last.group(1)
    return None


@dataclass(frozen=True)
class ChoiceGrader:
    """Letter extracted from the reply equals the gold letter."""

    name: str = "choice"

    @_lenient(None)
    def extract(self, task: Task, text: str) -> str | None:
        return _choice_letter(task, text)

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


#: Words that turn a reply containing the gold answer into a hedge or a negation of it.
_HEDGE_WORDS = frozenset(
    {
        "or", "nor", "not", "no", "neither", "either", "never", "and", "vs", "versus", "isnt", "wasnt",
        "arent", "werent", "cannot", "cant", "couldnt", "wouldnt", "doesnt", "dont", "didnt", "wrong",
        "incorrect", "false", "unlikely", "likely", "probably", "maybe", "perhaps", "possibly",
        "guess", "might", "could", "unsure", "doubt", "except", "unless", "rather", "instead",
    }
)  # fmt: skip
#: Words a lead-in before the gold answer may end with ("It was sung by ...", "It is ...").
_LEAD_IN_ENDS = frozenset(
    {"is", "was", "are", "were", "be", "by", "of", "in", "at", "from", "called", "named", "its", "answer"}
)
_LIST_SEP = ","  # normalisation removes every comma, so this token only ever marks a separator


def _tokens_with_separators(s: str) -> list[str]:
    """Normalised tokens, with list separators (, ; / & | + ? ( ) and dashes) kept as a token."""
    marked = normalize_text(re.sub(r"[,;/&|+?()\[\]]|\s[-–—]+\s", " qqlistsepqq ", s)).split()
    return [_LIST_SEP if t == "qqlistsepqq" else t for t in marked]


def _find_phrase(hay: list[str], needle: list[str]) -> tuple[int, int] | None:
    """Span of ``needle`` in ``hay``, list separators inside the span ignored."""
    for i in range(len(hay)):
        j, k = i, 0
        while j < len(hay) and k < len(needle):
            if hay[j] == needle[k]:
                k += 1
            elif hay[j] != _LIST_SEP or k == 0:
                break
            j += 1
        if k == len(needle):
            return i, j
    return None


def _contains_unhedged(cand_text: str, gold: str) -> bool:
    """``cand_text`` is the gold phrase after a short neutral lead-in and nothing after it.

    The lead-in has at most ``QA_MAX_EXTRA_TOKENS`` words and ends with a linking word ("It was
    sung by Sammy Davis Jr", "It is Paris"). Anything after the gold ("Paris London", "Paris is
    incorrect", "Paris (wrong)"), a lead-in that is another answer ("London Paris"), a list
    separator ("London, Paris") or a hedge or negation word ("not Paris", "it is unlikely to be
    Paris") makes it wrong — unless those words are part of the gold answer itself."""
    gtoks = gold.split()
    hay = _tokens_with_separators(cand_text)
    while hay and hay[-1] == _LIST_SEP and (not gtoks or gtoks[-1] != _LIST_SEP):
        hay.pop()  # a trailing "?" or ")" after the answer
    span = _find_phrase(hay, gtoks)
    if span is None or span[1] != len(hay):
        return False
    lead = hay[: span[0]]
    if len(lead) > QA_MAX_EXTRA_TOKENS:
        return False
    if lead and lead[-1] not in _LEAD_IN_ENDS:
        return False
    return not any(t == _LIST_SEP or t in _HEDGE_WORDS for t in lead)


@dataclass(frozen=True)
class QAGrader:
    """Normalised exact match against gold aliases, with a bounded, hedge-free containment rule."""

    name: str = "qa"

    @_lenient(None)
    def extract(self, task: Task, text: str) -> str | None:
        cand = _qa_candidate(text)
        norm = normalize_text(cand) if cand else ""
        return norm or None

    @_lenient(False)
    def grade(self, task: Task, text: str) -> bool:
        raw = _qa_candidate(text)
        cand = normalize_text(raw) if raw else ""
        whole = normalize_text(_tail(text)) if len(text) <= 2000 else ""
        for alias in gold_aliases(task):
            gold = normalize_text(alias)
            if not gold:
                continue
            if gold in (cand, whole):
                return True
            if raw and _contains_unhedged(raw, gold):
                return True
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


def candidate_program(task: Task, code: str) -> str:
    """The module the candidate sandbox loads: the task's test imports, then the candidate's code.

    A body-only HumanEval completion (check-style tests, no ``def entry_point``) is appended to
    the prompt. The tests themselves are never part of it: they run in the runner sandbox.
    """
    meta = task.metadata
    entry = str(meta.get("entry_point") or "")
    prompt = str(meta.get("prompt") or "")
    imports = "\n".join(str(i) for i in meta.get("test_imports") or [])
    defines_entry = bool(entry) and re.search(rf"\bdef\s+{re.escape(entry)}\s*\(", code) is not None
    if isinstance(meta.get("tests"), str) and entry and prompt and not defines_entry:
        code = prompt + code
    # a candidate's `from __future__` imports must stay the module's first statements
    future = [ln for ln in code.splitlines() if _FUTURE.match(ln)]
    if future and imports:
        code = "\n".join(ln for ln in code.splitlines() if not _FUTURE.match(ln))
        imports = "\n".join(future) + "\n" + imports
    return "\n\n".join(p for p in (imports, code) if p) + "\n"


_FUTURE = re.compile(r"^from\s+__future__\s+import\s")


def test_spec(task: Task) -> TestSpec:
    """The task's tests as a :class:`TestSpec`: MBPP assert lists (or one string of asserts) or
    HumanEval ``check`` code (a string that defines ``check``)."""
    meta = task.metadata
    tests = meta.get("tests")
    entry = str(meta.get("entry_point") or "")
    imports = tuple(str(i) for i in meta.get("test_imports") or [])
    if isinstance(tests, str) and not re.search(r"^\s*def\s+check\s*\(", tests, flags=re.MULTILINE):
        return TestSpec("asserts", (tests,), entry, imports)  # a block of asserts, not a check program
    if isinstance(tests, str):
        return TestSpec("check", tests, entry, imports, str(meta.get("prompt") or ""))
    if isinstance(tests, list | tuple) and tests:
        return TestSpec("asserts", tuple(str(t) for t in tests), entry, imports)
    raise ValueError(f"code task {task.id} has no tests (metadata['tests'])")


@dataclass(frozen=True)
class CodeGrader:
    """Runs the extracted code in the sandbox and the task's tests against it in another one;
    correct only when the runner reports that every test ran and passed."""

    name: str = "code"

    @_lenient(None)
    def extract(self, task: Task, text: str) -> str | None:
        code = extract_code(_tail(text), task.metadata.get("entry_point"))
        key = " ".join(code.split())
        return key or None

    def grade(self, task: Task, text: str) -> bool:
        return self.settled_grade(task, text)[0]

    def settled_grade(self, task: Task, text: str) -> tuple[bool, bool]:
        """(correct, settled): settled is False only when no verdict came from the test runner
        (the wall-clock backstop, or a runner that gave none): another run may grade otherwise,
        so such a grade is not kept beyond this process (``tasks.grade_store``)."""
        if not isinstance(text, str) or not text.strip():
            return False, True
        spec = test_spec(task)
        try:
            code = extract_code(_tail(text), task.metadata.get("entry_point"))
        except Exception:
            return False, True
        if not code.strip() or "\x00" in code:
            return False, True
        timeout = float(task.metadata.get("timeout_s") or CODE_TIMEOUT_S)
        program = candidate_program(task, code)
        if not compiles(program):
            return False, True  # the sandbox would fail it at import: no process needed
        # SandboxUnavailableError propagates: no sandbox means no grading, never a weaker mode.
        verdict = run_tests(program, spec, timeout_s=timeout, memory_mb=CODE_MEMORY_MB)
        unsettled = verdict.total == 0 and verdict.error in ("timed out", "the test runner gave no verdict")
        return verdict.passed, verdict.passed or not unsettled


#: The file name :func:`compiles` gives the parser. Its compile-time warnings (``SyntaxWarning``:
#: ``assert (x, y)``, ``is`` with a literal; ``DeprecationWarning`` on 3.11: an invalid escape)
#: are about a worker's answer, not this process: the sandbox's interpreter decides what they
#: mean, so here every warning category is silenced for this name only (a table build printed
#: thousands of them to stderr). Only ``compile`` reports warnings under this name.
_COMPILE_NAME = "<rl-conductor-candidate>"
_SILENCE = ("ignore", None, Warning, re.compile(re.escape(_COMPILE_NAME)), 0)


def _silence_compile_warnings() -> None:
    """Put the filter (back) first: a ``warnings.catch_warnings`` block (pytest wraps every test
    in one) restores the list it found, dropping a filter added inside it, and a filter added
    later (``simplefilter("error")``, pytest's own) goes in front of ours. Cheap when it is
    first already (one comparison); else ``filterwarnings`` moves it to the front."""
    if not warnings.filters or warnings.filters[0] != _SILENCE:
        warnings.filterwarnings("ignore", category=Warning, module=re.escape(_COMPILE_NAME))


_silence_compile_warnings()


def compiles(program: str) -> bool:
    """False only when ``program`` is certainly not valid Python (a ``SyntaxError`` from
    :func:`compile`, which parses and never runs anything); anything else — valid code, or a
    parser that gives up (recursion, memory) — goes to the sandbox.

    Why: answers cut short (a budget or deadline capping the output) or prose without code are
    each distinct texts, so the grade cache rarely helps, and each would cost a sandboxed
    subprocess (milliseconds, more under load) to learn what the parser says in microseconds.
    Measured on the candidate table with deadline columns, these were most sandbox runs."""
    _silence_compile_warnings()
    try:
        compile(program, _COMPILE_NAME, "exec", dont_inherit=True)
    except SyntaxError:  # IndentationError and TabError included
        # a warning made an error by this process's filters (-W error) is no error to the
        # sandbox's interpreter (-I ignores PYTHONWARNINGS): confirm with warnings ignored
        # (rare path only: catch_warnings is not thread-safe)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                compile(program, _COMPILE_NAME, "exec", dont_inherit=True)
            except SyntaxError:
                return False
            except Exception:
                return True
        return True
    except Exception:
        return True
    return True


# --------------------------------------------------------------------------- recorded labels


#: How a stand-in starts: the text a replay worker answers with where only a label was recorded
#: and no gold exists (:func:`rl_conductor.tasks.recordings_format.stand_in`).
STAND_IN_PREFIX = "[recorded answer "


def text_key(text: str) -> str:
    """The key of a recorded text in ``metadata["recorded_labels"]`` (a SHA-256 prefix)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True)
class RecordedGrader:
    """Grades as recorded: items of a recordings file with no gold answer (or code without tests)
    carry each recorded text's correctness label (``metadata["recorded_labels"]``, keyed by
    :func:`text_key`; :mod:`rl_conductor.tasks.recordings_format`). A text no model recorded is wrong:
    there is nothing to grade it against."""

    name: str = "recorded"

    def grade(self, task: Task, text: str) -> bool:
        if not isinstance(text, str):
            return False
        return bool((task.metadata.get("recorded_labels") or {}).get(text_key(text), False))

    def extract(self, task: Task, text: str) -> str | None:
        """The answer key of the grader the file named for the item (``metadata.recorded_grader``:
        a math item's final number, a choice item's letter, a code item's code), so two workers'
        texts that state one answer agree, as they do on a gradable item: without it a file with
        texts but no gold could not be reviewed or voted on (every pair of answers "disagreed").
        A ``qa`` item (the default when the file names no grader) agrees on an answer the text
        *states* (``\\boxed{…}``, "the answer is …", "Answer: …", "#### …", "A: …"), else on
        the value its last line computes or names (:func:`_recorded_qa_key`): chat texts often
        end on a shared sign-off ("Hope this helps!") or a citation that a last-line rule would
        read as one answer, so such a text has no answer. A stand-in (a label without text) keys
        on its opaque digest, which says nothing of its label. A text no model recorded extracts
        as on a gradable item (it still grades wrong). Grades never depend on the key: they are
        the labels."""
        if not isinstance(text, str):
            return None
        if _STAND_IN.fullmatch(text):
            return text_key(text) if text_key(text) in (task.metadata.get("recorded_labels") or {}) else None
        own = answer_grader(task)
        if own.name == self.name:
            return text_key(text)
        if own.name == "qa":
            return _recorded_qa_key(_tail(text))
        return own.extract(task, text)


def _recorded_qa_key(text: str) -> str | None:
    """A qa item's answer key without gold: the answer the text states (:func:`_stated_answer`),
    else the value after the last ``=`` of its last line (a worked solution ending "… = $18 every
    day.") or the one number of a closing sentence ("So it takes 12 years."), as
    :func:`_answer_value` writes it. None when the text states nothing and its last line has no
    such value ("Hope this helps!", a "[1]" citation, a "(Source …, 2021)", a date or a time with
    several numbers, a question back): no answer found, which agrees with nothing. Deliberately
    strict: a false agreement keeps a wrong answer where a review would have escalated, a missed
    one only escalates."""
    stated = _stated_answer(text)
    if stated is not None:
        return _answer_value(stated)
    final = _final_line(text)
    if final is None:
        return None
    if "=" in final:
        stated = final.rsplit("=", 1)[1]
    else:  # a closing sentence with one number in it, not a citation, a source or a question
        numbers = _NUMBER.findall(final)
        if len(numbers) != 1 or final.startswith(("[", "(")) or final.rstrip().endswith("?"):
            return None
        stated = final[final.index(numbers[0]) :]
    value = _answer_value(stated)
    return value if value is not None and not value.startswith(("text:", "option:")) else None


_STATED = re.compile(
    r"(?:\bfinal\s+answer|\bthe\s+(?:correct\s+|final\s+|right\s+)?answer)\s*(?:is|:|：|=)\s*[:：]?\s*(.+)",
    re.IGNORECASE,
)
#: "Answer: X" opening a line (markdown emphasis allowed), not "my answer is based on …"
_ANSWER_LINE = re.compile(r"^[\s*_#>-]*answer[\s*_]*[:：][\s*_]*(.+)$", re.IGNORECASE | re.MULTILINE)
#: GSM8K's "#### 18" (a value, not a markdown heading such as "#### Final Answer")
_HASHES = re.compile(r"^\s*####[ \t]*([^\n]*\d[^\n]*?|\S+)\s*$", re.MULTILINE)
_STAND_IN = re.compile(re.escape(STAND_IN_PREFIX) + r"[0-9a-f]{12}\]")
_OPTION = re.compile(r"^\(?([A-J])\)(?:\s|$)|^\(?([A-J])[.)]?$")
_LEADING_NUMBER = re.compile(
    r"^[$€£]?\s*(-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?|-?\.\d+)\s*%?(?=$|\s|[.,;:!)](?:\s|$))"
)


def _answer_value(stated: str) -> str | None:
    """A stated answer as a key: ``option:C`` for an option letter ("(C) 42", "C."), the number it
    opens with by value ("$18", "18 dollars", "25% more likely", "1,000.00" -> ``18``, ``25``,
    ``1000``; not "1/2", "2^3" or "12,5", which stay text), else ``text:`` and its words in lower
    case, punctuation inside kept ("-1/2" is not "1/2")."""
    s = stated.replace("\u2212", "-").replace("\\$", "$").replace("\\%", "%")
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = s.strip(" \t*_`'\".,;:!")
    if not s:
        return None
    option = _OPTION.match(s)
    if option:
        return f"option:{option.group(1) or option.group(2)}"
    number = _LEADING_NUMBER.match(s)
    if number:
        value = float(number.group(1).replace(",", ""))
        if math.isfinite(value):
            key = repr(value)
            return key[:-2] if key.endswith(".0") else key
    return "text:" + " ".join(s.lower().split())


def _stated_answer(text: str) -> str | None:
    """The answer the text states last (boxed, "the answer is", a line "Answer: …", "#### 18", a
    last line "A: …"), or None."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    patterns = (_STATED, _ANSWER_LINE, _HASHES)
    found = [(m.start(), m.group(1)) for pattern in patterns for m in pattern.finditer(text)]
    final = _final_line(text)
    qa_style = _QA_STYLE_ANSWER.match(final) if final is not None else None
    if qa_style:
        found.append((len(text), qa_style.group(1)))
    if not found:
        return None
    said = max(found)[1].split("\n", 1)[0].strip()
    return said or None


def answer_grader(task: Task) -> Grader:
    """The grader whose answer keys ``task``'s answers are compared by: its own, or for an item
    graded as recorded the grader its file named (``metadata.recorded_grader``)."""
    grader = _grader_for(task)
    if grader.name != "recorded":
        return grader
    return GRADERS.get(str(task.metadata.get("recorded_grader", "qa")), grader)


# --------------------------------------------------------------------------- registry

GRADERS: dict[str, Grader] = {
    g.name: g for g in (MathGrader(), ChoiceGrader(), QAGrader(), CodeGrader(), RecordedGrader())
}


def _grader_for(task: Task) -> Grader:
    try:
        return GRADERS[task.grader]
    except KeyError:
        raise KeyError(
            f"unknown grader {task.grader!r} for task {task.id}; known: {sorted(GRADERS)}"
        ) from None


def recorded_label(task: Task, text: str) -> bool | None:
    """A code item's recorded label for ``text`` when a model of its recordings file recorded
    exactly this text with a label (``metadata.recorded_labels``,
    :mod:`rl_conductor.tasks.recordings_format`); None for any other text or task. Why: a
    recording's label is authoritative, and no line appended to a program makes it pass or fail
    its tests, so a recorded program whose tests disagree with its label (another harness, a
    timeout) could not replay as recorded."""
    if task.grader != "code" or not isinstance(text, str):
        return None
    labels = task.metadata.get("recorded_labels")
    if not isinstance(labels, dict):
        return None
    label = labels.get(text_key(text))
    if label is None and any(w.startswith(text) for w in task.metadata.get("recorded_wrong_texts", ())):
        return False  # a recorded wrong program cut short (max_tokens) is no better than whole
    return None if label is None else bool(label)


def grade(task: Task, text: str) -> bool:
    """True when ``text`` (a worker's final answer) solves ``task``. Never raises on odd text."""
    label = recorded_label(task, text)
    return label if label is not None else _grader_for(task).grade(task, text)


def settled_grade(task: Task, text: str) -> tuple[bool, bool]:
    """:func:`grade` and whether another run would surely grade the same (False only for a code
    answer whose test runner gave no verdict: see :meth:`CodeGrader.settled_grade`)."""
    label = recorded_label(task, text)
    if label is not None:
        return label, True
    grader = _grader_for(task)
    if isinstance(grader, CodeGrader):
        return grader.settled_grade(task, text)
    return grader.grade(task, text), True


def extract_answer(task: Task, text: str) -> str | None:
    """A normalised answer key for majority voting (None when no answer is found)."""
    return _grader_for(task).extract(task, text)


def answers_agree(a: str, b: str, task: Task) -> bool:
    """Whether two workers' answers to ``task`` state the same final answer: the task's grader
    extracts both (math through math-verify), and they agree when both extract and the keys are
    equal or, for math, symbolically equivalent. An answer with nothing to extract agrees with
    nothing. The one comparison of the cascade baseline and of the Conductor's review prompt."""
    return keys_agree(task, extract_answer(task, a), extract_answer(task, b))


@functools.lru_cache(maxsize=65536)
def _math_keys_agree(ka: str, kb: str) -> bool:
    return _verify_strings(ka, kb) or _verify_strings(kb, ka)


def keys_agree(task: Task, ka: str | None, kb: str | None) -> bool:
    """:func:`answers_agree` on answers already extracted with :func:`extract_answer`."""
    if ka is None or kb is None:
        return False
    if ka == kb:
        return True
    return answer_grader(task).name == "math" and _math_keys_agree(ka, kb)


def agreement(task: Task, answers: Sequence[str]) -> bool | None:
    """Whether every answer agrees with the first (:func:`answers_agree`); None for fewer than two."""
    if len(answers) < 2:
        return None
    return all(answers_agree(answers[0], other, task) for other in answers[1:])
