"""Errors whose message is the whole story, so a front door can show it in one line.

Library code raises these for problems the user can fix: a name that does not exist, a number
out of range, a missing model folder, a malformed config file, an object store that refuses
access. The ``conductor`` CLI prints their message on stderr and exits (2 for bad input, 1 for a
failure at run time) instead of a traceback; anything else is a bug and keeps its traceback.

Each class also derives from the builtin a caller would have caught before it existed
(``ValueError``, ``KeyError``, ``FileNotFoundError``), so ``except ValueError`` still works.
"""

from __future__ import annotations

from typing import Any, ClassVar


class UserError(Exception):
    """A failure the user can act on from its message alone (exit status 1: at run time)."""

    exit_code: ClassVar[int] = 1


class UsageError(UserError):
    """Something the user gave is wrong: a value, a name, a path (exit status 2, as for usage)."""

    exit_code: ClassVar[int] = 2


class UnknownName(UsageError, ValueError):
    """A policy, pool, dataset, split, preset or other name that does not exist; the message
    lists the valid ones."""


class UnknownWorker(UnknownName, KeyError):
    """A worker name the pool does not have (a ``KeyError`` too: it is a failed lookup)."""

    def __str__(self) -> str:
        # KeyError quotes its argument (repr); the message is meant to be read as is.
        return str(self.args[0]) if self.args else ""


class InvalidSpec(UsageError, ValueError):
    """A spec string the user wrote (``single:<worker>``, a model spec, …) that does not parse."""


class InvalidArgument(UsageError, ValueError):
    """An argument, or a combination of arguments, that cannot work; the message says what would."""


class ConfigError(UsageError, ValueError):
    """A config file (pool YAML, training preset, …) that does not say something valid."""


class MissingFile(UsageError, FileNotFoundError):
    """A file or folder the user named (or must create first) does not exist."""


class ModelNotFound(MissingFile):
    """No Conductor model where the user pointed (a folder, URI or registry version)."""


def model_not_found(where: str, detail: str = "") -> ModelNotFound:
    """The one message for a model location that holds no Conductor."""
    why = f"; {detail}" if detail else ""
    return ModelNotFound(
        f"no Conductor model at {where} (expected a folder with conductor.json, an s3:// or "
        f"models:/ URI, or a Hugging Face id){why}"
    )


def yaml_problem(exc: Exception) -> str:
    """A YAML parser error in one line ("line 3: mapping values are not allowed here"); the
    parser's own message spans several, with a caret drawing."""
    mark: Any = getattr(exc, "problem_mark", None)
    what = getattr(exc, "problem", None) or exc.__class__.__name__
    return f"line {mark.line + 1}: {what}" if mark is not None else str(what)
