"""The predictor's edges found by the second outside attack: calls in flight when a request is
cancelled are charged, slow or unauthenticated clients cannot hold connections, and the small
wire-format holes (v2 shapes, duplicate names and keys, string flags, batch budgets, keys in
access logs, the egress rule, bounded per-request state).

Most checks run in process (the service, the guard as an ASGI app, the parsers); the connection
checks run against the real server process on loopback.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from rl_conductor.policies.fixed import FixedPlan
from rl_conductor.serving.service import ConductorService
from rl_conductor.serving_core import ConductorRequest
from rl_conductor.workers.pool import build_pool

# -- cancelled with calls in flight --------------------------------------------------------------


def _slow_pool() -> Any:
    return build_pool(
        {
            "name": "slow",
            "workers": [
                {"name": "quick", "kind": "fake", "hosting": "self", "price_in": 0.1, "price_out": 0.2},
                {
                    "name": "slow",
                    "kind": "fake",
                    "hosting": "self",
                    "price_in": 0.2,
                    "price_out": 0.4,
                    "latency_s": 30.0,
                },
            ],
        }
    )


def _records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.getMessage().startswith('{"event"')]


async def test_a_request_cancelled_with_a_call_in_flight_is_charged_that_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The chain quick -> slow is cancelled while ``slow`` is in flight: the call was sent and
    may be billed, so the log line charges its reservation (before: only ``quick``'s cost)."""
    from rl_conductor.serving import metrics as m

    service = ConductorService(FixedPlan([0, 1]), _slow_pool())
    steps: list[dict[str, Any]] = []
    caplog.set_level(logging.INFO, "rl_conductor.serving")
    cost_before = m.WORKER_COST.labels("slow")._value.get()
    task = asyncio.ensure_future(
        service.answer(ConductorRequest(question="What is 6*7?", max_cost_usd=0.5), on_step=steps.append)
    )
    while not steps:  # the first step answered: the second is in flight
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (record,) = _records(caplog)
    assert record["cancelled"] is True
    assert record["workers"] == ["quick", "slow"]
    assert record["statuses"] == ["ok", "cancelled"]
    quick = steps[0]["cost_usd"]
    assert record["cost_usd"] > quick > 0
    in_flight = record["cost_usd"] - quick
    assert m.WORKER_COST.labels("slow")._value.get() - cost_before == pytest.approx(in_flight)
    assert record["cost_usd"] <= 0.5
