"""More workers for a recordings file: each new worker answers an item as one of two existing ones.

Why: the hidden file of issue 21 has eleven models on three benchmarks; the project ships no
recordings with that many workers and several domains (``benchmarks/sim_recordings.py`` gives
seven simulated workers). A many-worker development file tests what grows with the pool: the
prompt's worker list, the ids the Conductor must tell apart, the pairs its first plan may use.
A new worker ``name = a/b@p`` answers each item as ``a`` with probability ``p`` and as ``b``
otherwise (text, label and tokens copied), with its own prices: its recorded cost is its tokens
at those prices. Copied texts make it agree with its source exactly, as a distilled model agrees
with its teacher more often than chance; read results on such a file as a stress test of scale,
not as a measurement of any real model.

Usage (the eleven-worker file of docs/recordings.md, from the seed-7 simulated texts)::

    python benchmarks/sim_recordings.py --seed 7 --texts --domains math,knowledge,reasoning \\
        --out .conductor/bench/s7t
    python benchmarks/widen_recordings.py --pool .conductor/bench/s7t.yaml --out .conductor/bench/s11t \\
        --add gpt-5-mini=gpt-5/qwen3-32b@0.6:0.25:2.0 \\
        --add claude-haiku=claude-sonnet-4/gemma-3-27b-it@0.5:0.8:4.0 \\
        --add llama-70b=qwen3-32b/deepseek-r1-distill-qwen-32b@0.5:0.6:0.8 \\
        --add mistral-small=gemma-3-27b-it/qwen3-32b@0.7:0.1:0.3
"""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path
from typing import Any

import yaml
from strip_gold import read_rows  # benchmarks/strip_gold.py (scripts run from this folder)

from rl_conductor.tasks.recordings_format import resolve_path, write_recordings
from rl_conductor.workers.pool import load_pool_config

_SPEC = re.compile(r"^([^=]+)=([^/]+)/([^@]+)@([0-9.]+):([0-9.]+):([0-9.]+)$")


def parse_add(spec: str) -> tuple[str, str, str, float, float, float]:
    """``name=a/b@p:price_in:price_out`` -> its parts (prices in USD per 1M tokens)."""
    m = _SPEC.match(spec)
    if not m:
        raise argparse.ArgumentTypeError(f"--add takes name=a/b@p:price_in:price_out, not {spec!r}")
    name, a, b, p, pin, pout = m.groups()
    return name, a, b, float(p), float(pin), float(pout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", type=Path, required=True, help="a recordings pool YAML")
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.jsonl.gz and OUT.yaml")
    ap.add_argument(
        "--add", type=parse_add, action="append", required=True, help="name=a/b@p:price_in:price_out"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    pool: dict[str, Any] = load_pool_config(str(args.pool))
    rows = list(read_rows(resolve_path(str(pool["recordings"]))))
    known = {w["name"] for w in pool["workers"]}
    for name, a, b, *_ in args.add:
        if name in known or a not in known or b not in known:
            raise SystemExit(f"--add {name}: the name must be new and {a}, {b} workers of {args.pool}")
    rng = random.Random(args.seed)
    for r in rows:
        for name, a, b, p, pin, pout in args.add:
            got = r["responses"].get(a if rng.random() < p else b)
            if got is None:
                continue
            resp = dict(got)
            if "input_tokens" in resp and "output_tokens" in resp:
                resp["cost_usd"] = (resp["input_tokens"] * pin + resp["output_tokens"] * pout) / 1e6
            r["responses"][name] = resp
    for name, a, b, _, pin, pout in args.add:
        pool["workers"].append(
            {"name": name, "kind": "replay", "price_in": pin, "price_out": pout, "hosting": "self",
             "description": f"mix of {a} and {b}"}
        )  # fmt: skip
    out = args.out.with_suffix(".jsonl.gz")
    pool = {k: v for k, v in pool.items() if k != "default_dataset"}
    pool["name"] = args.out.name
    pool["recordings"] = str(out.resolve())
    write_recordings(out, rows)
    args.out.with_suffix(".yaml").write_text(yaml.safe_dump(pool, sort_keys=False), encoding="utf-8")
    n = len(pool["workers"])
    print(f"wrote {out} and {args.out.with_suffix('.yaml')} ({n} workers, {len(rows)} items)")


if __name__ == "__main__":
    main()
