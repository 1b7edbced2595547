"""Worker kinds: the registry a kind's module registers its builder with, and what a pool
file's worker entry says about a worker (:func:`info_from_spec`).

Why a module of its own, below the kinds: each kind's module (``simulated``, ``replay``,
``fake``, the live API clients) registers here, and :mod:`rl_conductor.workers.pool`, above
them, imports a kind's module the first time a pool file names it (a live kind pulls in its
provider's SDK); the registry never refers to the modules built on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl_conductor.errors import ConfigError
from rl_conductor.workers.base import Worker, WorkerInfo

WorkerBuilder = Callable[[dict[str, Any], dict[str, Any]], Worker]
_BUILDERS: dict[str, WorkerBuilder] = {}


def builder_of(kind: str) -> WorkerBuilder | None:
    """The builder registered for ``kind``, None before its module registered one."""
    return _BUILDERS.get(kind)


def registered_kinds() -> list[str]:
    """The kinds registered so far, sorted."""
    return sorted(_BUILDERS)


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
    stray = sorted(k for k in spec if "price" in str(k).lower() and k not in ("price_in", "price_out"))
    if stray:  # a misspelt price had been read as a price of 0 (free), without a word
        raise PoolConfigError(
            f"worker {spec.get('name')!r}: unknown price field(s) {stray}; a worker's prices are "
            "price_in and price_out (USD per 1M tokens)"
        )
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
