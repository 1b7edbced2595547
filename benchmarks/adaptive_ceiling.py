"""How much adaptivity can earn on a replay pool: the best cascade vs the best one-round router.

Issue 22 asks the adaptive Conductor for +2 accuracy points over a non-adaptive Conductor at equal
cost. Before training anything, this measures the ceiling of that bar on the recorded answers
alone (no LM): the most any cascade of the family the Conductor can learn there could earn over
the most any per-question router could, at the same cost.

* Cascades (what rounds can do on replay, where a later worker never sees an earlier answer):
  round 1 asks two workers in parallel; while no two answers so far agree, the next round asks one
  more worker (up to ``--max-rounds``), and the final answer is the last step's. Every order of
  distinct workers is scored; the one with the best mean reward on the training split is kept
  and reported on test, with every cascade's test (accuracy, cost) for the frontier.
* One-round routers (a question to one worker, decided before any answer): the kNN router
  (``policies/knn.py``, at several ``k`` and cost weights, fitted on every training question),
  the evidence probes' router (``policies/evidence.py``: each worker's estimated chance from the
  question's embedding; send to the best estimated reward) and its threshold family (the
  cheaper of the two best workers unless the stronger's estimated chance exceeds it by ``t``,
  every ``t``: the probe's whole frontier), and a random mix of the two best workers.
* The one-round ceiling at a cost: the best test accuracy any of those routers reaches at or
  under that cost, chosen on test in hindsight (the upper hull: mixing two routers at random is a
  router too). That is more than a router fitted on train would get, so the cascade's margin
  over it is a lower bound of what rounds add.

Paired 95 % CIs (normal approximation over per-question differences) are against the threshold
router whose test cost is closest to, and not above, the cascade's. Writes
``benchmarks/results/adaptive_ceiling.json``.

Usage::

    python benchmarks/adaptive_ceiling.py --cost-weight 0.25 --max-rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json
from adaptive_conductor import paired_ci
from numpy.typing import NDArray

from rl_conductor.policies.cascade import SampleOutcomes, measure_samples
from rl_conductor.policies.evidence import estimated_rewards, fit_evidence
from rl_conductor.policies.knn import KnnRouter, cached_embeddings
from rl_conductor.policies.routers import SingleOutcomes
from rl_conductor.reward import RewardConfig, reward_config, reward_of
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.tasks.graders import keys_agree
from rl_conductor.workers.pool import Pool, load_pool

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.6)
KS: tuple[int | None, ...] = (10, 25, 50, 100, None)


class Split:
    """One split's recorded outcomes: ``correct[i, j]``, ``cost[i, j]``, ``agree[i, j, l]``."""

    def __init__(self, tasks: list[Task], out: SampleOutcomes) -> None:
        self.tasks = tasks
        self.names = out.names
        self.correct = out.correct[:, :, 0]
        self.cost = out.cost[:, :, 0]
        w = len(out.names)
        self.agree = np.zeros((len(tasks), w, w), dtype=bool)
        for i, t in enumerate(tasks):
            for j, m in itertools.product(range(w), repeat=2):
                self.agree[i, j, m] = keys_agree(t, out.keys[i][j][0], out.keys[i][m][0])


def cascade(s: Split, order: tuple[int, ...]) -> dict[str, NDArray[Any]]:
    """Per question: correctness, cost and rounds of the cascade asking ``order`` (see docstring)."""
    n = len(s.tasks)
    a, b = order[:2]
    cost = s.cost[:, a] + s.cost[:, b]
    correct = s.correct[:, b].copy()
    rounds = np.ones(n, dtype=int)
    open_ = ~s.agree[:, a, b]
    asked = [a, b]
    for c in order[2:]:
        cost = cost + np.where(open_, s.cost[:, c], 0.0)
        correct = np.where(open_, s.correct[:, c], correct)
        rounds = rounds + open_
        hit = np.zeros(n, dtype=bool)
        for e in asked:
            hit |= s.agree[:, c, e]
        asked.append(c)
        open_ = open_ & ~hit
    return {"correct": correct, "cost": cost, "rounds": rounds}


def summary(name: str, correct: NDArray[Any], cost: NDArray[Any], rc: RewardConfig) -> dict[str, Any]:
    return {
        "policy": name,
        "accuracy": float(np.mean(correct)),
        "mean_cost_usd": float(np.mean(cost)),
        "mean_reward": float(np.mean(reward_of(rc, correct=correct, cost=cost))),
    }


