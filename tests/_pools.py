"""Fake pools the tests share: :func:`rising_pool` (the round tests), :func:`fake_pool` (the
evidence, rank-address and kNN tests); :func:`pool_spend_guard` (the live-worker tests). Test
doubles of pools live here, not in the library."""

from __future__ import annotations

from collections.abc import Sequence

from rl_conductor.workers.base import Hosting
from rl_conductor.workers.cache import SHARED_KEY, SharedState
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.live.spend import SpendGuard
from rl_conductor.workers.pool import Pool


def rising_pool(*answers: str) -> Pool:
    """w0, w1, ... with rising prices, each answering its text."""
    workers = [
        FakeWorker(info=fake_info(f"w{i}", price_in=i + 1.0, price_out=2.0 * (i + 1)), answer=a)
        for i, a in enumerate(answers)
    ]
    return Pool(name="fake", workers=list(workers))


def fake_pool(
    n: int = 3, *, latency_s: float = 0.0, hosting: Sequence[Hosting] | None = None, name: str = "fake"
) -> Pool:
    """A pool of ``n`` fake workers ``w0..w{n-1}`` with rising prices."""
    hs = list(hosting) if hosting else ["external"] * n
    workers = [
        FakeWorker(
            info=fake_info(f"w{i}", price_in=0.5 * (i + 1), price_out=2.0 * (i + 1), hosting=hs[i]),
            answer=f"answer from w{i}",
            latency_s=latency_s,
        )
        for i in range(n)
    ]
    return Pool(name=name, workers=list(workers))


def pool_spend_guard(pool: Pool) -> SpendGuard | None:
    """The spend guard of a built pool (None without ``max_usd``)."""
    state = pool.options.get(SHARED_KEY)
    return state.spend_guard if isinstance(state, SharedState) else None
