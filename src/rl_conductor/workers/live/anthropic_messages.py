"""Anthropic Messages (``kind: anthropic``), through the official ``anthropic`` SDK.

Pool entry::

    - name: claude
      kind: anthropic
      model: claude-sonnet-4-5
      api_key_env: ANTHROPIC_API_KEY       # required
      base_url: https://api.anthropic.com  # the default; the SDK appends /v1/messages

``temperature`` is not sent by default: this SDK version (anthropic 2.x) no longer takes it for
the current models; ``send_temperature: true`` sends it in the body for servers that still do.
System messages go to the API's ``system`` field; the rest keep their order. Usage comes from
``usage.input_tokens`` / ``usage.output_tokens``; ``stop_reason: max_tokens`` is reported as
``finish_reason: length`` (cut at ``max_tokens``), any other stop as ``stop``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2

from rl_conductor.workers.base import Message, WorkerError
from rl_conductor.workers.live.base import LiveWorker, WireResult, common_settings, wrap_cache
from rl_conductor.workers.live.resilience import MalformedResponseError, classify_sdk_error
from rl_conductor.workers.live.secrets import redact
from rl_conductor.workers.pool import PoolConfigError, register_kind

DEFAULT_BASE_URL = "https://api.anthropic.com"


@dataclass(kw_only=True)
class AnthropicWorker(LiveWorker):
    """A worker behind the Anthropic Messages API."""

    send_temperature: bool = False

    def _make_client(self, http_client: httpx2.AsyncClient) -> Any:
        return anthropic.AsyncAnthropic(
            api_key=self.api_key,
            base_url=self.base_url,
            http_client=http_client,
            max_retries=0,
            timeout=self.timeout_s + 5.0,
        )

    async def _send(
        self, client: Any, messages: Sequence[Message], max_tokens: int, temperature: float
    ) -> WireResult:
        system = "\n\n".join(m.get("content", "") for m in messages if m.get("role") == "system")
        chat = [
            {"role": m.get("role", "user"), "content": m.get("content", "")}
            for m in messages
            if m.get("role") != "system"
        ]
        kwargs: dict[str, Any] = {"system": system} if system else {}
        if self.send_temperature:
            kwargs["extra_body"] = {"temperature": temperature}
        resp = await client.messages.create(model=self.model, max_tokens=max_tokens, messages=chat, **kwargs)
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
        in_tok = getattr(usage, "input_tokens", None) if usage is not None else None
        out_tok = getattr(usage, "output_tokens", None) if usage is not None else None
        return WireResult(
            text="".join(parts),
            input_tokens=in_tok if isinstance(in_tok, int) else None,
            output_tokens=out_tok if isinstance(out_tok, int) else None,
            finish_reason="length" if stop == "max_tokens" else ("stop" if stop else ""),
        )

    def _classify(self, exc: Exception) -> WorkerError | None:
        return classify_sdk_error(self.info.name, exc, anthropic)


@register_kind("anthropic")
def build_anthropic(spec: dict[str, Any], options: dict[str, Any]) -> Any:
    """Builder for ``kind: anthropic`` (``api_key_env`` required; see the module docstring)."""
    settings = common_settings(spec, options, needs_key=True)
    settings["base_url"] = settings["base_url"] or DEFAULT_BASE_URL
    send = spec.get("send_temperature", False)
    if not isinstance(send, bool):
        raise PoolConfigError(f"worker {spec['name']!r}: send_temperature must be true or false")
    return wrap_cache(AnthropicWorker(send_temperature=send, **settings), spec, options)
