"""KFP component ``promote_conductor``: the evaluation gate in front of the ``champion`` alias.

Thin adapter over :func:`rl_conductor.pipeline.steps.promote_step` (rules in
``rl_conductor.tracking.gate``); see README.md.
"""

from typing import NamedTuple

from components.images import base_component


@base_component
def promote_conductor(
    version: int,
    model_name: str = "conductor",
    min_accuracy_gain: float = 0.0,
    max_cost_ratio: float = 1.0,
    min_accuracy: float = 0.0,
    mlflow_tracking_uri: str = "",
) -> NamedTuple("PromoteOutputs", [("promoted", bool), ("reason", str), ("champion", int)]):
    """Make ``version`` the champion if it passes the gate; returns the decision and the champion (0: none).

    It passes when there is no champion yet, or when on the same test split its accuracy is at
    least the champion's plus ``min_accuracy_gain`` and its mean cost at most the champion's
    times ``max_cost_ratio``; never below ``min_accuracy``. The decision is tagged on the version.
    """
    from collections import namedtuple

    from rl_conductor.pipeline import steps

    outcome = steps.call_same_named(steps.promote_step, locals(), version=int(version))
    print(f"gate: {'promoted' if outcome.promoted else 'kept the champion'}: {outcome.reason}")
    PromoteOutputs = namedtuple("PromoteOutputs", ["promoted", "reason", "champion"])
    return PromoteOutputs(outcome.promoted, outcome.reason, outcome.champion)
