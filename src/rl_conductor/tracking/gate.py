"""The evaluation gate: a challenger becomes champion only if it is measurably better.

Why: promotion moves the ``champion`` alias that serving loads, so it must follow a rule that
can be read, tested and logged, not a person's judgement at the end of a pipeline run.

The rule (``decide``): refuse a challenger below ``min_accuracy``; refuse it when it is below
the best baseline of its *own* evaluation (every single worker, the ``domain-router`` and the
``knn`` router, measured on the same questions, see :func:`best_baseline`) — by mean reward when
both carry one (``mean_reward`` / ``baseline_mean_reward``: the evaluation scores every policy,
and fits the routers, at the reward the Conductor was trained with, so a Conductor trained to
trade accuracy for cost is compared on that trade), else by accuracy (``baseline_accuracy``)
plus ``min_gain_over_baseline`` — a Conductor that a fixed router beats is registered but never
becomes champion, the first version included; promote it when there is no champion; otherwise
both must have been measured in the same world (same ``test_split_id``, which fingerprints the
task ids, the pool file's contents, the evaluation seed and the code version:
:func:`rl_conductor.fingerprint.evaluation_id`), its accuracy must reach the
champion's plus ``min_accuracy_gain``, and its mean cost must stay within ``max_cost_ratio``
times the champion's.

Deliberate simplifications: one accuracy and one mean cost per model, compared as point
estimates (no confidence intervals); equal-or-better passes with the default thresholds. The
split check compares identifiers only; computing them is the evaluation's job. Every threshold
is validated (:mod:`rl_conductor.validation`): a NaN would make every comparison false and wave
any challenger through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rl_conductor import validation
from rl_conductor.tracking.keys import BASELINE_POLICY_KEY, TEST_SPLIT_KEY

__all__ = [
    "ACCURACY",
    "BASELINE_ACCURACY",
    "BASELINE_COST",
    "BASELINE_POLICY",
    "BASELINE_REWARD",
    "COST",
    "GATE_BASELINES",
    "REWARD",
    "SPLIT",
    "GateDecision",
    "GateThresholds",
    "best_baseline",
    "decide",
    "promote_if_better",
]

ACCURACY = "accuracy"
COST = "mean_cost_usd"
SPLIT = TEST_SPLIT_KEY
#: Metrics (and a param) the evaluation attaches to the challenger: its best baseline's numbers.
BASELINE_ACCURACY = "baseline_accuracy"
BASELINE_COST = "baseline_mean_cost_usd"
BASELINE_POLICY = BASELINE_POLICY_KEY
REWARD = "mean_reward"
BASELINE_REWARD = "baseline_mean_reward"
#: Policies of an evaluation the challenger must not fall below: every single worker and the
#: two routers (prefixes of the policy names).
GATE_BASELINES = ("single:", "domain-router", "knn")
_EPS = 1e-12  # float noise must not flip an "equal" comparison


@dataclass(frozen=True)
class GateThresholds:
    """What a challenger must show to replace the champion."""

    min_accuracy_gain: float = 0.0  # absolute accuracy points over the champion (0.02 = +2 pts)
    max_cost_ratio: float = 1.0  # challenger mean cost <= champion mean cost x this
    min_accuracy: float = 0.0  # floor for any champion, including the first one
    min_gain_over_baseline: float = 0.0  # accuracy points over the best baseline (rewards unknown)
    min_reward_gain_over_baseline: float = 0.0  # mean reward over the best baseline (when known)
    require_baseline: bool = True  # refuse a challenger whose metrics lack the baseline's accuracy
    #: what "better than the champion" means: "accuracy" (its accuracy + min_accuracy_gain, its cost
    #: within max_cost_ratio) or "reward" (its mean reward + min_reward_gain: the trade the reward
    #: prices, so a cheaper, slightly less accurate challenger wins when prices rise; the
    #: retraining loop's choice, both measured again in the same world)
    versus_champion: str = "accuracy"
    min_reward_gain: float = 0.0  # mean reward over the champion (versus_champion="reward")

    def __post_init__(self) -> None:
        validation.non_negative_finite("min_accuracy_gain", self.min_accuracy_gain)
        validation.positive_finite("max_cost_ratio", self.max_cost_ratio)
        validation.probability("min_accuracy", self.min_accuracy)
        validation.non_negative_finite("min_gain_over_baseline", self.min_gain_over_baseline)
        validation.non_negative_finite("min_reward_gain_over_baseline", self.min_reward_gain_over_baseline)
        if not isinstance(self.require_baseline, bool):
            raise validation.InvalidValue("require_baseline", self.require_baseline, "true or false")
        if self.versus_champion not in ("accuracy", "reward"):
            raise validation.InvalidValue("versus_champion", self.versus_champion, "accuracy or reward")
        validation.non_negative_finite("min_reward_gain", self.min_reward_gain)


@dataclass(frozen=True)
class GateDecision:
    """Whether to promote, and a sentence that says why (logged as a version tag)."""

    promote: bool
    reason: str


def _number(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def decide(
    challenger: Mapping[str, Any],
    champion: Mapping[str, Any] | None,
    thresholds: GateThresholds | None = None,
) -> GateDecision:
    """Apply the gate to two metric dicts (``accuracy``, ``mean_cost_usd``, ``test_split_id``)."""
    t = thresholds or GateThresholds()
    acc = _number(challenger, ACCURACY)
    cost = _number(challenger, COST)
    if acc is None or cost is None:
        return GateDecision(False, f"challenger lacks numeric {ACCURACY!r} and {COST!r} metrics")
    if acc + _EPS < t.min_accuracy:
        return GateDecision(False, f"challenger accuracy {acc:.4f} is below the floor {t.min_accuracy:.4f}")
    base_acc = _number(challenger, BASELINE_ACCURACY)
    base_name = str(challenger.get(BASELINE_POLICY) or "the best baseline")
    if base_acc is None and t.require_baseline:
        return GateDecision(
            False,
            f"challenger lacks {BASELINE_ACCURACY!r} (the best single worker / domain-router of its "
            "evaluation): evaluate it with the baselines before promoting it",
        )
    versus = ""
    reward, base_reward = _number(challenger, REWARD), _number(challenger, BASELINE_REWARD)
    if reward is not None and base_reward is not None:
        if reward + _EPS < base_reward + t.min_reward_gain_over_baseline:
            gain = (
                f" + required gain {t.min_reward_gain_over_baseline:.4f}"
                if t.min_reward_gain_over_baseline
                else ""
            )
            return GateDecision(
                False,
                f"mean reward {reward:.4f} is below {base_name} ({base_reward:.4f}{gain}) at the reward it "
                "was trained with, on the same test questions: a fixed router does better, so this "
                "Conductor stays registered but not champion",
            )
        versus = f", reward {reward:.4f} >= {base_name} {base_reward:.4f}"
    elif base_acc is not None:
        if acc + _EPS < base_acc + t.min_gain_over_baseline:
            gain = f" + required gain {t.min_gain_over_baseline:.4f}" if t.min_gain_over_baseline else ""
            return GateDecision(
                False,
                f"accuracy {acc:.4f} is below {base_name} ({base_acc:.4f}{gain}) on the same test "
                "questions: a fixed router does better, so this Conductor stays registered but not champion",
            )
        versus = f", >= {base_name} {base_acc:.4f}"
    if champion is None:
        return GateDecision(
            True, f"no champion yet; challenger accuracy {acc:.4f}{versus}, mean cost ${cost:.6f}"
        )

    split, champ_split = challenger.get(SPLIT), champion.get(SPLIT)
    if not split or not champ_split:
        return GateDecision(False, f"cannot compare: {SPLIT} missing for the challenger or the champion")
    if str(split) != str(champ_split):
        return GateDecision(
            False, f"different test splits: challenger {split!r} vs champion {champ_split!r}; re-evaluate"
        )
    if t.versus_champion == "reward":
        champ_reward = _number(champion, REWARD)
        if reward is None or champ_reward is None:
            return GateDecision(
                False, f"cannot compare by reward: {REWARD!r} missing for the challenger or the champion"
            )
        if reward + _EPS < champ_reward + t.min_reward_gain:
            return GateDecision(
                False,
                f"mean reward {reward:.4f} < champion {champ_reward:.4f} + required gain "
                f"{t.min_reward_gain:.4f} at this pool's prices, same split {split!r}",
            )
        return GateDecision(
            True,
            f"mean reward {reward:.4f} vs champion {champ_reward:.4f} "
            f"(gain {reward - champ_reward:+.4f}){versus}, accuracy {acc:.4f}, mean cost ${cost:.6f}, "
            f"same split {split!r}",
        )
    champ_acc = _number(champion, ACCURACY)
    champ_cost = _number(champion, COST)
    if champ_acc is None or champ_cost is None:
        return GateDecision(False, f"champion lacks numeric {ACCURACY!r} and {COST!r} metrics")

    needed = champ_acc + t.min_accuracy_gain
    if acc + _EPS < needed:
        return GateDecision(
            False,
            f"accuracy {acc:.4f} < champion {champ_acc:.4f} + required gain {t.min_accuracy_gain:.4f}",
        )
    cost_cap = champ_cost * t.max_cost_ratio
    if cost > cost_cap + _EPS:
        return GateDecision(
            False,
            f"mean cost ${cost:.6f} > champion ${champ_cost:.6f} x {t.max_cost_ratio:g} = ${cost_cap:.6f}",
        )
    return GateDecision(
        True,
        f"accuracy {acc:.4f} vs champion {champ_acc:.4f} (gain {acc - champ_acc:+.4f}){versus}, "
        f"mean cost ${cost:.6f} vs ${champ_cost:.6f}, same split {split!r}",
    )


def best_baseline(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The best of an evaluation's ``GATE_BASELINES`` as the challenger's ``baseline_*`` entries:
    by mean reward when every one carries it (the evaluation's one reward: the Conductor's own),
    else by accuracy (ties: the cheaper); None when the evaluation ran none of them."""
    rows = [
        s
        for s in summaries
        if str(s.get("policy", "")).startswith(GATE_BASELINES) and _number(s, ACCURACY) is not None
    ]
    if not rows:
        return None
    by_reward = all(_number(s, REWARD) is not None for s in rows)
    first = REWARD if by_reward else ACCURACY
    best = max(rows, key=lambda s: (float(s[first]), -float(s.get(COST) or 0.0)))
    out = {
        BASELINE_POLICY: str(best["policy"]),
        BASELINE_ACCURACY: float(best[ACCURACY]),
        BASELINE_COST: float(best.get(COST) or 0.0),
    }
    if by_reward:
        out[BASELINE_REWARD] = float(best[REWARD])
    return out


