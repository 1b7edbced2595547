"""KFP component ``promote_conductor``: the evaluation gate in front of the ``champion`` alias.

Thin adapter over :func:`rl_conductor.pipeline.steps.promote_step` (rules in
``rl_conductor.tracking.gate``); see README.md.
"""

from typing import NamedTuple

from components.images import BASE_IMAGE
from kfp import dsl


@dsl.component(base_image=BASE_IMAGE, packages_to_install=[], install_kfp_package=False)
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

    outcome = steps.promote_step(
        version=int(version),
        model_name=model_name,
        min_accuracy_gain=min_accuracy_gain,
        max_cost_ratio=max_cost_ratio,
        min_accuracy=min_accuracy,
        mlflow_tracking_uri=mlflow_tracking_uri,
    )
    print(f"gate: {'promoted' if outcome.promoted else 'kept the champion'}: {outcome.reason}")
    PromoteOutputs = namedtuple("PromoteOutputs", ["promoted", "reason", "champion"])
    return PromoteOutputs(outcome.promoted, outcome.reason, outcome.champion)
