"""Live workers: client overhead next to a bare httpx call, the cache's speed-up, and the local
worker's generation speed.

Why: every live call goes through :class:`~rl_conductor.workers.live.openai_chat.OpenAIChatWorker`
(the ``openai`` SDK, retries, circuit breaker, usage accounting), and the cache is meant to make
repeated rollouts free. This measures, in one run:

1. **per-call overhead**: the same chat-completions request sent N times by a bare
   ``httpx.AsyncClient`` POST and N times by the live client, alternating, against (a) a
   scripted OpenAI-format server (pure HTTP, no model: the client's own cost shows) and (b) a
   real ``conductor worker serve --model tiny`` process (``max_tokens=1``);
2. **cache speed-up**: N distinct calls through :class:`~rl_conductor.workers.cache.CachedWorker`
   against the tiny worker, cold (misses: HTTP + generation) then warm (hits: one sqlite read);
3. **tokens/s of the local worker**: ``conductor worker serve --model smol`` (SmolLM2-135M-
   Instruct, CPU), a few GSM8K questions at ``max_tokens=64``, temperature 0; completion tokens
   (from the server's ``usage``) divided by wall time, and the same per request.

Wall-clock and CPU time of this process are reported; figures are medians (overhead) or totals.
Simplifications: the model servers run as child processes on the same 2 shared cores, so the
generation figures depend on the machine's load (recorded with the result).

Usage: ``python benchmarks/live_workers.py --json benchmarks/results/live_workers.json``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx

from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.cache import CachedWorker, SqliteCacheStore
from rl_conductor.workers.live.testing import scripted_server
from rl_conductor.workers.pool import build_pool

MESSAGES = [{"role": "user", "content": "Natalia sold clips to 48 of her friends. How many clips?"}]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_worker(model: str, name: str, port: int, log: Path, model_dir: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "rl_conductor.cli", "worker", "serve", "--model", model, "--name", name]
    cmd += ["--port", str(port), "--threads", "2", "--model-dir", str(model_dir)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker {name} exited:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/openai/v1/models", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"worker {name} did not start in 600 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _client(name: str, base_url: str, model: str) -> Any:
    pool = build_pool(
        {
            "retries": 1,
            "workers": [{"name": name, "kind": "openai", "model": model, "base_url": base_url,
                         "price_in": 0.1, "price_out": 0.2, "hosting": "self"}],
        }
    )  # fmt: skip
    return pool.workers[0]


async def _overhead(base_url: str, model: str, n: int) -> dict[str, Any]:
    """Median seconds per call: bare httpx POST vs the live client, alternating."""
    worker = _client("bench", base_url, model)
    body = {"model": model, "messages": MESSAGES, "max_tokens": 1, "temperature": 0.0}
    bare: list[float] = []
    live: list[float] = []
    async with httpx.AsyncClient(timeout=60) as http:
        for i in range(n + 5):  # 5 warm-up rounds (connection set-up, imports) are dropped
            t0 = time.perf_counter()
            resp = await http.post(f"{base_url}/chat/completions", json=body)
            resp.raise_for_status()
            resp.json()["choices"][0]["message"]["content"]
            t1 = time.perf_counter()
            await worker.complete(MESSAGES, max_tokens=1, temperature=0.0)
            t2 = time.perf_counter()
            if i >= 5:
                bare.append(t1 - t0)
                live.append(t2 - t1)
    b, c = statistics.median(bare), statistics.median(live)
    return {
        "calls": n,
        "bare_httpx_median_ms": round(b * 1e3, 3),
        "client_median_ms": round(c * 1e3, 3),
        "overhead_median_ms": round((c - b) * 1e3, 3),
        "bare_httpx_mean_ms": round(statistics.fmean(bare) * 1e3, 3),
        "client_mean_ms": round(statistics.fmean(live) * 1e3, 3),
    }


async def _cache(base_url: str, model: str, n: int, db: Path) -> dict[str, Any]:
    worker = CachedWorker(inner=_client("cached", base_url, model), store=SqliteCacheStore(db))
    prompts = [[{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}] for i in range(n)]

    async def run_all() -> float:
        t0 = time.perf_counter()
        for p in prompts:
            await worker.complete(p, max_tokens=8, temperature=0.0)
        return time.perf_counter() - t0

    cold = await run_all()
    warm = await run_all()
    return {
        "calls": n,
        "max_tokens": 8,
        "cold_s": round(cold, 4),
        "warm_s": round(warm, 4),
        "cold_ms_per_call": round(cold / n * 1e3, 3),
        "warm_ms_per_call": round(warm / n * 1e3, 3),
        "speedup": round(cold / warm, 1),
        "hits": worker.hits,
        "misses": worker.misses,
    }


async def _tokens_per_s(base_url: str, model: str, n: int, max_tokens: int) -> dict[str, Any]:
    worker = _client("smol", base_url, model)
    questions = [t.question for t in load_tasks("gsm8k", "test", limit=n, seed=0)]
    rows = []
    t0 = time.perf_counter()
    for q in questions:
        c = await worker.complete([{"role": "user", "content": q}], max_tokens=max_tokens, temperature=0.0)
        rows.append({"input_tokens": c.input_tokens, "output_tokens": c.output_tokens,
                     "latency_s": round(c.latency_s, 3), "finish_reason": c.finish_reason,
                     "tokens_per_s": round(c.output_tokens / c.latency_s, 2)})  # fmt: skip
    wall = time.perf_counter() - t0
    out_tokens = sum(r["output_tokens"] for r in rows)
    return {
        "requests": n,
        "max_tokens": max_tokens,
        "output_tokens": out_tokens,
        "input_tokens": sum(r["input_tokens"] for r in rows),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(out_tokens / wall, 2),
        "per_request": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--calls", type=int, default=100, help="calls per overhead figure")
    ap.add_argument("--cache-calls", type=int, default=30)
    ap.add_argument("--smol-requests", type=int, default=4)
    ap.add_argument("--smol-max-tokens", type=int, default=64)
    ap.add_argument("--model-dir", type=Path, default=Path(".conductor/models"))
    ap.add_argument("--skip-smol", action="store_true")
    args = ap.parse_args()

    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg_1m_start": round(os.getloadavg()[0], 2)},
    }  # fmt: skip
    t_cpu = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        with scripted_server("openai") as srv:
            results["overhead_scripted_server"] = asyncio.run(
                _overhead(srv.base_url, "test-model", args.calls)
            )
        port = _free_port()
        proc = _start_worker("tiny", "tiny", port, tmpd / "tiny.log", args.model_dir)
        try:
            url = f"http://127.0.0.1:{port}/openai/v1"
            results["overhead_tiny_worker"] = asyncio.run(_overhead(url, "tiny", args.calls))
            results["cache_tiny_worker"] = asyncio.run(
                _cache(url, "tiny", args.cache_calls, tmpd / "c.sqlite")
            )
        finally:
            _stop(proc)
        if not args.skip_smol:
            port = _free_port()
            proc = _start_worker("smol", "smol", port, tmpd / "smol.log", args.model_dir)
            try:
                results["smol_worker"] = asyncio.run(
                    _tokens_per_s(f"http://127.0.0.1:{port}/openai/v1", "smol", args.smol_requests,
                                  args.smol_max_tokens)
                )  # fmt: skip
            finally:
                _stop(proc)
    results["bench_cpu_s"] = round(time.process_time() - t_cpu, 2)
    results["machine"]["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
