"""The adaptive Conductor on gsm8k-six: two rounds vs the same model in one round, and the baselines.

Issue 22's bar for a Conductor trained to use rounds (``configs/train/gsm8k-six.yaml``,
``training/adaptive.py``): on the test split, at a cost weight where the most accurate model alone
is not reward-optimal, the adaptive Conductor (``max_rounds`` 2) against the same model planning
once (``max_rounds`` 1), the fitted escalation cascade, the kNN and domain routers (fitted at the
same reward on every training question), every single worker and the oracle; the paired 95 %
confidence interval of the accuracy difference two rounds minus one (normal approximation over the
per-question differences); and where the second round goes: its share among questions whose first
two answers agreed, disagreed, or where the first plan gave one answer.

Usage::

    python benchmarks/adaptive_conductor.py --model runs/gsm8k-six/final --cost-weight 0.25
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from rl_conductor.evaluation.runner import evaluate
from rl_conductor.policies.base import make_policy
from rl_conductor.reward import REWARD_PRESETS
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.trace import Limits
from rl_conductor.workers.pool import load_pool

ROOT = Path(__file__).resolve().parents[1]


def paired_ci(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Mean of ``a - b`` and its normal-approximation 95 % interval."""
    d = a.astype(np.float64) - b.astype(np.float64)
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0
    m = float(d.mean())
    return {"mean": m, "low": m - 1.96 * se, "high": m + 1.96 * se}


def row(name: str, res: Any) -> dict[str, Any]:
    recs = res.records
    s = res.summary()

    def share(rs: list[Any]) -> float | None:
        return float(np.mean([r.rounds > 1 for r in rs])) if rs else None

    one = [r for r in recs if r.first_agree is None]
    return {
        "policy": name,
        "n": len(recs),
        "accuracy": s["accuracy"],
        "mean_cost_usd": s["mean_cost_usd"],
        "mean_reward": s["mean_reward"],
        "multi_round_rate": share(recs),
        "n_agree": sum(r.first_agree is True for r in recs),
        "n_disagree": sum(r.first_agree is False for r in recs),
        "multi_round_rate_agree": share([r for r in recs if r.first_agree is True]),
        "multi_round_rate_disagree": share([r for r in recs if r.first_agree is False]),
        "multi_round_rate_one_answer": share(one),
        "shapes": s.get("shapes"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="the trained Conductor's folder")
    ap.add_argument("--pool", default="gsm8k-six")
    ap.add_argument("--cost-weight", type=float, default=0.25)
    ap.add_argument("--splits", nargs="+", default=["validation", "test"])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "adaptive_conductor.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rc = replace(REWARD_PRESETS["cost-aware"], cost_weight=args.cost_weight)
    pool = load_pool(args.pool)
    dataset = str(pool.options.get("default_dataset", args.pool))
    view = pool.view()
    kw: dict[str, Any] = {"seed": 0, "dataset": dataset, "reward_config": rc, "fit_limit": None}
    conductor = make_policy(f"conductor:{args.model}", pool, **kw)
    baselines = ["cascade", "knn", "domain-router", "oracle", *(f"single:{n}" for n in pool.names())]
    built = [make_policy(spec, pool, **kw) for spec in baselines]
    result: dict[str, Any] = {"pool": args.pool, "cost_weight": args.cost_weight, "reward": asdict(rc)}
    for split in args.splits:
        tasks = load_tasks(dataset, split=split)
        two = evaluate(conductor, view, tasks, Limits(max_rounds=2), progress=False, reward_config=rc)
        one = evaluate(conductor, view, tasks, Limits(max_rounds=1), progress=False, reward_config=rc)
        rows = [row("conductor (max_rounds 2)", two), row("conductor (max_rounds 1)", one)]
        for spec, pol in zip(baselines, built, strict=True):
            res = evaluate(pol, view, tasks, Limits(max_rounds=2), progress=False, reward_config=rc)
            rows.append(row(pol.name if spec == "cascade" else spec, res))
        c2 = np.array([r.correct for r in two.records])
        c1 = np.array([r.correct for r in one.records])
        k2 = np.array([r.cost_usd for r in two.records])
        k1 = np.array([r.cost_usd for r in one.records])
        result[split] = {
            "policies": rows,
            "accuracy_two_minus_one": paired_ci(c2, c1),
            "cost_two_minus_one": paired_ci(k2, k1),
        }
        print(f"\n{split} (n={len(tasks)}, cost weight {args.cost_weight})")
        print(
            "| policy | acc % | $/question | reward | rounds>1 % | agree: n, rounds>1 % "
            "| disagree: n, rounds>1 % | one answer: rounds>1 % |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")

        def pct(v: Any) -> str:
            return "-" if v is None else f"{100 * v:.1f}"

        for r in rows:
            cells = [
                r["policy"],
                pct(r["accuracy"]),
                f"{r['mean_cost_usd']:.6f}",
                f"{r['mean_reward']:.4f}",
                pct(r["multi_round_rate"]),
                f"{r['n_agree']}, {pct(r['multi_round_rate_agree'])}",
                f"{r['n_disagree']}, {pct(r['multi_round_rate_disagree'])}",
                pct(r["multi_round_rate_one_answer"]),
            ]
            print("| " + " | ".join(cells) + " |")
        ci = result[split]["accuracy_two_minus_one"]
        m, lo, hi = (100 * ci[k] for k in ("mean", "low", "high"))
        print(f"accuracy, two rounds - one: {m:+.1f} points [{lo:+.1f}, {hi:+.1f}]")
    result["seconds"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
