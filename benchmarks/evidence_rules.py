"""What per-question evidence is worth before any Conductor is trained: routing rules side by side.

Why: the Conductor's prompt shows, per worker, an estimate of its chance to answer this question
right (:mod:`rl_conductor.policies.evidence`), and its warm-start targets follow the same
estimates. If sending each question to the worker with the best *estimated* reward did not beat
the routers, no Conductor trained on those targets would. This benchmark measures every worker
alone on every question of a pool's dataset (replay: the recorded answers; cached), then scores
single-worker routing rules at one reward on the validation split (where choices are made) and
the test split:

* every single worker, and the oracle (cheapest correct worker: an upper bound);
* ``domain-router``: the best mean reward in the question's domain;
* ``knn-all``: the kNN router as shipped (similarity-weighted over every training question);
* ``knn-K``: the mean over the K nearest training questions (K in 5 … 200);
* ``evidence``: the probes' estimate (fitted on the training split, scored out of sample) with
  the domain's mean cost;
* ``evidence-shrunk``: the same with each estimate blended with the worker's domain rate by a
  weight chosen out of fold (``fit_evidence(shrink=True)``, the ``evidence: rank`` recipe): the
  first id of the ranking line a ``recordings`` Conductor is shown and trained to copy.

Usage: ``python benchmarks/evidence_rules.py --pool routellm-replay --cost-weight 0.27 --json
benchmarks/results/evidence_rules_routellm.json`` (a few minutes: embeddings and the fits).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.table import Table

from rl_conductor.policies.evidence import estimated_rewards, fit_evidence
from rl_conductor.policies.knn import cached_embeddings
from rl_conductor.policies.routers import reward_matrix, single_outcomes
from rl_conductor.reward import REWARD_PRESETS
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.pool import load_pool

SPLITS = ("train", "validation", "test")
KS = (5, 10, 20, 50, 100, 200)


def _domain_mean(train_dom: np.ndarray, dom: np.ndarray, m: np.ndarray) -> np.ndarray:
    out = np.repeat(m.mean(axis=0)[None], len(dom), axis=0)
    for d in set(dom):
        rows = train_dom == d
        if rows.any():
            out[dom == d] = m[rows].mean(axis=0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", default="routellm-replay")
    ap.add_argument("--dataset", default=None, help="default: the pool's default_dataset")
    ap.add_argument("--cost-weight", type=float, required=True)
    ap.add_argument("--reward-preset", default="cost-aware")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    pool = load_pool(args.pool, seed=0)
    dataset = args.dataset or str(pool.options.get("default_dataset", "paper-mix"))
    rc = replace(REWARD_PRESETS[args.reward_preset], cost_weight=args.cost_weight)
    data: dict[str, dict[str, Any]] = {}
    names: list[str] = []
    for split in SPLITS:
        tasks = load_tasks(dataset, split=split)
        out = single_outcomes(pool, tasks)
        names = out.names
        data[split] = {
            "tasks": tasks,
            "emb": cached_embeddings([t.question for t in tasks]),
            "R": reward_matrix(out, rc),
            "C": out.cost,
            "Y": out.correct,
            "dom": np.array([t.domain for t in tasks]),
        }
    tr = data["train"]
    model, _ = fit_evidence(tr["tasks"], tr["emb"], names, tr["Y"], cost=tr["C"])
    shrunk, _ = fit_evidence(tr["tasks"], tr["emb"], names, tr["Y"], cost=tr["C"], shrink=True)

    def rules(split: str) -> dict[str, np.ndarray]:
        s = data[split]
        n = len(s["tasks"])
        out: dict[str, np.ndarray] = {f"single:{w}": np.full(n, j) for j, w in enumerate(names)}
        out["domain-router"] = _domain_mean(tr["dom"], s["dom"], tr["R"]).argmax(axis=1)
        sims = s["emb"] @ tr["emb"].T
        w = np.clip(sims, 0, None)
        w = np.where(w.sum(axis=1, keepdims=True) > 0, w, 1.0)
        out["knn-all"] = (w @ tr["R"] / w.sum(axis=1, keepdims=True)).argmax(axis=1)
        order = np.argsort(-sims, axis=1, kind="stable")
        for k in KS:
            idx = order[:, : min(k, order.shape[1])]
            out[f"knn-{k}"] = tr["R"][idx].mean(axis=1).argmax(axis=1)
        for label, m in (("evidence", model), ("evidence-shrunk", shrunk)):
            est = estimated_rewards(m, s["tasks"], m.predict(s["tasks"], s["emb"]), rc)
            out[label] = est.argmax(axis=1)
        y, c = s["Y"], s["C"]
        out["oracle"] = np.where(y.any(axis=1), np.where(y, -c, -np.inf).argmax(axis=1), c.argmin(axis=1))
        return out

    results: dict[str, dict[str, dict[str, float]]] = {}
    for split in ("validation", "test"):
        s = data[split]
        i = np.arange(len(s["tasks"]))
        results[split] = {
            name: {
                "accuracy": float(100 * s["Y"][i, ch].mean()),
                "cost_usd": float(s["C"][i, ch].mean()),
                "reward": float(s["R"][i, ch].mean()),
            }
            for name, ch in rules(split).items()
        }
    table = Table(title=f"{args.pool}: routing rules at cost weight {args.cost_weight}")
    for col in ("rule", "val acc %", "val reward", "test acc %", "test $/q", "test reward"):
        table.add_column(col, justify="left" if col == "rule" else "right")
    for name, t in results["test"].items():
        v = results["validation"][name]
        table.add_row(
            name,
            f"{v['accuracy']:.2f}",
            f"{v['reward']:.4f}",
            f"{t['accuracy']:.2f}",
            f"{t['cost_usd']:.6f}",
            f"{t['reward']:.4f}",
        )
    Console().print(table)
    if args.json:
        write_json(
            args.json,
            "evidence_rules",
            {
                "pool": args.pool,
                "dataset": dataset,
                "reward": rc.to_dict(),
                "n": {k: len(v["tasks"]) for k, v in data.items()},
                "chosen_c": dict(zip(names, model.chosen_c, strict=True)),
                "shrunk_alpha": {n: float(a) for n, a in zip(names, np.ravel(shrunk.alpha), strict=True)},
                "results": results,
            },
        )


if __name__ == "__main__":
    main()
