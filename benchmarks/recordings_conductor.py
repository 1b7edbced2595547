"""A trained ``recordings`` Conductor against its own evidence rule and the routers, with paired CIs.

Why: the bar of a Conductor for bring-your-own recordings is to reach what its evidence says
(``evidence-rule:DIR``: each question to the first worker of its ranking line) and to beat the
routers fitted at the reward it was trained with (``knn``, ``domain-router``). This benchmark
evaluates, on the validation and test splits of the pool the model was trained on (its
``conductor.json``), through the executor as ``conductor compare`` does:

* ``conductor`` (the folder given; with ``--sft`` also the SFT-only folder next to it: GRPO's
  effect);
* ``evidence-rule``, ``knn`` and ``domain-router`` (fitted at the model's reward on every training
  question), ``knn-k100`` (the kNN router on the 100 nearest training questions) and
  ``evidence-router`` (``benchmarks/adaptive_ceiling.py``'s probe router: the evidence probes fitted
  on every training question without shrinking, each question to the best estimated reward; scored
  from the recorded single outcomes, which is what the executor replays);

and reports per policy accuracy, $/question, mean reward, the Conductor's agreement with its
evidence (``evidence_agreement``), paired bootstrap 95 % intervals of the Conductor's reward minus
each other policy's, and its accuracy minus the kNN router's cost-accuracy frontier at the
Conductor's cost (the kNN router refitted at cost weights 0 … 1 on the recorded single outcomes,
with the single workers, :func:`~rl_conductor.evaluation.frontier.hull_accuracy`; the bootstrap
resamples the questions of every point).

``--extra NAME=DIR`` (repeatable) adds more Conductor folders of the same pool (an ablation: its
paired intervals against the same routers and against ``conductor``, the routers evaluated once).
``--rewards FILE`` writes every policy's per-question rewards and summary; ``--reuse FILE`` reads
such a file instead of evaluating the rule and the routers again (same pool, splits and questions:
they do not depend on the Conductor folder beyond its evidence model, which a recipe's seed fixes).

Usage: ``python benchmarks/recordings_conductor.py --model runs/mine/final --sft --json
benchmarks/results/recordings_conductor_routellm.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.table import Table

from rl_conductor.evaluation.frontier import Point, hull_accuracy
from rl_conductor.evaluation.runner import EvalResult, evaluate
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.catalog import make_policy
from rl_conductor.policies.evidence import estimated_rewards, fit_evidence
from rl_conductor.policies.knn import KnnRouter, cached_embeddings
from rl_conductor.policies.routers import reward_matrix, single_outcomes
from rl_conductor.reward import reward_config, trained_reward
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.pool import load_pool

#: the policies --reuse reads from an earlier --rewards file instead of evaluating them again
ROUTERS = ("evidence-rule", "knn", "knn-k100", "domain-router", "evidence-router")

#: cost weights of the kNN frontier (the router refitted at each)
FRONTIER_WEIGHTS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)


def knn_choices(train: dict[str, Any], test: dict[str, Any], base: Any) -> dict[float, np.ndarray]:
    """The shipped kNN router's choice (similarity-weighted mean reward over every training
    question) per test question at each frontier weight."""
    sims = test["emb"] @ train["emb"].T
    w = np.clip(sims, 0, None)
    w = np.where(w.sum(axis=1, keepdims=True) > 0, w, 1.0)
    w = w / w.sum(axis=1, keepdims=True)
    return {
        cw: (w @ reward_matrix(train["out"], reward_config(base, cost_weight=cw))).argmax(axis=1)
        for cw in FRONTIER_WEIGHTS
    }


def frontier_gap(
    res: EvalResult, test: dict[str, Any], choices: dict[float, np.ndarray], idx: np.ndarray
) -> float:
    """Accuracy points of ``res`` above the kNN frontier (with the singles) at its cost, on ``idx``."""
    y, c = test["out"].correct[idx], test["out"].cost[idx]
    rows = np.arange(len(idx))
    points = [
        Point(f"knn@{w}", c[rows, ch[idx]].mean(), y[rows, ch[idx]].mean()) for w, ch in choices.items()
    ]
    points += [Point(n, c[:, j].mean(), y[:, j].mean()) for j, n in enumerate(test["out"].names)]
    acc = np.array([r.correct for r in res.records], dtype=float)[idx]
    cost = np.array([r.cost_usd for r in res.records])[idx]
    return float(100 * (acc.mean() - hull_accuracy(max(cost.mean(), min(p.cost for p in points)), points)))


def paired(a: np.ndarray, b: np.ndarray, draws: np.ndarray) -> dict[str, Any]:
    d = a - b
    means = d[draws].mean(axis=1)
    return {
        "mean": float(d.mean()),
        "ci95": [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="the trained Conductor folder (OUT/final)")
    ap.add_argument("--sft", action="store_true", help="also the SFT-only folder (OUT/sft)")
    ap.add_argument("--splits", default="validation,test")
    ap.add_argument("--limit", type=int, default=None, help="at most N questions per split")
    ap.add_argument("--boot", type=int, default=2000)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rewards", type=Path, help="also write each policy's per-question rewards here (JSON)")
    ap.add_argument(
        "--reuse", type=Path, help="the rule's and routers' rewards from an earlier --rewards file"
    )
    ap.add_argument(
        "--extra", action="append", default=[], metavar="NAME=DIR", help="another Conductor folder to compare"
    )
    args = ap.parse_args()
    meta = json.loads((args.model / "conductor.json").read_text())
    pool = load_pool(meta["pool"], seed=0)
    dataset = str(meta["dataset"])
    rc = trained_reward(meta)
    specs = {"conductor": f"conductor:{args.model}"}
    if args.sft:
        specs["conductor-sft"] = f"conductor:{args.model.parent / 'sft'}"
    for extra in args.extra:
        name, sep, folder = extra.partition("=")
        if not sep or not name or name in specs or name in ROUTERS:
            ap.error(f"--extra takes NAME=DIR with a new NAME, not {extra!r}")
        specs[name] = f"conductor:{folder}"
    conductors = [k for k, s in specs.items() if s.startswith("conductor:")]
    reused: dict[str, Any] = json.loads(args.reuse.read_text()) if args.reuse else {}
    if not reused:
        specs |= {
            "evidence-rule": f"evidence-rule:{args.model}",
            "knn": "knn",
            "domain-router": "domain-router",
        }
    policies = {k: make_policy(s, pool, seed=0, dataset=dataset, reward_config=rc) for k, s in specs.items()}
    tr_tasks = load_tasks(dataset, split="train")
    train = {"out": single_outcomes(pool, tr_tasks), "emb": cached_embeddings([t.question for t in tr_tasks])}
    if not reused:
        policies["knn-k100"] = KnnRouter(train["emb"], train["out"], k=100, reward=rc)
        probes, _ = fit_evidence(
            tr_tasks, train["emb"], train["out"].names, train["out"].correct, cost=train["out"].cost
        )
    out: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "model": str(args.model),
        "pool": meta["pool"],
        "reward": rc.to_dict(),
        "splits": {},
    }
    console = Console()
    per_q: dict[str, Any] = {}
    for split in args.splits.split(","):
        tasks = load_tasks(dataset, split=split, limit=args.limit)
        test = {"out": single_outcomes(pool, tasks), "emb": cached_embeddings([t.question for t in tasks])}
        results = {
            k: evaluate(p, pool.view(), tasks, RequestLimits(), reward_config=rc, description=f"{split} {k}")
            for k, p in policies.items()
        }
        rewards = {k: np.array([r.reward for r in res.records]) for k, res in results.items()}
        summary = {k: res.summary() for k, res in results.items()}
        if not reused:  # the probe router, from the recorded outcomes of its choices
            choice = estimated_rewards(probes, tasks, probes.predict(tasks, test["emb"]), rc).argmax(axis=1)
            rows = np.arange(len(tasks))
            rewards["evidence-router"] = reward_matrix(test["out"], rc)[rows, choice]
            summary["evidence-router"] = {
                "accuracy": float(test["out"].correct[rows, choice].mean()),
                "mean_cost_usd": float(test["out"].cost[rows, choice].mean()),
                "mean_reward": float(rewards["evidence-router"].mean()),
                "evidence_agreement": None,
                "fallback_rate": 0.0,
            }
        if reused:
            if split not in reused:
                ap.error(f"--reuse {args.reuse} has no {split} split")
            old = reused[split]
            where = {i: j for j, i in enumerate(old["ids"])}
            missing = [t.id for t in tasks if t.id not in where]
            if missing:
                ap.error(f"--reuse {args.reuse} lacks {len(missing)} {split} questions, e.g. {missing[0]!r}")
            rows = [where[t.id] for t in tasks]
            for k in ROUTERS:
                if k not in old["rewards"]:
                    ap.error(f"--reuse {args.reuse} has no {k!r} rewards (written before it was measured)")
                rewards[k] = np.array(old["rewards"][k])[rows]
                summary[k] = old["policies"][k]
        draws = np.random.default_rng(0).integers(0, len(tasks), size=(args.boot, len(tasks)))
        choices = knn_choices(train, test, rc)
        every = np.arange(len(tasks))
        gaps = [
            frontier_gap(results["conductor"], test, choices, d) for d in draws[: max(200, args.boot // 10)]
        ]
        block = {
            "n": len(tasks),
            "policies": {
                k: {
                    key: s.get(key)
                    for key in (
                        "accuracy",
                        "mean_cost_usd",
                        "mean_reward",
                        "evidence_agreement",
                        "fallback_rate",
                    )
                }
                for k, s in summary.items()
            },
            "conductor_minus": {
                k: paired(rewards["conductor"], rewards[k], draws) for k in rewards if k != "conductor"
            },
            "conductor_above_knn_frontier_points": {
                "mean": frontier_gap(results["conductor"], test, choices, every),
                "ci95": [float(np.percentile(gaps, 2.5)), float(np.percentile(gaps, 97.5))],
            },
        }
        for name in conductors[1:]:  # the SFT-only folder and the extras, against the same policies
            other = [
                frontier_gap(results[name], test, choices, d) for d in draws[: max(200, args.boot // 10)]
            ]
            block.setdefault("others", {})[name] = {
                "minus": {k: paired(rewards[name], rewards[k], draws) for k in rewards if k != name},
                "above_knn_frontier_points": {
                    "mean": frontier_gap(results[name], test, choices, every),
                    "ci95": [float(np.percentile(other, 2.5)), float(np.percentile(other, 97.5))],
                },
            }
        out["splits"][split] = block
        if args.rewards:  # for paired comparisons with folders evaluated later
            per_q[split] = {
                "ids": [t.id for t in tasks],
                "rewards": {k: v.tolist() for k, v in rewards.items()},
                "policies": block["policies"],
            }
            args.rewards.write_text(json.dumps(per_q))
        table = Table(title=f"{meta['pool']} {split} (n = {len(tasks)}, cost weight {rc.cost_weight})")
        for col in ("policy", "acc %", "$/q", "reward", "agreement", "conductor − it (95 % CI)"):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for k, s in block["policies"].items():
            d = block["conductor_minus"].get(k)
            table.add_row(
                k,
                f"{100 * s['accuracy']:.2f}",
                f"{s['mean_cost_usd']:.6f}",
                f"{s['mean_reward']:.4f}",
                "" if s["evidence_agreement"] is None else f"{100 * s['evidence_agreement']:.1f} %",
                "" if d is None else f"{d['mean']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]",
            )
        console.print(table)
        g = block["conductor_above_knn_frontier_points"]
        console.print(f"conductor above the kNN frontier at its cost: {g['mean']:+.2f} points {g['ci95']}")
        for name, o in block.get("others", {}).items():
            diffs = ", ".join(
                f"{k} {d['mean']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]"
                for k, d in o["minus"].items()
            )
            console.print(f"{name} − {diffs}")
        if args.json:  # after every split: a long run leaves what it measured
            write_json(args.json, "recordings_conductor", out)


if __name__ == "__main__":
    main()
