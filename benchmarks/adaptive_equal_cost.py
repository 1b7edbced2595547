"""The adaptive Conductor against each baseline family's frontier, at the Conductor's own cost.

Issue 22 asks the adaptive Conductor for accuracy >= the best fixed cascade's and >= the kNN
router's "at equal or lower cost", and >= the non-adaptive Conductor's + 2 points "at equal cost".
A single baseline point at another cost says little: a policy that spends less buys less. So each
family is swept over everything it can be (every setting, every cost weight it can be fitted at),
its points are mixed at random where that helps (the upper concave hull: sending a share of the
questions to one setting and the rest to another is a policy too), and the hull is read at the
Conductor's mean cost per question. That is the most accuracy the family reaches at the
Conductor's cost, chosen on the split itself in hindsight, which favours the baselines.

Families (every one includes each single worker):

* ``kNN``: the kNN router (``policies/knn.py``) with k in 10 / 25 / 50 / 100 / all, fitted on every
  training question at each cost weight of ``adaptive_ceiling.WEIGHTS``;
* ``one-round Conductor (evidence rule)``: the per-question evidence estimates of the
  ``recordings`` preset (``evidence: rank``, shrunk probes) sending each question to the worker
  of best estimated reward, at each cost weight. The one-round rank Conductor follows this rule on
  every question (``docs/recordings.md``), so its frontier over cost weights is this one;
* ``all one-round routers``: the two above plus the probes' threshold family
  (``adaptive_ceiling.router_choices``): the most a router deciding before any answer reaches;
* ``fixed cascades``: every cascade of distinct workers, two in parallel then one more per round
  while no two answers agree, up to 3 rounds (``adaptive_ceiling.cascade``: 480 orders on six
  workers), each one a point;
* ``fixed cascades fitted on train``: per cost weight, the order with the best training reward
  (what a team would ship at that weight).

The Conductor runs through the library's evaluation (``evaluate``, ``max_rounds`` 2, the plan ->
execute -> review path of a request) on the split. Paired bootstrap (rows resampled; each draw
recomputes every family point, the hull and the Conductor's cost) gives the 95 % intervals of
"Conductor accuracy minus the family's hull at its cost" and of the reward difference against
the family's best test reward. Writes JSON and a cost-vs-accuracy PNG.

Usage::

    python benchmarks/adaptive_equal_cost.py --model runs/gsm8k-six-text/final --splits test \\
        --json benchmarks/results/adaptive_equal_cost.json --plot benchmarks/results/adaptive_equal_cost.png
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json
from adaptive_ceiling import WEIGHTS, Split, cascade, router_choices
from numpy.typing import NDArray

from rl_conductor.evaluation.runner import evaluate
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.cascade import measure_samples
from rl_conductor.policies.catalog import make_policy
from rl_conductor.reward import reward_config, reward_of, trained_reward
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.pool import load_pool

ROOT = Path(__file__).resolve().parents[1]


def upper_hull_at(cost: NDArray[Any], acc: NDArray[Any], budget: float) -> float:
    """The best accuracy at mean cost <= ``budget`` over random mixtures of the points
    (``cost[p]``, ``acc[p]``); NaN when no point is affordable."""
    order = np.lexsort((acc, cost))
    hull: list[tuple[float, float]] = []
    for x, y in zip(cost[order].tolist(), acc[order].tolist(), strict=True):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (y - y1) - (y2 - y1) * (x - x1) >= 0:  # hull[-1] is on or below
                hull.pop()
            else:
                break
        hull.append((x, y))
    under = acc[cost <= budget]
    best = float(under.max()) if under.size else float("nan")
    for (x1, y1), (x2, y2) in pairwise(hull):
        if x1 <= budget <= x2 and x2 > x1:
            best = max(best, y1 + (y2 - y1) * (budget - x1) / (x2 - x1))
    return best


def family_gap(
    conductor: tuple[NDArray[Any], NDArray[Any]],
    family: Sequence[tuple[NDArray[Any], NDArray[Any]]],
    weights: NDArray[Any],
) -> dict[str, Any]:
    """Conductor accuracy minus the family's hull at the Conductor's cost: on the full split
    (``weights[0]``: every row once) and over the bootstrap draws (``weights[1:]``, each row's
    multiplicity / n)."""
    yc, cc = conductor
    y = np.stack([f[0] for f in family]).astype(np.float64)  # P x n
    c = np.stack([f[1] for f in family]).astype(np.float64)
    acc_p, cost_p = weights @ y.T, weights @ c.T  # B x P
    acc_c, cost_c = weights @ yc.astype(np.float64), weights @ cc
    gaps = np.array(
        [acc_c[b] - upper_hull_at(cost_p[b], acc_p[b], float(cost_c[b])) for b in range(len(weights))]
    )
    if np.isnan(gaps[0]):
        raise ValueError("the Conductor is cheaper than every point of a family: no hull at its cost")
    return {
        # draws where the Conductor was cheaper than every point (no hull there): left out of the CI
        "nan_draws": int(np.isnan(gaps[1:]).sum()),
        "hull_accuracy": float(acc_c[0] - gaps[0]),
        "gap_points": float(100 * gaps[0]),
        "ci95_points": [
            float(100 * np.nanpercentile(gaps[1:], 2.5)),
            float(100 * np.nanpercentile(gaps[1:], 97.5)),
        ],
    }


def best_reward(
    conductor_reward: NDArray[Any], rewards: Sequence[NDArray[Any]], weights: NDArray[Any]
) -> dict[str, Any]:
    """Conductor reward minus the family's best mean test reward (chosen on the full split)."""
    means = np.array([r.mean() for r in rewards])
    k = int(np.argmax(means))
    d = weights[1:] @ (conductor_reward - rewards[k])
    return {
        "best_reward": float(means[k]),
        "minus_best": float(conductor_reward.mean() - means[k]),
        "ci95": [float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))],
        "best_index": k,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="the trained Conductor's folder (OUT/final)")
    ap.add_argument("--splits", nargs="+", default=["test"])
    ap.add_argument("--max-rounds", type=int, default=2, help="the Conductor's rounds")
    ap.add_argument("--cascade-rounds", type=int, default=3, help="rounds of the longest fixed cascade")
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument(
        "--json",
        type=Path,
        default=None,
        help="where to write (default: runs/adaptive_equal_cost-POOL.json, untracked; the shipped "
        "figures are benchmarks/results/adaptive_equal_cost.json)",
    )
    ap.add_argument("--plot", type=Path, default=None, help="a cost-vs-accuracy PNG of the first split")
    args = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    meta = json.loads((args.model / "conductor.json").read_text())
    rc = trained_reward(meta)
    pool = load_pool(meta["pool"], seed=0)
    if args.json is None:  # a user's own pool never overwrites the shipped figures
        args.json = ROOT / "runs" / f"adaptive_equal_cost-{pool.name}.json"
    dataset = str(meta["dataset"])
    view = pool.view()
    conductor = make_policy(f"conductor:{args.model}", pool, seed=0, dataset=dataset, reward_config=rc)
    train_tasks = load_tasks(dataset, split="train")
    train = Split(train_tasks, asyncio.run(measure_samples(pool, train_tasks)))
    w = len(train.names)
    orders = [o for r in range(2, args.cascade_rounds + 2) for o in itertools.permutations(range(w), r)]
    runs = {o: _casc(train, o) for o in orders}  # each cascade replayed once on the training split

    def train_reward(o: tuple[int, ...], cw: float = rc.cost_weight) -> float:
        y, c = runs[o]
        return float(np.mean(reward_of(reward_config(rc, cost_weight=cw), correct=y, cost=c)))

    fitted = {cw: max(orders, key=lambda o, cw=cw: train_reward(o, cw)) for cw in WEIGHTS}
    result: dict[str, Any] = {
        "model": str(args.model),
        "pool": meta["pool"],
        "reward": meta["reward"],
        "max_rounds": args.max_rounds,
        "weights": list(WEIGHTS),
        "fitted_cascades": {str(cw): [train.names[j] for j in o] for cw, o in fitted.items()},
        "best_train_cascade": [train.names[j] for j in max(orders, key=train_reward)],
    }
    rng = np.random.default_rng(0)
    for split in args.splits:
        tasks = load_tasks(dataset, split=split)
        test = Split(tasks, asyncio.run(measure_samples(pool, tasks)))
        res = evaluate(
            conductor,
            view,
            tasks,
            RequestLimits(max_rounds=args.max_rounds),
            progress=False,
            reward_config=rc,
        )
        if [r.task_id for r in res.records] != [t.id for t in tasks]:
            raise SystemExit("the evaluation's records are not in the split's order")
        yc = np.array([r.correct for r in res.records], dtype=np.float64)
        cc = np.array([r.cost_usd for r in res.records], dtype=np.float64)
        rwc = np.array([r.reward for r in res.records], dtype=np.float64)
        n = len(tasks)
        weights = np.vstack([np.full(n, 1 / n), rng.multinomial(n, np.full(n, 1 / n), size=args.boot) / n])
        idx = np.arange(n)
        choices, _ = router_choices(train, test, rc, shrink=True)
        one = {k: (test.correct[idx, ch], test.cost[idx, ch]) for k, ch in choices.items()}
        singles = {k: v for k, v in one.items() if k.startswith("single:")}
        casc = {" > ".join(test.names[j] for j in o): _casc(test, o) for o in orders}
        fit_c = {
            f"fitted w={cw}: {' > '.join(test.names[j] for j in o)}": _casc(test, o)
            for cw, o in fitted.items()
        }
        families = {
            "kNN": {**{k: v for k, v in one.items() if k.startswith("knn")}, **singles},
            "one-round Conductor (evidence rule)": {
                **{k: v for k, v in one.items() if k.startswith("evidence w=")},
                **singles,
            },
            "all one-round routers": one,
            "fixed cascades": {**casc, **singles},
            "fixed cascades fitted on train": {**fit_c, **singles},
        }
        out: dict[str, Any] = {
            "n": n,
            "conductor": {
                "accuracy": float(yc.mean()),
                "mean_cost_usd": float(cc.mean()),
                "mean_reward": float(rwc.mean()),
                "multi_round_rate": float(np.mean([r.rounds > 1 for r in res.records])),
            },
            "families": {},
        }
        head = f"Conductor {100 * yc.mean():.2f} % at ${cc.mean():.6f}, reward {rwc.mean():.4f}"
        print(f"\n{split} (n={n}): {head}")
        print(
            "| family | points | hull acc % at the Conductor's cost | Conductor minus it, points [95 % CI] "
            "| best reward in family | Conductor minus it [95 % CI] |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for name, fam in families.items():
            vals = list(fam.values())
            try:
                gap = family_gap((yc, cc), vals, weights)
            except ValueError as exc:  # one line, not a traceback (e.g. a Conductor that never escalates)
                raise SystemExit(f"{split}: family {name!r}: {exc} (${cc.mean():.6f} a question)") from None
            rewards = [reward_of(rc, correct=v[0], cost=v[1]) for v in vals]
            br = best_reward(rwc, rewards, weights)
            br["best_policy"] = list(fam)[br.pop("best_index")]
            out["families"][name] = {"points": len(vals), **gap, "reward": br}
            print(
                f"| {name} | {len(vals)} | {100 * gap['hull_accuracy']:.2f} | {gap['gap_points']:+.2f} "
                f"[{gap['ci95_points'][0]:+.2f}, {gap['ci95_points'][1]:+.2f}] | {br['best_reward']:.4f} "
                f"({br['best_policy']}) | {br['minus_best']:+.4f} "
                f"[{br['ci95'][0]:+.4f}, {br['ci95'][1]:+.4f}] |"
            )
        result[split] = out
        if args.plot is not None and split == args.splits[0]:
            _plot(args.plot, families, (float(yc.mean()), float(cc.mean())), split)
    result["seconds"] = time.perf_counter() - t0
    result["cpu_seconds"] = time.process_time() - c0
    write_json(args.json, "adaptive_equal_cost", result)
    print(f"wrote {args.json} ({result['seconds']:.0f} s)")


def _casc(s: Split, o: tuple[int, ...]) -> tuple[NDArray[Any], NDArray[Any]]:
    r = cascade(s, o)
    return r["correct"], r["cost"]


def _plot(
    path: Path, families: dict[str, dict[str, Any]], conductor: tuple[float, float], split: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    # the largest family first, so that the families it contains stay visible on top of it
    ordered = sorted(families.items(), key=lambda kv: -len(kv[1]))
    for (name, fam), marker in zip(ordered, "xso^d", strict=False):
        pts = np.array([(float(np.mean(c)), float(np.mean(y))) for y, c in fam.values()])
        ax.scatter(pts[:, 0], 100 * pts[:, 1], s=12, marker=marker, alpha=0.5, label=name)
    ax.scatter(
        [conductor[1]], [100 * conductor[0]], s=160, marker="*", color="black", label="adaptive Conductor"
    )
    ax.set_xscale("log")
    ax.set_xlabel("mean cost per question (USD, log)")
    ax.set_ylabel("accuracy %")
    ax.set_title(f"Cost vs accuracy, {split} split: the adaptive Conductor and each family's points")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
