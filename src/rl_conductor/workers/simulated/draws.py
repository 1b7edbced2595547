"""Stable randomness for the simulated pool: every draw is a BLAKE2b hash of its inputs.

Why: the same seed must give the same text on every machine and in every process, so no draw
uses Python's ``hash()`` or a global RNG.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics


def unit(*parts: object) -> float:
    """A uniform number in (0, 1) from a stable hash of ``parts`` (never Python's ``hash()``)."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return (int.from_bytes(h, "big") + 0.5) / 2.0**64


_STD_NORMAL = statistics.NormalDist()


def normal(*parts: object) -> float:
    return _STD_NORMAL.inv_cdf(unit(*parts))


def logistic(*parts: object) -> float:
    u = unit(*parts)
    return math.log(u / (1.0 - u))


def seeded_rng(*parts: object) -> random.Random:
    """A ``random.Random`` seeded from ``parts`` (:func:`unit`): the same parts, the same draws."""
    return random.Random(int(unit(*parts) * 2**53))
