"""The wire formats of the predictor: what a client may send, checked before anything runs.

Why a module of its own: the HTTP adapters (KServe v1/v2, the OpenAI-compatible route) accept
different envelopes, but every one of them carries the same question and limits. This module
checks the envelope's *shape* (unknown fields, wrong types, an empty question) with pydantic and
hands the fields to :func:`rl_conductor.serving.request.parse_request`, which checks the *values*
(finite positive budgets, known sensitivity, step counts) once for every front door. Either
check raises :class:`WireError`, whose message names the field, and the adapters answer 4xx.

Deliberate simplifications:
- The server's pool is fixed at start: a request cannot name another pool (``pool`` is rejected).
- OpenAI messages: the question is the last ``user`` message (text, or its text parts joined);
  the messages around it (system/developer prompts, earlier turns) are put in front of it under
  a ``[Conversation so far]`` marker, so the Conductor plans for them and every worker sees them
  as part of the question (and the budget pays for them). ``temperature`` and ``max_tokens`` /
  ``max_completion_tokens`` apply to the workflow's final step; the other common SDK fields
  (:data:`IGNORED_CHAT_FIELDS`) are accepted and ignored; ``n`` > 1 and tools are refused.
- A v2 body may carry only the fields of the v2 protocol (:func:`check_v2_body`); the limits go
  in the request's ``parameters``, each a bool, a number or a string (``allowed_workers`` is a
  comma-separated string there), checked here so that KServe's own model never answers a 422.
  A binary-extension body is turned into the same JSON request (:func:`v2_binary_to_json`); the
  response is JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from rl_conductor.limits import Sensitivity
from rl_conductor.serving.request import (
    MAX_BATCH,
    ConductorRequest,
    RequestError,
    capped_amount,
    check_batch,
    parse_request,
)

#: Largest request body the server reads (bytes); bigger ones get 413.
MAX_BODY_BYTES = 1_000_000
#: Most instances in one v1/v2 request.
MAX_INSTANCES = MAX_BATCH


class WireError(ValueError):
    """A request is malformed; ``str(exc)`` says which field and why, ``status`` is the HTTP code."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


#: The branch names pydantic appends to the location of a union's error (``max_cost_usd.float``).
_UNION_BRANCHES = {"float", "int", "bool", "str"}


def _errors(exc: ValidationError, prefix: str = "") -> str:
    """One ``field: message`` per field (a union's failed branches are one field)."""
    parts: dict[str, list[tuple[str, str]]] = {}
    for e in exc.errors():
        path = [str(p) for p in e["loc"]]
        if len(path) > 1 and path[-1] in _UNION_BRANCHES:
            path.pop()
        loc = ".".join(path)
        where = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "request")
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        parts.setdefault(where, []).append((e["type"], msg))
    out = []
    for where, errs in parts.items():
        types = {t for t, _ in errs}
        msg = "Input should be a number" if {"float_type", "int_type"} <= types else errs[0][1]
        out.append(f"{where}: {msg}")
    return "; ".join(out)


class WireLimits(BaseModel):
    """The request-time limits every envelope may carry (values and caps checked by
    serving.request, with :mod:`rl_conductor.limits`'s caps)."""

    model_config = ConfigDict(extra="forbid")

    max_cost_usd: StrictFloat | StrictInt | None = Field(
        default=None, description="hard budget in USD for all worker calls of the request"
    )
    max_latency_s: StrictFloat | StrictInt | None = Field(
        default=None,
        description="deadline in seconds for the whole request; steps that cannot answer in time "
        "are skipped or shortened and the response says so (deadline_cut)",
    )
    sensitivity: Sensitivity = Field(
        default="public", description="'private' keeps the request on self-hosted workers"
    )
    allowed_workers: list[StrictStr] | None = Field(
        default=None, description="worker names that may be called"
    )
    max_steps: StrictInt | None = Field(default=None, description="most steps the workflow may run")
    max_rounds: StrictInt | None = Field(
        default=None,
        description="rounds the Conductor may use: after each but the last it reads the answers so "
        "far and keeps them or adds steps (default: the served model's; 1 = plan once)",
    )
    max_calls: StrictInt | None = Field(default=None, description="most worker calls over all rounds")

    @field_validator("max_cost_usd", "max_latency_s")
    @classmethod
    def _cap(cls, v: float | None, info: ValidationInfo) -> float | None:
        return v if v is None else capped_amount(str(info.field_name), v)  # the request's own check


class Instance(WireLimits):
    """One v1 instance: a question with its limits."""

    question: StrictStr


