"""Spend guard: a dollar ceiling for a whole training or evaluation run against paid APIs.

The executor's ``max_cost_usd`` bounds one request; a run makes thousands. A :class:`SpendGuard`
shared by every live worker of a pool (pool option ``max_usd``) reserves each call's worst case
(an input-token upper bound for any text plus ``max_tokens`` of output, at the worker's prices)
before the call goes out and charges the reported cost after it. A call whose worst case would
cross the ceiling is refused with :class:`SpendLimitError` and never sent, so the total spent
never crosses ``max_usd``; every later call is refused the same way, and the run finishes
cleanly with those steps marked failed. Cache hits spend nothing and are never refused.

A retry that follows an attempt charged its worst case (timed out, stream cut) reserves one more
worst case before it is sent (``LiveWorker._cover_retry``), and is not sent when that does not
fit, so retried timeouts never take the total past ``max_usd`` either.

Simplification: a call that raised after being sent is charged nothing (most APIs do not bill
failed requests); a timed-out call is charged its reservation, since it may still be billed.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

from rl_conductor.workers.base import Message, WorkerError, WorkerInfo


class SpendLimitError(WorkerError):
    """The run's spend ceiling would be crossed by this call; it was not sent."""


def worst_case_cost(info: WorkerInfo, messages: list[Message], max_tokens: int) -> float:
    """Upper bound of what one call may cost: ``info.input_token_bound`` input tokens (UTF-8
    bytes + 16 a message for a server's tokenizer) and ``max_tokens`` output, which caps every
    billed output token, reasoning and thinking included (docs/live-workers.md)."""
    return info.cost(info.input_token_bound(messages), max(0, max_tokens))


@dataclass
class SpendGuard:
    """A run-wide ceiling on real spend (see the module docstring)."""

    max_usd: float
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    calls: int = 0
    refused: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_usd) and self.max_usd >= 0):
            raise ValueError(f"max_usd must be a finite number >= 0, got {self.max_usd!r}")

    def reserve(self, name: str, amount: float) -> float:
        """Hold ``amount`` for a call, or raise :class:`SpendLimitError` if it might cross the ceiling."""
        with self._lock:
            if self.spent_usd + self.reserved_usd + amount > self.max_usd:
                self.refused += 1
                raise SpendLimitError(
                    f"{name}: spend guard: this call could cost up to ${amount:.6f}, and "
                    f"${self.spent_usd:.6f} of the run's max_usd ${self.max_usd:g} is spent "
                    f"(${self.reserved_usd:.6f} reserved); not sent"
                )
            self.reserved_usd += amount
            return amount

    def settle(self, reservation: float, charge: float) -> None:
        """Release a reservation and charge what the call really cost."""
        with self._lock:
            self.reserved_usd = max(0.0, self.reserved_usd - reservation)
            self.spent_usd += charge
            self.calls += 1

    def summary(self) -> dict[str, Any]:
        return {
            "max_usd": self.max_usd,
            "spent_usd": self.spent_usd,
            "calls": self.calls,
            "refused": self.refused,
        }
