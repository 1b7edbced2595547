"""Time to first token and total latency of the predictor's OpenAI route, streaming vs not, in one run.

Why: a streaming client should see the answer as soon as the workflow has it. The workers of the
pool answer whole (no worker kind streams tokens), so the first *content* token of a stream can
only come once the final step is done; what streaming adds before it is one ``conductor_step``
chunk per finished call. This benchmark measures both, side by side, on local workers with a
fixed answer time (fake workers, ``latency_s``), through the real KServe server:

* ``first_byte_s`` — the first SSE chunk (the role chunk),
* ``first_step_s`` — the first ``conductor_step`` chunk,
* ``first_content_s`` — the first non-empty ``delta.content``,
* ``total_s`` — the end of the response;

for a non-streaming request every one of them is the total. Ratios are streaming / non-streaming.

    python benchmarks/streaming_latency.py --json benchmarks/results/streaming_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

STEP_S = 0.25
POOL = {
    "name": "streaming-bench",
    "workers": [
        {"name": "first", "kind": "fake", "hosting": "self", "price_in": 0.1, "price_out": 0.2,
         "answer": "draft: 42", "latency_s": STEP_S},
        {"name": "final", "kind": "fake", "hosting": "self", "price_in": 0.1, "price_out": 0.2,
         "answer": "A: 42", "latency_s": STEP_S},
    ],
}  # fmt: skip
BODY = {"model": "conductor", "messages": [{"role": "user", "content": "What is 6*7?"}]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20, help="requests per mode")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="streaming-bench-") as tmp:
        pool = Path(tmp) / "pool.yaml"
        pool.write_text(yaml.safe_dump(POOL))
        log = Path(tmp) / "predictor.log"
        cmd = [sys.executable, "-m", "rl_conductor.serving", "--pool", str(pool), "--policy", "fixed:0,1"]
        cmd += ["--auth", "none", "--host", "127.0.0.1", "--http_port", str(port)]
        with log.open("wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ})
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                deadline = time.monotonic() + 120
                while True:
                    try:
                        if client.get("/v2/health/ready").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"predictor did not start:\n{log.read_text()[-3000:]}")
                    time.sleep(0.2)
                _stream_once(client), _plain_once(client)  # warm-up
                streaming, plain = [], []
                for _ in range(args.requests):  # interleaved: both modes see the same machine load
                    streaming.append(_stream_once(client))
                    plain.append(_plain_once(client))
        finally:
            proc.terminate()
            proc.wait(30)
    s, p = _summary(streaming), _summary(plain)
    results: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {"requests_per_mode": args.requests, "steps": 2, "worker_answer_s": STEP_S},
        "median_streaming": s,
        "median_non_streaming": p,
        "ratio_streaming_over_non_streaming": {k: round(s[k] / p[k], 3) for k in s},
        "note": "the workers answer whole: first content token = when the final step is done",
    }
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
