"""The predictor's traffic log: every answered request, written to storage off the request path.

Why: a Conductor trained once keeps routing as it learnt while the pool and the questions move
on. The retraining loop (:mod:`rl_conductor.loop.retrain`) needs what was served — question,
workflow, the worker of every step, answer, tokens, cost, latency — to learn from it, and the
feedback route (:mod:`rl_conductor.loop.feedback`) needs to find a request by its id.

How it stays off the request path: :meth:`TrafficLog.submit` builds one small dict from the
response document the service already made and puts it on a bounded queue (no I/O, no JSON, no
lock held for longer than a dict insert); one daemon thread takes records off the queue and
writes them in batches, one JSON Lines object per batch, through :mod:`rl_conductor.storage`
(a local folder or ``s3://bucket/prefix``)::

    <store>/traffic/<YYYY-MM-DD>/<epoch ms>-<random>.jsonl

A batch is written when it holds ``batch_size`` records or ``flush_interval_s`` after its first
record, and on :meth:`TrafficLog.close` (the server's shutdown, also registered with
:mod:`atexit`). A full queue drops the record (counted in ``conductor_traffic_dropped_total``,
one warning per second at most) rather than slowing a request. A write that fails is retried
(tenacity, three tries) and then dropped, counted and logged.

Private requests: not recorded at all unless the operator names a private store
(``private_store``, a self-hosted folder or bucket that must differ from the public one); then
they are written there and only there. The in-memory index keeps the id of a private request
that was not recorded (no content), so feedback on it gets a clear refusal, not "unknown id".

Retention: on every write the log deletes batch files older than ``retention_days`` and, past
``max_store_bytes``, the oldest files until the store fits (each store on its own).

Deliberate simplifications: a batch file is the unit of retention (records are not rewritten);
the id index holds the last ``index_size`` requests in memory, and the location index the batch
file of the last :data:`LOCATION_INDEX_SIZE` ids written (those already in the stores are read
once, when the log starts, off the request path): an older id is found by reading one file, and
an id in neither is unknown without reading any (an unknown id read every batch file before, so
each such feedback cost a scan of the store). An id older than the location index is unknown.
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter
from tenacity import retry, stop_after_attempt, wait_exponential

from rl_conductor import storage, validation

log = logging.getLogger("rl_conductor.loop.traffic")

#: Folder of the batch files below a store.
TRAFFIC_DIR = "traffic"
#: Request ids whose batch file the log remembers (an id and a shared file name each).
LOCATION_INDEX_SIZE = 200_000
#: What a private request not recorded leaves in the id index (its id only, no content).
PRIVATE_NOT_RECORDED = "private-not-recorded"

RECORDED = Counter("conductor_traffic_records_total", "Requests written to the traffic log", ["store"])
DROPPED = Counter(
    "conductor_traffic_dropped_total",
    "Requests not written to the traffic log, by reason: queue_full, write_error",
    ["reason"],
)


@dataclass(frozen=True)
class TrafficConfig:
    """Where and how the traffic log writes (``conductor serve --traffic_*`` flags).

    Attributes:
        store: folder or ``s3://`` URI of public requests' records.
        private_store: folder or ``s3://`` URI for private requests (None: private requests are
            not recorded); must not be ``store``.
        batch_size: records per batch file.
        flush_interval_s: longest a record waits in memory before its batch is written.
        max_queue: records waiting to be written before new ones are dropped.
        retention_days: batch files older than this are deleted (None: kept).
        max_store_bytes: past this size of a store the oldest batch files are deleted (None: no cap).
        index_size: request ids kept in memory for feedback look-ups.
    """

    store: str
    private_store: str | None = None
    batch_size: int = 100
    flush_interval_s: float = 2.0
    max_queue: int = 10_000
    retention_days: float | None = 30.0
    max_store_bytes: int | None = None
    index_size: int = 100_000

    def __post_init__(self) -> None:
        if not str(self.store).strip():
            raise validation.InvalidValue("--traffic_store", self.store, "a folder or s3:// URI")
        for flag, uri in (("--traffic_store", self.store), ("--traffic_private_store", self.private_store)):
            if uri is not None and storage.is_s3(str(uri)):
                try:
                    storage.split_s3(str(uri))
                except ValueError:
                    raise validation.InvalidValue(flag, uri, "a folder or s3://BUCKET[/prefix] URI") from None
        if self.private_store is not None and _overlap(self.private_store, self.store):
            raise validation.InvalidValue(
                "--traffic_private_store",
                self.private_store,
                "a store other than --traffic_store, neither inside it nor containing it (a store's "
                "reads and retention cover every batch file below it: private records never mix with "
                "public ones)",
            )
        validation.integer_at_least("--traffic_batch_size", self.batch_size, 1)
        validation.positive_finite("--traffic_flush_interval_s", self.flush_interval_s)
        validation.integer_at_least("--traffic_max_queue", self.max_queue, 1)
        if self.retention_days is not None:
            validation.positive_finite("--traffic_retention_days", self.retention_days)
        if self.max_store_bytes is not None:
            validation.integer_at_least("--traffic_max_bytes", self.max_store_bytes, 1)
        validation.integer_at_least("--traffic_index_size", self.index_size, 1)


def _overlap(a: str, b: str) -> bool:
    """Whether one store is the other or lies below it: :func:`batch_files` lists every batch file
    below a store, so a private store inside the public one would be read (and swept) as public."""

    def parts(u: str) -> tuple[str, ...]:
        import os

        if storage.is_s3(u):
            return ("s3:", *(p for p in u[len("s3://") :].split("/") if p))
        return tuple(p for p in os.path.realpath(u).split(os.sep) if p)

    pa, pb = parts(str(a)), parts(str(b))
    short = min(len(pa), len(pb))
    return pa[:short] == pb[:short]


def traffic_record(
    request: Any, doc: Mapping[str, Any], *, endpoint: str, pool: str = "", model: str = ""
) -> dict[str, Any]:
    """The record of one answered request (``request``: a ``ConductorRequest``; ``doc``: the
    service's response document). Plain values only; serialised by the writer thread."""
    now = time.time()
    return {
        "request_id": doc["request_id"],
        "time": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds"),
        "ts": now,
        "endpoint": endpoint,
        "sensitivity": request.sensitivity,
        "pool": pool,
        "model": model,
        "question": request.question,
        "max_cost_usd": request.max_cost_usd,
        "max_latency_s": request.max_latency_s,
        "allowed_workers": request.allowed_workers,
        "workflow": doc.get("workflow", []),
        "steps": [
            {
                "index": s.get("index"),
                "worker": s.get("worker", ""),
                "status": s.get("status", ""),
                "input_tokens": s.get("input_tokens", 0),
                "output_tokens": s.get("output_tokens", 0),
                "cost_usd": s.get("cost_usd", 0.0),
                "latency_s": s.get("latency_s", 0.0),
                # the calls the step made, failed ones included: what the reward's "called" reads
                "attempts": len(s.get("attempts") or []),
            }
            for s in doc.get("steps", [])
        ],
        "answer": doc.get("answer", ""),
        "input_tokens": doc.get("input_tokens", 0),
        "output_tokens": doc.get("output_tokens", 0),
        "tokens": doc.get("tokens", 0),
        "cost_usd": doc.get("cost_usd", 0.0),
        "latency_s": doc.get("wall_s", 0.0),
        "budget_stop": bool(doc.get("budget_stop")),
        "deadline_cut": bool(doc.get("deadline_cut")),
        "fallback_plan": bool(doc.get("fallback_plan")),
    }


class _Flush:
    """A queue item asking the writer to write what it holds now, then set ``done``."""

    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()


class TrafficLog:
    """The traffic log of one predictor process (see module docstring)."""

    def __init__(self, config: TrafficConfig, *, pool: str = "", model: str = "") -> None:
        self.config = config
        self.pool = pool
        self.model = model
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=config.max_queue)
        self._index: OrderedDict[str, dict[str, Any] | str] = OrderedDict()
        self._index_lock = threading.Lock()
        self._where: OrderedDict[str, str] = OrderedDict()  # request id -> its batch file
        self._where_ready = threading.Event()
        self._last_drop_warning = 0.0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="traffic-log", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- the request path ---------------------------------------------------------------------

    def submit(self, request: Any, doc: Mapping[str, Any], endpoint: str) -> None:
        """Queue the record of one answered request (never blocks, never raises for a full queue)."""
        rid = str(doc["request_id"])
        private = request.sensitivity != "public"
        if private and self.config.private_store is None:
            self._remember(rid, PRIVATE_NOT_RECORDED)
            return
        record = traffic_record(request, doc, endpoint=endpoint, pool=self.pool, model=self.model)
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            DROPPED.labels("queue_full").inc()
            now = time.monotonic()
            if now - self._last_drop_warning > 1.0:
                self._last_drop_warning = now
                log.warning("traffic log: queue full (%d records), dropping", self.config.max_queue)
            return
        self._remember(rid, record)

    def _remember(self, rid: str, value: dict[str, Any] | str) -> None:
        with self._index_lock:
            self._index[rid] = value
            self._index.move_to_end(rid)
            while len(self._index) > self.config.index_size:
                self._index.popitem(last=False)

    # -- look-ups (feedback) --------------------------------------------------------------------

    def lookup(self, request_id: str) -> dict[str, Any] | str | None:
        """The record of ``request_id`` (from memory, else from the stores), the marker
        :data:`PRIVATE_NOT_RECORDED`, or None when this log never saw it."""
        with self._index_lock:
            found = self._index.get(request_id)
        if found is not None:
            return found
        self.flush()  # a record still queued is written, and located
        self._where_ready.wait(60)
        with self._index_lock:
            uri = self._where.get(request_id)
        if uri is None:
            return None
        try:
            text = storage.read_text(uri)
        except Exception:  # deleted by retention since
            return None
        return _record_in(text, request_id)

    def _locate(self, found: list[tuple[str, str]]) -> None:
        """Remember the batch file of each ``(request id, uri)``, the last ones most recent."""
        with self._index_lock:
            for rid, uri in found:
                self._where[rid] = uri
                self._where.move_to_end(rid)
            while len(self._where) > LOCATION_INDEX_SIZE:
                self._where.popitem(last=False)

    def _locate_stored(self) -> None:
        """The location index of the newest :data:`LOCATION_INDEX_SIZE` records already in the
        stores (written by an earlier process), read once when the log starts."""
        for store in self.stores():
            found: list[tuple[str, str]] = []
            try:
                for uri, _, _ in reversed(batch_files(store)):
                    if len(found) >= LOCATION_INDEX_SIZE:
                        break
                    rows = [json.loads(line) for line in storage.read_text(uri).splitlines() if line.strip()]
                    found += [(str(r["request_id"]), uri) for r in reversed(rows) if "request_id" in r]
            except Exception as exc:  # an unreadable store: its older records are not found
                log.warning("traffic log: could not index %s: %s", store, exc)
            self._locate(found[::-1])

    def stores(self) -> list[str]:
        """The public store, then the private one when configured."""
        return [self.config.store] + ([self.config.private_store] if self.config.private_store else [])

    def store_of(self, record: Mapping[str, Any]) -> str:
        """Where a record lives: private requests' in the private store, never the public one."""
        if record.get("sensitivity", "public") != "public":
            assert self.config.private_store is not None  # submit() never records them otherwise
            return self.config.private_store
        return self.config.store

    # -- writer thread --------------------------------------------------------------------------

    def flush(self, timeout_s: float = 30.0) -> None:
        """Write every record queued so far (blocks the caller, not the request path)."""
        if self._closed or not self._thread.is_alive():
            return
        marker = _Flush()
        self._queue.put(marker)
        marker.done.wait(timeout_s)

    def close(self) -> None:
        """Write what is queued and stop the writer thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout=60)

    def _run(self) -> None:
        try:
            self._locate_stored()
        finally:
            self._where_ready.set()
        pending: list[dict[str, Any]] = []
        first_at: float | None = None
        while True:
            wait = (
                None
                if first_at is None
                else max(0.0, first_at + self.config.flush_interval_s - time.monotonic())
            )
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = None
            if isinstance(item, dict):
                pending.append(item)
                first_at = first_at if first_at is not None else time.monotonic()
                if len(pending) < self.config.batch_size:
                    continue
            self._write(pending)
            pending, first_at = [], None
            if isinstance(item, _Flush):
                item.done.set()
            elif item is _STOP:
                return

    def _write(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        by_store: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            by_store.setdefault(self.store_of(r), []).append(r)
        for store, rows in by_store.items():
            uri = batch_uri(store)
            data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
            try:
                _write_retrying(uri, data)
            except Exception as exc:  # storage down: count and say so, the server keeps answering
                DROPPED.labels("write_error").inc(len(rows))
                log.error("traffic log: could not write %d records to %s: %s", len(rows), uri, exc)
                continue
            RECORDED.labels("private" if store == self.config.private_store else "public").inc(len(rows))
            self._locate([(str(r["request_id"]), uri) for r in rows])
            try:
                sweep(store, retention_days=self.config.retention_days, max_bytes=self.config.max_store_bytes)
            except Exception as exc:
                log.warning("traffic log: retention sweep of %s failed: %s", store, exc)


@retry(stop=stop_after_attempt(3), wait=wait_exponential(multiplier=0.2, max=2.0), reraise=True)
def _write_retrying(uri: str, data: bytes) -> None:
    storage.write_bytes(uri, data)


_last_ms = 0
_last_ms_lock = threading.Lock()


def _next_ms(t: float) -> int:
    """Epoch milliseconds of ``t``, strictly above the last name this process gave: two batches
    written in the same millisecond otherwise tie, and :func:`batch_files` (which orders by the
    name's milliseconds) read them back in the random order of their suffixes."""
    global _last_ms
    with _last_ms_lock:
        _last_ms = max(int(t * 1000), _last_ms + 1)
        return _last_ms


def batch_uri(store: str, now: float | None = None) -> str:
    """A new batch file's URI below ``store`` (day folder, then epoch milliseconds, increasing
    within a process)."""
    t = time.time() if now is None else now
    ms = _next_ms(t) if now is None else int(t * 1000)
    day = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")
    return storage.join(store, TRAFFIC_DIR, day, f"{ms:013d}-{uuid.uuid4().hex[:8]}.jsonl")


def _batch_ms(rel: str) -> int | None:
    name = rel.rsplit("/", 1)[-1]
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() and name.endswith(".jsonl") else None


def batch_files(store: str) -> list[tuple[str, int, int]]:
    """``(uri, epoch ms, bytes)`` of every batch file of ``store``, oldest first."""
    root = storage.join(store, TRAFFIC_DIR)
    rows = []
    for rel, size in storage.sizes(root).items():
        ms = _batch_ms(rel)
        if ms is not None:
            rows.append((storage.join(root, *rel.split("/")), ms, size))
    return sorted(rows, key=lambda r: r[1])


def sweep(
    store: str, *, retention_days: float | None, max_bytes: int | None, now: float | None = None
) -> int:
    """Delete ``store``'s batch files past the retention age, then the oldest past ``max_bytes``;
    returns how many were deleted."""
    files = batch_files(store)
    t = time.time() if now is None else now
    gone = 0
    keep = []
    for uri, ms, size in files:
        if retention_days is not None and ms / 1000 < t - retention_days * 86_400:
            storage.delete(uri)
            gone += 1
        else:
            keep.append((uri, ms, size))
    if max_bytes is not None:
        total = sum(size for *_, size in keep)
        for uri, _, size in keep[:-1]:  # the newest batch stays: it was just written
            if total <= max_bytes:
                break
            storage.delete(uri)
            total -= size
            gone += 1
    return gone


def read_traffic(
    store: str, *, since: float | None = None, until: float | None = None
) -> list[dict[str, Any]]:
    """The records of ``store`` with ``since <= ts < until`` (epoch seconds; None: open), oldest first."""
    return list(_iter_records(store, since, until))


def _iter_records(store: str, since: float | None, until: float | None) -> Iterator[dict[str, Any]]:
    for uri, ms, _ in batch_files(store):
        # a batch file is named by its write time: records in it are older, never newer
        if since is not None and ms / 1000 < since:
            continue
        for line in storage.read_text(uri).splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            ts = float(rec.get("ts", 0.0))
            if (since is None or ts >= since) and (until is None or ts < until):
                yield rec


def find_record(store: str, request_id: str) -> dict[str, Any] | None:
    """The record of ``request_id`` in ``store`` (newest batch first, every file), or None."""
    for uri, _, _ in reversed(batch_files(store)):
        record = _record_in(storage.read_text(uri), request_id)
        if record is not None:
            return record
    return None


def _record_in(text: str, request_id: str) -> dict[str, Any] | None:
    """The record of ``request_id`` in one batch file's text, or None."""
    if request_id not in text:
        return None
    for line in text.splitlines():
        if line.strip():
            rec = json.loads(line)
            if rec.get("request_id") == request_id:
                return dict(rec)
    return None


__all__ = [
    "PRIVATE_NOT_RECORDED",
    "TrafficConfig",
    "TrafficLog",
    "batch_files",
    "batch_uri",
    "find_record",
    "read_traffic",
    "sweep",
    "traffic_record",
]
