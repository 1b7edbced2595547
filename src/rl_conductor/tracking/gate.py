"""The evaluation gate: a challenger becomes champion only if it is measurably better.

Why: promotion moves the ``champion`` alias that serving loads, so it must follow a rule that
can be read, tested and logged, not a person's judgement at the end of a pipeline run.

The rule (``decide``): refuse a challenger below ``min_accuracy``; promote it when there is no
champion; otherwise both must have been measured on the same test split (same
``test_split_id``), its accuracy must reach the champion's plus ``min_accuracy_gain``, and its
mean cost must stay within ``max_cost_ratio`` times the champion's.

Deliberate simplifications: one accuracy and one mean cost per model, compared as point
estimates (no confidence intervals); equal-or-better passes with the default thresholds. The
split check compares identifiers only; computing them (a fingerprint of the test set) is the
evaluation's job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rl_conductor.tracking import registry

__all__ = ["ACCURACY", "COST", "SPLIT", "GateDecision", "GateThresholds", "decide", "promote_if_better"]

ACCURACY = "accuracy"
COST = "mean_cost_usd"
SPLIT = registry.TEST_SPLIT_KEY
_EPS = 1e-12  # float noise must not flip an "equal" comparison


@dataclass(frozen=True)
class GateThresholds:
    """What a challenger must show to replace the champion."""

    min_accuracy_gain: float = 0.0  # absolute accuracy points over the champion (0.02 = +2 pts)
    max_cost_ratio: float = 1.0  # challenger mean cost <= champion mean cost x this
    min_accuracy: float = 0.0  # floor for any champion, including the first one

    def __post_init__(self) -> None:
        if self.max_cost_ratio < 0 or not math.isfinite(self.max_cost_ratio):
            raise ValueError(f"max_cost_ratio must be a finite number >= 0, got {self.max_cost_ratio}")
        if not 0.0 <= self.min_accuracy <= 1.0:
            raise ValueError(f"min_accuracy is a fraction in [0, 1], got {self.min_accuracy}")


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
    if champion is None:
        return GateDecision(True, f"no champion yet; challenger accuracy {acc:.4f}, mean cost ${cost:.6f}")

    split, champ_split = challenger.get(SPLIT), champion.get(SPLIT)
    if not split or not champ_split:
        return GateDecision(False, f"cannot compare: {SPLIT} missing for the challenger or the champion")
    if str(split) != str(champ_split):
        return GateDecision(
            False, f"different test splits: challenger {split!r} vs champion {champ_split!r}; re-evaluate"
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
        f"accuracy {acc:.4f} vs champion {champ_acc:.4f} (gain {acc - champ_acc:+.4f}), "
        f"mean cost ${cost:.6f} vs ${champ_cost:.6f}, same split {split!r}",
    )


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
