"""KFP component ``evaluate_conductor``: the Conductor, the kNN router and every baseline on the test split.

Thin adapter over :func:`rl_conductor.pipeline.steps.evaluate_step`; see README.md.
"""

from typing import NamedTuple

from components.images import base_component
from kfp import dsl


@base_component
def evaluate_conductor(
    model: dsl.Input[dsl.Model],
    train_data: dsl.Input[dsl.Dataset],
    test_data: dsl.Input[dsl.Dataset],
    eval_metrics: dsl.Output[dsl.Metrics],
    report: dsl.Output[dsl.Markdown],
    report_html: dsl.Output[dsl.HTML],
    pareto: dsl.Output[dsl.Artifact],
    latency: dsl.Output[dsl.Artifact],
    results: dsl.Output[dsl.Artifact],
    pool: str = "paper-sim",
    seed: int = 0,
    artifact_root: str = "",
    run_tag: str = "local",
    max_latency_s: float = 0.0,
    deadlines: str = "",
) -> NamedTuple("EvalOutputs", [("test_split_id", str), ("accuracy", float), ("mean_cost_usd", float)]):
    """Evaluate on ``test_data`` against ``pool``; the kNN router is fitted on ``train_data``.

    Writes the Conductor's metrics (and every other policy's accuracy and cost) to
    ``eval_metrics``, the comparison as Markdown (``report``) and HTML (``report_html``), the
    cost-vs-accuracy Pareto chart (``pareto``, PNG), the accuracy-under-deadlines chart
    (``latency``, PNG) and every summary as JSON (``results``); copies go to
    ``<artifact_root>/<run_tag>/reports/``. ``max_latency_s`` (seconds, 0 = none) is a deadline
    for every request of the evaluation; ``deadlines`` the extra deadlines of the latency view
    (``""``: the default, ``"none"``: no view, or e.g. ``"60,15,5"``).
    """
    from collections import namedtuple

    from rl_conductor.pipeline import steps

    deadline, extra_deadlines = steps.deadline_parameters(max_latency_s, deadlines)
    outcome = steps.call_same_named(
        steps.evaluate_step,
        locals(),
        model_dir=model.path,
        train_path=train_data.path,
        test_path=test_data.path,
        outputs={
            "report_md": report.path,
            "report_html": report_html.path,
            "pareto_png": pareto.path,
            "latency_png": latency.path,
            "results_json": results.path,
        },
        max_latency_s=deadline,
        deadlines=extra_deadlines,
    )
    for name, value in outcome.metrics().items():
        eval_metrics.log_metric(name, value)
    eval_metrics.metadata["test_split_id"] = outcome.test_split_id
    pareto.metadata.update({"mime_type": "image/png", "uri": outcome.uris["pareto_png"]})
    latency.metadata.update({"mime_type": "image/png", "uri": outcome.uris.get("latency_png", "")})
    report.metadata["uri"] = outcome.uris["report_md"]
    results.metadata.update({"mime_type": "application/json", "test_split_id": outcome.test_split_id})
    EvalOutputs = namedtuple("EvalOutputs", ["test_split_id", "accuracy", "mean_cost_usd"])
    return EvalOutputs(
        outcome.test_split_id, float(outcome.conductor["accuracy"]), float(outcome.conductor["mean_cost_usd"])
    )
