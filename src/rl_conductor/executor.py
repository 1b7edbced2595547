"""Run a workflow against a worker pool: the one execution path of training, evaluation and serving.

``execute(workflow, task, view, limits)`` builds each step's message from its access list, runs
steps whose dependencies are done concurrently (asyncio), and returns a :class:`Trace`.
Whatever the policy wrote, it enforces:

* **budget** — before a call it reserves the worst case the call can cost (a conservative input
  token count plus ``max_tokens`` of output, with ``max_tokens`` capped to what the unreserved
  budget affords) and charges the real cost afterwards, so ``trace.cost_usd`` never exceeds
  ``limits.max_cost_usd``. The bound holds for any text: input is reserved at
  ``WorkerInfo.input_token_bound`` (UTF-8 bytes + 16 a message, which no byte-level tokenizer
  exceeds; characters / 2.5 + 16 for the offline kinds, which count characters / 4), and every
  billed output token (reasoning and thinking included) falls under the ``max_tokens`` sent
  (docs/live-workers.md, "How money is counted"). A worker that still reports more than its
  reservation is charged what it reported, and the attempt says so. Every call is recorded as an
  :class:`~rl_conductor.trace.Attempt` carrying what the budget was charged for it (a blank
  answer its cost, a timed-out call its whole reservation, plus the worst case of each request a
  live worker sent and saw time out before retrying: the vendor may bill those too,
  ``workers.base.UNANSWERED_BILLS``), so ``trace.cost_usd`` is exactly the budget's charged
  total and never under-states a possible bill. A step that cannot afford ``MIN_OUTPUT_TOKENS``
  of output is skipped, its dependents too, and the best answer so far (the latest completed
  step) becomes the final answer.
* **allowed workers and sensitivity** — a forbidden worker (not in ``allowed_workers``, or external
  on a ``private`` request) is replaced by the permitted worker of the view whose price is
  closest; with none permitted the step is skipped. Private requests never reach an external worker.
* **failures** — a call that raises or passes ``step_timeout_s`` is retried on a fallback worker of
  the same hosting class (the closest in price); after that the step is ``failed`` and its
  dependents run without it. ``StepRecord.worker`` is the worker whose attempt decided the step
  ("" when none was called), so the audit never names a worker that did not see the request.
* **rounds** — with ``limits.max_rounds > 1`` and a ``review`` hook (the policy), after a round
  the hook gets the workflow so far, every step's record and the answer so far
  (:class:`RoundRequest`) and returns the steps to add (:class:`Continuation`; none keeps the
  answer). The added steps are numbered after the earlier ones and may see any of them; they
  start when the round before has finished, on the same budget, deadline and privacy rule, and a
  round is cut to the calls ``limits.max_calls`` leaves. No review starts when the budget, the
  deadline or the calls are spent. Each round is a :class:`~rl_conductor.trace.RoundRecord` on the
  trace. A one-round request runs exactly the one workflow and records no rounds.

* **deadline** — with ``limits.max_latency_s`` each step's time left is the deadline minus its
  start on the critical path. Before a call the worker's latency model (``WorkerInfo.ttft_s``,
  ``tokens_per_s``, ``prefill_tokens_per_s``: the simulated profile's medians, the replay pool's
  nominal model, or numbers a pool file states for a live worker) caps ``max_tokens`` to what
  ``DEADLINE_MARGIN`` of the time left affords; a step that cannot afford ``MIN_OUTPUT_TOKENS``
  is ``skipped_deadline``, its dependents too, and the best answer so far stands. The time left
  is also the call's timeout, and an answer reported later than the time left is dropped (the
  attempt is a ``timeout`` lasting exactly the time left, charged its cost), so a trace's
  critical-path latency never exceeds the deadline. Independent steps still run in parallel.

Latency is reported two ways: ``Trace.wall_s`` (measured) and ``Trace.latency_s`` (critical path
of the workers' reported latencies, which is what simulated pools model).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

from rl_conductor.limits import MIN_OUTPUT_TOKENS, RequestLimits
from rl_conductor.tasks.base import Task
from rl_conductor.trace import ANSWERED, Attempt, RoundRecord, StepRecord, StepStatus, Trace
from rl_conductor.validation import has_visible_text
from rl_conductor.workers.base import (
    RETRY_ALLOWANCE,
    UNANSWERED_BILLS,
    CallContext,
    Completion,
    RetryRefusedError,
    VisibleStep,
    Worker,
    WorkerInfo,
    estimate_token_bound,
)
from rl_conductor.workers.pool import PoolView
from rl_conductor.workflow import Step, Workflow, worker_message

__all__ = [
    "CHARGES",
    "DEADLINE_MARGIN",
    "MIN_OUTPUT_TOKENS",
    "Charge",
    "Continuation",
    "ReviewHook",
    "RoundRequest",
    "execute",
    "reserve_input_tokens",
]
#: Characters of each extracted answer a round record keeps (a code answer can be long).
ANSWER_CHARS = 200
#: Share of a step's time left that its output cap is planned for: the latency model gives
#: medians, so the slack absorbs most of the scatter (an overrun is still cut at the deadline).
DEADLINE_MARGIN = 0.8


@dataclass(frozen=True)
class RoundRequest:
    """What a policy sees after a round: the workflow so far and what each of its steps did.

    ``limits`` are the request's, with what is left of them: ``max_cost_usd`` the budget not
    spent, ``max_latency_s`` the time left before the deadline, ``max_steps`` at most the calls
    ``max_calls`` leaves. ``round`` is the round being planned (2 = the first review)."""

    task: Task
    view: PoolView
    workflow: Workflow
    records: tuple[StepRecord, ...]
    answer: str
    round: int
    limits: RequestLimits


@dataclass(frozen=True)
class Continuation:
    """A policy's decision after a round: the steps to add (none = keep the answer so far).

    A step's access list names steps of the whole workflow: ``"all"`` is every earlier step of
    every round, explicit indices count from the first round's first step. ``seen`` is the prompt
    (or whatever text) the decision was made from; the trace keeps its digest only."""

    workflow: Workflow
    text: str = ""
    seen: str = ""
    answers: tuple[str | None, ...] = ()
    agree: bool | None = None


#: ``review(request) -> continuation``: the policy's decision after a round.
ReviewHook = Callable[[RoundRequest], Awaitable[Continuation]]


def reserve_input_tokens(messages: list[dict[str, str]], info: WorkerInfo | None = None) -> int:
    """The input tokens a call reserves: ``info.input_token_bound`` (UTF-8 bytes + 16 a message
    for a server's tokenizer; characters / 2.5 + 16 for the kinds that count locally); without
    ``info``, the local workers' bound (what the simulated pool's planning replays use)."""
    return estimate_token_bound(messages) if info is None else info.input_token_bound(messages)


#: Relative slack kept off every budget so float rounding in sums never crosses the limit.
_BUDGET_SLACK = 1e-9


@dataclass(frozen=True)
class Charge:
    """What one call was charged when it settled: ``outcome`` is ``ok``, ``empty``, ``timeout``,
    ``error`` or ``cancelled`` (the request was cancelled while the call was in flight: the call
    was sent and may be billed, so it is charged its reservation)."""

    worker: str
    outcome: str
    usd: float


#: A list the caller of :func:`execute` may set: every call's :class:`Charge` is appended to it as
#: the call settles, cancelled calls included, so a request cancelled mid-way (its client left)
#: still knows what it was charged although :func:`execute` never returns its trace.
CHARGES: ContextVar[list[Charge] | None] = ContextVar("conductor_charges", default=None)


@dataclass
class _Budget:
    limit: float | None
    spent: float = 0.0
    reserved: float = 0.0
    holds: int = 0  # reservations in flight (counted, since float sums of them never return to 0.0)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def available(self) -> float:
        if self.limit is None:
            return math.inf
        return self.limit * (1 - _BUDGET_SLACK) - self.spent - self.reserved

    def reserve(self, amount: float) -> None:
        self.reserved += amount
        self.holds += 1

    def release(self, reservation: float, charge: float) -> None:
        self.holds -= 1
        self.reserved = self.reserved - reservation if self.holds else 0.0
        self.spent += charge
        self.changed.set()


@dataclass
class _Run:
    task: Task
    workflow: Workflow
    view: PoolView
    limits: RequestLimits
    budget: _Budget
    #: when the round now running started (its steps start no earlier: the review saw all before)
    round_start: float = 0.0
    #: calls promised so far against ``limits.max_calls``: one per accepted step, plus fallbacks
    calls_committed: int = 0
    finish: dict[int, float] = field(default_factory=dict)  # simulated finish time per step
    t0: float = field(default_factory=time.perf_counter)

    def calls_left(self) -> int | None:
        cap = self.limits.max_calls
        return None if cap is None else max(cap - self.calls_committed, 0)

    def take_spare_call(self) -> bool:
        """Commit one more call (a fallback) if the call cap leaves one."""
        left = self.calls_left()
        if left is not None and left <= 0:
            return False
        self.calls_committed += 1
        return True


def _permitted(view: PoolView, limits: RequestLimits, ordinal: int) -> bool:
    info = view.worker(ordinal).info
    return limits.permits(info.name, info.hosting)


def _substitute(view: PoolView, limits: RequestLimits, ordinal: int, *, exclude: set[int]) -> int | None:
    """The permitted worker of the view closest in price to ``ordinal`` (same hosting preferred)."""
    target = view.worker(ordinal).info
    best: tuple[tuple[int, float], int] | None = None
    for j in range(len(view)):
        if j == ordinal or j in exclude or not _permitted(view, limits, j):
            continue
        info = view.worker(j).info
        key = (0 if info.hosting == target.hosting else 1, abs(info.price_out - target.price_out))
        if best is None or key < best[0]:
            best = (key, j)
    return None if best is None else best[1]


async def _affordable_cap(
    run: _Run, info: WorkerInfo, in_cost: float, time_cap: int | None = None
) -> int | None:
    """Output tokens a call may use, waiting for siblings' reservations; None = unaffordable."""
    while True:
        cap = min(run.limits.max_tokens, info.max_output_tokens)
        if time_cap is not None:
            cap = min(cap, time_cap)  # checked >= MIN_OUTPUT_TOKENS by the caller
        avail = run.budget.available()
        if math.isfinite(avail):
            if info.price_out > 0:
                cap = min(cap, math.floor((avail - in_cost) * 1e6 / info.price_out))
            elif avail < in_cost:
                cap = -1
        if cap >= MIN_OUTPUT_TOKENS:
            return cap
        if run.budget.holds == 0:
            return None
        # siblings in flight hold reservations: wait until one settles, then look again
        run.budget.changed.clear()
        await run.budget.changed.wait()


def _settle(run: _Run, info: WorkerInfo, reservation: float, charge: float, outcome: str) -> None:
    """Release a call's reservation, charge it, and note the charge in :data:`CHARGES`."""
    run.budget.release(reservation, charge)
    charges = CHARGES.get()
    if charges is not None:
        charges.append(Charge(info.name, outcome, charge))


async def _call(
    run: _Run,
    worker: Worker,
    messages: list[dict[str, str]],
    ctx: CallContext,
    *,
    time_cap: int | None = None,
    time_left: float | None = None,
) -> tuple[Completion | None, Attempt | None]:
    """One budgeted call: (completion or None, its attempt); attempt None = unaffordable, not called.

    ``time_left`` (a deadline) bounds the call: it is the timeout when shorter than
    ``step_timeout_s``, and a completion reporting a longer latency is dropped as a timeout."""
    info = worker.info
    in_cost = info.input_token_bound(messages) * info.price_in / 1e6
    cap = await _affordable_cap(run, info, in_cost, time_cap)
    if cap is None:
        return None, None
    reservation = in_cost + cap * info.price_out / 1e6
    run.budget.reserve(reservation)
    timeout = run.limits.step_timeout_s if time_left is None else min(run.limits.step_timeout_s, time_left)
    # attempts the worker sent that timed out (its own retries) may be billed: it notes each one's
    # worst case here, and the call is charged them on top of whatever else it is charged
    unanswered: list[float] = []
    token = UNANSWERED_BILLS.set(unanswered)
    # a retry after an attempt charged its worst case needs a worst case of its own, held here
    extra: list[float] = []

    def allow(usd: float) -> bool:
        if run.budget.available() < usd:
            return False
        run.budget.reserved += usd
        extra.append(usd)
        return True

    allow_token = RETRY_ALLOWANCE.set(allow)
    try:
        comp = await asyncio.wait_for(
            worker.complete(messages, max_tokens=cap, temperature=run.limits.temperature, context=ctx),
            timeout=timeout,
        )
    except TimeoutError:
        # a timed-out call may still be billed: keep its reservation counted as spent
        charge = reservation + sum(unanswered)
        _settle(run, info, reservation + sum(extra), charge, "timeout")
        why = "deadline: no answer in the time left" if timeout < run.limits.step_timeout_s else "timed out"
        err = f"{info.name}: {why} ({timeout:g}s)"
        return None, Attempt(info.name, "timeout", cost_usd=charge, latency_s=timeout, error=err)
    except asyncio.CancelledError:
        # cancelled mid-call: it may still be billed
        _settle(run, info, reservation + sum(extra), reservation + sum(unanswered), "cancelled")
        raise
    except Exception as exc:  # any worker failure is recorded and replaced
        charge = sum(unanswered)  # an error answer is not billed; a timed-out attempt may be
        _settle(run, info, reservation + sum(extra), charge, "error")
        err = f"{info.name}: {exc.__class__.__name__}: {str(exc)[:200]}"
        if isinstance(exc, RetryRefusedError) and exc.by == "request":
            # its retry did not fit the budget (the step is then budget-stopped, see _run_step)
            err = f"{info.name}: budget: retry not sent ({str(exc)[:200]})"
        return None, Attempt(info.name, "error", cost_usd=charge, error=err)
    finally:
        UNANSWERED_BILLS.reset(token)
        RETRY_ALLOWANCE.reset(allow_token)
    cost = comp.cost_usd
    if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 0:
        cost = reservation  # a worker that reports no usable cost is charged its worst case
    cost += sum(unanswered)
    # blank also when only invisible characters (zero-width spaces, controls), as a question is
    answered = isinstance(comp.text, str) and has_visible_text(comp.text)
    late = time_left is not None and not comp.latency_s <= time_left
    _settle(run, info, reservation + sum(extra), cost, "timeout" if late else "ok" if answered else "empty")
    overrun = (
        f"{info.name}: reported ${cost:.6g}, above its reservation of ${reservation:.6g}"
        if cost > reservation * (1 + _BUDGET_SLACK)
        else ""
    )
    if late and time_left is not None:
        # the answer came after the deadline: the request stopped waiting when the time ran out
        err = f"{info.name}: deadline: answered after {comp.latency_s:.3g}s, {time_left:.3g}s were left"
        attempt = Attempt(
            info.name,
            "timeout",
            input_tokens=comp.input_tokens,
            output_tokens=comp.output_tokens,
            cost_usd=cost,
            latency_s=time_left,
            error=err,
        )
        return None, attempt
    attempt = Attempt(
        info.name,
        "ok" if answered else "empty",
        input_tokens=comp.input_tokens,
        output_tokens=comp.output_tokens,
        cost_usd=cost,
        latency_s=comp.latency_s,
        error=overrun or ("" if answered else f"{info.name}: empty answer"),
    )
    return (comp if answered else None), attempt


def _fallback(run: _Run, failed: WorkerInfo, tried: set[int]) -> int | None:
    """The untried permitted worker of ``failed``'s hosting class closest to it in price."""
    same = [
        j
        for j in range(len(run.view))
        if j not in tried
        and _permitted(run.view, run.limits, j)
        and run.view.worker(j).info.hosting == failed.hosting
    ]
    if not same:
        return None
    return min(same, key=lambda j: (abs(run.view.worker(j).info.price_out - failed.price_out), j))


async def _run_step(run: _Run, index: int, step: Step, done: dict[int, StepRecord]) -> StepRecord:
    visible_idx = [i for i in step.visible(index) if done[i].status in ANSWERED]
    visible = [(i, run.workflow.steps[i].instruction, done[i].answer) for i in visible_idx]
    start = max((run.finish.get(i, 0.0) for i in step.visible(index)), default=run.round_start)
    start = max(start, run.round_start)

    requested = run.view.worker(step.worker).info.name
    rec = StepRecord(
        index=index,
        worker="",
        instruction=step.instruction,
        visible=visible_idx,
        started_s=start,
        requested_worker=requested,
    )
    ordinal: int | None = step.worker
    notes: list[str] = []
    if not _permitted(run.view, run.limits, step.worker):
        sub = _substitute(run.view, run.limits, step.worker, exclude=set())
        notes.append(f"{requested} not permitted ({run.limits.sensitivity} request)")
        ordinal = sub
        if sub is None:
            rec.status, rec.note = "skipped_forbidden", "; ".join([*notes, "no permitted worker"])
            run.finish[index] = start
            return rec
    messages = [{"role": "user", "content": worker_message(run.task.question, visible, step.instruction)}]
    ctx = CallContext(
        task=run.task,
        step_index=index,
        instruction=step.instruction,
        visible_answers=tuple(a for _, _, a in visible),
        visible_steps=tuple(VisibleStep(done[i].worker, i, instr) for i, instr, _ in visible),
        nonce=index,
        sensitivity=run.limits.sensitivity,
    )
    tried: set[int] = set()
    deadline = run.limits.max_latency_s
    while ordinal is not None:
        tried.add(ordinal)
        worker = run.view.worker(ordinal)
        time_left: float | None = None
        time_cap: int | None = None
        if deadline is not None:
            time_left = deadline - start - sum(a.latency_s for a in rec.attempts)
            fits = worker.info.tokens_within(
                time_left * DEADLINE_MARGIN, worker.info.input_token_bound(messages)
            )
            if time_left <= 0 or (fits is not None and fits < MIN_OUTPUT_TOKENS):
                rec.status = "skipped_deadline"
                notes.append(
                    f"deadline: {max(time_left, 0.0):.3g}s left is too little for {worker.info.name}"
                )
                break
            time_cap = fits
            if fits is not None and fits < min(run.limits.max_tokens, worker.info.max_output_tokens):
                notes.append(f"deadline: output capped at {fits} tokens ({time_left:.3g}s left)")
        comp, attempt = await _call(run, worker, messages, ctx, time_cap=time_cap, time_left=time_left)
        if attempt is None:
            rec.status = "skipped_budget"
            notes.append("budget exhausted")
            break
        rec.attempts.append(attempt)
        rec.worker = attempt.worker
        if comp is not None:
            rec.answer, rec.cached = comp.text, comp.cached
            rec.finish_reason, rec.tokens_estimated = comp.finish_reason, comp.tokens_estimated
            rec.synthesised = comp.synthesised
            if comp.finish_reason == "length":
                notes.append("output truncated at max_tokens")
            rec.status = "ok"
            break
        notes.append(attempt.error)
        rec.status = (
            "skipped_deadline"
            if attempt.error.startswith(f"{attempt.worker}: deadline")
            else "skipped_budget"
            if attempt.error.startswith(f"{attempt.worker}: budget")
            else "failed"
        )
        # a fallback of the same hosting class, never one the request forbids
        ordinal = _fallback(run, worker.info, tried)
        if ordinal is not None and not run.take_spare_call():
            notes.append(f"call cap of {run.limits.max_calls} reached: no fallback")
            ordinal = None
        if ordinal is not None:
            notes.append(f"fallback to {run.view.worker(ordinal).info.name}")
    rec.input_tokens = sum(a.input_tokens for a in rec.attempts)
    rec.output_tokens = sum(a.output_tokens for a in rec.attempts)
    rec.cost_usd = sum(a.cost_usd for a in rec.attempts)
    rec.latency_s = sum(a.latency_s for a in rec.attempts)
    rec.note = "; ".join(notes)
    run.finish[index] = start + rec.latency_s
    return rec


