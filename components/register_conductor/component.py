"""KFP component ``register_conductor``: log the trained model to MLflow as the ``challenger``.

Thin adapter over :func:`rl_conductor.pipeline.steps.register_step`; see README.md.
"""

from typing import NamedTuple

from components.images import base_component
from kfp import dsl


@base_component
def register_conductor(
    model: dsl.Input[dsl.Model],
    results: dsl.Input[dsl.Artifact],
    report: dsl.Input[dsl.Markdown],
    report_html: dsl.Input[dsl.HTML],
    pareto: dsl.Input[dsl.Artifact],
    model_name: str = "conductor",
    preset: str = "",
    mlflow_tracking_uri: str = "",
    artifact_root: str = "",
    run_tag: str = "local",
) -> NamedTuple("RegisterOutputs", [("version", int), ("model_uri", str)]):
    """Register ``model`` (its whole folder) as a new version of ``model_name``, alias ``challenger``.

    The version's MLflow run gets the Conductor's test metrics from ``results`` (``accuracy``,
    ``mean_cost_usd``, ...) and ``test_split_id``, which the promotion gate compares, plus the
    reports under ``eval/``. ``mlflow_tracking_uri`` empty: sqlite under ``.conductor/``.
    """
    from collections import namedtuple

    from rl_conductor.pipeline import steps

    outcome = steps.call_same_named(
        steps.register_step,
        locals(),
        model_dir=model.path,
        results_path=results.path,
        report_files={"report.md": report.path, "report.html": report_html.path, "pareto.png": pareto.path},
        params={"preset": preset},
    )
    RegisterOutputs = namedtuple("RegisterOutputs", ["version", "model_uri"])
    return RegisterOutputs(outcome.version, outcome.model_uri)
