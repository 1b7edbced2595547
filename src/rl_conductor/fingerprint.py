"""Fingerprints of what makes two evaluations comparable, and of what a fitted router depends on.

Why: the promotion gate compares a challenger's accuracy with the champion's and with the
baselines of the same evaluation, and the kNN / domain routers cache what they measured on the
training split. Both are only sound when the measured world is the same: the same task ids, the
same pool *file contents* (prices, seeds, calibration settings), the same evaluation seed and
the same code for everything that turns a plan into a graded answer (simulated workers,
executor, graders, reward). A name such as ``paper-sim`` alone says none of that.

Why not in ``evaluation/``: the routers' caches (``policies/``), the evaluation and the pipeline's
gate all key on these, so the module sits below all of them.

Deliberate simplifications: the code version is a hash of the source files (and calibration
data) that produce outcomes, not a git commit (an installed package has none); editing any of
them, even a comment, yields a new id, which errs on the side of "re-evaluate". Files that
only present results (reports, CLI) are left out on purpose.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "OUTCOME_SOURCES",
    "code_version",
    "evaluation_id",
    "fingerprint",
    "loaded_pool_parts",
    "pool_fingerprint",
    "recordings_fingerprint",
]

#: Package-relative files and folders whose contents decide what a plan scores.
OUTCOME_SOURCES = (
    "workers",
    "executor.py",
    "workflow.py",
    "trace.py",
    "reward.py",
    "tasks/graders.py",
    "tasks/recordings_format.py",
    "tasks/sandbox.py",
    "data/calibration",
)


def fingerprint(parts: Iterable[str | bytes], length: int = 12) -> str:
    """A short SHA-256 hex digest of ``parts`` (separated, so ``["ab", "c"] != ["a", "bc"]``)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8") if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:length]


@functools.cache
def code_version() -> str:
    """``<package version>+<hash of OUTCOME_SOURCES>``, computed once per process."""
    from rl_conductor import __version__

    root = Path(str(resources.files("rl_conductor")))
    parts: list[str | bytes] = []
    for rel in OUTCOME_SOURCES:
        target = root / rel
        files = sorted(target.rglob("*")) if target.is_dir() else [target]
        for f in files:
            if (
                f.is_file()
                and f.suffix in (".py", ".json", ".yaml", ".csv", ".txt")
                and "__pycache__" not in f.parts
            ):
                parts += [f.relative_to(root).as_posix(), f.read_bytes()]
    return f"{__version__}+{fingerprint(parts, 10)}"


def recordings_fingerprint(options: dict[str, Any]) -> str:
    """A digest of the recordings file a replay pool's ``options`` name ("" for other pools): the
    caches of what a pool's workers answer (routers, cascade fits, training tables) key on it, so
    an edited file (a text changed, a label fixed) is measured again, not read from a stale cache."""
    path = options.get("recordings")
    if not path:
        return ""
    from rl_conductor.tasks.recordings_format import resolve_path

    p = resolve_path(str(path))
    if not p.is_file():
        return f"missing:{p}"
    stat = p.stat()
    return _file_digest(str(p), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def loaded_pool_parts(pool: Any) -> list[str]:
    """What a loaded pool's outcomes depend on besides the code: its options, its workers' facts
    (names, prices, hosting; a simulated worker's accuracy targets too: a pool file that degrades a
    worker in place keeps its name and prices) and a replay pool's recordings file's contents (not
    only its path). Part of the routers' cache key and of a training's ``recipe.json``."""
    from dataclasses import asdict

    facts = [asdict(w.info) | {"targets": getattr(w, "targets", None)} for w in pool.workers]
    return [
        json.dumps(pool.options, sort_keys=True, default=str),
        json.dumps(facts, sort_keys=True, default=str),
        recordings_fingerprint(pool.options),
    ]


def pool_fingerprint(pool: str, seed: int = 0) -> str:
    """Hash of the pool's parsed YAML (its contents, not its name) and the seed it is loaded with."""
    from rl_conductor.workers.pool import load_pool_config

    cfg: dict[str, Any] = load_pool_config(pool)
    return fingerprint([json.dumps(cfg, sort_keys=True, default=str), f"seed={seed}"])


def evaluation_id(task_ids: Iterable[str], pool: str, *, seed: int = 0) -> str:
    """``<pool>-n<count>-<hash>`` over the sorted task ids, the pool's contents, the evaluation
    seed and :func:`code_version`: equal ids mean the numbers were measured in the same world."""
    ids = sorted(task_ids)
    name = Path(pool).stem if pool.endswith((".yaml", ".yml")) else pool
    digest = fingerprint([pool_fingerprint(pool, seed), f"seed={seed}", code_version(), *ids])
    return f"{name}-n{len(ids)}-{digest}"
