"""Google Gemini ``generateContent`` (``kind: gemini``), through the official ``google-genai`` SDK.

Pool entry::

    - name: gemini-flash
      kind: gemini
      model: gemini-2.5-flash
      api_key_env: GEMINI_API_KEY                               # required
      base_url: https://generativelanguage.googleapis.com/      # the default
      api_version: v1beta                                       # the default

Messages map to ``contents`` (``assistant`` becomes the API's ``model`` role) and system
messages to ``system_instruction``. Usage comes from ``usageMetadata.promptTokenCount`` (which
includes ``cachedContentTokenCount``; charged at the full input price) and, as output,
``candidatesTokenCount`` plus ``thoughtsTokenCount``: the thinking models bill their thoughts as
output tokens (a response with text but no ``candidatesTokenCount``, as a cut stream's early
chunk has, is charged the worst case and marked estimated), and ``maxOutputTokens`` caps
thoughts and answer together (a call whose thoughts use it all ends ``MAX_TOKENS`` with no
text, an empty step that is still charged).
``finishReason: MAX_TOKENS`` is reported as ``finish_reason: length``.
The SDK's own retries are off (``retry_options`` unset): retries are :mod:`.resilience`'s.

Streaming (the call that answers a ``stream: true`` request): ``streamGenerateContent`` with
``alt=sse`` (the SDK's ``generate_content_stream``); each chunk's non-thought text is passed on,
the finish reason and ``usageMetadata`` come from the last chunk that has them. A stream that
ends without a chunk carrying ``finishReason`` was cut (:class:`.base.StreamEndedEarlyError`). An
error object in the stream (``data: {"error": ...}``) is the API's error with its code: transient (5xx)
before the first text delta, a broken stream after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx2
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from rl_conductor.workers.base import Message, WorkerError
from rl_conductor.workers.kinds import register_kind
from rl_conductor.workers.live.base import LiveWorker, WireResult, common_settings, usage_count, wrap_cache
from rl_conductor.workers.live.resilience import (
    MalformedResponseError,
    TransientWorkerError,
    classify_status,
)
from rl_conductor.workers.live.secrets import redact

DEFAULT_API_VERSION = "v1beta"


@dataclass(kw_only=True)
class GeminiWorker(LiveWorker):
    """A worker behind the Gemini API."""

    stream_end_marker: ClassVar[str] = "a chunk with finishReason"

    api_version: str = DEFAULT_API_VERSION

    def _make_client(self, http_client: httpx2.AsyncClient) -> Any:
        opts: dict[str, Any] = {
            "api_version": self.api_version,
            "timeout": int((self.timeout_s + 5.0) * 1000),
            "httpx_async_client": http_client,
        }
        if self.base_url:
            opts["base_url"] = self.base_url
        return genai.Client(api_key=self.api_key, http_options=types.HttpOptions(**opts))

    def _request(self, messages: Sequence[Message], max_tokens: int, temperature: float) -> dict[str, Any]:
        system = "\n\n".join(m.get("content", "") for m in messages if m.get("role") == "system")
        contents = [
            types.Content(
                role="model" if m.get("role") == "assistant" else "user",
                parts=[types.Part(text=m.get("content", ""))],
            )
            for m in messages
            if m.get("role") != "system"
        ]
        config = types.GenerateContentConfig(
            max_output_tokens=max_tokens,
            temperature=temperature,
            system_instruction=system or None,
        )
        return {"model": self.model, "contents": contents, "config": config}

    async def _send(self, client: Any, request: dict[str, Any]) -> WireResult:
        resp = await client.aio.models.generate_content(**request)
        candidates = getattr(resp, "candidates", None)
        if not candidates:
            raise MalformedResponseError(f"{self.info.name}: response has no candidates")
        cand = candidates[0]
        parts = cand.content.parts if cand.content is not None and cand.content.parts else []
        text = "".join(p.text for p in parts if isinstance(p.text, str) and not p.thought)
        return _result(text, cand.finish_reason, getattr(resp, "usage_metadata", None))

    async def _send_stream(
        self, client: Any, request: dict[str, Any], on_delta: Callable[[str], None]
    ) -> WireResult:
        stream = await client.aio.models.generate_content_stream(**request)
        parts: list[str] = []
        finish: Any = None
        usage: Any = None
        try:
            async for chunk in stream:
                usage = getattr(chunk, "usage_metadata", None) or usage
                candidates = getattr(chunk, "candidates", None) or []
                if not candidates:
                    continue
                cand = candidates[0]
                finish = cand.finish_reason or finish
                for part in cand.content.parts if cand.content is not None and cand.content.parts else []:
                    if isinstance(part.text, str) and part.text and not part.thought:
                        parts.append(part.text)
                        on_delta(part.text)
        finally:
            await stream.aclose()  # the SDK's generator: release the connection now, not at GC
        return _result("".join(parts), finish, usage)

    def _classify(self, exc: Exception) -> WorkerError | None:
        name = self.info.name
        if isinstance(exc, genai_errors.APIError):
            response = getattr(exc, "response", None)
            headers = dict(response.headers) if response is not None and hasattr(response, "headers") else {}
            return classify_status(
                int(exc.code), f"{name}: HTTP {exc.code}: {redact(str(exc.message))[:300]}", headers
            )
        if isinstance(exc, httpx2.TimeoutException):
            return TransientWorkerError(f"{name}: timed out", timed_out=True)
        if isinstance(exc, httpx2.TransportError):
            return TransientWorkerError(f"{name}: connection failed: {redact(str(exc))[:200]}")
        if isinstance(exc, ValueError | KeyError | TypeError | AttributeError):
            return MalformedResponseError(f"{name}: malformed response: {redact(str(exc))[:200]}")
        return None


def _result(text: str, finish: Any, usage: Any) -> WireResult:
    """A result with the billed tokens of a ``usageMetadata`` (None where it has none)."""
    finish_name = getattr(finish, "name", str(finish or ""))
    in_tok = usage_count(usage, "prompt_token_count", "tool_use_prompt_token_count")
    # thoughts are billed as output; a response with only thoughts omits candidatesTokenCount
    out_tok = usage_count(usage, "candidates_token_count", "thoughts_token_count")
    if text and usage_count(usage, "candidates_token_count") is None:
        out_tok = None  # an answer whose tokens are not counted: charged the worst case, estimated
    elif out_tok is None and in_tok is not None:
        out_tok = 0
    return WireResult(
        text=text,
        input_tokens=in_tok,
        output_tokens=out_tok,
        finish_reason="length" if finish_name == "MAX_TOKENS" else ("stop" if finish_name else ""),
    )


@register_kind("gemini")
def build_gemini(spec: dict[str, Any], options: dict[str, Any]) -> Any:
    """Builder for ``kind: gemini`` (``api_key_env`` required; see the module docstring)."""
    settings = common_settings(spec, options, needs_key=True)
    return wrap_cache(
        GeminiWorker(api_version=str(spec.get("api_version", DEFAULT_API_VERSION)), **settings), spec, options
    )
