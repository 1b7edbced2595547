"""The skill model of the simulated pool: paper numbers, difficulty features, fitted skills.

See the package docstring (``rl_conductor.workers.simulated``) for the model and
``docs/simulated-pool.md`` for the numbers.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import itertools
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from rl_conductor.tasks.base import Task
from rl_conductor.workers.kinds import PoolConfigError
from rl_conductor.workers.simulated.answers import (
    NO_ANSWER,
    WRONG_SET_SIZE,
    WRONG_WEIGHTS,
    grade_cached_async,
    render_answer,
    wrong_candidates,
)
from rl_conductor.workers.simulated.draws import logistic, normal, seeded_rng, unit

#: Paper benchmark column whose accuracy each domain is calibrated to (Table 7, constrained).
DOMAIN_COLUMNS = {"math": "MATH500", "knowledge": "MMLU", "reasoning": "RLPR", "code": "LiveCodeBench"}
PAPER_TABLE = "constrained_in_domain_table7"

HIDDEN_DIFFICULTY_SD = 1.5
TOPIC_SD = 0.5
IDIOSYNCRATIC_SD = 0.8
CALL_NOISE_SCALE = 0.35
DEFAULT_CALIBRATION = "paper-mix:all"
DEFAULT_CALIBRATION_N = 2000

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
def paper_rows() -> dict[str, dict[str, float]]:
    """Every row of the paper's Table 7 (workers, baselines, the Conductor) as fractions per
    domain."""
    table = _calibration_json("conductor_paper_tables.json")[PAPER_TABLE]
    cols = table["columns"]
    return {
        name: {d: row[cols.index(col)] / 100.0 for d, col in DOMAIN_COLUMNS.items()}
        for name, row in table["rows"].items()
    }


@cache
def worker_prices() -> dict[str, dict[str, Any]]:
    """List prices (USD per 1M tokens) and hosting per worker, from ``worker_prices.json``."""
    workers: dict[str, dict[str, Any]] = _calibration_json("worker_prices.json")["workers"]
    return workers


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
    and :func:`rl_conductor.evaluation.calibrate.calibrate` measures on the same rule, so both see the
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
        rng = seeded_rng(self.seed, "render-check", task.id)
        for cand in wrong_candidates(task, self.seed):
            if cand in out or cand.strip() == task.answer.strip():
                continue
            if not await grade_cached_async(task, render_answer(task, cand, 8, rng)):
                out.append(cand)
            if len(out) == want:
                break
        self._wrong[key] = out
        return out

    async def prepare(self, tasks: Sequence[Task]) -> None:
        """Grade, in this process, every answer value a worker can give on ``tasks``: the gold
        answer and the verified wrong set (:meth:`verified_wrong`), into the grade cache.

        Why: the candidate table's parallel build forks workers that inherit this process's
        caches. Without this, each child graded what it met itself, and a grading that depends
        on time (the code sandbox's and math-verify's wall-clock limits) could come out otherwise
        under the children's load than in the serial build: a different wrong answer, a
        different cell. Prepared here once, every child reads the same grades as the serial
        build, which grades the same values the same way."""

        async def one(task: Task) -> None:
            rng = seeded_rng(self.seed, "render-prepare", task.id)
            wrong = await self.verified_wrong(task)
            # None: an answer cut before its end; a verifier that adopts an earlier wrong answer
            # says its stripped value; with no verified wrong answer a wrong worker says NO_ANSWER
            values = [task.answer, None, *(w.strip() for w in wrong), *([] if wrong else [NO_ANSWER])]
            for value in dict.fromkeys(values):
                await grade_cached_async(task, render_answer(task, value, 8, rng))

        await asyncio.gather(*(one(t) for t in tasks if t.answer.strip()))

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
