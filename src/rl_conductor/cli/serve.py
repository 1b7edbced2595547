"""``conductor serve``: run the KServe predictor (thin adapter over ``rl_conductor.serving.server``).

KServe's own flags (``--http_port``, ``--grpc_port``, ``--enable_grpc``, ``--model_name``, ...) pass
through unchanged to KServe's argument parser, which is why this command forwards its arguments
instead of declaring every option in typer.
"""

from __future__ import annotations

import typer

from rl_conductor.cli.app import app


@app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def serve(ctx: typer.Context) -> None:
    """Serve the Conductor with KServe: --model URI|DIR (default models:/conductor@champion) or
    --policy SPEC, --pool NAME|YAML, plus KServe's flags (--http_port, --grpc_port). --help lists all."""
    from rl_conductor.loop.serving import TrafficExtension
    from rl_conductor.serving.server import main

    main(list(ctx.args), extensions=(TrafficExtension(),))
