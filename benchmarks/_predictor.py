"""The serving benchmarks' loopback predictor: a free port, the wait until it is ready, the report.

Why one place: soak.py, streaming_latency.py and serving_load.py each start a server process on
127.0.0.1 and must not measure before it answers ``/v2/health/ready``; a server that dies or
never gets ready ends the run with the tail of its log.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(
    proc: subprocess.Popen[bytes], ready: Callable[[], httpx.Response], log: Path, timeout_s: float = 120
) -> None:
    """Poll ``ready`` (a GET of ``/v2/health/ready``) until it answers 200; exit with the log's tail
    when the predictor ``proc`` ends or ``timeout_s`` pass first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready().status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"predictor did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def report(results: dict[str, Any], path: Path | None) -> None:
    """Print ``results`` as JSON and, when ``path`` is given, write them there too."""
    print(json.dumps(results, indent=1))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
