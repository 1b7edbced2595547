"""The predictor's side of the loop: traffic-log flags, the log's hook and the feedback routes.

Why apart from ``serving/server.py``: the server stays the KServe adapter and never imports the
loop; this module adds what the loop needs to it through :class:`TrafficExtension`, which the
front door (``conductor serve``, the predictor image) passes to ``serving.server.main``, so the
two evolve separately.

Flags (each also read from an environment variable, for a pod spec)::

    --traffic_store URI            CONDUCTOR_TRAFFIC_STORE          off when empty
    --traffic_private_store URI    CONDUCTOR_TRAFFIC_PRIVATE_STORE  private requests' store (self-hosted)
    --traffic_batch_size N         (100)   --traffic_flush_interval_s S (2)
    --traffic_max_queue N          (10000) --traffic_retention_days D   (30; 0 = keep)
    --traffic_max_bytes N          (0 = no cap)     --traffic_index_size N       (100000)

Routes: ``POST /v1/feedback`` (errors ``{"error": ...}``, as the v1 route's) and ``POST
/openai/v1/feedback`` (errors in OpenAI's shape). Both sit behind the request guard, so they need
the same bearer key as every other route. Without a traffic store they answer 404 saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rl_conductor.loop.feedback import Feedback, FeedbackError, parse_feedback
from rl_conductor.loop.traffic import TrafficConfig, TrafficLog

STORE_ENV = "CONDUCTOR_TRAFFIC_STORE"
PRIVATE_STORE_ENV = "CONDUCTOR_TRAFFIC_PRIVATE_STORE"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The traffic-log flags (see module docstring)."""
    g = parser.add_argument_group("traffic log and feedback (docs/closed-loop.md)")
    g.add_argument(
        "--traffic_store",
        default=os.environ.get(STORE_ENV, ""),
        help=f"folder or s3:// URI where answered requests are recorded (env {STORE_ENV}; default off)",
    )
    g.add_argument(
        "--traffic_private_store",
        default=os.environ.get(PRIVATE_STORE_ENV, ""),
        help="a self-hosted folder or s3:// URI for private requests (default: private requests are not "
        f"recorded; env {PRIVATE_STORE_ENV})",
    )
    g.add_argument("--traffic_batch_size", type=int, default=100, help="records per batch file")
    g.add_argument(
        "--traffic_flush_interval_s",
        type=float,
        default=2.0,
        help="longest a record waits before it is written",
    )
    g.add_argument(
        "--traffic_max_queue",
        type=int,
        default=10_000,
        help="records waiting to be written before new ones drop",
    )
    g.add_argument(
        "--traffic_retention_days",
        type=float,
        default=30.0,
        help="delete batch files older than this (0: keep)",
    )
    g.add_argument(
        "--traffic_max_bytes",
        type=int,
        default=0,
        help="most bytes per store; oldest files go first (0: no cap)",
    )
    g.add_argument(
        "--traffic_index_size",
        type=int,
        default=TrafficConfig.index_size,
        help="request ids kept in memory for feedback look-ups",
    )


def config_from_args(args: argparse.Namespace) -> TrafficConfig | None:
    """The traffic log's settings (None when no store is named); raises ``InvalidValue``."""
    from rl_conductor import validation

    if not args.traffic_store:
        if args.traffic_private_store:
            raise validation.InvalidValue(
                "--traffic_private_store", args.traffic_private_store, "set together with --traffic_store"
            )
        return None
    return TrafficConfig(
        store=args.traffic_store,
        private_store=args.traffic_private_store or None,
        batch_size=args.traffic_batch_size,
        flush_interval_s=args.traffic_flush_interval_s,
        max_queue=args.traffic_max_queue,
        retention_days=args.traffic_retention_days or None,
        max_store_bytes=args.traffic_max_bytes or None,
        index_size=args.traffic_index_size,
    )


def attach(
    app: FastAPI, model: Any, config: TrafficConfig | None, *, pool: str, model_ref: str
) -> TrafficLog | None:
    """Start the traffic log on ``model``'s service (a loaded ``ConductorModel``) and add the
    feedback routes to ``app``; returns the log (None without a store)."""
    traffic = TrafficLog(config, pool=pool, model=model_ref) if config is not None else None
    if traffic is not None:
        model.service.on_answered.append(traffic.submit)
    feedback = Feedback(traffic) if traffic is not None else None
    add_feedback_routes(app, lambda: feedback)
    return traffic


class TrafficExtension:
    """The loop's part of the predictor (a ``serving.server.ServerExtension``): the traffic-log
    flags, their check, and :func:`attach` once the model is loaded. ``conductor serve`` passes it
    to ``serving.server.main``."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)

    def check(self, args: argparse.Namespace) -> None:
        config_from_args(args)

    def attach(self, app: FastAPI, model: Any, args: argparse.Namespace) -> None:
        attach(app, model, config_from_args(args), pool=args.pool, model_ref=str(args.model or args.policy))


def add_feedback_routes(app: FastAPI, get: Callable[[], Feedback | None]) -> None:
    """``POST /v1/feedback`` and ``POST /openai/v1/feedback`` (see module docstring)."""

    async def handle(request: Request) -> tuple[int, dict[str, Any], str | None]:
        from rl_conductor.serving.schemas import WireError, loads

        feedback = get()
        if feedback is None:
            return 404, {"error": "feedback is off: this server keeps no traffic log (--traffic_store)"}, None
        try:
            body = parse_feedback(loads(await request.body()))
            return 200, await asyncio.to_thread(feedback.submit, body), None
        except WireError as exc:
            return exc.status, {"error": str(exc)}, exc.param
        except FeedbackError as exc:
            return exc.status, {"error": str(exc)}, exc.param

    async def v1(request: Request) -> JSONResponse:
        status, content, _ = await handle(request)
        return JSONResponse(status_code=status, content=content)

    async def openai(request: Request) -> JSONResponse:
        status, content, param = await handle(request)
        if status == 200:
            return JSONResponse(status_code=200, content={"object": "feedback", **content})
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return JSONResponse(
            status_code=status,
            content={"error": {"message": content["error"], "type": kind, "param": param, "code": None}},
        )

    app.add_api_route("/v1/feedback", v1, methods=["POST"], response_model=None)
    app.add_api_route("/openai/v1/feedback", openai, methods=["POST"], response_model=None)


__all__ = ["add_arguments", "add_feedback_routes", "attach", "config_from_args"]
