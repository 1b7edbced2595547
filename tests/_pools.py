"""Fake pools the round tests share (tests/test_rounds.py, tests/test_round_limits.py)."""

from __future__ import annotations

from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool


def rising_pool(*answers: str) -> Pool:
    """w0, w1, ... with rising prices, each answering its text."""
    workers = [
        FakeWorker(info=fake_info(f"w{i}", price_in=i + 1.0, price_out=2.0 * (i + 1)), answer=a)
        for i, a in enumerate(answers)
    ]
    return Pool(name="fake", workers=list(workers))
