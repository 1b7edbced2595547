"""Parallel execution of independent steps: wall time of a fan-out workflow versus the same steps
forced to run one after another.

Why: the paper runs every workflow sequentially; this executor runs steps whose dependencies are
done concurrently. A Mixture-of-Agents shape (three independent proposers, then an aggregator
that sees all of them) should take two worker latencies instead of four.

Both workflows use the same four fixed-latency fake workers (``--latency`` seconds each):

* parallel: ``access_list = [[], [], [], "all"]``
* sequential: ``access_list = [[], [0], [1], "all"]`` (each step depends on the previous one)

Each is run ``--repeats`` times in one process, alternating, and the report gives the wall times
(median, min, max), the simulated critical path the trace reports (``Trace.latency_s``) and the
ratio of medians. Simplification: fake workers sleep instead of computing, so this measures the
scheduling, not contention for a model server.

Usage: ``python benchmarks/parallel_speedup.py --json benchmarks/results/parallel_speedup.json``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path
from typing import Any

from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.table import Table

from rl_conductor.executor import execute
from rl_conductor.tasks.base import Task
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Access, Step, Workflow

TASK = Task(
    id="bench/1", question="What is 17 * 23?", answer="391", domain="math", source="bench", grader="math"
)
SHAPES: dict[str, tuple[Access, ...]] = {
    "parallel": ((), (), (), "all"),
    "sequential": ((), (0,), (1,), "all"),
}


def _view(latency_s: float) -> PoolView:
    workers = [
        FakeWorker(info=fake_info(f"w{i}"), answer=f"candidate {i}: 391", latency_s=latency_s)
        for i in range(4)
    ]
    return Pool(name="bench", workers=list(workers)).view()


def workflow(shape: str) -> Workflow:
    access = SHAPES[shape]
    instructions = ["Solve it.", "Solve it.", "Solve it.", "Compare the candidates and answer."]
    return Workflow(steps=tuple(Step(i, instructions[i], a) for i, a in enumerate(access)))


async def measure(latency_s: float, repeats: int) -> dict[str, Any]:
    view = _view(latency_s)
    walls: dict[str, list[float]] = {s: [] for s in SHAPES}
    critical: dict[str, float] = {}
    for _ in range(repeats):
        for shape in SHAPES:
            trace = await execute(workflow(shape), TASK, view)
            assert all(s.status == "ok" for s in trace.steps)
            walls[shape].append(trace.wall_s)
            critical[shape] = trace.latency_s
    out: dict[str, Any] = {"latency_s": latency_s, "repeats": repeats}
    for shape, ws in walls.items():
        out[shape] = {
            "wall_median_s": round(statistics.median(ws), 4),
            "wall_min_s": round(min(ws), 4),
            "wall_max_s": round(max(ws), 4),
            "critical_path_s": round(critical[shape], 4),
            "walls_s": [round(w, 4) for w in ws],
        }
    out["speedup_wall_median"] = round(
        out["sequential"]["wall_median_s"] / out["parallel"]["wall_median_s"], 3
    )
    out["speedup_critical_path"] = round(critical["sequential"] / critical["parallel"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--latency", type=float, default=0.1, help="seconds each fake worker call takes")
    ap.add_argument("--repeats", type=int, default=10, help="runs of each workflow")
    args = ap.parse_args(argv)

    res = asyncio.run(measure(args.latency, args.repeats))
    table = Table(title=f"3 proposers + aggregator, {args.latency:g} s per call, {args.repeats} runs each")
    for col in ("workflow", "wall median s", "wall min s", "wall max s", "critical path s"):
        table.add_column(col, justify="left" if col == "workflow" else "right")
    for shape in SHAPES:
        r = res[shape]
        table.add_row(
            shape,
            f"{r['wall_median_s']:.3f}",
            f"{r['wall_min_s']:.3f}",
            f"{r['wall_max_s']:.3f}",
            f"{r['critical_path_s']:.3f}",
        )
    console = Console()
    console.print(table)
    console.print(
        f"speed-up (sequential / parallel): wall median {res['speedup_wall_median']:.2f}x, "
        f"critical path {res['speedup_critical_path']:.2f}x"
    )
    if args.json:
        write_json(args.json, "parallel_speedup", res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
