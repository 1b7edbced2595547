"""The wire formats of the predictor: what a client may send, checked before anything runs.

Why a module of its own: the HTTP adapters (KServe v1/v2, the OpenAI-compatible route) accept
different envelopes, but every one of them carries the same question and limits. This module
checks the envelope's *shape* (unknown fields, wrong types, an empty question) with pydantic and
hands the fields to :func:`rl_conductor.serving_core.parse_request`, which checks the *values*
(finite positive budgets, known sensitivity, step counts) once for every front door. Either
check raises :class:`WireError`, whose message names the field, and the adapters answer 4xx.

Deliberate simplifications:
- The server's pool is fixed at start: a request cannot name another pool (``pool`` is rejected).
- OpenAI messages: the question is the last ``user`` message (text, or its text parts joined);
  earlier turns and system messages are not shown to the Conductor. ``temperature`` and
  ``max_tokens`` are accepted for SDK compatibility and ignored: the workers' sampling settings
  belong to the server.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from rl_conductor.serving_core import ConductorRequest, RequestError, parse_request

#: Largest request body the server reads (bytes); bigger ones get 413.
MAX_BODY_BYTES = 1_000_000
#: Most instances in one v1/v2 request.
MAX_INSTANCES = 64
#: Largest budget one request may state (USD): anything above is a client bug, not a budget.
MAX_BUDGET_USD = 10_000.0
#: Longest deadline one request may state (seconds): a day is a client bug, not a deadline.
MAX_LATENCY_S = 3_600.0


class WireError(ValueError):
    """A request is malformed; ``str(exc)`` says which field and why, ``status`` is the HTTP code."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def _errors(exc: ValidationError, prefix: str = "") -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"])
        where = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "request")
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


class WireLimits(BaseModel):
    """The request-time limits every envelope may carry (values checked by serving_core)."""

    model_config = ConfigDict(extra="forbid")

    max_cost_usd: StrictFloat | StrictInt | None = Field(
        default=None, description="hard budget in USD for all worker calls of the request"
    )
    max_latency_s: StrictFloat | StrictInt | None = Field(
        default=None,
        description="deadline in seconds for the whole request; steps that cannot answer in time "
        "are skipped or shortened and the response says so (deadline_cut)",
    )
    sensitivity: Literal["public", "private"] = Field(
        default="public", description="'private' keeps the request on self-hosted workers"
    )
    allowed_workers: list[StrictStr] | None = Field(
        default=None, description="worker names that may be called"
    )
    max_steps: StrictInt | None = Field(default=None, description="most steps the workflow may run")

    @field_validator("max_cost_usd")
    @classmethod
    def _budget_cap(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        if v is not None and v > MAX_BUDGET_USD:
            raise ValueError(f"at most {MAX_BUDGET_USD:g} USD per request, got {v:g}")
        return v

    @field_validator("max_latency_s")
    @classmethod
    def _deadline_cap(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        if v is not None and v > MAX_LATENCY_S:
            raise ValueError(f"at most {MAX_LATENCY_S:g} seconds per request, got {v:g}")
        return v


class Instance(WireLimits):
    """One v1 instance: a question with its limits."""

    question: StrictStr


def to_request(fields: dict[str, Any], prefix: str = "") -> ConductorRequest:
    """Library-validated request from already shape-checked fields (None values dropped)."""
    question = fields.get("question")
    if isinstance(question, str) and question and not question.strip():
        raise WireError(f"{prefix}question: must contain more than whitespace")
    try:
        return parse_request({k: v for k, v in fields.items() if v is not None})
    except RequestError as exc:
        raise WireError(f"{prefix}{exc}") from None


def parse_instance(raw: Any, prefix: str = "") -> ConductorRequest:
    """A v1 instance: an object with a ``question`` (or a bare question string)."""
    if isinstance(raw, str):
        raw = {"question": raw}
    if not isinstance(raw, dict):
        raise WireError(f"{prefix or 'instance'}: expected an object with a 'question', got {_kind(raw)}")
    if "pool" in raw:
        raise WireError(f"{prefix}pool: unknown field (the server's pool is fixed when it starts)")
    try:
        inst = Instance.model_validate(raw)
    except ValidationError as exc:
        raise WireError(_errors(exc, prefix)) from None
    return to_request(inst.model_dump(), prefix)


def parse_v1(body: Any) -> list[ConductorRequest]:
    """``{"instances": [...]}`` -> validated requests (at most :data:`MAX_INSTANCES`)."""
    if not isinstance(body, dict):
        raise WireError(f"expected a JSON object {{'instances': [...]}}, got {_kind(body)}")
    extra = set(body) - {"instances"}
    if extra:
        raise WireError(f"unknown fields {sorted(extra)}; a v1 request is {{'instances': [...]}}")
    instances = body.get("instances")
    if not isinstance(instances, list) or not instances:
        raise WireError("instances: expected a non-empty list of {'question': ...} objects")
    if len(instances) > MAX_INSTANCES:
        raise WireError(f"instances: at most {MAX_INSTANCES} per request, got {len(instances)}")
    return [parse_instance(raw, f"instances.{i}.") for i, raw in enumerate(instances)]


def parse_v2_parameters(params: Any) -> dict[str, Any]:
    """The limits of a v2 request ride in its ``parameters`` (applied to every question)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise WireError(f"parameters: expected an object, got {_kind(params)}")
    try:
        return WireLimits.model_validate(params).model_dump()
    except ValidationError as exc:
        raise WireError(_errors(exc, "parameters.")) from None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = None


class ChatCompletionRequest(WireLimits):
    """The OpenAI chat-completions body, plus the Conductor's limits as top-level fields."""

    model: StrictStr
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] | None = None
    user: StrictStr | None = None
    temperature: StrictFloat | StrictInt | None = None
    top_p: StrictFloat | StrictInt | None = None
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None

    def question(self) -> str:
        for m in reversed(self.messages):
            if m.role == "user":
                if isinstance(m.content, str):
                    return m.content
                return "\n".join(p.text for p in m.content)
        raise WireError("messages: needs at least one message with role 'user'", param="messages")

    def limits(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in WireLimits.model_fields}


def parse_chat(body: Any) -> tuple[ChatCompletionRequest, ConductorRequest]:
    """Shape-check an OpenAI chat body and turn it into a library request."""
    if not isinstance(body, dict):
        raise WireError(f"expected a JSON object (an OpenAI chat completion request), got {_kind(body)}")
    try:
        chat = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]["loc"]
        raise WireError(_errors(exc), param=str(first[0]) if first else None) from None
    return chat, to_request({"question": chat.question(), **chat.limits()})


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(raw: bytes | str) -> Any:
    """Strict JSON: ``NaN`` and ``Infinity`` are errors (as in KServe's orjson), not floats."""
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise WireError(f"the body is not valid JSON: {exc}") from None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )
