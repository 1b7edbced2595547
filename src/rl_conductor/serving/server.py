"""The KServe predictor: a ``kserve.Model`` over :class:`ConductorService`, plus the OpenAI route.

Why this shape: KServe's ``ModelServer`` gives the v1/v2 data plane, health and readiness
routes, ``/metrics`` and its CLI flags; the Conductor adds

* ``ConductorModel`` — ``load()`` fetches the policy (an MLflow model URI such as
  ``models:/conductor@champion``, an ``s3://`` or local folder, or a policy spec for tests and
  baselines) and the pool YAML, and is ready only when both are loaded; ``predict`` answers
  v1 ``{"instances": [...]}`` and v2 (a BYTES input ``question``, limits in ``parameters``);
* OpenAI-compatible ``GET /openai/v1/models`` and ``POST /openai/v1/chat/completions`` (KServe's
  own OpenAI classes import vLLM, so the routes are added to ``kserve.model_server.app`` before
  the server starts), with ``stream: true`` as server-sent events: one chunk per finished step
  (field ``conductor_step``), then the answer, then a final chunk with ``usage`` and the whole
  response document (``conductor``);
* a request guard (ASGI middleware) that answers 413 for bodies over the limit and 415 for a
  POST that is not JSON, and counts requests per endpoint and status class.

Every malformed request becomes a 4xx whose message names the field; only a bug is a 500.
The top-level ``serving/`` folder (Dockerfile, entry script) is a thin wrapper over :func:`main`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import kserve
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from kserve.errors import InvalidInput, ModelNotReady
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

from rl_conductor.serving import metrics as m
from rl_conductor.serving.schemas import (
    MAX_BODY_BYTES,
    MAX_INSTANCES,
    WireError,
    loads,
    parse_chat,
    parse_v1,
    parse_v2_parameters,
    to_request,
)
from rl_conductor.serving.service import ConductorService, ServiceConfig, load_policy
from rl_conductor.serving_core import ConductorRequest, RequestError

DEFAULT_MODEL_URI = "models:/conductor@champion"
DEFAULT_NAME = "conductor"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ConductorModel(kserve.Model):
    """The predictor (see module docstring)."""

    def __init__(
        self,
        name: str = DEFAULT_NAME,
        *,
        pool: str,
        model: str | None = None,
        policy: str | None = None,
        config: ServiceConfig | None = None,
    ) -> None:
        super().__init__(name)
        self.pool_ref = pool
        self.model_ref = model
        self.policy_ref = policy
        self.config = config or ServiceConfig()
        self.service: ConductorService | None = None
        self.ready = False

    def load(self) -> bool:
        from rl_conductor.workers.pool import load_pool

        pool = load_pool(self.pool_ref)
        policy = load_policy(self.model_ref, self.policy_ref, pool)
        self.service = ConductorService(policy, pool, self.config)
        self.ready = True
        return self.ready

    def validate(self, payload: Any) -> Any:
        return payload  # predict validates every envelope itself (schemas.py)

    def _service(self) -> ConductorService:
        if self.service is None:
            raise ModelNotReady(self.name)
        return self.service

    async def answer_all(self, requests: list[ConductorRequest], endpoint: str) -> list[dict[str, Any]]:
        service = self._service()
        for i, r in enumerate(requests):  # reject the whole request before any worker is called
            try:
                service.check(r)
            except RequestError as exc:
                raise InvalidInput(f"{'instances' if endpoint == 'v1' else 'question'}.{i}: {exc}") from None
        try:
            return list(await asyncio.gather(*(service.answer(r, endpoint=endpoint) for r in requests)))
        except RequestError as exc:
            raise InvalidInput(str(exc)) from None

    async def predict(  # type: ignore[override]
        self, payload: Any, headers: dict[str, str] | None = None
    ) -> dict[str, Any] | InferResponse:
        if isinstance(payload, InferRequest):
            return await self._predict_v2(payload)
        try:
            if isinstance(payload, bytes | str):  # a JSON content type KServe did not recognise
                payload = loads(payload)
            requests = parse_v1(payload)
        except WireError as exc:
            raise InvalidInput(str(exc)) from None
        return {"predictions": await self.answer_all(requests, "v1")}

    async def _predict_v2(self, payload: InferRequest) -> InferResponse:
        try:
            limits = parse_v2_parameters(payload.parameters)
            questions = _v2_questions(payload)
            requests = [
                to_request({"question": q, **limits}, f"question[{i}]: ") for i, q in enumerate(questions)
            ]
        except WireError as exc:
            raise InvalidInput(str(exc)) from None
        docs = await self.answer_all(requests, "v2")
        n = len(docs)
        outputs = [
            InferOutput("answer", [n], "BYTES", [d["answer"] for d in docs]),
            InferOutput("cost_usd", [n], "FP64", [float(d["cost_usd"]) for d in docs]),
            InferOutput("tokens", [n], "INT64", [int(d["tokens"]) for d in docs]),
            InferOutput("response", [n], "BYTES", [json.dumps(d) for d in docs]),
        ]
        return InferResponse(
            response_id=payload.id or uuid.uuid4().hex, model_name=self.name, infer_outputs=outputs
        )


def _v2_questions(payload: InferRequest) -> list[str]:
    inputs = {i.name: i for i in payload.inputs}
    extra = set(inputs) - {"question"}
    if extra:
        raise WireError(f"inputs: unknown tensors {sorted(extra)}; send one BYTES tensor named 'question'")
    if "question" not in inputs:
        raise WireError("inputs: needs a BYTES tensor named 'question'")
    tensor = inputs["question"]
    if tensor.datatype != "BYTES":
        raise WireError(f"inputs.question: datatype must be BYTES, got {tensor.datatype}")
    data = tensor.data
    if not isinstance(data, list) or not data or not all(isinstance(q, str) for q in data):
        raise WireError("inputs.question: data must be a non-empty list of strings")
    if len(data) > MAX_INSTANCES:
        raise WireError(f"inputs.question: at most {MAX_INSTANCES} questions per request, got {len(data)}")
    return list(data)


# -- OpenAI-compatible routes ------------------------------------------------------------------


def _openai_error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        kind = "not_found_error"
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "param": param, "code": None}},
    )


def _usage(doc: dict[str, Any]) -> dict[str, int]:
    return {
        "prompt_tokens": int(doc["input_tokens"]),
        "completion_tokens": int(doc["output_tokens"]),
        "total_tokens": int(doc["input_tokens"]) + int(doc["output_tokens"]),
    }


def add_openai_routes(app: FastAPI, model: ConductorModel) -> None:
    """``GET /openai/v1/models`` and ``POST /openai/v1/chat/completions`` for ``model``."""
    created = int(time.time())

    async def list_models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model.name, "object": "model", "created": created, "owned_by": "rl-conductor"}],
        }

    async def chat_completions(request: Request) -> Any:
        try:
            chat, req = parse_chat(loads(await request.body()))
        except WireError as exc:
            return _openai_error(exc.status, str(exc), exc.param)
        if chat.model != model.name:
            return _openai_error(404, f"model {chat.model!r} is not served here; use {model.name!r}", "model")
        if not model.ready or model.service is None:
            return _openai_error(503, f"model {model.name!r} is not ready")
        service = model.service
        try:
            service.check(req)
        except RequestError as exc:
            return _openai_error(400, str(exc))
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        if chat.stream:
            return StreamingResponse(
                _stream(service, req, cid, model.name),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        doc = await service.answer(req, endpoint="openai", request_id=cid)
        return {
            "id": cid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": doc["answer"]},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": _usage(doc),
            "conductor": doc,
        }

    app.add_api_route("/openai/v1/models", list_models, methods=["GET"])
    app.add_api_route("/openai/v1/chat/completions", chat_completions, methods=["POST"], response_model=None)


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


async def _stream(
    service: ConductorService, req: ConductorRequest, cid: str, name: str
) -> AsyncIterator[bytes]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        body = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return _sse({**body, **extra})

    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.ensure_future(
        service.answer(req, endpoint="openai", on_step=queue.put_nowait, request_id=cid)
    )
    try:
        yield chunk({"role": "assistant", "content": ""})
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                event = getter.result()
                yield chunk({}, conductor_step={k: v for k, v in event.items() if not k.endswith("_ns")})
                continue
            getter.cancel()
            break
        while not queue.empty():
            event = queue.get_nowait()
            yield chunk({}, conductor_step={k: v for k, v in event.items() if not k.endswith("_ns")})
        try:
            doc = task.result()
        except Exception as exc:  # a bug mid-stream: tell the client in OpenAI's error shape
            logging.getLogger("rl_conductor.serving").exception("stream %s failed", cid)
            m.ERRORS.labels("internal").inc()
            yield _sse(
                {"error": {"message": f"internal error: {exc.__class__.__name__}", "type": "server_error"}}
            )
            return
        yield chunk({"content": doc["answer"]})
        yield chunk({}, "stop", usage=_usage(doc), conductor=doc)
        yield b"data: [DONE]\n\n"
    finally:
        if not task.done():
            task.cancel()


# -- request guard ------------------------------------------------------------------------------


def _endpoint(path: str) -> str:
    for prefix, label in (("/v1/", "v1"), ("/v2/", "v2"), ("/openai/", "openai"), ("/metrics", "metrics")):
        if path.startswith(prefix):
            return label
    return "other"


def _is_json(content_type: str) -> bool:
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


class RequestGuard:
    """ASGI middleware: 413 for large bodies, 415 for non-JSON POSTs, 400 for bodies that are not
    strict JSON (no NaN/Infinity, valid UTF-8), and request metrics."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = _endpoint(scope.get("path", ""))
        status_seen: list[int] = []

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(int(message["status"]))
            await send(message)

        try:
            if scope.get("method") == "POST":
                headers = {
                    k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
                }
                binary_v2 = endpoint == "v2" and "inference-header-content-length" in headers
                if not binary_v2 and not _is_json(headers.get("content-type", "")):
                    got = headers.get("content-type") or "none"
                    await _reject(counting_send, 415, f"content-type must be application/json, got {got}")
                    return
                length = headers.get("content-length", "")
                if length.isdigit() and int(length) > self.max_body_bytes:
                    await _reject(counting_send, 413, f"body of {length} bytes exceeds {self.max_body_bytes}")
                    return
                body = bytearray()
                more = True
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body += message.get("body", b"")
                    more = bool(message.get("more_body"))
                    if len(body) > self.max_body_bytes:
                        await _reject(counting_send, 413, f"body exceeds {self.max_body_bytes} bytes")
                        return
                if not binary_v2:
                    try:  # strict JSON for every route (FastAPI's own parser accepts NaN/Infinity)
                        orjson.loads(bytes(body))
                    except orjson.JSONDecodeError as exc:
                        await _reject(counting_send, 400, f"the body is not valid JSON: {exc}")
                        return
                sent = False

                async def replay() -> Message:
                    nonlocal sent
                    if not sent:
                        sent = True
                        return {"type": "http.request", "body": bytes(body), "more_body": False}
                    return await receive()

                await self.app(scope, replay, counting_send)
            else:
                await self.app(scope, receive, counting_send)
        finally:
            status = status_seen[0] if status_seen else 0
            if endpoint != "metrics":
                m.REQUESTS.labels(endpoint, f"{status // 100}xx" if status else "none").inc()
            if 400 <= status < 500:
                m.ERRORS.labels("bad_request").inc()
            elif status >= 500:
                m.ERRORS.labels("internal").inc()


