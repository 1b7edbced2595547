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
  answer its cost, a timed-out call its whole reservation), so ``trace.cost_usd`` is exactly the
  budget's charged total. A step that cannot afford ``MIN_OUTPUT_TOKENS`` of output is skipped,
  its dependents too, and the best answer so far (the latest completed step) becomes the final
  answer.
* **allowed workers and sensitivity** — a forbidden worker (not in ``allowed_workers``, or external
  on a ``private`` request) is replaced by the permitted worker of the view whose price is
  closest; with none permitted the step is skipped. Private requests never reach an external worker.
* **failures** — a call that raises or passes ``step_timeout_s`` is retried on a fallback worker of
  the same hosting class (the closest in price); after that the step is ``failed`` and its
  dependents run without it. ``StepRecord.worker`` is the worker whose attempt decided the step
  ("" when none was called), so the audit never names a worker that did not see the request.
* **recursion** — worker id ``len(view)`` names the Conductor itself, valid only while
  ``depth < limits.recursion_depth`` and with a ``recursion`` hook; otherwise the workflow is
  rejected, as ``parse`` rejects it (one recursion setting for parsing, prompt and executor).
  The hook (the policy) gets the parent workflow and the answers so far and returns the inner
  trace. The inner run is charged to a hold of the whole remaining budget (parallel siblings
  wait for it) and its records are kept even when the hook raises; an exception from the hook
  makes the step ``failed`` instead of escaping ``execute``.

* **deadline** — with ``limits.max_latency_s`` each step's time left is the deadline minus its
  start on the critical path. Before a call the worker's latency model (``WorkerInfo.ttft_s``,
  ``tokens_per_s``, ``prefill_tokens_per_s``: the simulated profile's medians, the replay pool's
  nominal model, or numbers a pool file states for a live worker) caps ``max_tokens`` to what
  ``DEADLINE_MARGIN`` of the time left affords; a step that cannot afford ``MIN_OUTPUT_TOKENS``
  is ``skipped_deadline``, its dependents too, and the best answer so far stands. The time left
  is also the call's timeout, and an answer reported later than the time left is dropped (the
  attempt is a ``timeout`` lasting exactly the time left, charged its cost), so a trace's
  critical-path latency never exceeds the deadline. Independent steps still run in parallel.
  A recursion step passes its time left to the inner run as that run's deadline.

