"""Time to first token and total latency of the predictor's OpenAI route, streaming vs not, in one run.

Why: a streaming client should see the answer as soon as the workflow's answering step starts
producing it. Two pools, each through the real KServe server on loopback:

* ``live`` — a two-step chain whose first step is a fake worker with a fixed answer time and whose
  final step is a live ``kind: openai`` worker: a :class:`ScriptedServer` on loopback that
  streams its answer in OpenAI's wire format, one piece every ``--piece_s`` seconds (and, asked
  without ``stream``, answers whole after the same generation time);
* ``whole`` — the same chain with fake workers only, which answer whole: the behaviour every
  worker had before token streaming, where the first content token came when the final step
  was done.

Per request: ``first_byte_s`` (the role chunk), ``first_step_s`` (the first ``conductor_step``
chunk), ``first_content_s`` (the first non-empty ``delta.content``), ``total_s``; for a
non-streaming request every one of them is the total. Ratios are streaming / non-streaming.

    python benchmarks/streaming_latency.py --json benchmarks/results/streaming_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _predictor import free_port, predictor, report, wait_ready

from rl_conductor.workers.live.testing import Reply, ScriptedServer, success_body

STEP_S = 0.25
PIECES = 20


def _pools(worker_url: str, piece_s: float) -> dict[str, dict[str, Any]]:
    first = {
        "name": "first",
        "kind": "fake",
        "hosting": "self",
        "price_in": 0.1,
        "price_out": 0.2,
        "answer": "draft: 42",
        "latency_s": STEP_S,
    }
    live = {
        "name": "final",
        "kind": "openai",
        "model": "m",
        "base_url": worker_url,
        "hosting": "self",
        "price_in": 0.1,
        "price_out": 0.2,
        "retries": {"attempts": 1},
    }
    fake = {
        "name": "final",
        "kind": "fake",
        "hosting": "self",
        "price_in": 0.1,
        "price_out": 0.2,
        "answer": "A: 42",
        "latency_s": PIECES * piece_s,
    }
    return {
        "live": {"name": "streaming-bench-live", "workers": [first, live]},
        "whole": {"name": "streaming-bench-whole", "workers": [first, fake]},
    }


BODY = {"model": "conductor", "messages": [{"role": "user", "content": "What is 6*7?"}]}


def _stream_once(client: httpx.Client) -> dict[str, float]:
    t0 = time.perf_counter()
    marks: dict[str, float] = {}
    with client.stream("POST", "/openai/v1/chat/completions", json={**BODY, "stream": True}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter() - t0
            marks.setdefault("first_byte_s", now)
            chunk = json.loads(line[6:])
            if chunk.get("conductor_step"):
                marks.setdefault("first_step_s", now)
            if any(c["delta"].get("content") for c in chunk.get("choices", [])):
                marks.setdefault("first_content_s", now)
    marks["total_s"] = time.perf_counter() - t0
    return marks


def _plain_once(client: httpx.Client) -> dict[str, float]:
    t0 = time.perf_counter()
    resp = client.post("/openai/v1/chat/completions", json=BODY)
    resp.raise_for_status()
    assert resp.json()["choices"][0]["message"]["content"]
    total = time.perf_counter() - t0
    return {"first_byte_s": total, "first_step_s": total, "first_content_s": total, "total_s": total}


def _summary(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]}


def _measure(pool_cfg: dict[str, Any], requests: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median marks (streaming, non-streaming) of ``requests`` interleaved requests of each mode."""
    port = free_port()
    args = ["--auth", "none", "--host", "127.0.0.1", "--http_port", str(port)]
    with (
        tempfile.TemporaryDirectory(prefix="streaming-bench-") as tmp,
        predictor(pool_cfg, Path(tmp), args, os.environ) as (proc, log),
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client,
    ):
        wait_ready(proc, lambda: client.get("/v2/health/ready"), log)
        _stream_once(client), _plain_once(client)  # warm-up
        streaming, plain = [], []
        for _ in range(requests):  # interleaved: both modes see the same machine load
            streaming.append(_stream_once(client))
            plain.append(_plain_once(client))
    return _summary(streaming), _summary(plain)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20, help="requests per mode")
    parser.add_argument("--piece_s", type=float, default=0.025, help="the live worker's time per piece")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    text = " ".join(["tok"] * (PIECES - 1) + ["42"])
    reply = Reply(
        body=success_body("openai", text, input_tokens=30, output_tokens=PIECES),
        pieces=tuple(w if i == 0 else " " + w for i, w in enumerate(text.split(" "))),
        piece_delay_s=args.piece_s,
    )
    worker = ScriptedServer("openai", default=reply).start()
    try:
        pools = _pools(worker.base_url, args.piece_s)
        measured = {name: _measure(cfg, args.requests) for name, cfg in pools.items()}
    finally:
        worker.stop()
    results: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {
            "requests_per_mode": args.requests,
            "steps": 2,
            "first_step_s": STEP_S,
            "final_step_pieces": PIECES,
            "final_step_piece_s": args.piece_s,
        },
    }
    for name, (s, p) in measured.items():
        results[name] = {
            "median_streaming": s,
            "median_non_streaming": p,
            "ratio_streaming_over_non_streaming": {k: round(s[k] / p[k], 3) for k in s},
        }
    results["note"] = (
        "live: the final step is a loopback OpenAI-compatible worker that streams; whole: fake "
        "workers that answer whole (every worker before token streaming) with the same total time"
    )
    report(results, args.json)


if __name__ == "__main__":
    main()
