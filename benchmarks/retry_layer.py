"""One retry layer: HTTP requests per failing step, and how soon a restarted worker is used again.

Why: retries stacked in two layers (the live client's 3 attempts times the predictor's own 3)
sent up to 9 requests per worker per step, 4xx included, and an open circuit refused a worker
for a fixed 30 s after it came back. This measures both on real loopback HTTP servers through
the real ``openai`` SDK:

* **requests per step** — the predictor's service (``ConductorService``) answers one question
  with a one-step plan on a pool whose worker always answers 503 (transient) or 401 (permanent),
  alone or with a fallback worker of the same hosting class that fails too; the figure is the
  requests the servers received;
* **back after a restart** — a worker whose server is down (connection refused) gets a call
  every 50 ms for ``outage`` seconds, so its circuit opens; then the server starts on the same
  port and the figure is the seconds until a call succeeds again (the pool's default circuit).

Simplifications: retry waits are zeroed for the first part (they change time, not counts); the
second part is one run per outage on a shared machine, so it is exact only to the 50 ms call
period plus scheduling noise, and its phase relative to the breaker's probes decides where in
``[0, wait]`` a run lands.

Usage: ``python benchmarks/retry_layer.py --json benchmarks/results/retry_layer.json``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.table import Table

from rl_conductor.policies.fixed import FixedPlan
from rl_conductor.serving.request import ConductorRequest
from rl_conductor.serving.service import ConductorService
from rl_conductor.workers.live.testing import error, scripted_server, success_body
from rl_conductor.workers.pool import build_pool

NO_WAIT = {"initial_s": 0.0, "jitter_s": 0.0}


def _spec(name: str, url: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "openai", "model": "m", "base_url": url, "hosting": "self", **extra}


async def requests_per_step(status: int, with_fallback: bool) -> int:
    with (
        scripted_server("openai", default=error("openai", status)) as a,
        scripted_server("openai", default=error("openai", status)) as b,
    ):
        workers = [_spec("a", a.base_url)] + (
            [_spec("b", b.base_url, price_out=1.0)] if with_fallback else []
        )
        service = ConductorService(FixedPlan([0]), build_pool({"retries": NO_WAIT, "workers": workers}))
        await service.answer(ConductorRequest(question="What is 6 times 7?"))
        return len(a.requests) + len(b.requests)


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps(success_body("openai", "42")).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def back_after_restart(outage_s: float) -> float:
    port = _free_port()
    worker = build_pool(
        {"workers": [_spec("w", f"http://127.0.0.1:{port}/v1", retries=1, timeout_s=5)]}
    ).workers[0]
    msgs = [{"role": "user", "content": "hi"}]
    down = time.monotonic()
    while time.monotonic() - down < outage_s:
        with contextlib.suppress(Exception):  # down (connection refused) or refused by the circuit
            await worker.complete(msgs, max_tokens=64, temperature=0.0)
        await asyncio.sleep(0.05)
    server = ThreadingHTTPServer(("127.0.0.1", port), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    up = time.monotonic()
    try:
        while True:
            try:
                await worker.complete(msgs, max_tokens=64, temperature=0.0)
                return time.monotonic() - up
            except Exception:
                await asyncio.sleep(0.05)
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", default="1,5,20,60", help="outage lengths in seconds, comma-separated")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    counts = {
        f"{status}{'+fallback' if fb else ''}": asyncio.run(requests_per_step(status, fb))
        for status in (503, 401)
        for fb in (False, True)
    }
    recovery = {o: round(asyncio.run(back_after_restart(float(o))), 2) for o in args.outages.split(",")}
    console = Console()
    t = Table(title="HTTP requests for one failing step")
    t.add_column("worker answers")
    t.add_column("requests", justify="right")
    for k, v in counts.items():
        t.add_row(k, str(v))
    console.print(t)
    r = Table(title="seconds until a restarted worker is called again")
    r.add_column("outage s", justify="right")
    r.add_column("back after s", justify="right")
    for k, v in recovery.items():
        r.add_row(k, f"{v:.2f}")
    console.print(r)
    if args.json:
        write_json(args.json, "retry_layer", {"requests_per_step": counts, "back_after_restart_s": recovery})


if __name__ == "__main__":
    main()
