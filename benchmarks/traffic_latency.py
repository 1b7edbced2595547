"""Traffic log latency: what recording each answered request adds to the request path.

Why: the traffic log (rl_conductor.loop.traffic) must not slow serving; its writes happen on a
background thread, so the request path pays only for building one record and a queue put. This
measures it where it is paid: the service's ``answer`` (plan, execute, metrics, log line, hooks)
over instant fake workers, in-process, with and without the log, alternating blocks of requests
so that machine load hits both alike; and the log's ``submit`` alone. Reports p50/p95 of each and
the p50 difference (goal: <= 1 ms).

Simplifications: in-process (no HTTP: the HTTP stack's own noise on a loaded 2-core machine is
larger than the effect measured); the fake pool answers instantly, so the figures are the
predictor's own overhead.

Usage: ``python benchmarks/traffic_latency.py --requests 3000 --json benchmarks/results/traffic_latency.json``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_json

POOL = {
    "name": "bench-fake",
    "workers": [
        {"name": "w0", "kind": "fake", "hosting": "self", "price_in": 0.1, "price_out": 0.4, "answer": "12"},
        {"name": "w1", "kind": "fake", "hosting": "self", "price_in": 0.2, "price_out": 0.8, "answer": "12"},
    ],
}


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


async def _measure(requests: int, block: int, store: str) -> dict[str, Any]:
    import yaml

    from rl_conductor.loop.traffic import TrafficConfig, TrafficLog
    from rl_conductor.serving.request import ConductorRequest
    from rl_conductor.serving.service import ConductorService, load_policy
    from rl_conductor.workers.pool import load_pool

    logging.getLogger("rl_conductor").setLevel(logging.WARNING)  # the per-request log line, both arms
    pool_file = Path(store) / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(POOL))
    pool = load_pool(str(pool_file))
    plain = ConductorService(load_policy(None, "fixed:0,1", pool), pool)
    logged = ConductorService(load_policy(None, "fixed:0,1", pool), pool)
    log = TrafficLog(TrafficConfig(store=str(Path(store) / "traffic"), batch_size=200, flush_interval_s=0.5))
    logged.on_answered.append(log.submit)
    times: dict[str, list[float]] = {"off": [], "on": []}
    for i in range(20):  # warm-up
        await plain.answer(ConductorRequest(question=f"warm {i}"))
        await logged.answer(ConductorRequest(question=f"warm {i}"))
    n = 0
    while n < requests:
        for arm, service in (("off", plain), ("on", logged)):
            for j in range(block):
                req = ConductorRequest(question=f"What is {n + j} + 1?")
                t = time.perf_counter()
                await service.answer(req)
                times[arm].append(time.perf_counter() - t)
        n += block
    doc = await logged.answer(ConductorRequest(question="sample"))
    submit: list[float] = []
    for i in range(requests):
        t = time.perf_counter()
        log.submit(ConductorRequest(question=f"q{i}"), {**doc, "request_id": f"s{i}"}, "v1")
        submit.append(time.perf_counter() - t)
    t = time.perf_counter()
    log.close()
    close_s = time.perf_counter() - t
    from rl_conductor.loop.traffic import read_traffic

    written = len(read_traffic(str(Path(store) / "traffic")))
    out = {
        arm: {"p50_ms": 1000 * statistics.median(xs), "p95_ms": 1000 * _pct(xs, 0.95), "n": len(xs)}
        for arm, xs in times.items()
    }
    return {
        **out,
        "p50_delta_ms": out["on"]["p50_ms"] - out["off"]["p50_ms"],
        "submit_p50_us": 1e6 * statistics.median(submit),
        "submit_p95_us": 1e6 * _pct(submit, 0.95),
        "records_written": written,
        "close_flush_s": close_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000, help="requests per arm")
    ap.add_argument("--block", type=int, default=100, help="requests per arm before switching")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="traffic-bench-") as tmp:
        res = asyncio.run(_measure(args.requests, args.block, tmp))
    print(
        f"service.answer p50 without the log {res['off']['p50_ms']:.3f} ms, with {res['on']['p50_ms']:.3f} ms"
    )
    print(f"p50 delta {res['p50_delta_ms']:+.3f} ms; submit() p50 {res['submit_p50_us']:.1f} us")
    print(f"records written {res['records_written']} (all requests of the 'on' arm and the submits)")
    if args.json:
        write_json(args.json, "traffic_latency", res)


if __name__ == "__main__":
    main()
