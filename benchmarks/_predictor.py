"""The serving benchmarks' loopback predictor: a free port, the wait until it is ready, the report.

Why one place: soak.py, streaming_latency.py and serving_load.py each start a server process on
127.0.0.1 and must not measure before it answers ``/v2/health/ready``; a server that dies or
never gets ready ends the run with the tail of its log.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def predictor(
    pool_cfg: Mapping[str, Any], folder: Path, args: Sequence[str], env: Mapping[str, str]
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The predictor (``python -m rl_conductor.serving``, policy ``fixed:0,1``) on ``pool_cfg`` with
    the further ``args`` and ``env``; yields the process and its log, both in ``folder`` with the
    pool file. Terminated on exit."""
    pool = folder / "pool.yaml"
    pool.write_text(yaml.safe_dump(pool_cfg))
    log = folder / "predictor.log"
    cmd = [sys.executable, "-m", "rl_conductor.serving", "--pool", str(pool), "--policy", "fixed:0,1", *args]
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=dict(env))
    try:
        yield proc, log
    finally:
        proc.terminate()
        proc.wait(30)


def wait_ready(
    proc: subprocess.Popen[bytes],
    ready: Callable[[], httpx.Response],
    log: Path,
    timeout_s: float = 120,
    *,
    unreachable: type[Exception] = httpx.TransportError,
    failure: Callable[[str], BaseException] = lambda tail: SystemExit(f"predictor did not start:\n{tail}"),
) -> None:
    """Poll ``ready`` (a GET of ``/v2/health/ready``; ``unreachable``: not up yet) until it answers
    200; raise ``failure`` of the log's tail when the server ``proc`` ends or ``timeout_s`` pass
    first (by default: exit, the predictor did not start)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready().status_code == 200:
                return
        except unreachable:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise failure(log.read_text()[-3000:])
        time.sleep(0.2)


def report(results: dict[str, Any], path: Path | None) -> None:
    """Print ``results`` as JSON and, when ``path`` is given, write them there too."""
    print(json.dumps(results, indent=1))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