Latency is reported two ways: ``Trace.wall_s`` (measured) and ``Trace.latency_s`` (critical path
of the workers' reported latencies, which is what simulated pools model).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from rl_conductor.tasks.base import Task
from rl_conductor.trace import ANSWERED, MIN_OUTPUT_TOKENS, Attempt, Limits, StepRecord, StepStatus, Trace
from rl_conductor.workers.base import CallContext, Completion, Worker, WorkerInfo, estimate_token_bound
from rl_conductor.workers.pool import PoolView
from rl_conductor.workflow import Step, Workflow, worker_message

__all__ = [
    "DEADLINE_MARGIN",
    "MIN_OUTPUT_TOKENS",
    "RecursionHook",
    "RecursionRequest",
    "execute",
    "reserve_input_tokens",
]
#: Share of a step's time left that its output cap is planned for: the latency model gives
#: medians, so the slack absorbs most of the scatter (an overrun is still cut at the deadline).
DEADLINE_MARGIN = 0.8


@dataclass(frozen=True)
class RecursionRequest:
    """What the Conductor sees when it is called as a step of its own workflow."""

    task: Task
    parent: Workflow
    step_index: int
    visible: tuple[tuple[int, str, str], ...]  # (index, subtask, answer) of steps this step sees
    answer_so_far: str
    limits: Limits
    depth: int


#: ``hook(request) -> (inner workflow, inner trace)``; an empty inner workflow keeps the answer.
RecursionHook = Callable[[RecursionRequest], Awaitable[Trace]]


def reserve_input_tokens(messages: list[dict[str, str]], info: WorkerInfo | None = None) -> int:
    """The input tokens a call reserves: ``info.input_token_bound`` (UTF-8 bytes + 16 a message
    for a server's tokenizer; characters / 2.5 + 16 for the kinds that count locally); without
    ``info``, the local workers' bound (what the simulated pool's planning replays use)."""
    return estimate_token_bound(messages) if info is None else info.input_token_bound(messages)


#: Relative slack kept off every budget so float rounding in sums never crosses the limit.
_BUDGET_SLACK = 1e-9


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
class _Inner:
    """What a recursion step shares with the run its hook starts: the held budget, and a sink
    that receives each inner step's record as it settles (kept even if the hook raises)."""

    depth: int
    budget: _Budget
    records: list[StepRecord] = field(default_factory=list)
    joined: bool = False


#: Set by a recursion step while its hook runs; the hook's ``execute`` at that depth joins it.
_INNER: contextvars.ContextVar[_Inner | None] = contextvars.ContextVar("rl_conductor_inner", default=None)


@dataclass
class _Run:
    task: Task
    workflow: Workflow
    view: PoolView
    limits: Limits
    recursion: RecursionHook | None
    depth: int
    budget: _Budget
    sink: list[StepRecord] | None = None  # a recursion step's record sink (see _Inner)
    finish: dict[int, float] = field(default_factory=dict)  # simulated finish time per step
    t0: float = field(default_factory=time.perf_counter)


def _permitted(view: PoolView, limits: Limits, ordinal: int) -> bool:
    info = view.worker(ordinal).info
    return limits.permits(info.name, info.hosting)


def _substitute(view: PoolView, limits: Limits, ordinal: int, *, exclude: set[int]) -> int | None:
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
    try:
        comp = await asyncio.wait_for(
            worker.complete(messages, max_tokens=cap, temperature=run.limits.temperature, context=ctx),
            timeout=timeout,
        )
    except TimeoutError:
        # a timed-out call may still be billed: keep its reservation counted as spent
        run.budget.release(reservation, reservation)
        why = "deadline: no answer in the time left" if timeout < run.limits.step_timeout_s else "timed out"
        err = f"{info.name}: {why} ({timeout:g}s)"
        return None, Attempt(info.name, "timeout", cost_usd=reservation, latency_s=timeout, error=err)
    except asyncio.CancelledError:
        run.budget.release(reservation, reservation)  # cancelled mid-call: it may still be billed
        raise
    except Exception as exc:  # any worker failure is recorded and replaced
        run.budget.release(reservation, 0.0)
        err = f"{info.name}: {exc.__class__.__name__}: {str(exc)[:200]}"
        return None, Attempt(info.name, "error", error=err)
    cost = comp.cost_usd
    if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 0:
        cost = reservation  # a worker that reports no usable cost is charged its worst case
    run.budget.release(reservation, cost)
    overrun = (
        f"{info.name}: reported ${cost:.6g}, above its reservation of ${reservation:.6g}"
        if cost > reservation * (1 + _BUDGET_SLACK)
        else ""
    )
    if time_left is not None and not comp.latency_s <= time_left:
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
    answered = isinstance(comp.text, str) and bool(comp.text.strip())
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
    start = max((run.finish.get(i, 0.0) for i in step.visible(index)), default=0.0)

    if step.worker == len(run.view):
        return await _run_recursion(run, index, step, visible, start)

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
        nonce=index + 100 * run.depth,
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
            if comp.finish_reason == "length":
                notes.append("output truncated at max_tokens")
            rec.status = "ok"
            break
        notes.append(attempt.error)
        rec.status = (
            "skipped_deadline" if attempt.error.startswith(f"{attempt.worker}: deadline") else "failed"
        )
        # a fallback of the same hosting class, never one the request forbids
        ordinal = _fallback(run, worker.info, tried)
        if ordinal is not None:
            notes.append(f"fallback to {run.view.worker(ordinal).info.name}")
    rec.input_tokens = sum(a.input_tokens for a in rec.attempts)
    rec.output_tokens = sum(a.output_tokens for a in rec.attempts)
    rec.cost_usd = sum(a.cost_usd for a in rec.attempts)
    rec.latency_s = sum(a.latency_s for a in rec.attempts)
    rec.note = "; ".join(notes)
    run.finish[index] = start + rec.latency_s
    return rec


async def _run_recursion(
    run: _Run, index: int, step: Step, visible: list[tuple[int, str, str]], start: float
) -> StepRecord:
    rec = StepRecord(
        index=index,
        worker="conductor",
        instruction=step.instruction,
        visible=[v[0] for v in visible],
        started_s=start,
        status="recursed",
        requested_worker="conductor",
    )
    hook = run.recursion
    assert hook is not None  # execute() rejects a Conductor step it cannot run
    prev = visible[-1][2] if visible else ""
    avail = run.budget.available()
    while math.isfinite(avail) and avail <= 0 and run.budget.holds:
        run.budget.changed.clear()
        await run.budget.changed.wait()
        avail = run.budget.available()
    run.finish[index] = start
    if math.isfinite(avail) and avail <= 0:
        rec.status, rec.worker, rec.note = "skipped_budget", "", "budget exhausted before the recursion"
        return rec
    deadline = run.limits.max_latency_s
    if deadline is not None and deadline - start <= 0:
        rec.status, rec.worker, rec.note = "skipped_deadline", "", "deadline reached before the recursion"
        return rec
    hold = avail if math.isfinite(avail) else 0.0
    sub_limits = replace(
        run.limits,
        max_cost_usd=hold if math.isfinite(avail) else None,
        max_latency_s=None if deadline is None else deadline - start,  # the inner run's deadline
    )
    shared = _Inner(depth=run.depth + 1, budget=_Budget(sub_limits.max_cost_usd))
    run.budget.reserve(hold)
    token = _INNER.set(shared)
    charge: float | None = None
    try:
        inner = await hook(
            RecursionRequest(
                task=run.task,
                parent=run.workflow,
                step_index=index,
                visible=tuple(visible),
                answer_so_far=prev,
                limits=sub_limits,
                depth=run.depth + 1,
            )
        )
        # a hook whose inner run went through this executor was charged on the held budget; one
        # that ran elsewhere reports its cost in the trace it returns
        charge = shared.budget.spent if shared.joined else inner.cost_usd
    except Exception as exc:  # the policy failed: this step fails, the rest of the run goes on
        rec.status, rec.answer = "failed", ""
        rec.substeps = list(shared.records)
        rec.note = f"recursion failed: {exc.__class__.__name__}: {str(exc)[:200]}"
        return rec
    finally:
        _INNER.reset(token)
        run.budget.release(hold, shared.budget.spent if charge is None else charge)
    rec.substeps = (
        list(inner.steps) if not shared.joined or _same(inner.steps, shared.records) else list(shared.records)
    )
    rec.answer = inner.final_answer or prev
    rec.note = (
        "inner workflow kept the previous answer"
        if not inner.steps
        else f"inner workflow of {len(inner.steps)} steps"
    )
    rec.latency_s = inner.latency_s
    run.finish[index] = start + inner.latency_s
    return rec


def _same(a: list[StepRecord], b: list[StepRecord]) -> bool:
    return sorted(map(id, a)) == sorted(map(id, b))


async def execute(
    workflow: Workflow,
    task: Task,
    view: PoolView,
    limits: Limits | None = None,
    *,
    recursion: RecursionHook | None = None,
    depth: int = 0,
) -> Trace:
    """Execute ``workflow`` for ``task`` on ``view`` within ``limits`` and return its trace.

    Raises:
        ValueError: for a workflow these limits make invalid (a worker id outside the view, a
            step that sees a later one, the Conductor's id where recursion is off or no hook).
    """
    limits = limits or Limits()
    steps = workflow.steps[: limits.max_steps]
    trace = Trace(task_id=task.id)
    if len(workflow.steps) > limits.max_steps:
        trace.notes.append(f"workflow truncated to {limits.max_steps} steps")
    for i, s in enumerate(steps):
        if s.worker == len(view) and not (limits.allows_recursion(depth) and recursion is not None):
            why = (
                "no recursion hook was given"
                if recursion is None
                else f"recursion_depth={limits.recursion_depth} allows none at depth {depth}"
            )
            raise ValueError(f"step {i} names the Conductor itself (id {len(view)}) but {why}")
        if not 0 <= s.worker <= len(view):
            raise ValueError(f"step worker id {s.worker} is outside the view of {len(view)} workers")
        if not all(0 <= d < i for d in s.visible(i)):
            raise ValueError(f"step {i} may only see earlier steps, not {s.access}")
    shared = _INNER.get()
    if shared is not None and shared.depth == depth:
        # started by a recursion step's hook: spend from its hold and report every record to it
        shared.joined = True
        run = _Run(task, workflow, view, limits, recursion, depth, shared.budget, sink=shared.records)
    else:
        run = _Run(task, workflow, view, limits, recursion, depth, _Budget(limits.max_cost_usd))

    done: dict[int, StepRecord] = {}

    def settle(i: int, rec: StepRecord) -> None:
        done[i] = rec
        if run.sink is not None:
            run.sink.append(rec)

    pending = set(range(len(steps)))
    running: dict[asyncio.Task[StepRecord], int] = {}
    try:
        while pending or running:
            for i in sorted(pending):
                deps = steps[i].visible(i)
                if all(d in done for d in deps):
                    skipped = [done[d].status for d in deps if done[d].status in _SKIPS_DEPENDENTS]
                    if skipped:
                        settle(
                            i,
                            StepRecord(
                                index=i,
                                worker="",
                                instruction=steps[i].instruction,
                                visible=[],
                                status=skipped[0],
                                note="a step it depends on was skipped",
                                requested_worker=_name(view, steps[i].worker),
                            ),
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
                settle(i, fut.result())
    finally:
        # an error (or a cancellation) stops the steps still in flight: no orphan keeps calling
        for fut in running:
            fut.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    trace.steps = [done[i] for i in range(len(steps))]
    answered = [r for r in trace.steps if r.status in ANSWERED and r.answer]
    trace.final_answer = answered[-1].answer if answered else ""
    if trace.steps and trace.steps[-1].status not in ANSWERED:
        trace.stopped_reason = trace.steps[-1].status
    trace.charged_usd = run.budget.spent
    trace.wall_s = time.perf_counter() - run.t0
    return trace


#: A step depending on one skipped for these reasons is skipped the same way (its input is missing
#: because the request ran out of money or time, not because a worker failed).
_SKIPS_DEPENDENTS: tuple[StepStatus, ...] = ("skipped_budget", "skipped_deadline")


def _name(view: PoolView, ordinal: int) -> str:
    return "conductor" if ordinal == len(view) else view.worker(ordinal).info.name
