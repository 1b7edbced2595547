"""Scripted HTTP servers that speak each vendor's wire format, for tests, demos and benchmarks.

A :class:`ScriptedServer` is a real HTTP server on a loopback port (a thread of the test
process). It answers requests from a script of :class:`Reply` values, one per request, then a
default; each reply may wait, set headers (``Retry-After``), fail with a status and the vendor's
error body, or return a malformed body. It records every request (path, headers, JSON body),
so tests can count HTTP calls and check what was sent.

The response bodies follow the vendors' documented examples: OpenAI's ``chat.completion``
object, Anthropic's ``message`` object and error envelope, Gemini's ``GenerateContentResponse``
with ``usageMetadata``. Nothing here fakes the SDKs: the clients under test speak real HTTP.

Streaming: a request with ``"stream": true`` (OpenAI, Anthropic) or to Gemini's
``:streamGenerateContent`` gets its successful reply as server-sent events in the vendor's
format, each event written and flushed on its own (chunked transfer encoding): OpenAI's
``chat.completion.chunk`` objects, the ``usage`` chunk when the request set
``stream_options.include_usage``, then ``data: [DONE]``; Anthropic's ``message_start``,
``content_block_*``, ``ping``, ``message_delta`` and ``message_stop`` events; Gemini's
``GenerateContentResponse`` chunks, the last with ``finishReason`` and ``usageMetadata``.
:func:`streamed` scripts a stream in pieces, with a stream that just ends part-way without
the vendor's end marker (``truncate_after``), with a mid-stream error event (OpenAI's and
Gemini's ``data: {"error": ...}``, Anthropic's ``event: error``) and a hold: the server stops
after the first text delta until the test sets a ``threading.Event``, so a test can show that the
first token reached its client before the worker produced its last one without timing anything.

Simplification: HTTP/1.1 without TLS; one thread per connection.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Vendor = Literal["openai", "anthropic", "gemini"]


@dataclass(frozen=True)
class Reply:
    """One scripted response.

    Attributes:
        status: HTTP status.
        body: a JSON-able value, or raw text (sent as is: a malformed body).
        headers: extra headers (``Retry-After``, …).
        delay_s: wait this long before answering (timeouts).
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    #: text pieces of a streamed answer (None: split the body's text into words when streamed)
    pieces: tuple[str, ...] | None = None
    #: end the stream with the vendor's error event after this many text pieces
    error_after: int | None = None
    #: end the stream cleanly (chunked body closed) after this many text pieces, without the
    #: vendor's end marker: no finish_reason chunk nor ``[DONE]`` (OpenAI), no ``message_delta``
    #: nor ``message_stop`` (Anthropic), no ``finishReason`` nor usage (Gemini)
    truncate_after: int | None = None
    #: after the first text piece, wait until this is set (at most HOLD_TIMEOUT_S, then fail
    #: with an error event); a reply answered whole waits for it before answering at all
    hold: threading.Event | None = None
    #: generation time of one text piece (benchmarks): slept before each piece is sent, and for
    #: every piece before a reply answered whole is sent
    piece_delay_s: float = 0.0


#: longest a held stream waits for its test to release it before it fails with an error event
HOLD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Request:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


