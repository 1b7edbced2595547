"""Core commands: ``pool list|show|calibrate``, ``eval`` and ``compare``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rl_conductor.cli.app import app, pool_app
from rl_conductor.cli.options import choice, count, non_negative, positive, writable_path
from rl_conductor.limits import MAX_CALLS, MAX_ROUNDS, SENSITIVITIES
from rl_conductor.validation import SPLIT_CHOICES

# a fixed width when not on a terminal (CI logs, pipes), so tables keep their columns whole
#: in a log or a pipe, wide enough that a table of long policy names keeps its numbers whole
console = Console(stderr=False, width=None if Console().is_terminal else 200)


def _write_json(path: Path | None, payload: Any) -> None:
    if path is None:
        return
    from rl_conductor import storage
    from rl_conductor.errors import UsageError

    try:
        storage.write_json(str(path), payload)
    except OSError as exc:  # checked at parse time (writable_path); gone or full since
        raise UsageError(f"--json {path}: cannot write it ({exc.strerror or exc})") from None
    console.print(f"[dim]wrote {path}[/dim]")


SeedOpt = Annotated[int, typer.Option(callback=count(0), help="random seed (>= 0)")]
LimitOpt = Annotated[int | None, typer.Option(callback=count(1), help="at most N tasks")]
SplitOpt = Annotated[str, typer.Option(callback=choice(*SPLIT_CHOICES), help=" | ".join(SPLIT_CHOICES))]
#: eval's and compare's: a ``conductor:DIR`` policy's own pool and dataset unless given
TrainedPoolOpt = Annotated[
    str | None,
    typer.Option(help="pool name or YAML path (default: the Conductor's training pool, else paper-sim)"),
]
TrainedDatasetOpt = Annotated[
    str | None, typer.Option(help="dataset (default: the Conductor's with its pool, else the pool's)")
]


CostWeightOpt = Annotated[
    float | None,
    typer.Option(
        callback=non_negative,
        help="score every policy (and fit knn / domain-router) at this cost weight (>= 0; default: "
        "the Conductor's own, from its conductor.json, else the preset's)",
    ),
]
RewardPresetOpt = Annotated[
    str | None,
    typer.Option(
        callback=choice("cost-aware", "paper"),
        help="cost-aware | paper (default: the Conductor's own, else cost-aware)",
    ),
]


def max_rounds_option(what: str) -> Any:
    """A ``--max-rounds`` option: an integer from 1 to the request cap (``limits.MAX_ROUNDS``);
    ``what`` says what the rounds are, the help adds the range."""
    return typer.Option(callback=count(1, MAX_ROUNDS), help=f"{what} (1 to {MAX_ROUNDS})")


#: ``evaluation.paired.FRONTIER_WEIGHTS`` as ``compare --help`` shows them (a test keeps the two
#: equal; importing that module here would load numpy for every command)
FRONTIER_WEIGHTS_HELP = "0,0.01,0.02,0.05,0.1,0.15,0.2,0.3,0.5,1"
MaxRoundsOpt = Annotated[
    int | None,
    max_rounds_option(
        "rounds a policy may use: after each but the last, one that reviews (the Conductor, "
        "cascade) reads the answers so far and keeps them or adds steps; 1 = plan once (default: "
        "each Conductor the rounds of its conductor.json, a fixed cascade its 2, every other policy 1)"
    ),
]
MaxCallsOpt = Annotated[
    int | None,
    typer.Option(
        callback=count(1, MAX_CALLS),
        help=f"most worker calls per question over all rounds (1 to {MAX_CALLS})",
    ),
]
FitLimitOpt = Annotated[
    int | None,
    typer.Option(callback=count(1), help="fit knn / domain-router on N training questions (default: all)"),
]


@pool_app.command("list")
def pool_list() -> None:
    """List the built-in pools."""
    from rl_conductor.workers.pool import available_pools

    for name in available_pools():
        console.print(name)


@pool_app.command("show")
def pool_show(pool: Annotated[str, typer.Argument(help="pool name or YAML path")] = "paper-sim") -> None:
    """Show a pool's workers, prices and hosting."""
    from rl_conductor.workers.pool import load_pool

    p = load_pool(pool)
    t = Table(title=f"pool {p.name}")
    for col in ("id", "worker", "kind", "hosting", "$/1M in", "$/1M out", "description"):
        t.add_column(col)
    for i, w in enumerate(p.workers):
        inf = w.info
        t.add_row(
            str(i),
            inf.name,
            inf.kind,
            inf.hosting,
            f"{inf.price_in:g}",
            f"{inf.price_out:g}",
            inf.description,
        )
    console.print(t)


