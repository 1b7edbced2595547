"""What changed in the worker pool since the champion was trained: the loop's pool-change trigger.

Why: a new, removed or re-priced worker changes what the best workflow is (a worker that got 4x
dearer should see fewer questions), so it is an event that retrains the Conductor, not a detail.

A pool *snapshot* is, per worker, the facts that change a workflow's reward or feasibility:
kind, model, prices, hosting and, for a simulated worker, its declared per-domain ``accuracy``
(how a simulated pool models an endpoint that degraded; a live worker has none). The champion's
snapshot is the ``loop.pool_snapshot`` tag of its registry version (the loop sets it when it
registers a version), else the snapshot of the pool
its ``conductor.json`` names, loaded now (exact when the pool changed by a new file, as a
rollout of a new pool file usually does; an in-place edit of the champion's own pool file is seen
once the loop has tagged a snapshot).
"""

from __future__ import annotations

import json
from typing import Any

#: The registry version tag that holds the snapshot of the pool a version was evaluated on.
SNAPSHOT_TAG = "loop.pool_snapshot"
_FIELDS = ("kind", "model", "price_in", "price_out", "hosting", "accuracy")


def snapshot(pool: str) -> dict[str, dict[str, Any]]:
    """Per worker of the pool file ``pool`` (name or path): kind, model, prices, hosting, accuracy."""
    from rl_conductor.workers.pool import load_pool_config

    cfg = load_pool_config(pool)
    return {str(w["name"]): {k: w.get(k) for k in _FIELDS} for w in cfg["workers"]}


def changes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> list[str]:
    """One sentence per change from ``before`` to ``after`` (empty: the same pool)."""
    out = [f"new worker {n}" for n in sorted(set(after) - set(before))]
    out += [f"removed worker {n}" for n in sorted(set(before) - set(after))]
    for name in sorted(set(before) & set(after)):
        a, b = before[name], after[name]
        for key in _FIELDS:
            if a.get(key) != b.get(key):
                word = "re-priced" if key.startswith("price") else "changed"
                out.append(f"{word} worker {name}: {key} {a.get(key)!r} -> {b.get(key)!r}")
    return out


def champion_snapshot(model_name: str, version: int, champion_dir: str) -> dict[str, dict[str, Any]] | None:
    """The pool snapshot the champion was evaluated on (see module docstring); None if unknown."""
    from rl_conductor.policies.conductor import read_conductor_meta
    from rl_conductor.tracking import mlflow_utils

    client = mlflow_utils.client()
    tags = client.get_model_version(model_name, str(version)).tags
    if SNAPSHOT_TAG in tags:
        return dict(json.loads(tags[SNAPSHOT_TAG]))
    pool = read_conductor_meta(champion_dir).get("pool")
    if not pool:
        return None
    try:
        return snapshot(str(pool))
    except Exception:  # the pool it names is gone from this machine: unknown, not "unchanged"
        return None


__all__ = ["SNAPSHOT_TAG", "champion_snapshot", "changes", "snapshot"]
