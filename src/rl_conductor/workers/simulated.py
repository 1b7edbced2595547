"""The ``simulated`` worker kind: an offline stand-in for the paper's seven workers.

Why it exists: training and evaluating a Conductor needs thousands of worker calls. The simulated
pool answers them in microseconds, for free, deterministically, with single-worker accuracies equal
to the paper's constrained-setting table (Table 7, ``data/calibration``) and prices from
``worker_prices.json``. Its answers are real text that the project's real graders grade. The
numbers are documented in ``docs/simulated-pool.md``.

The model: for worker ``w``, item ``i`` of domain ``d`` and a call ``k`` = (nonce, step index)::

    latent = skill[w,d] − (λ_w·f_i + 1.5·z_i) + topic[w,subject(i)] + ε[w,i] + η[w,i,k] + evidence
    correct ⇔ latent > 0

* ``f_i``: visible difficulty, from the question's own features (MATH level, reference-solution
  length, question length, number and length of choices, number of tests), z-scored per domain on
  the calibration items, weighted and standardised. ``λ_w`` (``feature_weight``): how much it
  hurts this worker (frontier and thinking models < 1, gemma > 1), so routing by it pays.
* ``z_i ~ N(0,1)``: hidden difficulty, a stable hash of (seed, task id), shared by all workers —
  their errors are correlated, as real models' are.
* ``topic ~ N(0, 0.5²)`` per (worker, domain, subject): specialisms a router can learn.
* ``ε ~ N(0, 0.8²)`` per (worker, item): persistent; a worker mostly agrees with itself.
* ``η ~ Logistic(0, 0.35)`` per call (hash of seed, worker, task id, nonce, step): sampling noise;
  self-consistency gains one or two points (Table 5), not more.
* ``evidence``, when the call sees earlier answers (``CallContext.visible_answers``, graded with
  the task's real grader): ``+EVIDENCE_CORRECT`` per correct one, ``−EVIDENCE_WRONG × k`` with
  ``k`` the largest group of identical wrong ones. A worker adopts a correct visible answer more
  readily the closer it was to solving the item itself (the stronger it is) and the more answers
  agree; agreeing wrong answers mislead it, and a wrong worker then repeats that wrong answer with
  probability ``k/(k+1)``. Three strong proposers plus an aggregator beat one answer but stay far
  from the best of the three: Mixture-of-Agents lands near the paper's MoA row.
* Instructions do **not** change accuracy — only live workers can reward good instructions — and
  temperature is ignored (``η`` is the sampling noise).

Calibration: ``skill[w,d]`` is solved on the *realised* outcomes of the deterministic
single-worker call (nonce 0, step 0) on the calibration items (default: ``paper-mix``, all splits,
≤ 500 items per domain by :func:`calibration_subset`). Item ``i`` is correct iff ``skill > c_i``
(``c_i`` = difficulty − topic − ε − η), so realised accuracy is a step function of the skill and
the solution is the order statistic that makes ``round(target·n)`` items correct — the limit of a
bisection, computed directly. Independent draws would add ≈2 points of sampling noise per
500-item domain on top of the paper's numbers; fitting to the realised draws removes it on the
calibration items, while other items (a split alone, another seed, other datasets) keep honest
sampling noise, as a real worker's accuracy would.

Answers: correct → filler reasoning, then the gold in the grader's format (``\\boxed{gold}``,
``Answer: X``, ``Answer: gold``, the reference code in a python block); wrong → one of a small,
popularity-weighted per-item set of wrong answers (perturbed numbers, other letters, mutated
reference code), each checked once with the real grader and replaced if it passes, so wrong
answers of different workers often coincide. The filler has no digits, lone letters or answer
phrases, so it never changes a grade, and it makes the text as long as the drawn output length
(lognormal per worker and domain, thinking models ≈3× longer, capped at 4,000 tokens):
``output_tokens == estimate_tokens(text)`` and visible context costs realistic input tokens.

Deliberate simplifications: a ``max_tokens`` below the drawn length cuts the text before its
answer (wrong); truncation at the paper's 4,096 limit is already inside its accuracies. A call
without a ``CallContext`` or gold answer (a serving request) gets a placeholder answer. Wrong
answers are crude perturbations, not real model mistakes.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import itertools
import json
import math
import random
import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

from rl_conductor.tasks.base import DOMAINS, Task
from rl_conductor.workers.base import (
    CallContext,
    Completion,
    Message,
    WorkerInfo,
    estimate_tokens,
    offline_completion,
)
from rl_conductor.workers.pool import PoolConfigError, info_from_spec, register_kind

#: Paper benchmark column whose accuracy each domain is calibrated to (Table 7, constrained).
DOMAIN_COLUMNS = {"math": "MATH500", "knowledge": "MMLU", "reasoning": "RLPR", "code": "LiveCodeBench"}
PAPER_TABLE = "constrained_in_domain_table7"

HIDDEN_DIFFICULTY_SD = 1.5
TOPIC_SD = 0.5
IDIOSYNCRATIC_SD = 0.8
CALL_NOISE_SCALE = 0.35
EVIDENCE_CORRECT = 0.8
EVIDENCE_WRONG = 0.9
LENGTH_SIGMA = 0.45
MAX_SIM_OUTPUT_TOKENS = 4000
#: Probability weights of the per-item wrong answers (most popular first).
WRONG_WEIGHTS = (0.6, 0.28, 0.12)
#: Wrong answers per item, by grader: each distinct answer costs one real grading (a sandbox run
#: for code, a math-verify parse for math, tens of milliseconds), so math and code keep two.
WRONG_SET_SIZE = {"math": 2, "code": 2, "choice": 3, "qa": 3}
DEFAULT_CALIBRATION = "paper-mix:all"
DEFAULT_CALIBRATION_N = 2000


@dataclass(frozen=True)
class WorkerProfile:
    """Behavioural numbers of one simulated worker (everything but prices and accuracy targets).

    Attributes:
        output_tokens: median output tokens per domain (lognormal, sigma ``LENGTH_SIGMA``).
        ttft_s: median time to first token.
        tokens_per_s: median decode speed.
        prefill_tokens_per_s: input tokens processed per second.
        feature_weight: λ, how much the visible difficulty features hurt this worker.
    """

    output_tokens: dict[str, int]
    ttft_s: float
    tokens_per_s: float
    prefill_tokens_per_s: float = 8000.0
    feature_weight: float = 1.0

    def mean_output_tokens(self) -> int:
        mean = statistics.fmean(self.output_tokens.values())
        return round(mean * math.exp(LENGTH_SIGMA**2 / 2))


def _lengths(math_: int, knowledge: int, reasoning: int, code: int) -> dict[str, int]:
    return {"math": math_, "knowledge": knowledge, "reasoning": reasoning, "code": code}


#: Built-in profiles of the paper's workers (constrained setting: minimal reasoning for the closed
#: models, full thinking for the two open reasoning models). A pool entry may override any field.
PROFILES: dict[str, WorkerProfile] = {
    "gpt-5": WorkerProfile(_lengths(480, 170, 430, 750), ttft_s=0.9, tokens_per_s=90, feature_weight=0.85),
    "claude-sonnet-4": WorkerProfile(
        _lengths(500, 180, 440, 760), ttft_s=1.1, tokens_per_s=60, feature_weight=0.95
    ),
    "gemini-2.5-pro": WorkerProfile(
        _lengths(540, 200, 470, 800), ttft_s=1.6, tokens_per_s=110, feature_weight=0.9
    ),
    "deepseek-r1-distill-qwen-32b": WorkerProfile(
        _lengths(1700, 700, 1800, 2300), ttft_s=0.35, tokens_per_s=38, feature_weight=1.05
    ),
    "gemma-3-27b-it": WorkerProfile(
        _lengths(380, 140, 320, 450), ttft_s=0.3, tokens_per_s=45, feature_weight=1.3
    ),
    "qwen3-32b": WorkerProfile(_lengths(450, 170, 400, 550), ttft_s=0.3, tokens_per_s=40, feature_weight=1.1),
    "qwen3-32b-thinking": WorkerProfile(
        _lengths(1500, 650, 1600, 2100), ttft_s=0.35, tokens_per_s=40, feature_weight=1.0
    ),
}
_GENERIC_PROFILE = WorkerProfile(_lengths(500, 180, 450, 700), ttft_s=0.5, tokens_per_s=50)


# --------------------------------------------------------------------------- packaged numbers


def _calibration_json(name: str) -> dict[str, Any]:
    path = resources.files("rl_conductor").joinpath("data", "calibration", name)
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


@cache
def paper_targets() -> dict[str, dict[str, float]]:
    """Single-worker accuracy (fraction) per worker and domain, from the paper's Table 7."""
    table = _calibration_json("conductor_paper_tables.json")[PAPER_TABLE]
    cols = table["columns"]
    out: dict[str, dict[str, float]] = {}
    for name, row in table["rows"].items():
        if name.startswith("baseline:") or name.startswith("conductor"):
            continue
        out[name] = {d: row[cols.index(col)] / 100.0 for d, col in DOMAIN_COLUMNS.items()}
    return out


