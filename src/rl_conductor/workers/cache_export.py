"""``conductor record export``: the response cache as a bring-your-own recordings file.

A team that trained once against paid APIs (every completion cached by
:class:`~rl_conductor.workers.cache.CachedWorker`) exports the cache into the recordings format
(:mod:`rl_conductor.tasks.recordings_format`) and retrains offline on a replay pool over it.

Which cached call becomes a worker's recorded response to an item: a replay worker answers an
item the same way whatever a workflow shows it, so one response per (item, worker) is kept —
the one closest to answering the bare question: the lowest step index, then the fewest earlier
answers visible, then the lowest nonce, then the earliest. Its text, tokens, cost and latency
are kept as recorded; ``correct`` is the project's grade of that text against the item's gold
(absent when the item has no gold answer).

What is left out: entries made without a task (free-text calls: no item to belong to), entries
whose text was made from a recorded label (``Completion.synthesised``: no model wrote it); entries
of serving traffic (a request's question, task source ``request``, or ``origin: serving``)
unless ``include_serving`` is set, since those are users' questions rather than benchmark items;
and private entries (``sensitivity: private``), always: a private request's text never leaves the
store it was kept in. Serving entries with no ``sensitivity`` at all were written before private
requests were kept out of the shared cache, so any of them may be private: they are never
exported either (counted with the private ones). The counts say how many of each were left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.recordings_format import RecordedResponse, item_dict, write_recordings
from rl_conductor.workers.cache import CacheStore


def _rank(entry: dict[str, Any]) -> tuple[int, int, int, float]:
    return (
        int(entry.get("step_index") or 0),
        int(entry.get("visible_answers") or 0),
        int(entry.get("nonce") or 0),
        float(entry.get("created") or 0.0),
    )


def is_serving(entry: dict[str, Any]) -> bool:
    """Whether a cache entry came from serving traffic (a request's question)."""
    task = entry.get("task") or {}
    return entry.get("origin") == "serving" or (isinstance(task, dict) and task.get("source") == "request")


def export_cache(
    store: CacheStore,
    out: str | Path,
    *,
    workers: Iterable[str] | None = None,
    include_serving: bool = False,
) -> dict[str, Any]:
    """Write the cache's completions as a recordings file at ``out``; returns counts (what was
    left out too) and, per worker, the facts a replay pool needs (prices, hosting, description)."""
    from rl_conductor.tasks.graders import grade

    keep = set(workers) if workers else None
    picked: dict[tuple[str, str], dict[str, Any]] = {}
    tasks: dict[str, Task] = {}
    entries = private = serving = 0
    for entry in store.rows():
        entries += 1
        marked = entry.get("sensitivity")
        if marked not in (None, "public") or (marked is None and is_serving(entry)):
            private += 1  # private, or a request's question from before entries were marked
            continue
        if is_serving(entry) and not include_serving:
            serving += 1
            continue
        if not entry.get("task") or (keep is not None and entry["worker"] not in keep):
            continue
        if entry.get("synthesised"):  # made from a recorded label, not a model's text: no recording
            continue
        task = Task.from_dict(entry["task"])
        tasks.setdefault(task.id, task)
        slot = (task.id, entry["worker"])
        if slot not in picked or _rank(entry) < _rank(picked[slot]):
            picked[slot] = entry
    facts: dict[str, dict[str, Any]] = {}
    items = []
    responses = 0
    for task_id, task in tasks.items():
        per_model: dict[str, RecordedResponse] = {}
        for (tid, worker), e in picked.items():
            if tid != task_id:
                continue
            per_model[worker] = RecordedResponse(
                text=e["text"],
                correct=grade(task, e["text"]) if task.answer else None,
                input_tokens=int(e["input_tokens"]),
                output_tokens=int(e["output_tokens"]),
                cost_usd=float(e["cost_usd"]),
                latency_s=float(e["latency_s"]),
            )
            facts.setdefault(worker, dict(e.get("worker_info") or {}))
        if per_model:
            items.append(item_dict(task, per_model))
            responses += len(per_model)
    write_recordings(out, items)
    return {
        "entries": entries,
        "private_skipped": private,
        "serving_skipped": serving,
        "items": len(items),
        "responses": responses,
        "models": sorted(facts),
        "model_facts": facts,
    }


def replay_pool_yaml(
    recordings: str | Path, facts: dict[str, dict[str, Any]], *, name: str | None = None
) -> str:
    """A replay pool YAML over a recordings file, one worker per recorded model."""
    path = Path(recordings).expanduser().resolve()
    workers = [
        {
            "name": model,
            "kind": "replay",
            "model": model,
            "price_in": float(f.get("price_in", 0.0)),
            "price_out": float(f.get("price_out", 0.0)),
            "hosting": f.get("hosting", "external"),
            "description": f.get("description", "") or f"recorded answers of {model}",
        }
        for model, f in sorted(facts.items())
    ]
    cfg = {"name": name or path.name.split(".")[0], "recordings": str(path), "workers": workers}
    header = f"# Replay pool over the recordings in {path} (written by `conductor record export`).\n"
    return header + yaml.safe_dump(cfg, sort_keys=False)
