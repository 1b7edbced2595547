"""Code-grading throughput: reference solutions of every mbpp and humaneval task graded per second.

Why: every code reward in training and every code row of an evaluation runs the candidate in the
sandbox. Isolation (bubblewrap namespaces, a harness that reports its verdict over its own
channel) must not make training crawl, so this measures candidates per second through the real
``grade(task, text)`` entry point, with ``--threads`` graders at once (the calibration and
reward code grade from a thread pool), and counts how many reference solutions pass (all should).

On a shared machine the wall figure depends on what else runs: the 1-minute load average before
and after is recorded with it, and "before" and "after" should be measured back to back.

``--git-rev REV`` measures the library as it was at commit REV instead of the working tree: the
``src/`` tree of that commit is exported to a temporary folder (``git archive``) and this script
re-runs itself there in a child process. That is how the "before" figure of a sandbox change is
taken without touching the working tree.

Usage: ``python benchmarks/grading_throughput.py --json benchmarks/results/grading_throughput.json``
(add ``--git-rev HEAD~1 --label before`` for the old code). Results are appended by label to the
JSON file, so "before" and "after" sit side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def measure(threads: int, limit: int | None) -> dict[str, Any]:
    """Grade every mbpp + humaneval reference answer with ``threads`` threads; figures as a dict."""
    import rl_conductor
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.tasks.graders import grade

    tasks = list(load_tasks("mbpp")) + list(load_tasks("humaneval"))
    if limit:
        tasks = tasks[:limit]
    grade(tasks[0], tasks[0].answer)  # warm up: imports, the sandbox's one-off checks
    load_before = os.getloadavg()[0]
    cpu0 = time.process_time()
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda t: grade(t, t.answer), tasks))
    wall = time.perf_counter() - start
    parent_cpu = time.process_time() - cpu0
    failed = [t.id for t, ok in zip(tasks, results, strict=True) if not ok]
    return {
        "library": str(Path(rl_conductor.__file__).resolve().parent),
        "candidates": len(tasks),
        "passed": len(tasks) - len(failed),
        "failed_ids": failed,
        "threads": threads,
        "wall_s": round(wall, 3),
        "candidates_per_s": round(len(tasks) / wall, 2),
        "ms_per_candidate_wall": round(1000 * wall / len(tasks), 1),
        "parent_cpu_s": round(parent_cpu, 3),
        "load_avg_1min_before": round(load_before, 2),
        "load_avg_1min_after": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def measure_at_rev(rev: str, threads: int, limit: int | None) -> dict[str, Any]:
    """Run :func:`measure` in a child whose ``rl_conductor`` is the one of commit ``rev``."""
    with tempfile.TemporaryDirectory(prefix="rlc-bench-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "src"],
            check=True,
            capture_output=True,
        ).stdout
        tar_path = Path(tmp) / "src.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        env = {**os.environ, "PYTHONPATH": str(Path(tmp) / "src")}
        cmd = [sys.executable, __file__, "--threads", str(threads), "--child"]
        if limit:
            cmd += ["--limit", str(limit)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=tmp).stdout
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        result["git_rev"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", rev], check=True, capture_output=True, text=True
        ).stdout.strip()
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="results file; the figures are stored under --label")
    ap.add_argument("--label", default="current", help="key of this measurement in the JSON file")
    ap.add_argument("--git-rev", help="measure the library of this commit instead of the working tree")
    ap.add_argument("--threads", type=int, default=2, help="graders running at once (default 2)")
    ap.add_argument("--limit", type=int, default=None, help="grade only the first N tasks")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.threads, args.limit)))
        return
    if args.git_rev:
        result = measure_at_rev(args.git_rev, args.threads, args.limit)
    else:
        result = measure(args.threads, args.limit)
    print(json.dumps(result, indent=2))
    if args.json:
        data: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
        data[args.label] = result
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
