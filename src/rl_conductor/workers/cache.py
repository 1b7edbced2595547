"""Response cache for live workers: pay for a completion once, re-use it in every later run.

:class:`CachedWorker` wraps any worker. A call's key is a SHA-256 of the worker's name and model,
the messages, ``max_tokens``, ``temperature`` and the call's ``nonce`` (so self-consistency's n
samples stay n different entries). A hit returns the stored completion marked ``cached=True``
with its recorded tokens and cost (so rewards and reports price the plan as it was paid) and
makes no HTTP call and no spend; a miss calls the worker and stores the answer. Failed calls
are not stored.

Each entry also keeps what :mod:`rl_conductor.workers.cache_export` needs to turn the cache into a
bring-your-own recordings file (``conductor record export``): the task (id, question, gold,
grader, domain), the step index, the messages.

Stores (pool option ``cache``)::

    cache: true                                  # sqlite at .conductor/cache/completions.sqlite
    cache: path/to/completions.sqlite            # sqlite at that path
    cache: s3://bucket/prefix                    # one JSON object per entry, via rl_conductor.storage
    cache: {backend: sqlite, path: …}            # the long form (backend: sqlite | s3, uri: …)

Private requests (``CallContext.sensitivity == "private"``) never enter the ``cache`` store, nor
are answered from it: a shared store would keep their text where every later request (and
``record export``) reads it, and a hit would tell a public request, by its speed, that someone
asked the same privately. By default a private call is not cached at all. A pool may give
private calls a store of their own (``cache_private``, same forms as ``cache``; default off),
which must not be the ``cache`` store; its entries are marked ``sensitivity: private`` and only
private calls read it (so only private requests can learn from its timing), and ``record
export`` never exports them. Every entry records its origin: ``serving`` for a request's
question (task source ``request``), ``run`` for a training or evaluation item.

Simplifications: two identical calls in flight at once both miss (and both are paid); the S3
store reads every object to list rows, which is fine for exports, not for millions of entries.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rl_conductor.workers.base import (
    STREAM_SINK,
    CallContext,
    Completion,
    Message,
    Worker,
    WorkerCall,
    WorkerInfo,
    WorkerWrapper,
)

DEFAULT_SQLITE = ".conductor/cache/completions.sqlite"


def cache_key(
    worker: str, model: str, messages: Sequence[Message], *, max_tokens: int, temperature: float, nonce: int
) -> str:
    """The cache key of one call (see the module docstring)."""
    payload = {
        "worker": worker,
        "model": model,
        "messages": [{"role": m.get("role", ""), "content": m.get("content", "")} for m in messages],
        "max_tokens": int(max_tokens),
        "temperature": round(float(temperature), 6),
        "nonce": int(nonce),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class CacheStore(Protocol):
    """Where cache entries live."""

    hits: int
    misses: int

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, row: dict[str, Any]) -> None: ...

    def rows(self) -> Iterator[dict[str, Any]]: ...


@dataclass
class SqliteCacheStore:
    """Entries in one sqlite table (``key`` primary key, the entry as JSON)."""

    path: Path
    hits: int = 0
    misses: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _conn: sqlite3.Connection | None = field(default=None, repr=False)

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS completions (key TEXT PRIMARY KEY, worker TEXT NOT NULL, "
                "task_id TEXT, created REAL NOT NULL, entry TEXT NOT NULL)"
            )
            conn.commit()
            self._conn = conn
        return self._conn

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db().execute("SELECT entry FROM completions WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        entry: dict[str, Any] = json.loads(row[0])
        return entry

    def put(self, key: str, row: dict[str, Any]) -> None:
        with self._lock:
            db = self._db()
            db.execute(
                "INSERT OR REPLACE INTO completions (key, worker, task_id, created, entry) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, row["worker"], row.get("task_id"), row["created"], json.dumps(row, ensure_ascii=False)),
            )
            db.commit()

    def rows(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            found = self._db().execute("SELECT entry FROM completions ORDER BY created, key").fetchall()
        for (entry,) in found:
            yield json.loads(entry)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


@dataclass
class S3CacheStore:
    """Entries as JSON objects under an ``s3://`` prefix (through :mod:`rl_conductor.storage`)."""

    uri: str
    hits: int = 0
    misses: int = 0

    def _object(self, key: str) -> str:
        from rl_conductor import storage

        return storage.join(self.uri, key[:2], f"{key}.json")

    def get(self, key: str) -> dict[str, Any] | None:
        from rl_conductor import storage

        try:
            entry: dict[str, Any] = storage.read_json(self._object(key))
        except storage.NotFoundError:
            return None
        return entry

    def put(self, key: str, row: dict[str, Any]) -> None:
        from rl_conductor import storage

        storage.write_json(self._object(key), row, indent=None)

    def rows(self) -> Iterator[dict[str, Any]]:
        from rl_conductor import storage

        entries = [
            storage.read_json(storage.join(self.uri, rel))
            for rel in storage.list_files(self.uri)
            if rel.endswith(".json")
        ]
        yield from sorted(entries, key=lambda e: (e.get("created", 0.0), e.get("key", "")))


