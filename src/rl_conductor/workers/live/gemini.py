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
output tokens, and ``maxOutputTokens`` caps thoughts and answer together (a call whose thoughts
use it all ends ``MAX_TOKENS`` with no text, an empty step that is still charged).
``finishReason: MAX_TOKENS`` is reported as ``finish_reason: length``.
The SDK's own retries are off (``retry_options`` unset): retries are :mod:`.resilience`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx2
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from rl_conductor.workers.base import Message, WorkerError
from rl_conductor.workers.live.base import LiveWorker, WireResult, common_settings, usage_count, wrap_cache
from rl_conductor.workers.live.resilience import (
    MalformedResponseError,
    TransientWorkerError,
    classify_status,
)
from rl_conductor.workers.live.secrets import redact
from rl_conductor.workers.pool import register_kind

DEFAULT_API_VERSION = "v1beta"


@dataclass(kw_only=True)
class GeminiWorker(LiveWorker):
    """A worker behind the Gemini API."""

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

    async def _send(
        self, client: Any, messages: Sequence[Message], max_tokens: int, temperature: float
    ) -> WireResult:
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
        resp = await client.aio.models.generate_content(model=self.model, contents=contents, config=config)
        candidates = getattr(resp, "candidates", None)
        if not candidates:
            raise MalformedResponseError(f"{self.info.name}: response has no candidates")
        cand = candidates[0]
        parts = cand.content.parts if cand.content is not None and cand.content.parts else []
        text = "".join(p.text for p in parts if isinstance(p.text, str) and not p.thought)
        finish = cand.finish_reason
        finish_name = getattr(finish, "name", str(finish or ""))
        usage = getattr(resp, "usage_metadata", None)
        in_tok = usage_count(usage, "prompt_token_count", "tool_use_prompt_token_count")
        # thoughts are billed as output; a response with only thoughts omits candidatesTokenCount
        out_tok = usage_count(usage, "candidates_token_count", "thoughts_token_count")
        if out_tok is None and in_tok is not None:
            out_tok = 0
        return WireResult(
            text=text,
            input_tokens=in_tok,
            output_tokens=out_tok,
            finish_reason="length" if finish_name == "MAX_TOKENS" else ("stop" if finish_name else ""),
        )

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


@register_kind("gemini")
def build_gemini(spec: dict[str, Any], options: dict[str, Any]) -> Any:
    """Builder for ``kind: gemini`` (``api_key_env`` required; see the module docstring)."""
    settings = common_settings(spec, options, needs_key=True)
    return wrap_cache(
        GeminiWorker(api_version=str(spec.get("api_version", DEFAULT_API_VERSION)), **settings), spec, options
    )