@pool_app.command("calibrate")
def pool_calibrate(
    pool: Annotated[str, typer.Option(help="pool name or YAML path")] = "paper-sim",
    n: Annotated[int, typer.Option(callback=count(1), help="number of tasks to simulate")] = 2000,
    dataset: Annotated[str | None, typer.Option(help="dataset (default: the pool's)")] = None,
    seed: SeedOpt = 0,
    json_out: Annotated[
        Path | None, typer.Option("--json", callback=writable_path, help="write the rows as JSON here")
    ] = None,
    collaboration: Annotated[
        bool,
        typer.Option(
            help="also search the candidate workflows per domain and compare the best with the "
            "paper's Conductor row (minutes on the full set)"
        ),
    ] = True,
    check: Annotated[
        bool,
        typer.Option(
            help="exit 1 if a worker is > 2.5 points from its target or a held-out best workflow > 1.5 "
            "from the paper"
        ),
    ] = False,
) -> None:
    """Compare each simulated worker's accuracy per domain with its calibration target, and the
    best fixed workflow per domain with the paper's Conductor."""
    from rl_conductor.evaluation.calibrate import (
        COLLABORATION_TOLERANCE,
        SINGLE_TOLERANCE,
        calibrate,
        collaboration_gap,
        collaboration_table,
        max_gap,
    )
    from rl_conductor.evaluation.suite import dataset_for
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.workers.pool import load_pool

    p = load_pool(pool, seed=seed)
    tasks = load_tasks(dataset_for(p, dataset), split="all")
    rows = calibrate(p, tasks, n=n)
    t = Table(title=f"calibration of {p.name} (n={n})")
    for col in ("worker", "domain", "target %", "simulated %", "diff", "n"):
        t.add_column(col, justify="right")
    for r in rows:
        tgt = r.get("target")
        diff = "" if tgt is None else f"{r['simulated'] - tgt:+.2f}"
        t.add_row(
            r["worker"],
            r["domain"],
            "-" if tgt is None else f"{tgt:.2f}",
            f"{r['simulated']:.2f}",
            diff,
            str(r["n"]),
        )
    console.print(t)
    collab: list[dict[str, Any]] = []
    if collaboration:
        collab = collaboration_table(p, tasks, n=n, singles=rows)
        ct = Table(title=f"collaboration: best workflow per domain vs the paper's Conductor (n={n})")
        cols = ("domain", "paper %", "single %", "in-sample %", "held-out %", "diff", "$/q", "tokens", "out")
        for col in (*cols, "steps"):
            ct.add_column(col, justify="right")
        ct.add_column("workflow")
        for r in collab:
            diff = "" if r["paper"] is None else f"{r['held_out'] - r['paper']:+.2f}"
            ct.add_row(
                r["domain"],
                "-" if r["paper"] is None else f"{r['paper']:.2f}",
                f"{r['best_single_accuracy']:.2f}",
                f"{r['accuracy']:.2f}",
                f"{r['held_out']:.2f}",
                diff,
                f"{r['cost_usd']:.4f}",
                f"{r['tokens']:.0f}",
                f"{r['output_tokens']:.0f}",
                f"{r['steps']:.2f}",
                r["workflow"],
            )
        console.print(ct)
    _write_json(json_out, {"pool": p.name, "n": n, "rows": rows, "collaboration": collab})
    if check:
        single, joint = max_gap(rows), collaboration_gap(collab)
        console.print(
            f"largest gap: single workers {single:.2f} points, best workflows held out {joint:.2f} points "
            f"(in-sample {collaboration_gap(collab, 'accuracy'):.2f}, not gated)"
        )
        if single > SINGLE_TOLERANCE or joint > COLLABORATION_TOLERANCE:
            raise typer.Exit(1)


