"""Retries, ``Retry-After`` and a circuit breaker: what keeps a flaky endpoint from sinking a run.

Order of defences for one call of a live worker:

1. a per-attempt timeout (``timeout_s``);
2. retries with exponential backoff and jitter (tenacity) on what is worth retrying — HTTP 408,
   409, 429, 5xx, timeouts and connection errors — waiting what the server's ``Retry-After``
   (or ``retry-after-ms``) asks for instead, capped by ``max_retry_after_s``;
3. after the retries, the call fails with a :class:`~rl_conductor.workers.base.WorkerError`
   and the executor tries its fallback worker of the same hosting class;
4. a per-worker :class:`CircuitBreaker`: after ``failure_threshold`` failed calls in a row the
   worker refuses calls at once (no latency, no spend, :class:`CircuitOpenError`) for
   ``reset_after_s``; then one probe call (a real request) is let through: its success closes the
   circuit, its failure opens it again for twice as long, up to ``max_reset_after_s``. So a
   worker that comes back is called again within ``reset_after_s`` after a short outage and
   within ``max_reset_after_s`` after a long one (defaults 2 s and 16 s), never a fixed 30 s.

This is the only retry layer: nothing above a live client (the executor, the predictor) retries
the same worker again; the executor's answer to a failed call is a *different* worker (its
fallback). One step therefore makes at most ``attempts`` HTTP requests per worker it tries
(default 3), and exactly one for a permanent error (400, 401, 403, 404, 422, ...).

Simplification: the breaker counts failed *calls* (after retries), not attempts, and is local to
the process (each serving replica learns on its own).
"""

from __future__ import annotations

import email.utils
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from rl_conductor.workers.base import WorkerError

#: HTTP statuses worth retrying: request timeout, conflict, rate limit, and server errors.
RETRYABLE_STATUS = frozenset({408, 409, 429})
#: Default tries per call of one worker (``retries: {attempts: N}`` in a pool file).
DEFAULT_ATTEMPTS = 3
#: Circuit defaults: failed calls in a row that open it; first and longest wait before a probe.
DEFAULT_FAILURE_THRESHOLD = 5
DEFAULT_RESET_AFTER_S = 2.0
DEFAULT_MAX_RESET_AFTER_S = 16.0


class TransientWorkerError(WorkerError):
    """A failure that may pass on retry (429, 5xx, timeout, connection); may carry Retry-After."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        timed_out: bool = False,
    ):
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s
        self.timed_out = timed_out


class PermanentWorkerError(WorkerError):
    """A failure that retrying will not fix (4xx other than the retryable ones, bad request)."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.status = status


class MalformedResponseError(WorkerError):
    """The server answered 2xx with a body that is not the API's response shape."""


class CircuitOpenError(WorkerError):
    """The worker's circuit is open: it failed repeatedly and is not called for a while."""


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS or status >= 500


