"""A process forked while a rich bar is drawn can write to stderr (rl_conductor/progress.py).

The bar's refresh thread holds its console's lock while it draws, and a live bar routes
``sys.stderr`` through that lock; a child forked at that moment used to hang at its first write.
The test holds the lock from another thread at the moment of the fork, which is what the refresh
thread does for a few milliseconds ten times a second.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import pytest

from rl_conductor import progress as progress_mod


def _fork_and_write(wait_s: float = 20.0) -> int | None:
    """Fork; the child writes a line to stderr and exits 0. The child's exit code, or None if
    it was still running after ``wait_s`` (then killed)."""
    pid = os.fork()
    if pid == 0:  # the child
        try:
            sys.stderr.write("child writes through the bar\n")
            sys.stderr.flush()
        finally:
            os._exit(0)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def _hold(lock: Any, seconds: float) -> threading.Thread:
    held = threading.Event()

    def run() -> None:
        with lock:
            held.set()
            time.sleep(seconds)

    t = threading.Thread(target=run)
    t.start()
    held.wait()
    return t


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich draws a live bar and redirects stderr through it
    assert progress_mod.is_terminal()


def test_a_child_forked_while_the_bar_draws_can_write_to_stderr(terminal: None) -> None:
    with progress_mod.progress(True) as bar:
        assert bar.console.is_terminal and bar in progress_mod._LIVE
        t = _hold(bar.console._lock, 0.5)  # the refresh thread, mid-draw
        code = _fork_and_write()
        t.join()
    assert code == 0, "the forked child hung at its first write to stderr"
    assert bar not in progress_mod._LIVE and not progress_mod._HELD.__dict__.get("locks")


def test_without_the_guard_the_child_hangs(terminal: None) -> None:
    """The failure the guard prevents, so that the test above can fail."""
    with progress_mod.progress(True) as bar:
        progress_mod.guard_forks(bar, on=False)
        t = _hold(bar.console._lock, 0.5)
        code = _fork_and_write(wait_s=3.0)  # a hung child stays hung: a slow machine cannot pass this
        t.join()
    assert code is None, "the child wrote: the test above cannot tell the guard from no guard"
    assert bar not in progress_mod._LIVE


def test_the_trainers_bar_is_guarded_while_it_draws(terminal: None) -> None:
    from types import SimpleNamespace

    from rl_conductor.training.callbacks import RichProgress

    cb = RichProgress("SFT")
    state = SimpleNamespace(max_steps=3, global_step=0)
    cb.on_train_begin(None, state, None)
    bar = cb._progress
    assert bar in progress_mod._LIVE
    t = _hold(bar.console._lock, 0.3)
    code = _fork_and_write()
    t.join()
    cb.on_train_end(None, state, None)
    assert code == 0
    assert bar not in progress_mod._LIVE


@pytest.mark.parametrize("registered", ["both", "inner only"])
def test_a_bar_inside_another_holds_the_outer_display_without_deadlock(
    terminal: None, registered: str
) -> None:
    """rich draws a bar opened inside another through the outer one's display: the fork must hold
    the outer display's lock (which a child's write to stderr takes), and take every display's
    lock before any console's, as the refresh thread does (a guard that took the inner bar's
    console lock first then waited on the outer display deadlocked with the outer refresh
    thread, which held that display and waited on the console)."""
    with progress_mod.progress(True) as outer, progress_mod.progress(True) as inner:
        assert inner.live._nested and not outer.live._nested
        if registered == "inner only":
            progress_mod.guard_forks(outer, on=False)
        got_console: list[bool] = []
        holding = threading.Event()

        def refresh_like() -> None:  # what outer's refresh thread does: its display, then the console
            with outer.live._lock:
                holding.set()
                time.sleep(0.3)
                ok = outer.console._lock.acquire(timeout=5)
                got_console.append(ok)
                if ok:
                    outer.console._lock.release()

        t = threading.Thread(target=refresh_like)
        t.start()
        holding.wait()
        code = _fork_and_write()
        t.join()
    assert got_console == [True], "the fork held the console while it waited for the display"
    assert code == 0, "the forked child hung at its first write to stderr"