def fail_if_nothing_answered(summaries: list[dict[str, Any]]) -> None:
    """Exit 1 naming each policy whose every worker call failed (its 0 % measures a broken pool
    or recordings file, not the policy); warn of partial failures, replaced workers and plans
    that did not parse (:func:`~rl_conductor.evaluation.runner.measurement_warnings`)."""
    from rl_conductor.evaluation.runner import every_call_failed, measurement_warnings

    failed = [every_call_failed(s) for s in summaries]
    reasons = [r for r in failed if r]
    warnings = (w for s, r in zip(summaries, failed, strict=True) if not r for w in measurement_warnings(s))
    for line in dict.fromkeys(warnings):
        typer.echo(f"warning: {line}", err=True)
    for reason in reasons:
        typer.echo(f"error: {reason}", err=True)
    if reasons:
        raise typer.Exit(1)


@app.command("eval")
def eval_cmd(
    policy: Annotated[
        list[str],
        typer.Option(
            help="single:<worker> | random | moa | moa:a,b>agg | self-consistency:<worker> | oracle | "
            "knn | domain-router | fixed:0,1 | conductor:DIR (repeatable; the specs `serve --policy` takes)"
        ),
    ],
    pool: TrainedPoolOpt = None,
    dataset: TrainedDatasetOpt = None,
    split: SplitOpt = "test",
    limit: LimitOpt = None,
    seed: SeedOpt = 0,
    max_cost_usd: Annotated[
        float | None, typer.Option(callback=positive, help="per-request budget in USD (> 0)")
    ] = None,
    max_latency_s: Annotated[
        float | None,
        typer.Option(callback=positive, help="per-request deadline in seconds (critical path, > 0)"),
    ] = None,
    sensitivity: Annotated[
        str, typer.Option(callback=choice(*SENSITIVITIES), help="public | private")
    ] = "public",
    allowed_workers: Annotated[str | None, typer.Option(help="comma-separated worker names")] = None,
    concurrency: Annotated[int, typer.Option(callback=count(1), help="tasks in flight (>= 1)")] = 32,
    json_out: Annotated[
        Path | None, typer.Option("--json", callback=writable_path, help="write the summary JSON here")
    ] = None,
    cost_weight: CostWeightOpt = None,
    reward_preset: RewardPresetOpt = None,
    fit_limit: FitLimitOpt = None,
    max_rounds: MaxRoundsOpt = None,
    max_calls: MaxCallsOpt = None,
) -> None:
    """Evaluate one or more policies on a pool and print a table.

    Every policy is scored with one reward (the Conductor's own by default) and the routers are
    fitted at it. With a ``conductor:DIR`` policy, ``--pool`` and ``--dataset`` default to what it
    was trained on (its ``conductor.json``). With several policies, the first minus each other is
    shown question by question, with 95 % paired intervals (``paired`` in the JSON; every summary's
    ``questions`` holds its per-question outcomes). Exits 1 when every worker call of a policy failed."""
    from rl_conductor.evaluation.report import behaviour_table, domain_table, print_table
    from rl_conductor.evaluation.suite import run_eval, trained_defaults

    pool, dataset = trained_defaults(policy, pool, dataset)
    summaries = run_eval(
        policy,
        pool=pool,
        dataset=dataset,
        split=split,
        limit=limit,
        seed=seed,
        max_cost_usd=max_cost_usd,
        max_latency_s=max_latency_s,
        sensitivity=sensitivity,
        allowed=allowed_workers,
        concurrency=concurrency,
        reward_preset=reward_preset,
        cost_weight=cost_weight,
        fit_limit=fit_limit,
        max_rounds=max_rounds,  # None: each policy its own (a Conductor's conductor.json)
        max_calls=max_calls,
    )
    print_table(summaries, title=f"{pool} / {summaries[0]['dataset']} / {split}")
    for s in summaries:
        console.print(domain_table(s))
    console.print(behaviour_table(summaries))
    paired = _print_paired(summaries, summaries[0]["policy"]) if len(summaries) > 1 else []
    console.print(_reward_line(summaries[0]))
    # one shape whatever the number of policies: ``results`` always; one policy's summary is also
    # the top level, as it was before ``results`` was written for it
    _write_json(
        json_out,
        {
            **(summaries[0] if len(summaries) == 1 else {}),
            "results": summaries,
            **({"paired": paired} if paired else {}),
        },
    )
    fail_if_nothing_answered(summaries)


