"""A request to a served Conductor and its response document: validate, turn into limits and a
task, report.

Shared by every front door (the KServe predictor, the OpenAI route, the MLflow pyfunc: all answer
through :class:`rl_conductor.serving.service.ConductorService`): a request names a question and
optional limits; the response carries
the answer, the workflow, per-step usage (every attempt, in every round), the rounds and the
total cost. A request may state a deadline (``max_latency_s``, seconds): the executor skips or
shortens steps that cannot answer in time, and the response's ``deadline_cut`` says whether it
did (the steps' ``skipped_deadline`` statuses and ``deadline:`` notes say which and how).
Validation errors raise :class:`RequestError` (the HTTP adapters turn it into a 4xx that says
what is wrong): a budget
or deadline must be a finite number above zero (JSON ``NaN``, ``"inf"`` and ``true`` are errors,
not "no budget" or $1), a question must hold text. The worker pool is
the operator's choice (or the model's own pool), never a field of the request: a client must not
point a served Conductor at a pool nobody evaluated.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from rl_conductor.limits import (
    DEFAULT_MAX_STEPS,
    MAX_CALLS,
    MAX_ROUNDS,
    MAX_SECONDS,
    MAX_STEPS,
    MAX_USD,
    SENSITIVITIES,
    SENSITIVITY_CHOICES,
    RequestLimits,
    Sensitivity,
)
from rl_conductor.reward import deadline_shortened
from rl_conductor.tasks.base import Task
from rl_conductor.trace import StepRecord
from rl_conductor.validation import InvalidValue, has_visible_text, integer_at_least, positive_finite

if TYPE_CHECKING:
    from rl_conductor.policies.base import Episode
    from rl_conductor.workers.pool import Pool, PoolView


#: The capped amounts of a request: field -> (largest value, unit), for the messages of every
#: front door; the caps are :mod:`rl_conductor.limits`'s (``MAX_USD``, ``MAX_SECONDS``), the caps
#: of every ``RequestLimits``, as are the count caps below (``MAX_STEPS``, ...).
REQUEST_CAPS: dict[str, tuple[float, str]] = {
    "max_cost_usd": (MAX_USD, "USD"),
    "max_latency_s": (MAX_SECONDS, "seconds"),
}


def capped_amount(name: str, value: Any) -> float:
    """``value`` of the capped amount ``name`` (:data:`REQUEST_CAPS`) if it is a finite number
    above 0 and within its cap; else ``ValueError`` with the one message every front door gives
    (the request model here and the wire schemas, ``serving.schemas``)."""
    cap, unit = REQUEST_CAPS[name]
    try:
        return positive_finite(name, value, cap)
    except InvalidValue:
        raise ValueError(f"must be a finite number of {unit} > 0 and <= {cap:g}, got {value!r}") from None


class RequestError(ValueError):
    """A request is malformed; the message says which field and why."""


#: Fields a request may not set, with why (the message the client gets).
FORBIDDEN_FIELDS = {
    "pool": "a request cannot choose the worker pool; the operator sets it when serving starts",
}


class ConductorRequest(BaseModel):
    """One question with its request-time limits."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=100_000)
    max_cost_usd: float | None = Field(default=None, gt=0)
    max_latency_s: float | None = Field(default=None, gt=0)
    sensitivity: Sensitivity = "public"
    allowed_workers: list[str] | None = None
    max_steps: int = Field(default=DEFAULT_MAX_STEPS, ge=1, le=MAX_STEPS)
    #: None = the served model's (its ``conductor.json``, else 1)
    max_rounds: int | None = Field(default=None, ge=1, le=MAX_ROUNDS)
    max_calls: int | None = Field(default=None, ge=1, le=MAX_CALLS)

    @field_validator("question")
    @classmethod
    def _question(cls, v: str) -> str:
        # blank also when only invisible characters (zero-width spaces, NUL, other controls/formats)
        if not has_visible_text(v):
            raise ValueError("the question is blank (only whitespace or invisible characters)")
        return v

    @field_validator("max_cost_usd", "max_latency_s", mode="before")
    @classmethod
    def _capped(cls, v: Any, info: ValidationInfo) -> Any:
        # strictly a number: pydantic's lax mode reads "inf" as infinity and true as 1.0
        return v if v is None else capped_amount(str(info.field_name), v)

    @field_validator("max_steps", "max_rounds", "max_calls", mode="before")
    @classmethod
    def _steps(cls, v: Any) -> Any:
        # strictly an integer: lax mode reads true as 1 and "3" as 3
        if v is None:
            return v
        try:
            return integer_at_least("count", v, 1)
        except InvalidValue:
            raise ValueError(f"must be an integer >= 1, got {v!r}") from None

    @field_validator("sensitivity", mode="before")
    @classmethod
    def _sens(cls, v: Any) -> Any:
        if v not in SENSITIVITIES:
            raise ValueError(f"sensitivity must be {SENSITIVITY_CHOICES}")
        return v


