"""Issue 9's routellm-replay bar: a cost-weighted Conductor against the straight line between
Mixtral-only and GPT-4-only, and against the kNN router at the same cost.

Why: on a two-worker pool a router earns its keep only if it recovers more of the strong
worker's accuracy gap than the share of the strong worker's extra cost it spends; a policy on or
below the straight line between the two singles does no better than flipping a biased coin
between them (RouteLLM's call-performance view). And the reward asks for routing at all only
once the cost weight makes GPT-4 alone no longer the reward-optimal single policy.

What it does (all choices on the training split; the test split only scores):

1. Measures both workers alone on every training question (replay: the recorded answers) and
   prints each one's mean reward over a sweep of cost weights, and the crossover weight at
   which Mixtral alone out-earns GPT-4 alone, overall and per domain. It checks that the
   preset's ``cost_weight`` lies above the overall crossover.
2. Trains the preset (``configs/train/routellm.yaml``; fixed SFT and GRPO steps) into ``--out``
   unless ``--model`` names a trained Conductor folder.
3. Evaluates on the test split, with the same reward config (the preset's cost-aware reward
   with its cost weight): the Conductor, ``single:`` both workers, the kNN router fitted on
   every training question at the same cost weight, and the ``domain-router``; and the kNN
   router at a sweep of other cost weights, whose points (with the two singles) draw the kNN's
   cost-accuracy frontier: the accuracy that randomly mixing two of them reaches at the
   Conductor's cost (:func:`rl_conductor.evaluation.frontier.hull_accuracy`).
4. Bars: the Conductor above the line at its cost; the Conductor at or above the kNN router's
   accuracy at the same cost (the frontier), and for reference the kNN point at the same
   cost weight against the line. Writes JSON (and a Pareto PNG with ``--plot``).

Usage: ``python benchmarks/routellm_conductor.py --json benchmarks/results/routellm_conductor.json
--plot benchmarks/results/routellm_conductor.png`` (~20-30 min on 2 shared cores, training
included; ``--model runs/routellm/final`` skips training).
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter, defaultdict
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.table import Table

from rl_conductor.evaluation.frontier import (
    Point,
    cost_share,
    crossover_weight,
    gap_recovered,
    hull_accuracy,
    line_accuracy,
    mean_rewards,
)
from rl_conductor.evaluation.runner import EvalResult, evaluate
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import Policy
from rl_conductor.policies.baselines import SingleWorker
from rl_conductor.policies.knn import KnnRouter, cached_embeddings
from rl_conductor.policies.routers import DomainRouter, SingleOutcomes, single_outcomes
from rl_conductor.reward import REWARD_PRESETS, RewardConfig
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.training.config import TrainConfig, load_preset
from rl_conductor.workers.pool import Pool, load_pool

STRONG = "gpt-4-1106-preview"
WEAK = "mixtral-8x7b-instruct"
SWEEP = (0.0, 0.03, 0.1, 0.2, 0.25, 0.26, 0.27, 0.28, 0.3, 0.4)
KNN_SWEEP = (0.03, 0.1, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.7, 1.0)

console = Console()


def reward_config(cfg: TrainConfig) -> RewardConfig:
    """The training reward (as ``training.train`` builds it): the preset with the overrides."""
    over = {
        k: v for k, v in (("cost_weight", cfg.cost_weight), ("cost_scale", cfg.cost_scale)) if v is not None
    }
    return replace(REWARD_PRESETS[cfg.reward_preset], **over)


def cost_weight_sweep(outcomes: SingleOutcomes, tasks: list[Task], base: RewardConfig) -> dict[str, Any]:
    """Each worker's mean reward per cost weight and the crossovers (training split only)."""
    domains = np.array([t.domain for t in tasks])
    sweep = mean_rewards(outcomes, base, SWEEP)
    cross = {"all": crossover_weight(outcomes, base, STRONG, WEAK)}
    for d in sorted(set(domains)):
        cross[d] = crossover_weight(outcomes, base, STRONG, WEAK, rows=np.flatnonzero(domains == d))
    table = Table(title=f"mean reward alone on the training split (n = {len(tasks)})")
    for col in ("cost weight", STRONG, WEAK, "optimal single"):
        table.add_column(col, justify="right")
    for w, row in sweep.items():
        table.add_row(f"{w:g}", f"{row[STRONG]:.4f}", f"{row[WEAK]:.4f}", max(row, key=lambda n: row[n]))
    console.print(table)
    console.print(
        "crossover (Mixtral alone >= GPT-4 alone) from cost weight: "
        + ", ".join(f"{k} {v:.4f}" if v is not None else f"{k} none" for k, v in cross.items())
    )
    return {
        "weights": {f"{w:g}": row for w, row in sweep.items()},
        "crossover": cross,
        "train_accuracy": {n: float(outcomes.correct[:, j].mean()) for j, n in enumerate(outcomes.names)},
        "train_mean_cost_usd": {n: float(outcomes.cost[:, j].mean()) for j, n in enumerate(outcomes.names)},
    }