def _print_paired(summaries: list[dict[str, Any]], reference: str, at: str = "") -> list[dict[str, Any]]:
    """Print ``reference`` minus every other policy of ``summaries``, question by question, with
    95 % paired intervals (:mod:`rl_conductor.evaluation.paired`); the rows, for the JSON. ``at``:
    the budget / deadline they ran under, for the title."""
    from rl_conductor.evaluation.paired import paired_rows
    from rl_conductor.evaluation.report import paired_table

    rows = paired_rows(summaries, reference)
    if rows:
        console.print(paired_table(rows, reference + at))
    return rows


def _equal_cost(
    reference: dict[str, Any],
    singles: list[dict[str, Any]],
    families: list[str],
    weights: list[float],
    at: str = "",
    **options: Any,
) -> dict[str, Any]:
    """Trace each family's frontier (``run_frontier``, under the point ``options`` give: the
    budget and deadline the reference and the singles ran under), print ``reference`` minus each
    frontier at its cost; the JSON entries (``equal_cost`` rows, ``frontier`` summaries)."""
    from rich.text import Text

    from rl_conductor.evaluation.paired import equal_cost_difference
    from rl_conductor.evaluation.report import equal_cost_table
    from rl_conductor.evaluation.suite import run_frontier

    said = f"tracing {', '.join(families)} at cost weights {', '.join(f'{w:g}' for w in weights)}{at}…"
    console.print(Text(said, style="dim"))
    traced = run_frontier(families, weights, **options)
    rows = [
        equal_cost_difference(reference, [*runs, *singles], family=f"{family} (+ single workers)")
        for family, runs in traced.items()
    ]
    title = f"{reference['policy']}{at}: accuracy at equal cost, minus each frontier (same questions)"
    console.print(equal_cost_table(rows, title))
    return {"equal_cost": rows, "frontier": traced}


def _reward_line(summary: dict[str, Any]) -> str:
    r = summary.get("reward") or {}
    weight, scale = r.get("cost_weight", "?"), r.get("cost_scale", "?")
    return f"reward: cost weight {weight} per ${scale} (every policy scored and every router fitted at it)"


