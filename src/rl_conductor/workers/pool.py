"""Worker pools: one YAML format shared by training, evaluation and serving.

A pool file lists workers with their kind, model, prices, hosting and description::

    name: paper-sim
    seed: 0                      # pool-level options are passed to every worker builder
    default_dataset: paper-mix   # what the pool is trained and evaluated on (Pool.default_dataset)
    workers:
      - name: gpt-5
        kind: simulated          # simulated | replay | fake | openai | anthropic | gemini
        price_in: 1.25           # USD per 1M tokens
        price_out: 10.0
        hosting: external        # self = inside the cluster, external = third-party API
        description: strongest coder, strong at math

Builders for each ``kind`` register themselves with
:func:`rl_conductor.workers.kinds.register_kind` (re-exported here); this module imports a
built-in kind's module the first time a pool names it. The built-in pools live in
``rl_conductor/configs/pools`` and are found by name (``load_pool("paper-sim")``).

The Conductor sees a :class:`PoolView`: an ordered subset of the pool whose ordinal ids
(``Model 0 … Model k-1``) are what workflows refer to. Randomised pools are views over random subsets.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rl_conductor.errors import UnknownWorker, yaml_problem
from rl_conductor.workers.base import Worker, WorkerInfo
from rl_conductor.workers.kinds import (
    PoolConfigError,
    builder_of,
    registered_kinds,
)

# re-exported: where a plug-in kind written before workers.kinds existed imports them from
from rl_conductor.workers.kinds import WorkerBuilder as WorkerBuilder
from rl_conductor.workers.kinds import info_from_spec as info_from_spec
from rl_conductor.workers.kinds import register_kind as register_kind

#: The module that registers each built-in kind, imported the first time a pool names it.
BUILTIN_KIND_MODULES = {
    "simulated": "rl_conductor.workers.simulated",
    "replay": "rl_conductor.workers.replay",
    "fake": "rl_conductor.workers.fake",
    "openai": "rl_conductor.workers.live.openai_chat",
    "anthropic": "rl_conductor.workers.live.anthropic_messages",
    "gemini": "rl_conductor.workers.live.gemini",
}


#: The dataset of a pool whose file names no ``default_dataset``.
DEFAULT_DATASET = "paper-mix"


@dataclass
class Pool:
    """A named, ordered set of workers."""

    name: str
    workers: list[Worker]
    options: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.workers)

    def names(self) -> list[str]:
        return [w.info.name for w in self.workers]

    def index(self, name: str) -> int:
        for i, w in enumerate(self.workers):
            if w.info.name == name:
                return i
        raise UnknownWorker(f"pool {self.name!r} has no worker {name!r}; it has {self.names()}")

    def get(self, name: str) -> Worker:
        return self.workers[self.index(name)]

    def default_dataset(self, fallback: str = DEFAULT_DATASET) -> str:
        """The dataset the pool is trained and evaluated on when none is named: its
        ``default_dataset`` option, else ``fallback`` (:data:`DEFAULT_DATASET`, the paper's mix
        the simulated pool is calibrated on; ``""`` asks whether the pool names one at all)."""
        stated = self.options.get("default_dataset")
        return fallback if stated is None else str(stated)

    def view(self, indices: Sequence[int] | None = None) -> PoolView:
        """The pool as the Conductor sees it: ordinal ids over ``indices`` (all, in order, by default)."""
        idx = tuple(range(len(self.workers))) if indices is None else tuple(indices)
        for i in idx:
            if not 0 <= i < len(self.workers):
                raise IndexError(f"pool {self.name!r} has no worker #{i}")
        return PoolView(pool=self, indices=idx)

    def random_view(self, rng: random.Random, *, min_size: int = 2, max_size: int | None = None) -> PoolView:
        """A random subset in random order (randomised-pool training)."""
        hi = len(self.workers) if max_size is None else min(max_size, len(self.workers))
        lo = min(max(1, min_size), hi)
        k = rng.randint(lo, hi)
        idx = rng.sample(range(len(self.workers)), k)
        return self.view(idx)


@dataclass(frozen=True)
class PoolView:
    """An ordered subset of a pool; workflow worker ids index into it."""

    pool: Pool
    indices: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.indices)

    def worker(self, ordinal: int) -> Worker:
        return self.pool.workers[self.indices[ordinal]]

    def infos(self) -> list[WorkerInfo]:
        return [self.worker(i).info for i in range(len(self))]

    def names(self) -> list[str]:
        return [i.name for i in self.infos()]


def builtin_pool_dir() -> Path:
    return Path(str(resources.files("rl_conductor").joinpath("configs", "pools")))


def available_pools() -> list[str]:
    return sorted(p.stem for p in builtin_pool_dir().glob("*.yaml"))


def _resolve(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if p.is_file():
            return p
        raise PoolConfigError(f"no pool file at {str(p)!r}; built-in pools: {available_pools()}")
    candidate = builtin_pool_dir() / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    raise PoolConfigError(f"no pool named {str(name_or_path)!r}; built-in pools: {available_pools()}")


def load_pool_config(name_or_path: str | Path) -> dict[str, Any]:
    path = _resolve(name_or_path)
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PoolConfigError(f"pool file {str(path)!r} is not valid YAML: {yaml_problem(exc)}") from exc
    if not isinstance(cfg, dict) or not isinstance(cfg.get("workers"), list) or not cfg["workers"]:
        raise PoolConfigError(f"pool {name_or_path!r}: expected a mapping with a non-empty `workers` list")
    return cfg


def build_pool(cfg: dict[str, Any], **overrides: Any) -> Pool:
    """Build a pool from a parsed config; ``overrides`` update pool-level options (e.g. ``seed``)."""
    import importlib

    options = {k: v for k, v in cfg.items() if k not in ("name", "workers")}
    options.update(overrides)
    workers: list[Worker] = []
    names: set[str] = set()
    for spec in cfg["workers"]:
        if not isinstance(spec, dict) or "name" not in spec or "kind" not in spec:
            raise PoolConfigError(f"each worker needs `name` and `kind`: {spec!r}")
        kind = spec["kind"]
        if builder_of(kind) is None and kind in BUILTIN_KIND_MODULES:
            importlib.import_module(BUILTIN_KIND_MODULES[kind])
        build = builder_of(kind)
        if build is None:
            raise PoolConfigError(
                f"worker {spec['name']!r}: unknown kind {kind!r}; known: {registered_kinds()}"
            )
        if spec["name"] in names:
            raise PoolConfigError(f"duplicate worker name {spec['name']!r}")
        names.add(spec["name"])
        workers.append(build(dict(spec), options))
    pool = Pool(name=str(cfg.get("name", "pool")), workers=workers, options=options)
    for worker in workers:  # state a kind shares among its workers of one pool, not the process
        join = getattr(worker, "join_pool", None)
        if callable(join):
            join(pool)
    return pool


def load_pool(name_or_path: str | Path, **overrides: Any) -> Pool:
    """Load a built-in pool by name or a pool YAML by path."""
    return build_pool(load_pool_config(name_or_path), **overrides)
