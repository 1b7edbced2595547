"""Random deadlines for training prompts, as budgets are drawn for a share of them.

Why: the Conductor plans for a deadline only if it sees deadlines in training. A share
(``TrainConfig.deadline_fraction``) of prompts carries a deadline drawn log-uniformly from
``TrainConfig.deadline_range_s`` (short deadlines are as common, relatively, as long ones: 5-10 s
as often as 30-60 s); the executor enforces it during the rollout and the reward's
``deadline_penalty`` charges a workflow it cut short. With ``deadline_fraction == 0`` (the
default) :func:`draw_deadline` touches no random state, so the recipe without deadlines draws
exactly the same prompts as before.

Wiring it into the prompt builder (``training/data.py``: ``PromptSpec`` → ``RequestLimits.max_latency_s``)
belongs to the training recipe.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from rl_conductor.errors import ConfigError

__all__ = ["check_range", "draw_deadline"]


def check_range(range_s: Sequence[float]) -> tuple[float, float]:
    """``[shortest, longest]`` seconds, both finite and > 0, shortest <= longest; else ConfigError."""
    if len(range_s) != 2:
        raise ConfigError(f"deadline_range_s must be [shortest, longest] in seconds, got {list(range_s)!r}")
    low, high = (
        float(x) if isinstance(x, int | float) and not isinstance(x, bool) else math.nan for x in range_s
    )
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
        raise ConfigError(
            f"deadline_range_s must be two finite seconds with 0 < shortest <= longest, got {list(range_s)!r}"
        )
    return low, high


def draw_deadline(rng: random.Random, fraction: float, range_s: Sequence[float]) -> float | None:
    """A deadline in seconds (rounded to 0.1 s) for one prompt with probability ``fraction``, else None.

    Log-uniform over ``range_s``. ``fraction == 0`` returns None without drawing from ``rng``."""
    if not 0 <= fraction <= 1:
        raise ConfigError(f"deadline_fraction must be in [0, 1], got {fraction!r}")
    low, high = check_range(range_s)
    if fraction == 0 or rng.random() >= fraction:
        return None
    return round(math.exp(rng.uniform(math.log(low), math.log(high))), 1)