def open_store(cfg: Any) -> CacheStore:
    """A store from a ``cache`` setting (see the module docstring)."""
    if cfg is True:
        return SqliteCacheStore(Path(DEFAULT_SQLITE))
    if isinstance(cfg, str | Path):
        text = str(cfg)
        return S3CacheStore(text) if text.startswith("s3://") else SqliteCacheStore(Path(text))
    if isinstance(cfg, dict):
        backend = cfg.get("backend", "sqlite")
        where = cfg.get("uri", cfg.get("path"))
        if backend == "sqlite":
            return SqliteCacheStore(Path(str(where or DEFAULT_SQLITE)))
        if backend == "s3":
            if not isinstance(where, str) or not where.startswith("s3://"):
                raise ValueError("cache backend s3 needs `uri: s3://bucket/prefix`")
            return S3CacheStore(where)
        raise ValueError(f"unknown cache backend {backend!r}; use sqlite or s3")
    raise ValueError(f"cache must be true, a path, an s3:// URI or a mapping, not {cfg!r}")


class SharedState:
    """What a pool's live workers share (cache stores, the spend guard), kept in the pool options
    under :data:`SHARED_KEY`. Its text form is constant, so code that fingerprints pool options
    (``json.dumps(options, default=str)``) sees the same pool before and after calls."""

    def __init__(self) -> None:
        self.stores: dict[str, CacheStore] = {}
        self.spend_guard: Any = None

    def __repr__(self) -> str:
        return "<shared live-worker state>"


SHARED_KEY = "_live_shared"


def shared_state(options: dict[str, Any]) -> SharedState:
    """The :class:`SharedState` of a pool's options (made on first use)."""
    state = options.get(SHARED_KEY)
    if not isinstance(state, SharedState):
        state = options[SHARED_KEY] = SharedState()
    return state


def store_for(cfg: Any, options: dict[str, Any], *, option: str = "cache") -> CacheStore:
    """The pool's shared store for ``cfg`` (one per distinct setting)."""
    from rl_conductor.workers.kinds import PoolConfigError

    stores = shared_state(options).stores
    key = json.dumps(cfg, sort_keys=True, default=str)
    if key not in stores:
        try:
            stores[key] = open_store(cfg)
        except ValueError as exc:
            raise PoolConfigError(f"{option}: {exc}") from None
    return stores[key]


def _where(cfg: Any) -> str:
    """Where a ``cache`` setting stores its entries (to tell two settings naming one store)."""
    if cfg is True:
        return str(Path(DEFAULT_SQLITE).resolve())
    if isinstance(cfg, dict):
        cfg = cfg.get("uri", cfg.get("path")) or DEFAULT_SQLITE
    text = str(cfg)
    return text.rstrip("/") if text.startswith("s3://") else str(Path(text).expanduser().resolve())


