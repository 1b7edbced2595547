"""The typer application object shared by the command modules."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="conductor",
    help="rl-conductor: train, evaluate and serve an RL-trained orchestrator of LLM worker pools.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
pool_app = typer.Typer(help="Worker pools: inspect and calibrate.", no_args_is_help=True)
app.add_typer(pool_app, name="pool")
