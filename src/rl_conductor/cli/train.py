"""Training commands: ``train`` and ``plan``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from rl_conductor.cli.app import app
from rl_conductor.cli.core import console, max_rounds_option
from rl_conductor.cli.options import count, non_negative, positive, writable


def preset_names() -> list[str]:
    """The training presets shipped in ``rl_conductor/configs/train`` — what
    :func:`rl_conductor.training.config.available_presets` lists, read without importing it (the
    CLI builds its help before any command runs)."""
    from importlib import resources

    folder = resources.files("rl_conductor").joinpath("configs", "train")
    return sorted(f.name[: -len(".yaml")] for f in folder.iterdir() if f.name.endswith(".yaml"))


@app.command("train")
def train_cmd(
    out: Annotated[Path, typer.Option(help="output folder (final model in OUT/final)")],
    preset: Annotated[
        str,
        typer.Option(
            help=" | ".join([*preset_names(), "a YAML path"])
            + ". Several, comma-separated, or auto (the recordings presets for --pool's recordings; "
            "give --cost-weight, they default to different ones): each is trained into "
            "OUT/candidates/NAME on one pool, dataset and reward, and the best on the validation "
            "split is copied to OUT/final (OUT/choice.json has the figures; docs/recordings.md)"
        ),
    ] = "tiny",
    pool: Annotated[
        str | None,
        typer.Option(help="worker pool (overrides the preset's; the dataset is then that pool's default)"),
    ] = None,
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
    from rl_conductor.pipeline.choose import AUTO, CHOICE_FILE, candidate_presets
    from rl_conductor.training.config import load_preset

    overrides: dict[str, Any] = {
        "pool": pool,
        "dataset": dataset,
        "model": model,
        "grpo_steps": grpo_steps,
        "sft_examples": sft_examples,
        "reward_preset": reward_preset,
        "cost_weight": cost_weight,
        "time_limit_s": time_limit_s,
        "seed": seed,
    }
    names = candidate_presets(preset, pool, dataset)
    if len(names) > 1:
        _train_and_choose(names, overrides, out, resume=resume)
        return
    if preset.strip() == AUTO:  # said, not silently: there is nothing to choose between
        typer.echo(
            f"note: --preset auto: these recordings keep too little text for a review to read; "
            f"training {names[0]} alone (nothing to choose between)",
            err=True,
        )
    cfg = load_preset(names[0], **overrides)
    writable(out / CHOICE_FILE, "--out")  # a file or an unwritable place: one line, before training
    stale = out / CHOICE_FILE
    if stale.is_file():  # it described the final folder this training replaces
        stale.unlink()
        typer.echo(f"note: removed {stale}: it described an earlier choice this training replaces", err=True)
    from rl_conductor.training.train import train  # torch and TRL: only once the config is valid

    _hint_texts(cfg)
    res = train(cfg, out, resume=resume)
    curve = res.reward_curve
    console.print(
        f"trained in {res.seconds.get('total', 0):.0f}s ({res.global_step} GRPO steps) -> {res.final_dir}"
    )
    if res.sft_fit:
        from rl_conductor.training.sft_fit import fit_line

        console.print(fit_line(res.sft_fit), markup=False)
    if curve:
        console.print(
            f"reward: first log {curve[0].get('reward', float('nan')):.3f}, "
            f"last {curve[-1].get('reward', float('nan')):.3f}"
        )
        parsed = [c["conductor/parsed"] for c in curve if "conductor/parsed" in c]
        if parsed and parsed[-1] < 0.5:  # a model that writes no plan must not read as trained
            typer.echo(
                f"warning: only {100 * parsed[-1]:.0f} % of the last GRPO step's plans parsed; the "
                "warm start did not teach the plan format (more --sft-examples, or check the SFT loss)",
                err=True,
            )
    console.print(json.dumps(res.seconds))


#: fewer validation questions than this make a choice a coin toss: said on stderr
FEW_VALIDATION = 30


def _fit_lines(out: Path, labels: dict[str, str]) -> None:
    """Each candidate's warm-start fit (its ``metrics.json``; training/sft_fit.py), one line each."""
    from rl_conductor.training.sft_fit import fit_line

    for name, spec in labels.items():
        path = out / "candidates" / name / "metrics.json"
        fit = json.loads(path.read_text(encoding="utf-8")).get("sft_fit") if path.is_file() else None
        if fit:
            console.print(f"preset {spec}: {fit_line(fit)}", markup=False)