def retry_after_seconds(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds a response asks the client to wait: ``retry-after-ms``, else ``Retry-After``
    (delta seconds or an HTTP date); None when absent or unreadable."""
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lower.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify_status(status: int, message: str, headers: Mapping[str, str] | None) -> WorkerError:
    """The error for an HTTP error status: transient (with Retry-After) or permanent."""
    if is_retryable_status(status):
        return TransientWorkerError(message, status=status, retry_after_s=retry_after_seconds(headers))
    return PermanentWorkerError(message, status=status)


@dataclass(frozen=True)
class RetryPolicy:
    """How a live worker retries one call.

    Attributes:
        attempts: tries in all (1 = no retry).
        initial_s: first backoff wait; doubles each retry.
        max_s: the longest backoff wait.
        jitter_s: uniform random extra wait added to each backoff wait.
        max_retry_after_s: the longest ``Retry-After`` honoured (a longer one is capped).
    """

    attempts: int = DEFAULT_ATTEMPTS
    initial_s: float = 0.5
    max_s: float = 8.0
    jitter_s: float = 0.5
    max_retry_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("retry attempts must be >= 1")
        if min(self.initial_s, self.max_s, self.jitter_s, self.max_retry_after_s) < 0:
            raise ValueError("retry waits must be >= 0")

    def wait_s(self, state: RetryCallState, rng: random.Random | None = None) -> float:
        """Seconds to wait before the next attempt: the server's Retry-After, else backoff + jitter."""
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, TransientWorkerError) and exc.retry_after_s is not None:
            return min(exc.retry_after_s, self.max_retry_after_s)
        backoff = min(self.max_s, self.initial_s * 2 ** (state.attempt_number - 1))
        return backoff + (rng or random).uniform(0, self.jitter_s)

    def retrying(
        self,
        on_retry: Callable[[RetryCallState], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> AsyncRetrying:
        """A tenacity controller that retries :class:`TransientWorkerError` only (``sleep``:
        how to wait, ``asyncio.sleep`` by default; tests record the waits instead)."""
        extra: dict[str, Any] = {"sleep": sleep} if sleep is not None else {}
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            retry=retry_if_exception_type(TransientWorkerError),
            wait=self.wait_s,
            before_sleep=on_retry,
            reraise=True,
            **extra,
        )


CircuitState = Literal["closed", "open", "half_open"]


@dataclass
class CircuitBreaker:
    """Per-worker circuit breaker (see the module docstring).

    Attributes:
        failure_threshold: failed calls in a row that open the circuit.
        reset_after_s: how long a newly opened circuit refuses calls before one probe is let
            through (the wait after a short outage).
        max_reset_after_s: the longest wait: each failed probe doubles the wait up to this.
        clock: monotonic seconds (injectable for tests).
    """

    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD
    reset_after_s: float = DEFAULT_RESET_AFTER_S
    max_reset_after_s: float = DEFAULT_MAX_RESET_AFTER_S
    clock: Callable[[], float] = time.monotonic
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False
    opened_count: int = 0
    #: how long the circuit stays open this time (``reset_after_s``, doubled per failed probe)
    open_for_s: float = -1.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("circuit failure_threshold must be >= 1")
        if self.reset_after_s < 0:
            raise ValueError("circuit reset_after_s must be >= 0")
        if self.max_reset_after_s < self.reset_after_s:
            # an explicit reset_after_s above the default ceiling is meant as a fixed wait
            self.max_reset_after_s = self.reset_after_s
        if self.open_for_s < 0:
            self.open_for_s = self.reset_after_s

    @property
    def state(self) -> CircuitState:
        if self.opened_at is None:
            return "closed"
        if self.clock() - self.opened_at < self.open_for_s:
            return "open"
        return "half_open"

    def before_call(self, name: str) -> None:
        """Raise :class:`CircuitOpenError` unless a call may go out now."""
        with self._lock:
            state = self.state
            if state == "closed":
                return
            if state == "half_open" and not self.probing:
                self.probing = True  # exactly one probe at a time
                return
            assert self.opened_at is not None
            wait = max(0.0, self.open_for_s - (self.clock() - self.opened_at))
            raise CircuitOpenError(
                f"{name}: circuit open after {self.failures} failed calls in a row; next probe in {wait:.1f}s"
            )

    def record_success(self) -> None:
        with self._lock:
            self.failures, self.opened_at, self.probing = 0, None, False
            self.open_for_s = self.reset_after_s

    def record_failure(self) -> None:
        with self._lock:
            self.failures += 1
            if self.probing:  # the probe failed: the worker is still down, wait twice as long
                self.open_for_s = min(self.max_reset_after_s, max(self.open_for_s, 1e-3) * 2)
            if self.probing or self.failures >= self.failure_threshold:
                if self.opened_at is None or self.probing:
                    self.opened_count += 1
                self.opened_at, self.probing = self.clock(), False

    def release_probe(self) -> None:
        """A probe ended without a verdict on the endpoint (e.g. refused by the spend guard)."""
        with self._lock:
            self.probing = False


def retry_policy_from(spec: Mapping[str, Any], options: Mapping[str, Any]) -> RetryPolicy:
    """``retries:`` of a worker entry (else of the pool): attempts, initial_s, max_s, jitter_s,
    max_retry_after_s."""
    raw = spec.get("retries", options.get("retries"))
    if raw is None:
        raw = {}
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = {"attempts": raw}
    if not isinstance(raw, Mapping):
        raise ValueError("`retries` must be a number of attempts or a mapping")
    known = {f for f in RetryPolicy.__dataclass_fields__}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown retries settings {sorted(unknown)}; known: {sorted(known)}")
    kwargs: dict[str, Any] = {k: (int(v) if k == "attempts" else float(v)) for k, v in raw.items()}
    return RetryPolicy(**kwargs)


def breaker_from(spec: Mapping[str, Any], options: Mapping[str, Any]) -> CircuitBreaker:
    """``circuit:`` of a worker entry (else of the pool): failure_threshold, reset_after_s,
    max_reset_after_s."""
    raw = spec.get("circuit", options.get("circuit", {})) or {}
    if not isinstance(raw, Mapping):
        raise ValueError("`circuit` must be a mapping")
    known = {"failure_threshold", "reset_after_s", "max_reset_after_s"}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown circuit settings {sorted(unknown)}; known: {sorted(known)}")
    reset = float(raw.get("reset_after_s", DEFAULT_RESET_AFTER_S))
    return CircuitBreaker(
        failure_threshold=int(raw.get("failure_threshold", DEFAULT_FAILURE_THRESHOLD)),
        reset_after_s=reset,
        max_reset_after_s=float(raw.get("max_reset_after_s", max(reset, DEFAULT_MAX_RESET_AFTER_S))),
    )


def breaker_of(worker: Any) -> CircuitBreaker | None:
    """The circuit breaker of ``worker`` or of the worker it wraps (``.inner``: the cache, the
    predictor's metrics wrapper); None for workers without one (simulated, replay, fake)."""
    seen = 0
    while worker is not None and seen < 16:
        breaker = getattr(worker, "breaker", None)
        if isinstance(breaker, CircuitBreaker):
            return breaker
        worker, seen = getattr(worker, "inner", None), seen + 1
    return None


def classify_sdk_error(name: str, exc: Exception, sdk: Any) -> WorkerError | None:
    """Map an exception of a Stainless-generated SDK (``openai``, ``anthropic``: the same error
    classes) to a transient / permanent / malformed error; None when it is not an API error.
    Messages are redacted and shortened: they may end up in traces and logs."""
    from rl_conductor.workers.live.secrets import redact

    if isinstance(exc, sdk.APITimeoutError):
        return TransientWorkerError(f"{name}: timed out", timed_out=True)
    if isinstance(exc, sdk.APIConnectionError):
        return TransientWorkerError(f"{name}: connection failed: {redact(str(exc))[:200]}")
    if isinstance(exc, sdk.APIStatusError):
        return classify_status(
            exc.status_code,
            f"{name}: HTTP {exc.status_code}: {redact(exc.message)[:300]}",
            dict(exc.response.headers),
        )
    if isinstance(exc, sdk.APIResponseValidationError | ValueError):
        return MalformedResponseError(f"{name}: malformed response: {redact(str(exc))[:200]}")
    return None