@cache
def worker_prices() -> dict[str, dict[str, Any]]:
    """List prices (USD per 1M tokens) and hosting per worker, from ``worker_prices.json``."""
    workers: dict[str, dict[str, Any]] = _calibration_json("worker_prices.json")["workers"]
    return workers


# --------------------------------------------------------------------------- stable randomness


def unit(*parts: object) -> float:
    """A uniform number in (0, 1) from a stable hash of ``parts`` (never Python's ``hash()``)."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return (int.from_bytes(h, "big") + 0.5) / 2.0**64


_STD_NORMAL = statistics.NormalDist()


def normal(*parts: object) -> float:
    return _STD_NORMAL.inv_cdf(unit(*parts))


def logistic(*parts: object) -> float:
    u = unit(*parts)
    return math.log(u / (1.0 - u))


def _rng(*parts: object) -> random.Random:
    return random.Random(int(unit(*parts) * 2**53))


# --------------------------------------------------------------------------- difficulty features


def _log_len(text: str) -> float:
    return math.log1p(len(text))


def raw_features(task: Task) -> list[tuple[str, float, float]]:
    """Difficulty features a reader of the question can see: ``(name, value, weight)``."""
    md = task.metadata
    feats = [("question_len", _log_len(task.question), 1.0)]
    level = md.get("level")
    if isinstance(level, str):
        digits = re.findall(r"\d", level)
        level = int(digits[0]) if digits else None
    if isinstance(level, int | float) and not isinstance(level, bool):
        feats.append(("level", float(level), 3.0))  # MATH level dominates the math score
    ref_len = md.get("ref_len")
    if isinstance(ref_len, int | float) and not isinstance(ref_len, bool):
        feats.append(("ref_len", math.log1p(float(ref_len)), 1.5))
    elif task.domain == "code":
        feats.append(("ref_len", _log_len(task.answer), 1.5))
    choices = md.get("choices")
    if isinstance(choices, list | tuple) and choices:
        feats.append(("n_choices", float(len(choices)), 1.0))
        feats.append(("choices_len", _log_len(" ".join(map(str, choices))), 0.5))
    tests = md.get("tests")
    if task.domain == "code" and isinstance(tests, list | tuple):
        feats.append(("n_tests", math.log1p(len(tests)), 0.5))
    return feats


def _topic(task: Task) -> str:
    md = task.metadata
    for key in ("subject", "type", "category", "task_name"):
        if isinstance(md.get(key), str) and md[key]:
            return str(md[key])
    return task.source


@dataclass(frozen=True)
class FeatureScaler:
    """Turns raw features into the visible difficulty ``f_i``: each feature z-scored per domain on
    the calibration set, a weighted sum, then standardised again (unit variance per domain)."""

    feature_stats: dict[tuple[str, str], tuple[float, float]]
    score_stats: dict[str, tuple[float, float]]

    @classmethod
    def fit(cls, tasks: Sequence[Task]) -> FeatureScaler:
        values: dict[tuple[str, str], list[float]] = {}
        for t in tasks:
            for name, v, _ in raw_features(t):
                values.setdefault((t.domain, name), []).append(v)
        fstats = {k: (statistics.fmean(v), statistics.pstdev(v)) for k, v in values.items()}
        partial = cls(fstats, {})
        scores: dict[str, list[float]] = {}
        for t in tasks:
            scores.setdefault(t.domain, []).append(partial._weighted(t))
        sstats = {d: (statistics.fmean(v), statistics.pstdev(v)) for d, v in scores.items()}
        return cls(fstats, sstats)

    def _weighted(self, task: Task) -> float:
        total = 0.0
        for name, v, w in raw_features(task):
            mean, sd = self.feature_stats.get((task.domain, name), (0.0, 0.0))
            if sd > 1e-9:
                total += w * (v - mean) / sd
        return total

    def score(self, task: Task) -> float:
        mean, sd = self.score_stats.get(task.domain, (0.0, 0.0))
        if sd <= 1e-9:
            return 0.0
        return max(-3.0, min(3.0, (self._weighted(task) - mean) / sd))


def calibration_subset(tasks: Sequence[Task], n: int) -> list[Task]:
    """At most ``ceil(n / number of domains)`` tasks per domain, chosen by a salted hash of the
    id (order kept). The simulated pool fits its skills on this subset of its calibration dataset,
    and :func:`rl_conductor.workers.calibrate.calibrate` measures on the same rule, so both see the
    same items when given the same tasks and ``n``."""
    domains = sorted({t.domain for t in tasks})
    if not domains:
        return []
    quota = math.ceil(n / len(domains))
    keep: set[str] = set()
    for d in domains:
        ids = sorted((t.id for t in tasks if t.domain == d), key=lambda i: unit("calibration-subset", i))
        keep.update(ids[:quota])
    return [t for t in tasks if t.id in keep]


# --------------------------------------------------------------------------- grading (cached)

_GRADE_CACHE: dict[tuple[str, str, str, str], bool] = {}
_RENDERED: dict[bytes, str | None] = {}
_CACHE_MAX = 500_000
_MISSING = object()


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _remember(text: str, value: str | None) -> None:
    if len(_RENDERED) >= _CACHE_MAX:
        _RENDERED.clear()
    _RENDERED[_digest(text)] = value


def simulated_value(text: str) -> object:
    """The answer value a simulated text was rendered with (None: cut before its answer), or
    ``_MISSING`` for text this process did not render."""
    return _RENDERED.get(_digest(text), _MISSING)


def answer_key(task: Task, text: str) -> str:
    """What a grade depends on. For text this module rendered: its answer value (the filler around
    it contains nothing a grader extracts, which the tests check). Otherwise the grader's extracted
    answer (graders grade the extracted answer), or the whole text for ``qa``, which may read it."""
    from rl_conductor.tasks.graders import extract_answer

    value = simulated_value(text)
    if value is not _MISSING:
        return "cut" if value is None else f"value:{value}"
    if task.grader == "qa":
        return f"text:{text.strip()}"
    ans = extract_answer(task, text)
    return "none" if ans is None else f"extracted:{ans}"


def grade_cached(task: Task, text: str) -> bool:
    """The task's real grader, cached on (task, :func:`answer_key`): code grading runs a sandboxed
    subprocess and math grading a symbolic parse, and the simulation produces the same few answers
    per item over and over."""
    from rl_conductor.tasks.graders import grade

    key = (task.id, task.grader, task.answer, answer_key(task, text))
    hit = _GRADE_CACHE.get(key)
    if hit is None:
        hit = bool(grade(task, text))
        if len(_GRADE_CACHE) >= _CACHE_MAX:
            _GRADE_CACHE.clear()
        _GRADE_CACHE[key] = hit
    return hit


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
_PLACEHOLDER = "(simulated worker: no reference answer is available for this question)"


def _final_block(task: Task, value: str) -> str:
    if task.grader == "math":
        return f"Therefore, the final answer is $\\boxed{{{value}}}$."
    if task.grader == "choice":
        return f"Answer: {value}"
    if task.grader == "code":
        return f"```python\n{value.rstrip()}\n```"
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
    rng = _rng(seed, "wrong-set", task.id)
    if task.grader == "math":
        return _math_candidates(task.answer.strip(), rng)
    if task.grader == "choice":
        return _choice_candidates(task, rng)
    if task.grader == "code":
        return _code_candidates(task.answer, rng)
    return _qa_candidates(task, rng)


# --------------------------------------------------------------------------- the shared model


@dataclass
class SimulationModel:
    """Item facts, fitted skills and wrong-answer sets shared by the workers of one pool.

    Args:
        seed: drives every hashed draw.
        calibration: the dataset skills are fitted on: ``"dataset:split"`` (loaded lazily with
            ``rl_conductor.tasks.datasets.load_tasks``) or a sequence of Tasks.
        calibration_n: the fit uses :func:`calibration_subset` of it (≤ n/4 items per domain).
    """

    seed: int = 0
    calibration: str | Sequence[Task] = DEFAULT_CALIBRATION
    calibration_n: int = DEFAULT_CALIBRATION_N
    _reference: list[Task] | None = field(default=None, init=False, repr=False)
    _scaler: FeatureScaler | None = field(default=None, init=False, repr=False)
    _skills: dict[tuple[str, str, float, float], float] = field(default_factory=dict, init=False, repr=False)
    _wrong: dict[tuple[str, str, str], list[str]] = field(default_factory=dict, init=False, repr=False)
    _items: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict, init=False, repr=False)
    _persistent: dict[tuple[str, str, str], float] = field(default_factory=dict, init=False, repr=False)
    _inflight: dict[tuple[tuple[str, str, str], int], asyncio.Task[list[str]]] = field(
        default_factory=dict, init=False, repr=False
    )

    # ---- calibration set
    def reference(self) -> list[Task]:
        """The calibration items (loaded on first use)."""
        if self._reference is None:
            if isinstance(self.calibration, str):
                from rl_conductor.tasks.datasets import load_tasks

                name, _, split = self.calibration.partition(":")
                tasks = list(load_tasks(name, split or "all"))
            else:
                tasks = list(self.calibration)
            self._reference = calibration_subset(tasks, self.calibration_n)
            if not self._reference:
                raise PoolConfigError(f"simulated pool: calibration set {self.calibration!r} is empty")
        return self._reference

    def scaler(self) -> FeatureScaler:
        if self._scaler is None:
            self._scaler = FeatureScaler.fit(self.reference())
        return self._scaler

    # ---- latent components
    def difficulty(self, task: Task, feature_weight: float) -> float:
        """λ·f_i + 1.5·z_i (higher = harder)."""
        key = (task.id, task.domain)
        parts = self._items.get(key)
        if parts is None:
            parts = (self.scaler().score(task), HIDDEN_DIFFICULTY_SD * normal(self.seed, "item", task.id))
            self._items[key] = parts
        return feature_weight * parts[0] + parts[1]

    def persistent(self, worker: str, task: Task) -> float:
        """topic + ε: what this worker brings to this item beyond its domain skill."""
        key = (worker, task.id, task.domain)
        value = self._persistent.get(key)
        if value is None:
            topic = TOPIC_SD * normal(self.seed, "topic", worker, task.domain, _topic(task))
            value = topic + IDIOSYNCRATIC_SD * normal(self.seed, "eps", worker, task.id)
            self._persistent[key] = value
        return value

    def call_noise(self, worker: str, task: Task, nonce: int, step: int) -> float:
        """η: the per-call sampling noise (varies with nonce and step index)."""
        return CALL_NOISE_SCALE * logistic(self.seed, "call", worker, task.id, nonce, step)

    def threshold(self, worker: str, task: Task, feature_weight: float) -> float:
        """``c_i``: the single-worker call (nonce 0, step 0) is correct iff skill > c_i."""
        return (
            self.difficulty(task, feature_weight)
            - self.persistent(worker, task)
            - self.call_noise(worker, task, 0, 0)
        )

    def skill(self, worker: str, domain: str, target: float, feature_weight: float) -> float:
        """The skill whose realised single-call accuracy on the calibration items is ``target``."""
        key = (worker, domain, target, feature_weight)
        if key not in self._skills:
            items = [t for t in self.reference() if t.domain == domain]
            if not items:
                raise PoolConfigError(
                    f"simulated pool: calibration set {self.calibration!r} has no {domain!r} items"
                )
            cs = sorted(self.threshold(worker, t, feature_weight) for t in items)
            k = round(min(1.0, max(0.0, target)) * len(cs))
            if k == 0:
                s = cs[0] - 1.0
            elif k == len(cs):
                s = cs[-1] + 1.0
            else:
                s = (cs[k - 1] + cs[k]) / 2.0
            self._skills[key] = s
        return self._skills[key]

    def margin(self, worker: str, task: Task, target: float, feature_weight: float) -> float:
        """skill − difficulty + persistent: the latent before call noise and evidence."""
        s = self.skill(worker, task.domain, target, feature_weight)
        return s - self.difficulty(task, feature_weight) + self.persistent(worker, task)

    # ---- answers
    async def verified_wrong(self, task: Task) -> list[str]:
        """Up to three wrong answer values, each checked to grade wrong with the real grader
        (computed once per item; concurrent callers share one computation)."""
        key = (task.id, task.grader, task.answer)
        if key in self._wrong:
            return self._wrong[key]
        loop = asyncio.get_running_loop()
        slot = (key, id(loop))
        job = self._inflight.get(slot)
        if job is None:
            job = loop.create_task(self._compute_wrong(task, key))
            self._inflight[slot] = job
            job.add_done_callback(lambda _: self._inflight.pop(slot, None))
        return await asyncio.shield(job)

    async def _compute_wrong(self, task: Task, key: tuple[str, str, str]) -> list[str]:
        out: list[str] = []
        want = WRONG_SET_SIZE.get(task.grader, len(WRONG_WEIGHTS))
        rng = _rng(self.seed, "render-check", task.id)
        for cand in wrong_candidates(task, self.seed):
            if cand in out or cand.strip() == task.answer.strip():
                continue
            if not await grade_cached_async(task, render_answer(task, cand, 8, rng)):
                out.append(cand)
            if len(out) == want:
                break
        self._wrong[key] = out
        return out

    async def pick_wrong(self, task: Task, *parts: object) -> str | None:
        """One of the item's verified wrong answers, popular ones more often."""
        options = await self.verified_wrong(task)
        if not options:
            return None
        cum = list(itertools.accumulate(WRONG_WEIGHTS[: len(options)]))
        u = unit(self.seed, "wrong-pick", task.id, *parts) * cum[-1]
        return options[min(bisect.bisect_left(cum, u), len(options) - 1)]


