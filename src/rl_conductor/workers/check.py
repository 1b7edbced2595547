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
answer at once and cost what their prices say).

A replay worker has no endpoint: what can be wrong is its recordings. So it replays every item
of the pool's dataset (the recordings file's items; with workers naming files of their own, the
first replay worker's, as in the built pool) offline, as an evaluation would call it (a one-step
solve's message, the executor's output cap: ``RequestLimits.max_tokens`` or the worker's
``max_output_tokens`` where lower), and reports
``replayed N/M items`` with the recorded accuracy and the mean cost per item, or ``error`` with
how many items cannot be replayed and why (no recording of the item for this model, a text that
cannot be made to grade as recorded, a recorded cost above the call's worst case at the pool's
prices). It also says how many answers ``max_tokens`` cuts (they are charged at the cap and
graded as cut), and where a file records ``cost_usd`` with token counts, whether those costs
agree with the pool's prices (a median ratio outside ``PRICE_TOLERANCE``). Such a worker is
still ``ok``: the recorded cost is what a replayed call charges, but the pool's prices are what
the executor reserves and what the routers' fits assume, so a user should know they disagree.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rl_conductor.errors import ConfigError, UserError
from rl_conductor.tasks.base import Task
from rl_conductor.workers.base import CallContext, Worker, innermost
from rl_conductor.workflow import worker_message

CHECK_PROMPT = "Reply with the single word OK."
#: the subtask of the one-step solve a replay check words its messages with
CHECK_INSTRUCTION = "Solve it; give the final answer."
#: output tokens a check call may use (the executor's minimum call size, so the cost stays tiny)
CHECK_MAX_TOKENS = 64
DEFAULT_CHECK_TIMEOUT_S = 60.0
#: sampled as the executor samples by default (``RequestLimits.temperature``): greedy decoding of a small
#: model can repeat one blank token, which is not how the pool will be called
CHECK_TEMPERATURE = 0.2

CheckStatus = Literal["ok", "offline", "config", "error", "timeout", "empty"]
#: kinds that can only answer recorded tasks: their recordings are replayed instead of a call
NOT_CALLABLE_KINDS = frozenset({"replay"})
#: recorded costs within this factor of the pool's prices (median over items) are taken to agree
PRICE_TOLERANCE = 1.25
#: distinct replay failure messages kept in a report
ERRORS_KEPT = 3


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
    #: a replay worker's items: ``items`` (of the pool's dataset), ``replayed``, ``missing`` (no
    #: recording for this model), ``failed``, ``cut`` (at ``max_tokens``), ``recorded_accuracy``,
    #: ``price_ratio`` (median recorded cost over the pool's price of the recorded tokens), ``errors``
    replay: dict[str, Any] | None = None

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


async def replay_check(
    worker: Worker, tasks: Sequence[Task], *, max_tokens: int | None = None
) -> WorkerCheck:
    """Replay every item of ``tasks`` through the replay ``worker`` (beneath its cache) and report
    what a run would meet (see the module docstring); ``offline`` when there are no items."""
    from rl_conductor.limits import RequestLimits
    from rl_conductor.workers.base import WorkerError

    real = innermost(worker)
    info = worker.info
    base = WorkerCheck(name=info.name, kind=info.kind, hosting=info.hosting, url="-", status="ok")
    if not tasks:
        return replace(base, status="offline", detail="answers recorded tasks only; no items to replay")
    # the executor's cap: the request's max_tokens, at most the worker's own max_output_tokens
    cap = min(RequestLimits().max_tokens if max_tokens is None else max_tokens, info.max_output_tokens)
    source, model = getattr(real, "source", None), getattr(real, "model", info.name)
    replayed = missing = cut = labelled = right = 0
    tokens_in = tokens_out = 0
    cost = 0.0
    errors: dict[str, list[Any]] = {}  # reason (ids and amounts left out) -> [count, its first message]
    ratios: list[float] = []
    for task in tasks:
        rec = source.get(task.id, model) if source is not None else None
        if rec is None:
            missing += 1
            continue
        # every recorded cost against the pool's prices, replayable or not: a price far off is
        # what makes items unreplayable (a recorded cost above a call's worst case)
        if rec.cost_usd is not None and rec.input_tokens is not None and rec.output_tokens is not None:
            priced = info.cost(rec.input_tokens, rec.output_tokens)
            if priced > 0:
                ratios.append(rec.cost_usd / priced)
        # the message of a one-step solve, as the executor words it (its input bound sets the
        # call's worst case, which a recorded cost must not exceed)
        message = worker_message(task.question, [], CHECK_INSTRUCTION)
        try:
            comp = await real.complete(
                [{"role": "user", "content": message}],
                max_tokens=cap,
                temperature=CHECK_TEMPERATURE,
                context=CallContext(task=task),
            )
        except WorkerError as exc:
            example = (
                str(exc)
                .removeprefix(f"replay worker {model!r}: ")
                .removeprefix(f"replay worker {info.name!r}: ")
            )
            why = _reason(example)
            errors.setdefault(why, [0, example])[0] += 1
            continue
        replayed += 1
        tokens_in, tokens_out, cost = (
            tokens_in + comp.input_tokens,
            tokens_out + comp.output_tokens,
            cost + comp.cost_usd,
        )
        cut += real.answer_tokens(task) > cap  # the worker's own rule (ReplayWorker.call)
        if rec.correct is not None:
            labelled, right = labelled + 1, right + int(rec.correct)
    failed = sum(n for n, _ in errors.values())
    ratio = float(statistics.median(ratios)) if ratios else None
    kept = sorted(errors.items(), key=lambda kv: -kv[1][0])[:ERRORS_KEPT]
    replay = {
        "items": len(tasks),
        "replayed": replayed,
        "missing": missing,
        "failed": failed,
        "cut": cut,
        "max_tokens": cap,
        "recorded_accuracy": right / labelled if labelled else None,
        "price_ratio": ratio,
        "errors": {why: n for why, (n, _) in kept},
    }
    each = max(replayed, 1)
    used = replace(
        base,
        input_tokens=round(tokens_in / each),
        output_tokens=round(tokens_out / each),
        cost_usd=cost / each,
        replay=replay,
    )
    parts = [f"replayed {replayed}/{len(tasks)} items"]
    if labelled:
        over = "" if labelled == replayed else f" (over the {labelled} labelled)"
        parts.append(f"recorded accuracy {right / labelled:.1%}{over}")
    if missing:
        parts.append(f"{missing} without a recording of {model!r} (a run falls back to another worker there)")
    if cut:
        parts.append(f"{cut} longer than max_tokens {cap} (charged at the cap, graded as cut)")
    if ratio is not None and not 1 / PRICE_TOLERANCE <= ratio <= PRICE_TOLERANCE:
        parts.append(
            f"recorded cost_usd is {ratio:.3g}x the pool's prices for the recorded tokens (median of "
            f"{len(ratios)}): check price_in / price_out"
        )
    if failed:
        first = "; ".join(f"{why} ({n}x; the first: {example})" for why, (n, example) in kept)
        return replace(
            used,
            status="error",
            detail=f"{failed} of {len(tasks)} items cannot be replayed: {first}; " + ", ".join(parts),
        )
    if not replayed:
        return replace(
            used, status="error", detail=f"no item of the pool's dataset has a recording of {model!r}"
        )
    return replace(used, detail=", ".join(parts))


