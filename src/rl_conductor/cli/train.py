"""Training commands: ``train`` and ``plan``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from rl_conductor.cli.app import app
from rl_conductor.cli.core import console
from rl_conductor.cli.options import count, non_negative, positive


@app.command("train")
def train_cmd(
    out: Annotated[Path, typer.Option(help="output folder (final model in OUT/final)")],
    preset: Annotated[str, typer.Option(help="tiny | smol | gpu | a YAML path")] = "tiny",
    pool: Annotated[str | None, typer.Option(help="worker pool (overrides the preset)")] = None,
    dataset: Annotated[str | None, typer.Option(help="training dataset (overrides the pool default)")] = None,
    model: Annotated[str | None, typer.Option(help="tiny | smol | folder | s3://… | HF id")] = None,
    grpo_steps: Annotated[
        int | None, typer.Option(callback=count(1), help="override the preset's GRPO steps")
    ] = None,
    sft_examples: Annotated[
        int | None, typer.Option(callback=count(1), help="override the preset's SFT examples")
    ] = None,
    reward_preset: Annotated[str | None, typer.Option(help="cost-aware | paper")] = None,
    cost_weight: Annotated[float | None, typer.Option(callback=non_negative, help=">= 0")] = None,
    time_limit_s: Annotated[
        float | None, typer.Option(callback=positive, help="stop GRPO after this many seconds")
    ] = None,
    seed: Annotated[int | None, typer.Option(callback=count(0))] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue from the last checkpoint in OUT")
    ] = False,
) -> None:
    """Train a Conductor: bootstrap the model, SFT warm start, GRPO against the pool."""
    from rl_conductor.training.config import load_preset

    cfg = load_preset(
        preset,
        pool=pool,
        dataset=dataset,
        model=model,
        grpo_steps=grpo_steps,
        sft_examples=sft_examples,
        reward_preset=reward_preset,
        cost_weight=cost_weight,
        time_limit_s=time_limit_s,
        seed=seed,
    )
    from rl_conductor.training.train import train  # torch and TRL: only once the config is valid

    res = train(cfg, out, resume=resume)
    curve = res.reward_curve
    console.print(
        f"trained in {res.seconds.get('total', 0):.0f}s ({res.global_step} GRPO steps) -> {res.final_dir}"
    )
    if curve:
        console.print(
            f"reward: first log {curve[0].get('reward', float('nan')):.3f}, "
            f"last {curve[-1].get('reward', float('nan')):.3f}"
        )
    console.print(json.dumps(res.seconds))


@app.command("plan")
def plan_cmd(
    model_dir: Annotated[Path, typer.Argument(help="a trained Conductor folder")],
    question: Annotated[str, typer.Argument(help="the question to plan for")],
    pool: Annotated[str, typer.Option(help="worker pool shown to the Conductor")] = "paper-sim",
    max_cost_usd: Annotated[float | None, typer.Option(callback=positive, help="budget in USD (> 0)")] = None,
    execute_plan: Annotated[
        bool, typer.Option("--execute", help="also run the workflow on the pool")
    ] = False,
) -> None:
    """Print the workflow the Conductor would run for a question."""
    import asyncio

    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.tasks.base import Task
    from rl_conductor.trace import Limits
    from rl_conductor.workers.pool import load_pool

    p = load_pool(pool)
    view = p.view()
    pol = ConductorPolicy(str(model_dir))
    task = Task(id="cli/question", question=question, answer="", domain="unknown", source="cli", grader="qa")
    limits = Limits(max_cost_usd=max_cost_usd)
    plan = asyncio.run(pol.plan(task, view, limits))
    console.print("[bold]raw completion[/bold]")
    console.print(plan.text, markup=False)
    if plan.fallback:
        console.print(f"[yellow]unparseable ({plan.parse_error}); fallback plan used[/yellow]")
    for i, s in enumerate(plan.workflow.steps):
        who = "conductor (recursion)" if s.worker == len(view) else view.worker(s.worker).info.name
        console.print(f"step {i}: {who} sees {list(s.visible(i))}: {s.instruction}", markup=False)
    if execute_plan:
        from rl_conductor.executor import execute

        trace = asyncio.run(execute(plan.workflow, task, view, limits, recursion=pol.recursion_hook(view)))
        console.print(f"final answer: {trace.final_answer}", markup=False)
        console.print(f"cost ${trace.cost_usd:.5f}, tokens {trace.tokens}, calls {trace.calls}")
