"""CPU seconds of each step of a command that runs subprocesses (``make run``'s local pipeline:
one process per kfp component), sampled from ``/proc``.

Why: on a shared machine a step's wall time says more about the other load than about the step;
its CPU time hardly changes with the load. The local pipeline runs each component in its own
``python -m kfp.dsl.executor_main`` process, so the CPU of a step is that process's own plus its
waited-for children's (``utime + stime + cutime + cstime`` in ``/proc/PID/stat``), read every
``--interval`` seconds until it ends (a step shorter than one interval is missed; the last
sample before a process ends is what is reported, so up to one interval of CPU can be missing).
Linux only. Training's own stages are in its ``metrics.json`` (``cpu_seconds``).

Usage: ``python benchmarks/step_cpu.py -- conductor pipeline run --local --preset tiny``
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from collections import defaultdict

TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids[ppid].append(int(entry))
    return kids


def _cpu_and_label(pid: int) -> tuple[float, str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline") as f:
            cmd = f.read().split("\0")
    except OSError:
        return None
    cpu = sum(int(x) for x in fields[11:15]) / TICK
    if "--function_to_execute" in cmd[:-1]:
        label = cmd[cmd.index("--function_to_execute") + 1]
    else:
        label = re.sub(r"\s+", " ", " ".join(cmd))[:100]
    return cpu, label


def profile(argv: list[str], interval: float) -> tuple[int, float, list[tuple[float, float, int, str]]]:
    """Run ``argv``; its return code, wall seconds, and (start s, CPU s, pid, label) per process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv)
    peak: dict[int, tuple[float, float, str]] = {}
    while proc.poll() is None:
        kids, todo = _children(), [proc.pid]
        while todo:
            pid = todo.pop()
            todo += kids.get(pid, [])
            got = _cpu_and_label(pid)
            if got is not None and got[1]:
                start = peak[pid][0] if pid in peak else time.perf_counter() - t0
                peak[pid] = (start, max(got[0], peak.get(pid, (0.0, 0.0, ""))[1]), got[1])
        time.sleep(interval)
    wall = time.perf_counter() - t0
    return proc.returncode, wall, sorted((s, c, pid, label) for pid, (s, c, label) in peak.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval", type=float, default=0.3, help="seconds between samples")
    ap.add_argument("--min-cpu", type=float, default=0.5, help="hide processes below this CPU")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to profile after --")
    rc, wall, rows = profile(command, args.interval)
    print(f"exit {rc}, wall {wall:.0f} s, load average now {os.getloadavg()[0]:.1f}")
    print(f"{'start s':>8} {'CPU s':>8}  process")
    for start, cpu, _pid, label in rows:
        if cpu >= args.min_cpu:
            print(f"{start:8.1f} {cpu:8.1f}  {label}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
