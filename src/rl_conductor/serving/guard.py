"""The predictor's front door: one ASGI middleware in front of KServe's app, and the HTTP protocol
class that cuts half-sent headers.

Why a middleware and not per-route code: KServe owns most routes (v1, v2, health, the model
repository), and a request must be checked before any of them runs. :class:`RequestGuard`, in
order:

1. gives every request an id — the client's ``X-Request-ID`` when it is a sane token, else a new
   one — returned in the response's ``X-Request-ID`` header and written in the request's log line;
2. refuses KServe's model-repository routes (``/v2/repository/...``: load/unload would take the
   Conductor offline) with 404;
3. answers liveness (``/``, ``/v2/health/live``) with 503 once the model is gone, so Kubernetes
   restarts the pod instead of keeping a live pod that answers nothing;
4. checks the API key (:mod:`.auth`) on every route except the probes and ``/metrics``;
5. for a POST: 415 unless JSON (or a v2 binary-extension body, which it turns into the
   equivalent JSON request, :func:`.schemas.v2_binary_to_json`), 413 over the size cap, 408 when
   the body does not arrive within the body timeout, 400 for JSON that is not strict (NaN, an
   object with a key twice) or a v2 body with unknown fields, duplicate input names or a shape
   that does not match its data;
6. counts each request (not the probes) per endpoint and status class, and logs each 4xx it or
   a handler answers as one WARNING line (no traceback);
7. closes the connection after any response sent before the request's body was read to its end
   (a 415, a 404 ...): the rest of the body is never read, so a client trickling it cannot
   keep the connection open; and after every 401, body or not, so that a client guessing keys
   gets one guess per connection.

:class:`HeaderTimeoutProtocol` is uvicorn's httptools protocol with a timer from the first byte of
a request until its headers are complete: a client that stops half-way through its headers is
disconnected (uvicorn has a keep-alive timeout between requests, none within one), and one whose
headers pass :data:`MAX_HEADER_BYTES` gets 431. A second timer runs from the end of the headers
to the end of the body, whoever reads it (the guard, a handler, nobody): a body not complete
within the body timeout plus :data:`BODY_GRACE_S` closes the connection, so no route and no early
answer lets a slow body hold it. The number of connections is capped by uvicorn's
``limit_concurrency`` (:mod:`.server`, ``--max_connections``); the probes are not: a probe is
answered at once, and clients holding the cap must not fail liveness and restart the pod.

:class:`RedactQueryKeys` is a logging filter for the log lines that carry a URL (uvicorn's access
log, KServe's ``kserve.trace``, the guard's own): a credential sent in a URL (``?api_key=...``,
``;token=...``; the server reads keys only from the ``Authorization`` header) is written as
``REDACTED``, and so is a configured API key wherever it appears.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rl_conductor.serving import metrics as m
from rl_conductor.serving.auth import ApiKeys
from rl_conductor.serving.schemas import MAX_BODY_BYTES, WireError, check_v2_body, loads, v2_binary_to_json

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("rl_conductor.serving")

#: Seconds a client may take to send a request's body.
BODY_TIMEOUT_S = 30.0
#: Seconds a client may take from a request's first byte to the end of its headers.
HEADER_TIMEOUT_S = 10.0
#: Most bytes of request line and headers a request may send (then 431 and the connection closes).
MAX_HEADER_BYTES = 64 * 1024
#: Seconds past the body timeout after which the protocol closes a connection whose body is still
#: incomplete (the guard answers 408 at the body timeout itself; this is the backstop).
BODY_GRACE_S = 1.0

_LIVE = {"/", "/v2/health/live"}
_READY = re.compile(r"^/v2/health/ready$|^/v2/models/[^/]+(/versions/[^/]+)?/ready$")
_V2_INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
#: The HTTP request's id (``X-Request-ID``), for the request's log line (:mod:`.service`).
HTTP_REQUEST_ID: ContextVar[str | None] = ContextVar("conductor_http_request_id", default=None)


def endpoint_of(path: str) -> str:
    """The ``endpoint`` label of a path."""
    for prefix, label in (("/v1/", "v1"), ("/v2/", "v2"), ("/openai/", "openai"), ("/metrics", "metrics")):
        if path.startswith(prefix):
            return label
    return "other"


def is_probe(path: str) -> bool:
    """Liveness and readiness routes (never counted as requests, never behind a key)."""
    return path in _LIVE or bool(_READY.match(path))


def _is_json(content_type: str) -> bool:
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


class _Reject(Exception):
    def __init__(self, status: int, message: str, *, close: bool = False, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.close = close
        self.code = code


class _Gone(Exception):
    """The client disconnected before its body arrived."""


class RequestGuard:
    """ASGI middleware (see module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: ApiKeys | None,
        is_live: Callable[[], bool],
        max_body_bytes: int = MAX_BODY_BYTES,
        body_timeout_s: float = BODY_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.keys = keys
        self.is_live = is_live
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = endpoint_of(path)
        raw_headers: list[tuple[bytes, bytes]] = list(scope.get("headers", []))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw_headers}
        given = headers.get("x-request-id", "")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        token = HTTP_REQUEST_ID.set(rid)
        status_seen: list[int] = []
        length = headers.get("content-length", "0").strip()
        body_left = [length != "0" or "transfer-encoding" in headers]  # a body not yet read to its end

        async def tracked_receive() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body"):
                body_left[0] = False
            return message

        async def tagged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(int(message["status"]))
                message = dict(message)
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message["headers"] = [*kept, (b"x-request-id", rid.encode())]
                if body_left[0] and not any(k.lower() == b"connection" for k, _ in kept):
                    # answered before the body was read: the rest is never read, the connection ends
                    message["headers"].append((b"connection", b"close"))
            await send(message)

        t0 = time.perf_counter()
        try:
            try:
                if path.startswith(("/v2/repository", "/v1/repository")):
                    raise _Reject(404, "the model repository routes are disabled on this server")
                if path in _LIVE and not self.is_live():
                    raise _Reject(503, "the model is not loaded; this server cannot answer")
                needs_key = self.keys is not None and not is_probe(path) and path != "/metrics"
                if needs_key and not self.keys.accepts(headers.get("authorization")):  # type: ignore[union-attr]
                    raise _Reject(401, "missing or invalid API key (send Authorization: Bearer KEY)")
                if scope.get("method") == "POST":
                    scope, replay = await self._read_body(scope, tracked_receive, headers, endpoint, path)
                    await self.app(scope, replay, tagged_send)
                else:
                    await self.app(scope, tracked_receive, tagged_send)
            except _Reject as exc:
                await _reject(tagged_send, exc, openai=endpoint == "openai")
            except _Gone:
                pass
        finally:
            HTTP_REQUEST_ID.reset(token)
            status = status_seen[0] if status_seen else 0
            if not is_probe(path) and endpoint != "metrics":
                m.REQUESTS.labels(endpoint, f"{status // 100}xx" if status else "none").inc()
                if 400 <= status < 500:
                    m.ERRORS.labels("bad_request").inc()
                    log.warning(
                        "%s %s -> %d (request %s, %.3fs)",
                        scope.get("method"),
                        path,
                        status,
                        rid,
                        time.perf_counter() - t0,
                    )
                elif status >= 500:
                    m.ERRORS.labels("internal" if status == 500 else "unavailable").inc()

    async def _read_body(
        self, scope: Scope, receive: Receive, headers: dict[str, str], endpoint: str, path: str
    ) -> tuple[Scope, Receive]:
        header_length = headers.get("inference-header-content-length")
        binary_v2 = endpoint == "v2" and header_length is not None
        if not binary_v2 and not _is_json(headers.get("content-type", "")):
            got = headers.get("content-type") or "none"
            raise _Reject(415, f"content-type must be application/json, got {got}")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            raise _Reject(413, f"body of {length} bytes exceeds {self.max_body_bytes}", close=True)
        body = bytearray()
        deadline = time.monotonic() + self.body_timeout_s
        more = True
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                raise _Reject(
                    408, f"the body did not arrive within {self.body_timeout_s:g} s", close=True
                ) from None
            if message["type"] == "http.disconnect":
                raise _Gone  # the client left: nothing to answer
            body += message.get("body", b"")
            more = bool(message.get("more_body"))
            if len(body) > self.max_body_bytes:
                raise _Reject(413, f"body exceeds {self.max_body_bytes} bytes", close=True)
        data = bytes(body)
        try:
            if binary_v2:
                if not _V2_INFER.match(path):
                    raise WireError(f"{path}: binary-extension bodies are read only by the v2 infer route")
                doc: Any = v2_binary_to_json(data, header_length or "")
                data = orjson.dumps(doc)
                scope = dict(scope)
                scope["headers"] = [
                    (k, v)
                    for k, v in scope.get("headers", [])
                    if k.lower()
                    not in (b"inference-header-content-length", b"content-length", b"content-type")
                ] + [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
            else:
                try:  # strict JSON for every route (FastAPI's own parser accepts NaN/Infinity)
                    doc = orjson.loads(data)
                except orjson.JSONDecodeError as exc:
                    raise WireError(f"the body is not valid JSON: {exc}") from None
                if b'"' in data:  # no key twice in an object: the routes' parsers would each pick one
                    loads(data)
            if _V2_INFER.match(path):
                check_v2_body(doc)
        except WireError as exc:
            raise _Reject(exc.status, str(exc)) from None
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        return scope, replay


async def _reject(send: Send, exc: _Reject, *, openai: bool) -> None:
    message = str(exc)
    if openai:
        kind = "authentication_error" if exc.status == 401 else "invalid_request_error"
        if exc.status >= 500:
            kind = "server_error"
        payload: dict[str, Any] = {
            "error": {"message": message, "type": kind, "param": None, "code": exc.code}
        }
    else:
        payload = {"error": message}
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if exc.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="conductor"'))
    if exc.close or exc.status == 401:  # a wrong key ends the connection: one guess per connection
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol that drops a connection whose request headers are not complete
    within :attr:`header_timeout_s` of the request's first byte (see module docstring)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    #: seconds from the end of a request's headers to the end of its body (then the connection closes)
    body_deadline_s: float = BODY_TIMEOUT_S + BODY_GRACE_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._header_tail = b""  # the last bytes counted, for an end of headers split across reads
        super().connection_made(transport)
        self._arm()  # a client that connects and sends nothing is cut too

    def data_received(self, data: bytes) -> None:
        if self._header_timer is not None:  # still within a request's line and headers
            # count the bytes up to the end of the headers only: a read that also carries the
            # start of a large body is the body's business (413), not the headers' (431)
            seen = self._header_tail + data
            end = seen.find(b"\r\n\r\n")
            self._header_bytes += len(data) if end < 0 else end + 4 - len(self._header_tail)
            self._header_tail = seen[-3:]
            if self._header_bytes > MAX_HEADER_BYTES:
                self._disarm()
                body = b'{"error": "request headers too large"}'
                self.transport.write(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                    b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                self.transport.close()
                return
        super().data_received(data)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        self._header_bytes = 0
        self._header_tail = b""
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._end_body_timer()
        self._body_timer = self.loop.call_later(self.body_deadline_s, self._headers_late)
        cap = self.limit_concurrency
        if cap is not None and is_probe(_path_of(self.url)):
            # a probe is answered at once and holds nothing: clients holding every connection of
            # the cap must not make liveness fail (the kubelet would restart a healthy pod)
            self.limit_concurrency = None
        try:
            super().on_headers_complete()
        finally:
            self.limit_concurrency = cap

    def on_message_complete(self) -> None:
        self._end_body_timer()
        super().on_message_complete()

    def _end_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._end_body_timer()
        super().connection_lost(exc)


def _path_of(url: bytes) -> str:
    """The path of a request line's target (``/v2/health/live?x=1`` -> ``/v2/health/live``)."""
    return url.split(b"?", 1)[0].split(b"#", 1)[0].decode("latin-1")


def header_timeout_protocol(
    seconds: float, body_timeout_s: float = BODY_TIMEOUT_S
) -> type[HeaderTimeoutProtocol]:
    """A :class:`HeaderTimeoutProtocol` class with its own timeouts (uvicorn takes a class)."""
    attrs = {"header_timeout_s": seconds, "body_deadline_s": body_timeout_s + BODY_GRACE_S}
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), attrs)