def promote_if_better(
    name: str,
    challenger_version: int | str,
    challenger_metrics: Mapping[str, Any] | None = None,
    thresholds: GateThresholds | None = None,
) -> GateDecision:
    """Gate ``challenger_version`` against the current champion and move ``champion`` if it passes.

    ``challenger_metrics`` default to the metrics of the run that logged the version. The
    champion's come from its run. The decision is recorded as ``gate.*`` tags on the version.
    """
    from rl_conductor.tracking import registry  # MLflow: imported only when a version is gated

    metrics = (
        dict(challenger_metrics)
        if challenger_metrics is not None
        else registry.version_metrics(name, challenger_version)
    )
    champion_version = registry.get_alias_version(name, registry.CHAMPION)
    if champion_version is not None and champion_version == int(challenger_version):
        decision = GateDecision(False, f"version {challenger_version} is already the champion")
    else:
        champion = registry.version_metrics(name, champion_version) if champion_version is not None else None
        decision = decide(metrics, champion, thresholds)
        if decision.promote:
            registry.promote(name, challenger_version)
    registry.tag_version(
        name,
        challenger_version,
        {
            "gate.promoted": str(decision.promote).lower(),
            "gate.reason": decision.reason,
            "gate.champion_before": "" if champion_version is None else str(champion_version),
        },
    )
    return decision