def private_store_for(cfg: Any, shared: Any, options: dict[str, Any]) -> CacheStore | None:
    """The pool's store for private calls (pool option ``cache_private``), None when off; a
    setting naming the shared ``cache`` store (or a place inside it) is refused."""
    from rl_conductor.workers.kinds import PoolConfigError

    if not cfg:
        return None
    if shared:
        mine, theirs = _where(cfg), _where(shared)
        if mine == theirs or mine.startswith(theirs.rstrip("/") + "/") or theirs.startswith(mine + "/"):
            raise PoolConfigError(
                f"cache_private: {mine} is the shared cache's store; private entries need their own"
            )
    return store_for(cfg, options, option="cache_private")


@dataclass
class CachedWorker(WorkerWrapper):
    """A worker whose completions are cached in ``store`` (see the module docstring)."""

    inner: Worker
    store: CacheStore | None
    #: where private calls are cached (None: they are not cached at all)
    private_store: CacheStore | None = None
    hits: int = 0
    misses: int = 0

    async def call(self, call: WorkerCall) -> Completion:
        info = self.inner.info
        messages, max_tokens, temperature, context = (
            call.messages,
            call.max_tokens,
            call.temperature,
            call.context,
        )
        private = context is not None and context.sensitivity == "private"
        store = self.private_store if private else self.store
        if store is None:  # a private call without a private store: never cached, never looked up
            return await self.forward(call)
        model = str(getattr(self.inner, "model", info.name))
        key = cache_key(
            info.name,
            model,
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            nonce=context.nonce if context is not None else 0,
        )
        row = store.get(key)
        if row is not None and (row.get("sensitivity", "public") == "private") == private:
            self.hits += 1
            store.hits += 1
            return Completion(
                text=row["text"],
                input_tokens=int(row["input_tokens"]),
                output_tokens=int(row["output_tokens"]),
                cost_usd=float(row["cost_usd"]),
                latency_s=float(row["latency_s"]),
                worker=info.name,
                cached=True,
                finish_reason=str(row.get("finish_reason", "")),
                tokens_estimated=bool(row.get("tokens_estimated", False)),
                synthesised=bool(row.get("synthesised", False)),
            )
        self.misses += 1
        store.misses += 1
        comp = await self.forward(call)
        sink = STREAM_SINK.get()
        if sink is not None and (sink.closed or not comp.finish_reason):
            return comp  # a stream that did not end whole (no end marker) is never a stored answer
        store.put(key, _entry(key, info, model, messages, max_tokens, temperature, context, comp))
        return comp


def _entry(
    key: str,
    info: WorkerInfo,
    model: str,
    messages: Sequence[Message],
    max_tokens: int,
    temperature: float,
    context: CallContext | None,
    comp: Completion,
) -> dict[str, Any]:
    return {
        "key": key,
        "worker": info.name,
        "model": model,
        "worker_info": {
            "price_in": info.price_in,
            "price_out": info.price_out,
            "hosting": info.hosting,
            "description": info.description,
        },
        "created": time.time(),
        "sensitivity": "private" if context is not None and context.sensitivity == "private" else "public",
        "origin": "serving" if context is not None and context.task.source == "request" else "run",
        "messages": [dict(m) for m in messages],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "task_id": context.task.id if context is not None else None,
        "task": context.task.to_dict() if context is not None else None,
        "step_index": context.step_index if context is not None else None,
        "visible_answers": len(context.visible_answers) if context is not None else None,
        "nonce": context.nonce if context is not None else 0,
        "text": comp.text,
        "input_tokens": comp.input_tokens,
        "output_tokens": comp.output_tokens,
        "cost_usd": comp.cost_usd,
        "latency_s": comp.latency_s,
        "finish_reason": comp.finish_reason,
        "tokens_estimated": comp.tokens_estimated,
        "synthesised": comp.synthesised,
    }
