"""The ``conductor`` command: thin typer adapters over the library.

Each sub-module registers its commands on :data:`app`; heavy imports happen inside commands so
``conductor --help`` stays fast.
"""

from __future__ import annotations

from rl_conductor.cli import core as _core  # noqa: F401  (registers commands)
from rl_conductor.cli import live as _live  # noqa: F401
from rl_conductor.cli import pipeline as _pipeline  # noqa: F401
from rl_conductor.cli import pool_check as _pool_check  # noqa: F401
from rl_conductor.cli import retrain as _retrain  # noqa: F401
from rl_conductor.cli import serve as _serve  # noqa: F401
from rl_conductor.cli import train as _train  # noqa: F401
from rl_conductor.cli.app import app

__all__ = ["app"]


def main() -> None:
    app()
