"""KFP component ``gate_challenger``: challenger vs champion at the current pool's prices, the
gate, registration and promotion.

Thin adapter over :func:`rl_conductor.loop.retrain.gate_step` (rules in
``rl_conductor.tracking.gate``); see docs/closed-loop.md.
"""

from typing import NamedTuple

from components.images import base_component
from kfp import dsl


@base_component
def gate_challenger(
    challenger: dsl.Input[dsl.Model],
    champion: dsl.Input[dsl.Model],
    holdout_data: dsl.Input[dsl.Dataset],
    test_data: dsl.Input[dsl.Dataset],
    train_data: dsl.Input[dsl.Dataset],
    gate_metrics: dsl.Output[dsl.Metrics],
    pool: str = "paper-sim",
    model_name: str = "conductor",
    min_reward_gain: float = 0.0,
    require_significant: bool = True,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    run_tag: str = "local",
    fit_limit: int = 0,
) -> NamedTuple("GateOutputs", [("promoted", bool), ("reason", str), ("version", int), ("champion", int)]):
    """Evaluate both on the held-out traffic and the test split, gate by mean reward (paired 95 %
    interval above ``min_reward_gain`` when ``require_significant``), register the challenger and
    promote it if it passed. The floor's routers are fitted on ``train_data`` (``fit_limit``: a
    seeded sample of that many; 0: all). The trigger (``reason``) and the champion's version come from
    ``holdout_data``'s metadata (written by ``collect_traffic``)."""
    from collections import namedtuple

    from rl_conductor.loop import retrain
    from rl_conductor.pipeline.steps import call_same_named

    outcome = call_same_named(
        retrain.gate_step,
        locals(),
        challenger_dir=challenger.path,
        champion_dir=champion.path,
        holdout_path=holdout_data.path,
        test_path=test_data.path,
        champion_version=int(holdout_data.metadata.get("champion_version", 0)),
        reason=str(holdout_data.metadata.get("reason", "")),
        train_path=train_data.path,
        fit_limit=fit_limit or None,
    )
    for name in ("reward_gain", "ci_low", "ci_high", "n"):
        gate_metrics.log_metric(name, float(getattr(outcome, name)))
    print(f"gate: {'promoted' if outcome.promoted else 'kept the champion'}: {outcome.reason}")
    GateOutputs = namedtuple("GateOutputs", ["promoted", "reason", "version", "champion"])
    return GateOutputs(outcome.promoted, outcome.reason, outcome.version, outcome.champion)
