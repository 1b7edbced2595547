"""The code sandbox: limits and audit-hook guards hold, ordinary programs run, results are typed."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from rl_conductor.tasks.sandbox import run_python


def test_ordinary_program_runs_and_captures_output() -> None:
    r = run_python("import math\nprint(math.factorial(5))")
    assert r.ok and r.returncode == 0 and not r.timed_out
    assert r.stdout.strip() == "120"


def test_failing_assert_is_not_ok() -> None:
    r = run_python("assert 1 == 2")
    assert not r.ok and r.returncode == 1
    assert "AssertionError" in r.stderr


def test_infinite_loop_times_out_quickly() -> None:
    start = time.perf_counter()
    r = run_python("while True:\n    pass", timeout_s=1.0)
    assert r.timed_out and not r.ok
    assert r.returncode < 0
    assert time.perf_counter() - start < 5


def test_write_outside_its_directory_fails(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('x')")
    assert not r.ok and "PermissionError" in r.stderr
    assert not target.exists()


def test_remove_and_rename_outside_fail(tmp_path: Path) -> None:
    victim = tmp_path / "keep.txt"
    victim.write_text("keep")
    r1 = run_python(f"import os\nos.remove({str(victim)!r})")
    r2 = run_python(f"import os\nos.rename({str(victim)!r}, 'mine.txt')")
    assert not r1.ok and not r2.ok
    assert victim.read_text() == "keep"


def test_write_inside_its_directory_works() -> None:
    r = run_python("open('a.txt', 'w').write('hi')\nprint(open('a.txt').read())")
    assert r.ok and r.stdout.strip() == "hi"


def test_socket_fails_even_to_a_listening_loopback_port() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        r = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    assert not r.ok and "PermissionError" in r.stderr


@pytest.mark.parametrize(
    "code",
    [
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import os\nos.fork()",
        "import os\nos.execv('/bin/true', ['true'])",
        "import _posixsubprocess\n_posixsubprocess.fork_exec()",
        "import ctypes\nctypes.CDLL(None).system(b'true')",
    ],
)
def test_process_creation_fails(code: str) -> None:
    r = run_python(code)
    assert not r.ok
    assert "PermissionError" in r.stderr


def test_memory_bomb_fails() -> None:
    r = run_python("x = bytearray(4 * 1024 ** 3)\nprint('allocated')", memory_mb=256)
    assert not r.ok and "allocated" not in r.stdout
    assert "MemoryError" in r.stderr


def test_output_is_truncated() -> None:
    r = run_python("print('y' * 100000)", output_cap=1000)
    assert r.ok
    assert len(r.stdout) < 1100 and r.stdout.endswith("[... output truncated]")


def test_environment_is_stripped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLC_SECRET_FOR_TEST", "s3cr3t")
    r = run_python("import os\nprint(sorted(os.environ))")
    assert r.ok and "RLC_SECRET_FOR_TEST" not in r.stdout


def test_junk_source_is_reported_not_raised() -> None:
    r = run_python("\x00\x01def (:")
    assert not r.ok and r.returncode != 0


def test_per_call_overhead_is_small() -> None:
    start = time.perf_counter()
    for _ in range(3):
        assert run_python("pass").ok
    assert (time.perf_counter() - start) / 3 < 1.0
