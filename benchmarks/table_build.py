"""Candidate table build: wall time of the serial (one process) build versus the forked
multi-process build, and a check that both give the same table.

Why: the warm start's candidate table (:mod:`rl_conductor.training.candidates`) is the largest
single cost of ``make run``; its executions are CPU-bound (simulated workers, graders), so one
asyncio process uses one core. The parallel build splits each stage's job list into contiguous
chunks run in forked processes and must give the serial table array for array.

Setup: ``--per-domain`` training questions per domain of ``paper-mix`` (the first by the
table's stable hash order), the ``paper-sim`` pool (seed 0), the tiny preset's budgets,
warm-start deadlines (on ``--deadline-per-domain`` items per domain, default all),
``top_k``/``cheap_k`` and step cap; built once with ``workers=1`` (twice with
``--repeat-serial``: a serial build must also equal itself) and once with ``--workers``
processes (default: the CPUs this process may use), each in a fresh process with a fresh
``CONDUCTOR_HOME`` (no grade kept on disk by one build serves the next), serial first.
``make run``'s size is ``--per-domain 500 --deadline-per-domain 200`` (the tiny preset's
``warm_items_per_domain`` and ``warm_deadline_items_per_domain``).
``parallel_min_jobs`` is left at its default, so stages with few jobs stay in process in both.
On a shared machine the wall figures include waiting for a core; the load average is recorded,
and so is the CPU time of each build (its process and its forked children), which the other
load changes far less.

Usage: ``python benchmarks/table_build.py --json benchmarks/results/table_build.json``
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.table import Table

from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.training.candidates import CandidateTable, build_table, select_items, table_workers
from rl_conductor.training.config import load_preset
from rl_conductor.workers.pool import load_pool

ARRAYS = ("correct", "cost", "stopped", "tokens", "done", "calls", "cut")


def build_once(per_domain: int, deadline_per_domain: int, workers: int, out: Path) -> tuple[float, float]:
    """Build the table (tiny preset settings) with ``workers`` processes, save it to ``out`` and
    return the build's wall seconds and CPU seconds (this process and its children)."""
    cfg = load_preset("tiny")
    tasks = select_items(load_tasks("paper-mix", split="train"), per_domain)
    pool = load_pool("paper-sim", seed=0)
    t0, c0 = time.perf_counter(), _cpu()
    table = build_table(
        tasks,
        pool,
        budgets=cfg.budgets_usd,
        deadlines=cfg.warm_deadlines_s,
        deadline_items_per_domain=deadline_per_domain,
        top_k=cfg.warm_top_k,
        cheap_k=cfg.warm_cheap_k,
        max_steps=cfg.max_steps_per_workflow,
        workers=workers,
    )
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    table.save(out)
    return wall, cpu


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended (the forked workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(per_domain: int, deadline_per_domain: int, workers: int, repeat_serial: bool) -> dict[str, Any]:
    """Each build in a fresh process (module-level caches of the pool and graders would favour
    whichever build runs second in one process) with its own ``CONDUCTOR_HOME``."""
    out: dict[str, Any] = {
        "items_per_domain": per_domain,
        "deadline_items_per_domain": deadline_per_domain,
        "workers": workers,
    }
    tables = {}
    builds = [("serial", 1), *([("serial_again", 1)] if repeat_serial else []), ("parallel", workers)]
    with tempfile.TemporaryDirectory() as tmp:
        for mode, w in builds:
            path = Path(tmp) / f"{mode}.npz"
            load = os.getloadavg()[0]
            cmd = [
                sys.executable,
                __file__,
                "--per-domain",
                str(per_domain),
                "--deadline-per-domain",
                str(deadline_per_domain),
                "--build-one",
                str(w),
                str(path),
            ]
            env = {**os.environ, "CONDUCTOR_HOME": str(Path(tmp) / f"home-{mode}")}
            res = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
            wall, cpu = map(float, res.stdout.strip().splitlines()[-1].split())
            out[mode] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_avg_1m_before": load}
            tables[mode] = CandidateTable.load(path)
    s = tables["serial"]
    out["items"] = len(s.task_ids)
    out["candidates"] = len(s.candidates)
    out["cells_done"] = int(s.done.sum())
    out["identical"] = True
    for mode in tables:
        if mode == "serial":
            continue
        p = tables[mode]
        same = [c.name for c in s.candidates] == [c.name for c in p.candidates]
        diff = {a: int((getattr(s, a) != getattr(p, a)).sum()) if same else -1 for a in ARRAYS}
        out[f"differing_cells_{mode}"] = diff
        out["identical"] = out["identical"] and same and not any(diff.values())
    out["speedup_wall"] = round(out["serial"]["wall_s"] / out["parallel"]["wall_s"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--per-domain", type=int, default=40, help="training questions per domain")
    ap.add_argument(
        "--deadline-per-domain",
        type=int,
        default=None,
        help="items per domain of the deadline columns (default: all)",
    )
    ap.add_argument(
        "--repeat-serial", action="store_true", help="build serially twice (a serial build must equal itself)"
    )
    ap.add_argument("--workers", type=int, default=None, help="processes of the parallel build")
    ap.add_argument("--build-one", nargs=2, metavar=("WORKERS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    deadline_per_domain = args.deadline_per_domain or args.per_domain
    if args.build_one:
        print(
            *build_once(args.per_domain, deadline_per_domain, int(args.build_one[0]), Path(args.build_one[1]))
        )
        return 0

    # the parallel side uses every CPU (at least two), as the library does by default
    workers = table_workers(args.workers) if args.workers else max(2, len(os.sched_getaffinity(0)))
    res = measure(args.per_domain, deadline_per_domain, workers, args.repeat_serial)
    table = Table(title=f"candidate table, {res['items']} items x {res['candidates']} candidates, paper-sim")
    for col in ("build", "processes", "wall s", "CPU s", "load 1m before"):
        table.add_column(col, justify="left" if col == "build" else "right")
    for mode, w in (("serial", 1), ("serial_again", 1), ("parallel", res["workers"])):
        if mode not in res:
            continue
        r = res[mode]
        table.add_row(
            mode, str(w), f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}", f"{r['load_avg_1m_before']:.2f}"
        )
    console = Console()
    console.print(table)
    console.print(f"speed-up {res['speedup_wall']:.2f}x; tables identical: {res['identical']}")
    for key in (k for k in res if k.startswith("differing_cells_")):
        console.print(f"{key}: {res[key]}")
    if args.json:
        write_json(args.json, "table_build", res)
    return 0 if res["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