_MODELS: dict[tuple[int, str, int], SimulationModel] = {}


def shared_model(
    seed: int,
    calibration: str | Sequence[Task] = DEFAULT_CALIBRATION,
    calibration_n: int = DEFAULT_CALIBRATION_N,
) -> SimulationModel:
    """One :class:`SimulationModel` per (seed, calibration set), shared by the workers of a pool."""
    if isinstance(calibration, str):
        key = (seed, calibration, calibration_n)
    else:
        ids = "\n".join(t.id for t in calibration)
        key = (seed, "tasks:" + hashlib.blake2b(ids.encode(), digest_size=12).hexdigest(), calibration_n)
    if key not in _MODELS:
        _MODELS[key] = SimulationModel(seed=seed, calibration=calibration, calibration_n=calibration_n)
    return _MODELS[key]


# --------------------------------------------------------------------------- the worker


@dataclass
class SimulatedWorker:
    """One simulated worker: static facts, behaviour profile, accuracy targets, shared model.

    Attributes:
        latency_scale: 0 reports latency without sleeping; > 0 sleeps ``latency_s * scale``.
    """

    info: WorkerInfo
    profile: WorkerProfile
    targets: dict[str, float]
    model: SimulationModel
    latency_scale: float = 0.0

    @property
    def seed(self) -> int:
        return self.model.seed

    def skill(self, domain: str) -> float:
        return self.model.skill(self.info.name, domain, self._target(domain), self.profile.feature_weight)

    def _target(self, domain: str) -> float:
        if domain not in self.targets:
            raise ValueError(
                f"simulated worker {self.info.name!r} has no accuracy target for domain {domain!r}"
            )
        return self.targets[domain]

    def margin(self, task: Task) -> float:
        """skill − difficulty + persistent effects for this worker on ``task`` (logit scale)."""
        return self.model.margin(self.info.name, task, self._target(task.domain), self.profile.feature_weight)

    def expected_accuracy(self, task: Task) -> float:
        """P(correct) of a fresh call that sees no earlier answers."""
        return 1.0 / (1.0 + math.exp(-self.margin(task) / CALL_NOISE_SCALE))

    async def _evidence(self, task: Task, visible: Sequence[str]) -> tuple[float, str | None, int]:
        """(latent shift, most common visible wrong answer value, its count)."""
        from rl_conductor.tasks.graders import extract_answer

        n_correct = 0
        wrong: Counter[str] = Counter()
        for text in visible:
            if not text or not text.strip():
                continue
            if await grade_cached_async(task, text):
                n_correct += 1
                continue
            known = simulated_value(text)
            ans = extract_answer(task, text) if known is _MISSING else known
            if isinstance(ans, str) and ans.strip():
                wrong[ans.strip()] += 1
        top, k_wrong = wrong.most_common(1)[0] if wrong else (None, 0)
        return EVIDENCE_CORRECT * n_correct - EVIDENCE_WRONG * k_wrong, top, k_wrong

    def draw_length(self, domain: str, *parts: object) -> int:
        median = self.profile.output_tokens.get(domain, _GENERIC_PROFILE.output_tokens["reasoning"])
        n = median * math.exp(LENGTH_SIGMA * normal(self.seed, "len", self.info.name, *parts))
        return int(max(16, min(MAX_SIM_OUTPUT_TOKENS, round(n))))

    def draw_latency(self, input_tokens: int, output_tokens: int, *parts: object) -> float:
        p = self.profile
        ttft = p.ttft_s * math.exp(0.25 * normal(self.seed, "ttft", self.info.name, *parts))
        decode = (
            output_tokens / p.tokens_per_s * math.exp(0.15 * normal(self.seed, "tps", self.info.name, *parts))
        )
        return round(ttft + decode + input_tokens / p.prefill_tokens_per_s, 4)

    async def answer(self, task: Task, ctx: CallContext) -> tuple[str | None, bool]:
        """(answer value, correct?) for one call, before length and truncation."""
        name = self.info.name
        shift, top_wrong, k_wrong = (0.0, None, 0)
        if ctx.visible_answers:
            shift, top_wrong, k_wrong = await self._evidence(task, ctx.visible_answers)
        latent = self.margin(task) + self.model.call_noise(name, task, ctx.nonce, ctx.step_index) + shift
        if latent > 0:
            return task.answer, True
        key = (name, ctx.nonce, ctx.step_index)
        if top_wrong is not None and unit(self.seed, "adopt", task.id, *key) < k_wrong / (k_wrong + 1):
            probe = render_answer(task, top_wrong, 8, _rng(self.seed, "render-check", task.id))
            if not await grade_cached_async(task, probe):  # re-rendered, it must still grade wrong
                return top_wrong, False
        return await self.model.pick_wrong(task, *key), False

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float,
        context: CallContext | None = None,
    ) -> Completion:
        """Answer one call (see the module docstring); ``temperature`` is ignored."""
        input_tokens = sum(estimate_tokens(m.get("content", "")) for m in messages)
        value: str | None
        if context is None or not context.task.answer.strip():
            joined = "\x1f".join(m.get("content", "") for m in messages)
            digest = hashlib.blake2b(joined.encode(), digest_size=8).hexdigest()
            ctx = CallContext(task=Task(f"adhoc/{digest}", "", "", "reasoning", "", "qa"))
            value = _PLACEHOLDER
        else:
            ctx = context
            value, _ = await self.answer(ctx.task, ctx)
            if value is None:  # no verified wrong answer exists: the worker gives up
                value = "no answer"
        task = ctx.task
        parts = (task.id, ctx.nonce, ctx.step_index)
        want = self.draw_length(task.domain, *parts)
        cap = max(1, max_tokens)
        if want > cap:  # the answer does not fit: cut before the final answer
            want, value = cap, None
        text = render_answer(task, value, want, _rng(self.seed, "text", self.info.name, *parts))
        output_tokens = estimate_tokens(text)
        if output_tokens > cap:  # a long final block (code) under a tight cap: cut it too
            text = text[: cap * 4]
            output_tokens = min(cap, estimate_tokens(text))
        latency = self.draw_latency(input_tokens, output_tokens, *parts)
        return await offline_completion(
            self.info,
            text,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            latency_s=latency,
            latency_scale=self.latency_scale,
        )


