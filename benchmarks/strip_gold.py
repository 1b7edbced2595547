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
from pathlib import Path

import yaml

from rl_conductor.tasks.recordings_format import resolve_path
from rl_conductor.workers.pool import load_pool_config


def strip(pool: str, out: Path, *, drop_grader: bool) -> tuple[Path, Path]:
    """Write the gold-free copy of ``pool``'s recordings and a pool YAML over it; returns both."""
    import gzip

    cfg = load_pool_config(pool)
    src = resolve_path(str(cfg["recordings"]))
    opener = gzip.open if src.suffix == ".gz" else open
    out.parent.mkdir(parents=True, exist_ok=True)
    data = out.with_name(out.name + ".jsonl")
    n = 0
    with opener(src, "rt", encoding="utf-8-sig") as f, data.open("w", encoding="utf-8") as w:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            row.pop("answer", None)
            if drop_grader:
                row.pop("grader", None)
            w.write(json.dumps(row) + "\n")
            n += 1
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
