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
  (field ``conductor_step``), the answering step's text as its worker streams it (the answer in
  one chunk where the worker does not stream), then a final chunk with ``usage`` and the whole
  response document (``conductor``). A failure after the status line is an ``error`` event (code
  ``workers_failed``, ``budget_exhausted`` when the request's budget bought no answer, as the
  unstreamed route's 422, or ``stream_interrupted`` when the answer broke off after part of it
  was sent), never a truncated answer that ends like a good one;
* the request guard (:mod:`.guard`: API keys, request ids, the size/time limits of a request,
  no model-repository routes, liveness that fails once the model is gone).

Every malformed request becomes a 4xx whose message names the field (one WARNING log line, no
traceback); a request no worker could answer is a 502 (504 when the deadline left no step) whose
body says why; only a bug is a 500. A start-up problem (no API keys, a port taken, a bad host) is
one line ``Error: ...`` and exit status 2. The top-level ``serving/`` folder (Dockerfile, entry
script) is a thin wrapper over :func:`main`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, NoReturn, Protocol

import anyio
import kserve
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from grpc_interceptor.exceptions import DeadlineExceeded, PermissionDenied, ResourceExhausted, Unavailable
from kserve.errors import InvalidInput, ModelNotReady
from kserve.protocol.grpc.server import GRPCServer
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
from kserve.protocol.model_repository_extension import ModelRepositoryExtension

from rl_conductor.limits import MAX_ROUNDS, MAX_SECONDS
from rl_conductor.lm.generate import trained_threads
from rl_conductor.serving import metrics as m
from rl_conductor.serving.auth import ApiKeys, AuthConfigError, load_keys
from rl_conductor.serving.guard import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    RedactQueryKeys,
    RequestGuard,
    header_timeout_protocol,
)
from rl_conductor.serving.request import ConductorRequest, RequestError
from rl_conductor.serving.schemas import (
    MAX_BODY_BYTES,
    MAX_INSTANCES,
    WireError,
    check_batch_budget,
    check_v2_body,
    loads,
    parse_chat,
    parse_v1,
    parse_v2_parameters,
    to_request,
)
from rl_conductor.serving.service import ConductorService, ServiceConfig, load_policy, loggable_error
from rl_conductor.workers.base import TokenSink

DEFAULT_MODEL_URI = "models:/conductor@champion"
DEFAULT_NAME = "conductor"
#: Where the HTTP server listens unless --host says otherwise: loopback, so a local server is
#: not reachable from the network by accident (the manifests pass --host=0.0.0.0 in the pod).
DEFAULT_HOST = "127.0.0.1"
#: Most connections (and requests in progress) the HTTP server holds; past it a new request gets
#: 503 and its connection closes (uvicorn's ``limit_concurrency``).
MAX_CONNECTIONS = 512
#: Connections the kernel queues before the server accepts them (uvicorn's ``backlog``).
BACKLOG = 512

log = logging.getLogger("rl_conductor.serving")


class BadRequest(InvalidInput):
    """A 400 whose handler logs one WARNING line (KServe's own logs a traceback at ERROR)."""


class WorkersFailed(Exception):
    """No worker could answer any question of a request: 502, 504 for a deadline, or 422 when the
    request's own budget bought no answer. (In a batch
    where some questions were answered, the request is a 200 and each unanswered question's
    document carries its ``error``.)"""

    def __init__(self, docs: list[dict[str, Any]], endpoint: str, requests: list[ConductorRequest]) -> None:
        failed = [(i, d) for i, d in enumerate(docs) if d.get("error")]
        if all(d.get("budget_stop") for _, d in failed):
            self.status = 422  # the request's own budget bought no answer: the client can raise it
        elif all(d.get("deadline_cut") for _, d in failed):
            self.status = 504
        else:
            self.status = 502
        where = "" if len(docs) == 1 else f"question {failed[0][0]}: "
        super().__init__(f"{where}{failed[0][1]['error']}")
        i, doc = failed[0]
        #: what the log line may say: a private request's worker error text may echo its question
        self.loggable = f"{where}{loggable_error(doc, requests[i].sensitivity)}"
        self.docs = docs
        self.endpoint = endpoint