def _train_and_choose(specs: list[str], overrides: dict[str, Any], out: Path, *, resume: bool) -> None:
    """``train --preset a,b``: train each, keep the best on validation, print the figures."""
    from rich.table import Table

    from rl_conductor.pipeline.choose import (
        CHOICE_FILE,
        check_candidates,
        check_out,
        folder_names,
        train_and_choose,
    )
    from rl_conductor.training.config import load_preset

    folders = folder_names(specs)
    cfgs = {folders[spec]: load_preset(spec, **overrides) for spec in specs}
    labels = {folders[spec]: spec for spec in specs}
    check_candidates(cfgs)  # before the first minute of training
    check_out(out)
    writable(out / CHOICE_FILE, "--out")
    choice = train_and_choose(cfgs, out, resume=resume, labels=labels)
    w = choice.reward["cost_weight"]
    table = Table(title=f"validation split (n={choice.n}), reward at cost weight {w:g}")
    for col in ("policy", "acc %", "$/question", "reward", "chosen - this (SE)"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, s in choice.candidates.items():
        d, se = choice.margins.get(name, (0.0, 0.0))
        table.add_row(
            f"preset {labels[name]}" + (" (chosen)" if name == choice.chosen else ""),
            f"{100 * s['accuracy']:.2f}",
            f"{s['mean_cost_usd']:.6f}",
            f"{s['mean_reward']:.4f}",
            "" if name == choice.chosen else f"{d:+.4f} ({'n/a' if se is None else f'{se:.4f}'})",
        )
    for name, s in choice.baselines.items():
        d, se = choice.baseline_margins.get(name, (0.0, None))
        margin = (
            f"{d:+.4f} ({'n/a' if se is None else f'{se:.4f}'})" if name in choice.baseline_margins else ""
        )
        table.add_row(
            name, f"{100 * s['accuracy']:.2f}", f"{s['mean_cost_usd']:.6f}", f"{s['mean_reward']:.4f}", margin
        )
    console.print(table)
    _fit_lines(out, labels)
    console.print(f"chose {labels[choice.chosen]} -> {choice.final_dir} (figures in {out / CHOICE_FILE})")
    if choice.n < FEW_VALIDATION:
        typer.echo(
            f"warning: the choice was made on {choice.n} validation questions, too few to tell "
            "recipes apart; give the file more validation items",
            err=True,
        )
    for name, fig in choice.candidates.items():  # a choice among broken measurements is no choice
        failed = fig.get("failed_call_rate") or 0.0
        if failed > 0:
            typer.echo(
                f"warning: {100 * failed:.1f} % of {labels[name]}'s worker calls failed on the "
                "validation split (a replacement worker or no answer stood in): check the pool's "
                "recordings cover the dataset (conductor eval prints the errors)",
                err=True,
            )
    chosen = choice.candidates[choice.chosen]
    if chosen.get("parse_rate", 1.0) < 0.5:  # as single-preset train warns of a model that writes no plan
        typer.echo(
            f"warning: only {100 * chosen['parse_rate']:.0f} % of the chosen Conductor's validation "
            "plans parsed; the warm start did not teach the plan format (more --sft-examples)",
            err=True,
        )
    for router in choice.better_baselines():
        d, se = choice.baseline_margins.get(router, (0.0, None))
        by = "" if se is None else f", by {-d:.4f} (SE {se:.4f}{': within noise' if -d < 2 * se else ''})"
        typer.echo(
            f"warning: on the validation split {router} ({choice.baselines[router]['mean_reward']:.4f}) "
            f"scores above the chosen Conductor ({choice.candidates[choice.chosen]['mean_reward']:.4f}{by}) "
            "at this reward; serve it, or compare them on your own traffic before promoting",
            err=True,
        )


def _hint_texts(cfg: Any) -> None:
    """Say when the recipe and the recordings do not match: a one-round recipe on recordings that
    keep their texts (a two-round one reads them), or a review that reads texts on labels only."""
    from rl_conductor.pipeline.choose import recordings_path
    from rl_conductor.tasks.recordings_format import text_share
    from rl_conductor.workers.pool import load_pool

    pool = load_pool(cfg.pool)
    dataset = cfg.dataset or pool.default_dataset()
    path = recordings_path(pool, dataset)
    share = text_share(path) if path else None
    if share is None:
        return
    from rl_conductor.tasks.datasets import load_tasks

    if not load_tasks(dataset, split="train"):  # train refuses it with its own one-line error
        return
    if cfg.max_rounds == 1 and share >= 0.5:
        typer.echo(
            f"note: {100 * share:.0f} % of these recordings keep their response text; --preset "
            "recordings-text trains a Conductor that reads the first answers before it escalates "
            "(two rounds: docs/recordings.md, 'Recordings that keep response texts'); --preset auto "
            "trains both recipes and keeps the better on the validation split",
            err=True,
        )
    elif cfg.max_rounds > 1 and cfg.review_evidence == "text" and share < 0.5:
        typer.echo(
            f"note: only {100 * share:.0f} % of these recordings keep their response text; a review "
            "that reads answers has little to read (a label-only answer is an opaque stand-in): "
            "--preset recordings routes each question in one round",
            err=True,
        )


@app.command("plan")
def plan_cmd(
    model_dir: Annotated[Path, typer.Argument(help="a trained Conductor folder")],
    question: Annotated[str, typer.Argument(help="the question to plan for")],
    pool: Annotated[
        str | None,
        typer.Option(help="worker pool shown to the Conductor (default: the one it was trained for)"),
    ] = None,
    max_cost_usd: Annotated[float | None, typer.Option(callback=positive, help="budget in USD (> 0)")] = None,
    execute_plan: Annotated[
        bool, typer.Option("--execute", help="also run the workflow on the pool")
    ] = False,
    max_rounds: Annotated[
        int | None,
        max_rounds_option(
            "rounds with --execute: after each but the last the Conductor reads the answers so far "
            "and keeps them or adds steps (default: its conductor.json's, else 1)"
        ),
    ] = None,
) -> None:
    """Print the workflow the Conductor would run for a question."""
    import asyncio

    from rl_conductor.errors import InvalidArgument, UserError
    from rl_conductor.evaluation.suite import trained_meta
    from rl_conductor.limits import RequestLimits
    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.tasks.base import Task
    from rl_conductor.validation import has_visible_text
    from rl_conductor.workers.pool import load_pool

    if not has_visible_text(question):
        raise InvalidArgument("the question is blank: give the text to plan for")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("the question is not valid UTF-8 text") from None
    p = load_pool(pool or str(trained_meta([f"conductor:{model_dir}"]).get("pool") or "paper-sim"))
    view = p.view()
    pol = ConductorPolicy.from_spec(str(model_dir), p)  # the pool checks eval and serve run
    task = _recorded_item(p, question) or Task(
        id="cli/question", question=question, answer="", domain="unknown", source="cli", grader="qa"
    )
    rounds = max_rounds or int(pol.meta.get("max_rounds", 1))
    limits = RequestLimits(max_cost_usd=max_cost_usd, max_rounds=rounds)
    plan = asyncio.run(pol.plan(task, view, limits))
    line = pol.plan_ids(task, view, limits) if pol.plan_hint is not None else None
    if line is not None:  # plan_hint: the line the prompt ended with, and whom it names
        who = ", ".join(view.worker(i).info.name for i in line)
        console.print(f"plan line: Plan by estimate: {', '.join(map(str, line))} ({who})", markup=False)
    console.print("[bold]raw completion[/bold]")
    console.print(plan.text, markup=False)
    if plan.fallback:
        console.print(f"[yellow]unparseable ({plan.parse_error}); fallback plan used[/yellow]")
    for i, s in enumerate(plan.workflow.steps):
        who = view.worker(s.worker).info.name
        console.print(f"step {i}: {who} sees {list(s.visible(i))}: {s.instruction}", markup=False)
    for note in plan.notes:
        console.print(note, markup=False)
    if execute_plan:
        trace = asyncio.run(pol.run(task, view, limits, plan=plan)).trace
        for r in trace.rounds[1:]:
            shown = ", ".join("-" if x is None else x[:40] for x in r.answers)
            console.print(
                f"round {r.index}: saw answers [{shown}] (agree: {r.agree}) -> {r.decision}"
                + (f" {r.reason}" if r.reason else "")
                + f", ${r.cost_usd:.5f}",
                markup=False,
            )
            for i in r.steps:
                rec = trace.steps[i]
                console.print(f"  step {i}: {rec.worker} sees {rec.visible}: {rec.instruction}", markup=False)
        console.print(f"final answer: {trace.final_answer}", markup=False)
        console.print(f"cost ${trace.cost_usd:.5f}, tokens {trace.tokens}, calls {trace.calls}")
        if not has_visible_text(trace.final_answer or ""):  # never a blank answer with exit 0
            why = (
                next((a.error for a in trace.attempts if a.error), "")
                or trace.stopped_reason
                or "no step ran"
            )
            raise UserError(f"no worker answered the question; e.g. {why}")


def _recorded_item(pool: Any, question: str) -> Any:
    """The pool's own dataset item whose question is exactly ``question``, or None: a replay
    worker answers items, not free text (and a simulated one grades an item against its gold)."""
    from rl_conductor.tasks.datasets import load_tasks

    dataset = pool.default_dataset(fallback="")  # "": the pool names no dataset of its own
    if not dataset:
        return None
    return next((t for t in load_tasks(dataset) if t.question == question), None)
