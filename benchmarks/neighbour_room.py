"""How much a per-question first plan could earn on a file: the warm-start targets of a preset with
group means against per-question neighbourhoods (``warm_neighbours``), read on the training split.

Why: ``warm_neighbours`` (training/warmstart.py ``neighbour_means``) values each training
question's first plans over its nearest training questions instead of its (domain, source)
group. Whether that can pay depends on the file: where a group mixes questions that different
plans serve best (task types inside a domain) the neighbours split them; where a group is
homogeneous they only add noise. This reads it in seconds, before any training: the preset's
candidate table (first plans valued with their review, as training builds it; read from the cache
that ``conductor train`` writes, else built), and for each rule (group means, then each k) every
training question's target, scored by the reward that question's own row records for it. Neither
rule sees the question's own outcome: the neighbours leave it out, and the group means are fitted
on the other four of five folds (in-sample, the best of some fifty plans by a group's mean is
partly chosen by the outcomes it is then scored on). What a trained Conductor then
reaches also depends on how well the tiny LM reads the rule from the question's text (the note of
issue 21 has both).

Usage (CONDUCTOR_HOME where ``conductor train`` cached the tables)::

    python benchmarks/neighbour_room.py --pool my-recordings.yaml --cost-weight 0.13 \\
        --json benchmarks/results/neighbour_room_mine.json
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.table import Table

from rl_conductor.policies.knn import cached_embeddings
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.training import train as train_module
from rl_conductor.training import warmstart
from rl_conductor.training.config import load_preset
from rl_conductor.training.neighbours import target_rewards
from rl_conductor.workers.pool import load_pool

ROOT = Path(__file__).resolve().parents[1]


def training_table(preset: str, pool: str, cost_weight: float) -> tuple[Any, Any, list[Any], Any]:
    """(config, the adapted candidate table training fits its targets on, the training tasks, pool)."""
    cfg = load_preset(preset, pool=pool, cost_weight=cost_weight)
    p = load_pool(cfg.pool, seed=cfg.seed)
    tasks = load_tasks(cfg.dataset or p.default_dataset(), split="train", seed=cfg.seed)
    seen: dict[str, Any] = {}
    real = warmstart.ExpectedRewards.fit.__func__  # type: ignore[attr-defined]

    def spy(cls: Any, table: Any, config: Any, **kw: Any) -> Any:
        seen["table"] = table
        return real(cls, table, config, **kw)

    warmstart.ExpectedRewards.fit = classmethod(spy)  # type: ignore[method-assign,assignment]
    try:
        train_module._warm_start(cfg, tasks, p)
    finally:
        warmstart.ExpectedRewards.fit = classmethod(real)  # type: ignore[method-assign,assignment]
    return cfg, seen["table"], tasks, p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="recordings-text")
    ap.add_argument("--pool", required=True)
    ap.add_argument("--cost-weight", type=float, required=True)
    ap.add_argument("--k", default="10,25,50,100", help="neighbourhood sizes to compare")
    ap.add_argument(
        "--json",
        type=Path,
        default=None,
        help="where to write (default: runs/neighbour_room-POOL.json, untracked)",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    cfg, table, tasks, pool = training_table(args.preset, args.pool, args.cost_weight)
    if args.json is None:  # a user's own pool never overwrites the shipped figures
        args.json = ROOT / "runs" / f"neighbour_room-{pool.name}.json"
    reward = cfg.reward()
    r = warmstart.reward_array(table, reward)[:, :, 0]
    by_id = {t.id: t for t in tasks}
    items = [by_id[i] for i in table.task_ids]
    names = pool.view().names()
    emb = cached_embeddings([t.question for t in items])
    rules: dict[str, int] = {"group means": 0, **{f"k={k}": int(k) for k in args.k.split(",")}}
    rows: dict[str, dict[str, Any]] = {}
    for label, k in rules.items():
        # out of sample (training/neighbours.py): group means fitted on the other folds, neighbours
        # leaving the question out
        got, chosen = target_rewards(
            table, items, names, reward, k=k, embeddings=emb, seed=cfg.seed,
            shrink=cfg.warm_shrink, se_rule=cfg.warm_se_rule, group_by=cfg.warm_group_by,
        )  # fmt: skip
        per_domain: dict[str, list[float]] = defaultdict(list)
        targets: dict[str, set[str]] = defaultdict(set)
        for i, t in enumerate(items):
            per_domain[t.domain].append(float(got[i]))
            targets[t.domain].add(chosen[i])
        rows[label] = {
            "mean_reward": float(np.mean([v for vs in per_domain.values() for v in vs])),
            "domains": {
                d: {"n": len(vs), "mean_reward": float(np.mean(vs)), "distinct_targets": len(targets[d])}
                for d, vs in sorted(per_domain.items())
            },
        }
    oracle = float(np.nanmax(r, axis=1).mean())
    table_out = Table(title=f"{args.pool}: training-split reward of the targets (w {args.cost_weight:g})")
    table_out.add_column("rule")
    table_out.add_column("all", justify="right")
    domains = sorted({d for row in rows.values() for d in row["domains"]})
    for d in domains:
        table_out.add_column(d, justify="right")
    for label, row in rows.items():
        per = [row["domains"][d] for d in domains]
        cells = [f"{c['mean_reward']:.4f} ({c['distinct_targets']})" for c in per]
        table_out.add_row(label, f"{row['mean_reward']:.4f}", *cells)
    Console().print(table_out)
    Console().print(f"cells: reward (distinct targets); per-question oracle over the plans: {oracle:.4f}")
    write_json(
        args.json,
        "neighbour_room",
        {
            "pool": args.pool,
            "preset": args.preset,
            "cost_weight": args.cost_weight,
            "n_train": len(items),
            "oracle_reward": oracle,
            "rules": rows,
            "seconds": time.perf_counter() - t0,
        },
    )


if __name__ == "__main__":
    main()