def success_body(
    vendor: Vendor,
    text: str,
    *,
    input_tokens: int | None = 9,
    output_tokens: int | None = 12,
    reasoning_tokens: int = 0,
    cached_tokens: int = 0,
    truncated: bool = False,
    model: str = "test-model",
) -> dict[str, Any]:
    """A successful response in ``vendor``'s format (usage omitted where tokens are None).

    ``input_tokens`` is every prompt token billed, ``cached_tokens`` of them read from the
    vendor's prompt cache; ``output_tokens`` the answer's tokens and ``reasoning_tokens`` the
    thinking billed beside them, each in the vendor's own fields: OpenAI counts reasoning inside
    ``completion_tokens`` (``completion_tokens_details.reasoning_tokens``) and cached tokens inside
    ``prompt_tokens``; Anthropic counts thinking inside ``output_tokens`` (with a ``thinking``
    block) and cache reads apart from ``input_tokens``; Gemini reports ``thoughtsTokenCount``
    apart from ``candidatesTokenCount`` (with a ``thought`` part) and cached tokens inside
    ``promptTokenCount``."""
    usage = input_tokens is not None and output_tokens is not None
    if vendor == "openai":
        body: dict[str, Any] = {
            "id": "chatcmpl-123",
            "object": "chat.completion",
            "created": 1677652288,
            "model": model,
            "system_fingerprint": "fp_44709d6fcb",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "length" if truncated else "stop",
                }
            ],
        }
        if usage:
            assert input_tokens is not None and output_tokens is not None
            body["usage"] = {
                "prompt_tokens": input_tokens,
                "completion_tokens": output_tokens + reasoning_tokens,
                "total_tokens": input_tokens + output_tokens + reasoning_tokens,
                "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
                "completion_tokens_details": {
                    "reasoning_tokens": reasoning_tokens,
                    "audio_tokens": 0,
                    "accepted_prediction_tokens": 0,
                    "rejected_prediction_tokens": 0,
                },
            }
        return body
    if vendor == "anthropic":
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if reasoning_tokens:
            content.insert(0, {"type": "thinking", "thinking": "Let me think.", "signature": "c2lnbmF0dXJl"})
        body = {
            "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": "max_tokens" if truncated else "end_turn",
            "stop_sequence": None,
        }
        if usage:
            assert input_tokens is not None and output_tokens is not None
            body["usage"] = {
                "input_tokens": input_tokens - cached_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached_tokens,
                "output_tokens": output_tokens + reasoning_tokens,
            }
        return body
    parts: list[dict[str, Any]] = [{"text": text}]
    if reasoning_tokens:
        parts.insert(0, {"text": "Let me think.", "thought": True})
    body = {
        "candidates": [
            {
                "content": {"parts": parts, "role": "model"},
                "finishReason": "MAX_TOKENS" if truncated else "STOP",
                "index": 0,
            }
        ],
        "modelVersion": model,
    }
    if usage:
        assert input_tokens is not None and output_tokens is not None
        meta: dict[str, Any] = {
            "promptTokenCount": input_tokens,
            "candidatesTokenCount": output_tokens,
            "totalTokenCount": input_tokens + output_tokens + reasoning_tokens,
        }
        if reasoning_tokens:
            meta["thoughtsTokenCount"] = reasoning_tokens
        if cached_tokens:
            meta["cachedContentTokenCount"] = cached_tokens
        body["usageMetadata"] = meta
    return body


def stream_events(
    vendor: Vendor, body: dict[str, Any], pieces: list[str], *, include_usage: bool
) -> list[str]:
    """The server-sent events that stream the success ``body`` (of :func:`success_body`) in
    ``pieces`` of text: one event per piece (those events are marked by their index in the
    returned list being ``1 .. len(pieces)`` for OpenAI and ``3 .. len(pieces) + 2`` for
    Anthropic; see :func:`_piece_indices`)."""
    if vendor == "openai":
        head = {k: body[k] for k in ("id", "created", "model", "system_fingerprint") if k in body}
        head["object"] = "chat.completion.chunk"
        finish = body["choices"][0]["finish_reason"]

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            data = {**head, "choices": [choice]}
            if include_usage:
                data["usage"] = None
            return f"data: {json.dumps(data)}\n\n"

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": p}) for p in pieces]
        events.append(chunk({}, finish))
        if include_usage and "usage" in body:
            events.append(f"data: {json.dumps({**head, 'choices': [], 'usage': body['usage']})}\n\n")
        return [*events, "data: [DONE]\n\n"]
    if vendor == "anthropic":
        usage = body.get("usage", {})

        def event(kind: str, data: dict[str, Any]) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

        start_usage = {k: v for k, v in usage.items() if k != "output_tokens"} | {"output_tokens": 1}
        message = {**body, "content": [], "stop_reason": None, "usage": start_usage}
        events = [
            event("message_start", {"message": message}),
            event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            event("ping", {}),
        ]
        events += [
            event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": p}})
            for p in pieces
        ]
        events.append(event("content_block_stop", {"index": 0}))
        delta = {"stop_reason": body["stop_reason"], "stop_sequence": None}
        out = {"output_tokens": usage["output_tokens"]} if "output_tokens" in usage else {}
        events.append(event("message_delta", {"delta": delta, "usage": out}))
        return [*events, event("message_stop", {})]
    cand = body["candidates"][0]
    chunks = []
    for i, p in enumerate(pieces or [""]):
        last = i == max(len(pieces), 1) - 1
        c: dict[str, Any] = {"content": {"parts": [{"text": p}], "role": "model"}, "index": 0}
        data: dict[str, Any] = {"candidates": [c], "modelVersion": body.get("modelVersion", "")}
        if last:
            c["finishReason"] = cand["finishReason"]
            if "usageMetadata" in body:
                data["usageMetadata"] = body["usageMetadata"]
        chunks.append(f"data: {json.dumps(data)}\r\n\r\n")
    return chunks


