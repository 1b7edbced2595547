"""Grades on disk, shared by the processes of one ``CONDUCTOR_HOME``: a code answer is run in the
sandbox once per machine, not once per process.

Why: the simulated workers give a few answer values per question, and each distinct value is
graded for real (a sandbox start for code, a math-verify parse for math). Every process graded
them again: ``make run``'s training step graded every training question's values to build its
candidate table, and its evaluation step graded the same values again to measure each worker
alone; every test and benchmark did the same. Grades here are keyed by the question (its id,
grader, gold answer and metadata, where the tests of a code question are), the answer value and
the version of the grading code, so a grade is reused only where it would come out the same:
the graders' limits count CPU time, not wall time, so a grade does not depend on the load.

What it holds (what :mod:`rl_conductor.workers.simulated.answers` puts there: settled code grades
of simulated values): SHA-256 keys and booleans in one sqlite file per grading-code version,
``<CONDUCTOR_HOME>/.conductor/cache/grades/<version>.sqlite`` — no question or answer text.
``RL_CONDUCTOR_GRADE_CACHE=0`` turns it off. Any error of the store (a read-only folder, a
locked or corrupt file) turns it off for the process with one warning: grading never fails
because of it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import sys
import threading
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from rl_conductor.storage import conductor_home
from rl_conductor.tasks.base import Task

__all__ = ["ENV", "GradeStore", "grade_key", "grading_version", "shared_store"]

log = logging.getLogger(__name__)

#: ``0`` / ``off`` / ``false``: no grade store (every process grades on its own).
ENV = "RL_CONDUCTOR_GRADE_CACHE"
#: The package files a grade depends on (the graders, the sandbox, how simulated values render).
_SOURCES = (
    "tasks/graders.py",
    "tasks/sandbox.py",
    "tasks/sandbox_harness.py",
    "workers/simulated/answers.py",
)

_LOCK = threading.Lock()
_STORES: dict[tuple[int, Path], GradeStore] = {}
_DISABLED: set[int] = set()
_VERSION: str | None = None


def grading_version() -> str:
    """A digest of the grading code (:data:`_SOURCES`), the Python that runs sandboxed code, and
    the versions of math-verify and the parsers it uses."""
    global _VERSION
    if _VERSION is None:
        root = resources.files("rl_conductor")
        h = hashlib.sha256()
        for rel in _SOURCES:
            h.update(rel.encode() + b"\0" + root.joinpath(rel).read_bytes() + b"\0")
        # the interpreter the sandbox runs code with, and what math-verify parses with
        h.update(f"{sys.version}\0{sys.executable}\0{os.path.realpath(sys.executable)}".encode())
        for package in ("math-verify", "sympy", "latex2sympy2_extended"):
            try:
                h.update(f"{package}={metadata.version(package)}\0".encode())
            except metadata.PackageNotFoundError:
                h.update(f"{package} missing\0".encode())
        _VERSION = h.hexdigest()[:16]
    return _VERSION


def grade_key(task: Task, answer: str) -> bytes:
    """The store's key of ``task``'s grade of ``answer`` (an answer value or key)."""
    fields: list[Any] = [task.id, task.grader, task.answer, task.metadata, answer]
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).digest()


class GradeStore:
    """One sqlite file of grades; safe across threads (one connection, a lock) and processes
    (sqlite's own locking; a forked child opens its own connection)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), timeout=60, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS grades (key BLOB PRIMARY KEY, ok INTEGER NOT NULL) WITHOUT ROWID"
        )

    def get(self, key: bytes) -> bool | None:
        """The stored grade (None: none, or the store failed and is now off for this process)."""
        try:
            with self._lock:
                row = self._db.execute("SELECT ok FROM grades WHERE key = ?", (key,)).fetchone()
        except (OSError, sqlite3.Error) as exc:
            disable(exc)
            return None
        return None if row is None else bool(row[0])

    def put(self, key: bytes, ok: bool) -> None:
        """Keep a grade (a failing store turns itself off for this process instead)."""
        try:
            with self._lock:
                self._db.execute("INSERT OR IGNORE INTO grades (key, ok) VALUES (?, ?)", (key, int(ok)))
        except (OSError, sqlite3.Error) as exc:
            disable(exc)


def shared_store() -> GradeStore | None:
    """This process's store for the current ``CONDUCTOR_HOME`` (None: turned off, or failed)."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return None
    pid = os.getpid()
    if pid in _DISABLED:
        return None
    try:  # the home is the current directory by default, which may be gone
        path = conductor_home() / ".conductor" / "cache" / "grades" / f"{grading_version()}.sqlite"
    except OSError as exc:
        disable(exc)
        return None
    with _LOCK:
        store = _STORES.get((pid, path))
        if store is None:
            try:
                store = _STORES[(pid, path)] = GradeStore(path)
            except (OSError, sqlite3.Error) as exc:
                disable(exc)
                return None
    return store


def disable(exc: BaseException) -> None:
    """Stop using the store in this process after ``exc`` (one warning)."""
    if os.getpid() not in _DISABLED:
        _DISABLED.add(os.getpid())
        log.warning(
            "grade store off for this process (%s: %s); grading goes on without it", type(exc).__name__, exc
        )
