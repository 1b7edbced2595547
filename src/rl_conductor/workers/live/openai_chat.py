"""OpenAI-compatible chat completions (``kind: openai``), through the official ``openai`` SDK.

One wire API, many servers: KServe's Hugging Face and vLLM runtimes (under ``/openai/v1``),
vLLM, llama.cpp, this project's ``conductor worker serve``, and OpenAI itself. The base URL is
the API root (``http://host/openai/v1``); the SDK appends ``/chat/completions``.

Pool entry::

    - name: qwen-7b
      kind: openai
      model: qwen-7b                       # the name the server expects
      base_url: http://qwen-7b.workers.svc/openai/v1
      api_key_env: OPENAI_API_KEY          # omit for servers that need no key
      max_tokens_field: max_tokens         # or max_completion_tokens (OpenAI's newer models)
      extra_body: {chat_template_kwargs: {enable_thinking: true}}   # optional extra request fields
      timeout_s: 60
      retries: {attempts: 3, initial_s: 0.5, max_s: 8}
      circuit: {failure_threshold: 5, reset_after_s: 30}

Usage comes from ``usage.prompt_tokens`` / ``usage.completion_tokens``: the completion count
already includes ``completion_tokens_details.reasoning_tokens`` (billed as output, bounded by the
``max_tokens`` / ``max_completion_tokens`` sent), and the prompt count includes
``prompt_tokens_details.cached_tokens``, charged at the full input price (no discount is
assumed, so the charge never falls below the bill); ``finish_reason``
``length`` marks an answer cut at ``max_tokens``. The SDK's own retries are off: retries are
:mod:`.resilience`'s, so that they are the same for every API.

Streaming (the call that answers a ``stream: true`` request): ``stream=True`` with
``stream_options={"include_usage": true}``, so the last chunk carries the same ``usage`` (vLLM,
llama.cpp and OpenAI send it; a server that does not is charged the worst case, marked
estimated). A stream that ends without a chunk carrying ``finish_reason`` (a proxy or a
crashed server cut it) is broken (:class:`.base.StreamEndedEarlyError`), never a whole answer.
An ``error`` event in the stream (vLLM sends one when generation fails mid-way) is a
transient error before the first text delta and a broken stream after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx2
import openai

from rl_conductor.workers.base import Message, WorkerError
from rl_conductor.workers.kinds import PoolConfigError, register_kind
from rl_conductor.workers.live.base import LiveWorker, WireResult, common_settings, usage_count, wrap_cache
from rl_conductor.workers.live.resilience import (
    MalformedResponseError,
    TransientWorkerError,
    classify_sdk_error,
)
from rl_conductor.workers.live.secrets import redact

#: placeholder key for servers that need none (the SDK insists on some value)
NO_KEY = "EMPTY"


@dataclass(kw_only=True)
class OpenAIChatWorker(LiveWorker):
    """A worker behind an OpenAI-compatible ``/chat/completions`` endpoint."""

    stream_end_marker: ClassVar[str] = "a chunk with finish_reason, then [DONE]"

    max_tokens_field: str = "max_tokens"
    #: extra request fields the server understands (e.g. vLLM's ``chat_template_kwargs``)
    extra_body: dict[str, Any] | None = None

    def _make_client(self, http_client: httpx2.AsyncClient) -> Any:
        return openai.AsyncOpenAI(
            api_key=self.api_key or NO_KEY,
            base_url=self.base_url,
            http_client=http_client,
            max_retries=0,
            timeout=self.timeout_s + 5.0,
        )

    def _request(self, messages: Sequence[Message], max_tokens: int, temperature: float) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "temperature": temperature,
            self.max_tokens_field: max_tokens,
        }
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    async def _send(self, client: Any, request: dict[str, Any]) -> WireResult:
        resp = await client.chat.completions.create(**request)
        try:
            choice = resp.choices[0]
            text = choice.message.content
            finish = choice.finish_reason or ""
        except (AttributeError, IndexError, KeyError, TypeError):
            raise MalformedResponseError(
                f"{self.info.name}: response has no choices[0].message: {redact(str(resp))[:200]}"
            ) from None
        if text is not None and not isinstance(text, str):
            raise MalformedResponseError(f"{self.info.name}: message content is not text")
        return _result(text or "", getattr(resp, "usage", None), str(finish))

    async def _send_stream(
        self, client: Any, request: dict[str, Any], on_delta: Callable[[str], None]
    ) -> WireResult:
        stream = await client.chat.completions.create(
            **request,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts: list[str] = []
        finish = ""
        usage: Any = None
        try:
            async for chunk in stream:
                usage = getattr(chunk, "usage", None) or usage
                for choice in getattr(chunk, "choices", None) or []:
                    if getattr(choice, "index", 0) != 0:
                        continue
                    text = getattr(choice.delta, "content", None) if choice.delta is not None else None
                    if text is not None and not isinstance(text, str):
                        raise MalformedResponseError(f"{self.info.name}: a chunk's content is not text")
                    if text:
                        parts.append(text)
                        on_delta(text)
                    finish = choice.finish_reason or finish
        except openai.APIError as exc:
            if type(exc) is not openai.APIError:  # connection, timeout, status: classified as usual
                raise
            raise TransientWorkerError(
                f"{self.info.name}: the stream reported an error: {redact(exc.message)[:300]}"
            ) from None
        finally:
            await stream.close()
        return _result("".join(parts), usage, str(finish))

    def _classify(self, exc: Exception) -> WorkerError | None:
        return classify_sdk_error(self.info.name, exc, openai)


def _result(text: str, usage: Any, finish: str) -> WireResult:
    """A result with the billed tokens of an OpenAI ``usage`` object (None where it has none)."""
    in_tok = usage_count(usage, "prompt_tokens")
    out_tok = usage_count(usage, "completion_tokens")
    # completion_tokens already include completion_tokens_details.reasoning_tokens (OpenAI,
    # vLLM); a server reporting more reasoning than completion tokens is charged the larger
    reasoning = usage_count(getattr(usage, "completion_tokens_details", None), "reasoning_tokens")
    if out_tok is not None and reasoning is not None:
        out_tok = max(out_tok, reasoning)
    return WireResult(text=text, input_tokens=in_tok, output_tokens=out_tok, finish_reason=finish)


@register_kind("openai")
def build_openai(spec: dict[str, Any], options: dict[str, Any]) -> Any:
    """Builder for ``kind: openai`` (see the module docstring for the entry's fields)."""
    settings = common_settings(spec, options, needs_key=False)
    if settings["base_url"] is None:
        settings["base_url"] = "https://api.openai.com/v1"
        if settings["api_key"] is None:
            raise PoolConfigError(
                f"worker {spec['name']!r}: OpenAI itself needs `api_key_env`; "
                "set `base_url` for a server of your own"
            )
    field = str(spec.get("max_tokens_field", "max_tokens"))
    if field not in ("max_tokens", "max_completion_tokens"):
        raise PoolConfigError(
            f"worker {spec['name']!r}: max_tokens_field must be max_tokens or max_completion_tokens"
        )
    extra = spec.get("extra_body")
    if extra is not None and not isinstance(extra, dict):
        raise PoolConfigError(f"worker {spec['name']!r}: extra_body must be a mapping")
    worker = OpenAIChatWorker(max_tokens_field=field, extra_body=extra, **settings)
    return wrap_cache(worker, spec, options)
