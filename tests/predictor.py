"""Start the Conductor's KServe predictor as a real server process on a free loopback port.

Why: the predictor's contract is HTTP (KServe v1/v2, the OpenAI route, SSE, ``/metrics``), so
its tests talk to the real server process that ``conductor serve`` runs, not to an in-process app.
The pools are YAML files of the library's fake workers (instant, scripted, optionally failing),
so a test controls what every worker answers and costs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from servers import LOOPBACK, _log_tail, _stop, free_ports

#: Two self-hosted workers and one external one (the privacy tests rely on the split).
FAKE_WORKERS = [
    {
        "name": "local-a",
        "kind": "fake",
        "hosting": "self",
        "price_in": 0.1,
        "price_out": 0.2,
        "answer": "A: 42",
    },
    {
        "name": "local-b",
        "kind": "fake",
        "hosting": "self",
        "price_in": 0.2,
        "price_out": 0.4,
        "answer": "B: 42",
    },
    {
        "name": "cloud-x",
        "kind": "fake",
        "hosting": "external",
        "price_in": 1.0,
        "price_out": 4.0,
        "answer": "X: 42",
    },
]
HOSTING = {w["name"]: w["hosting"] for w in FAKE_WORKERS}


def write_pool(
    path: Path, *, fail_rate: float = 0.0, seed: int = 0, workers: list[dict] | None = None
) -> Path:
    cfg = {"name": "fake-serving", "seed": seed, "fail_rate": fail_rate, "workers": workers or FAKE_WORKERS}
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass(frozen=True)
class Predictor:
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def process(
    cmd: Sequence[str],
    log: Path,
    ready_url: str,
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 180.0,
) -> Iterator[Path]:
    """Run ``cmd`` (its output into ``log``) until the block ends, once ``ready_url`` answers 200."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            list(cmd), stdout=fh, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not _ok(ready_url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(cmd)} did not start:\n{_log_tail(log)}")
            time.sleep(0.2)
        yield log
    finally:
        _stop(proc, grace_s=5.0)


@contextmanager
def predictor(
    args: Sequence[str],
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
    cli: bool = False,
) -> Iterator[Predictor]:
    """Run ``python -m rl_conductor.serving ARGS`` (or ``conductor serve ARGS``) until the block ends
    (``--auth none`` unless ARGS or ``env`` give API keys), in ``log_dir`` as its CONDUCTOR_HOME
    unless ``env`` names a home or a tracking store."""
    (port,) = free_ports(1)
    log = log_dir / f"predictor-{port}.log"
    entry = (
        [sys.executable, "-m", "rl_conductor.cli", "serve"]
        if cli
        else [sys.executable, "-m", "rl_conductor.serving"]
    )
    cmd = [*entry, *args, "--http_port", str(port), "--enable_grpc", "false", "--host", LOOPBACK]
    if not any(a.startswith(("--auth", "--api-key-file", "--api_key_file")) for a in args) and not (
        env and "CONDUCTOR_API_KEYS" in env
    ):
        cmd += ["--auth", "none"]  # tests of authentication pass their keys
    env = dict(env or {})
    if "CONDUCTOR_HOME" not in env and "MLFLOW_TRACKING_URI" not in env:
        env["CONDUCTOR_HOME"] = str(log_dir)  # its traces and cache stay out of the checkout's .conductor
    server = Predictor(port=port, log=log)
    with process(cmd, log, f"{server.url}/v2/health/ready", env=env, timeout_s=timeout_s):
        yield server