def to_request(fields: dict[str, Any], prefix: str = "") -> ConductorRequest:
    """Library-validated request from already shape-checked fields (None values dropped)."""
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
    requests = [parse_instance(raw, f"instances.{i}.") for i, raw in enumerate(instances)]
    check_batch_budget(requests, "instances")
    return requests


def check_batch_budget(requests: list[ConductorRequest], where: str) -> None:
    """:func:`rl_conductor.serving.request.check_batch` as a 400."""
    try:
        check_batch(requests, where)
    except RequestError as exc:
        raise WireError(str(exc)) from None


def parse_v2_parameters(params: Any) -> dict[str, Any]:
    """The limits of a v2 request ride in its ``parameters`` (applied to every question).

    A v2 parameter is a bool, a number or a string (the Open Inference Protocol has no lists), so
    ``allowed_workers`` is a comma-separated string there (``"local-a,local-b"``)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise WireError(f"parameters: expected an object, got {_kind(params)}")
    for key, value in params.items():
        if value is None or isinstance(value, list | dict):
            form = "a comma-separated string" if key == "allowed_workers" else "a bool, a number or a string"
            grpc = " (the {'int64_param': ...} form is gRPC's; over HTTP send the value itself)"
            raise WireError(
                f"parameters.{key}: a v2 parameter is a bool, a number or a string, got {_kind(value)}; "
                f"send {form}" + (grpc if isinstance(value, dict) else "")
            )
    workers = params.get("allowed_workers")
    if isinstance(workers, str):
        params = {**params, "allowed_workers": [w.strip() for w in workers.split(",") if w.strip()]}
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

    include_usage: StrictBool | None = None
    continuous_usage_stats: StrictBool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"] = Field(description="only plain text answers are produced")


#: OpenAI SDK fields accepted for compatibility and ignored (what they would tune is the
#: workers' sampling, which the Conductor's plan and the pool decide).
IGNORED_CHAT_FIELDS = (
    "stop",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "user",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "response_format",
    "stream_options",
    "metadata",
    "store",
    "service_tier",
    "reasoning_effort",
    "parallel_tool_calls",
    "modalities",
    "prediction",
    "web_search_options",
    "safety_identifier",
    "prompt_cache_key",
    "verbosity",
)
#: Fields that ask for something the Conductor cannot give: a clear 400, not silence.
_REFUSED_CHAT_FIELDS = {
    "tools": "tool calls are not supported; the Conductor answers in text",
    "tool_choice": "tool calls are not supported; the Conductor answers in text",
    "functions": "function calls are not supported; the Conductor answers in text",
    "function_call": "function calls are not supported; the Conductor answers in text",
    "audio": "audio output is not supported",
}


class ChatCompletionRequest(WireLimits):
    """The OpenAI chat-completions body, plus the Conductor's limits as top-level fields."""

    model: StrictStr
    messages: list[Message] = Field(min_length=1)
    stream: StrictBool = False  # "true" (a string) is a 400, not a stream
    stream_options: StreamOptions | None = None
    n: StrictInt | None = None
    user: StrictStr | None = None
    temperature: StrictFloat | StrictInt | None = Field(default=None, ge=0, le=2)
    top_p: StrictFloat | StrictInt | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    stop: StrictStr | list[StrictStr] | None = None
    presence_penalty: StrictFloat | StrictInt | None = None
    frequency_penalty: StrictFloat | StrictInt | None = None
    seed: StrictInt | None = None
    logit_bias: dict[str, StrictFloat | StrictInt] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    response_format: ResponseFormat | None = None
    metadata: dict[str, StrictStr] | None = None
    store: StrictBool | None = None
    service_tier: StrictStr | None = None
    reasoning_effort: StrictStr | None = None
    parallel_tool_calls: StrictBool | None = None
    modalities: list[StrictStr] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    verbosity: StrictStr | None = None

    @field_validator("metadata")
    @classmethod
    def _no_limits_in_metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        # OpenAI's metadata is free-form tags; a limit placed there would be silently ignored (a
        # "private" request answered as public): refuse it and say where it goes
        misplaced = sorted(k for k in v or {} if k.strip().lower() in WireLimits.model_fields)
        if misplaced:
            raise ValueError(
                f"{', '.join(misplaced)} is a top-level field of the request (extra_body in the "
                "OpenAI SDK), not metadata"
            )
        return v

    def question(self) -> str:
        """The last user message, with the rest of the conversation in front of it."""
        last = next(
            (i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i].role == "user"), None
        )
        if last is None:
            raise WireError("messages: needs at least one message with role 'user'", param="messages")
        current = _text(self.messages[last])
        context = [m for i, m in enumerate(self.messages) if i != last]
        if not context:
            return current
        lines = [f"{m.role}: {_text(m)}" for m in context]
        return "[Conversation so far]\n" + "\n\n".join(lines) + "\n\n[Current message]\n" + current

    def limits(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in WireLimits.model_fields}

    def final_step(self) -> dict[str, Any]:
        """Sampling settings for the workflow's final step (``temperature``, ``max_tokens``)."""
        out: dict[str, Any] = {}
        if self.temperature is not None:
            out["temperature"] = float(self.temperature)
        cap = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if cap is not None:
            out["max_tokens"] = int(cap)
        return out