def hull_at(points: list[tuple[float, float]], budget: float) -> float:
    """The best accuracy at mean cost <= ``budget`` over random mixtures of ``points`` (cost, acc)."""
    best = max((a for c, a in points if c <= budget), default=float("nan"))
    for (c1, a1), (c2, a2) in itertools.product(points, repeat=2):
        if c1 < budget < c2:
            best = max(best, a1 + (a2 - a1) * (budget - c1) / (c2 - c1))
    return best


def router_choices(
    train: Split, test: Split, rc: RewardConfig, *, shrink: bool = False
) -> tuple[dict[str, NDArray[np.int64]], dict[str, Any]]:
    """Every one-round router's per-question choice (a worker column per test question), by name;
    and the threshold family's two workers. ``shrink``: the evidence probes blended with the
    domain rates, as ``evidence: rank`` (the ``recordings`` preset) fits them."""
    emb_train = cached_embeddings([t.question for t in train.tasks])
    emb_test = cached_embeddings([t.question for t in test.tasks])
    choices: dict[str, NDArray[np.int64]] = {}
    outcomes = SingleOutcomes(
        names=train.names,
        task_ids=[t.id for t in train.tasks],
        domains=[t.domain for t in train.tasks],
        correct=train.correct,
        cost=train.cost,
    )
    mean_cost = {n: float(train.cost[:, j].mean()) for j, n in enumerate(train.names)}
    for w in WEIGHTS:
        cfg = reward_config(rc, cost_weight=w)
        for k in KS:
            knn = KnnRouter(emb_train, outcomes, k=k, reward=cfg)
            choice = []
            for q in emb_test:
                expected, _ = knn.expected(q)
                choice.append(
                    min(
                        range(len(train.names)),
                        key=lambda j: (-expected[train.names[j]], mean_cost[train.names[j]], j),
                    )
                )
            choices[f"knn k={k or 'all'} w={w}"] = np.array(choice)
    model, _ = fit_evidence(
        train.tasks, emb_train, train.names, train.correct, cost=train.cost, shrink=shrink
    )
    p = model.predict(test.tasks, emb_test)
    for w in WEIGHTS:
        est = estimated_rewards(model, test.tasks, p, reward_config(rc, cost_weight=w))
        choices[f"evidence w={w}"] = np.argmax(est, axis=1)
    acc = train.correct.mean(axis=0)
    strong = int(np.argmax(acc))
    cheap = int(np.argsort(-acc)[1])
    margin = p[:, strong] - p[:, cheap]
    threshold: dict[str, Any] = {"strong": train.names[strong], "cheap": train.names[cheap], "choices": []}
    for t in np.unique(np.concatenate([margin, [np.inf, -np.inf]])):
        choice = np.where(margin > t, strong, cheap)
        choices[f"evidence threshold t={t:.4f}"] = choice
        threshold["choices"].append(choice)
    for j, name in enumerate(test.names):
        choices[f"single:{name}"] = np.full(len(test.tasks), j)
    return choices, threshold


def routers(train: Split, test: Split, rc: RewardConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every one-round router's test outcome; and the threshold routers' per-question choices."""
    choices, threshold = router_choices(train, test, rc)
    idx = np.arange(len(test.tasks))
    rows = [summary(name, test.correct[idx, ch], test.cost[idx, ch], rc) for name, ch in choices.items()]
    return rows, threshold


def arguments(doc: str | None, cost_weight: float, out: str) -> argparse.ArgumentParser:
    """The options the adaptive_* benchmarks share: ``--pool``, ``--cost-weight`` and ``--out``
    (by default ``benchmarks/results/<out>``)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", default="gsm8k-six")
    ap.add_argument("--cost-weight", type=float, default=cost_weight)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / out)
    return ap


def setting(args: argparse.Namespace) -> tuple[RewardConfig, Pool, str]:
    """The cost-aware reward at ``--cost-weight``, the ``--pool`` and its default dataset."""
    rc = reward_config("cost-aware", cost_weight=args.cost_weight)
    pool = load_pool(args.pool)
    return rc, pool, pool.default_dataset()


