"""Grade a trace and turn it into a reward.

``reward = format_bonus·called + correct_weight·correct − cost_weight·cost/cost_scale − budget_penalty
− deadline_penalty`` (0 for an unparseable plan; each penalty only when that limit cut the workflow).
The format bonus is paid only when at least one worker call ran (``called``): a plan that calls
nobody — every step skipped or forbidden — must not out-earn a real plan whose answer was wrong,
or a GRPO group where every answer is wrong learns to do nothing.
The paper's reward (0 / 0.5 / 1, no cost term) is the ``paper``
preset; the default preset adds a cost term so that, between two equally correct workflows, the
cheaper one wins, and a penalty when a stated budget stopped the workflow early. A stated
deadline (``RequestLimits.max_latency_s``) that skipped a step (``skipped_deadline``) costs
``deadline_penalty`` in the same way — by default as much as the budget penalty, so the Conductor
learns to plan fewer sequential steps or faster workers when time is short rather than to plan
as if there were no deadline and lose steps to it.

``rl_conductor.training.grpo_reward.ConductorReward`` adapts this to TRL's reward-function contract
``(prompts, completions, **kwargs) -> list[float | None]``; training, evaluation and serving
share :func:`grade_trace` so "correct" means the same thing everywhere.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from rl_conductor.tasks.base import Task
from rl_conductor.trace import Trace


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the reward terms (see module docstring)."""

    format_bonus: float = 0.5
    correct_weight: float = 0.5
    # $0.01 costs 0.03 reward = 6 accuracy points: accuracy first, then the cheaper of equals.
    # (0.25 made the cheapest decent open model optimal everywhere, below the frontier's accuracy.)
    cost_weight: float = 0.03
    cost_scale: float = 0.01  # USD: a cost of `cost_scale` costs `cost_weight` reward
    budget_penalty: float = 0.25
    #: charged when the request's deadline skipped a step (``skipped_deadline``); like the budget's
    deadline_penalty: float = 0.25
    max_cost_penalty: float = (
        0.45  # capped below correct_weight: a correct answer stays worth more than a wrong one
    )

    def __post_init__(self) -> None:
        if self.cost_scale <= 0:
            raise ValueError(
                "cost_scale must be > 0 (it is the dollar amount that costs `cost_weight` reward)"
            )
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"{f.name} must be >= 0")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


REWARD_PRESETS: dict[str, RewardConfig] = {
    "paper": RewardConfig(cost_weight=0.0, budget_penalty=0.0, deadline_penalty=0.0),
    "cost-aware": RewardConfig(),
}


def reward_config(preset: str | RewardConfig = "cost-aware", **overrides: float | None) -> RewardConfig:
    """The reward of ``preset`` (a preset's name, or a reward to start from: a model's own) with
    any of its terms overridden (``cost_weight=0.25``; None: the preset's): the one place a reward
    is built from settings, for training, evaluation, the routers' fits and the pipeline's gate
    alike. An unknown preset or term is a ``ValueError`` that lists the known ones."""
    if isinstance(preset, str) and preset not in REWARD_PRESETS:
        raise ValueError(f"unknown reward preset {preset!r}; known: {', '.join(sorted(REWARD_PRESETS))}")
    unknown = sorted(set(overrides) - {f.name for f in fields(RewardConfig)})
    if unknown:
        raise ValueError(f"unknown reward terms {unknown}; known: {[f.name for f in fields(RewardConfig)]}")
    base = REWARD_PRESETS[preset] if isinstance(preset, str) else preset
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})


