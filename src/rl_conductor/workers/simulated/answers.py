"""Answers of the simulated workers: rendered text, verified wrong answers, cached grading.

Why a module of its own: what a simulated worker *says* (filler reasoning, then a value in the
grader's format) is independent of whether it is right; the skill model decides correctness and
this module turns a value into text that the project's real graders grade.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
import re
import threading
from collections.abc import Callable
from functools import cache, lru_cache
from typing import Any

from rl_conductor.tasks.base import Task
from rl_conductor.workers.simulated.draws import seeded_rng

#: Probability weights of the per-item wrong answers (most popular first).
WRONG_WEIGHTS = (0.6, 0.28, 0.12)
#: Wrong answers per item, by grader: each distinct answer costs one real grading (a sandbox run
#: for code, a math-verify parse for math, tens of milliseconds), so math and code keep two.
WRONG_SET_SIZE = {"math": 2, "code": 2, "choice": 3, "qa": 3}

# --------------------------------------------------------------------------- grading (cached)

#: What a wrong worker says when no verified wrong answer exists for the item.
NO_ANSWER = "no answer"

_GRADE_CACHE: dict[tuple[str, str, str, str], bool] = {}
_RENDERED: dict[bytes, str | None] = {}
_CACHE_MAX = 500_000  # rendered texts
_GRADES_MAX = 500_000  # grades: a few values per item, so in practice never full
#: What :func:`simulated_value` returns for a text this process did not render.
NOT_RENDERED = object()
_WRITE_LOCK = threading.Lock()  # one for every cache of the simulation (see remember)


@lru_cache(maxsize=4096)
def text_digest(text: str) -> bytes:
    """The key of a rendered text in the caches below. Memoised for the texts of the executions
    in flight: each is looked up again by every later step that sees it (its author, its value),
    and a string's own hash is cached in it, so a hit costs far less than hashing kilobytes."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def evict_oldest(cache: dict[Any, Any], limit: int) -> None:
    """Make room in a full ``cache``: drop its older half (write order), never everything.

    Why not ``clear()``: a workflow's later step looks up what its earlier steps rendered (the
    value, the author). Clearing a full cache forgot the texts of executions still in flight, so
    an outcome depended on when, among all the executions of the process, the cache filled up:
    a forked table worker (which fills its own copy at other moments) scored some cells
    differently from the serial build. An entry is read at most a few thousand writes after it
    was last written (the executions in flight), far fewer than ``limit // 2``, so dropping the
    oldest half never loses one that is still needed — provided a re-written key counts as new,
    which :func:`remember` sees to."""
    if len(cache) < limit:
        return
    for key in list(itertools.islice(cache, len(cache) - limit // 2)):
        del cache[key]


def remember(cache: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """Write ``cache[key] = value`` as the newest entry, making room first (:func:`evict_oldest`).

    A plain re-assignment keeps a dict key at its first insertion's place, so a text rendered
    again at the end of a long-lived process (a server, a sweep) would be evicted as "old" while
    an execution in flight still reads it: the key is popped first, so write order is age. Under
    a lock: code grades are written from worker threads, and an eviction that iterates the dict
    while another thread inserts raised."""
    with _WRITE_LOCK:
        cache.pop(key, None)
        evict_oldest(cache, limit)
        cache[key] = value


def _remember(text: str, value: str | None) -> None:
    remember(_RENDERED, text_digest(text), value, _CACHE_MAX)


def simulated_value(text: str) -> object:
    """The answer value a simulated text was rendered with (None: cut before its answer), or
    ``NOT_RENDERED`` for text this process did not render."""
    return _RENDERED.get(text_digest(text), NOT_RENDERED)


def answer_key(task: Task, text: str) -> str:
    """What a grade depends on. For text this module rendered: its answer value (the filler around
    it contains nothing a grader extracts, which the tests check). Otherwise the grader's extracted
    answer (graders grade the extracted answer), or the whole text for ``qa``, which may read it."""
    from rl_conductor.tasks.graders import extract_answer, recorded_label

    value = simulated_value(text)
    if value is not NOT_RENDERED:
        return "cut" if value is None else f"value:{value}"
    if task.grader in ("qa", "recorded") or recorded_label(task, text) is not None:
        return f"text:{text.strip()}"  # a recorded grade is the label of the whole text
    ans = extract_answer(task, text)
    return "none" if ans is None else f"extracted:{ans}"


#: Graders whose grades of simulated values go to the grade store on disk: code, where each grade
#: costs a sandbox start and the runner's verdict says whether it is settled. Not math: a grade
#: made while the math-verify helper stalled is wrong and, through the helper's in-process
#: caches, looks settled (an outside review reproduced it sticking on disk); choice and qa are a
#: string comparison, cheaper than a lookup.
_STORED_GRADERS = frozenset({"code"})


def grade_cached(task: Task, text: str) -> bool:
    """The task's real grader, cached on (task, :func:`answer_key`): code grading runs a sandboxed
    subprocess and math grading a symbolic parse, and the simulation produces the same few answers
    per item over and over. A settled code grade of a simulated value is also kept on disk for
    the other processes of this ``CONDUCTOR_HOME`` (:mod:`rl_conductor.tasks.grade_store`)."""
    from rl_conductor.tasks import graders

    value_key = answer_key(task, text)
    key = (task.id, task.grader, task.answer, value_key)
    hit = _GRADE_CACHE.get(key)
    if hit is None:
        hit = _stored_grade(task, value_key)
        if hit is None:
            hit, settled = graders.settled_grade(task, text)
            if settled:  # a code answer whose runner gave no verdict is not kept for others
                _store_grade(task, value_key, hit)
        remember(_GRADE_CACHE, key, hit, _GRADES_MAX)
    return hit


def _stored_grade(task: Task, value_key: str) -> bool | None:
    store = _store_for(task, value_key)
    return None if store is None else store.get(_store_key(task, value_key))


def _store_grade(task: Task, value_key: str, ok: bool) -> None:
    store = _store_for(task, value_key)
    if store is not None:
        store.put(_store_key(task, value_key), ok)


def _store_for(task: Task, value_key: str) -> Any:
    """The grade store for this grade (None: not a stored kind of grade, or no store)."""
    from rl_conductor.tasks import grade_store

    if task.grader not in _STORED_GRADERS or not value_key.startswith(("value:", "cut")):
        return None
    return grade_store.shared_store()


def _store_key(task: Task, value_key: str) -> bytes:
    from rl_conductor.tasks.grade_store import grade_key

    return grade_key(task, value_key)


def grade_simulated(task: Task, text: str) -> bool | None:
    """The grade of a text this process's simulation rendered, by the value it was rendered with
    (:func:`grade_cached`: graded once per item and value); None for any other text.

    Why: every rendering of a value has its own filler, so a cache keyed by the text misses on
    each one, and a code answer cost a sandbox start per rendering (evaluation's routers graded
    2,468 of them one after another to measure each worker alone on the training split)."""
    return None if simulated_value(text) is NOT_RENDERED else grade_cached(task, text)


async def grade_cached_async(task: Task, text: str) -> bool:
    """:func:`grade_cached`, off the event loop for code (a subprocess per uncached answer)."""
    if task.grader == "code":
        return await asyncio.to_thread(grade_cached, task, text)
    return grade_cached(task, text)


# --------------------------------------------------------------------------- answer rendering

_FILLER = {
    "math": [
        "We restate the given quantities and what is asked.",
        "Writing the condition as an equation makes the structure clearer.",
        "We simplify the expression term by term.",
        "Substituting the known values reduces the problem to one unknown.",
        "A quick check with a small case confirms the pattern.",
        "We collect like terms and factor where possible.",
        "The constraint rules out the extraneous solution.",
        "Rewriting the fraction over a common denominator helps.",
        "We verify that the intermediate result satisfies the original condition.",
        "Using symmetry, we only need to consider one case.",
    ],
    "knowledge": [
        "We recall the relevant definition from the subject.",
        "Each option is compared with the standard result.",
        "Two of the options contradict the basic principle and can be ruled out.",
        "The remaining options differ in one detail, which decides it.",
        "This matches the textbook statement of the concept.",
    ],
    "reasoning": [
        "We list the facts given in the question.",
        "Each clue narrows the possibilities.",
        "Combining the constraints eliminates most of the cases.",
        "We check the remaining case against every clue.",
        "The chain of inferences is consistent from start to end.",
        "Considering the alternatives one by one, only one survives.",
    ],
    "code": [
        "We read the specification and the examples carefully.",
        "The function iterates over the input once and builds the result.",
        "Edge cases: empty input and single elements are handled.",
        "The complexity is linear in the size of the input.",
        "We trace the examples by hand to confirm the behaviour.",
        "Helper variables keep the logic readable.",
    ],
}
#: The answer a simulated worker gives to a question with no reference answer (an ad-hoc request).
PLACEHOLDER = "(simulated worker: no reference answer is available for this question)"


def _final_block(task: Task, value: str) -> str:
    if task.grader == "math":
        return f"Therefore, the final answer is $\\boxed{{{value}}}$."
    if task.grader == "choice":
        return f"Answer: {value}"
    if task.grader == "code":
        return f"```python\n{value}\n```"
    return f"Answer: {value}"


_CONNECTIVES = ("First,", "Next,", "Then", "Also,", "Now", "Again,", "So")


@cache
def _corpus(domain: str) -> tuple[str, tuple[int, ...]]:
    """A long, fixed filler text per domain and the offsets where its lines start."""
    bank = _FILLER.get(domain, _FILLER["reasoning"])
    r = random.Random(f"filler/{domain}")  # a str seed is hashed with SHA-512: stable across runs
    lines = []
    for _ in range(1200):
        s = r.choice(bank)
        lines.append(f"{r.choice(_CONNECTIVES)} {s[0].lower()}{s[1:]}")
    text = "\n".join(lines)
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    return text, tuple(starts)


def _filler(domain: str, n_chars: int, rng: random.Random) -> str:
    """About ``n_chars`` of reasoning-like sentences (whole lines) without digits, lone letters or
    answer phrases, so that no grader can extract an answer from them."""
    if n_chars <= 0:
        return ""
    text, starts = _corpus(domain)
    while len(text) < 2 * n_chars + 2:
        text = text + "\n" + text
    start = starts[rng.randrange(len(starts) // 2)] if len(text) - starts[len(starts) // 2] > n_chars else 0
    end = text.find("\n", start + n_chars)
    return text[start : end if end >= 0 else len(text)]


def render_answer(task: Task, value: str | None, n_tokens: int, rng: random.Random) -> str:
    """Text of about ``n_tokens`` tokens: filler reasoning, then ``value`` in the grader's format
    (``value=None``: the text was cut before the final answer)."""
    if value is None:
        cut = _filler(task.domain, max(4, n_tokens * 4 - 3), rng)[: max(4, n_tokens * 4)]
        _remember(cut, None)
        return cut
    if task.grader == "code":  # the text shows the code without trailing blanks: one value per text
        value = value.rstrip()
    final = _final_block(task, value)
    body_chars = n_tokens * 4 - len(final) - 2
    body = _filler(task.domain, body_chars, rng) if body_chars > 0 else ""
    text = f"{body}\n\n{final}" if body else final
    _remember(text, value)
    return text


# --------------------------------------------------------------------------- wrong answers

_NUM = re.compile(r"\d+")


def _math_candidates(gold: str, rng: random.Random) -> list[str]:
    nums = list(_NUM.finditer(gold))
    out: list[str] = []
    if nums:
        for _ in range(8):
            m = rng.choice(nums)
            n = int(m.group())
            new = rng.choice([n + 1, n - 1, n * 2, n + 2, max(0, n - 2), n * 10, n // 2 or 3])
            if new != n:
                out.append(gold[: m.start()] + str(new) + gold[m.end() :])
    out += [f"-{gold}" if not gold.startswith("-") else gold[1:], f"2({gold})", f"{gold} + 1"]
    return out


def _choice_candidates(task: Task, rng: random.Random) -> list[str]:
    choices = task.metadata.get("choices")
    n = len(choices) if isinstance(choices, list | tuple) and choices else 4
    letters = [chr(ord("A") + i) for i in range(min(max(n, 2), 10))]
    others = [x for x in letters if x != task.answer.strip().upper()]
    rng.shuffle(others)
    return others


def _qa_candidates(task: Task, rng: random.Random) -> list[str]:
    gold_words = set(re.findall(r"\w+", task.answer.lower()))
    words = [w for w in re.findall(r"[A-Za-z][A-Za-z\-]{3,}", task.question) if w.lower() not in gold_words]
    rng.shuffle(words)
    cands = [" ".join(words[i : i + 2]) for i in range(0, min(len(words), 6), 2)]
    return [*cands, "none of these", "it cannot be determined"]


_CODE_MUTATIONS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    (re.compile(r"(?<![<>=!])<(?![<=])"), lambda m: "<="),
    (re.compile(r"(?<![<>=!])>(?![>=])"), lambda m: ">="),
    (re.compile(r"<="), lambda m: "<"),
    (re.compile(r">="), lambda m: ">"),
    (re.compile(r"=="), lambda m: "!="),
    (re.compile(r"\bTrue\b"), lambda m: "False"),
    (re.compile(r"\bFalse\b"), lambda m: "True"),
    (re.compile(r"(?<![\w.])(\d+)(?![\w.])"), lambda m: str(int(m.group(1)) + 1)),
    (re.compile(r" \+ "), lambda m: " - "),
    (re.compile(r" - "), lambda m: " + "),
]


def _code_candidates(reference: str, rng: random.Random) -> list[str]:
    """Broken variants of the reference: one operator or constant mutated on one line (never on a
    ``while`` line, to avoid infinite loops), a variant that forgets its result (``return None``),
    more mutants, and last a variant that crashes. The forgetful variant comes second because it
    almost always fails, so verifying two wrong answers rarely needs more than three runs."""
    lines = reference.split("\n")
    spots: list[tuple[int, int, re.Match[str]]] = []
    for li, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "while", "def ", "import", "from", '"""', "'''")):
            continue
        for mi, (pat, _) in enumerate(_CODE_MUTATIONS):
            spots.extend((li, mi, m) for m in pat.finditer(line))
    rng.shuffle(spots)
    mutants: list[str] = []
    for li, mi, m in spots[:6]:
        line = lines[li]
        new_line = line[: m.start()] + _CODE_MUTATIONS[mi][1](m) + line[m.end() :]
        mutants.append("\n".join([*lines[:li], new_line, *lines[li + 1 :]]))
    forgetful: list[str] = []
    returns = [i for i, ln in enumerate(lines) if ln.strip().startswith("return ")]
    if returns:
        i = returns[-1]
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        forgetful.append("\n".join([*lines[:i], f"{indent}return None", *lines[i + 1 :]]))
    crash = reference.rstrip() + "\n\nraise RuntimeError('unfinished solution')\n"
    return [*mutants[:1], *forgetful, *mutants[1:], crash]


def wrong_candidates(task: Task, seed: int) -> list[str]:
    """Plausible wrong answer values for ``task`` in preference order (not yet verified)."""
    rng = seeded_rng(seed, "wrong-set", task.id)
    if task.grader == "math":
        return _math_candidates(task.answer.strip(), rng)
    if task.grader == "choice":
        return _choice_candidates(task, rng)
    if task.grader == "code":
        return _code_candidates(task.answer, rng)
    return _qa_candidates(task, rng)