_SEP = r"(?:[_.-]|%5f|%2d|%2e)?"  # api_key, api-key, apikey, api%5Fkey ...
_SECRET_NAMES = "|".join(
    (
        rf"(?:x{_SEP})?api{_SEP}keys?",
        r"keys?",
        rf"(?:access{_SEP}|refresh{_SEP}|id{_SEP}|auth{_SEP})?tokens?",
        rf"(?:access|secret|private|client){_SEP}keys?",
        rf"(?:client{_SEP})?secrets?",
        r"auth|authorization|bearer|jwt|sig|signature|password|passwd|pwd|credentials?|session(?:id)?",
    )
)
#: URL parameters (query ``?name=``/``&name=`` or path ``;name=``) whose value is a credential,
#: compared without case, with ``_``, ``-``, ``.`` (or their percent-encodings) or nothing between
#: the words of a name; uvicorn's access log writes a path's ``=`` as ``%3D``.
_SECRET_PARAMS = re.compile(rf"(?i)((?:[?&;]|%3b|%26)(?:{_SECRET_NAMES})(?:=|%3d))[^&;\s\"']*")


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with credential parameters' values and every one of ``secrets`` (the configured
    API keys, wherever they appear) written as ``REDACTED``."""
    for secret in secrets:
        text = text.replace(secret, "REDACTED")
    return _SECRET_PARAMS.sub(r"\1REDACTED", text)


class RedactQueryKeys(logging.Filter):
    """Writes ``REDACTED`` for credential values in the URLs of log lines (uvicorn's access log,
    KServe's ``kserve.trace``, the guard's 4xx lines; see module docstring): named credential
    parameters, and the configured API keys themselves under any name."""

    def __init__(self, keys: ApiKeys | None = None) -> None:
        super().__init__()
        self.secrets = tuple(k.decode("latin-1") for k in keys.keys) if keys is not None else ()

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a, self.secrets) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg, self.secrets)
        return True