def _check_steps(steps: Sequence[Step], view: PoolView, first: int) -> str | None:
    """Why steps numbered from ``first`` cannot run on ``view`` (None when they can)."""
    for k, s in enumerate(steps):
        i = first + k
        if not 0 <= s.worker < len(view):
            return f"step worker id {s.worker} is outside the view of {len(view)} workers"
        if not all(0 <= d < i for d in s.visible(i)):
            return f"step {i} may only see earlier steps, not {s.access}"
    return None


async def execute(
    workflow: Workflow,
    task: Task,
    view: PoolView,
    limits: RequestLimits | None = None,
    *,
    review: ReviewHook | None = None,
) -> Trace:
    """Execute ``workflow`` for ``task`` on ``view`` within ``limits`` and return its trace.

    With ``limits.max_rounds > 1`` and a ``review`` hook, later rounds follow (module docstring).

    Raises:
        ValueError: for a workflow these limits make invalid (a worker id outside the view, a
            step that sees a later one).
    """
    limits = limits or RequestLimits()
    keep = limits.max_steps if limits.max_calls is None else min(limits.max_steps, limits.max_calls)
    steps = workflow.steps[:keep]
    trace = Trace(task_id=task.id)
    if len(workflow.steps) > limits.max_steps:
        trace.notes.append(f"workflow truncated to {limits.max_steps} steps")
    if len(workflow.steps) > keep and keep < limits.max_steps:
        trace.notes.append(f"workflow truncated to {keep} steps (call cap)")
    why = _check_steps(steps, view, 0)
    if why is not None:
        raise ValueError(why)
    run = _Run(task, Workflow(steps=tuple(steps)), view, limits, _Budget(limits.max_cost_usd))
    run.calls_committed = len(steps)
    done: dict[int, StepRecord] = {}
    await _run_steps(run, range(len(steps)), done)
    if review is not None and limits.max_rounds > 1:
        first = [done[i] for i in range(len(steps))]
        trace.rounds.append(
            RoundRecord(
                index=1,
                decision="plan",
                steps=list(range(len(steps))),
                cost_usd=sum(r.cost_usd for r in first),
                latency_s=max((r.started_s + r.latency_s for r in first), default=0.0),
            )
        )
        await _later_rounds(run, review, done, trace)

    trace.steps = [done[i] for i in range(len(run.workflow.steps))]
    trace.final_answer = _answer_so_far(trace.steps)
    if trace.steps and trace.steps[-1].status not in ANSWERED:
        trace.stopped_reason = trace.steps[-1].status
    trace.charged_usd = run.budget.spent
    trace.wall_s = time.perf_counter() - run.t0
    return trace


