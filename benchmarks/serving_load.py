"""Serving load: what the predictor adds on top of KServe itself, and what planning costs.

Why: the predictor validates, plans, executes a workflow and records metrics for every request;
this must stay small next to KServe's own request handling. In one run, three real server
processes on loopback take the same load (``--requests`` v1 requests, ``--concurrency`` in flight,
after a warm-up):

1. **echo** — a bare ``kserve.Model`` that returns its instances (KServe's floor);
2. **fixed** — the Conductor predictor with a fixed two-step plan (``fixed:0,1``) over instant fake
   workers: request guard, validation, executor, metrics and logs, no model;
3. **tiny** — the predictor with a trained tiny Conductor planning on the simulated paper pool
   (``paper-sim``): the cost of generation, batched across concurrent requests.

It reports p50/p95/p99 latency and throughput per server, the fixed/echo p50 ratio (the
orchestration overhead; goal <= 3), and a sample streamed (SSE) response of each predictor.

Simplifications: the load generator (httpx, asyncio) shares the machine's cores with the
server it measures, so absolute figures are machine-bound; the ratio is the figure to read.
Without ``--model`` the tiny Conductor is trained here with the test suite's micro settings
(1-2 minutes on two cores): it learns the output format, not good routing.

Usage: ``python benchmarks/serving_load.py --json benchmarks/results/serving_load.json``
(``--serve-echo`` runs the echo server itself; the benchmark starts it as a child process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml
from _predictor import free_port, wait_ready  # benchmarks/_predictor.py (scripts run from this folder)

QUESTION = "A train leaves at 9:00 at 80 km/h, a second at 10:00 at 120 km/h. When does the second catch up?"
FAKE_POOL = {
    "name": "bench-fake",
    "workers": [
        {
            "name": "w0",
            "kind": "fake",
            "hosting": "self",
            "price_in": 0.1,
            "price_out": 0.4,
            "answer": "12:00",
        },
        {
            "name": "w1",
            "kind": "fake",
            "hosting": "self",
            "price_in": 0.2,
            "price_out": 0.8,
            "answer": "At 12:00.",
        },
    ],
}


def serve_echo(argv: list[str]) -> None:
    """A bare KServe model that returns its instances: the floor the predictor is compared to."""
    import kserve

    class Echo(kserve.Model):
        def load(self) -> bool:
            self.ready = True
            return True

        async def predict(self, payload: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
            return {"predictions": payload.get("instances", []) if isinstance(payload, dict) else []}

    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    args, _ = parser.parse_known_args(argv)
    model = Echo("conductor")
    model.load()
    kserve.ModelServer(http_port=args.http_port, enable_grpc=False, enable_latency_logging=False).start(
        [model]
    )


@contextmanager
def _server(cmd: list[str], log: Path, port: int, timeout_s: float = 180.0) -> Iterator[str]:
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [*cmd, "--http_port", str(port), "--enable_grpc", "false"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_ready(
            proc,
            lambda: httpx.get(f"{url}/v2/health/ready", timeout=2),
            log,
            timeout_s,
            unreachable=httpx.HTTPError,
            failure=lambda tail: RuntimeError(f"server did not start: {' '.join(cmd)}\n{tail}"),
        )
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


async def _load(url: str, n: int, concurrency: int, warmup: int) -> dict[str, Any]:
    body = {"instances": [{"question": QUESTION, "max_cost_usd": 0.05}]}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        path = "/v1/models/conductor:predict"
        for _ in range(warmup):
            (await client.post(path, json=body)).raise_for_status()
        latencies: list[float] = []
        errors = 0
        todo = iter(range(n))

        async def worker() -> None:
            nonlocal errors
            for _ in todo:
                t = time.perf_counter()
                resp = await client.post(path, json=body)
                latencies.append(time.perf_counter() - t)
                errors += resp.status_code != 200

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=100)
    return {
        "requests": n,
        "concurrency": concurrency,
        "errors": errors,
        "p50_ms": round(q[49] * 1e3, 3),
        "p95_ms": round(q[94] * 1e3, 3),
        "p99_ms": round(q[98] * 1e3, 3),
        "mean_ms": round(statistics.fmean(latencies) * 1e3, 3),
        "throughput_rps": round(n / wall, 1),
        "wall_s": round(wall, 3),
    }


def _stream_sample(url: str, question: str) -> list[str]:
    body = {"model": "conductor", "messages": [{"role": "user", "content": question}], "stream": True}
    lines = []
    with httpx.stream("POST", f"{url}/openai/v1/chat/completions", json=body, timeout=120) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line:
                lines.append(line)
    return lines


def _plan_batches(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        for key in ("conductor_plan_batch_size_sum", "conductor_plan_batch_size_count"):
            if line.startswith(key + " "):
                out[key] = float(line.split()[1])
    return out


def _train_micro(root: Path) -> Path:
    from rl_conductor.tracking import mlflow_utils
    from rl_conductor.training.config import MICRO_SETTINGS, TrainConfig
    from rl_conductor.training.train import train

    os.environ[mlflow_utils.HOME_ENV] = str(root)
    # the test suite's micro Conductor (tests/_tiny.py) but with the default, expected-best SFT
    uri = f"sqlite:///{root / 'mlflow.db'}"
    cfg = TrainConfig(**{**MICRO_SETTINGS, "mlflow_experiment": "bench-micro", "mlflow_tracking_uri": uri})
    train(cfg, root / "out", progress=False)
    return root / "out" / "final"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--tiny-requests", type=int, default=500, help="requests for the tiny Conductor run")
    ap.add_argument("--model", default=None, help="a trained Conductor folder (default: train the micro one)")
    ap.add_argument("--skip-tiny", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.serve_echo:
        serve_echo(rest)
        return
    py = sys.executable
    results: dict[str, Any] = {
        "benchmark": "serving_load",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "settings": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "warmup": args.warmup,
            "endpoint": "POST /v1/models/conductor:predict, one instance",
        },
    }
    with tempfile.TemporaryDirectory(prefix="serving-load-") as tmp:
        root = Path(tmp)
        pool = root / "pool.yaml"
        pool.write_text(yaml.safe_dump(FAKE_POOL))
        runs: dict[str, dict[str, Any]] = {}
        with _server([py, __file__, "--serve-echo"], root / "echo.log", free_port()) as url:
            runs["echo"] = asyncio.run(_load(url, args.requests, args.concurrency, args.warmup))
        predictor = [py, "-m", "rl_conductor.serving", "--auth", "none", "--host", "127.0.0.1", "--pool"]
        fixed_cmd = [*predictor, str(pool), "--policy", "fixed:0,1"]
        with _server(fixed_cmd, root / "fixed.log", free_port()) as url:
            runs["fixed"] = asyncio.run(_load(url, args.requests, args.concurrency, args.warmup))
            results["stream_sample_fixed"] = _stream_sample(url, QUESTION)
        runs["fixed"]["p50_vs_echo"] = round(runs["fixed"]["p50_ms"] / runs["echo"]["p50_ms"], 2)
        runs["fixed"]["p95_vs_echo"] = round(runs["fixed"]["p95_ms"] / runs["echo"]["p95_ms"], 2)
        print(json.dumps(runs, indent=1), flush=True)
        if not args.skip_tiny:
            model = Path(args.model) if args.model else _train_micro(root / "micro")
            tiny_cmd = [*predictor, "paper-sim", "--model", str(model)]
            with _server(tiny_cmd, root / "tiny.log", free_port()) as url:
                n = args.tiny_requests
                runs["tiny"] = asyncio.run(_load(url, n, args.concurrency, min(args.warmup, 32)))
                batches = _plan_batches(url)
                if batches.get("conductor_plan_batch_size_count"):
                    runs["tiny"]["mean_plan_batch"] = round(
                        batches["conductor_plan_batch_size_sum"] / batches["conductor_plan_batch_size_count"],
                        2,
                    )
                results["stream_sample_tiny"] = _stream_sample(url, QUESTION)
            runs["tiny"]["p50_vs_echo"] = round(runs["tiny"]["p50_ms"] / runs["echo"]["p50_ms"], 2)
        results["runs"] = runs
        results["goal"] = {"fixed_p50_vs_echo_at_most": 3.0, "met": runs["fixed"]["p50_vs_echo"] <= 3.0}
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
