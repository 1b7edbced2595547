"""Modules that test files name at the top but import only when a test first uses them.

Why it exists: every pytest-xdist worker collects every test file, and importing torch, TRL,
MLflow or a vendor SDK at collection costs seconds of CPU per worker, paid again by each
worker even when it runs none of the tests that need them (``make test-fast`` deselects them
only after collecting). ``torch = lazy("torch")`` reads like ``import torch``; the first
attribute access imports the real module through the normal import system (public names only:
collection probes a module-level object for ``__test__``, ``__wrapped__`` and the like).
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class _Lazy(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # what collection probes (__test__, __wrapped__, _mock_name...)
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.__name__), attr)


def lazy(name: str) -> Any:
    """The module ``name``, imported on first attribute access."""
    return _Lazy(name)
