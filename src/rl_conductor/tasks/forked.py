"""Run chunks of CPU-bound executions and grading in forked processes, results in input order.

Why: the executor's asyncio loop runs on one core, and executing and grading thousands of calls
to simulated workers is CPU-bound Python. The candidate table (``training/candidates.py``) and
the routers' measurement of every worker alone (``policies/routers.py``) each split their work
into contiguous chunks run in forked children, which inherit the work through fork (nothing is
pickled on the way in) and send back compact results.

Why it sits beside the graders: a child grades code in sandboxes and math through a helper
process, and it must leave nothing behind. Each child adopts the orphans of its sandboxes
(``sandbox.adopt_orphans``) and, when the pool is closed and joined, stops its test runners and
its math helper and reaps the rest (in a pod whose PID 1 is the parent nobody else would;
``atexit`` does not run in a pool worker, its ``Finalize`` does).

Deliberate simplifications: ``fork`` only (elsewhere everything runs in this process); callers
pass work that never touches torch in the child (the parent may have initialised it); one
chunk list per call, no nesting.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from rl_conductor.tasks.graders import close_math_helper
from rl_conductor.tasks.sandbox import adopt_orphans, close_runners, sweep_orphans

__all__ = ["WORKERS_ENV", "chunk_bounds", "fork_map", "fork_workers"]

#: Env override of the number of forked processes (1: everything in this process; ``auto``: the
#: CPUs this process may run on, at most 16). The name predates the routers' use of it.
WORKERS_ENV = "RL_CONDUCTOR_TABLE_WORKERS"
_MAX_WORKERS = 16

R = TypeVar("R")

# What the children read (inherited through fork, never pickled): the function and the chunks.
_STATE: tuple[Callable[[int, int], Any], list[tuple[int, int]]] | None = None


def fork_workers(workers: int | None = None) -> int:
    """The number of processes to fork: ``workers`` if given, else ``$RL_CONDUCTOR_TABLE_WORKERS``
    (a number, or ``auto``), else ``auto``: the CPUs this process may run on, capped at 16; 1
    where ``fork`` is unavailable."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if workers is None:
        env = os.environ.get(WORKERS_ENV, "").strip() or "auto"
        if env != "auto":
            try:
                workers = int(env)
            except ValueError:
                raise ValueError(f"{WORKERS_ENV} must be an integer, got {env!r}") from None
        else:
            try:
                workers = len(os.sched_getaffinity(0))
            except AttributeError:  # not Linux
                workers = os.cpu_count() or 1
            workers = min(workers, _MAX_WORKERS)
    if workers < 1:
        raise ValueError(f"forked workers must be >= 1, got {workers}")
    return workers


def chunk_bounds(n: int, n_chunks: int) -> list[tuple[int, int]]:
    """``n`` items cut into at most ``n_chunks`` contiguous, non-empty ``(lo, hi)`` ranges."""
    edges = [round(n * c / n_chunks) for c in range(n_chunks + 1)]
    return [(edges[c], edges[c + 1]) for c in range(n_chunks) if edges[c + 1] > edges[c]]


def _child_init() -> None:
    adopt_orphans()
    multiprocessing.util.Finalize(None, _child_exit, exitpriority=10)


def _child_exit() -> None:
    close_runners()
    close_math_helper()
    sweep_orphans()


def _run(c: int) -> Any:
    assert _STATE is not None
    fn, bounds = _STATE
    return fn(*bounds[c])


def fork_map(fn: Callable[[int, int], R], bounds: Sequence[tuple[int, int]], workers: int) -> Iterator[R]:
    """``fn(lo, hi)`` for each chunk of ``bounds`` in ``workers`` forked processes (one chunk at a
    time per process, so slow chunks even out), yielded in the order of ``bounds`` as they
    arrive. ``fn`` and whatever it reads are inherited through fork; its result is pickled back."""
    global _STATE
    if _STATE is not None:
        raise RuntimeError("fork_map does not nest")
    _STATE = (fn, list(bounds))
    try:
        with multiprocessing.get_context("fork").Pool(workers, initializer=_child_init) as procs:
            yield from procs.imap(_run, range(len(bounds)), chunksize=1)
            procs.close()  # workers exit normally and run their Finalize (not terminate()d)
            procs.join()
    finally:
        _STATE = None
