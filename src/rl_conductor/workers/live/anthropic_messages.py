"""Anthropic Messages (``kind: anthropic``), through the official ``anthropic`` SDK.

Pool entry::

    - name: claude
      kind: anthropic
      model: claude-sonnet-4-5
      api_key_env: ANTHROPIC_API_KEY       # required
      base_url: https://api.anthropic.com  # the default; the SDK appends /v1/messages

Extended thinking (``thinking_budget_tokens: N``, at least 1,024) sends ``thinking: {type:
enabled, budget_tokens: b}`` with ``b = min(N, max_tokens - 64)``: Anthropic bills thinking as
output tokens, inside ``usage.output_tokens``, and ``budget_tokens`` must stay below
``max_tokens``, so the ``max_tokens`` the executor reserved still bounds every billed output
token; a call whose ``max_tokens`` leaves less than 1,024 for thinking is sent without it.

``temperature`` is not sent by default: this SDK version (anthropic 2.x) no longer takes it for
the current models; ``send_temperature: true`` sends it in the body for servers that still do.
System messages go to the API's ``system`` field; the rest keep their order. Usage comes from
``usage.input_tokens`` plus ``cache_creation_input_tokens`` and ``cache_read_input_tokens``
(prompt caching reports those apart from ``input_tokens``; they are charged at the input price)
and ``usage.output_tokens`` (thinking included); ``stop_reason: max_tokens`` is reported as
``finish_reason: length`` (cut at ``max_tokens``), any other stop as ``stop``.

Streaming (the call that answers a ``stream: true`` request): ``stream=True``; text comes in
``content_block_delta`` events (``text_delta``; thinking deltas are not passed on), input usage in
``message_start``, the final output count and the stop reason in ``message_delta``. A stream that
ends without its ``message_delta`` stop reason was cut (:class:`.base.StreamEndedEarlyError`):
never a whole answer, and never billed by ``message_start``'s placeholder output count. An ``error``
event mid-stream (``overloaded_error``) is a transient error before the first text delta and a
broken stream after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import anthropic
import httpx2

from rl_conductor.limits import MIN_OUTPUT_TOKENS
from rl_conductor.workers.base import Message, WorkerError
from rl_conductor.workers.kinds import PoolConfigError, register_kind
from rl_conductor.workers.live.base import LiveWorker, WireResult, common_settings, usage_count, wrap_cache
from rl_conductor.workers.live.resilience import (
    MalformedResponseError,
    TransientWorkerError,
    classify_sdk_error,
)
from rl_conductor.workers.live.secrets import redact

DEFAULT_BASE_URL = "https://api.anthropic.com"
#: the smallest ``budget_tokens`` the Messages API accepts
MIN_THINKING_BUDGET = 1024


@dataclass(kw_only=True)
class AnthropicWorker(LiveWorker):
    """A worker behind the Anthropic Messages API."""

    stream_end_marker: ClassVar[str] = "message_delta with stop_reason, then message_stop"

    send_temperature: bool = False
    #: most extended-thinking tokens a call may spend (None: thinking is not requested)
    thinking_budget_tokens: int | None = None

    def _make_client(self, http_client: httpx2.AsyncClient) -> Any:
        return anthropic.AsyncAnthropic(
            api_key=self.api_key,
            base_url=self.base_url,
            http_client=http_client,
            max_retries=0,
            timeout=self.timeout_s + 5.0,
        )

    def _request(self, messages: Sequence[Message], max_tokens: int, temperature: float) -> dict[str, Any]:
        system = "\n\n".join(m.get("content", "") for m in messages if m.get("role") == "system")
        chat = [
            {"role": m.get("role", "user"), "content": m.get("content", "")}
            for m in messages
            if m.get("role") != "system"
        ]
        kwargs: dict[str, Any] = {"system": system} if system else {}
        if self.send_temperature:
            kwargs["extra_body"] = {"temperature": temperature}
        if self.thinking_budget_tokens is not None:
            budget = min(self.thinking_budget_tokens, max_tokens - MIN_OUTPUT_TOKENS)
            if budget >= MIN_THINKING_BUDGET:
                kwargs["thinking"] = {"type": "enabled", "budget_tokens": budget}
        return {"model": self.model, "max_tokens": max_tokens, "messages": chat, **kwargs}

    async def _send(self, client: Any, request: dict[str, Any]) -> WireResult:
        resp = await client.messages.create(**request)
        try:
            parts = [b.text for b in resp.content if getattr(b, "type", "") == "text"]
            stop = resp.stop_reason
        except (AttributeError, TypeError):
            raise MalformedResponseError(
                f"{self.info.name}: response has no content blocks: {redact(str(resp))[:200]}"
            ) from None
        if not all(isinstance(p, str) for p in parts):
            raise MalformedResponseError(f"{self.info.name}: a text block holds no text")
        usage = getattr(resp, "usage", None)
        return WireResult(
            text="".join(parts),
            input_tokens=usage_count(usage, *_INPUT_FIELDS),
            output_tokens=usage_count(usage, "output_tokens"),
            finish_reason=_finish(stop),
        )

    async def _send_stream(
        self, client: Any, request: dict[str, Any], on_delta: Callable[[str], None]
    ) -> WireResult:
        stream = await client.messages.create(**request, stream=True)
        parts: list[str] = []
        stop: str | None = None
        in_tok: int | None = None
        out_tok: int | None = None
        try:
            async for event in stream:
                kind = getattr(event, "type", "")
                if kind == "message_start":
                    usage = getattr(event.message, "usage", None)
                    in_tok = usage_count(usage, *_INPUT_FIELDS)
                    out_tok = usage_count(usage, "output_tokens")
                elif kind == "content_block_delta" and getattr(event.delta, "type", "") == "text_delta":
                    text = event.delta.text
                    if not isinstance(text, str):
                        raise MalformedResponseError(f"{self.info.name}: a text delta holds no text")
                    parts.append(text)
                    on_delta(text)
                elif kind == "message_delta":
                    stop = getattr(event.delta, "stop_reason", None) or stop
                    usage = getattr(event, "usage", None)
                    out_tok = usage_count(usage, "output_tokens") or out_tok  # the final count
                    later_in = usage_count(usage, *_INPUT_FIELDS)
                    if later_in is not None:
                        in_tok = max(in_tok or 0, later_in)
        except anthropic.APIStatusError as exc:
            if exc.status_code >= 400:
                raise
            # an `error` event after a 200 status line (overloaded_error mid-stream)
            body = exc.body if isinstance(exc.body, dict) else {}
            err = body.get("error") if isinstance(body.get("error"), dict) else {}
            what = f"{err.get('type', 'error')}: {err.get('message', '')}" if err else exc.message
            raise TransientWorkerError(
                f"{self.info.name}: the stream reported an error: {redact(str(what))[:300]}"
            ) from None
        finally:
            await stream.close()
        return WireResult(
            text="".join(parts), input_tokens=in_tok, output_tokens=out_tok, finish_reason=_finish(stop)
        )

    def _classify(self, exc: Exception) -> WorkerError | None:
        return classify_sdk_error(self.info.name, exc, anthropic)


#: the usage fields of billed input: prompt-cache writes and reads are reported apart
_INPUT_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _finish(stop: str | None) -> str:
    return "length" if stop == "max_tokens" else ("stop" if stop else "")


@register_kind("anthropic")
def build_anthropic(spec: dict[str, Any], options: dict[str, Any]) -> Any:
    """Builder for ``kind: anthropic`` (``api_key_env`` required; see the module docstring)."""
    settings = common_settings(spec, options, needs_key=True)
    settings["base_url"] = settings["base_url"] or DEFAULT_BASE_URL
    send = spec.get("send_temperature", False)
    if not isinstance(send, bool):
        raise PoolConfigError(f"worker {spec['name']!r}: send_temperature must be true or false")
    thinking = spec.get("thinking_budget_tokens")
    if thinking is not None:
        if isinstance(thinking, bool) or not isinstance(thinking, int) or thinking < MIN_THINKING_BUDGET:
            raise PoolConfigError(
                f"worker {spec['name']!r}: thinking_budget_tokens must be an integer >= {MIN_THINKING_BUDGET}"
            )
        if send:
            raise PoolConfigError(
                f"worker {spec['name']!r}: extended thinking takes no temperature; drop send_temperature"
            )
    worker = AnthropicWorker(send_temperature=send, thinking_budget_tokens=thinking, **settings)
    return wrap_cache(worker, spec, options)