@app.command("compare")
def compare_cmd(
    pool: TrainedPoolOpt = None,
    dataset: TrainedDatasetOpt = None,
    split: SplitOpt = "test",
    limit: LimitOpt = None,
    seed: SeedOpt = 0,
    extra: Annotated[list[str] | None, typer.Option("--policy", help="extra policies to include")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", callback=writable_path)] = None,
    plot: Annotated[Path | None, typer.Option(help="write a cost-vs-accuracy Pareto PNG here")] = None,
    budgets: Annotated[
        str | None,
        typer.Option(
            help="also run the same questions under these per-request budgets, e.g. none,0.002 "
            "(side-by-side table; the JSON keeps every run; --plot draws them)"
        ),
    ] = None,
    deadlines: Annotated[
        str | None,
        typer.Option(
            help="also run the same questions under these per-request deadlines in seconds, e.g. "
            "none,60,15,5 (latency-vs-accuracy table; the JSON keeps every run; --plot also writes "
            "PLOT-latency.png next to the Pareto chart)"
        ),
    ] = None,
    behaviour: Annotated[
        bool, typer.Option(help="print per domain which workers each policy calls and its workflow shapes")
    ] = True,
    cost_weight: CostWeightOpt = None,
    reward_preset: RewardPresetOpt = None,
    fit_limit: FitLimitOpt = None,
    max_rounds: MaxRoundsOpt = None,
    frontier: Annotated[
        list[str] | None,
        typer.Option(
            help="a router family (repeat for several: --frontier knn --frontier domain-router), "
            "fitted at every --frontier-weights weight on the same questions; the first --policy's "
            "accuracy minus the family's cost-accuracy frontier (with the single workers) at its "
            "cost, 95 % paired interval"
        ),
    ] = None,
    frontier_weights: Annotated[
        str | None,
        typer.Option(
            help="cost weights that trace each --frontier family (comma-separated, >= 0; default: "
            f"{FRONTIER_WEIGHTS_HELP})"
        ),
    ] = None,
) -> None:
    """Evaluate every baseline (and extra policies) side by side; table, JSON and Pareto chart.

    With a ``--policy conductor:DIR``, ``--pool`` and ``--dataset`` default to what it was trained
    on (its ``conductor.json``), as ``eval``'s do. Every policy is scored with one reward —
    ``--cost-weight`` / ``--reward-preset``, else the reward the first ``--policy conductor:DIR``
    was trained with — and knn / domain-router are fitted at it on every training question
    (``--fit-limit N``: N of them). The first ``--policy`` minus every other policy is shown
    question by question, with 95 % paired intervals (``paired`` in the JSON). Exits 1 when every
    worker call of a policy failed."""
    from rl_conductor.evaluation.report import (
        behaviour_table,
        budget_label,
        budget_plot,
        budget_table,
        deadline_label,
        deadline_plot,
        deadline_table,
        pareto_plot,
        parse_budgets,
        parse_deadlines,
        print_table,
    )
    from rl_conductor.evaluation.suite import GridPoint, baseline_specs, run_sweep, trained_defaults

    pool, dataset = trained_defaults(list(extra or []), pool, dataset)
    families = [f.strip() for f in frontier or [] if f.strip()]
    if families and not extra:
        raise typer.BadParameter("needs a --policy to compare with the frontier", param_hint="--frontier")
    from rl_conductor.policies.catalog import FRONTIER_KINDS, POLICY_KINDS

    unknown = [f for f in families if f.partition(":")[0] not in POLICY_KINDS]
    if unknown:  # found before minutes of evaluation, not after
        listed = "," in unknown[0] and all(p.partition(":")[0] in POLICY_KINDS for p in unknown[0].split(","))
        hint = "; give --frontier once per family" if listed else ""
        raise typer.BadParameter(
            f"unknown policy {unknown[0]!r}; known kinds: {', '.join(sorted(POLICY_KINDS))}{hint}",
            param_hint="--frontier",
        )
    fixed = [f for f in families if f.partition(":")[0] not in FRONTIER_KINDS]
    if fixed:  # one point however the weight moves (an oracle's would stand above any policy)
        raise typer.BadParameter(
            f"{fixed[0]!r} does not change with the cost weight, so it traces no frontier; a family is "
            f"one of {', '.join(FRONTIER_KINDS)} (the single workers are always points)",
            param_hint="--frontier",
        )
    from rl_conductor.evaluation.paired import FRONTIER_WEIGHTS

    try:
        given = frontier_weights
        weights = (
            list(FRONTIER_WEIGHTS) if given is None else [float(w) for w in given.split(",") if w.strip()]
        )
    except ValueError as exc:
        raise typer.BadParameter(f"{frontier_weights!r}: {exc}", param_hint="--frontier-weights") from exc
    if families and (not weights or any(not math.isfinite(w) or w < 0 for w in weights)):
        raise typer.BadParameter("cost weights must be finite numbers >= 0", param_hint="--frontier-weights")
    try:
        amounts = parse_budgets(budgets) if budgets else [None]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--budgets") from exc
    try:
        times = parse_deadlines(deadlines) if deadlines else [None]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--deadlines") from exc
    # a baseline also given as a --policy runs once, in the --policy's place (it was run and shown
    # twice: minutes of fitting for a duplicate row)
    specs = [b for b in baseline_specs(pool) if b not in (extra or [])] + list(extra or [])
    points = [
        GridPoint(
            amount,
            deadline,
            {"budget": budget_label(amount), **({"deadline": deadline_label(deadline)} if deadlines else {})},
        )
        for amount in amounts
        for deadline in times
    ]
    # the questions and options every run of this comparison shares (the frontier's too)
    same: dict[str, Any] = dict(
        pool=pool,
        dataset=dataset,
        split=split,
        limit=limit,
        seed=seed,
        reward_preset=reward_preset,
        fit_limit=fit_limit,
        max_rounds=max_rounds,  # None: each policy its own (a Conductor's conductor.json)
    )
    summaries = run_sweep(specs, points, cost_weight=cost_weight, **same)
    for at, point in enumerate(points):
        runs = summaries[at * len(specs) : (at + 1) * len(specs)]
        label = "" if point.max_cost_usd is None else f" / budget ${point.max_cost_usd:g}"
        label += "" if point.max_latency_s is None else f" / deadline {point.max_latency_s:g} s"
        print_table(runs, title=f"{pool} / {runs[0]['dataset']} / {split}{label}")
        if behaviour:
            console.print(behaviour_table([s for s in runs if not s["policy"].startswith("single:")]))
    # Side-by-side views vary one limit at a time, the other held at its first value.
    by_budget = [s for s in summaries if s.get("deadline", "none") == deadline_label(times[0])]
    by_deadline = [s for s in summaries if s["budget"] == budget_label(amounts[0])]
    if len(amounts) > 1:
        console.print(budget_table(by_budget))
    if len(times) > 1:
        console.print(deadline_table(by_deadline))
    # the first --policy (a Conductor, typically) minus every other policy at the first point,
    # named in the titles when there are several
    first = summaries[: len(specs)]
    at = ""
    if len(points) > 1:
        at = f" (at {', '.join(f'{k} {v}' for k, v in points[0].label.items())})"
    reference = first[len(specs) - len(extra or [])] if extra else None
    paired = _print_paired(first, reference["policy"], at) if reference else []
    for row in paired:  # the limits they ran under, as each of `results` says its own
        row.update(points[0].label)
    extras: dict[str, Any] = {"paired": paired} if paired else {}
    if families and reference is not None:
        # the comparison so far is written before the frontier is traced: a family that fails
        # there loses none of it
        _write_json(json_out, {"results": summaries, **extras})
        extras.update(
            _equal_cost(
                reference,
                [s for s in first if s["policy"].startswith("single:")],
                families,
                weights,
                at,
                point=GridPoint(points[0].max_cost_usd, points[0].max_latency_s),
                **same,
            )
        )
        for row in extras["equal_cost"]:
            row.update(points[0].label)
        for runs in extras["frontier"].values():
            for summary in runs:
                summary.update(points[0].label)
    console.print(_reward_line(summaries[0]))
    _write_json(json_out, {"results": summaries, **extras})
    if plot:
        n = summaries[0]["n"]
        if len(amounts) > 1:
            budget_plot(by_budget, plot, title=f"{pool}: accuracy under budgets ({split}, n={n})")
        else:
            pareto_plot(by_budget, plot, title=f"{pool}: cost vs accuracy ({split}, n={n})")
        console.print(f"[dim]wrote {plot}[/dim]")
        if len(times) > 1:
            latency_png = plot.with_name(f"{plot.stem}-latency{plot.suffix or '.png'}")
            deadline_plot(
                by_deadline, latency_png, title=f"{pool}: accuracy under deadlines ({split}, n={n})"
            )
            console.print(f"[dim]wrote {latency_png}[/dim]")
    fail_if_nothing_answered(summaries)