async def _reject(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def install(app: FastAPI, model: ConductorModel, *, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """Add the OpenAI routes and the request guard to KServe's app (before the server starts)."""
    add_openai_routes(app, model)
    app.add_middleware(RequestGuard, max_body_bytes=max_body_bytes)


# -- command line -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The predictor's flags on top of KServe's own (``--http_port``, ``--grpc_port``, ...)."""
    parser = argparse.ArgumentParser(
        prog="conductor serve",
        parents=[kserve.model_server.parser],
        description="Serve the Conductor with KServe (v1, v2 and OpenAI-compatible routes).",
    )
    parser.add_argument(
        "--model",
        default=None,
        help=f"MLflow model URI, s3:// URI or folder of a trained Conductor (default {DEFAULT_MODEL_URI})",
    )
    parser.add_argument(
        "--policy",
        default=None,
        help="serve a policy spec instead of a model: fixed:0,1 | single:NAME | moa ...",
    )
    parser.add_argument("--pool", required=True, help="pool name or pool YAML path")
    parser.add_argument("--step_timeout_s", type=float, default=120.0, help="per worker call timeout")
    parser.add_argument("--max_batch", type=int, default=32, help="most questions planned in one generation")
    parser.add_argument("--max_body_bytes", type=int, default=MAX_BODY_BYTES, help="largest request body")
    parser.add_argument(
        "--trace",
        default=None,
        type=lambda s: s.lower() in ("1", "true", "yes"),
        help="MLflow trace per request (default: on when MLFLOW_TRACKING_URI is set)",
    )
    parser.add_argument("--experiment", default="conductor-serving", help="MLflow experiment of the traces")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse flags, load the model and the pool, and run KServe's ModelServer until stopped."""
    import os

    from rl_conductor.validation import InvalidValue, integer_at_least, port, positive_finite

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        port("--http_port", args.http_port)
        port("--grpc_port", args.grpc_port)
        integer_at_least("--max_batch", args.max_batch, 1)
        integer_at_least("--max_body_bytes", args.max_body_bytes, 1)
        positive_finite("--step_timeout_s", args.step_timeout_s)
    except InvalidValue as exc:
        parser.error(str(exc))
    if args.model is None and args.policy is None:
        args.model = DEFAULT_MODEL_URI
    trace = args.trace if args.trace is not None else bool(os.environ.get("MLFLOW_TRACKING_URI"))
    name = DEFAULT_NAME if args.model_name == "model" else args.model_name
    logger = logging.getLogger("rl_conductor")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    config = ServiceConfig(
        step_timeout_s=args.step_timeout_s,
        max_batch=args.max_batch,
        trace=trace,
        experiment=args.experiment,
    )
    model = ConductorModel(name, pool=args.pool, model=args.model, policy=args.policy, config=config)
    try:
        model.load()
    except (OSError, ValueError, KeyError) as exc:
        source = args.model or args.policy
        print(f"error: cannot load {source!r} with pool {args.pool!r}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    install(kserve.model_server.app, model, max_body_bytes=args.max_body_bytes)
    kserve.ModelServer(
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        enable_grpc=args.enable_grpc,
        workers=1,
        enable_latency_logging=False,
    ).start([model])


if __name__ == "__main__":
    main()