def _answer_so_far(records: Sequence[StepRecord]) -> str:
    """The latest answered step's answer ("" when none answered)."""
    answered = [r for r in records if r.status in ANSWERED and r.answer]
    return answered[-1].answer if answered else ""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16] if text else ""


def _no_round(run: _Run, round_end: float) -> str:
    """Why no further round can start ("" when one can)."""
    if run.budget.available() <= 0:
        return "budget spent"
    deadline = run.limits.max_latency_s
    if deadline is not None and deadline - round_end <= 0:
        return "deadline reached"
    if run.calls_left() == 0:
        return f"call cap of {run.limits.max_calls} reached"
    return ""


async def _later_rounds(run: _Run, review: ReviewHook, done: dict[int, StepRecord], trace: Trace) -> None:
    """Rounds 2..``max_rounds``: review, then run the steps the policy added (module docstring)."""
    limits = run.limits
    for number in range(2, limits.max_rounds + 1):
        round_end = max(run.finish.values(), default=0.0)
        why = _no_round(run, round_end)
        if why:
            trace.rounds.append(RoundRecord(index=number, decision="stop", reason=why))
            return
        avail = run.budget.available()
        calls = run.calls_left()
        left = replace(
            limits,
            max_cost_usd=avail if math.isfinite(avail) else None,
            max_latency_s=None if limits.max_latency_s is None else limits.max_latency_s - round_end,
            max_steps=limits.max_steps if calls is None else min(limits.max_steps, calls),
        )
        records = tuple(done[i] for i in range(len(run.workflow.steps)))
        request = RoundRequest(
            task=run.task,
            view=run.view,
            workflow=run.workflow,
            records=records,
            answer=_answer_so_far(records),
            round=number,
            limits=left,
        )
        try:
            cont = await review(request)
        except Exception as exc:  # the policy failed: the answer so far stands
            reason = f"review failed: {exc.__class__.__name__}: {str(exc)[:200]}"
            trace.rounds.append(RoundRecord(index=number, decision="stop", reason=reason))
            return
        record = RoundRecord(
            index=number,
            decision="keep",
            plan_text=cont.text,
            seen=_digest(cont.seen),
            answers=[a if a is None else a[:ANSWER_CHARS] for a in cont.answers],
            agree=cont.agree,
        )
        trace.rounds.append(record)
        added = cont.workflow.steps[: left.max_steps]
        if not added:
            return
        first = len(run.workflow.steps)
        bad = _check_steps(added, run.view, first)
        if bad is not None:
            record.decision, record.reason = "stop", f"invalid continuation: {bad}"
            return
        if len(cont.workflow.steps) > len(added):
            record.reason = f"continuation truncated to {len(added)} steps"
        run.workflow = Workflow(steps=run.workflow.steps + tuple(added))
        run.round_start = round_end
        run.calls_committed += len(added)
        indices = range(first, first + len(added))
        await _run_steps(run, indices, done)
        record.decision, record.steps = "continue", list(indices)
        record.cost_usd = sum(done[i].cost_usd for i in indices)
        record.latency_s = max(run.finish.values(), default=round_end) - round_end