def parse_request(raw: Any) -> ConductorRequest:
    if isinstance(raw, str):
        raw = {"question": raw}
    if not isinstance(raw, Mapping):
        raise RequestError(f"a request must be an object with a 'question', got {type(raw).__name__}")
    for name, why in FORBIDDEN_FIELDS.items():
        if name in raw:
            raise RequestError(f"{name}: {why}")
    # JSON null means "not given"; NaN is not null (it is an error for every numeric field)
    clean = {k: v for k, v in raw.items() if v is not None}
    try:
        return ConductorRequest.model_validate(clean)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors())
        raise RequestError(msgs) from None


#: Questions one call may carry (a KServe v1/v2 batch, a pyfunc ``predict`` input).
MAX_BATCH = 64


def check_batch(requests: Sequence[ConductorRequest], where: str = "inputs") -> None:
    """The rules of a batch, on every path that takes one: at most :data:`MAX_BATCH` questions,
    and the request cap (``max_cost_usd``'s) bounds the whole batch: the budgets its questions
    state add up to at most the cap (a question without a budget states none, as alone)."""
    if len(requests) > MAX_BATCH:
        raise RequestError(f"{where}: at most {MAX_BATCH} questions per request, got {len(requests)}")
    cap = REQUEST_CAPS["max_cost_usd"][0]
    total = math.fsum(r.max_cost_usd for r in requests if r.max_cost_usd is not None)
    if total > cap:
        raise RequestError(
            f"{where}: the questions' max_cost_usd add up to {total:g} USD; at most {cap:g} "
            "USD per request, for the whole batch"
        )


def parse_batch(raws: Sequence[Any], where: str = "inputs") -> list[ConductorRequest]:
    """Validated requests of a batch (:func:`parse_request` each, named by position, then
    :func:`check_batch`): what the pyfunc model takes, with KServe's rules."""
    if not raws:  # an empty batch is a mistake, not a request for nothing (KServe answers 400)
        raise RequestError(f"{where}: expected at least one question")
    if len(raws) > MAX_BATCH:  # before validating thousands of them
        raise RequestError(f"{where}: at most {MAX_BATCH} questions per request, got {len(raws)}")
    requests = []
    for i, raw in enumerate(raws):
        try:
            requests.append(parse_request(raw))
        except RequestError as exc:
            raise RequestError(f"{where}.{i}: {exc}") from None
    check_batch(requests, where)
    return requests


def request_limits(request: ConductorRequest, *, default_rounds: int = 1) -> RequestLimits:
    """The executor's :class:`RequestLimits` for a validated request (``default_rounds`` where it states
    no ``max_rounds``: the served model's)."""
    return RequestLimits(
        max_cost_usd=request.max_cost_usd,
        max_latency_s=request.max_latency_s,
        sensitivity=request.sensitivity,
        allowed_workers=frozenset(request.allowed_workers) if request.allowed_workers is not None else None,
        max_steps=request.max_steps,
        max_rounds=request.max_rounds or default_rounds,
        max_calls=request.max_calls,
    )


