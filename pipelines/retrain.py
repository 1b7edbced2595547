"""The Kubeflow pipeline ``conductor-retrain``: served traffic + feedback → warm-start retrain →
challenger vs champion at the current pool's prices → gate → register → promote.

Compiled to ``retrain.yaml`` next to this file (``conductor retrain compile``; a test fails when
the committed YAML is stale). Run it locally with ``conductor retrain --local`` (kfp's
SubprocessRunner) or on a cluster as a recurring run (docs/closed-loop.md):

    kfp.Client(host=URL).create_recurring_run(
        experiment_id=..., job_name="conductor-retrain-nightly",
        cron_expression="0 0 3 * * *", max_concurrency=1,
        pipeline_package_path="pipelines/retrain.yaml",
        params={"traffic_store": "s3://bucket/traffic", "window_hours": 24, ...})

Schedule parameters (root inputs of the compiled YAML): ``window_hours`` (how much traffic each
run reads: the cron period, so windows tile), ``only_on_pool_change`` (a frequent schedule that
retrains only when the pool file changed: a new, removed or re-priced worker), ``min_train_tasks``
(skip a run whose window is too thin). Steps: ``collect_traffic`` decides; under ``dsl.If`` the
training and the gate run only when it said so. The training step asks for one GPU and gets the
worker API keys from ``api_keys_secret`` on a cluster (ignored locally), as in
``conductor-training``; every step gets S3 credentials from ``s3_secret``.
"""

from components.retrain_collect.component import collect_traffic
from components.retrain_conductor.component import retrain_conductor
from components.retrain_gate.component import gate_challenger
from kfp import dsl

from pipelines import wiring

PIPELINE_NAME = "conductor-retrain"


@dsl.pipeline(
    name=PIPELINE_NAME,
    description="Retrain the Conductor from served traffic and feedback, warm-started from the champion; "
    "promote the challenger only if the gate finds it better at the current pool's prices.",
)
def conductor_retrain(
    traffic_store: str,
    pool: str = wiring.POOL,
    preset: str = wiring.PRESET,
    train_overrides: str = "{}",
    window_hours: float = 24.0,
    holdout_fraction: float = 0.3,
    eval_limit: int = 200,
    base_train_limit: int = 0,
    min_train_tasks: int = 8,
    only_on_pool_change: bool = False,
    spend_cap_usd: float = 0.0,
    min_reward_gain: float = 0.0,
    require_significant: bool = True,
    fit_limit: int = 0,
    seed: int = 0,
    model_name: str = wiring.MODEL_NAME,
    mlflow_tracking_uri: str = "",
    artifact_root: str = "",
    api_keys_secret: str = wiring.API_KEYS_SECRET,
    s3_secret: str = wiring.S3_SECRET,
) -> bool:
    """Parameters: traffic_store (the predictor's --traffic_store); pool (the pool now served);
    preset / train_overrides (JSON): the training run, warm-started from the champion;
    window_hours (0: the whole log) / holdout_fraction / min_train_tasks / only_on_pool_change: the
    schedule's window and trigger; eval_limit: standing test questions compared on besides the
    held-out traffic; base_train_limit: standing training questions added to the traffic's;
    spend_cap_usd: most the warm-start table may pay live workers for calls the cache lacks;
    min_reward_gain / require_significant: the gate (paired 95 % interval of the reward gain);
    fit_limit: training tasks the gate's routers (domain-router, knn) are fitted on (0: all).
    Returns whether it retrained (the reason and the gate's decision: MLflow experiment
    ``<model_name>-loop`` and the registered version's ``gate.*`` tags).
    """
    run_tag = dsl.PIPELINE_JOB_NAME_PLACEHOLDER
    parameters = dict(locals())  # the parameters and run_tag, which steps take by name (wiring.same_named)
    collect = collect_traffic(**wiring.same_named(collect_traffic, parameters))
    collect.set_caching_options(enable_caching=False)  # reads a log that grows
    wiring.use_secrets([collect], s3_secret=s3_secret)
    with dsl.If(collect.outputs["Output"] == True):  # noqa: E712 (a KFP condition, not Python)
        train = retrain_conductor(**wiring.same_named(retrain_conductor, parameters, collect))
        # a constant: kfp's local runner cannot resolve a pipeline parameter in a task's settings
        # inside dsl.If (multi-GPU training: conductor-training's train_gpus)
        train.set_accelerator_type(wiring.GPU_RESOURCE).set_accelerator_limit(1)
        gate = gate_challenger(
            **wiring.same_named(gate_challenger, parameters, collect, challenger=train.outputs["model"])
        )
        gate.set_caching_options(enable_caching=False)  # moves the registry's aliases
        wiring.use_secrets((train, gate), s3_secret=s3_secret, api_keys_secret=api_keys_secret)
    return collect.outputs[
        "Output"
    ]  # whether it retrained; the decision is on the registry version and in MLflow