async def _run_steps(run: _Run, indices: range, done: dict[int, StepRecord]) -> None:
    """Run the steps ``indices`` of ``run.workflow`` (earlier ones are in ``done``): each starts
    once the steps it sees have settled, independent ones concurrently."""
    steps = run.workflow.steps
    pending = set(indices)
    running: dict[asyncio.Task[StepRecord], int] = {}
    try:
        while pending or running:
            for i in sorted(pending):
                deps = steps[i].visible(i)
                if all(d in done for d in deps):
                    skipped = [done[d].status for d in deps if done[d].status in _SKIPS_DEPENDENTS]
                    if skipped:
                        done[i] = StepRecord(
                            index=i,
                            worker="",
                            instruction=steps[i].instruction,
                            visible=[],
                            status=skipped[0],
                            note="a step it depends on was skipped",
                            requested_worker=run.view.worker(steps[i].worker).info.name,
                        )
                        pending.discard(i)
                        continue
                    running[asyncio.ensure_future(_run_step(run, i, steps[i], done))] = i
                    pending.discard(i)
            if not running:
                continue
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for fut in finished:
                i = running.pop(fut)
                done[i] = fut.result()
    finally:
        # an error (or a cancellation) stops the steps still in flight: no orphan keeps calling
        for fut in running:
            fut.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


#: A step depending on one skipped for these reasons is skipped the same way (its input is missing
#: because the request ran out of money or time, not because a worker failed).
_SKIPS_DEPENDENTS: tuple[StepStatus, ...] = ("skipped_budget", "skipped_deadline")