def main() -> None:
    ap = arguments(__doc__, 0.25, "adaptive_ceiling.json")
    ap.add_argument("--max-rounds", type=int, default=3, help="rounds of the longest cascade (>= 2)")
    args = ap.parse_args()
    t0 = time.process_time()
    rc, pool, dataset = setting(args)
    data = {}
    for split in ("train", "test"):
        tasks = load_tasks(dataset, split=split)
        data[split] = Split(tasks, asyncio.run(measure_samples(pool, tasks)))
    train, test = data["train"], data["test"]
    w = len(train.names)
    orders = [o for r in range(2, args.max_rounds + 2) for o in itertools.permutations(range(w), r)]
    fits = []
    for o in orders:
        tr, te = cascade(train, o), cascade(test, o)
        fits.append(
            {
                "order": [train.names[j] for j in o],
                "train_reward": float(np.mean(reward_of(rc, correct=tr["correct"], cost=tr["cost"]))),
                **{
                    f"test_{k}": v
                    for k, v in summary("", te["correct"], te["cost"], rc).items()
                    if k != "policy"
                },
                "test_multi_round_rate": float(np.mean(te["rounds"] > 1)),
                "_o": o,
            }
        )
    fits.sort(key=lambda f: -f["train_reward"])
    best_by_rounds = {}
    for r in range(2, args.max_rounds + 1):
        best_by_rounds[r] = next(f for f in fits if len(f["_o"]) <= r + 1)
    router_rows, threshold = routers(train, test, rc)
    points = [(r["mean_cost_usd"], r["accuracy"]) for r in router_rows]
    result: dict[str, Any] = {
        "pool": args.pool,
        "cost_weight": args.cost_weight,
        "n_train": len(train.tasks),
        "n_test": len(test.tasks),
    }
    result["cascades_fitted"] = {}
    print(
        f"test n={len(test.tasks)}, cost weight {args.cost_weight}; "
        f"cascades fitted on train n={len(train.tasks)}"
    )
    print(
        "| cascade (fitted on train) | acc % | $/q | reward | one-round ceiling at its cost, acc % | "
        "threshold router at <= its cost: acc %, $/q | cascade minus it, points [95 % CI] |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r, f in best_by_rounds.items():
        te = cascade(test, f["_o"])
        ceiling = hull_at(points, f["test_mean_cost_usd"])
        idx = np.arange(len(test.tasks))
        fits_cost = [(float(test.cost[idx, c].mean()), k) for k, c in enumerate(threshold["choices"])]
        under = [x for x in fits_cost if x[0] <= f["test_mean_cost_usd"]]
        c_cost, k = max(under)
        ch = threshold["choices"][k]
        d = paired_ci(te["correct"], test.correct[idx, ch])
        result["cascades_fitted"][str(r)] = {
            **{k2: v for k2, v in f.items() if k2 != "_o"},
            "one_round_ceiling_accuracy": ceiling,
            "threshold_router": {"accuracy": float(test.correct[idx, ch].mean()), "mean_cost_usd": c_cost},
            "accuracy_minus_threshold_router": d,
        }
        print(
            f"| {' > '.join(f['order'])} ({r} rounds max) | {100 * f['test_accuracy']:.1f} "
            f"| {f['test_mean_cost_usd']:.6f} | {f['test_mean_reward']:.4f} | {100 * ceiling:.1f} "
            f"| {100 * test.correct[idx, ch].mean():.1f}, {c_cost:.6f} "
            f"| {100 * d['mean']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] |"
        )
    # the test frontier of cascades vs routers: at each cascade's cost, its margin over the ceiling
    margins = []
    for f in fits:
        c = f["test_mean_cost_usd"]
        margins.append(
            {
                "order": f["order"],
                "test_accuracy": f["test_accuracy"],
                "test_mean_cost_usd": c,
                "margin_over_ceiling": f["test_accuracy"] - hull_at(points, c),
            }
        )
    margins.sort(key=lambda m: -m["margin_over_ceiling"])
    result["largest_test_margins"] = margins[:10]
    print("\nlargest test margins over the one-round ceiling (any cascade, chosen on test):")
    for m in margins[:5]:
        print(
            f"  {' > '.join(m['order'])}: {100 * m['test_accuracy']:.1f} % "
            f"at ${m['test_mean_cost_usd']:.6f}, "
            f"{100 * m['margin_over_ceiling']:+.1f} points"
        )
    result["routers"] = router_rows
    best_router = max(router_rows, key=lambda r: r["mean_reward"])
    print(f"\nbest one-round router by test reward: {best_router}")
    result["cpu_seconds"] = time.process_time() - t0
    write_json(args.out, "adaptive_ceiling", result)
    print(f"wrote {args.out} ({result['cpu_seconds']:.0f} CPU s)")


if __name__ == "__main__":
    main()
