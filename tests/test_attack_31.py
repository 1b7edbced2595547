"""Findings of the 31st outside attack (notes: /work/notes/attack-31.md), each pinned by a test that
failed before its fix: bring-your-own recordings, the closed loop's traffic stores, and the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rl_conductor.loop import traffic as tl
from rl_conductor.serving_core import ConductorRequest
from rl_conductor.validation import InvalidValue


def _doc(rid: str) -> dict[str, Any]:
    return {
        "request_id": rid,
        "answer": "42",
        "workflow": [],
        "steps": [],
        "tokens": 1,
        "input_tokens": 1,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "latency_s": 0.1,
    }


# --------------------------------------------------------------------------- F7: nested traffic stores


@pytest.mark.parametrize(
    ("public", "private"),
    [
        ("pub", "pub/traffic"),  # the private batches would sit below the public store's traffic/
        ("pub", "pub/sub"),
        ("pub/sub", "pub"),  # the public store inside the private one
        ("s3://bucket/t", "s3://bucket/t/private"),
        ("s3://bucket/t/", "s3://bucket/t"),
    ],
)
def test_a_private_store_inside_or_around_the_public_one_is_refused(
    tmp_path: Path, public: str, private: str
) -> None:
    def where(u: str) -> str:
        return u if u.startswith("s3://") else str(tmp_path / u)

    with pytest.raises(InvalidValue, match="--traffic_private_store"):
        tl.TrafficConfig(store=where(public), private_store=where(private))


def test_sibling_stores_are_accepted_and_stay_apart(tmp_path: Path) -> None:
    """``pub`` and ``pub-private`` (and S3 prefixes alike) share a string prefix, not a folder."""
    tl.TrafficConfig(store="s3://bucket/t", private_store="s3://bucket/t-private")
    public, private = tmp_path / "pub", tmp_path / "pub-private"
    log = tl.TrafficLog(tl.TrafficConfig(store=str(public), private_store=str(private)))
    log.submit(ConductorRequest(question="secret", sensitivity="private"), _doc("p1"), "v1")
    log.submit(ConductorRequest(question="open"), _doc("o1"), "v1")
    log.close()
    assert [r["request_id"] for r in tl.read_traffic(str(public))] == ["o1"]
    assert [r["request_id"] for r in tl.read_traffic(str(private))] == ["p1"]


def test_an_s3_store_without_a_bucket_is_refused() -> None:
    with pytest.raises(InvalidValue, match="--traffic_store"):
        tl.TrafficConfig(store="s3://")