def run_eval(
    policy: Policy, pool: Pool, tasks: list[Task], limits: RequestLimits, rc: RewardConfig, label: str
) -> EvalResult:
    res = evaluate(policy, pool.view(), tasks, limits, reward_config=rc, description=f"eval {label}")
    res.policy = label
    return res


def gpt4_share(res: EvalResult, tasks: list[Task]) -> dict[str, dict[str, float]]:
    """Per source and per MMLU subject: questions, accuracy, and the share of questions whose
    plan calls GPT-4 (what the policy routes where)."""
    by: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for t, r in zip(tasks, res.records, strict=True):
        uses = STRONG in r.workers
        by[f"source:{t.source}"].append((uses, r.correct))
        if "subject" in t.metadata:
            by[f"subject:{t.metadata['subject']}"].append((uses, r.correct))
    return {
        k: {
            "n": len(v),
            "gpt4_share": float(np.mean([u for u, _ in v])),
            "accuracy": float(np.mean([c for _, c in v])),
        }
        for k, v in sorted(by.items())
    }


def above_line_bootstrap(results: dict[str, EvalResult], n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Paired bootstrap over test questions of each router's points above the line (the line's
    ends are resampled with it): mean, standard error and 95 % interval, and the same for the
    Conductor minus the kNN router (at the same cost weight)."""
    rng = np.random.default_rng(seed)
    acc = {k: np.array([r.correct for r in res.records], dtype=float) for k, res in results.items()}
    cost = {k: np.array([r.cost_usd for r in res.records]) for k, res in results.items()}
    n = len(acc["conductor"])
    draws: dict[str, list[float]] = defaultdict(list)
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        weak = Point("mixtral", cost["mixtral"][idx].mean(), acc["mixtral"][idx].mean())
        strong = Point("gpt-4", cost["gpt-4"][idx].mean(), acc["gpt-4"][idx].mean())
        above = {
            k: 100 * (acc[k][idx].mean() - line_accuracy(cost[k][idx].mean(), weak, strong))
            for k in ("conductor", "knn", "domain-router")
        }
        for k, v in above.items():
            draws[k].append(v)
        draws["conductor - knn"].append(above["conductor"] - above["knn"])
    return {
        k: {
            "mean": float(np.mean(v)),
            "se": float(np.std(v, ddof=1)),
            "ci95": [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))],
        }
        for k, v in draws.items()
    }


def bars(points: dict[str, Point], knn_curve: list[Point]) -> dict[str, Any]:
    """The bar arithmetic on measured points (see module docstring)."""
    weak, strong, cond, knn = points["mixtral"], points["gpt-4"], points["conductor"], points["knn"]
    out: dict[str, Any] = {}
    for name, p in (("conductor", cond), ("knn", knn), ("domain-router", points["domain-router"])):
        line = line_accuracy(p.cost, weak, strong)
        out[name] = {
            "accuracy": p.accuracy,
            "mean_cost_usd": p.cost,
            "line_accuracy_at_cost": line,
            "above_line_points": 100 * (p.accuracy - line),
            "cost_share": cost_share(p.cost, weak, strong),
            "gap_recovered": gap_recovered(p.accuracy, weak, strong),
            "above_line": bool(p.accuracy > line),
        }
    frontier = [weak, strong, *knn_curve]
    knn_at_cost = hull_accuracy(cond.cost, frontier)
    out["knn_frontier_accuracy_at_conductor_cost"] = knn_at_cost
    out["bar_above_line"] = out["conductor"]["above_line"]
    out["bar_at_or_above_knn_at_same_cost"] = bool(cond.accuracy >= knn_at_cost - 1e-12)
    out["bar_at_or_above_knn_same_weight_vs_line"] = bool(
        out["conductor"]["above_line_points"] >= out["knn"]["above_line_points"] - 1e-9
    )
    out["bar_holds"] = out["bar_above_line"] and out["bar_at_or_above_knn_at_same_cost"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--plot", type=Path, help="write a cost-accuracy PNG here")
    ap.add_argument("--preset", default="routellm", help="training preset (name or YAML path)")
    ap.add_argument("--model", type=Path, help="a trained Conductor folder (skips training)")
    ap.add_argument(
        "--out", type=Path, default=Path("runs/routellm-conductor"), help="training output folder"
    )
    ap.add_argument("--test-limit", type=int, default=None, help="score on at most N test questions")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    cfg = load_preset(args.preset)
    if cfg.pool != "routellm-replay":
        raise SystemExit(
            f"this benchmark is about routellm-replay; preset {args.preset!r} trains on {cfg.pool!r}"
        )
    rc = reward_config(cfg)
    pool = load_pool(cfg.pool, seed=cfg.seed)
    dataset = cfg.dataset or pool.default_dataset()
    train_tasks = load_tasks(dataset, split="train")
    test_tasks = load_tasks(dataset, split="test", limit=args.test_limit, seed=cfg.seed)
    if {t.id for t in train_tasks} & {t.id for t in test_tasks}:
        raise SystemExit("train and test splits overlap")  # splits are by task-id hash; never expected

    # 1. the cost weight, from the training split only
    train_out = single_outcomes(pool, train_tasks)
    sweep = cost_weight_sweep(train_out, train_tasks, rc)
    overall = sweep["crossover"]["all"]
    if overall is None or rc.cost_weight <= overall:
        console.print(
            f"[red]cost weight {rc.cost_weight} does not make GPT-4 alone sub-optimal (crossover {overall})"
        )

    # 2. the Conductor
    if args.model:
        model_dir = args.model
    else:
        from rl_conductor.training.train import train

        console.print(f"training preset {args.preset!r} into {args.out} ...")
        model_dir = train(cfg, args.out).final_dir

    # 3. evaluation, one reward config for all
    from rl_conductor.policies.conductor import ConductorPolicy

    limits = RequestLimits(max_steps=cfg.max_steps_per_workflow)
    knn = KnnRouter(cached_embeddings([t.question for t in train_tasks]), train_out, reward=rc)
    # the test questions embedded once (cached on disk) for every kNN router of the sweep
    test_emb = dict(
        zip(
            [t.question for t in test_tasks], cached_embeddings([t.question for t in test_tasks]), strict=True
        )
    )
    knn._query = dict(test_emb)
    policies: list[tuple[str, Policy]] = [
        ("conductor", ConductorPolicy(model_dir, seed=cfg.seed)),
        ("gpt-4", SingleWorker(STRONG)),
        ("mixtral", SingleWorker(WEAK)),
        ("knn", knn),
        ("domain-router", DomainRouter.from_outcomes(train_out, rc)),
    ]
    results = {label: run_eval(p, pool, test_tasks, limits, rc, label) for label, p in policies}
    summaries = {label: r.summary() for label, r in results.items()}
    points = {k: Point(k, s["mean_cost_usd"], s["accuracy"]) for k, s in summaries.items()}
    knn_curve: list[dict[str, Any]] = []
    for w in KNN_SWEEP:
        other = KnnRouter(knn.embeddings, train_out, reward=reward_config(rc, cost_weight=w))
        other._query = dict(test_emb)
        s = run_eval(other, pool, test_tasks, limits, rc, f"knn@{w:g}").summary()
        knn_curve.append({"cost_weight": w, "accuracy": s["accuracy"], "mean_cost_usd": s["mean_cost_usd"]})
    curve_points = [Point(f"knn@{c['cost_weight']:g}", c["mean_cost_usd"], c["accuracy"]) for c in knn_curve]
    verdict = bars(points, [*curve_points, points["knn"]])
    verdict["above_line_points_bootstrap"] = above_line_bootstrap(results)

    # 4. report
    table = Table(title=f"routellm-replay test split (n = {len(test_tasks)}), cost weight {rc.cost_weight:g}")
    for col in ("policy", "accuracy", "mean cost $", "line acc. at cost", "above line (pts)", "mean reward"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for label, s in summaries.items():
        line = line_accuracy(s["mean_cost_usd"], points["mixtral"], points["gpt-4"])
        table.add_row(
            label,
            f"{100 * s['accuracy']:.2f} %",
            f"{s['mean_cost_usd']:.6f}",
            f"{100 * line:.2f} %",
            f"{100 * (s['accuracy'] - line):+.2f}",
            f"{s['mean_reward']:.4f}",
        )
    console.print(table)
    knn_at = verdict["knn_frontier_accuracy_at_conductor_cost"]
    console.print(
        f"kNN frontier at the Conductor's cost: {100 * knn_at:.2f} %; "
        f"bars: above line {verdict['bar_above_line']}, at/above kNN at same cost "
        f"{verdict['bar_at_or_above_knn_at_same_cost']}"
    )
    for k, b in verdict["above_line_points_bootstrap"].items():
        lo, hi = b["ci95"]
        console.print(
            f"points above the line, {k}: {b['mean']:+.2f} (SE {b['se']:.2f}, 95 % {lo:+.2f} .. {hi:+.2f})"
        )
    routing = {
        label: gpt4_share(results[label], test_tasks) for label in ("conductor", "knn", "domain-router")
    }
    shapes = {label: Counter(r.shape for r in results[label].records).most_common(6) for label in results}
    out = {
        "preset": args.preset,
        "model_dir": str(model_dir),
        "train_config": cfg.to_dict(),
        "reward_config": asdict(rc),
        "n_train": len(train_tasks),
        "n_test": len(test_tasks),
        "cost_weight_sweep": sweep,
        "summaries": summaries,
        "knn_sweep": knn_curve,
        "bars": verdict,
        "routing": routing,
        "shapes": shapes,
    }
    if args.json:
        write_json(args.json, "routellm_conductor", out)
    if args.plot:
        plot(points, curve_points, args.plot, rc.cost_weight)
    return 0


def plot(points: dict[str, Point], knn_curve: list[Point], path: Path, weight: float) -> None:
    """Cost (linear) vs accuracy: the two singles' line, the kNN sweep, the routers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weak, strong = points["mixtral"], points["gpt-4"]
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    ax.plot(
        [weak.cost, strong.cost],
        [100 * weak.accuracy, 100 * strong.accuracy],
        "--",
        color="C7",
        label="Mixtral-GPT-4 line",
    )
    curve = sorted(knn_curve, key=lambda p: p.cost)
    ax.plot(
        [p.cost for p in curve],
        [100 * p.accuracy for p in curve],
        ".-",
        color="C0",
        alpha=0.6,
        label="kNN, cost-weight sweep",
    )
    for name, p in points.items():
        star = name == "conductor"
        ax.scatter(
            p.cost,
            100 * p.accuracy,
            s=120 if star else 45,
            marker="*" if star else "o",
            color="C3" if star else "C0",
            zorder=3,
        )
        ax.annotate(name, (p.cost, 100 * p.accuracy), fontsize=8, xytext=(4, 3), textcoords="offset points")
    ax.set_xlabel("mean cost per question (USD)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"routellm-replay test split, cost weight {weight:g}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
