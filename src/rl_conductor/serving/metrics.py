"""Prometheus metrics of the predictor, served by KServe's own ``/metrics`` route.

Why module-level objects: prometheus_client keeps one process-wide registry (the one KServe's
``/metrics`` encodes), and a metric may be registered only once per process.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

REQUESTS = Counter(
    "conductor_requests_total", "Requests answered, by endpoint and HTTP status class", ["endpoint", "status"]
)
REQUEST_LATENCY = Histogram(
    "conductor_request_latency_seconds",
    "Wall time of one question (plan + execute)",
    ["endpoint"],
    buckets=_LATENCY_BUCKETS,
)
PLAN_LATENCY = Histogram(
    "conductor_plan_latency_seconds", "Wall time of the policy's planning", buckets=_LATENCY_BUCKETS
)
PLAN_BATCH = Histogram(
    "conductor_plan_batch_size",
    "Questions planned in one batched generation",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
REQUEST_COST = Histogram(
    "conductor_request_cost_usd",
    "Worker cost of one question",
    buckets=(0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
)
WORKER_CALLS = Counter(
    "conductor_worker_calls_total",
    "Worker calls (a live worker's own retries inside one call), by worker and outcome: ok, error, "
    "refused (by the worker's open circuit breaker, no request sent), cancelled (timed out)",
    ["worker", "outcome"],
)
#: value of ``conductor_worker_circuit_state`` per breaker state
CIRCUIT_VALUES = {"closed": 0, "half_open": 1, "open": 2}
WORKER_CIRCUIT = Gauge(
    "conductor_worker_circuit_state",
    "Circuit breaker of a live worker: 0 closed (called), 1 half-open (one probe may go), 2 open (refused)",
    ["worker"],
)
WORKER_TOKENS = Counter(
    "conductor_worker_tokens_total", "Tokens of successful worker calls", ["worker", "direction"]
)
WORKER_COST = Counter("conductor_worker_cost_usd_total", "USD spent on worker calls", ["worker"])
WORKER_LATENCY = Histogram(
    "conductor_worker_latency_seconds",
    "Wall time of a worker call attempt",
    ["worker"],
    buckets=_LATENCY_BUCKETS,
)
ERRORS = Counter("conductor_errors_total", "Errors, by kind (bad_request, worker, internal)", ["kind"])
STOPS = Counter(
    "conductor_request_flags_total",
    "Requests with a fallback plan, a worker fallback, a budget stop or a deadline cut",
    ["flag"],
)
