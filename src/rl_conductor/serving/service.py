"""The predictor's engine: one policy and one pool, answering validated requests concurrently.

Why it is apart from the HTTP code: the KServe model, the OpenAI route, the CLI and the tests all
answer through :meth:`ConductorService.answer`, which runs the library's one episode runner
(:meth:`rl_conductor.policies.base.Policy.run`: plan -> execute -> annotate) with
:mod:`rl_conductor.serving.request`'s request helpers, and adds what a production endpoint needs
around it:

* **concurrency** — requests run as independent coroutines on the server's event loop; there is
  no lock around a request. An LM Conductor's generation is synchronous, so it runs in a worker
  thread through a continuous micro-batcher: requests that arrive while a batch generates are
  planned together in the next batch (one ``generate`` call over all their prompts).
* **failing workers** — no retry here: a live worker retries transient errors itself, once, with
  the pool's ``retries`` policy (:mod:`rl_conductor.workers.live.resilience`, the one retry
  layer); the executor then replaces a worker that still fails or times out with one of the same
  hosting class. A call its circuit breaker refused is counted as ``outcome="refused"``, apart
  from errors, and each worker's circuit state is a gauge.
* **observability** — per-worker Prometheus metrics, a per-step event stream (for SSE), each a
  :class:`~rl_conductor.workers.base.WorkerWrapper` of one concern (:func:`observed_pool`), a
  structured log line per request (never the question text of a private request, never headers)
  and, when enabled, an MLflow trace per request with a span per step.
* **budgets** — a budget too small for a single call is answered with a message saying so, before
  any planning.

Deliberate simplifications: step events come from worker calls (a later round's steps report
theirs like the first round's); the LM Conductor's review after a round generates on the event
loop (one short generation per round, and rounds are few).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from rl_conductor import validation
from rl_conductor.executor import CHARGES, MIN_OUTPUT_TOKENS, Charge, reserve_input_tokens
from rl_conductor.limits import MAX_ROUNDS, MAX_SECONDS, RequestLimits
from rl_conductor.policies.base import Episode, Plan, Policy
from rl_conductor.reward import budget_stopped, deadline_shortened, deadline_stopped
from rl_conductor.serving import metrics as m
from rl_conductor.serving.guard import HTTP_REQUEST_ID
from rl_conductor.serving.request import (
    ConductorRequest,
    RequestError,
    permitted_view,
    recorded_tasks,
    request_limits,
    request_task,
    response_document,
)
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Trace
from rl_conductor.workers.base import (
    STREAM_SINK,
    Completion,
    TokenSink,
    Worker,
    WorkerCall,
    WorkerError,
    WorkerWrapper,
)
from rl_conductor.workers.live.resilience import CircuitOpenError, breaker_of
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import worker_message

log = logging.getLogger("rl_conductor.serving")

StepListener = Callable[[dict[str, Any]], None]
_LISTENER: ContextVar[StepListener | None] = ContextVar("conductor_step_listener", default=None)
#: [index of the planned workflow's last step (None until planned), its sampling settings, the
#: TokenSink its text streams to (None: answered whole)] for the request running; a list so that
#: the policy's ``plan`` can fill in the index.
_FINAL_STEP: ContextVar[list[Any] | None] = ContextVar("conductor_final_step", default=None)


@dataclass(frozen=True)
class ServiceConfig:
    """How the service runs requests.

    Attributes:
        step_timeout_s: per-call timeout the executor enforces (then it falls back).
        max_rounds: rounds of a request that states none (None: the served model's).
        max_batch: most questions an LM Conductor plans in one generation.
        trace: log an MLflow trace per request (span per step) to the configured tracking store.
        experiment: MLflow experiment of the traces.
    """

    step_timeout_s: float = 120.0
    #: rounds a request gets when it states none (None: the model's ``conductor.json``, else 1)
    max_rounds: int | None = None
    max_batch: int = 32
    trace: bool = False
    experiment: str = "conductor-serving"

    def __post_init__(self) -> None:
        # the per-call timeout becomes every request's RequestLimits.step_timeout_s: a value its
        # cap refuses would start a server that fails every request (the same caps, checked here)
        validation.positive_finite("step_timeout_s", self.step_timeout_s, MAX_SECONDS)
        if self.max_rounds is not None:
            validation.integer_at_least("max_rounds", self.max_rounds, 1, MAX_ROUNDS)
        validation.integer_at_least("max_batch", self.max_batch, 1)


class StreamClosedError(WorkerError):
    """The answering step's stream broke off after part of it was sent: no further call is made."""


class MeteredWorker(WorkerWrapper):
    """The predictor's Prometheus metrics of each call: its outcome (``ok``, ``error``,
    ``cancelled``: the executor's timeout, ``refused``: its circuit breaker sent nothing), its
    latency, tokens and cost, and the worker's circuit state as a gauge."""

    def __init__(self, inner: Worker) -> None:
        super().__init__(inner)
        breaker = breaker_of(inner)
        if breaker is not None:
            m.WORKER_CIRCUIT.labels(self.info.name).set_function(lambda: m.CIRCUIT_VALUES[breaker.state])

    async def call(self, call: WorkerCall) -> Completion:
        name = self.info.name
        t0 = time.perf_counter()
        try:
            comp = await self.forward(call)
        except asyncio.CancelledError:
            m.WORKER_CALLS.labels(name, "cancelled").inc()  # the executor's timeout
            raise
        except CircuitOpenError:
            m.WORKER_CALLS.labels(name, "refused").inc()  # no request was sent
            raise
        except Exception:
            m.WORKER_CALLS.labels(name, "error").inc()
            m.ERRORS.labels("worker").inc()
            raise
        finally:
            m.WORKER_LATENCY.labels(name).observe(time.perf_counter() - t0)
        m.WORKER_CALLS.labels(name, "ok").inc()
        m.WORKER_TOKENS.labels(name, "input").inc(comp.input_tokens)
        m.WORKER_TOKENS.labels(name, "output").inc(comp.output_tokens)
        m.WORKER_COST.labels(name).inc(comp.cost_usd)
        return comp


class AnsweringStep(WorkerWrapper):
    """The request's settings of its answering step (the planned workflow's last): the client's
    sampling settings (OpenAI ``temperature`` / ``max_tokens``; ``max_tokens`` only lowers what
    the executor reserved, so the budget still holds) and, for a streaming request, the sink its
    text goes to as it arrives. Other steps' calls pass through."""

    async def call(self, call: WorkerCall) -> Completion:
        final = _FINAL_STEP.get()
        ctx = call.context
        if final is None or final[0] is None or ctx is None or ctx.step_index != final[0]:
            return await self.forward(call)
        settings = final[1]
        call = replace(
            call,
            temperature=settings.get("temperature", call.temperature),
            max_tokens=min(call.max_tokens, settings.get("max_tokens", call.max_tokens)),
        )
        sink = final[2]
        if sink is None:
            return await self.forward(call)
        if sink.closed:
            # part of an answer was sent and then broke off: a fallback's text would not
            # continue it, so no worker is called for this step again
            raise StreamClosedError(f"{self.info.name}: not called: the streamed answer already broke off")
        token = STREAM_SINK.set(sink)
        try:
            return await self.forward(call)
        finally:
            STREAM_SINK.reset(token)


class StepEvents(WorkerWrapper):
    """Each answered call as an event (worker, tokens, cost, latency, answer, start and end) to the
    request's step listener (the SSE stream, the MLflow trace's spans)."""

    async def call(self, call: WorkerCall) -> Completion:
        started = time.time_ns()
        comp = await self.forward(call)
        listener = _LISTENER.get()
        if listener is not None:
            listener(
                {
                    "index": call.context.step_index if call.context else None,
                    "worker": self.info.name,
                    "input_tokens": comp.input_tokens,
                    "output_tokens": comp.output_tokens,
                    "cost_usd": comp.cost_usd,
                    "latency_s": comp.latency_s,
                    "answer": comp.text,
                    "start_ns": started,
                    "end_ns": time.time_ns(),
                }
            )
        return comp


def observed_pool(pool: Pool) -> Pool:
    """The same pool with every worker wrapped for serving: :class:`StepEvents` around
    :class:`AnsweringStep` around :class:`MeteredWorker` (a call the answering step refuses is
    neither metered nor an event)."""
    return Pool(
        name=pool.name,
        workers=[StepEvents(AnsweringStep(MeteredWorker(w))) for w in pool.workers],
        options=dict(pool.options),
    )


class _Planner:
    """Continuous micro-batching of an LM Conductor's planning (see module docstring)."""

    def __init__(self, policy: Any, max_batch: int) -> None:
        self.policy = policy
        self.max_batch = max_batch
        self._queue: list[tuple[Task, PoolView, RequestLimits, asyncio.Future[Plan]]] = []
        self._runner: asyncio.Task[None] | None = None

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        fut: asyncio.Future[Plan] = asyncio.get_running_loop().create_future()
        self._queue.append((task, view, limits, fut))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        return await fut

    async def _run(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            m.PLAN_BATCH.observe(len(batch))
            try:
                plans = await asyncio.to_thread(
                    self.policy.plan_batch, [(t, v, lim) for t, v, lim, _ in batch]
                )
            except Exception as exc:
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (*_, fut), plan in zip(batch, plans, strict=True):
                if not fut.done():
                    fut.set_result(plan)


def cheapest_call(question: str, view: PoolView) -> tuple[float, str]:
    """The least a first step can reserve on this view (the executor's own reservation rule)."""
    messages = [{"role": "user", "content": worker_message(question, [], "")}]
    best = min(view.infos(), key=lambda i: i.cost(reserve_input_tokens(messages, i), MIN_OUTPUT_TOKENS))
    return best.cost(reserve_input_tokens(messages, best), MIN_OUTPUT_TOKENS), best.name


@dataclass
class _Events:
    forward: StepListener | None
    items: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, event: dict[str, Any]) -> None:
        self.items.append(event)
        if self.forward is not None:
            self.forward(event)


class ConductorService:
    """Answers requests with ``policy`` over ``pool`` (see module docstring)."""

    def __init__(self, policy: Policy, pool: Pool, config: ServiceConfig | None = None) -> None:
        self.config = config or ServiceConfig()
        self.policy = policy
        self.pool = observed_pool(pool)
        #: on a pool of recorded answers, its items by question (serving.request.recorded_tasks)
        self._recorded = recorded_tasks(pool)
        self._planner = _Planner(policy, self.config.max_batch) if policy.batches_plans else None
        self._tracer = _Tracer(self.config.experiment) if self.config.trace else None
        self._background: set[asyncio.Future[Any]] = set()
        #: called with (request, response document, endpoint) for every answered request, on the
        #: event loop, after its log line (the traffic log, rl_conductor.loop.traffic): must not block
        self.on_answered: list[Callable[[ConductorRequest, dict[str, Any], str], None]] = []

    def default_rounds(self) -> int:
        """Rounds of a request that states none: the service's setting, else the model's."""
        if self.config.max_rounds is not None:
            return self.config.max_rounds
        return int(getattr(self.policy, "trained_rounds", 1))

    def check(self, request: ConductorRequest) -> None:
        """Raise :class:`RequestError` now for what :meth:`answer` would reject (unknown or no
        permitted workers), so a streaming response can still answer 4xx before it starts."""
        permitted_view(self.pool, request, request_limits(request))

    async def answer(
        self,
        request: ConductorRequest,
        *,
        endpoint: str = "python",
        on_step: StepListener | None = None,
        request_id: str | None = None,
        final_step: dict[str, Any] | None = None,
        stream: TokenSink | None = None,
    ) -> dict[str, Any]:
        """Plan and execute one request; the response document (see ``serving.request``) plus
        ``request_id``, token totals, ``calls``, ``wall_s``, ``worker_fallback``, ``budget_stop``,
        ``deadline_cut`` and a human ``message`` when the budget, the deadline or a failure shaped
        the answer. A deadline (``max_latency_s``) covers the whole request: the time the plan
        took is taken off what the workflow's steps may use. ``final_step`` (``temperature``,
        ``max_tokens``) applies to the planned workflow's last step, and ``stream`` receives that
        step's text as a worker that streams produces it (only where that step is the answer: one
        round, and a policy that neither raises the rounds nor picks another step's answer, see
        :func:`_answers_with_last_step`; otherwise the answer is sent whole). When no worker answered,
        ``error`` says why (the HTTP adapters answer 502/504 with it). A request cancelled
        mid-way (the client left) still gets its log line, with what every call was charged (a call
        in flight at the cancellation: its reservation, since it was sent and may be billed).

        Raises :class:`RequestError` when the request names unknown workers or permits none."""
        rid = request_id or uuid.uuid4().hex
        t0, t0_ns = time.perf_counter(), time.time_ns()
        limits = replace(
            request_limits(request, default_rounds=self.default_rounds()),
            step_timeout_s=self.config.step_timeout_s,
        )
        view = permitted_view(self.pool, request, limits)
        task = self._recorded.get(request.question) or request_task(request)
        events = _Events(on_step)
        floor, floor_worker = cheapest_call(request.question, view)
        if limits.max_cost_usd is not None and limits.max_cost_usd < floor:
            doc = _unaffordable(limits.max_cost_usd, floor, floor_worker)
        else:
            charges: list[Charge] = []
            charges_token = CHARGES.set(charges)
            try:
                sink = stream if _answers_with_last_step(self.policy, limits) else None
                episode = await self._run(task, view, limits, events, final_step or {}, sink)
            except asyncio.CancelledError:
                doc = _cancelled(events.items, charges)
                if stream is not None and stream.closed and not stream.abandoned:
                    # not the client leaving: the streamed answer broke off (a worker cut it, or
                    # the step timeout did) and the server stopped the request: no answer
                    doc["cancelled"] = False
                    doc["error"] = f"the streamed answer broke off: {stream.reason}"
                    doc["notes"] = ["the streamed answer broke off mid-way; the request was stopped"]
                doc["request_id"] = rid
                doc["wall_s"] = time.perf_counter() - t0
                self._observe(endpoint, request, doc, events.items, t0_ns)
                raise
            finally:
                CHARGES.reset(charges_token)
            doc = response_document(view, episode)
            doc.update(_extras(episode.trace))
            if not doc["answer"]:
                # no 200 with an empty answer: a budget that bought no answer says so as an error
                doc["error"] = doc["message"] if doc["budget_stop"] else _failure(doc)
        doc["request_id"] = rid
        doc["wall_s"] = time.perf_counter() - t0
        self._observe(endpoint, request, doc, events.items, t0_ns)
        return doc

    async def _run(
        self,
        task: Task,
        view: PoolView,
        limits: RequestLimits,
        events: _Events,
        final_step: dict[str, Any],
        sink: TokenSink | None = None,
    ) -> Episode:
        token = _LISTENER.set(events)
        final: list[Any] | None = [None, final_step, sink] if final_step or sink is not None else None
        final_token = _FINAL_STEP.set(final)
        try:
            t = time.perf_counter()
            planner = self._planner.plan if self._planner is not None else self.policy.plan
            plan = await planner(task, view, limits)
            planned_s = time.perf_counter() - t
            m.PLAN_LATENCY.observe(planned_s)
            if limits.max_latency_s is not None:
                # the deadline is the request's: planning already used part of it
                limits = replace(limits, max_latency_s=max(limits.max_latency_s - planned_s, 1e-6))
            if final is not None:
                final[0] = len(plan.workflow.steps) - 1
            return await self.policy.run(task, view, limits, plan=plan)
        finally:
            _FINAL_STEP.reset(final_token)
            _LISTENER.reset(token)

    def _observe(
        self,
        endpoint: str,
        request: ConductorRequest,
        doc: dict[str, Any],
        events: list[dict[str, Any]],
        t0_ns: int,
    ) -> None:
        m.REQUEST_LATENCY.labels(endpoint).observe(doc["wall_s"])
        m.REQUEST_COST.observe(doc["cost_usd"])
        for flag in ("fallback_plan", "worker_fallback", "budget_stop", "deadline_cut"):
            if doc.get(flag):
                m.STOPS.labels(flag).inc()
        for flag in ("cancelled", "error"):
            if doc.get(flag):
                m.STOPS.labels(flag if flag == "cancelled" else "no_answer").inc()
        record: dict[str, Any] = {
            "event": "conductor.request",
            "request_id": doc["request_id"],
            "http_request_id": HTTP_REQUEST_ID.get(),
            "endpoint": endpoint,
            "sensitivity": request.sensitivity,
            "question_sha256": hashlib.sha256(request.question.encode()).hexdigest()[:16],
            "question_chars": len(request.question),
            "max_cost_usd": request.max_cost_usd,
            "max_latency_s": request.max_latency_s,
            "workers": [s["worker"] for s in doc["steps"]],
            "statuses": [s["status"] for s in doc["steps"]],
            "rounds": [r["decision"] for r in doc.get("rounds", [])],  # no answers: they are content
            "cost_usd": doc["cost_usd"],
            "tokens": doc["tokens"],
            "wall_s": round(doc["wall_s"], 6),
            "fallback_plan": doc["fallback_plan"],
            "worker_fallback": doc["worker_fallback"],
            "budget_stop": doc["budget_stop"],
            "deadline_cut": doc["deadline_cut"],
            "cancelled": bool(doc.get("cancelled")),
            "error": loggable_error(doc, request.sensitivity),
        }
        if request.sensitivity == "public":
            record["question_preview"] = request.question[:80]
        log.info(json.dumps(record))
        if doc.get("answer") and not doc.get("cancelled") and not doc.get("error"):
            for hook in self.on_answered:
                hook(request, doc, endpoint)
        if self._tracer is not None:
            fut = asyncio.ensure_future(
                asyncio.to_thread(self._tracer.record, request, doc, events, t0_ns, time.time_ns())
            )
            self._background.add(fut)
            fut.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for background work (MLflow traces) to finish."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def _extras(trace: Trace) -> dict[str, Any]:
    budget_stop = budget_stopped(trace)
    worker_fallback = trace.worker_fallbacks > 0  # a failing worker was replaced
    failed = [s for s in trace.steps if s.status == "failed"]
    message = ""
    deadline_cut = deadline_shortened(trace)
    if budget_stop:
        message = (
            "the budget stopped the workflow early; the answer is the best one so far"
            if trace.final_answer
            else "the budget (max_cost_usd) ran out before any worker answered; no answer"
        )
    elif deadline_cut and trace.plan_cut and not deadline_stopped(trace):
        message = "the deadline shortened the workflow before it ran (see notes)"
    elif deadline_cut:
        message = "the deadline shortened the workflow; the answer is the best one so far"
    elif failed and not trace.final_answer:
        message = "every worker tried for this request failed; no answer"
    return {
        "input_tokens": trace.input_tokens,
        "output_tokens": trace.output_tokens,
        "calls": trace.calls,
        "latency_s": trace.latency_s,
        "worker_fallback": worker_fallback,
        "budget_stop": budget_stop,
        "deadline_cut": deadline_cut,
        "message": message,
    }


def _answers_with_last_step(policy: Policy, limits: RequestLimits) -> bool:
    """Whether the planned workflow's last step is the request's answer, so that its text may
    stream: one round under the limits the policy really runs with (a later round's answer would
    replace it), and no ``execute_plan`` of the policy's own, which may raise those limits (the
    cascade always runs two rounds) or pick another step's answer (self-consistency's vote, the
    oracle)."""
    if not policy.executes_as_planned():
        return False
    return policy.review_hook(limits) is None


#: An attempt's error as the executor writes it: ``worker: ExceptionType: the worker's message``.
_ERROR_TYPE = re.compile(r"^[^:]*: ([A-Za-z_][A-Za-z0-9_.]*): ")


def loggable_error(doc: dict[str, Any], sensitivity: str) -> str:
    """``doc``'s ``error`` as a log line, a trace or MLflow may keep it: a private request's keeps
    each failed worker's name and its error's type only, since a worker's message may echo the
    question (validation errors of vLLM or llama.cpp do). The client's 502 body has it whole."""
    if not doc.get("error") or sensitivity == "public":
        return str(doc.get("error", ""))
    return _failure(doc, text=False)


def _withheld(step: dict[str, Any]) -> dict[str, Any]:
    """A private request's step as its trace keeps it: its note and its attempts' errors (a worker's
    message may echo the question) become their length; the rest (worker, status, cost) stays."""
    attempts = [
        {**a, "error": f"[private: {len(a['error'])} chars]"} if a.get("error") else a
        for a in step.get("attempts", [])
    ]
    return {**step, "attempts": attempts, "note": f"[private: {len(step.get('note') or '')} chars]"}


def _failure(doc: dict[str, Any], *, text: bool = True) -> str:
    """Why a request got no answer, for its 502/504 body: the statuses and the workers' errors
    (with ``text=False``, each error's type instead of its message)."""
    errors: list[str] = []
    for a in (a for s in doc["steps"] for a in s["attempts"] if a.get("error")):
        if text:
            errors.append(f"{a['worker']}: {a['error']}")
        else:
            kind = _ERROR_TYPE.match(a["error"])
            errors.append(f"{a['worker']}: {kind.group(1) if kind else a.get('status', 'error')}")
    if doc["deadline_cut"] and not errors:
        return "the deadline (max_latency_s) left no worker time to answer; no answer"
    if not errors:
        statuses = ", ".join(f"{s['worker'] or '-'} {s['status']}" for s in doc["steps"]) or "no step ran"
        return f"no worker gave an answer ({statuses})"
    shown = "; ".join(dict.fromkeys(errors))
    return "no worker could answer: " + (shown if len(shown) <= 600 else shown[:600] + "...")


def _cancelled(events: list[dict[str, Any]], charges: list[Charge]) -> dict[str, Any]:
    """The log document of a request cancelled mid-way (its client left): every call it made, as
    the executor charged it. A call still in flight when the request was cancelled was sent, and
    its vendor may bill it, so it is charged its reservation (status ``cancelled``) and counted in
    the worker's cost metric too (:class:`MeteredWorker` counts only the calls that answered)."""
    for c in charges:
        if c.outcome == "cancelled":
            m.WORKER_COST.labels(c.worker).inc(c.usd)
    return {
        "answer": "",
        "steps": [
            {
                "index": i,
                "worker": c.worker,
                "status": c.outcome,
                "cost_usd": c.usd,
                "note": "cancelled request",
            }
            for i, c in enumerate(charges)
        ],
        "raw_plan": "",
        "notes": ["the request was cancelled (the client left)"],
        "cost_usd": sum(c.usd for c in charges),
        "tokens": sum(e["input_tokens"] + e["output_tokens"] for e in events if "worker" in e),
        "fallback_plan": False,
        "worker_fallback": False,
        "budget_stop": False,
        "deadline_cut": False,
        "cancelled": True,
    }


def _unaffordable(budget: float, floor: float, worker: str) -> dict[str, Any]:
    message = (
        f"max_cost_usd={budget:g} cannot buy one worker call: the cheapest permitted worker "
        f"({worker}) needs at least ${floor:.6g} for this question"
    )
    return {
        "answer": "",
        "workflow": [],
        "steps": [],
        "cost_usd": 0.0,
        "tokens": 0,
        "fallback_plan": False,
        "stopped_reason": "budget",
        "raw_plan": "",
        "input_tokens": 0,
        "output_tokens": 0,
        "calls": 0,
        "latency_s": 0.0,
        "worker_fallback": False,
        "budget_stop": True,
        "deadline_cut": False,
        "notes": [],
        "workers_called": [],
        "rounds": [],
        "message": message,
        "error": message,
    }


class _Tracer:
    """Writes one MLflow trace per request, a span per step, from a worker thread."""

    def __init__(self, experiment: str) -> None:
        from rl_conductor.tracking import mlflow_utils

        self.experiment_id = mlflow_utils.ensure_experiment(experiment)
        self._lock = threading.Lock()

    def record(
        self,
        request: ConductorRequest,
        doc: dict[str, Any],
        events: list[dict[str, Any]],
        start_ns: int,
        end_ns: int,
    ) -> None:
        import mlflow

        question = (
            request.question
            if request.sensitivity == "public"
            else f"[private: {len(request.question)} chars]"
        )
        answer = (
            doc["answer"] if request.sensitivity == "public" else f"[private: {len(doc['answer'])} chars]"
        )
        # a plan's subtasks quote the question: a private request's plan is traced as its length
        raw_plan = (
            doc["raw_plan"] if request.sensitivity == "public" else f"[private: {len(doc['raw_plan'])} chars]"
        )
        timing = {e["index"]: e for e in events}
        with self._lock:
            root = mlflow.start_span_no_context(
                "conductor.request",
                span_type="CHAIN",
                inputs={
                    "question": question,
                    "max_cost_usd": request.max_cost_usd,
                    "max_latency_s": request.max_latency_s,
                    "sensitivity": request.sensitivity,
                },
                attributes={"request_id": doc["request_id"], "raw_plan": raw_plan},
                experiment_id=self.experiment_id,
                start_time_ns=start_ns,
            )
            for step in doc["steps"]:
                ev = timing.get(step["index"], {})
                span = mlflow.start_span_no_context(
                    f"step {step['index']}: {step['worker']}",
                    span_type="LLM",
                    parent_span=root,
                    inputs={"worker": step["worker"]},
                    attributes=step if request.sensitivity == "public" else _withheld(step),
                    start_time_ns=ev.get("start_ns", start_ns),
                )
                span.end(
                    outputs={"status": step["status"]},
                    status="OK" if step["status"] == "ok" else "ERROR",
                    end_time_ns=ev.get("end_ns", ev.get("start_ns", start_ns)),
                )
            root.end(
                outputs={
                    "answer": answer,
                    "cost_usd": doc["cost_usd"],
                    "tokens": doc["tokens"],
                    "deadline_cut": doc["deadline_cut"],
                    "notes": doc.get("notes", []),
                },
                end_time_ns=end_ns,
            )


def load_policy(model: str | None, policy: str | None, pool: Pool) -> Policy:
    """The policy to serve: a trained Conductor (MLflow URI, ``s3://`` or folder) or a policy spec.

    ``policy`` takes any spec of :func:`rl_conductor.policies.catalog.make_policy` (``single:NAME``,
    ``moa``, ``fixed:0,1``, ...), the parser ``conductor eval`` uses too."""
    if (model is None) == (policy is None):
        raise ValueError(
            "serve either a trained Conductor (--model URI|DIR) or a policy spec (--policy SPEC)"
        )
    if policy is not None:
        from rl_conductor.policies.catalog import make_policy

        return make_policy(policy, pool)
    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.tracking.registry import load_model_dir

    assert model is not None
    return ConductorPolicy(load_model_dir(model))


__all__ = [
    "AnsweringStep",
    "ConductorService",
    "MeteredWorker",
    "RequestError",
    "ServiceConfig",
    "StepEvents",
    "cheapest_call",
    "load_policy",
    "observed_pool",
]
