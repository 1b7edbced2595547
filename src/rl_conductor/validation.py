"""One place that says which values are valid, reused by the CLI, the pipeline, serving and `RequestLimits`.

Every front door (a CLI option, a KFP parameter, a JSON request field, a dataclass field) checks
its numbers with these functions, so a rule such as "a budget is a finite number above zero" is
written once and the error a user sees names the field, the bad value and what would be valid.
``InvalidValue`` subclasses ``ValueError`` so callers that already catch ``ValueError`` keep working,
and :class:`rl_conductor.errors.UsageError`, so the CLI shows it in one line (exit status 2).
"""

from __future__ import annotations

import math
import numbers
import unicodedata
from collections.abc import Sequence
from typing import Any

from rl_conductor.errors import UsageError


class InvalidValue(UsageError, ValueError):
    """A value outside what the field accepts; the message names the field and the valid range."""

    def __init__(self, name: str, value: Any, expected: str) -> None:
        self.name = name
        self.value = value
        self.expected = expected
        super().__init__(f"invalid {name}: {value!r} (expected {expected})")


#: The three disjoint splits of every dataset (``tasks.datasets.split_of``), and the words a split
#: option takes (``all`` besides): defined once, here at the bottom so that the CLI reads them
#: without importing the dataset registry; ``tasks``, the pipeline and the benchmarks read them too.
DATA_SPLITS = ("train", "validation", "test")
SPLIT_CHOICES = (*DATA_SPLITS, "all")


def has_visible_text(text: str) -> bool:
    """Whether ``text`` holds a character one can see: not only whitespace, separators, controls
    or format characters (zero-width space, NUL, ...). A question without one is blank, and so
    is a worker's answer (the step is then empty, never a 200)."""
    return any(unicodedata.category(c)[0] not in "CZ" for c in text)


def _real(name: str, value: Any, expected: str) -> float:
    # bool is an int in Python; `true` as a budget is a client bug, not $1.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidValue(name, value, expected)
    try:
        number = float(value)
    except (OverflowError, ValueError):  # 10**400, or a Real that will not convert
        raise InvalidValue(name, value, expected) from None
    if not math.isfinite(number):
        raise InvalidValue(name, value, expected)
    return number


def finite(name: str, value: Any) -> float:
    """Any finite number (parameters where a negative value means "use the default")."""
    return _real(name, value, "a finite number")


def positive_finite(name: str, value: Any, maximum: float | None = None) -> float:
    """A finite number strictly above zero (budgets, timeouts, deadlines), at most ``maximum``."""
    expected = "a finite number > 0" + (f" and <= {maximum:g}" if maximum is not None else "")
    number = _real(name, value, expected)
    if number <= 0 or (maximum is not None and number > maximum):
        raise InvalidValue(name, value, expected)
    return number


def non_negative_finite(name: str, value: Any) -> float:
    """A finite number at or above zero (weights, penalties, gains)."""
    expected = "a finite number >= 0"
    number = _real(name, value, expected)
    if number < 0:
        raise InvalidValue(name, value, expected)
    return number


def probability(name: str, value: Any) -> float:
    """A finite number in [0, 1]."""
    expected = "a number in [0, 1]"
    number = _real(name, value, expected)
    if not 0.0 <= number <= 1.0:
        raise InvalidValue(name, value, expected)
    return number


def integer_at_least(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """An integer >= ``minimum`` (counts, steps, token limits), at most ``maximum``."""
    expected = f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        raise InvalidValue(name, value, expected)
    return int(value)


def one_of(name: str, value: Any, choices: Sequence[str]) -> str:
    """One of a fixed set of words (sensitivity, split, …)."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidValue(name, value, "one of " + ", ".join(choices))
    return value


def port(name: str, value: Any) -> int:
    """A TCP port number in 1..65535."""
    expected = "a port in 1..65535"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidValue(name, value, expected)
    return value
