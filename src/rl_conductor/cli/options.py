"""Typer option callbacks that check values with :mod:`rl_conductor.validation`.

Why: a budget, a count or a port must mean the same thing on the command line, in a pipeline
parameter and in a serving request. The rules live once in ``rl_conductor.validation``; these
callbacks apply them while click parses, so ``--n -5`` fails before anything runs, with click's
usual ``Invalid value for '--n': -5 (expected an integer >= 1)``. Use them on any command::

    n: Annotated[int, typer.Option(callback=count(1))] = 2000
    port: Annotated[int, typer.Option(callback=tcp_port)] = 8080
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer

from rl_conductor import validation
from rl_conductor.errors import UsageError

Callback = Callable[[typer.CallbackParam, Any], Any]


def _option_name(param: typer.CallbackParam) -> str:
    return max(param.opts, key=len) if param.opts else str(param.name)


def checked(rule: Callable[..., Any], *rule_args: Any) -> Callback:
    """A callback applying ``rule(name, value, *rule_args)``; None (an unset option) passes."""

    def callback(param: typer.CallbackParam, value: Any) -> Any:
        if value is None:
            return None
        try:
            rule(_option_name(param), value, *rule_args)
        except validation.InvalidValue as exc:
            raise typer.BadParameter(f"{value!r} (expected {exc.expected})") from exc
        return value

    return callback


def count(minimum: int, maximum: int | None = None) -> Callback:
    """An integer >= ``minimum`` (and <= ``maximum``: a request's cap, ``rl_conductor.limits``)."""
    return checked(validation.integer_at_least, minimum, maximum)


def choice(*words: str) -> Callback:
    """One of ``words``."""
    allowed: Sequence[str] = words
    return checked(validation.one_of, allowed)


#: a finite number > 0 (budgets, time limits)
positive = checked(validation.positive_finite)
#: a finite number >= 0 (weights)
non_negative = checked(validation.non_negative_finite)
#: a number in [0, 1]
fraction = checked(validation.probability)
#: a TCP port in 1..65535
tcp_port = checked(validation.port)
#: any finite number
finite = checked(validation.finite)


def pipeline_parameter(name: str) -> Callback:
    """The pipeline's own rule for parameter ``name`` (``PARAMETER_RULES``)."""

    def rule(option: str, value: Any) -> None:
        from rl_conductor.pipeline.runner import PARAMETER_RULES

        check = PARAMETER_RULES.get(name)
        if check is not None:
            check(option, value)

    return checked(rule)


def writable(path: Path, flag: str = "--json") -> None:
    """Raise :class:`UsageError` unless a file can be written at ``path`` (the folder is made as
    the write would make it, and a scratch file is created and removed there)."""
    import tempfile

    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None


def writable_path(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """A callback for an output file option (``--json PATH``; ``-`` is stdout): one line
    ``Error: --json PATH: cannot write there (...)`` and exit 2 before anything runs, not a
    traceback after the work."""
    if value is not None and str(value) != "-":
        writable(value, _option_name(param))
    return value
