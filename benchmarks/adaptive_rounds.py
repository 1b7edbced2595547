"""Adaptive rounds on the six-model GSM8K pool: the baselines an adaptive Conductor must beat, and
the hindsight table it would learn from (issue 22, items 3-4).

On ``gsm8k-six`` (replay: a worker's answer to an item is its recorded solution, whatever the
context) a second round can only ask other workers, so adaptivity is an escalation cascade. This
script scores, on the test split at one reward (``--cost-weight``, chosen so that the most
accurate model alone is not reward-optimal on the training split), every single worker, the kNN
and domain routers (fitted at that reward on every training question), the oracle, and the
fitted cascade (``policies/cascade.py``: the best (first pair, escalation) on the training split),
through ``conductor eval``'s library entry (``evaluation.suite.run_eval``), with ``max_rounds`` 2.

The hindsight table: for each cheap first plan (a single worker, or a pair of workers, each
cheaper on average than the most accurate worker alone), how often its answers agree (a single:
whether an answer was found), and for agreeing / disagreeing questions the mean reward of
stopping and of the best escalation — measured exactly from the recorded answers
(``cascade.measure_samples``). Writes JSON (default ``benchmarks/results/adaptive_rounds.json``)
and prints Markdown tables.

Usage::

    python benchmarks/adaptive_rounds.py --cost-weight 0.3
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict
from typing import Any

import numpy as np
from adaptive_ceiling import arguments, setting

from rl_conductor.evaluation.suite import run_eval
from rl_conductor.policies.cascade import fit_cascade, measure_samples
from rl_conductor.reward import RewardConfig, reward_of
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.tasks.graders import keys_agree
from rl_conductor.workers.pool import load_pool


def hindsight(pool_name: str, split: str, rc: RewardConfig) -> list[dict[str, Any]]:
    """One row per cheap first plan (see module docstring)."""
    pool = load_pool(pool_name)
    tasks = load_tasks(pool.default_dataset(), split=split)
    out = asyncio.run(measure_samples(pool, tasks))
    names = out.names
    mean_cost = out.cost[:, :, 0].mean(axis=0)
    best = int(np.argmax(out.correct[:, :, 0].mean(axis=0)))  # the most accurate worker alone
    cheap = [j for j in range(len(names)) if mean_cost[j] < mean_cost[best]]
    rows: list[dict[str, Any]] = []
    firsts: list[tuple[int, ...]] = [(a,) for a in cheap]
    firsts += [(a, b) for a in cheap for b in cheap if mean_cost[a] < mean_cost[b]]
    for first in firsts:
        if len(first) == 1:
            (a,) = first
            signal = np.array([out.keys[i][a][0] is not None for i in range(len(tasks))])
            correct0, cost0 = out.correct[:, a, 0], out.cost[:, a, 0]
        else:
            a, b = first
            signal = np.array(
                [keys_agree(t, out.keys[i][a][0], out.keys[i][b][1]) for i, t in enumerate(tasks)]
            )
            correct0, cost0 = out.correct[:, b, 1], out.cost[:, a, 0] + out.cost[:, b, 1]
        row: dict[str, Any] = {
            "first": " + ".join(names[j] for j in first),
            "n": len(tasks),
            "signal": "answer found" if len(first) == 1 else "answers agree",
            "signal_rate": float(signal.mean()),
            "first_accuracy": float(correct0.mean()),
            "first_cost_usd": float(cost0.mean()),
        }
        for label, rows_mask in (("agree", signal), ("disagree", ~signal)):
            if not rows_mask.any():
                row[label] = None
                continue
            options = {"stop": reward_of(rc, correct=correct0[rows_mask], cost=cost0[rows_mask])}
            for e in range(len(names)):
                if e in first:
                    continue
                c = out.correct[rows_mask, e, 2]
                k = cost0[rows_mask] + out.cost[rows_mask, e, 2]
                options[f"+{names[e]}"] = reward_of(rc, correct=c, cost=k)
            best = max(options, key=lambda o: float(options[o].mean()))
            row[label] = {
                "n": int(rows_mask.sum()),
                "accuracy_if_stop": float(correct0[rows_mask].mean()),
                "reward_if_stop": float(options["stop"].mean()),
                "best": best,
                "best_reward": float(options[best].mean()),
            }
        rows.append(row)
    return rows


def main() -> None:
    args = arguments(__doc__, 0.3, "adaptive_rounds.json").parse_args()
    t0 = time.perf_counter()
    rc, pool, dataset = setting(args)
    train = load_tasks(dataset, split="train")
    fits = fit_cascade(asyncio.run(measure_samples(pool, train)), train, rc)
    specs = [f"single:{n}" for n in pool.names()] + ["knn", "domain-router", "cascade", "oracle"]
    best = fits[0]
    specs.append(f"cascade:{best.first[0]},{best.first[1]}")  # the fitted pair, never escalating
    # the three best cascades (on the training split) that do escalate on disagreement
    escalating = [f for f in fits if f.escalate and f.agree_rate < 1][:3]
    specs += [f"cascade:{f.first[0]},{f.first[1]}>{f.escalate}" for f in escalating]
    summaries = run_eval(
        specs,
        pool=args.pool,
        dataset=None,
        split="test",
        limit=None,
        seed=0,
        cost_weight=args.cost_weight,
        fit_limit=None,
        max_rounds=2,
        progress=False,
    )
    keep = (
        "policy",
        "n",
        "accuracy",
        "mean_cost_usd",
        "mean_reward",
        "mean_calls",
        "multi_round_rate",
        "multi_round_rate_agree",
        "multi_round_rate_disagree",
    )
    table = [{k: s.get(k) for k in keep} for s in summaries]
    result = {
        "pool": args.pool,
        "cost_weight": args.cost_weight,
        "reward": asdict(rc),
        "split": "test",
        "max_rounds": 2,
        "policies": table,
        "cascade_fits_train_top10": [asdict(f) for f in fits[:10]],
        "hindsight_test": hindsight(args.pool, "test", rc),
        "hindsight_train": hindsight(args.pool, "train", rc),
        "seconds": time.perf_counter() - t0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.1f}"

    print("| policy | acc % | $/question | reward | calls | rounds>1 % | when agree | when disagree |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in table:
        print(
            f"| {s['policy']} | {pct(s['accuracy'])} | {s['mean_cost_usd']:.6f} | {s['mean_reward']:.4f} | "
            f"{s['mean_calls']:.2f} | {pct(s['multi_round_rate'])} | {pct(s['multi_round_rate_agree'])} | "
            f"{pct(s['multi_round_rate_disagree'])} |"
        )
    print()
    print(
        "| first plan | signal % | acc % | $ | agree: n, reward if stop, best, its reward | disagree: ... |"
    )
    print("|---|---:|---:|---:|---|---|")
    for r in result["hindsight_test"]:
        cells = []
        for label in ("agree", "disagree"):
            c = r[label]
            cells.append(
                "-"
                if c is None
                else f"{c['n']}, {c['reward_if_stop']:.3f}, {c['best']}, {c['best_reward']:.3f}"
            )
        head = f"| {r['first']} | {pct(r['signal_rate'])} | {pct(r['first_accuracy'])} | "
        print(f"{head}{r['first_cost_usd']:.6f} | {cells[0]} | {cells[1]} |")
    print(f"wrote {args.out} in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
