"""The Kubeflow pipeline ``conductor-champion-check``: the closed loop's alert on a schedule.

Why a pipeline as well as the CLI: a platform that runs ``conductor-retrain`` as a KFP recurring
run can run the check the same way (same images, secrets and MLflow) instead of a separate
CronJob. One step, ``check_champion`` (``components/champion_check``: the code of
``conductor retrain check``, :mod:`rl_conductor.loop.monitor`). Compiled to
``champion_check.yaml`` next to this file (``conductor retrain compile``; a test fails when the
committed YAML is stale); run it locally with :func:`rl_conductor.loop.pipeline.run_check_local`.

Schedule parameters (root inputs of the compiled YAML): ``window_hours`` (how much recent traffic
each run reads; hourly runs over 24 h windows are docs/closed-loop.md's suggestion) and
``min_tasks`` (fewest requests with feedback for a verdict); ``prom_textfile`` / ``pushgateway``
say where the gauges go (a batch job has no ``/metrics`` route)::

    kfp.Client(host=URL).create_recurring_run(
        experiment_id=..., job_name="conductor-champion-check-hourly",
        cron_expression="0 0 * * * *", max_concurrency=1, no_catchup=True,
        pipeline_package_path="pipelines/champion_check.yaml",
        params={"traffic_store": "s3://bucket/traffic", "window_hours": 24,
                "pushgateway": "http://pushgateway:9091", "mlflow_tracking_uri": "http://mlflow:5000"})

The run's output is whether the champion is below the floor; a verdict does not fail the run
(page on the gauge ``conductor_champion_below_floor``), too little feedback does.
"""

from components.champion_check.component import check_champion
from kfp import dsl

from pipelines import wiring

PIPELINE_NAME = "conductor-champion-check"


@dsl.pipeline(
    name=PIPELINE_NAME,
    description="Is the serving Conductor below the gate's floor (every single worker, domain-router, "
    "knn) on recent traffic with feedback? Writes gauges, MLflow and the champion's check.* tags.",
)
def conductor_champion_check(
    traffic_store: str,
    pool: str = wiring.POOL,
    model_name: str = wiring.MODEL_NAME,
    window_hours: float = 24.0,
    min_tasks: int = 30,
    fit_limit: int = 0,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    prom_textfile: str = "",
    pushgateway: str = "",
    api_keys_secret: str = wiring.API_KEYS_SECRET,
    s3_secret: str = wiring.S3_SECRET,
) -> bool:
    """Parameters: traffic_store (the predictor's --traffic_store); pool (the pool now served);
    model_name (whose champion serves); window_hours (0: the whole log) / min_tasks: the schedule's
    window and the fewest requests with feedback for a verdict; fit_limit: training tasks the
    floor's routers fit on (0: all); prom_textfile / pushgateway: where the gauges go. Returns
    whether the champion is below the floor."""
    check = check_champion(
        **wiring.same_named(check_champion, locals(), run_tag=dsl.PIPELINE_JOB_NAME_PLACEHOLDER)
    )
    check.set_caching_options(enable_caching=False)  # reads a log that grows
    # a live pool re-executes the questions (its response cache replays them; misses are calls)
    wiring.use_secrets([check], s3_secret=s3_secret, api_keys_secret=api_keys_secret)
    return check.outputs["Output"]