def _reason(message: str) -> str:
    """A replay failure's reason without the item and the amounts, so that one cause is counted
    once however many items it hits."""
    return re.sub(r"\$[0-9][0-9.e+-]*", "$…", re.sub(r"task '[^']*'", "the item", message))


async def check_worker(
    worker: Worker, *, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S, tasks: Sequence[Task] = ()
) -> WorkerCheck:
    """Call ``worker`` (beneath its cache) once with :data:`CHECK_PROMPT`; a replay worker replays
    ``tasks`` instead (:func:`replay_check`)."""
    real = innermost(worker)
    info = worker.info
    base = WorkerCheck(name=info.name, kind=info.kind, hosting=info.hosting, url=_url(real), status="ok")
    if info.kind in NOT_CALLABLE_KINDS:
        return await replay_check(worker, tasks)
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
    workers: Sequence[Worker],
    *,
    timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
    tasks: Sequence[Sequence[Task]] | None = None,
) -> list[WorkerCheck]:
    """Check several workers concurrently; results in the given order. ``tasks``: per worker, the
    items a replay worker replays (none: it is listed ``offline``)."""
    items = list(tasks) if tasks is not None else [()] * len(workers)
    return list(
        await asyncio.gather(
            *(check_worker(w, timeout_s=timeout_s, tasks=t) for w, t in zip(workers, items, strict=True))
        )
    )


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
    """Build each worker of a pool file on its own (no cache, one attempt) and call it once (a
    replay worker replays every item of its pool's dataset: :func:`replay_check`).

    A worker entry that cannot be built (an unset key variable, a bad field) is reported as
    ``config`` with the loader's message, and the others are still called. A pool file that
    cannot be read at all raises :class:`~rl_conductor.workers.pool.PoolConfigError`."""
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.workers.pool import build_pool, load_pool_config

    cfg = load_pool_config(name_or_path)
    options = {k: v for k, v in cfg.items() if k not in ("cache", "workers")}
    options["retries"] = 1  # the first answer's status is what the report is about
    checks: list[WorkerCheck | None] = []
    workers: list[Worker] = []
    items: list[Sequence[Task]] = []
    loaded: dict[str, list[Task]] = {}
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
        if built.workers[0].info.kind in NOT_CALLABLE_KINDS:
            # as in the whole pool: the first replay worker's recordings name the pool's dataset
            # (a later worker with a file of its own is asked that dataset's items, not its own)
            options.setdefault("default_dataset", built.default_dataset())
            dataset = str(options["default_dataset"])
            try:
                tasks = loaded[dataset] if dataset in loaded else load_tasks(dataset)
            except (ConfigError, ValueError, OSError) as exc:
                checks.append(_unbuilt(spec, ValueError(f"its dataset {dataset!r} cannot be loaded: {exc}")))
                continue
            loaded[dataset] = tasks
        else:
            tasks = []
        checks.append(None)
        workers.append(built.workers[0])
        items.append(tasks)
    called = iter(_run(check_workers(workers, timeout_s=timeout_s, tasks=items)))
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