def _piece_indices(vendor: Vendor, n: int) -> range:
    """Where the ``n`` text pieces sit in :func:`stream_events`' list."""
    return range(1, n + 1) if vendor == "openai" else range(3, n + 3) if vendor == "anthropic" else range(n)


def stream_error_event(vendor: Vendor, message: str) -> str:
    """The event a vendor sends when generation fails after the stream started."""
    if vendor == "openai":  # vLLM: a data line holding an error object, then [DONE]
        err = {"error": {"message": message, "type": "server_error", "param": None, "code": 500}}
        return f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n"
    if vendor == "gemini":
        return f"data: {json.dumps(error_body('gemini', 500, message))}\r\n\r\n"
    err = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
    return f"event: error\ndata: {json.dumps(err)}\n\n"


def _text_of(vendor: Vendor, body: dict[str, Any]) -> str:
    if vendor == "openai":
        return str(body["choices"][0]["message"]["content"] or "")
    if vendor == "gemini":
        parts = body["candidates"][0]["content"]["parts"]
        return "".join(p.get("text", "") for p in parts if not p.get("thought"))
    return "".join(b.get("text", "") for b in body.get("content", []) if b.get("type") == "text")


def streamed(
    vendor: Vendor,
    pieces: list[str],
    *,
    error_after: int | None = None,
    truncate_after: int | None = None,
    hold: threading.Event | None = None,
    **usage: Any,
) -> Reply:
    """A success reply streamed in ``pieces`` (usage as in :func:`success_body`); with
    ``error_after`` the vendor's error event replaces the pieces after that many; with
    ``truncate_after`` the stream just ends after that many, without the vendor's end marker;
    with ``hold`` the stream stops after its first piece until the test sets it."""
    return Reply(
        body=success_body(vendor, "".join(pieces), **usage),
        pieces=tuple(pieces),
        error_after=error_after,
        truncate_after=truncate_after,
        hold=hold,
    )


def request_messages(vendor: Vendor, body: Any) -> list[tuple[str, str]]:
    """The (role, text) of every message in a request body of ``vendor``'s format (system text
    first where the vendor sends it apart), for servers that count tokens like a vendor."""
    if not isinstance(body, dict):
        return []
    out: list[tuple[str, str]] = []
    if vendor == "openai":
        return [(str(m.get("role", "")), str(m.get("content") or "")) for m in body.get("messages", [])]
    if vendor == "anthropic":
        system = body.get("system")
        if system:
            out.append(("system", system if isinstance(system, str) else json.dumps(system)))
        for m in body.get("messages", []):
            content = m.get("content", "")
            out.append((str(m.get("role", "")), content if isinstance(content, str) else json.dumps(content)))
        return out
    system = body.get("systemInstruction") or body.get("system_instruction")
    if isinstance(system, dict):
        out.append(("system", "".join(str(p.get("text", "")) for p in system.get("parts", []))))
    for c in body.get("contents", []):
        out.append((str(c.get("role", "")), "".join(str(p.get("text", "")) for p in c.get("parts", []))))
    return out


