"""``conductor retrain run|compile``: the closed loop's pipeline from the command line.

Thin adapter over :mod:`rl_conductor.loop.pipeline` (docs/closed-loop.md).
"""

from __future__ import annotations

from typing import Annotated

import typer

from rl_conductor.cli.app import app
from rl_conductor.cli.core import console
from rl_conductor.cli.pipeline import SetOpt, pipeline_arguments

retrain_app = typer.Typer(
    help="Retrain the Conductor from served traffic and feedback (the closed loop).", no_args_is_help=True
)
app.add_typer(retrain_app, name="retrain")


@retrain_app.command("run")
def run_cmd(
    traffic_store: Annotated[str, typer.Option(help="the predictor's --traffic_store (folder or s3://)")],
    local: Annotated[
        bool, typer.Option("--local", help="run with kfp's local SubprocessRunner (required)")
    ] = False,
    pool: Annotated[str | None, typer.Option(help="the pool now served (name or YAML path)")] = None,
    window_hours: Annotated[float | None, typer.Option(help="hours of traffic to read (0: all)")] = None,
    only_on_pool_change: Annotated[
        bool, typer.Option("--only-on-pool-change", help="retrain only if the pool changed")
    ] = False,
    quick: Annotated[bool, typer.Option("--quick", help="a few training steps (smoke test)")] = False,
    set_values: SetOpt = None,
) -> None:
    """Collect the traffic window, retrain from the champion, gate, register, promote."""
    from rl_conductor.errors import InvalidArgument
    from rl_conductor.loop.pipeline import run_local

    if not local:
        raise InvalidArgument(
            "only --local runs from here; on a cluster submit pipelines/retrain.yaml (docs/closed-loop.md)"
        )
    args = pipeline_arguments(set_values, traffic_store=traffic_store, pool=pool, window_hours=window_hours)
    if only_on_pool_change:
        args["only_on_pool_change"] = True
    run = run_local(quick=quick, **args)
    console.print(f"collect: {'retrain' if run.should_train else 'no retrain'}: {run.reason}")
    if run.version is None:
        console.print(f"champion: v{run.champion_before} (unchanged)")
        return
    verdict = "promoted" if run.promoted else "kept the champion"
    console.print(f"gate: v{run.version} {verdict}: {run.gate_reason}")
    console.print(f"champion: v{run.champion}  ({run.seconds:.0f} s; log {run.log_path})")


@retrain_app.command("compile")
def compile_cmd(
    out: Annotated[str | None, typer.Option(help="output YAML (default: pipelines/retrain.yaml)")] = None,
) -> None:
    """Compile the retraining pipeline and the champion check's to YAML (their schedule
    parameters are root inputs): pipelines/retrain.yaml, pipelines/champion_check.yaml."""
    from rl_conductor.loop.pipeline import compile_check_pipeline, compile_pipeline

    console.print(f"compiled: {compile_pipeline(out)}")
    console.print(f"compiled: {compile_check_pipeline(None if out is None else _beside(out))}")


def _beside(path: str) -> str:
    """Where the champion check's YAML goes when the retrain's goes to ``path``."""
    from pathlib import Path

    return str(Path(path).with_name("champion_check.yaml"))


@retrain_app.command("check")
def check_cmd(
    traffic_store: Annotated[str, typer.Option(help="the predictor's --traffic_store (folder or s3://)")],
    pool: Annotated[str, typer.Option(help="the pool now served (name or YAML path)")] = "paper-sim",
    model_name: Annotated[str, typer.Option(help="the registered model whose champion serves")] = (
        "conductor"
    ),
    window_hours: Annotated[float, typer.Option(help="hours of recent traffic to read (0: all)")] = 24.0,
    min_tasks: Annotated[
        int, typer.Option(min=2, help="fewest requests with feedback to give a verdict on")
    ] = 30,
    fit_limit: Annotated[
        int, typer.Option(min=0, help="training tasks the floor's routers fit on (0: all)")
    ] = 0,
    prom_textfile: Annotated[
        str, typer.Option(help="write the check's gauges here (node-exporter textfile collector)")
    ] = "",
    pushgateway: Annotated[str, typer.Option(help="push the check's gauges to this Pushgateway")] = "",
) -> None:
    """Is the serving champion below the gate's floor on recent traffic with feedback? Exit 3 if so
    (page on it), 0 if not, 1 without a verdict (docs/closed-loop.md)."""
    from rl_conductor.loop.monitor import BELOW_FLOOR_EXIT, check_champion, export_metrics

    outcome = check_champion(
        traffic_store=traffic_store,
        pool=pool,
        model_name=model_name,
        window_hours=window_hours,
        min_tasks=min_tasks,
        fit_limit=fit_limit or None,
        log_verdict=False,  # printed below, once (stdout), not also as a log record on stderr
    )
    export_metrics(outcome, textfile=prom_textfile, pushgateway=pushgateway)
    console.print(outcome.line, soft_wrap=True)
    if outcome.below_floor:
        raise typer.Exit(BELOW_FLOOR_EXIT)
