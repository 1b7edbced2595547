"""Did ``conductor train --preset auto`` choose well? Its candidates and baselines on the test split.

Why: ``train --preset a,b`` (``rl_conductor/pipeline/choose.py``) chooses on the validation
split and never reads the test split. Whether the choice pays can only be seen on questions it
did not look at: this script evaluates every candidate of a finished choice, and the baselines
it was compared with, on the test split at the choice's reward, and writes both splits side by
side (JSON, and a table). With ``--pool`` and no finished ``OUT`` it runs the choice first.

Usage::

    python benchmarks/preset_choice.py --out runs/auto --pool my.yaml --cost-weight 0.13 \\
        --json benchmarks/results/preset_choice_mine.json

(``--out`` holding a ``choice.json`` is evaluated as it is; otherwise ``conductor train --out OUT
--preset auto --pool POOL --cost-weight W`` runs first.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.table import Table

from rl_conductor.evaluation.suite import run_eval
from rl_conductor.pipeline.choose import BASELINES, CHOICE_FILE


def _row(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("n", "accuracy", "mean_cost_usd", "mean_reward", "mean_calls", "multi_round_rate")
    return {k: summary.get(k) for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a choice's output folder (train --out)")
    ap.add_argument("--pool", help="with no choice.json in OUT: the recordings pool to train on")
    ap.add_argument("--cost-weight", type=float, default=0.13)
    ap.add_argument("--preset", default="auto")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not (args.out / CHOICE_FILE).is_file():
        if not args.pool:
            sys.exit(f"{args.out} holds no {CHOICE_FILE}: give --pool to run the choice first")
        cmd = [sys.executable, "-m", "rl_conductor.cli", "train", "--out", str(args.out), "--preset",
               args.preset, "--pool", args.pool, "--cost-weight", str(args.cost_weight)]  # fmt: skip
        subprocess.run(cmd, check=True)
    choice = json.loads((args.out / CHOICE_FILE).read_text())
    meta = json.loads((args.out / "final" / "conductor.json").read_text())
    weight = choice["reward"]["cost_weight"]
    specs = [f"conductor:{c['final_dir']}" for c in choice["candidates"].values()]
    test = run_eval(
        [*specs, *BASELINES], pool=meta["pool"], dataset=meta.get("dataset"), split="test", limit=None,
        seed=0, reward_preset=choice["reward"]["reward_preset"], cost_weight=weight, max_rounds=None,
    )  # fmt: skip
    names = [*choice["candidates"], *BASELINES]
    rows: dict[str, dict[str, Any]] = {}
    validation = {**choice["candidates"], **choice["baselines"]}
    for name, summary in zip(names, test, strict=True):
        rows[name] = {"validation": _row(validation.get(name, {})), "test": _row(summary)}
    best_test = max(choice["candidates"], key=lambda n: rows[n]["test"]["mean_reward"])
    table = Table(title=f"{meta['pool']}: chosen {choice['chosen']} on validation (w {weight:g})")
    for col in ("policy", "validation acc %, $/q, reward", "test acc %, $/q, reward"):
        table.add_column(col)
    for name, r in rows.items():
        cells = [
            f"{100 * s['accuracy']:.2f}, {s['mean_cost_usd']:.5f}, {s['mean_reward']:.4f}"
            if s.get("n")
            else "-"
            for s in (r["validation"], r["test"])
        ]
        table.add_row(name + (" (chosen)" if name == choice["chosen"] else ""), *cells)
    Console().print(table)
    if args.json:
        write_json(args.json, "preset_choice", {
            "pool": meta["pool"], "dataset": meta.get("dataset"), "reward": choice["reward"],
            "chosen": choice["chosen"], "best_on_test": best_test,
            "chose_the_best_on_test": best_test == choice["chosen"],
            "margins_on_validation": choice["margins"], "policies": rows,
        })  # fmt: skip


if __name__ == "__main__":
    main()
