"""A local OpenAI-compatible server that behaves as llama.cpp's and vLLM's do at the edges.

Why: "bring your own OpenAI-compatible server" (docs/byo-openai-server.md) fails in three
ways that the pool file decides: the base URL (llama.cpp's ``llama-server`` and ``vllm serve``
answer under ``/v1``, not KServe's ``/openai/v1``), the API key (``--api-key``: a missing or
wrong ``Authorization: Bearer`` gets 401) and the model name (vLLM: 404 for a model it does not
serve). This server reproduces those answers with llama.cpp's error bodies, so the docs, ``pool
check`` and the live client are tested against what such a server really sends, without
building llama.cpp here. It is a :class:`~rl_conductor.workers.live.testing.ScriptedServer`
(a real HTTP server on a loopback port) whose default reply is computed per request.

Routes: ``GET {prefix}/models``, ``POST {prefix}/chat/completions`` (OpenAI's response shape with
``usage``: prompt tokens counted as whitespace-separated words of the messages plus 4 a message,
completion tokens as the words of the answer); anything else is 404 ``File Not Found``.
Simplifications: no streaming, no tokenizer, the answer is a fixed text.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rl_conductor.workers.live.testing import Reply, Request, ScriptedServer, success_body

DEFAULT_ANSWER = "OK. The answer is 42."


def _error(status: int, message: str, kind: str) -> Reply:
    return Reply(status=status, body={"error": {"code": status, "message": message, "type": kind}})


def _prompt_tokens(body: Any) -> int:
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return 0
    return sum(len(str(m.get("content", "")).split()) + 4 for m in messages if isinstance(m, dict))


def responder(
    *,
    prefix: str = "/v1",
    api_key: str | None = None,
    model: str = "local-model",
    answer: str = DEFAULT_ANSWER,
) -> Any:
    """The per-request reply function (see the module docstring)."""
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""

    def reply(req: Request) -> Reply:
        path = req.path.split("?", 1)[0]
        if api_key is not None and req.headers.get("authorization") != f"Bearer {api_key}":
            return _error(401, "Invalid API Key", "authentication_error")
        if req.method == "GET" and path == f"{prefix}/models":
            return Reply(
                body={"object": "list", "data": [{"id": model, "object": "model", "owned_by": "me"}]}
            )
        if req.method != "POST" or path != f"{prefix}/chat/completions":
            return _error(404, "File Not Found", "not_found_error")
        body = req.body if isinstance(req.body, dict) else {}
        if body.get("model") != model:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "not_found_error")
        cap = body.get("max_tokens") or body.get("max_completion_tokens") or 256
        words = answer.split()[: int(cap)]
        return Reply(
            body=success_body(
                "openai",
                " ".join(words),
                input_tokens=_prompt_tokens(body),
                output_tokens=len(words),
                model=model,
            )
        )

    return reply


@contextmanager
def byo_openai_server(
    *,
    prefix: str = "/v1",
    api_key: str | None = None,
    model: str = "local-model",
    answer: str = DEFAULT_ANSWER,
) -> Iterator[ScriptedServer]:
    """Run the server for a ``with`` block; ``server.root + prefix`` is its base URL."""
    server = ScriptedServer(
        "openai", default=responder(prefix=prefix, api_key=api_key, model=model, answer=answer)
    ).start()
    try:
        yield server
    finally:
        server.stop()