def _text(message: Message) -> str:
    if isinstance(message.content, str):
        return message.content
    return "\n".join(p.text for p in message.content)


def parse_chat(body: Any) -> tuple[ChatCompletionRequest, ConductorRequest]:
    """Shape-check an OpenAI chat body and turn it into a library request."""
    if not isinstance(body, dict):
        raise WireError(f"expected a JSON object (an OpenAI chat completion request), got {_kind(body)}")
    for name, why in _REFUSED_CHAT_FIELDS.items():
        if body.get(name) not in (None, [], "none"):
            raise WireError(f"{name}: {why}", param=name)
        body = {k: v for k, v in body.items() if k != name}
    if isinstance(body.get("n"), int) and not isinstance(body.get("n"), bool) and body["n"] != 1:
        raise WireError(f"n: only n=1 is supported (one answer per request), got {body['n']}", param="n")
    try:
        chat = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]["loc"]
        raise WireError(_errors(exc), param=str(first[0]) if first else None) from None
    return chat, to_request({"question": chat.question(), **chat.limits()})


#: Fields of a v2 request, of one of its input tensors, of one requested output.
_V2_FIELDS = {"id", "inputs", "outputs", "parameters"}
_V2_INPUT_FIELDS = {"name", "shape", "datatype", "data", "parameters"}
_V2_OUTPUT_FIELDS = {"name", "parameters"}
_V2_OUTPUT_PARAMETERS = {"binary_data"}


def check_v2_body(doc: Any) -> None:
    """Unknown or misplaced fields of a v2 JSON body are errors naming the field (KServe's own
    model drops them, so a misplaced ``sensitivity`` would be silently ignored)."""
    if not isinstance(doc, dict):
        raise WireError(f"expected a JSON object (a v2 inference request), got {_kind(doc)}")
    for key in sorted(set(doc) - _V2_FIELDS):
        hint = " (limits such as this go in 'parameters')" if key in WireLimits.model_fields else ""
        raise WireError(f"{key}: unknown field of a v2 request{hint}")
    if doc.get("id") is not None and not isinstance(doc["id"], str):
        raise WireError(f"id: expected a string, got {_kind(doc['id'])}")
    parse_v2_parameters(doc.get("parameters"))  # KServe's own model would answer a raw 422
    inputs = doc.get("inputs")
    if not isinstance(inputs, list):
        raise WireError("inputs: expected a list of tensors")
    names: set[Any] = set()
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict):
            raise WireError(f"inputs.{i}: expected a tensor object, got {_kind(tensor)}")
        for key in sorted(set(tensor) - _V2_INPUT_FIELDS):
            raise WireError(f"inputs.{i}.{key}: unknown field of a v2 tensor")
        name = tensor.get("name")
        for key in ("name", "datatype"):
            if not isinstance(tensor.get(key), str):
                raise WireError(f"inputs.{i}.{key}: expected a string, got {_kind(tensor.get(key))}")
        if isinstance(name, str) and name in names:
            raise WireError(f"inputs.{i}.name: a second input named {name!r}; each input name appears once")
        names.add(name)
        _check_shape(tensor, f"inputs.{i}")
        params = tensor.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise WireError(f"inputs.{i}.parameters: expected an object, got {_kind(params)}")
        for key in sorted(params or {}):
            raise WireError(
                f"inputs.{i}.parameters.{key}: unknown field (the request's limits go in its top-level "
                "'parameters')"
            )
    outputs = doc.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise WireError("outputs: expected a list")
        for i, out in enumerate(outputs):
            if not isinstance(out, dict):
                raise WireError(f"outputs.{i}: expected an object, got {_kind(out)}")
            for key in sorted(set(out) - _V2_OUTPUT_FIELDS):
                raise WireError(f"outputs.{i}.{key}: unknown field of a v2 output")
            if not isinstance(out.get("name"), str):
                raise WireError(f"outputs.{i}.name: expected a string, got {_kind(out.get('name'))}")
            oparams = out.get("parameters")
            if oparams is not None and not isinstance(oparams, dict):
                raise WireError(f"outputs.{i}.parameters: expected an object, got {_kind(oparams)}")
            for key in sorted(set(oparams or {}) - _V2_OUTPUT_PARAMETERS):
                raise WireError(f"outputs.{i}.parameters.{key}: unknown field")