def request_max_tokens(vendor: Vendor, body: Any) -> int | None:
    """The output cap a request of ``vendor``'s format asks for (None where it names none)."""
    if not isinstance(body, dict):
        return None
    if vendor == "gemini":
        value = (body.get("generationConfig") or {}).get("maxOutputTokens")
    else:
        value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) else None


def _words(text: str) -> list[str]:
    """``text`` in word pieces, each with the space before it (how tokens usually stream)."""
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)] if text else []


def count_bytes(text: str) -> int:
    """Tokens of ``text`` for a tokenizer at its worst: one per UTF-8 byte (byte-level BPE with no
    merge at all), 3 per CJK character, 4 per emoji."""
    return len(text.encode("utf-8"))


def count_chars(text: str) -> int:
    """Tokens of ``text`` for a tokenizer that spends one per character."""
    return len(text)


def count_words(text: str) -> int:
    """Tokens of ``text`` for a typical English tokenizer (about 4 characters a token)."""
    return max(1, round(len(text) / 4)) if text else 0


@dataclass
class BillingServer:
    """A reply function (``ScriptedServer(default=...)``) that bills like a vendor at its worst.

    Each request's input is counted with ``count`` plus ``overhead`` tokens a message; its output
    is ``output_share`` of the ``max_tokens`` the request allowed, ``reasoning_share`` of that as
    reasoning / thinking (each in the vendor's own usage fields, see :func:`success_body`), and
    ``cached_share`` of the input reported as read from a prompt cache. ``billed`` keeps the
    (input, output) tokens billed per request, so a test can price what the vendor would charge.
    """

    vendor: Vendor
    count: Callable[[str], int] = count_bytes
    overhead: int = 4
    output_share: float = 1.0
    reasoning_share: float = 0.5
    cached_share: float = 0.0
    text: str = "The answer is \\boxed{42}."
    billed: list[tuple[int, int]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __call__(self, req: Request) -> Reply:
        messages = request_messages(self.vendor, req.body)
        in_tok = sum(self.count(text) + self.overhead for _, text in messages)
        cap = request_max_tokens(self.vendor, req.body) or 0
        out_tok = int(cap * self.output_share)
        reasoning = int(out_tok * self.reasoning_share)
        with self._lock:
            self.billed.append((in_tok, out_tok))
        return ok(
            self.vendor,
            self.text,
            input_tokens=in_tok,
            output_tokens=out_tok - reasoning,
            reasoning_tokens=reasoning,
            cached_tokens=int(in_tok * self.cached_share),
            truncated=out_tok >= cap,
        )

    def cost(self, price_in: float, price_out: float) -> float:
        """What the vendor would bill for every request so far, at these prices (USD per 1M)."""
        with self._lock:
            return sum(i * price_in + o * price_out for i, o in self.billed) / 1e6


_STATUS_NAMES = {
    400: ("invalid_request_error", "INVALID_ARGUMENT"),
    401: ("authentication_error", "UNAUTHENTICATED"),
    429: ("rate_limit_error", "RESOURCE_EXHAUSTED"),
    500: ("api_error", "INTERNAL"),
    503: ("overloaded_error", "UNAVAILABLE"),
}


def error_body(vendor: Vendor, status: int, message: str = "scripted failure") -> dict[str, Any]:
    """An error response body in ``vendor``'s format."""
    kind, google_status = _STATUS_NAMES.get(status, ("api_error", "UNKNOWN"))
    if vendor == "openai":
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}
    if vendor == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"code": status, "message": message, "status": google_status}}


def error(vendor: Vendor, status: int, *, retry_after: str | None = None, message: str = "scripted") -> Reply:
    """A scripted error reply (with ``Retry-After`` when given)."""
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return Reply(status=status, body=error_body(vendor, status, message), headers=headers)


def ok(vendor: Vendor, text: str = "ok", **kwargs: Any) -> Reply:
    """A scripted success reply."""
    return Reply(body=success_body(vendor, text, **kwargs))


