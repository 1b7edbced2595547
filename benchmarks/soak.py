"""A bounded loopback soak of the predictor: thousands of mixed requests against the real server.

Why: the predictor's promises (no 5xx but for requests no worker could answer, no budget
overrun, no private request on an external worker, every request logged and costed, memory flat)
must hold under a mix a real deployment sees at once, not only one request at a time. The server
runs the fixed plan ``fixed:0,1`` (an external worker, then a self-hosted one) over fake workers of
which every one fails 30 % of its calls, with API keys on, and is sent, concurrently:

* v1 and v2 requests, public with budgets from 1e-6 to 1e-2 USD, or private;
* OpenAI requests, plain or streaming; half of the streams are dropped after their first step;
* slow clients that send their body in pieces (within ``--body_timeout_s``) and stalled ones that
  stop half-way (408 expected), and malformed requests (4xx expected).

Each request carries ``X-Request-ID: soak-N``. At the end the script reads ``/metrics`` and the
server's log and reports statuses, overruns, private calls to external workers, requests the
service ran without exactly one log line, the logged cost against the workers' cost counter,
RSS over time, and "Task was destroyed but it is pending!" lines.

    python benchmarks/soak.py --requests 5000 --json benchmarks/results/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import random
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _predictor import free_port, predictor, report, wait_ready

KEY = "soak-key-0123456789abcdef"
FAIL = 0.3
POOL = {
    "name": "soak",
    "workers": [
        {"name": "cloud-x", "kind": "fake", "hosting": "external", "price_in": 1.0, "price_out": 4.0,
         "answer": "X: 42", "fail_rate": FAIL, "latency_s": 0.01},
        {"name": "local-a", "kind": "fake", "hosting": "self", "price_in": 0.1, "price_out": 0.2,
         "answer": "A: 42", "fail_rate": FAIL, "latency_s": 0.05},
        {"name": "local-b", "kind": "fake", "hosting": "self", "price_in": 0.2, "price_out": 0.4,
         "answer": "B: 42", "fail_rate": FAIL, "latency_s": 0.01},
        {"name": "cloud-y", "kind": "fake", "hosting": "external", "price_in": 0.5, "price_out": 2.0,
         "answer": "Y: 42", "fail_rate": FAIL, "latency_s": 0.01},
    ],
}  # fmt: skip
EXTERNAL = {w["name"] for w in POOL["workers"] if w["hosting"] == "external"}
KINDS = [  # (kind, weight)
    ("v1_public", 30),
    ("v1_private", 18),
    ("v2", 10),
    ("openai", 14),
    ("stream", 8),
    ("stream_drop", 8),
    ("slow_client", 5),
    ("stalled", 2),
    ("bad", 5),
]
AUTH = {"authorization": f"Bearer {KEY}"}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Soak:
    def __init__(self, url: str, port: int, seed: int) -> None:
        self.url = url
        self.port = port
        self.rng = random.Random(seed)
        self.statuses: collections.Counter[str] = collections.Counter()
        self.overruns: list[str] = []
        self.private_leaks: list[str] = []
        self.unexpected: list[str] = []
        self.served_ids: set[str] = set()  # requests the service ran (must have one log line each)
        self.private_ids: set[str] = set()

    async def one(self, client: httpx.AsyncClient, i: int, kind: str) -> None:
        rid = f"soak-{i}"
        headers = {**AUTH, "x-request-id": rid}
        private = kind == "v1_private" or (kind in ("v2", "openai", "stream") and i % 2 == 0)
        if private:
            self.private_ids.add(rid)
        budget = 10 ** self.rng.uniform(-6, -2) if not private else None
        limits: dict[str, Any] = {"sensitivity": "private"} if private else {"max_cost_usd": budget}
        q = f"What is {i} * 7? " * self.rng.randint(1, 20)
        try:
            if kind in ("v1_public", "v1_private"):
                resp = await client.post(
                    "/v1/models/conductor:predict",
                    json={"instances": [{"question": q, **limits}]},
                    headers=headers,
                )
                self._count(kind, resp.status_code)
                docs = resp.json().get("predictions", [])
                self.served_ids.add(rid)
                self._check(rid, docs, budget, private)
            elif kind == "v2":
                body = {"inputs": [{"name": "question", "shape": [1], "datatype": "BYTES", "data": [q]}]}
                resp = await client.post(
                    "/v2/models/conductor/infer", json={**body, "parameters": limits}, headers=headers
                )
                self._count(kind, resp.status_code)
                self.served_ids.add(rid)
                if resp.status_code == 200:
                    out = {o["name"]: o for o in resp.json()["outputs"]}
                    self._check(rid, [json.loads(d) for d in out["response"]["data"]], budget, private)
                else:
                    self._check(rid, resp.json().get("responses", []), budget, private)
            elif kind == "openai":
                body = {"model": "conductor", "messages": [{"role": "user", "content": q}], **limits}
                resp = await client.post("/openai/v1/chat/completions", json=body, headers=headers)
                self._count(kind, resp.status_code)
                self.served_ids.add(rid)
                self._check(rid, [resp.json()["conductor"]], budget, private)
            elif kind in ("stream", "stream_drop"):
                body = {"model": "conductor", "messages": [{"role": "user", "content": q}], "stream": True}
                body.update(limits)
                async with client.stream(
                    "POST", "/openai/v1/chat/completions", json=body, headers=headers
                ) as resp:
                    self._count(kind, resp.status_code)
                    self.served_ids.add(rid)
                    async for line in resp.aiter_lines():
                        if kind == "stream_drop" and "conductor_step" in line:
                            break  # the client leaves mid-workflow
                        if line.startswith("data: {"):
                            doc = json.loads(line[6:]).get("conductor")
                            if doc:  # the final chunk, or the error event
                                self._check(rid, [doc], budget, private)
            elif kind == "slow_client":
                status = await self._raw(rid, q, pause_s=0.15, parts=4, stall=False)
                self._count(kind, status)
                if status in (200, 502):
                    self.served_ids.add(rid)
            elif kind == "stalled":
                self._count(kind, await self._raw(rid, q, pause_s=0.0, parts=2, stall=True))
            else:
                bad = self.rng.choice(
                    [b"{", b'{"instances": [{"question": "q", "max_cost_usd": -1}]}', b'{"instances": []}']
                )
                resp = await client.post(
                    "/v1/models/conductor:predict",
                    content=bad,
                    headers={**headers, "content-type": "application/json"},
                )
                self._count(kind, resp.status_code)
        except (TimeoutError, httpx.HTTPError, OSError) as exc:
            self.unexpected.append(f"{rid} {kind}: {exc!r}")

    def _count(self, kind: str, status: int) -> None:
        self.statuses[f"{kind} {status}"] += 1
        expected = {
            "stalled": {408},
            "bad": {400},
        }.get(kind, {200, 502})
        if status not in expected:
            self.unexpected.append(f"{kind}: status {status}")

    def _check(self, rid: str, docs: list[dict[str, Any]], budget: float | None, private: bool) -> None:
        for doc in docs:
            if budget is not None and doc["cost_usd"] > budget:
                self.overruns.append(f"{rid}: {doc['cost_usd']} > {budget}")
            if private:
                called = {a["worker"] for s in doc["steps"] for a in s["attempts"]} | {
                    s["worker"] for s in doc["steps"] if s["worker"]
                }
                if called & EXTERNAL:
                    self.private_leaks.append(f"{rid}: {sorted(called & EXTERNAL)}")

    async def _raw(self, rid: str, q: str, *, pause_s: float, parts: int, stall: bool) -> int:
        body = json.dumps({"instances": [{"question": q, "sensitivity": "private"}]}).encode()
        self.private_ids.add(rid)
        head = (
            f"POST /v1/models/conductor:predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"X-Request-ID: {rid}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(head)
            step = max(1, len(body) // parts)
            for k in range(0, len(body), step):
                if stall and k >= len(body) // 2:
                    break  # never sends the rest: the server must cut it
                writer.write(body[k : k + step])
                await writer.drain()
                await asyncio.sleep(pause_s)
            reply = await asyncio.wait_for(reader.read(), timeout=60)
        finally:
            writer.close()
        m = re.match(rb"HTTP/1.1 (\d+)", reply)
        return int(m.group(1)) if m else 0


def _metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{.*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


async def _run(url: str, port: int, n: int, concurrency: int, pid: int, seed: int) -> dict[str, Any]:
    soak = Soak(url, port, seed)
    names, weights = zip(*KINDS, strict=True)
    kinds = soak.rng.choices(names, weights=weights, k=n)
    rss: list[tuple[int, float]] = [(0, round(_rss_mb(pid), 1))]
    sem = asyncio.Semaphore(concurrency)
    done = 0
    t0 = time.perf_counter()
    async with httpx.AsyncClient(
        base_url=url, timeout=60, limits=httpx.Limits(max_connections=concurrency)
    ) as c:

        async def guarded(i: int, kind: str) -> None:
            nonlocal done
            async with sem:
                await soak.one(c, i, kind)
            done += 1
            if done % 500 == 0:
                rss.append((done, round(_rss_mb(pid), 1)))

        await asyncio.gather(*(guarded(i, k) for i, k in enumerate(kinds)))
        wall = time.perf_counter() - t0
        await asyncio.sleep(2.0)  # cancelled requests finish their log lines
        metrics = _metrics((await c.get("/metrics")).text)
    return {"soak": soak, "rss": rss, "wall_s": wall, "metrics": metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    port = free_port()
    serve = ["--host", "127.0.0.1", "--http_port", str(port), "--body_timeout_s", "2"]
    env = {**os.environ, "CONDUCTOR_API_KEYS": KEY, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        with predictor(POOL, Path(tmp), serve, env) as (proc, log):
            url = f"http://127.0.0.1:{port}"
            wait_ready(proc, lambda: httpx.get(f"{url}/v2/health/ready"), log)
            run = asyncio.run(_run(url, port, args.requests, args.concurrency, proc.pid, args.seed))
        text = log.read_text()
    soak: Soak = run["soak"]
    m = run["metrics"]
    records = [json.loads(x) for x in text.splitlines() if x.startswith('{"event": "conductor.request"')]
    per_id = collections.Counter(r["http_request_id"] for r in records)
    not_logged_once = sorted(i for i in soak.served_ids if per_id[i] != 1)
    private_external_logged = [
        r["http_request_id"]
        for r in records
        if r["sensitivity"] == "private" and set(r["workers"]) & EXTERNAL
    ]
    worker_cost = sum(v for k, v in m.items() if k.startswith("conductor_worker_cost_usd_total{"))
    logged_cost = sum(r["cost_usd"] for r in records)
    status_5xx = {k: v for k, v in soak.statuses.items() if k.split()[-1].startswith("5")}
    rss = run["rss"]
    results: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "worker_fail_rate": FAIL,
            "mix": dict(KINDS),
            "plan": "fixed:0,1 (cloud-x external, then local-a self)",
        },
        "wall_s": round(run["wall_s"], 1),
        "requests_per_s": round(args.requests / run["wall_s"], 1),
        "statuses": dict(sorted(soak.statuses.items())),
        "5xx": status_5xx,
        "5xx_other_than_502_no_answer": sum(v for k, v in status_5xx.items() if not k.endswith(" 502")),
        "unexpected": soak.unexpected[:20],
        "unexpected_count": len(soak.unexpected),
        "budget_overruns": len(soak.overruns),
        "private_calls_to_external_workers": len(soak.private_leaks) + len(private_external_logged),
        "served_requests": len(soak.served_ids),
        "log_lines": len(records),
        "served_without_exactly_one_log_line": len(not_logged_once),
        "cancelled_logged": sum(1 for r in records if r.get("cancelled")),
        "costed_requests_metric": m.get("conductor_request_cost_usd_count", 0.0),
        "logged_cost_usd": round(logged_cost, 6),
        "worker_cost_usd_total": round(worker_cost, 6),
        "cost_not_in_any_log_line_usd": round(worker_cost - logged_cost, 6),
        "rss_mb_by_requests_done": rss,
        "rss_growth_after_warmup_mb": round(rss[-1][1] - rss[min(2, len(rss) - 1)][1], 1),
        "task_destroyed_lines": text.count("Task was destroyed but it is pending"),
        "tracebacks": text.count("Traceback"),
    }
    report(results, args.json)


if __name__ == "__main__":
    main()
