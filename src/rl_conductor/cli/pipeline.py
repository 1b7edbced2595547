"""Pipeline and registry commands: ``pipeline run|compile|submit`` and ``registry list|promote``.

Thin adapters over :mod:`rl_conductor.pipeline` and :mod:`rl_conductor.tracking.registry`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rl_conductor.cli.app import app
from rl_conductor.cli.core import console
from rl_conductor.cli.options import count, pipeline_parameter

if TYPE_CHECKING:
    from rl_conductor.tracking.registry import VersionRow

pipeline_app = typer.Typer(
    help="The Kubeflow training pipeline: run locally, compile, submit.", no_args_is_help=True
)
registry_app = typer.Typer(help="The MLflow model registry: versions and aliases.", no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(registry_app, name="registry")

PresetOpt = Annotated[
    str | None,
    typer.Option(
        help="training preset: tiny | smol | gpu | a YAML path | a comma-separated list of these, or "
        "auto on a recordings pool (each trained, the best on the validation split kept)"
    ),
]
PoolOpt = Annotated[str | None, typer.Option(help="worker pool (name or YAML path)")]
DatasetOpt = Annotated[str | None, typer.Option(help="task set (default: the pool's)")]
StrOpt = Annotated[str | None, typer.Option()]
QuickOpt = Annotated[
    bool, typer.Option("--quick", help="a handful of training steps on a small sample (smoke test)")
]
StepsOpt = Annotated[
    int | None, typer.Option(callback=pipeline_parameter("grpo_steps"), help="0: the preset's")
]
EvalLimitOpt = Annotated[
    int | None,
    typer.Option(callback=pipeline_parameter("eval_limit"), help="test tasks to evaluate on (0: all)"),
]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="any other pipeline parameter as NAME=VALUE (repeatable)")
]


def pipeline_arguments(set_values: list[str] | None, **named: Any) -> dict[str, Any]:
    """Named options plus ``--set NAME=VALUE`` pairs (VALUE parsed as JSON when it parses)."""
    args = {k: v for k, v in named.items() if v is not None}
    for item in set_values or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--set expects NAME=VALUE, got {item!r}")
        try:
            args[key] = json.loads(raw)
        except json.JSONDecodeError:
            args[key] = raw
    return args


def _version_line(row: VersionRow | None) -> str:
    if row is None:
        return "none"
    m = row.metrics
    acc = f"{100 * m['accuracy']:.1f}%" if "accuracy" in m else "?"
    cost = f"${m['mean_cost_usd']:.5f}" if "mean_cost_usd" in m else "?"
    aliases = f" [{', '.join(row.aliases)}]" if row.aliases else ""
    return f"v{row.version}{aliases}: accuracy {acc}, mean cost {cost}, split {row.test_split_id or '?'}"


@pipeline_app.command("run")
def run_cmd(
    local: Annotated[
        bool, typer.Option("--local", help="run with kfp's local SubprocessRunner (required)")
    ] = False,
    preset: PresetOpt = None,
    pool: PoolOpt = None,
    dataset: DatasetOpt = None,
    quick: QuickOpt = False,
    grpo_steps: StepsOpt = None,
    sft_examples: Annotated[
        int | None, typer.Option(callback=pipeline_parameter("sft_examples"), help="0: the preset's")
    ] = None,
    train_limit: Annotated[
        int | None, typer.Option(callback=pipeline_parameter("train_limit"), help="0: every task")
    ] = None,
    eval_limit: EvalLimitOpt = None,
    reward_preset: StrOpt = None,
    cost_weight: Annotated[
        float | None,
        typer.Option(callback=pipeline_parameter("cost_weight"), help="negative: the preset's"),
    ] = None,
    mlflow_tracking_uri: StrOpt = None,
    artifact_root: Annotated[str | None, typer.Option(help="local folder or s3://bucket/prefix")] = None,
    set_values: SetOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="show every step's output")] = False,
) -> None:
    """Run the whole pipeline: prepare, train, evaluate, register, promote behind the gate."""
    from rl_conductor.evaluation.report import behaviour_table, print_table
    from rl_conductor.pipeline import run_local

    if not local:
        raise typer.BadParameter(
            "only --local runs here; use `conductor pipeline submit --host URL` for a cluster"
        )
    args = pipeline_arguments(
        set_values,
        preset=preset,
        pool=pool,
        dataset=dataset,
        grpo_steps=grpo_steps,
        sft_examples=sft_examples,
        train_limit=train_limit,
        eval_limit=eval_limit,
        reward_preset=reward_preset,
        cost_weight=cost_weight,
        mlflow_tracking_uri=mlflow_tracking_uri,
        artifact_root=artifact_root,
    )
    console.print(f"running the pipeline locally{' (quick)' if quick else ''} …")
    run = run_local(quick=quick, verbose=verbose, **args)
    meta = run.meta
    print_table(
        run.summaries,
        title=f"{meta.get('pool')} / test split {meta.get('test_split_id')} (n={meta.get('n')})",
        console=console,
    )
    acting = [s for s in run.summaries if s["policy"] in ("conductor", "domain-router", "knn")]
    console.print(behaviour_table(acting, title="what the Conductor and the routers do"))
    console.print(f"report: {run.report_uri}", markup=False, soft_wrap=True)
    console.print(f"artifacts: {run.run_folder}", markup=False, soft_wrap=True)
    aliases = ", ".join(run.aliases) or "none"
    console.print(
        f"registered: {run.model_name} version {run.version} (aliases: {aliases})",
        markup=False,
        soft_wrap=True,
    )
    console.print(
        f"gate: {'promoted' if run.promoted else 'not promoted'}: {run.gate_reason}",
        markup=False,
        soft_wrap=True,
    )
    if run.log_path:
        console.print(f"[dim]step output: {run.log_path}; took {run.seconds:.0f}s[/dim]")


@pipeline_app.command("compile")
def compile_cmd(
    out: Annotated[
        Path | None, typer.Option(help="YAML path (default: pipelines/conductor_training.yaml)")
    ] = None,
) -> None:
    """Compile the pipeline to YAML (the committed file by default)."""
    from rl_conductor.pipeline import compile_pipeline

    console.print(f"wrote {compile_pipeline(out)}", markup=False, soft_wrap=True)


@pipeline_app.command("submit")
def submit_cmd(
    host: Annotated[str, typer.Option(help="KFP API server, e.g. http://ml-pipeline-ui.kubeflow")],
    artifact_root: Annotated[str, typer.Option(help="s3://bucket/prefix for datasets, checkpoints, reports")],
    mlflow_tracking_uri: Annotated[str, typer.Option(help="MLflow server URL")],
    preset: PresetOpt = None,
    pool: PoolOpt = None,
    dataset: DatasetOpt = None,
    quick: QuickOpt = False,
    grpo_steps: StepsOpt = None,
    eval_limit: EvalLimitOpt = None,
    run_name: StrOpt = None,
    experiment: Annotated[str, typer.Option(help="KFP experiment")] = "conductor",
    namespace: StrOpt = None,
    package: Annotated[Path | None, typer.Option(help="compiled YAML (default: the committed one)")] = None,
    set_values: SetOpt = None,
) -> None:
    """Submit the compiled pipeline to a Kubeflow Pipelines cluster."""
    from rl_conductor.pipeline import submit

    args = pipeline_arguments(
        set_values,
        preset=preset,
        pool=pool,
        dataset=dataset,
        grpo_steps=grpo_steps,
        eval_limit=eval_limit,
        artifact_root=artifact_root,
        mlflow_tracking_uri=mlflow_tracking_uri,
    )
    run_id = submit(
        host,
        package_path=package,
        run_name=run_name,
        experiment=experiment,
        namespace=namespace,
        quick=quick,
        **args,
    )
    console.print(f"submitted run {run_id} to {host}", markup=False, soft_wrap=True)


@registry_app.command("list")
def registry_list(
    name: Annotated[str, typer.Option(help="registered model name")] = "conductor",
    mlflow_tracking_uri: StrOpt = None,
) -> None:
    """List the registered versions with their aliases and evaluation metrics."""
    from rich.table import Table

    from rl_conductor.tracking import mlflow_utils, registry

    mlflow_utils.configure(mlflow_tracking_uri)
    rows = registry.list_versions(name)
    if not rows:
        console.print(
            f"no versions of {name!r} in {mlflow_utils.tracking_config().tracking_uri}", markup=False
        )
        return
    console.print(f"{name} in {mlflow_utils.tracking_config().tracking_uri}", markup=False, soft_wrap=True)
    t = Table()
    for col in ("version", "aliases", "accuracy %", "cost $", "gate"):
        t.add_column(col, no_wrap=True)
    t.add_column("test split", overflow="fold")
    for r in rows:
        m = r.metrics
        gate = (
            "hand"
            if r.tags.get("promoted_by") == "hand"
            else {"true": "passed", "false": "refused"}.get(r.tags.get("gate.promoted", ""), "-")
        )
        t.add_row(
            str(r.version),
            ", ".join(r.aliases),
            f"{100 * m['accuracy']:.1f}" if "accuracy" in m else "-",
            f"{m['mean_cost_usd']:.5f}" if "mean_cost_usd" in m else "-",
            gate,
            r.test_split_id or "-",
        )
    console.print(t)


@registry_app.command("promote")
def registry_promote(
    version: Annotated[int, typer.Option(callback=count(1), help="the version to promote")],
    name: Annotated[str, typer.Option(help="registered model name")] = "conductor",
    alias: Annotated[str, typer.Option(help="alias to move")] = "champion",
    mlflow_tracking_uri: StrOpt = None,
) -> None:
    """Point an alias (champion by default) at a version by hand, bypassing the gate."""
    from rl_conductor.pipeline.steps import promote_by_hand

    try:
        done = promote_by_hand(
            version, model_name=name, alias=alias, mlflow_tracking_uri=mlflow_tracking_uri or ""
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    console.print(f"{name}@{alias} was: {_version_line(done.previous)}", markup=False, soft_wrap=True)
    console.print(f"{name}@{alias} now: {_version_line(done.current)}", markup=False, soft_wrap=True)
