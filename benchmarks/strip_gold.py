"""A copy of a replay pool's recordings with every gold answer removed: the shape of a team's logs.

Why: logs of real models (RouterBench-style files: each model's response text and a correctness
label per item) often carry no gold answer in a form the project can grade, and no grader name.
Such items replay *as recorded* (``docs/recordings.md``), and a Conductor that reads the answers
must then compare texts by what they state, not by a gold-aware grader. This writes that shape
from a pool whose file has gold (``gsm8k-six``), so the same recipe can be measured with and
without it: ``answer`` is dropped from every item, and ``--drop-grader`` also drops ``grader``
(the loader's default, ``qa``, then decides how answers are keyed). Writes ``<out>.jsonl`` and a
pool ``<out>.yaml`` with the same workers and prices.

Usage::

    python benchmarks/strip_gold.py --pool gsm8k-six --drop-grader --out .conductor/bench/gsm8k-six-nogold
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rl_conductor.tasks.recordings_format import resolve_path, write_recordings
from rl_conductor.workers.pool import load_pool_config


def read_rows(src: Path) -> Iterator[dict[str, Any]]:
    """The raw items of a recordings file (JSON Lines, gzipped for ``.gz``), as written, so a
    copy changes only what its script means to change (``load_recordings`` parses them)."""
    import gzip

    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt", encoding="utf-8-sig") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def strip(pool: str, out: Path, *, drop_grader: bool) -> tuple[Path, Path]:
    """Write the gold-free copy of ``pool``'s recordings and a pool YAML over it; returns both."""
    cfg = load_pool_config(pool)
    data = out.with_name(out.name + ".jsonl")

    def stripped() -> Iterator[dict[str, Any]]:
        for row in read_rows(resolve_path(str(cfg["recordings"]))):
            row.pop("answer", None)
            if drop_grader:
                row.pop("grader", None)
            yield row

    n = write_recordings(data, stripped())
    spec = {k: v for k, v in cfg.items() if k not in ("default_dataset", "name", "recordings")}
    spec = {"name": out.name, "recordings": str(data.resolve()), **spec}
    yml = out.with_name(out.name + ".yaml")
    yml.write_text(yaml.safe_dump(spec, sort_keys=False))
    print(f"wrote {n} items to {data} and the pool {yml}")
    return data, yml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", default="gsm8k-six", help="a replay pool over a recordings file")
    ap.add_argument("--out", type=Path, default=Path(".conductor/bench/gsm8k-six-nogold"))
    ap.add_argument("--drop-grader", action="store_true", help="also drop each item's grader (qa keys)")
    args = ap.parse_args()
    strip(args.pool, args.out, drop_grader=args.drop_grader)


if __name__ == "__main__":
    main()
