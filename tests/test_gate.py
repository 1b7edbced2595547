"""gate: the promotion rule as a pure function, then once through a real registry."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rl_conductor.tracking import registry
from rl_conductor.tracking.gate import GateDecision, GateThresholds, decide, promote_if_better
from rl_conductor.tracking.mlflow_utils import TrackingConfig

CHAMP = {"accuracy": 0.60, "mean_cost_usd": 0.010, "test_split_id": "test-v1"}


def _m(accuracy: float, cost: float, split: str | None = "test-v1") -> dict[str, object]:
    out: dict[str, object] = {"accuracy": accuracy, "mean_cost_usd": cost}
    if split is not None:
        out["test_split_id"] = split
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


def test_threshold_validation() -> None:
    with pytest.raises(ValueError, match="max_cost_ratio"):
        GateThresholds(max_cost_ratio=-1.0)
    with pytest.raises(ValueError, match="min_accuracy"):
        GateThresholds(min_accuracy=60.0)


def test_promote_if_better_through_registry(mlflow_tracking: TrackingConfig, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    name = f"conductor-{uuid.uuid4().hex[:8]}"

    def log(accuracy: float, cost: float, split: str) -> int:
        info = registry.log_conductor_model(
            folder,
            name=name,
            metrics={"accuracy": accuracy, "mean_cost_usd": cost},
            params={"test_split_id": split},
        )
        return info.version

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
    measured = {"accuracy": 0.70, "mean_cost_usd": 0.009, "test_split_id": "split-a"}
    better = promote_if_better(name, v5, measured)
    assert better.promote
    assert registry.get_alias_version(name, "champion") == v5

    rows = {r.version: r for r in registry.list_versions(name)}
    assert rows[v5].tags["gate.promoted"] == "true" and rows[v5].tags["gate.champion_before"] == str(v1)
    assert rows[v2].tags["gate.promoted"] == "false" and "accuracy 0.4500" in rows[v2].tags["gate.reason"]
    assert rows[v5].aliases == ["challenger", "champion"]
