"""gate: the promotion rule as a pure function (champion, floors, the best baseline of the same
evaluation, validated thresholds), then once through a real registry."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from _lazy import lazy
from rl_conductor.tracking.gate import (
    GateDecision,
    GateThresholds,
    best_baseline,
    decide,
    promote_if_better,
)
from rl_conductor.validation import InvalidValue

if TYPE_CHECKING:
    from rl_conductor.tracking.mlflow_utils import TrackingConfig

registry = lazy("rl_conductor.tracking.registry")  # MLflow: imported by the test that uses it
pyfunc = lazy("rl_conductor.serving.pyfunc")

CHAMP = {"accuracy": 0.60, "mean_cost_usd": 0.010, "test_split_id": "test-v1"}


def _m(
    accuracy: float, cost: float, split: str | None = "test-v1", baseline: float | None = 0.2
) -> dict[str, object]:
    out: dict[str, object] = {"accuracy": accuracy, "mean_cost_usd": cost}
    if split is not None:
        out["test_split_id"] = split
    if baseline is not None:
        out.update(baseline_accuracy=baseline, baseline_mean_cost_usd=0.005, baseline_policy="single:w")
    return out


@pytest.mark.parametrize(
    ("challenger", "champion", "thresholds", "promote", "reason"),
    [
        (_m(0.30, 0.5), None, GateThresholds(), True, "no champion yet"),
        (_m(0.30, 0.5, split=None), None, GateThresholds(), True, "no champion yet"),
        (_m(0.30, 0.5), None, GateThresholds(min_accuracy=0.4), False, "below the floor"),
        (_m(0.65, 0.009), CHAMP, GateThresholds(), True, "gain +0.0500"),
        (_m(0.60, 0.010), CHAMP, GateThresholds(), True, "same split"),  # equal passes by default
        (_m(0.61, 0.010), CHAMP, GateThresholds(min_accuracy_gain=0.02), False, "required gain 0.0200"),
        (_m(0.55, 0.001), CHAMP, GateThresholds(), False, "accuracy 0.5500 < champion 0.6000"),
        (_m(0.70, 0.011), CHAMP, GateThresholds(), False, "mean cost $0.011000 > champion"),
        (_m(0.70, 0.019), CHAMP, GateThresholds(max_cost_ratio=2.0), True, "gain +0.1000"),
        (_m(0.70, 0.005, split="test-v2"), CHAMP, GateThresholds(), False, "different test splits"),
        (_m(0.70, 0.005, split=None), CHAMP, GateThresholds(), False, "test_split_id missing"),
        (_m(0.70, 0.005), {"accuracy": 0.6, "mean_cost_usd": 0.01}, GateThresholds(), False, "missing"),
        ({"accuracy": 0.9}, CHAMP, GateThresholds(), False, "challenger lacks"),
        ({"accuracy": float("nan"), "mean_cost_usd": 0.0}, None, GateThresholds(), False, "challenger lacks"),
        (_m(0.9, 0.0), {"test_split_id": "test-v1"}, GateThresholds(), False, "champion lacks"),
        # the best baseline of the challenger's own evaluation: first version included
        (_m(0.56, 0.001, baseline=0.69), None, GateThresholds(), False, "below single:w (0.6900)"),
        (_m(0.56, 0.001, baseline=0.69), None, GateThresholds(), False, "registered but not champion"),
        (_m(0.70, 0.001, baseline=0.69), None, GateThresholds(), True, ">= single:w 0.6900"),
        (_m(0.69, 0.001, baseline=0.69), None, GateThresholds(), True, "no champion yet"),  # equal passes
        (
            _m(0.70, 0.001, baseline=0.69),
            None,
            GateThresholds(min_gain_over_baseline=0.05),
            False,
            "gain 0.0500",
        ),
        (
            _m(0.65, 0.009, baseline=0.69),
            CHAMP,
            GateThresholds(),
            False,
            "below single:w",
        ),  # beats champion only
        (_m(0.70, 0.009, baseline=0.69), CHAMP, GateThresholds(), True, ">= single:w 0.6900"),
        (_m(0.70, 0.001, baseline=None), None, GateThresholds(), False, "lacks 'baseline_accuracy'"),
        (_m(0.70, 0.001, baseline=None), None, GateThresholds(require_baseline=False), True, "no champion"),
        (_m(0.70, 0.001, baseline=float("nan")), None, GateThresholds(), False, "lacks 'baseline_accuracy'"),
    ],
)
def test_decide(
    challenger: dict[str, object],
    champion: dict[str, object] | None,
    thresholds: GateThresholds,
    promote: bool,
    reason: str,
) -> None:
    decision = decide(challenger, champion, thresholds)
    assert decision.promote is promote
    assert reason in decision.reason


def test_float_noise_does_not_flip_equal_metrics() -> None:
    champion = _m(0.1 + 0.2, 0.3)  # 0.30000000000000004
    assert decide(_m(0.3, 0.1 + 0.2), champion).promote


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_accuracy_gain", float("nan")),
        ("min_accuracy_gain", -0.01),
        ("min_accuracy_gain", float("inf")),
        ("min_accuracy_gain", True),
        ("max_cost_ratio", -1.0),
        ("max_cost_ratio", 0.0),
        ("max_cost_ratio", float("nan")),
        ("max_cost_ratio", float("inf")),
        ("min_accuracy", 60.0),
        ("min_accuracy", -0.1),
        ("min_accuracy", float("nan")),
        ("min_gain_over_baseline", float("nan")),
        ("min_gain_over_baseline", -0.5),
        ("require_baseline", "yes"),
    ],
)
def test_threshold_validation(field: str, value: object) -> None:
    with pytest.raises(InvalidValue, match=field):
        GateThresholds(**{field: value})  # type: ignore[arg-type]


def test_nan_gain_no_longer_waves_a_weak_challenger_through() -> None:
    # issue 7, finding 6: with min_accuracy_gain=NaN every comparison was false and 0.10 beat 0.90
    with pytest.raises(InvalidValue):
        GateThresholds(min_accuracy_gain=float("nan"))
    champion = _m(0.90, 0.01)
    assert not decide(_m(0.10, 0.01), champion, GateThresholds(min_accuracy_gain=0.0)).promote


def test_best_baseline_is_the_most_accurate_single_worker_or_domain_router() -> None:
    rows = [
        {"policy": "single:a", "accuracy": 0.70, "mean_cost_usd": 0.005},
        {"policy": "domain-router", "accuracy": 0.73, "mean_cost_usd": 0.006},
        {"policy": "single:b", "accuracy": 0.73, "mean_cost_usd": 0.004},  # tie: the cheaper
        {"policy": "oracle", "accuracy": 0.95, "mean_cost_usd": 0.001},  # reads the gold answer
        {"policy": "moa", "accuracy": 0.80, "mean_cost_usd": 0.050},  # not a router
        {"policy": "conductor", "accuracy": 0.99, "mean_cost_usd": 0.001},
        {"policy": "single:c", "accuracy": float("nan"), "mean_cost_usd": 0.0},
    ]
    assert best_baseline(rows) == {
        "baseline_policy": "single:b",
        "baseline_accuracy": 0.73,
        "baseline_mean_cost_usd": 0.004,
    }
    assert best_baseline(rows[3:5]) is None


def test_promote_if_better_through_registry(mlflow_tracking: TrackingConfig, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    name = f"conductor-{uuid.uuid4().hex[:8]}"

    def log(accuracy: float, cost: float, split: str, baseline: float = 0.40) -> int:
        info = registry.log_conductor_model(
            folder,
            model_code=pyfunc.MODEL_CODE,
            name=name,
            metrics={"accuracy": accuracy, "mean_cost_usd": cost, "baseline_accuracy": baseline},
            params={"test_split_id": split, "baseline_policy": "domain-router"},
        )
        return info.version

    v0 = log(0.50, 0.010, "split-a", baseline=0.55)  # below its own evaluation's router
    zero = promote_if_better(name, v0)
    assert not zero.promote and "below domain-router (0.5500)" in zero.reason
    assert registry.get_alias_version(name, "champion") is None

    v1 = log(0.50, 0.010, "split-a")
    first = promote_if_better(name, v1)  # metrics read back from the version's run
    assert first == GateDecision(True, first.reason) and "no champion" in first.reason
    assert registry.get_alias_version(name, "champion") == v1
    assert not promote_if_better(name, v1).promote  # already champion

    v2 = log(0.45, 0.005, "split-a")
    worse = promote_if_better(name, v2, thresholds=GateThresholds())
    assert not worse.promote and registry.get_alias_version(name, "champion") == v1

    v3 = log(0.70, 0.020, "split-a")
    assert "mean cost" in promote_if_better(name, v3).reason  # better but twice the cost
    assert registry.get_alias_version(name, "champion") == v1

    v4 = log(0.70, 0.009, "split-b")
    assert "different test splits" in promote_if_better(name, v4).reason

    v5 = log(0.70, 0.009, "split-a")
    measured = {
        "accuracy": 0.70,
        "mean_cost_usd": 0.009,
        "test_split_id": "split-a",
        "baseline_accuracy": 0.6,
    }
    better = promote_if_better(name, v5, measured)
    assert better.promote
    assert registry.get_alias_version(name, "champion") == v5

    rows = {r.version: r for r in registry.list_versions(name)}
    assert rows[v5].tags["gate.promoted"] == "true" and rows[v5].tags["gate.champion_before"] == str(v1)
    assert rows[v2].tags["gate.promoted"] == "false" and "accuracy 0.4500" in rows[v2].tags["gate.reason"]
    assert rows[v5].aliases == ["challenger", "champion"]
    assert rows[v0].tags["gate.promoted"] == "false" and "domain-router" in rows[v0].tags["gate.reason"]
