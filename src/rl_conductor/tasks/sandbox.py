"""Run untrusted Python (worker-written code answers) in a constrained child process.

Code tasks are graded by running the candidate program together with the task's tests; a pass
is exit code 0. Training grades thousands of such programs, so the sandbox is a plain
subprocess (tens of milliseconds per call), not a container or a VM.

What it does:

* a fresh ``python -I -B`` child (isolated mode: no user site, no ``PYTHON*`` variables, no
  script directory on ``sys.path``) in its own empty temporary directory, which is its cwd and
  ``HOME``/``TMPDIR``, deleted afterwards;
* a new session (process group) that is SIGKILLed as a whole on the wall-clock timeout;
* resource limits set before the untrusted code runs, soft = hard so they cannot be raised back
  by an unprivileged user: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` (file and
  output size), ``RLIMIT_NOFILE`` and ``RLIMIT_CORE``;
* a stripped environment (``PATH``, ``LANG``, ``HOME``, ``TMPDIR`` and single-thread BLAS settings);
* a preamble that installs a ``sys.addaudithook`` hook which raises ``PermissionError`` on
  socket creation or use, on ``subprocess``/``os.system``/``os.exec*``/``os.posix_spawn``/
  ``os.fork``/``os.kill``, on ``ctypes`` (which would bypass everything else), on opening a file
  for writing outside the temporary directory, on ``os.open`` of anything outside it, and on
  removing, renaming, linking or changing the metadata of paths outside it; it also disables
  ``_posixsubprocess.fork_exec``, which CPython does not audit;
* stdout and stderr go to files and come back truncated to ``output_cap`` characters.

What it deliberately does not do (it is not a security boundary against a determined attacker):

* no filesystem isolation for reads: the child can read any file the parent user can read;
* audit hooks are a CPython-level guard; C extensions already importable (numpy's, for example)
  or interpreter internals can act without raising events;
* as root, the resource limits can be raised again and file permissions do not apply;
* ``RLIMIT_NPROC`` is not set: Linux counts threads as processes and counts per user across the
  whole machine, so any useful value either breaks ``threading`` or limits nothing; fork and
  exec are refused by the audit hook instead;
* no network namespace, no seccomp, no cgroup: run real untrusted workloads in a container
  (the Kubernetes deployment does) if the threat model is more than buggy code.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: Characters of stdout/stderr kept in a SandboxResult.
DEFAULT_OUTPUT_CAP = 20_000
#: Bytes any file the child writes (including its stdout/stderr) may reach.
FILE_SIZE_LIMIT = 16 * 1024 * 1024

_PREAMBLE = r"""
import os, sys, resource

_WORK = os.path.realpath(os.getcwd())
for _lim, _val in (
    (resource.RLIMIT_AS, {mem}),
    (resource.RLIMIT_CPU, {cpu}),
    (resource.RLIMIT_FSIZE, {fsize}),
    (resource.RLIMIT_NOFILE, 64),
    (resource.RLIMIT_CORE, 0),
):
    try:
        resource.setrlimit(_lim, (_val, _val))
    except (ValueError, OSError):
        pass

try:
    import ctypes  # imported before the hook so numpy (which imports it) works; ctypes.* is refused
except ImportError:
    pass
try:
    import _posixsubprocess

    def _no_fork_exec(*args, **kwargs):
        raise PermissionError("sandbox: process creation is not allowed")

    _posixsubprocess.fork_exec = _no_fork_exec
except ImportError:
    pass

_FORBIDDEN_PREFIXES = ("socket.", "subprocess.", "ctypes.", "os.exec", "os.spawn", "os.posix_spawn",
                       "os.fork", "os.forkpty", "os.system", "os.kill", "os.killpg", "pty.",
                       "os.setuid", "os.setgid", "resource.setrlimit", "resource.prlimit",
                       "sys.remote_exec", "winreg.")
_PATH_EVENTS = {{"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
                "os.link": (0, 1), "os.symlink": (0, 1), "os.chmod": (0,), "os.chown": (0,),
                "os.truncate": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,),
                "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,),
                "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (1,),
                "os.mkfifo": (0,), "os.mknod": (0,)}}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _inside(path):
    if isinstance(path, int):
        return True
    try:
        p = os.fsdecode(path)
    except (TypeError, ValueError):
        return False
    real = os.path.realpath(p)
    return real == _WORK or real.startswith(_WORK + os.sep)


def _hook(event, args):
    if event.startswith(_FORBIDDEN_PREFIXES):
        raise PermissionError("sandbox: %s is not allowed" % event)
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int) or _inside(path):
            return
        if mode is None:
            raise PermissionError("sandbox: os.open outside the sandbox directory")
        if any(c in str(mode) for c in "wax+") or (flags or 0) & _WRITE_FLAGS:
            raise PermissionError("sandbox: writing outside the sandbox directory")
        return
    idx = _PATH_EVENTS.get(event)
    if idx is not None:
        for i in idx:
            if i < len(args) and not _inside(args[i]):
                raise PermissionError("sandbox: %s outside the sandbox directory" % event)


sys.addaudithook(_hook)
del _hook, resource
with open("solution.py", encoding="utf-8") as _f:
    _src = _f.read()
del _f
exec(compile(_src, "solution.py", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
"""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    Attributes:
        ok: True when the program exited with code 0 within the time limit.
        returncode: the child's exit status (negative: killed by that signal).
        stdout: captured standard output, truncated to the output cap.
        stderr: captured standard error, truncated to the output cap.
        timed_out: True when the wall-clock limit was reached and the process group killed.
        wall_s: seconds from start to exit, including interpreter start-up.
    """

    ok: bool
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float = 0.0


def _read_capped(path: Path, cap: int) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(cap * 4 + 4)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if len(text) > cap:
        return text[:cap] + "\n[... output truncated]"
    return text


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    output_cap: int = DEFAULT_OUTPUT_CAP,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a fresh constrained interpreter; never raises on bad code.

    Args:
        code: Python source; run after the guard preamble, from a file named ``solution.py``.
        timeout_s: wall-clock limit; the CPU limit is this rounded up plus one second.
        memory_mb: address-space limit of the child.
        output_cap: characters of stdout/stderr kept.
    """
    root = Path(tempfile.mkdtemp(prefix="rlc-sandbox-"))
    work = root / "work"
    work.mkdir()
    cpu = int(timeout_s) + 1
    preamble = _PREAMBLE.format(mem=int(memory_mb) * 1024 * 1024, cpu=cpu, fsize=FILE_SIZE_LIMIT)
    (work / "_boot.py").write_text(preamble, encoding="utf-8")
    (work / "solution.py").write_text(code, encoding="utf-8", errors="surrogatepass")
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(work),
        "TMPDIR": str(work),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    out_path, err_path = root / "stdout", root / "stderr"
    start = time.perf_counter()
    timed_out = False
    try:
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "_boot.py"],
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                returncode = proc.wait()
        wall = time.perf_counter() - start
        return SandboxResult(
            ok=returncode == 0 and not timed_out,
            returncode=returncode,
            stdout=_read_capped(out_path, output_cap),
            stderr=_read_capped(err_path, output_cap),
            timed_out=timed_out,
            wall_s=wall,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