class _ClientErrorTracebacks(logging.Filter):
    """Drops KServe's ERROR-with-traceback records for client errors (unknown model, invalid
    input, ...): the guard logs each 4xx once, as one WARNING line."""

    CLIENT_ERRORS = ("InvalidInput", "ModelNotFound", "ModelNotReady", "UnsupportedProtocol")

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and type(exc).__name__ in self.CLIENT_ERRORS)


async def _bad_request_handler(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=400, content={"error": str(exc)})


#: Segments of FastAPI's error locations that name no field of the client's body.
_NOT_FIELDS = {"body", "InferenceRequest", "RequestInput", "RequestOutput"}
#: The branch names pydantic appends to the location of a union's error.
_UNION_BRANCHES = {"float", "int", "bool", "str", "bytes"}


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    """A body that KServe's own request model refuses: 400 naming each field (FastAPI's default
    is a 422 listing every branch of its unions). The guard's checks (:func:`.schemas.check_v2_body`)
    catch the known cases first; this is the backstop for the rest."""
    assert isinstance(exc, RequestValidationError)
    errors = [e for e in exc.errors() if tuple(e.get("loc", ())) != ("body", "bytes")] or exc.errors()
    seen: dict[str, str] = {}
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p not in _NOT_FIELDS]
        if len(loc) > 1 and loc[-1] in _UNION_BRANCHES:  # one line per field, not per union branch
            loc.pop()
        seen.setdefault(".".join(loc) or "body", str(e.get("msg", "invalid")))
    return JSONResponse(status_code=400, content={"error": "; ".join(f"{k}: {v}" for k, v in seen.items())})


async def _workers_failed_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, WorkersFailed)
    log.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc.loggable)
    content: dict[str, Any] = {"error": str(exc)}
    if exc.endpoint == "v1":
        content["predictions"] = exc.docs
    else:
        content["responses"] = exc.docs
    return JSONResponse(status_code=exc.status, content=content)


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
        check_pool: bool = False,
    ) -> None:
        super().__init__(name)
        self.check_pool = check_pool
        self.pool_ref = pool
        self.model_ref = model
        self.policy_ref = policy
        self.config = config or ServiceConfig()
        self.service: ConductorService | None = None
        self.ready = False

    def load(self) -> bool:
        from rl_conductor.workers.pool import load_pool

        pool = load_pool(self.pool_ref)
        if self.check_pool:  # ready only once every worker has answered one call
            from concurrent.futures import ThreadPoolExecutor

            from rl_conductor.workers.check import ensure_pool_ready

            # in a thread of its own: its event loop must not replace the one KServe starts with
            with ThreadPoolExecutor(1) as ex:
                ex.submit(ensure_pool_ready, pool).result()
        policy = load_policy(self.model_ref, self.policy_ref, pool)
        threads = trained_threads(getattr(policy, "meta", None) or {})
        if threads:  # this process serves one Conductor: torch on the threads it trained with
            import torch

            torch.set_num_threads(threads)
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
                raise BadRequest(f"{'instances' if endpoint == 'v1' else 'question'}.{i}: {exc}") from None
        try:
            docs = list(await asyncio.gather(*(service.answer(r, endpoint=endpoint) for r in requests)))
        except RequestError as exc:
            raise BadRequest(str(exc)) from None
        if all(d.get("error") for d in docs):
            raise WorkersFailed(docs, endpoint, requests)
        return docs

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
            raise BadRequest(str(exc)) from None
        return {"predictions": await self.answer_all(requests, "v1")}

    async def _predict_v2(self, payload: InferRequest) -> InferResponse:
        try:
            if payload.from_grpc:  # the HTTP route's body is checked by the guard; gRPC's here
                check_v2_body(_v2_body_of(payload))
            params = _grpc_parameters(payload.parameters) if payload.from_grpc else payload.parameters
            limits = parse_v2_parameters(params)
            questions = _v2_questions(payload)
            requests = [
                to_request({"question": q, **limits}, f"question[{i}]: ") for i, q in enumerate(questions)
            ]
            check_batch_budget(requests, "parameters.max_cost_usd (applies to each question)")
        except WireError as exc:
            raise BadRequest(str(exc)) from None
        try:
            docs = await self.answer_all(requests, "v2")
        except WorkersFailed as exc:
            if not payload.from_grpc:
                raise
            # the HTTP statuses as gRPC codes (KServe's interceptor makes any other error INTERNAL)
            log.warning("gRPC ModelInfer -> %d: %s", exc.status, exc.loggable)
            kind = {422: ResourceExhausted, 504: DeadlineExceeded}.get(exc.status, Unavailable)
            raise kind(str(exc)) from None
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