class ScriptedServer:
    """A loopback HTTP server answering from a script (see the module docstring).

    Args:
        vendor: whose wire format the default reply uses.
        script: replies for the first requests, in order.
        default: the reply once the script is used up (a success saying "ok"), or a function of
            the request that returns one.
    """

    def __init__(
        self,
        vendor: Vendor,
        script: list[Reply] | None = None,
        default: Reply | Callable[[Request], Reply] | None = None,
    ) -> None:
        self.vendor = vendor
        self.script = list(script or [])
        self.default = default if default is not None else ok(vendor)
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out as two writes: without TCP_NODELAY the body waits for the
            # client's delayed ACK (about 40 ms a response on Linux)
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                return

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self._answer()

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                req = Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                reply = server._next(req)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                wants_stream = (isinstance(body, dict) and body.get("stream") is True) or (
                    server.vendor == "gemini" and ":streamGenerateContent" in self.path
                )
                if wants_stream and reply.status == 200 and isinstance(reply.body, dict):
                    self._stream(reply, body)
                    return
                if reply.piece_delay_s and reply.pieces:
                    time.sleep(reply.piece_delay_s * len(reply.pieces))
                if reply.hold is not None and not reply.hold.wait(HOLD_TIMEOUT_S):
                    # answered whole, its last token comes after the hold: never released, it fails
                    reply = error(server.vendor, 503, message="the test never released the hold")
                payload = (
                    reply.body.encode() if isinstance(reply.body, str) else json.dumps(reply.body).encode()
                )
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

            def _stream(self, reply: Reply, request: dict[str, Any]) -> None:
                vendor = server.vendor
                text = _text_of(vendor, reply.body)
                pieces = list(reply.pieces) if reply.pieces is not None else _words(text)
                include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
                events = stream_events(vendor, reply.body, pieces, include_usage=include_usage)
                at = _piece_indices(vendor, len(pieces))
                try:
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("cache-control", "no-cache")
                    self.send_header("transfer-encoding", "chunked")
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    for i, ev in enumerate(events):
                        piece = i - at.start if i in at else None
                        if piece is not None and piece == reply.error_after:
                            self._chunk(stream_error_event(vendor, "scripted failure mid-stream"))
                            break
                        if reply.truncate_after is not None and (
                            piece == reply.truncate_after or (piece is None and i > at.start)
                        ):
                            break  # a proxy or a crashed server cut it: the body just ends
                        if reply.hold is not None and piece == 1 and not reply.hold.wait(HOLD_TIMEOUT_S):
                            self._chunk(stream_error_event(vendor, "the test never released the hold"))
                            break
                        if piece is not None and reply.piece_delay_s:
                            time.sleep(reply.piece_delay_s)
                        self._chunk(ev)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _chunk(self, text: str) -> None:
                data = text.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def _next(self, req: Request) -> Reply:
        with self._lock:
            self.requests.append(req)
            if self.script:
                return self.script.pop(0)
        return self.default(req) if callable(self.default) else self.default

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The base URL a client of this vendor takes (OpenAI's includes ``/v1``)."""
        return f"{self.root}/v1" if self.vendor == "openai" else self.root

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@contextmanager
def scripted_server(
    vendor: Vendor,
    script: list[Reply] | None = None,
    default: Reply | Callable[[Request], Reply] | None = None,
) -> Iterator[ScriptedServer]:
    """Run a :class:`ScriptedServer` for the duration of a ``with`` block."""
    server = ScriptedServer(vendor, script, default).start()
    try:
        yield server
    finally:
        server.stop()


def worker_spec(
    vendor: str,
    base_url: str,
    name: str = "w",
    *,
    api_key_env: str,
    price_in: float,
    price_out: float,
    retries: dict[str, Any],
    timeout_s: float,
    **extra: Any,
) -> dict[str, Any]:
    """A pool file's entry for a ``vendor`` worker (model ``test-model``, external hosting)
    behind the server at ``base_url``; ``extra`` adds or replaces fields."""
    return {
        "name": name,
        "kind": vendor,
        "model": "test-model",
        "base_url": base_url,
        "api_key_env": api_key_env,
        "price_in": price_in,
        "price_out": price_out,
        "hosting": "external",
        "retries": retries,
        "timeout_s": timeout_s,
        **extra,
    }