def permitted_view(pool: Pool, request: ConductorRequest, limits: RequestLimits) -> PoolView:
    """The workers of ``pool`` this request permits, as the Conductor sees them.

    Raises :class:`RequestError` for unknown ``allowed_workers`` or when nothing is permitted."""
    unknown = set(request.allowed_workers or ()) - set(pool.names())
    if unknown:
        raise RequestError(f"allowed_workers: unknown workers {sorted(unknown)}; the pool has {pool.names()}")
    view = pool.view([i for i, w in enumerate(pool.workers) if limits.permits(w.info.name, w.info.hosting)])
    if len(view) == 0:
        raise RequestError("no worker of the pool is permitted by this request's sensitivity/allowed_workers")
    return view


def recorded_tasks(pool: Any) -> dict[str, Task]:
    """Question text -> the item of a pool of recorded answers (every worker ``replay``) with
    that exact question, from the pool's own dataset; empty for any other pool. A replay worker
    answers the items it has recordings for, by id, not free text: a served request (or
    ``conductor plan``) that asks a recorded question is that item (without this every served
    request to a replay pool failed with 502)."""
    if not pool.workers or any(w.info.kind != "replay" for w in pool.workers):
        return {}
    dataset = pool.default_dataset(fallback="")  # "": the pool names no dataset of its own
    if not dataset:
        return {}
    from rl_conductor.tasks.datasets import load_tasks

    out: dict[str, Task] = {}
    for t in load_tasks(dataset):
        out.setdefault(t.question, t)
    return out


def request_task(request: ConductorRequest) -> Task:
    """The :class:`Task` a request stands for (no gold answer; id from the question's hash)."""
    qid = hashlib.sha256(request.question.encode()).hexdigest()[:16]
    return Task(
        id=f"request/{qid}",
        question=request.question,
        answer="",
        domain="unknown",
        source="request",
        grader="qa",
    )


def step_document(s: StepRecord) -> dict[str, Any]:
    """One step of a response: its status, the worker that decided it ("" when none was called)
    and every attempt; the steps of a response add up to its ``cost_usd``."""
    return {
        "index": s.index,
        "worker": s.worker,
        "requested_worker": s.requested_worker,
        "status": s.status,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "cost_usd": s.cost_usd,
        "latency_s": s.latency_s,
        "note": s.note,
        "attempts": [
            {
                "worker": a.worker,
                "status": a.status,
                "input_tokens": a.input_tokens,
                "output_tokens": a.output_tokens,
                "cost_usd": a.cost_usd,
                "error": a.error,
            }
            for a in s.attempts
        ],
    }


def response_document(view: PoolView, episode: Episode) -> dict[str, Any]:
    """The response for one executed request: answer, workflow (every round's steps), per-step
    usage, the rounds (what the Conductor saw and decided after each, what each cost), totals.
    A planned step the plan named by evidence rank carries ``evidence_rank`` beside its resolved
    worker."""
    trace = episode.trace
    planned = [
        {
            "worker": view.worker(s.worker).info.name,
            "instruction": s.instruction,
            "access": list(s.visible(i)),
            # named by its place in the prompt's evidence ranking (``@k``): which place
            **({} if s.rank is None else {"evidence_rank": s.rank}),
        }
        for i, s in enumerate(episode.plan.workflow.steps)
    ]
    later = [
        {"worker": r.requested_worker, "instruction": r.instruction, "access": list(r.visible)}
        for r in trace.steps[len(planned) :]
    ]
    return {
        "answer": trace.final_answer,
        "workflow": planned + later,
        "rounds": [asdict(r) for r in trace.rounds],
        "steps": [step_document(s) for s in trace.steps],
        "workers_called": trace.workers_called,
        "cost_usd": trace.cost_usd,
        "tokens": trace.tokens,
        "fallback_plan": episode.plan.fallback,
        "deadline_cut": deadline_shortened(trace),
        "stopped_reason": trace.stopped_reason,
        "notes": list(trace.notes),
        "raw_plan": episode.plan.text,
    }