def _grpc_parameters(params: Any) -> dict[str, Any] | None:
    """A gRPC request's ``parameters`` (a protobuf map of ``InferParameter``) as the JSON object
    the HTTP v2 route gets. Open Inference Protocol parameters are bool, int64 or string only (no
    double), so a string that reads as a JSON number (``"0.05"``) is that number; KServe's own
    ``to_http_parameters`` is not used because it drops any field it does not know silently."""
    if not params:
        return None
    out: dict[str, Any] = {}
    for key, value in params.items():
        kind = value.WhichOneof("parameter_choice") if hasattr(value, "WhichOneof") else None
        if kind is None:
            raise WireError(f"parameters.{key}: has no value")
        got = getattr(value, kind)
        if kind == "string_param":
            try:
                number = json.loads(got)
            except ValueError:
                number = None
            if isinstance(number, int | float) and not isinstance(number, bool):
                got = number
        out[key] = got
    return out


def _v2_body_of(payload: InferRequest) -> dict[str, Any]:
    """The v2 JSON body a gRPC ``ModelInfer`` request stands for, so that it passes the checks of
    the HTTP route's body (:func:`.schemas.check_v2_body`: no tensor-level parameters, each input
    name once, a shape that matches the data)."""
    inputs = []
    for tensor in payload.inputs:
        data = tensor.data if isinstance(tensor.data, list) else None
        doc: dict[str, Any] = {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype}
        if data is not None:
            doc["data"] = data
        if tensor.parameters:
            doc["parameters"] = dict(tensor.parameters)
        inputs.append(doc)
    body: dict[str, Any] = {"inputs": inputs}
    if payload.request_outputs:
        body["outputs"] = [
            {"name": o.name, **({"parameters": dict(o.parameters)} if o.parameters else {})}
            for o in payload.request_outputs
        ]
    return body


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
    if payload.from_grpc and isinstance(data, list):  # gRPC BYTES contents arrive as bytes
        try:
            data = [q.decode("utf-8") if isinstance(q, bytes) else q for q in data]
        except UnicodeDecodeError:
            raise WireError("inputs.question: data must be UTF-8 text") from None
    if not isinstance(data, list) or not data or not all(isinstance(q, str) for q in data):
        raise WireError("inputs.question: data must be a non-empty list of strings")
    if len(data) > MAX_INSTANCES:
        raise WireError(f"inputs.question: at most {MAX_INSTANCES} questions per request, got {len(data)}")
    return list(data)


# -- OpenAI-compatible routes ------------------------------------------------------------------


