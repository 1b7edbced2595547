"""What every live client shares: timeouts, retries, the circuit breaker, spend guard, usage.

A wire-API module (:mod:`.openai`, :mod:`.anthropic`, :mod:`.gemini`) only says what one
request's SDK arguments are (:meth:`LiveWorker._request`), how to send them and read the answer
(:meth:`LiveWorker._send`) and how to turn the SDK's exceptions into transient or permanent
errors (:meth:`LiveWorker._classify`).
:meth:`LiveWorker.complete` adds the rest, the same for every API:

* a per-attempt timeout, retries (``resilience.RetryPolicy``), a circuit breaker;
* the spend guard's reservation before the call and charge after it;
* billed tokens from the API's usage fields, every kind the vendor bills (reasoning, thinking,
  prompt-cache reads and writes); where a server reports none, the worst case it could bill
  (the input bound and ``max_tokens``) marked ``Completion.tokens_estimated``; cost from the
  pool's prices;
* ``finish_reason`` ("stop" / "length") carried to the trace, so truncated or empty output is
  marked on the step rather than crashing anything;
* streaming, for the call that answers a ``stream: true`` request (a
  :class:`~rl_conductor.workers.base.TokenSink` in ``STREAM_SINK``): an API module that streams
  (:meth:`LiveWorker._send_stream`) passes each text delta on as it arrives. A failure before the
  first delta is retried like any other; after it the text cannot be taken back, so the failure
  is :class:`StreamInterruptedError` (not retried; the sink reports it to the client) and the
  attempt is charged its worst case, as a timed-out one is (the vendor bills what it generated,
  which may be more than reached us);
* error messages passed through :func:`.secrets.redact`; a refused key (401/403), a wrong path
  (404) or an endpoint that does not answer names the worker, its ``base_url``, the status and
  what to check (:func:`explain`), and a refused key or wrong path is logged as a warning once
  per worker, so a fallback never hides a misconfigured worker.

SDK clients are made per event loop (an HTTP connection pool belongs to the loop that opened
it), unless a client is injected, which is then used as is. The three SDKs are built on
``httpx2`` (the successor of httpx; anthropic refuses an ``httpx`` client), so an injected client
is an ``httpx2.AsyncClient``.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx2

from rl_conductor.workers.base import (
    STREAM_SINK,
    CallWorker,
    Completion,
    Message,
    RetryRefusedError,
    TokenSink,
    WorkerCall,
    WorkerError,
    WorkerInfo,
    note_unanswered_bill,
    reserve_retry,
)
from rl_conductor.workers.kinds import PoolConfigError, info_from_spec
from rl_conductor.workers.live.resilience import (
    CircuitBreaker,
    PermanentWorkerError,
    RetryPolicy,
    TransientWorkerError,
    breaker_from,
    retry_policy_from,
)
from rl_conductor.workers.live.secrets import redact
from rl_conductor.workers.live.spend import SpendGuard, SpendLimitError, worst_case_cost

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
#: statuses that mean the worker is misconfigured (key or URL), not that it is busy or down
MISCONFIGURED_STATUS = frozenset({401, 403, 404})
OPENAI_PATHS_HINT = (
    "llama.cpp and vLLM serve the OpenAI API under /v1 (base_url http://HOST:PORT/v1); KServe's "
    "Hugging Face and vLLM runtimes and `conductor worker serve` under /openai/v1"
)


def explain(
    err: WorkerError, *, kind: str, base_url: str | None, api_key_env: str | None, has_key: bool
) -> WorkerError:
    """``err`` with what to check appended when it says the worker is misconfigured (401/403:
    the key; 404: the base URL) or unreachable (connection refused: the URL and the server), so
    an error names the worker, the URL, the status and a fix. Other errors are returned as is."""
    status = getattr(err, "status", None)
    where = f"base_url {base_url}" if base_url else "the API's default base_url"
    if isinstance(err, PermanentWorkerError) and status in (401, 403):
        fix = (
            f"check the key in environment variable {api_key_env}"
            if api_key_env
            else "the server wants an API key: set `api_key_env` to the variable that holds it"
        )
        if api_key_env and not has_key:
            fix = f"environment variable {api_key_env} is empty"
        return PermanentWorkerError(f"{err} ({where}): the server refused the API key; {fix}", status=status)
    if isinstance(err, PermanentWorkerError) and status == 404:
        fix = OPENAI_PATHS_HINT if kind == "openai" else "check base_url and the model name"
        return PermanentWorkerError(f"{err} ({where}): no such route or model; {fix}", status=status)
    if isinstance(err, TransientWorkerError) and err.status is None and not err.timed_out:
        return TransientWorkerError(
            f"{err} ({where}): is the server running and the host and port right?",
            retry_after_s=err.retry_after_s,
        )
    return err


class StreamInterruptedError(WorkerError):
    """A streamed answer broke after part of it was passed on: not retried (see module docstring)."""


class StreamEndedEarlyError(TransientWorkerError):
    """A stream ended without its vendor's end marker (a proxy or a crashed server cut it): what
    came is part of an answer, never a whole one. Retried like a timeout before any text was
    passed on, and, like a timeout, charged its worst case (the vendor may bill what it made)."""


@dataclass(frozen=True)
class WireResult:
    """One successful response, as read from the wire.

    ``input_tokens`` / ``output_tokens`` are every billed token of each side (reasoning and
    thinking are output; prompt-cache reads and writes are input), None where the server
    reported no usage.
    """

    text: str
    input_tokens: int | None
    output_tokens: int | None
    finish_reason: str = ""


def usage_count(usage: Any, *names: str) -> int | None:
    """The sum of the integer usage fields ``names`` of an SDK usage object (a missing or
    non-integer field counts 0); None when none of them is an integer."""
    found = [getattr(usage, n, None) for n in names] if usage is not None else []
    ints = [v for v in found if isinstance(v, int) and not isinstance(v, bool)]
    return sum(ints) if ints else None


@dataclass(frozen=True)
class CallStats:
    """Counters of one live worker (for benchmarks, tests and the closing report)."""

    calls: int
    attempts: int
    retries: int
    failures: int
    refused_by_circuit: int


@dataclass(kw_only=True)
class LiveWorker(CallWorker, abc.ABC):
    """Base of the live clients. Subclasses implement ``_send`` and ``_classify``.

    Attributes:
        info: static facts (name, prices, hosting) from the pool file.
        model: the model name the API expects.
        base_url: the API root (``…/openai/v1`` for KServe, ``https://api.openai.com/v1``, …).
        api_key: the key (None where the server needs none); never printed.
        timeout_s: per-attempt timeout.
        retry: retry policy; breaker: circuit breaker; spend: optional run-wide spend guard.
        http_client: an injected ``httpx2.AsyncClient`` (else one per event loop, made here).
    """

    info: WorkerInfo
    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    #: the environment variable the key came from (named in error messages, never its value)
    api_key_env: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    spend: SpendGuard | None = None
    http_client: httpx2.AsyncClient | None = field(default=None, repr=False)
    #: how retries wait (``asyncio.sleep``); tests inject a recorder
    sleep: Callable[[float], Awaitable[None]] | None = field(default=None, repr=False)
    _clients: dict[int, Any] = field(default_factory=dict, repr=False)
    _counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("calls", "attempts", "retries", "failures", "refused"), 0),
        repr=False,
    )
    _warned: set[int] = field(default_factory=set, repr=False)

    #: what ends a whole stream of this API (named in the error when a stream ends without it)
    stream_end_marker: ClassVar[str] = "a finish reason"

    # ------------------------------------------------------------------ subclass hooks

    @abc.abstractmethod
    def _make_client(self, http_client: httpx2.AsyncClient) -> Any:
        """The SDK client over ``http_client``."""

    @abc.abstractmethod
    def _request(self, messages: Sequence[Message], max_tokens: int, temperature: float) -> dict[str, Any]:
        """The SDK call's keyword arguments for one request (the same whole or streamed)."""

    @abc.abstractmethod
    async def _send(self, client: Any, request: dict[str, Any]) -> WireResult:
        """Send ``request`` (:meth:`_request`'s) with the SDK and read the answer; raise SDK
        exceptions as they come."""

    async def _send_stream(
        self, client: Any, request: dict[str, Any], on_delta: Callable[[str], None]
    ) -> WireResult:
        """Send ``request`` streaming, pass each text delta to ``on_delta`` as it arrives, and
        return the whole result (usage from the stream's last event). The default answers whole,
        for an API whose streaming is not implemented here."""
        return await self._send(client, request)

    @abc.abstractmethod
    def _classify(self, exc: Exception) -> WorkerError | None:
        """Map an SDK exception to a transient / permanent error (None: not an API error)."""

    # ------------------------------------------------------------------ the call

    def stats(self) -> CallStats:
        c = self._counts
        return CallStats(c["calls"], c["attempts"], c["retries"], c["failures"], c["refused"])

    def _client(self) -> Any:
        if self.http_client is not None:
            key = 0
            if key not in self._clients:
                self._clients[key] = self._make_client(self.http_client)
            return self._clients[key]
        loop = asyncio.get_running_loop()
        key = id(loop)
        entry = self._clients.get(key)
        if entry is None or entry[0] is not loop:
            http = httpx2.AsyncClient(timeout=httpx2.Timeout(self.timeout_s + 5.0))
            entry = (loop, self._make_client(http))
            # forget clients of closed loops; their connections died with them
            self._clients = {k: v for k, v in self._clients.items() if not v[0].is_closed()}
            self._clients[key] = entry
        return entry[1]

    async def _attempt(
        self, messages: Sequence[Message], max_tokens: int, temperature: float, sink: TokenSink | None
    ) -> WireResult:
        self._counts["attempts"] += 1
        client = self._client()
        try:
            request = self._request(messages, max_tokens, temperature)
            call = (
                self._send(client, request)
                if sink is None
                else self._send_stream(client, request, sink.delta)
            )
            result = await asyncio.wait_for(call, self.timeout_s)
            if sink is not None and not result.finish_reason:
                # every vendor ends a whole stream with a marker (the finish reason rides on it);
                # a body that just stops is a cut answer, never to be served or cached as whole
                raise StreamEndedEarlyError(
                    f"{self.info.name}: the stream ended without its end marker "
                    f"({self.stream_end_marker}) after {sink.sent} chunks"
                )
            return result
        except Exception as exc:
            err = self._error_of(exc)
            if sink is not None and sink.sent:
                raise StreamInterruptedError(
                    f"{self.info.name}: the stream broke after {sink.sent} chunks were sent on: {err}"
                ) from None
            raise err from None

    def _error_of(self, exc: Exception) -> WorkerError:
        """The :class:`WorkerError` an attempt's exception stands for."""
        if isinstance(exc, TimeoutError):
            return TransientWorkerError(
                f"{self.info.name}: timed out after {self.timeout_s:g}s", timed_out=True
            )
        if isinstance(exc, WorkerError):
            return exc
        err = self._classify(exc)
        if err is None:
            return WorkerError(f"{self.info.name}: {exc.__class__.__name__}: {redact(str(exc))[:300]}")
        return explain(
            err,
            kind=self.info.kind,
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            has_key=bool(self.api_key),
        )

    def _on_retry(self, state: Any) -> None:
        self._counts["retries"] += 1
        exc = state.outcome.exception() if state.outcome is not None else None
        log.warning("%s: attempt %d failed (%s); retrying", self.info.name, state.attempt_number, exc)

    def _cover_retry(self, bound: float, last: WorkerError) -> float:
        """Reserve the worst case of one more attempt against the request's budget (the
        executor's) and the pool's spend guard, after the attempt before it was charged its own;
        the amount held on the spend guard. Raise :class:`RetryRefusedError` (the retry is not
        sent) when either has too little left."""
        name = self.info.name
        if not reserve_retry(bound):
            raise RetryRefusedError(
                f"{last}; a retry could cost up to ${bound:.6g}, more than the request's budget "
                "has left after the attempts before it; not sent",
                by="request",
            )
        if self.spend is None:
            return 0.0
        try:
            return self.spend.reserve(name, bound)
        except SpendLimitError as exc:
            raise RetryRefusedError(f"{last}; retry not sent: {exc}", by="pool") from None

    async def call(self, call: WorkerCall) -> Completion:
        messages, max_tokens, temperature = call.messages, call.max_tokens, call.temperature
        self._counts["calls"] += 1
        name = self.info.name
        try:
            self.breaker.before_call(name)
        except WorkerError:
            self._counts["refused"] += 1
            raise
        msgs = list(messages)
        sink = STREAM_SINK.get()
        bound = worst_case_cost(self.info, msgs, max_tokens)  # what one attempt may be billed
        # attempts sent that timed out or broke mid-stream: the vendor may bill them all the same
        timed_out_usd = 0.0
        reservation = 0.0
        if self.spend is not None:
            try:
                reservation = self.spend.reserve(name, bound)
            except SpendLimitError:
                self.breaker.release_probe()
                raise
        t0 = time.perf_counter()
        # set when an attempt was charged its worst case: the next one needs a worst case of its own
        uncovered: WorkerError | None = None
        try:
            result: WireResult | None = None
            async for attempt in self.retry.retrying(self._on_retry, self.sleep):
                with attempt:
                    if uncovered is not None:
                        reservation += self._cover_retry(bound, uncovered)
                        uncovered = None
                    try:
                        result = await self._attempt(msgs, max_tokens, temperature, sink)
                    except (TransientWorkerError, StreamInterruptedError) as exc:
                        if isinstance(exc, StreamInterruptedError | StreamEndedEarlyError) or exc.timed_out:
                            timed_out_usd += bound  # charged its worst case, by the executor too
                            note_unanswered_bill(bound)
                            uncovered = exc
                        raise
            assert result is not None
        except WorkerError as exc:
            self._counts["failures"] += 1
            self.breaker.record_failure()
            if sink is not None and sink.sent:
                sink.broken(str(exc))
            status = getattr(exc, "status", None)
            if status in MISCONFIGURED_STATUS and status not in self._warned:
                self._warned.add(status)  # once per worker and status: loud, not a flood
                log.warning("%s", exc)
            if self.spend is not None:
                self.spend.settle(reservation, timed_out_usd)
            raise
        except BaseException:
            self.breaker.release_probe()
            if sink is not None and sink.sent:  # the step timeout cut the stream off
                sink.broken(f"{name}: the stream was cut off after {sink.sent} chunks")
            if self.spend is not None:  # cancelled mid-attempt: that one may be billed too
                self.spend.settle(reservation, (0.0 if uncovered is not None else bound) + timed_out_usd)
            raise
        latency = time.perf_counter() - t0
        self.breaker.record_success()
        # a server that reports no usage is charged the worst case it could bill (the input bound
        # and every output token it was allowed, hidden reasoning included), marked as estimated
        estimated = result.input_tokens is None or result.output_tokens is None
        in_tok = result.input_tokens if result.input_tokens is not None else self.info.input_token_bound(msgs)
        out_tok = result.output_tokens if result.output_tokens is not None else max_tokens
        if out_tok > max_tokens:
            log.error(
                "%s: the server reports %d output tokens billed for a call capped at %d",
                name,
                out_tok,
                max_tokens,
            )
        cost = self.info.cost(in_tok, out_tok)
        if self.spend is not None:
            self.spend.settle(reservation, cost + timed_out_usd)
        return Completion(
            text=result.text,
            input_tokens=in_tok,
            output_tokens=out_tok,
            cost_usd=cost,
            latency_s=latency,
            worker=name,
            finish_reason=result.finish_reason,
            tokens_estimated=estimated,
        )


# ---------------------------------------------------------------------- pool-file helpers


def expand_env(value: str, *, where: str) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}`` in a pool value (endpoints, not keys)."""

    def sub(m: re.Match[str]) -> str:
        var, default = m.group(1), m.group(2)
        got = os.environ.get(var)
        if got:
            return got
        if default is not None:
            return default
        raise PoolConfigError(f"{where}: environment variable {var} is not set (and has no default)")

    return _ENV_REF.sub(sub, value)


def common_settings(spec: dict[str, Any], options: dict[str, Any], *, needs_key: bool) -> dict[str, Any]:
    """Keyword arguments shared by every live worker, read and validated from a worker entry
    (falling back to pool-level options): ``model``, ``base_url``, ``api_key_env``,
    ``timeout_s``, ``retries``, ``circuit``, and the pool's ``max_usd`` spend guard.
    ``model``, ``base_url``, ``cache`` and ``max_usd`` may use ``${VAR}`` / ``${VAR:-default}``."""
    from rl_conductor.workers.live.secrets import api_key_from_env

    name = spec["name"]
    where = f"worker {name!r}"
    model = spec.get("model")
    if not isinstance(model, str) or not model:
        raise PoolConfigError(f"{where}: `model` (the model name the API expects) is required")
    model = expand_env(model, where=where)
    base_url = spec.get("base_url", options.get("base_url"))
    if base_url is not None:
        base_url = expand_env(str(base_url), where=where)
        if not base_url.startswith(("http://", "https://")):
            raise PoolConfigError(f"{where}: base_url must start with http:// or https://, got {base_url!r}")
    timeout_s = float(spec.get("timeout_s", options.get("timeout_s", DEFAULT_TIMEOUT_S)))
    if not timeout_s > 0:
        raise PoolConfigError(f"{where}: timeout_s must be > 0")
    try:
        retry = retry_policy_from(spec, options)
        breaker = breaker_from(spec, options)
    except (TypeError, ValueError) as exc:
        raise PoolConfigError(f"{where}: {exc}") from None
    return {
        "info": info_from_spec(spec),
        "model": model,
        "base_url": base_url,
        "api_key": api_key_from_env(spec, required=needs_key),
        "api_key_env": spec.get("api_key_env"),
        "timeout_s": timeout_s,
        "retry": retry,
        "breaker": breaker,
        "spend": spend_guard_for(options),
    }


def spend_guard_for(options: dict[str, Any]) -> SpendGuard | None:
    """The pool's shared :class:`SpendGuard` (pool option ``max_usd``), made on first use."""
    from rl_conductor.workers.cache import shared_state

    if options.get("max_usd") is None:
        return None
    state = shared_state(options)
    guard = state.spend_guard
    if guard is None:
        raw = options["max_usd"]
        if isinstance(raw, str):
            raw = expand_env(raw, where="max_usd")
        try:
            guard = SpendGuard(float(raw))
        except (TypeError, ValueError) as exc:
            raise PoolConfigError(f"max_usd: {exc}") from None
        state.spend_guard = guard
    assert isinstance(guard, SpendGuard)
    return guard


def wrap_cache(worker: Any, spec: dict[str, Any], options: dict[str, Any]) -> Any:
    """Wrap ``worker`` in the pool's response cache when the pool (or entry) configures ``cache``
    (public calls) or ``cache_private`` (a separate store for private calls; default off)."""
    cfg = spec.get("cache", options.get("cache"))
    if isinstance(cfg, str):
        cfg = expand_env(cfg, where="cache")
    private = spec.get("cache_private", options.get("cache_private"))
    if isinstance(private, str):
        private = expand_env(private, where="cache_private")
    if not cfg and not private:
        return worker
    from rl_conductor.workers.cache import CachedWorker, private_store_for, store_for

    return CachedWorker(
        inner=worker,
        store=store_for(cfg, options) if cfg else None,
        private_store=private_store_for(private, cfg, options),
    )