def _profile_from_spec(spec: dict[str, Any]) -> WorkerProfile:
    base = PROFILES.get(str(spec["name"]), _GENERIC_PROFILE)
    over: dict[str, Any] = {}
    if isinstance(spec.get("output_tokens"), dict):
        over["output_tokens"] = {
            **base.output_tokens,
            **{k: int(v) for k, v in spec["output_tokens"].items()},
        }
    for k in ("ttft_s", "tokens_per_s", "prefill_tokens_per_s", "feature_weight"):
        if k in spec:
            over[k] = float(spec[k])
    return replace(base, **over) if over else base


def _targets_from_spec(spec: dict[str, Any]) -> dict[str, float]:
    name = str(spec["name"])
    acc = spec.get("accuracy")
    if isinstance(acc, dict):
        out = {str(k): float(v) / (100.0 if float(v) > 1.0 else 1.0) for k, v in acc.items()}
    elif name in paper_targets():
        out = dict(paper_targets()[name])
    else:
        raise PoolConfigError(
            f"simulated worker {name!r} is not one of the paper's workers {sorted(paper_targets())}: "
            "give it `accuracy: {math: .., knowledge: .., reasoning: .., code: ..}`"
        )
    unknown = set(out) - set(DOMAINS)
    if unknown:
        raise PoolConfigError(f"simulated worker {name!r}: unknown domains in accuracy: {sorted(unknown)}")
    return out


@register_kind("simulated")
def build_simulated(spec: dict[str, Any], options: dict[str, Any]) -> SimulatedWorker:
    """Builder for ``kind: simulated``.

    Pool options: ``seed`` (0), ``latency_scale`` (0), ``calibration`` (``"paper-mix:all"`` or a
    list of Tasks) and ``calibration_n`` (2000). Worker entries may override the profile
    (``output_tokens``, ``ttft_s``, ``tokens_per_s``, ``feature_weight``) and give ``accuracy``
    per domain (required for workers that are not in the paper).
    """
    seed = int(options.get("seed", 0))
    scale = float(options.get("latency_scale", 0.0))
    if scale < 0:
        raise PoolConfigError("latency_scale must be >= 0")
    profile = _profile_from_spec(spec)
    info = info_from_spec(spec)
    if "typical_output_tokens" not in spec:
        info = replace(info, typical_output_tokens=profile.mean_output_tokens())
    return SimulatedWorker(
        info=info,
        profile=profile,
        targets=_targets_from_spec(spec),
        model=shared_model(
            seed,
            options.get("calibration", DEFAULT_CALIBRATION),
            int(options.get("calibration_n", DEFAULT_CALIBRATION_N)),
        ),
        latency_scale=scale,
    )
