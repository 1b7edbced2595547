"""Does the evidence rule hold on pools it was not tuned for? Random sub-pools, cost weights and sizes.

Why: ``conductor train --preset recordings`` is meant for recordings of models this project never
saw. The per-question evidence (:mod:`rl_conductor.policies.evidence`) beats the routers on the
two pools it was developed on; a user's pool may have more workers, fewer training questions and
another cost weight, where the per-question signal is weaker than its noise. This benchmark draws
configurations from the recordings the project ships — a random subset of a pool's workers (3 to 6
of gsm8k-six's six; both of routellm-replay's two), a random cost weight, and a random number of
training questions (100, 250 or all) — and scores, per configuration, on the validation and the
test split:

* ``domain-router``: the best mean training reward in the question's domain;
* ``knn``: the kNN router as shipped (similarity-weighted over every training question);
* ``evidence``: the probes alone (``evidence: probe``);
* ``evidence-shrunk``: the probes blended with each worker's domain rate by a weight chosen out of
  fold (``evidence: rank``, the ``recordings`` preset): the ranking line's first id.

Each rule sends every question to one worker; rewards are those of the recorded single-worker
outcomes (the replay pool's, cached). Per configuration it reports the mean test reward and the
paired bootstrap 95 % interval of ``evidence-shrunk`` minus each router.

Usage: ``python benchmarks/evidence_sweep.py --configs 12 --json
benchmarks/results/evidence_sweep.json`` (minutes: the fits; singles and embeddings are cached).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from evidence_rules import _domain_mean
from rich.console import Console
from rich.table import Table

from rl_conductor.policies.evidence import estimated_rewards, fit_evidence
from rl_conductor.policies.knn import cached_embeddings
from rl_conductor.policies.routers import reward_matrix, single_outcomes
from rl_conductor.reward import reward_config
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.validation import DATA_SPLITS as SPLITS
from rl_conductor.workers.pool import load_pool

#: (pool, fewest workers drawn, cost weight range): the ranges span the weights at which the
#: pool's reward-optimal single changes (below: the most accurate worker everywhere; above: the
#: cheapest), where routing is the question
POOLS = (("gsm8k-six", 3, (0.02, 0.6)), ("routellm-replay", 2, (0.15, 0.35)))
TRAIN_SIZES = (100, 250, None)
RULES = ("domain-router", "knn", "evidence", "evidence-shrunk")


def load(pool_name: str) -> dict[str, Any]:
    pool = load_pool(pool_name, seed=0)
    dataset = pool.default_dataset()
    out: dict[str, Any] = {"dataset": dataset}
    for split in SPLITS:
        tasks = load_tasks(dataset, split=split)
        singles = single_outcomes(pool, tasks)
        out[split] = {
            "tasks": tasks,
            "emb": cached_embeddings([t.question for t in tasks]),
            "out": singles,
            "dom": np.array([t.domain for t in tasks]),
        }
        out["names"] = singles.names
    return out


def bootstrap(diff: np.ndarray, n_boot: int = 2000, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(n_boot, len(diff)))
    means = diff[idx].mean(axis=1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def run_config(
    data: dict[str, Any], cols: list[int], weight: float, n_train: int | None, seed: int, plain_too: bool
) -> dict[str, Any]:
    rc = reward_config("cost-aware", cost_weight=weight)
    names = [data["names"][j] for j in cols]
    tr = data["train"]
    rows = np.arange(len(tr["tasks"]))
    if n_train is not None and n_train < len(rows):
        rows = np.sort(np.random.default_rng(seed).choice(rows, n_train, replace=False))
    t_tasks = [tr["tasks"][i] for i in rows]
    t_emb, t_dom = tr["emb"][rows], tr["dom"][rows]
    t_y = tr["out"].correct[np.ix_(rows, cols)]
    t_c = tr["out"].cost[np.ix_(rows, cols)]
    t_r = reward_matrix(tr["out"], rc)[np.ix_(rows, cols)]
    plain = fit_evidence(t_tasks, t_emb, names, t_y, cost=t_c, seed=seed)[0] if plain_too else None
    shrunk, _ = fit_evidence(t_tasks, t_emb, names, t_y, cost=t_c, seed=seed, shrink=True)
    res: dict[str, Any] = {
        "workers": names,
        "cost_weight": weight,
        "n_train": len(rows),
        "alpha": [float(a) for a in np.ravel(shrunk.alpha)],
    }
    for split in ("validation", "test"):
        s = data[split]
        r = reward_matrix(s["out"], rc)[:, cols]
        sims = s["emb"] @ t_emb.T
        w = np.clip(sims, 0, None)
        w = np.where(w.sum(axis=1, keepdims=True) > 0, w, 1.0)
        choice = {
            "domain-router": _domain_mean(t_dom, s["dom"], t_r).argmax(axis=1),
            "knn": (w @ t_r / w.sum(axis=1, keepdims=True)).argmax(axis=1),
            "evidence-shrunk": estimated_rewards(
                shrunk, s["tasks"], shrunk.predict(s["tasks"], s["emb"]), rc
            ).argmax(1),
        }
        if plain is not None:
            est = estimated_rewards(plain, s["tasks"], plain.predict(s["tasks"], s["emb"]), rc)
            choice["evidence"] = est.argmax(axis=1)
        i = np.arange(len(s["tasks"]))
        per = {k: r[i, c] for k, c in choice.items()}
        y = s["out"].correct[:, cols]
        best_single = int(t_r.mean(axis=0).argmax())
        res[split] = {
            "reward": {k: float(v.mean()) for k, v in per.items()},
            "accuracy": {k: float(100 * y[i, c].mean()) for k, c in choice.items()},
            "best_single_reward": float(r[:, best_single].mean()),
            "oracle_reward": float(r.max(axis=1).mean()),
            "shrunk_minus": {
                k: {
                    "mean": float((per["evidence-shrunk"] - per[k]).mean()),
                    "ci95": bootstrap(per["evidence-shrunk"] - per[k]),
                }
                for k in choice
                if k != "evidence-shrunk"
            },
        }
    return res


def _delta(d: dict[str, Any]) -> str:
    lo, hi = d["ci95"]
    return f"{d['mean']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", type=int, default=12, help="configurations drawn (split over the pools)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plain", action="store_true", help="also the unshrunk probes (twice the fits)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rules = RULES if args.plain else tuple(r for r in RULES if r != "evidence")
    rng = np.random.default_rng(args.seed)
    loaded = {name: load(name) for name, _, _ in POOLS}
    configs: list[dict[str, Any]] = []
    for k in range(args.configs):
        name, fewest, (lo, hi) = POOLS[0] if k % 3 != 2 else POOLS[1]  # two of three on the six-model pool
        data = loaded[name]
        n_workers = len(data["names"])
        size = int(rng.integers(fewest, n_workers + 1))
        cols = sorted(int(c) for c in rng.choice(n_workers, size, replace=False))
        weight = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        n_train = TRAIN_SIZES[int(rng.integers(len(TRAIN_SIZES)))]
        res = run_config(data, cols, weight, n_train, seed=args.seed + k, plain_too=args.plain)
        configs.append({"pool": name, **res})
        Console().print(
            f"[{k + 1}/{args.configs}] {name} {res['workers']} w={weight:.3f} n={res['n_train']}: "
            + ", ".join(f"{r} {res['test']['reward'][r]:.4f}" for r in rules)
        )
    table = Table(title="evidence rules on random sub-pools (test reward; Δ = shrunk − router, 95 % CI)")
    for col in ("pool", "workers", "w", "n train", *rules, "Δ domain-router", "Δ knn"):
        table.add_column(col, justify="left" if col in ("pool", "workers") else "right")
    for c in configs:
        t = c["test"]
        table.add_row(
            c["pool"],
            str(len(c["workers"])),
            f"{c['cost_weight']:.3f}",
            str(c["n_train"]),
            *(f"{t['reward'][r]:.4f}" for r in rules),
            *(_delta(t["shrunk_minus"][r]) for r in ("domain-router", "knn")),
        )
    Console().print(table)
    summary = {
        split: {r: float(np.mean([c[split]["reward"][r] for c in configs])) for r in rules}
        for split in ("validation", "test")
    }
    wins = {
        r: int(sum(c["test"]["shrunk_minus"][r]["ci95"][0] > 0 for c in configs))
        for r in rules
        if r != "evidence-shrunk"
    }
    losses = {
        r: int(sum(c["test"]["shrunk_minus"][r]["ci95"][1] < 0 for c in configs))
        for r in rules
        if r != "evidence-shrunk"
    }
    Console().print(
        {"mean reward": summary, "shrunk significantly above": wins, "significantly below": losses}
    )
    if args.json:
        write_json(
            args.json,
            "evidence_sweep",
            {
                "seed": args.seed,
                "configs": configs,
                "mean_reward": summary,
                "significant_wins": wins,
                "significant_losses": losses,
            },
        )


if __name__ == "__main__":
    main()
