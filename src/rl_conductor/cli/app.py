"""The typer application object shared by the command modules, and how it reports errors.

Every command module registers on :data:`app`, whose click group is :class:`ConductorGroup`, so
all commands, present and future, report errors the same way:

- bad input (an unknown name, a value out of range, a missing model folder, a malformed pool
  YAML: :class:`rl_conductor.errors.UsageError`, and click's own usage errors) prints one line,
  ``Error: …``, plus a ``Try '… --help'`` hint for click's errors, on stderr, and exits 2;
- a failure at run time the user can act on (:class:`rl_conductor.errors.UserError`: storage
  refused, a pipeline step failed, MLflow unreachable) prints one line and exits 1;
- anything else is a bug and keeps its full traceback (exit 1).

``--debug`` (or ``CONDUCTOR_DEBUG=1``) shows the traceback for user errors too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from rl_conductor.errors import UserError

DEBUG_ENV = "CONDUCTOR_DEBUG"
_debug = False


def _debug_wanted() -> bool:
    return _debug or os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def report_error(exc: BaseException) -> int:
    """Print ``exc`` for a person on stderr (one line, two with a help hint); returns the exit status."""
    if isinstance(exc, typer.TyperException):  # click's errors (typer vendors click)
        typer.echo(f"Error: {_one_line(exc.format_message())}", err=True)
        ctx = getattr(exc, "ctx", None)  # usage errors know their command
        if ctx is not None and ctx.command.get_help_option(ctx) is not None:
            typer.echo(f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.", err=True)
        return exc.exit_code
    if isinstance(exc, UserError):
        typer.echo(f"Error: {_one_line(str(exc))}", err=True)
        return exc.exit_code
    raise TypeError(f"not a user-facing error: {exc!r}")


class ConductorGroup(TyperGroup):
    """The root ``conductor`` group: runs a command and turns user errors into short messages."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        global _debug
        _debug = False  # set by --debug during this run (CliRunner reuses the process)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except (typer.TyperException, UserError) as exc:
            if not standalone_mode or (isinstance(exc, UserError) and _debug_wanted()):
                raise
            if type(exc).__name__ == "NoArgsIsHelpError":  # typer has printed the help already
                sys.exit(exc.exit_code)
            sys.exit(report_error(exc))
        except typer.Abort:
            if not standalone_mode:
                raise
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        if not standalone_mode:
            return rv
        # without standalone mode, click returns the code of a `typer.Exit` (or of --help) here
        sys.exit(rv if isinstance(rv, int) else 0)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("rl-conductor")
        except PackageNotFoundError:  # running from a checkout that was never installed
            number = "unknown"
        typer.echo(f"conductor {number}")
        raise typer.Exit()


app = typer.Typer(
    name="conductor",
    cls=ConductorGroup,
    help="rl-conductor: train, evaluate and serve an RL-trained orchestrator of LLM worker pools.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit"),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar=DEBUG_ENV,
            help="show a traceback for user errors too (bugs always show one)",
        ),
    ] = False,
) -> None:
    """rl-conductor: train, evaluate and serve an RL-trained orchestrator of LLM worker pools."""
    global _debug
    _debug = debug


pool_app = typer.Typer(help="Worker pools: inspect, check and calibrate.", no_args_is_help=True)
app.add_typer(pool_app, name="pool")