def _check_shape(tensor: dict[str, Any], where: str) -> None:
    """A tensor's ``shape`` is a list of counts whose product is the number of its data elements."""
    shape = tensor.get("shape")
    if shape is None:
        raise WireError(f"{where}.shape: required (a list of counts, [n] for n questions)")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise WireError(f"{where}.shape: expected a list of counts (integers >= 0), got {shape!r}"[:300])
    data = tensor.get("data")
    if not isinstance(data, list):
        return  # checked where the data is read
    count = _elements_count(data)
    if math.prod(shape) != count:
        raise WireError(f"{where}.shape: {shape} holds {math.prod(shape)} elements, but data has {count}")


def _elements_count(data: list[Any]) -> int:
    """Elements of a flat or nested data list (the v2 protocol allows both)."""
    return sum(_elements_count(x) if isinstance(x, list) else 1 for x in data)


def v2_binary_to_json(body: bytes, header_length: str) -> dict[str, Any]:
    """The JSON request a v2 binary-extension body stands for: the JSON header's tensors with
    their ``binary_data_size`` bytes decoded (BYTES: 4-byte little-endian length + UTF-8 text per
    element). Any inconsistency is a :class:`WireError` naming what is wrong."""
    if not header_length.strip().isdigit():
        raise WireError(f"Inference-Header-Content-Length: expected a byte count, got {header_length!r}")
    n = int(header_length)
    if n > len(body):
        raise WireError(f"Inference-Header-Content-Length: {n} is more than the body's {len(body)} bytes")
    doc = loads(body[:n])
    if not isinstance(doc, dict):
        raise WireError(f"the JSON header: expected a v2 inference request object, got {_kind(doc)}")
    params = doc.get("parameters")
    if isinstance(params, dict):  # the response is JSON whatever the client asked
        doc["parameters"] = {k: v for k, v in params.items() if k != "binary_data_output"}
    inputs = doc.get("inputs")
    if not isinstance(inputs, list):
        raise WireError("inputs: expected a list of tensors")
    rest = body[n:]
    offset = 0
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict) or not isinstance(tensor.get("parameters"), dict):
            continue
        tparams = dict(tensor["parameters"])
        if "binary_data_size" not in tparams:
            continue
        size = tparams.pop("binary_data_size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise WireError(f"inputs.{i}.parameters.binary_data_size: expected a byte count, got {size!r}")
        if "data" in tensor:
            raise WireError(f"inputs.{i}: has both 'data' and binary_data_size")
        if tensor.get("datatype") != "BYTES":
            raise WireError(f"inputs.{i}: binary data is read only for BYTES tensors")
        if offset + size > len(rest):
            raise WireError(
                f"inputs.{i}.parameters.binary_data_size: {size} bytes, but only {len(rest) - offset} follow"
            )
        tensor["data"] = _bytes_elements(rest[offset : offset + size], f"inputs.{i}")
        offset += size
        if tparams:
            tensor["parameters"] = tparams
        else:
            del tensor["parameters"]
    if offset != len(rest):
        raise WireError(f"{len(rest) - offset} bytes of binary data follow the tensors' binary_data_size")
    return doc


def _bytes_elements(chunk: bytes, where: str) -> list[str]:
    out, p = [], 0
    while p < len(chunk):
        if p + 4 > len(chunk):
            raise WireError(f"{where}: binary data ends inside an element's 4-byte length")
        size = int.from_bytes(chunk[p : p + 4], "little")
        p += 4
        if p + size > len(chunk):
            raise WireError(f"{where}: an element of {size} bytes overruns the tensor's binary data")
        try:
            out.append(chunk[p : p + size].decode("utf-8"))
        except UnicodeDecodeError:
            raise WireError(f"{where}: an element is not UTF-8 text") from None
        p += size
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r} in an object (which one counts would be a guess)")
        seen.add(key)
    return dict(pairs)


def loads(raw: bytes | str) -> Any:
    """Strict JSON: ``NaN`` and ``Infinity`` are errors (as in KServe's orjson), not floats, and so
    is an object with the same key twice (parsers disagree on which one wins)."""
    try:
        return json.loads(raw, parse_constant=_no_constants, object_pairs_hook=_no_duplicate_keys)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise WireError(f"the body is not valid JSON: {exc}") from None


def _kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer"}
    return {**kinds, float: "a number", type(None): "null"}.get(type(value), f"a {type(value).__name__}")
