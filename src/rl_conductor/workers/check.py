"""Check a pool before using it: one tiny call per worker, or the reason it cannot be made.

Why: a misconfigured worker (a ``base_url`` without the server's ``/v1``, a refused API key, a
server that is not running, an unset key variable) otherwise shows up only later, as failed
steps and fallbacks in the middle of an evaluation or of served traffic. :func:`check_pool_file`
(``conductor pool check POOL``) builds each worker on its own, so one worker's missing key does
not hide the others, and calls each once, without the response cache (a cached answer proves
nothing about the endpoint) and without retries (the report shows the first answer's status).
:func:`check_pool` does the same for a pool already built, calling each worker beneath its
cache; :func:`ensure_pool_ready` raises unless all answered (the predictor's optional readiness
check).

What a check costs: one call of ``CHECK_MAX_TOKENS`` output tokens per worker, priced as any
call (the report shows the cost). The offline simulated and fake kinds are called too (they
answer at once and cost what their prices say); a replay worker answers recorded tasks only and
has no endpoint, so it is listed as ``offline``, not called.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rl_conductor.errors import ConfigError, UserError
from rl_conductor.tasks.base import Task
from rl_conductor.workers.base import CallContext, Worker, innermost

CHECK_PROMPT = "Reply with the single word OK."
#: output tokens a check call may use (the executor's minimum call size, so the cost stays tiny)
CHECK_MAX_TOKENS = 64
DEFAULT_CHECK_TIMEOUT_S = 60.0
#: sampled as the executor samples by default (``RequestLimits.temperature``): greedy decoding of a small
#: model can repeat one blank token, which is not how the pool will be called
CHECK_TEMPERATURE = 0.2

CheckStatus = Literal["ok", "offline", "config", "error", "timeout", "empty"]
#: kinds that can only answer recorded tasks: nothing to call
NOT_CALLABLE_KINDS = frozenset({"replay"})


@dataclass(frozen=True)
class WorkerCheck:
    """What one worker did when called once (or why it could not be called).

    ``status``: ``ok`` (answered with text), ``offline`` (a replay worker: no endpoint, not
    called; counts as ok), ``config`` (the pool entry cannot be built: a missing
    key variable, a bad field), ``error`` (the call raised: HTTP status, connection), ``timeout``,
    ``empty`` (answered without text). ``detail`` says why, naming the URL and what to check."""

    name: str
    kind: str
    hosting: str
    url: str
    status: CheckStatus
    latency_s: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "offline")


@dataclass(frozen=True)
class PoolReport:
    """One :class:`WorkerCheck` per worker of the pool, in pool order."""

    pool: str
    workers: list[WorkerCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.workers) and all(w.ok for w in self.workers)

    @property
    def failed(self) -> list[WorkerCheck]:
        return [w for w in self.workers if not w.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "ok": self.ok,
            "workers": [asdict(w) | {"ok": w.ok} for w in self.workers],
        }


def _url(worker: Any) -> str:
    return str(getattr(worker, "base_url", None) or "-")


_CHECK_TASK = Task(
    id="pool-check/1",
    question=CHECK_PROMPT,
    answer="OK",
    domain="knowledge",
    source="pool-check",
    grader="qa",
)


async def check_worker(worker: Worker, *, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> WorkerCheck:
    """Call ``worker`` (beneath its cache) once with :data:`CHECK_PROMPT`."""
    real = innermost(worker)
    info = worker.info
    base = WorkerCheck(name=info.name, kind=info.kind, hosting=info.hosting, url=_url(real), status="ok")
    if info.kind in NOT_CALLABLE_KINDS:
        return replace(base, status="offline", detail="answers recorded tasks only; not called")
    t0 = time.perf_counter()
    try:
        comp = await asyncio.wait_for(
            real.complete(
                [{"role": "user", "content": CHECK_PROMPT}],
                max_tokens=CHECK_MAX_TOKENS,
                temperature=CHECK_TEMPERATURE,
                context=CallContext(task=_CHECK_TASK),
            ),
            timeout=timeout_s,
        )
    except TimeoutError:
        return replace(base, status="timeout", latency_s=timeout_s, detail=f"no answer in {timeout_s:g}s")
    except Exception as exc:  # every failure is reported, named, never raised
        detail = (str(exc) or exc.__class__.__name__).removeprefix(f"{info.name}: ")
        return replace(base, status="error", latency_s=time.perf_counter() - t0, detail=detail)
    used = replace(
        base,
        latency_s=comp.latency_s,
        input_tokens=comp.input_tokens,
        output_tokens=comp.output_tokens,
        cost_usd=comp.cost_usd,
    )
    if not (isinstance(comp.text, str) and comp.text.strip()):
        return replace(used, status="empty", detail="answered without text")
    estimated = " (tokens estimated: the server reported no usage)" if comp.tokens_estimated else ""
    return replace(used, detail=f"answered {comp.text.strip()[:40]!r}{estimated}")


async def check_workers(
    workers: Sequence[Worker], *, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
) -> list[WorkerCheck]:
    """Check several workers concurrently; results in the given order."""
    return list(await asyncio.gather(*(check_worker(w, timeout_s=timeout_s) for w in workers)))


def _run(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    raise RuntimeError("check_pool() was called on a running event loop: await check_pool_async() instead")


async def check_pool_async(pool: Any, *, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> PoolReport:
    """:func:`check_pool` for callers on an event loop (the predictor)."""
    return PoolReport(pool=pool.name, workers=await check_workers(pool.workers, timeout_s=timeout_s))


def check_pool(pool: Any, *, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> PoolReport:
    """Call every worker of a built :class:`~rl_conductor.workers.pool.Pool` once (beneath its
    cache, with the worker's own retry policy) and report; never raises for a failing worker."""
    return _run(check_pool_async(pool, timeout_s=timeout_s))  # type: ignore[no-any-return]


class PoolNotReady(UserError):
    """A readiness check found workers that do not answer; the message names each and why."""


def ensure_pool_ready(pool: Any, *, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S) -> PoolReport:
    """:func:`check_pool`, raising :class:`PoolNotReady` (exit status 1 from the CLI, one line)
    unless every worker answered: what a predictor calls in ``load()`` behind an opt-in flag, so
    that it turns ready only once its pool has answered."""
    report = check_pool(pool, timeout_s=timeout_s)
    if not report.ok:
        why = "; ".join(f"{w.name} ({w.status}: {w.detail})" for w in report.failed)
        raise PoolNotReady(
            f"pool {report.pool}: {len(report.failed)} of {len(report.workers)} workers failed: {why}"
        )
    return report


def _unbuilt(spec: Any, exc: Exception) -> WorkerCheck:
    spec = spec if isinstance(spec, dict) else {}
    return WorkerCheck(
        name=str(spec.get("name", "?")),
        kind=str(spec.get("kind", "?")),
        hosting=str(spec.get("hosting", "external")),
        url=str(spec.get("base_url", "-")),
        status="config",
        detail=str(exc),
    )


def check_pool_file(
    name_or_path: str | Path, *, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S, seed: int = 0
) -> PoolReport:
    """Build each worker of a pool file on its own (no cache, one attempt) and call it once.

    A worker entry that cannot be built (an unset key variable, a bad field) is reported as
    ``config`` with the loader's message, and the others are still called. A pool file that
    cannot be read at all raises :class:`~rl_conductor.workers.pool.PoolConfigError`."""
    from rl_conductor.workers.pool import build_pool, load_pool_config

    cfg = load_pool_config(name_or_path)
    options = {k: v for k, v in cfg.items() if k not in ("cache", "workers")}
    options["retries"] = 1  # the first answer's status is what the report is about
    checks: list[WorkerCheck | None] = []
    workers: list[Worker] = []
    for spec in cfg["workers"]:
        entry = (
            {k: v for k, v in spec.items() if k not in ("cache", "retries")}
            if isinstance(spec, dict)
            else spec
        )
        try:
            built = build_pool({**options, "workers": [entry]}, seed=seed)
        except (ConfigError, ValueError, TypeError) as exc:
            checks.append(_unbuilt(spec, exc))
            continue
        checks.append(None)
        workers.append(built.workers[0])
    called = iter(_run(check_workers(workers, timeout_s=timeout_s)))
    report = [c if c is not None else next(called) for c in checks]
    return PoolReport(pool=str(cfg.get("name", name_or_path)), workers=report)


__all__ = [
    "CHECK_MAX_TOKENS",
    "CHECK_PROMPT",
    "PoolNotReady",
    "PoolReport",
    "WorkerCheck",
    "check_pool",
    "check_pool_async",
    "check_pool_file",
    "check_worker",
    "ensure_pool_ready",
]
