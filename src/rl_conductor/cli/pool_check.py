"""``conductor pool check POOL``: call every worker of a pool once and show what came back.

A thin adapter over :func:`rl_conductor.workers.check.check_pool_file`: a table of status,
latency, usage and cost per worker (``--json PATH`` writes the report, ``-`` to stdout), and
exit status 1 when any worker failed, so a pipeline or a person finds a wrong ``base_url`` or a
refused key before an evaluation or a deployment does. A replay worker replays every item of its
recordings instead (items it cannot replay, answers ``max_tokens`` cuts, recorded costs that
disagree with the pool's prices: :func:`rl_conductor.workers.check.replay_check`). A ``--json``
path that cannot be written is a usage error (one line, exit 2), found before any worker is called.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rl_conductor.cli.app import pool_app
from rl_conductor.cli.core import console
from rl_conductor.cli.options import positive, writable_path
from rl_conductor.errors import UsageError


@pool_app.command("check")
def pool_check(
    pool: Annotated[str, typer.Argument(help="pool name or YAML path")],
    timeout_s: Annotated[
        float, typer.Option(callback=positive, help="seconds each worker has to answer (> 0)")
    ] = 60.0,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", callback=writable_path, help="write the report as JSON here ('-': stdout)"),
    ] = None,
) -> None:
    """Call each worker once with a tiny prompt; print latency, tokens and cost per worker and
    why a worker failed (exit 1 when any did)."""
    from rl_conductor.workers.check import CHECK_MAX_TOKENS, check_pool_file

    # each failure is printed below the table; the live client's one-time warning would repeat it
    live_log = logging.getLogger("rl_conductor.workers.live.base")
    level = live_log.level
    live_log.setLevel(logging.ERROR)
    try:
        report = check_pool_file(pool, timeout_s=timeout_s)
    finally:
        live_log.setLevel(level)
    if json_out is not None and str(json_out) == "-":
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        replays = [w for w in report.workers if w.replay is not None]
        how = f"one call each, max_tokens {CHECK_MAX_TOKENS}"
        if replays:
            cap = max(w.replay["max_tokens"] for w in replays if w.replay)
            how += (
                f"; replay workers: every recorded item at max_tokens up to {cap}, tokens and cost per item"
            )
        table = Table(title=f"pool check: {report.pool} ({how})")
        for col in ("worker", "kind", "hosting", "url", "status", "latency s", "in tok", "out tok", "cost $"):
            right = col in ("latency s", "in tok", "out tok", "cost $")
            table.add_column(col, justify="right" if right else "left", overflow="fold")
        table.add_column("detail")
        for w in report.workers:
            style = "green" if w.ok else "red"
            table.add_row(
                w.name,
                w.kind,
                w.hosting,
                w.url,
                f"[{style}]{w.status}[/{style}]",
                "-" if w.latency_s is None else f"{w.latency_s:.3f}",
                str(w.input_tokens),
                str(w.output_tokens),
                f"{w.cost_usd:.3g}",
                w.detail if len(w.detail) <= 48 else w.detail[:47] + "…",
            )
        console.print(table)
        for w in report.workers:  # whole, one line each: what to fix, what a replay found
            if not w.ok:
                console.print(f"[red]{w.name}[/red]: {w.detail}", soft_wrap=True)
            elif w.replay is not None:
                console.print(f"{w.name}: {w.detail}", soft_wrap=True)
        if json_out is not None:
            from rl_conductor import storage

            try:
                storage.write_json(str(json_out), report.to_dict())
            except OSError as exc:
                raise UsageError(f"--json {json_out}: cannot write it ({exc.strerror or exc})") from None
            console.print(f"[dim]wrote {json_out}[/dim]")
    if not report.ok:
        names = ", ".join(f"{w.name} ({w.status})" for w in report.failed)
        typer.echo(f"Error: {len(report.failed)} of {len(report.workers)} workers failed: {names}", err=True)
        raise typer.Exit(1)
