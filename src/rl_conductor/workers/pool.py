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

Builders for each ``kind`` register themselves with :func:`register_kind`; the built-in pools live
in ``rl_conductor/configs/pools`` and are found by name (``load_pool("paper-sim")``).

The Conductor sees a :class:`PoolView`: an ordered subset of the pool whose ordinal ids
(``Model 0 … Model k-1``) are what workflows refer to. Randomised pools are views over random subsets.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rl_conductor.errors import ConfigError, UnknownWorker, yaml_problem
from rl_conductor.workers.base import Worker, WorkerInfo

WorkerBuilder = Callable[[dict[str, Any], dict[str, Any]], Worker]
_BUILDERS: dict[str, WorkerBuilder] = {}
_BUILTIN_MODULES = {
    "simulated": "rl_conductor.workers.simulated",
    "replay": "rl_conductor.workers.replay",
    "fake": "rl_conductor.workers.fake",
    "openai": "rl_conductor.workers.live.openai_chat",
    "anthropic": "rl_conductor.workers.live.anthropic_messages",
    "gemini": "rl_conductor.workers.live.gemini",
}


class PoolConfigError(ConfigError):
    """A pool name that does not exist or a malformed pool file; the message names the field."""


def register_kind(kind: str) -> Callable[[WorkerBuilder], WorkerBuilder]:
    """Decorator: register ``builder(worker_spec, pool_options) -> Worker`` for a worker kind."""

    def deco(fn: WorkerBuilder) -> WorkerBuilder:
        _BUILDERS[kind] = fn
        return fn

    return deco


def info_from_spec(spec: dict[str, Any]) -> WorkerInfo:
    """Build the static :class:`WorkerInfo` from a worker entry of a pool file."""
    try:
        hosting = spec.get("hosting", "external")
        if hosting not in ("self", "external"):
            raise PoolConfigError(f"worker {spec.get('name')!r}: hosting must be 'self' or 'external'")
        return WorkerInfo(
            name=str(spec["name"]),
            price_in=float(spec.get("price_in", 0.0)),
            price_out=float(spec.get("price_out", 0.0)),
            hosting=hosting,
            description=str(spec.get("description", "")),
            kind=str(spec.get("kind", "")),
            max_output_tokens=int(spec.get("max_output_tokens", 4096)),
            typical_output_tokens=int(spec.get("typical_output_tokens", 512)),
            extra={k: v for k, v in spec.items() if k not in _INFO_KEYS},
            # a pool file may state a worker's latency model (live workers: measured by hand)
            **{k: float(spec[k]) for k in _LATENCY_KEYS if spec.get(k) is not None},
        )
    except KeyError as exc:
        raise PoolConfigError(f"worker entry is missing {exc.args[0]!r}: {spec}") from None


_LATENCY_KEYS = ("ttft_s", "tokens_per_s", "prefill_tokens_per_s", "output_tokens_spread")
_INFO_KEYS = {
    "name",
    "price_in",
    "price_out",
    "hosting",
    "description",
    "kind",
    "max_output_tokens",
    "typical_output_tokens",
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
        if kind not in _BUILDERS and kind in _BUILTIN_MODULES:
            importlib.import_module(_BUILTIN_MODULES[kind])
        if kind not in _BUILDERS:
            raise PoolConfigError(
                f"worker {spec['name']!r}: unknown kind {kind!r}; known: {sorted(_BUILDERS)}"
            )
        if spec["name"] in names:
            raise PoolConfigError(f"duplicate worker name {spec['name']!r}")
        names.add(spec["name"])
        workers.append(_BUILDERS[kind](dict(spec), options))
    pool = Pool(name=str(cfg.get("name", "pool")), workers=workers, options=options)
    for worker in workers:  # state a kind shares among its workers of one pool, not the process
        join = getattr(worker, "join_pool", None)
        if callable(join):
            join(pool)
    return pool


def load_pool(name_or_path: str | Path, **overrides: Any) -> Pool:
    """Load a built-in pool by name or a pool YAML by path."""
    return build_pool(load_pool_config(name_or_path), **overrides)