def reward_from_dict(data: dict[str, float]) -> RewardConfig:
    """A :class:`RewardConfig` from its ``to_dict`` (as ``conductor.json`` records it); unknown
    keys are an error, missing ones take the defaults."""
    known = {f.name for f in fields(RewardConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown reward terms {unknown}; known: {sorted(known)}")
    return RewardConfig(**{k: float(v) for k, v in data.items()})


def reward_from_options(options: Mapping[str, Any]) -> RewardConfig:
    """The reward a policy built from a spec is fitted at (the routers, the kNN router, the
    cascade): ``options["reward_config"]`` (a :class:`RewardConfig` or its ``to_dict``; what the
    evaluation scores with, e.g. the Conductor's own), else ``reward_preset`` / ``cost_weight``
    (cost-aware)."""
    given = options.get("reward_config")
    if given is not None:
        return given if isinstance(given, RewardConfig) else reward_from_dict(given)
    return reward_config(
        str(options.get("reward_preset") or "cost-aware"), cost_weight=options.get("cost_weight")
    )


def trained_reward(meta: Mapping[str, Any]) -> RewardConfig:
    """The reward a Conductor was trained with, from its ``conductor.json`` (``meta``): ``reward``
    as recorded; for older models rebuilt from ``train_config``'s reward settings; else (no
    Conductor, or one that records neither) the cost-aware preset. The one reader of it, with one
    fallback: the evaluation's reward, the Conductor's and the evidence rule's rankings and the
    retraining loop's observed reward all call it."""
    if isinstance(meta.get("reward"), dict):
        return reward_from_dict(meta["reward"])
    cfg = meta.get("train_config")
    if isinstance(cfg, dict) and cfg.get("reward_preset"):
        return reward_config(
            str(cfg["reward_preset"]), cost_weight=cfg.get("cost_weight"), cost_scale=cfg.get("cost_scale")
        )
    return reward_config()


def grade_trace(task: Task, trace: Trace) -> bool:
    """Whether the trace's final answer is correct for the task. A simulated worker's text is
    graded once per value it can be rendered with (``answers.grade_simulated``), any other text
    once per exact text."""
    from rl_conductor.workers.simulated.answers import grade_simulated

    text = trace.final_answer
    if not text:
        return False
    simulated = grade_simulated(task, text)
    return simulated if simulated is not None else _GRADES.grade(task, text)


class _GradeCache:
    """Grades of (task, answer) pairs, least recently used dropped beyond ``maxsize``.

    Rollouts repeat the same pairs often and code answers cost a sandboxed subprocess. Keys hold
    a SHA-256 of the answer, not its text, so a long GRPO run keeps ~100 bytes per entry instead
    of every answer it ever graded."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._grades: OrderedDict[tuple[Task, bytes], bool] = OrderedDict()
        self._lock = threading.Lock()

    def grade(self, task: Task, text: str) -> bool:
        from rl_conductor.tasks.graders import grade, recorded_label

        # a label lookup in the task's metadata, which Task's equality ignores: a reloaded, edited
        # file must not hit (an item graded as recorded; a code item's recorded text)
        if task.grader == "recorded":
            return grade(task, text)
        label = recorded_label(task, text)
        if label is not None:
            return label
        key = (task, hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())
        with self._lock:
            if key in self._grades:
                self._grades.move_to_end(key)
                return self._grades[key]
        result = grade(task, text)
        with self._lock:
            self._grades[key] = result
            while len(self._grades) > self.maxsize:
                self._grades.popitem(last=False)
        return result

    def __len__(self) -> int:
        return len(self._grades)


_GRADES = _GradeCache(maxsize=50_000)


def reward_of(
    config: RewardConfig,
    *,
    correct: ArrayLike,
    cost: ArrayLike,
    called: ArrayLike = True,
    budget_stopped: ArrayLike = False,
    deadline_stopped: ArrayLike = False,
    capped: bool = True,
) -> Any:
    """The reward formula (module docstring) of plans that parsed, over scalars or numpy arrays
    (broadcast together): the format bonus where a worker was ``called``, ``correct_weight`` times
    ``correct`` (a 0/1 outcome or an estimated probability), the cost term (capped at
    ``max_cost_penalty``; ``capped=False``: linear, as the review estimate's gain reads an extra
    cost, :func:`rl_conductor.review_evidence.gain_of`), and each penalty where its limit stopped
    the workflow. The one place the formula is written: a plan's reward (:func:`trace_reward`),
    the routers' and the cascade's reward matrices, the warm start's candidate tables, the
    evidence ranking and the review estimate's gain all call it. A float for scalars."""
    cost_term = config.cost_weight * np.asarray(cost, dtype=np.float64) / config.cost_scale
    r = (
        config.format_bonus * np.asarray(called, dtype=np.float64)
        + config.correct_weight * np.asarray(correct, dtype=np.float64)
        - (np.minimum(config.max_cost_penalty, cost_term) if capped else cost_term)
        - config.budget_penalty * np.asarray(budget_stopped, dtype=np.float64)
        - config.deadline_penalty * np.asarray(deadline_stopped, dtype=np.float64)
    )
    return float(r) if r.ndim == 0 else r


def budget_stopped(trace: Trace) -> bool:
    """True when a stated budget stopped the workflow before all its steps ran."""
    return any(s.status == "skipped_budget" for s in trace.steps)


def deadline_stopped(trace: Trace) -> bool:
    """True when a stated deadline skipped a step (``skipped_deadline``), in any round."""
    return any(s.status == "skipped_deadline" for s in trace.steps)


def trace_reward(trace: Trace, correct: bool, config: RewardConfig, *, parsed: bool = True) -> float:
    """The reward of one plan (see module docstring), executed as ``trace`` and graded
    ``correct``: 0 when the plan did not parse (``parsed=False``), else :func:`reward_of` of its
    cost, whether it made any worker call (``trace.attempts``, failed ones included) and whether
    its budget or deadline stopped it. The one place a trace becomes a reward: evaluation, the
    GRPO reward and the round-2 targets call it."""
    if not parsed:
        return 0.0
    return float(
        reward_of(
            config,
            correct=correct,
            cost=trace.cost_usd,
            called=len(trace.attempts) > 0,
            budget_stopped=budget_stopped(trace),
            deadline_stopped=deadline_stopped(trace),
        )
    )


#: How the executor notes a step whose output it capped to fit the time left.
_DEADLINE_CAP_NOTE = re.compile(r"deadline: output capped at (\d+) tokens")


def deadline_shortened(trace: Trace) -> bool:
    """True when a stated deadline skipped a step, or cut a step's answer short: its output was
    capped to what the time left affords and it used the whole cap (or the worker reported
    ``finish_reason == "length"``), or cut the plan to its answering step before it ran
    (``Trace.plan_cut``). What a response's ``deadline_cut`` and a summary's
    ``deadline_cut_rate`` report; the reward penalises only skipped steps
    (:func:`deadline_stopped`): a cut answer that is worse already earns less."""
    if deadline_stopped(trace) or trace.plan_cut:
        return True
    for s in trace.steps:
        m = _DEADLINE_CAP_NOTE.search(s.note)
        if m and (s.finish_reason == "length" or s.output_tokens >= int(m.group(1))):
            return True
    return False
