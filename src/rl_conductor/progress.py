"""Progress of long loops (evaluation, training): a rich bar on a terminal, plain lines elsewhere.

Why: rich draws its bar only on a terminal; with output redirected (a log file, CI, a pipe, a
KFP pod) it prints nothing until the loop ends, and an evaluation or a warm start looks hung for
minutes. Off a terminal the same calls print one line to stderr every ``PLAIN_EVERY_S`` seconds
(and at the end) — ``eval knn: 96/321 (30 %), 0:00:41`` — so a log shows that work goes on.

Forks while a bar is drawn: rich's bar redraws from its own thread and, while it is live, routes
``sys.stdout``/``sys.stderr`` through its console's lock. A process forked while that thread held
the lock (the candidate table's and the routers' forked builders, ``tasks/forked.py``) inherits it
held by a thread that does not exist there, and hangs at its first write to stderr (an outside
tester's synthetic run: 1 in 400). So every live bar's locks are taken just before any fork and
released on both sides after it (:func:`os.register_at_fork`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import weakref
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

#: Seconds between two plain progress lines.
PLAIN_EVERY_S = 15.0


class PlainProgress:
    """The subset of ``rich.progress.Progress`` the project uses, as periodic plain lines."""

    def __init__(self, stream: TextIO | None = None, every_s: float = PLAIN_EVERY_S) -> None:
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self._tasks: dict[int, dict[str, Any]] = {}
        self._start = time.monotonic()

    def start(self) -> None:
        """Nothing to draw: lines are printed as progress is reported."""

    def stop(self) -> None:
        """Nothing to clear."""

    def add_task(self, description: str, total: float | None = None, completed: float = 0) -> int:
        tid = len(self._tasks)
        self._tasks[tid] = {"description": description, "total": total, "completed": completed, "last": 0.0}
        return tid

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, completed=self._tasks[task_id]["completed"] + advance)

    def update(self, task_id: int, *, completed: float | None = None, description: str | None = None) -> None:
        t = self._tasks[task_id]
        if completed is not None:
            t["completed"] = completed
        if description is not None:
            t["description"] = description
        now = time.monotonic()
        done = t["total"] is not None and t["completed"] >= t["total"]
        if done or now - t["last"] >= self.every_s:
            t["last"] = now
            self._line(t, now)

    def _line(self, t: dict[str, Any], now: float) -> None:
        elapsed = timedelta(seconds=int(now - self._start))
        total = t["total"]
        if total:
            share = f" ({100 * t['completed'] / total:.0f} %)"
            done = f"{t['completed']:g}/{total:g}{share}"
        else:
            done = f"{t['completed']:g}"
        print(f"{t['description']}: {done}, {elapsed}", file=self.stream, flush=True)


#: the rich bars being drawn now (their locks are held across a fork, module docstring)
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
#: the locks the forking thread holds (per thread: two threads may fork at once)
_HELD = threading.local()


def _before_fork() -> None:
    # a bar opened inside another is drawn by the outer one's display (rich nests them), which
    # is the display to hold; every display's lock first, then each console's once: the refresh
    # thread's order (its display's lock, then its console's), so no two threads wait on each other
    lives: dict[int, Any] = {}
    for bar in list(_LIVE):
        live = bar.live
        if live._nested:
            live = bar.console._live_stack[0] if bar.console._live_stack else None
        if live is not None:
            lives[id(live)] = live
    # in one order for every thread (two threads forking at once take them alike)
    ordered = [lives[k] for k in sorted(lives)]
    consoles = {id(live.console): live.console for live in ordered}
    held = _HELD.__dict__.setdefault("locks", [])
    for lock in [live._lock for live in ordered] + [consoles[k]._lock for k in sorted(consoles)]:
        lock.acquire()
        held.append(lock)


def _after_fork() -> None:
    # in the child the forking thread is its main thread, which owns these re-entrant locks
    held = _HELD.__dict__.get("locks", [])
    while held:
        held.pop().release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


def guard_forks(bar: Any, on: bool = True) -> None:
    """Hold ``bar``'s locks (a started ``rich.progress.Progress``) across every fork while it is
    drawn (module docstring); ``on=False`` when it stops."""
    if on:
        _LIVE.add(bar)
    else:
        _LIVE.discard(bar)


@contextmanager
def _tracked(bar: Any) -> Iterator[Any]:
    guard_forks(bar)
    try:
        yield bar
    finally:
        guard_forks(bar, on=False)


def is_terminal() -> bool:
    """Whether rich would draw a live bar on stdout."""
    from rich.console import Console

    return Console().is_terminal


@contextmanager
def progress(enabled: bool = True, *, transient: bool = True) -> Iterator[Any]:
    """A progress display: rich's bar on a terminal, :class:`PlainProgress` lines elsewhere, and a
    disabled rich one (prints nothing) when ``enabled`` is False."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if enabled and not is_terminal():
        yield PlainProgress()
        return
    with (
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            disable=not enabled,
            transient=transient,
        ) as bar,
        _tracked(bar),
    ):
        yield bar


def run_with_progress(
    jobs: Sequence[Coroutine[Any, Any, T]], *, label: str, enabled: bool, limit: int = 256
) -> list[T]:
    """The results of ``jobs``, in order, run ``limit`` at a time in a new event loop, each
    finished one advancing a :func:`progress` display named ``label`` (from synchronous code:
    the warm start's rounds table and review rows, minutes on a new file)."""
    if not jobs:
        return []
    with progress(enabled) as bar:
        pid = bar.add_task(label, total=len(jobs))

        async def gather() -> list[T]:
            sem = asyncio.Semaphore(limit)

            async def one(job: Coroutine[Any, Any, T]) -> T:
                async with sem:
                    out = await job
                bar.advance(pid, 1)
                return out

            return list(await asyncio.gather(*(one(j) for j in jobs)))

        return asyncio.run(gather())
