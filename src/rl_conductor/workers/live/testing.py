"""Scripted HTTP servers that speak each vendor's wire format, for tests, demos and benchmarks.

A :class:`ScriptedServer` is a real HTTP server on a loopback port (a thread of the test
process). It answers requests from a script of :class:`Reply` values, one per request, then a
default; each reply may wait, set headers (``Retry-After``), fail with a status and the vendor's
error body, or return a malformed body. It records every request (path, headers, JSON body),
so tests can count HTTP calls and check what was sent.

The response bodies follow the vendors' documented examples: OpenAI's ``chat.completion``
object, Anthropic's ``message`` object and error envelope, Gemini's ``GenerateContentResponse``
with ``usageMetadata``. Nothing here fakes the SDKs: the clients under test speak real HTTP.

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
    truncated: bool = False,
    model: str = "test-model",
) -> dict[str, Any]:
    """A successful response in ``vendor``'s format (usage omitted where tokens are None)."""
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
        if input_tokens is not None and output_tokens is not None:
            body["usage"] = {
                "prompt_tokens": input_tokens,
                "completion_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
            }
        return body
    if vendor == "anthropic":
        body = {
            "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "max_tokens" if truncated else "end_turn",
            "stop_sequence": None,
        }
        if input_tokens is not None and output_tokens is not None:
            body["usage"] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        return body
    body = {
        "candidates": [
            {
                "content": {"parts": [{"text": text}], "role": "model"},
                "finishReason": "MAX_TOKENS" if truncated else "STOP",
                "index": 0,
            }
        ],
        "modelVersion": model,
    }
    if input_tokens is not None and output_tokens is not None:
        body["usageMetadata"] = {
            "promptTokenCount": input_tokens,
            "candidatesTokenCount": output_tokens,
            "totalTokenCount": input_tokens + output_tokens,
        }
    return body


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