def _openai_error(
    status: int, message: str, param: str | None = None, *, code: str | None = None
) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        kind = "not_found_error"
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "param": param, "code": code}},
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
        final = chat.final_step()
        if chat.stream:
            return StreamingResponse(
                _stream(service, req, cid, model.name, final),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        doc = await service.answer(req, endpoint="openai", request_id=cid, final_step=final)
        if doc.get("error"):
            status = 422 if doc.get("budget_stop") else 504 if doc.get("deadline_cut") else 502
            log.warning(
                "POST /openai/v1/chat/completions -> %d: %s", status, loggable_error(doc, req.sensitivity)
            )
            code = "budget_exhausted" if status == 422 else "workers_failed"
            resp = _openai_error(status, doc["error"], code=code)
            body = json.loads(bytes(resp.body))
            return JSONResponse(status_code=status, content={**body, "conductor": doc})
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
    service: ConductorService, req: ConductorRequest, cid: str, name: str, final: dict[str, Any]
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

    def step(event: dict[str, Any]) -> bytes:
        return chunk({}, conductor_step={k: v for k, v in event.items() if not k.endswith("_ns")})

    def failed(message: str, code: str, **extra: Any) -> bytes:
        # the request's own budget bought no answer: the client's error, as the unstreamed 422's
        kind = "invalid_request_error" if code == "budget_exhausted" else "server_error"
        m.ERRORS.labels("bad_request" if code == "budget_exhausted" else "unavailable").inc()
        return _sse({"error": {"message": message, "type": kind, "code": code}, **extra})

    # steps, the answering step's text deltas and a broken stream, in the order they happened
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    sink = TokenSink(
        on_delta=lambda text: queue.put_nowait(("delta", text)),
        on_broken=lambda why: queue.put_nowait(("broken", why)),
    )
    task = asyncio.ensure_future(
        service.answer(
            req,
            endpoint="openai",
            on_step=lambda event: queue.put_nowait(("step", event)),
            request_id=cid,
            final_step=final,
            stream=sink,
        )
    )
    getter: asyncio.Future[tuple[str, Any]] | None = None
    streamed: list[str] = []

    def emit(kind: str, value: Any) -> bytes:
        if kind == "step":
            return step(value)
        if kind == "delta":
            streamed.append(value)
            return chunk({"content": value})
        # part of the answer is sent and cannot be taken back: the stream ends with an error
        # a worker's message may echo the question: a private request's line keeps none of it
        why = value if req.sensitivity == "public" else "(the worker's message is withheld: private request)"
        log.warning("POST /openai/v1/chat/completions (stream) broke: %s", why)
        return failed(f"the answer broke off mid-stream: {value}", "stream_interrupted")

    try:
        yield chunk({"role": "assistant", "content": ""})
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                kind, value = getter.result()
                yield emit(kind, value)
                if kind == "broken":
                    return  # the finally stops the request: nothing more can reach this client
                continue
            getter.cancel()
            break
        while not queue.empty():
            kind, value = queue.get_nowait()
            yield emit(kind, value)
            if kind == "broken":
                return
        try:
            doc = task.result()
        except Exception as exc:  # a bug mid-stream: tell the client in OpenAI's error shape
            log.exception("stream %s failed", cid)
            m.ERRORS.labels("internal").inc()
            yield _sse(
                {"error": {"message": f"internal error: {exc.__class__.__name__}", "type": "server_error"}}
            )
            return
        if doc.get("error"):  # the status line is sent: the failure is an error event
            log.warning(
                "POST /openai/v1/chat/completions (stream) failed: %s", loggable_error(doc, req.sensitivity)
            )
            code = "budget_exhausted" if doc.get("budget_stop") else "workers_failed"
            yield failed(doc["error"], code, conductor=doc)
            return
        if not streamed:  # the answering worker does not stream (replay, simulated, cached)
            yield chunk({"content": doc["answer"]})
        elif "".join(streamed) != doc["answer"]:
            # the streamed text was dropped after it was sent (it came after the deadline)
            log.warning("POST /openai/v1/chat/completions (stream): the streamed text is not the answer")
            yield failed(
                "the streamed text is not this request's answer: " + (doc.get("message") or "see conductor"),
                "stream_interrupted",
                conductor=doc,
            )
            return
        yield chunk({}, "stop", usage=_usage(doc), conductor=doc)
        yield b"data: [DONE]\n\n"
    finally:
        # the client may have left: stop the request and wait for it (its log line and cost),
        # shielded from the cancellation that closes this generator
        if getter is not None and not getter.done():
            getter.cancel()
        if not task.done():
            sink.abandon()  # when the stream did not break first, the client left
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({task}, timeout=30)
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at GC


# -- start-up ---------------------------------------------------------------------------------


def install(
    app: FastAPI,
    model: ConductorModel,
    *,
    keys: ApiKeys | None,
    max_body_bytes: int = MAX_BODY_BYTES,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> None:
    """Add the OpenAI routes, the error handlers and the request guard to KServe's app (before
    the server starts; KServe adds its own handlers then, which the subclasses here outrank)."""
    add_openai_routes(app, model)
    kserve_log = logging.getLogger("kserve")
    if not any(isinstance(f, _ClientErrorTracebacks) for f in kserve_log.filters):
        kserve_log.addFilter(_ClientErrorTracebacks())
    # a key sent in a URL (?api_key=..., ;token=..., or any name) is not written out by the loggers
    # that write URLs: uvicorn's access log, KServe's trace log and the guard's 4xx lines
    for name in ("uvicorn.access", "kserve.trace", "rl_conductor.serving"):
        url_log = logging.getLogger(name)
        for old in [f for f in url_log.filters if isinstance(f, RedactQueryKeys)]:
            url_log.removeFilter(old)
        url_log.addFilter(RedactQueryKeys(keys))
    app.add_exception_handler(BadRequest, _bad_request_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(WorkersFailed, _workers_failed_handler)
    app.add_middleware(
        RequestGuard,
        keys=keys,
        is_live=lambda: bool(model.ready and model.service is not None),
        max_body_bytes=max_body_bytes,
        body_timeout_s=body_timeout_s,
    )


# -- command line -------------------------------------------------------------------------------


class ServerExtension(Protocol):
    """What a layer above serving adds to the predictor (the retraining loop's traffic log and
    feedback routes, :class:`rl_conductor.loop.serving.TrafficExtension`): its flags, their check
    before anything starts, and its routes and hooks once the model is loaded. The front door
    (``conductor serve``) passes it to :func:`main`, so the server never imports the layers above."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def check(self, args: argparse.Namespace) -> None:
        """Raise ``InvalidValue`` for a flag value no server could start with."""
        ...

    def attach(self, app: FastAPI, model: ConductorModel, args: argparse.Namespace) -> None: ...


def build_parser(extensions: Sequence[ServerExtension] = ()) -> argparse.ArgumentParser:
    """The predictor's flags on top of KServe's own (``--http_port``, ``--grpc_port``, ...) and
    those of ``extensions``."""
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
    # the pyfunc's defaults too (ServiceConfig): one model answers alike however it is loaded
    parser.add_argument(
        "--step_timeout_s", type=float, default=ServiceConfig.step_timeout_s, help="per worker call timeout"
    )
    parser.add_argument(
        "--max_batch",
        type=int,
        default=ServiceConfig.max_batch,
        help="most questions planned in one generation",
    )
    parser.add_argument(
        "--max_rounds",
        type=int,
        default=None,
        help="rounds of a request that states none (default: the model's conductor.json, else 1)",
    )
    parser.add_argument("--max_body_bytes", type=int, default=MAX_BODY_BYTES, help="largest request body")
    parser.add_argument(
        "--body_timeout_s",
        type=float,
        default=BODY_TIMEOUT_S,
        help="seconds a client may take to send a request body (then 408 and the connection closes)",
    )
    parser.add_argument(
        "--header_timeout_s",
        type=float,
        default=HEADER_TIMEOUT_S,
        help="seconds a client may take to send a request's headers (then the connection closes)",
    )
    parser.add_argument(
        "--max_connections",
        type=int,
        default=MAX_CONNECTIONS,
        help=f"most open connections and requests in progress (default {MAX_CONNECTIONS}); past it a "
        "request gets 503 and its connection closes",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=BACKLOG,
        help=f"connections the kernel queues before they are accepted (default {BACKLOG})",
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address the HTTP server binds (default {DEFAULT_HOST}; 0.0.0.0 in a pod)",
    )
    parser.add_argument(
        "--auth",
        choices=["keys", "none"],
        default="keys",
        help="keys (default): every route but the probes and /metrics needs Authorization: Bearer KEY, "
        "with keys from --api-key-file and/or CONDUCTOR_API_KEYS; none: no authentication (explicit)",
    )
    parser.add_argument(
        "--api-key-file",
        "--api_key_file",
        dest="api_key_file",
        default=None,
        help="file with one API key per line (a mounted Kubernetes Secret)",
    )
    parser.add_argument(
        "--check_pool",
        default=False,
        type=lambda s: s.lower() in ("1", "true", "yes"),
        help="call every worker once at start and refuse to start unless all answer (default false)",
    )
    parser.add_argument(
        "--trace",
        default=None,
        type=lambda s: s.lower() in ("1", "true", "yes"),
        help="MLflow trace per request (default: on when MLFLOW_TRACKING_URI is set)",
    )
    parser.add_argument("--experiment", default="conductor-serving", help="MLflow experiment of the traces")
    for extension in extensions:
        extension.add_arguments(parser)
    # gRPC is off unless asked for (KServe's default is on, on the port self-hosted workers use)
    parser.set_defaults(enable_grpc=False)
    return parser


def _fail(message: str) -> NoReturn:
    print(f"Error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _check_bind(host: str, port: int, what: str) -> None:
    """Bind ``host:port`` once (as uvicorn will) so a taken port or a bad host is one line, exit 2."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        _fail(f"{what}: cannot resolve host {host!r}: {exc}")
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        _fail(f"{what}: cannot listen on {host}:{port}: {exc.strerror or exc}")
    finally:
        sock.close()


def _keys(args: argparse.Namespace) -> ApiKeys | None:
    try:
        keys = load_keys(args.api_key_file)
    except AuthConfigError as exc:
        _fail(str(exc))
    if args.auth == "none":
        if keys is not None:
            _fail("--auth none with API keys given: drop the keys or the flag")
        return None
    if keys is None:
        _fail(
            "no API keys: pass --api-key-file FILE or set CONDUCTOR_API_KEYS (one key or several, "
            "comma-separated), or serve without authentication with --auth none"
        )
    return keys


def _serve(server: kserve.ModelServer, model: ConductorModel, args: argparse.Namespace) -> None:
    """KServe's ``ModelServer.start`` for one uvicorn worker, with the HTTP server's host, its
    header and body deadlines and its connection cap set (KServe binds 0.0.0.0 and has none of
    these flags), and gRPC on ``--host`` too, without the model repository RPCs."""
    from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
    from kserve.protocol.rest.server import RESTServer

    server._register_and_check_atleast_one_model_is_ready([model])
    rest = RESTServer(
        FASTAPI_APP_IMPORT_STRING,
        server.dataplane,
        server.model_repository_extension,
        server.http_port,
        workers=1,
        grace_period=server.grace_period,
        event_loop=server.event_loop,
        timeout_keep_alive=server.timeout_keep_alive,
    )
    rest.config.host = args.host
    rest.config.http = header_timeout_protocol(args.header_timeout_s, args.body_timeout_s)
    rest.config.limit_concurrency = args.max_connections
    rest.config.backlog = args.backlog
    server._rest_server = rest
    server.servers.append(rest.start())
    if server.enable_grpc:
        grpc = HostGRPCServer(
            args.host,
            server.grpc_port,
            server.dataplane,
            NoRepository(server.registered_models),
            kwargs=vars(kserve.model_server.args),
            grace_period=server.grace_period,
        )
        server._grpc_server = grpc
        server.servers.append(grpc.start(server.max_threads))
    server.setup_event_loop()
    server.register_signal_handler()
    asyncio.run(server._serve())


def grpc_address(host: str, port: int) -> str:
    """``host:port`` as gRPC reads it (an IPv6 literal in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HostGRPCServer(GRPCServer):
    """KServe's gRPC server listening on ``host`` only: KServe's own ``start`` listens on every
    interface (``[::]``) whatever ``--host`` says, and gRPC checks no API key. The rest of
    ``start`` is KServe's (its servicer, interceptors and message size options), with
    ``SO_REUSEPORT`` off so that a second server cannot share the port unnoticed."""

    def __init__(self, host: str, port: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(port, *args, **kwargs)
        self.address = grpc_address(host, port)

    async def start(self, max_workers: int) -> None:
        from concurrent import futures

        from grpc import aio
        from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
        from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor, LoggingInterceptor
        from kserve.protocol.grpc.servicer import InferenceServicer

        self._server = aio.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            interceptors=(LoggingInterceptor(), ExceptionToStatusInterceptor()),
            options=[
                ("grpc.max_send_message_length", self._kwargs.get("grpc_max_send_message_length")),
                ("grpc.max_receive_message_length", self._kwargs.get("grpc_max_receive_message_length")),
                ("grpc.so_reuseport", 0),
            ],
        )
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(self._data_plane, self._model_repository_extension), self._server
        )
        self._server.add_insecure_port(self.address)
        log.info("gRPC server listening on %s", self.address)
        await self._server.start()
        await self._server.wait_for_termination()


class NoRepository(ModelRepositoryExtension):
    """KServe's model repository extension with load and unload refused (gRPC's repository RPCs;
    the HTTP routes are refused by the guard before they reach it): PERMISSION_DENIED with a
    message, and the model stays loaded."""

    def __init__(self, registry: Any) -> None:
        super().__init__(model_registry=registry)

    async def load(self, model_name: str) -> None:  # type: ignore[override]
        raise PermissionDenied(f"{model_name}: loading models through the repository API is disabled")

    async def unload(self, model_name: str) -> None:  # type: ignore[override]
        raise PermissionDenied(f"{model_name}: unloading models through the repository API is disabled")


def main(argv: list[str] | None = None, extensions: Sequence[ServerExtension] = ()) -> None:
    """Parse flags, load the model and the pool, add ``extensions`` (see :class:`ServerExtension`)
    and run KServe's ModelServer until stopped."""
    import os

    from rl_conductor.validation import InvalidValue, integer_at_least, port, positive_finite

    parser = build_parser(extensions)
    args = parser.parse_args(argv)
    try:
        port("--http_port", args.http_port)
        port("--grpc_port", args.grpc_port)
        integer_at_least("--max_batch", args.max_batch, 1)
        if args.max_rounds is not None:
            integer_at_least("--max_rounds", args.max_rounds, 1, MAX_ROUNDS)
        integer_at_least("--max_body_bytes", args.max_body_bytes, 1)
        integer_at_least("--max_connections", args.max_connections, 1)
        integer_at_least("--backlog", args.backlog, 1)
        positive_finite("--step_timeout_s", args.step_timeout_s, MAX_SECONDS)
        positive_finite("--body_timeout_s", args.body_timeout_s)
        positive_finite("--header_timeout_s", args.header_timeout_s)
        for extension in extensions:
            extension.check(args)
    except InvalidValue as exc:
        _fail(str(exc))
    keys = _keys(args)
    if args.enable_grpc and keys is not None:
        _fail("--enable_grpc true: the gRPC server does not check API keys; use it only with --auth none")
    _check_bind(args.host, args.http_port, "--http_port")
    if args.enable_grpc:
        _check_bind(args.host, args.grpc_port, "--grpc_port")
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
        max_rounds=args.max_rounds,
        max_batch=args.max_batch,
        trace=trace,
        experiment=args.experiment,
    )
    model = ConductorModel(
        name, pool=args.pool, model=args.model, policy=args.policy, config=config, check_pool=args.check_pool
    )
    from rl_conductor.errors import UserError

    try:
        model.load()
    except (OSError, ValueError, KeyError, UserError) as exc:
        source = args.model or args.policy
        _fail(f"cannot load {source!r} with pool {args.pool!r}: {exc}")
    install(
        kserve.model_server.app,
        model,
        keys=keys,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout_s,
    )
    for extension in extensions:
        extension.attach(kserve.model_server.app, model, args)
    server = kserve.ModelServer(
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        enable_grpc=args.enable_grpc,
        workers=1,
        enable_latency_logging=False,
    )
    _serve(server, model, args)


if __name__ == "__main__":
    main()
