"""Run a workflow against a worker pool: the one execution path of training, evaluation and serving.

``execute(workflow, task, view, limits)`` builds each step's message from its access list, runs
steps whose dependencies are done concurrently (asyncio), and returns a :class:`Trace`.
Whatever the policy wrote, it enforces:

* **budget** — before a call it reserves the worst case the call can cost (a conservative input
  token count plus ``max_tokens`` of output, with ``max_tokens`` capped to what the unreserved
  budget affords) and charges the real cost afterwards, so ``trace.cost_usd`` never exceeds
  ``limits.max_cost_usd`` as long as workers honour ``max_tokens``. A step that cannot afford
  ``MIN_OUTPUT_TOKENS`` of output is skipped, its dependents too, and the best answer so far
  (the latest completed step) becomes the final answer.
* **allowed workers and sensitivity** — a forbidden worker (not in ``allowed_workers``, or external
  on a ``private`` request) is replaced by the permitted worker of the view whose price is
  closest; with none permitted the step is skipped. Private requests never reach an external worker.
* **failures** — a call that raises or passes ``step_timeout_s`` is retried on a fallback worker of
  the same hosting class; after that the step is ``failed`` and its dependents run without it.
* **recursion** — worker id ``len(view)`` names the Conductor itself; the executor calls the
  ``recursion`` hook (the policy) with the parent workflow and the answers so far, up to
  ``limits.recursion_depth`` levels; deeper, the step keeps the previous answer.

Latency is reported two ways: ``Trace.wall_s`` (measured) and ``Trace.latency_s`` (critical path
of the workers' reported latencies, which is what simulated pools model).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from rl_conductor.tasks.base import Task
from rl_conductor.trace import Limits, StepRecord, Trace
from rl_conductor.workers.base import CallContext, Completion, Worker
from rl_conductor.workers.pool import PoolView
from rl_conductor.workflow import Step, Workflow, worker_message

#: A step that cannot afford this many output tokens is not started.
MIN_OUTPUT_TOKENS = 64
#: Conservative characters-per-token used to reserve input cost (real tokenizers average ~4).
_RESERVE_CHARS_PER_TOKEN = 2.5
_MESSAGE_OVERHEAD_TOKENS = 16


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


def reserve_input_tokens(messages: list[dict[str, str]]) -> int:
    """An upper-bound estimate of input tokens, used only for budget reservations."""
    chars = sum(len(m.get("content", "")) for m in messages)
    return math.ceil(chars / _RESERVE_CHARS_PER_TOKEN) + _MESSAGE_OVERHEAD_TOKENS * len(messages)


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
class _Run:
    task: Task
    workflow: Workflow
    view: PoolView
    limits: Limits
    recursion: RecursionHook | None
    depth: int
    budget: _Budget
    records: list[StepRecord] = field(default_factory=list)
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


async def _call(
    run: _Run, worker: Worker, messages: list[dict[str, str]], ctx: CallContext
) -> tuple[Completion | None, str]:
    """One budgeted call. Returns (completion, "") or (None, why it failed; "budget" if unaffordable)."""
    info = worker.info
    in_tok = reserve_input_tokens(messages)
    in_cost = in_tok * info.price_in / 1e6
    while True:
        cap = min(run.limits.max_tokens, info.max_output_tokens)
        avail = run.budget.available()
        if math.isfinite(avail):
            if info.price_out > 0:
                cap = min(cap, math.floor((avail - in_cost) * 1e6 / info.price_out))
            elif avail < in_cost:
                cap = -1
        if cap >= MIN_OUTPUT_TOKENS:
            break
        if run.budget.holds == 0:
            return None, "budget"
        # siblings in flight hold reservations: wait until one settles, then look again
        run.budget.changed.clear()
        await run.budget.changed.wait()
    reservation = in_cost + cap * info.price_out / 1e6
    run.budget.reserve(reservation)
    try:
        comp = await asyncio.wait_for(
            worker.complete(messages, max_tokens=cap, temperature=run.limits.temperature, context=ctx),
            timeout=run.limits.step_timeout_s,
        )
    except TimeoutError:
        # a timed-out call may still be billed: keep its reservation counted as spent
        run.budget.release(reservation, reservation)
        return None, f"{info.name}: timed out after {run.limits.step_timeout_s:g}s"
    except Exception as exc:  # any worker failure is recorded and replaced
        run.budget.release(reservation, 0.0)
        return None, f"{info.name}: {exc.__class__.__name__}: {str(exc)[:200]}"
    run.budget.release(reservation, comp.cost_usd)
    if not isinstance(comp.text, str) or not comp.text.strip():
        return None, f"{info.name}: empty answer"
    return comp, ""


async def _run_step(run: _Run, index: int, step: Step, done: dict[int, StepRecord]) -> StepRecord:
    visible_idx = [i for i in step.visible(index) if done[i].status in ("ok", "recursed")]
    visible = [(i, run.workflow.steps[i].instruction, done[i].answer) for i in visible_idx]
    start = max((run.finish.get(i, 0.0) for i in step.visible(index)), default=0.0)

    if step.worker == len(run.view):
        return await _run_recursion(run, index, step, visible, start)

    rec = StepRecord(
        index=index,
        worker=run.view.worker(step.worker).info.name,
        instruction=step.instruction,
        visible=visible_idx,
        started_s=start,
    )
    ordinal: int | None = step.worker
    notes: list[str] = []
    if not _permitted(run.view, run.limits, step.worker):
        sub = _substitute(run.view, run.limits, step.worker, exclude=set())
        notes.append(f"{rec.worker} not permitted ({run.limits.sensitivity} request)")
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
    )
    tried: set[int] = set()
    while ordinal is not None:
        tried.add(ordinal)
        worker = run.view.worker(ordinal)
        comp, err = await _call(run, worker, messages, ctx)
        if comp is not None:
            rec.worker = worker.info.name
            rec.answer = comp.text
            rec.input_tokens, rec.output_tokens = comp.input_tokens, comp.output_tokens
            rec.cost_usd, rec.latency_s, rec.cached = comp.cost_usd, comp.latency_s, comp.cached
            rec.finish_reason, rec.tokens_estimated = comp.finish_reason, comp.tokens_estimated
            if comp.finish_reason == "length":
                notes.append("output truncated at max_tokens")
            rec.status = "ok"
            break
        if err == "budget":
            rec.status = "skipped_budget"
            notes.append("budget exhausted")
            break
        notes.append(err)
        rec.status = "failed"
        # a fallback of the same hosting class, never one the request forbids
        same = [
            j
            for j in range(len(run.view))
            if j not in tried
            and _permitted(run.view, run.limits, j)
            and run.view.worker(j).info.hosting == worker.info.hosting
        ]
        ordinal = (
            min(same, key=lambda j: abs(run.view.worker(j).info.price_out - worker.info.price_out))
            if same
            else None
        )
        if ordinal is not None:
            notes.append(f"fallback to {run.view.worker(ordinal).info.name}")
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
    )
    prev = visible[-1][2] if visible else ""
    if run.recursion is None or run.depth >= run.limits.recursion_depth:
        rec.status, rec.answer = "recursed", prev
        rec.note = "recursion depth reached: previous answer kept"
        run.finish[index] = start
        return rec
    avail = run.budget.available()
    hold = 0.0 if math.isinf(avail) else max(0.0, avail)
    sub_limits = replace(run.limits, max_cost_usd=None if math.isinf(avail) else hold)
    run.budget.reserve(hold)
    charge = 0.0
    try:
        inner = await run.recursion(
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
        charge = inner.cost_usd
    finally:
        run.budget.release(hold, charge)
    rec.status = "recursed"
    rec.substeps = inner.steps
    rec.answer = inner.final_answer or prev
    rec.note = (
        "inner workflow kept the previous answer"
        if not inner.steps
        else f"inner workflow of {len(inner.steps)} steps"
    )
    rec.latency_s = inner.latency_s
    run.finish[index] = start + inner.latency_s
    return rec


async def execute(
    workflow: Workflow,
    task: Task,
    view: PoolView,
    limits: Limits | None = None,
    *,
    recursion: RecursionHook | None = None,
    depth: int = 0,
) -> Trace:
    """Execute ``workflow`` for ``task`` on ``view`` within ``limits`` and return its trace."""
    limits = limits or Limits()
    steps = workflow.steps[: limits.max_steps]
    run = _Run(task, workflow, view, limits, recursion, depth, _Budget(limits.max_cost_usd))
    trace = Trace(task_id=task.id)
    if len(workflow.steps) > limits.max_steps:
        trace.notes.append(f"workflow truncated to {limits.max_steps} steps")
    for i, s in enumerate(steps):
        if not 0 <= s.worker <= len(view):
            raise ValueError(f"step worker id {s.worker} is outside the view of {len(view)} workers")
        if not all(0 <= d < i for d in s.visible(i)):
            raise ValueError(f"step {i} may only see earlier steps, not {s.access}")

    done: dict[int, StepRecord] = {}
    pending = set(range(len(steps)))
    running: dict[asyncio.Task[StepRecord], int] = {}
    while pending or running:
        for i in sorted(pending):
            deps = steps[i].visible(i)
            if all(d in done for d in deps):
                if any(done[d].status in ("skipped_budget",) for d in deps):
                    done[i] = StepRecord(
                        index=i,
                        worker=_name(view, steps[i].worker),
                        instruction=steps[i].instruction,
                        visible=[],
                        status="skipped_budget",
                        note="a step it depends on was skipped",
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

    trace.steps = [done[i] for i in range(len(steps))]
    answered = [r for r in trace.steps if r.status in ("ok", "recursed") and r.answer]
    trace.final_answer = answered[-1].answer if answered else ""
    if trace.steps and trace.steps[-1].status not in ("ok", "recursed"):
        trace.stopped_reason = trace.steps[-1].status
    trace.wall_s = time.perf_counter() - run.t0
    return trace


def _name(view: PoolView, ordinal: int) -> str:
    return "conductor" if ordinal == len(view) else view.worker(ordinal).info.name
