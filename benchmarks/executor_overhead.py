"""Executor overhead per step: what ``execute`` adds on top of the worker calls themselves.

Why: every training rollout, evaluation item and served request goes through the executor, so its
own bookkeeping (scheduling steps as asyncio tasks, budget reservations, building messages,
traces) must stay negligible next to a worker call. This times ``execute`` on instant fake
workers (latency 0) for workflows of 1, 3 and 5 steps, and a bare loop that awaits the same
workers one after another with the very same messages (recorded from the executor's own calls),
and reports microseconds per step and the ratio.

Both wall-clock and CPU time (``time.process_time``) are reported: on a shared machine the wall
figure includes time spent waiting for a core, the CPU figure does not.

Simplifications: the workflows are chains in the paper's style (each step sees every earlier
step, ``"all"``), so nothing runs in parallel and the comparison is like for like. Each figure
is the best of ``--repeats`` timings (the least disturbed by other processes on the machine).
Instant fake workers make this an upper bound on the relative overhead: with real workers the
call itself dominates.

Usage: ``python benchmarks/executor_overhead.py --json benchmarks/results/executor_overhead.json``
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.table import Table

from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.tasks.base import Task
from rl_conductor.workers.base import CallContext
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow

TASK = Task(
    id="bench/1",
    question="A train leaves at 9:00 at 80 km/h, a second at 10:00 at 120 km/h. When does it catch up?",
    answer="12:00",
    domain="math",
    source="bench",
    grader="math",
)


def _pool(n: int) -> tuple[PoolView, list[FakeWorker]]:
    workers = [
        FakeWorker(info=fake_info(f"w{i}", price_in=0.5 * (i + 1), price_out=2.0 * (i + 1)), answer="x" * 400)
        for i in range(n)
    ]
    return Pool(name="bench", workers=list(workers)).view(), workers


def chain(steps: int, pool_size: int) -> Workflow:
    return Workflow(
        steps=tuple(
            Step(i % pool_size, f"Subtask {i}: work on it.", "all" if i else ()) for i in range(steps)
        )
    )


async def _time_executor(
    wf: Workflow, view: PoolView, limits: RequestLimits, runs: int
) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``runs`` executions."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(runs):
        await execute(wf, TASK, view, limits)
    return time.perf_counter() - t0, time.process_time() - c0


async def _time_bare(
    calls: list[tuple[FakeWorker, list[dict[str, str]], CallContext]], runs: int
) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of awaiting the recorded calls ``runs`` times, one after another."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(runs):
        for worker, messages, ctx in calls:
            await worker.complete(messages, max_tokens=4096, temperature=0.2, context=ctx)
    return time.perf_counter() - t0, time.process_time() - c0


async def measure(steps: int, runs: int, repeats: int, budget: float | None) -> dict[str, Any]:
    view, workers = _pool(3)
    wf = chain(steps, len(view))
    limits = RequestLimits(max_cost_usd=budget)
    # one recorded run gives the exact messages the bare loop replays
    await execute(wf, TASK, view, limits)
    calls: list[tuple[FakeWorker, list[dict[str, str]], CallContext]] = []
    for w in workers:
        for c in w.calls:
            ctx, messages = c["context"], c["messages"]
            assert isinstance(ctx, CallContext) and isinstance(messages, list)
            calls.append((w, messages, ctx))
    calls.sort(key=lambda call: call[2].step_index)
    assert len(calls) == steps
    ex_wall = ex_cpu = bare_wall = bare_cpu = float("inf")
    for _ in range(repeats):
        for w in workers:
            w.calls.clear()
        wall, cpu = await _time_executor(wf, view, limits, runs)
        ex_wall, ex_cpu = min(ex_wall, wall), min(ex_cpu, cpu)
        for w in workers:
            w.calls.clear()
        wall, cpu = await _time_bare(calls, runs)
        bare_wall, bare_cpu = min(bare_wall, wall), min(bare_cpu, cpu)
    per_step = 1e6 / (runs * steps)
    return {
        "steps": steps,
        "budget": budget,
        "runs": runs,
        "executor_us_per_step": round(ex_wall * per_step, 2),
        "bare_us_per_step": round(bare_wall * per_step, 2),
        "overhead_us_per_step": round((ex_wall - bare_wall) * per_step, 2),
        "ratio": round(ex_wall / bare_wall, 2),
        "executor_cpu_us_per_step": round(ex_cpu * per_step, 2),
        "bare_cpu_us_per_step": round(bare_cpu * per_step, 2),
        "cpu_ratio": round(ex_cpu / bare_cpu, 2),
        "executor_us_per_workflow": round(ex_wall / runs * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--runs", type=int, default=2000, help="workflows timed per measurement")
    ap.add_argument("--repeats", type=int, default=3, help="timings per figure; the best is kept")
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 3, 5])
    args = ap.parse_args(argv)

    rows = [
        asyncio.run(measure(n, args.runs, args.repeats, budget)) for budget in (None, 1.0) for n in args.steps
    ]
    table = Table(title=f"Executor overhead per step (instant fake workers, best of {args.repeats})")
    cols = ("steps", "budget", "executor µs/step", "bare µs/step", "overhead µs/step", "ratio", "CPU ratio")
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["steps"]),
            "none" if r["budget"] is None else f"${r['budget']:g}",
            f"{r['executor_us_per_step']:.1f}",
            f"{r['bare_us_per_step']:.1f}",
            f"{r['overhead_us_per_step']:.1f}",
            f"{r['ratio']:.1f}x",
            f"{r['cpu_ratio']:.1f}x",
        )
    Console().print(table)
    if args.json:
        write_json(args.json, "executor_overhead", {"repeats": args.repeats, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
