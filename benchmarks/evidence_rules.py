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
  first id of the ranking line a ``recordings`` Conductor is shown and trained to copy;
* ``evidence-select`` / ``evidence-select-1se``: the estimator chosen per pool on the training
  split alone among the domain rates, kNN means at several k, the shrunk and the plain probe and
  a stack of them, by out-of-fold training reward (``fit_evidence(select=...)``; ``1se``: the
  simplest within one standard error of the best).

For ``evidence-select`` it also reports, per split, the paired bootstrap 95 % interval of its
reward minus each router's and its accuracy minus the kNN frontier's at its cost (the shipped
kNN router and kNN k=100, each refitted at every weight of ``FRONTIER_WEIGHTS``, with the single
workers: :func:`~rl_conductor.evaluation.frontier.hull_accuracy`).

``--pool`` takes a built-in pool or a pool YAML (a recordings file, ``benchmarks/sim_recordings.py``).

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
from recordings_conductor import paired  # the same paired bootstrap as the recordings benchmark
from rich.console import Console
from rich.table import Table

from rl_conductor.evaluation.frontier import Point, hull_accuracy
from rl_conductor.policies.evidence import (
    CANDIDATES,
    EvidenceModel,
    estimated_rewards,
    fit_evidence,
    one_se_choice,
)
from rl_conductor.policies.knn import cached_embeddings
from rl_conductor.policies.routers import reward_matrix, single_outcomes
from rl_conductor.reward import reward_config
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.validation import DATA_SPLITS as SPLITS
from rl_conductor.workers.pool import load_pool

KS = (5, 10, 20, 50, 100, 200)
#: cost weights the kNN frontier's routers are refitted at
FRONTIER_WEIGHTS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)
#: what ``evidence-select`` is compared with (paired bootstrap intervals)
VERSUS = ("domain-router", "knn-all", "knn-100", "evidence", "evidence-shrunk", "evidence-select-1se",
          "evidence-select-logloss")  # fmt: skip


def _domain_mean(train_dom: np.ndarray, dom: np.ndarray, m: np.ndarray) -> np.ndarray:
    out = np.repeat(m.mean(axis=0)[None], len(dom), axis=0)
    for d in set(dom):
        rows = train_dom == d
        if rows.any():
            out[dom == d] = m[rows].mean(axis=0)
    return out


def knn_rule(tr: dict[str, Any], s: dict[str, Any], r_train: np.ndarray, k: int | None) -> np.ndarray:
    """The kNN router's choice per question of ``s``: the shipped one (``k`` None: similarity-
    weighted mean reward over every training question) or the mean over the ``k`` nearest."""
    sims = s["emb"] @ tr["emb"].T
    if k is None:
        w = np.clip(sims, 0, None)
        w = np.where(w.sum(axis=1, keepdims=True) > 0, w, 1.0)
        return np.asarray((w @ r_train / w.sum(axis=1, keepdims=True)).argmax(axis=1))
    idx = np.argsort(-sims, axis=1, kind="stable")[:, : min(k, sims.shape[1])]
    return np.asarray(r_train[idx].mean(axis=1).argmax(axis=1))


def frontier_gap(
    s: dict[str, Any], choice: np.ndarray, frontier: list[np.ndarray], draws: np.ndarray
) -> dict[str, Any]:
    """Accuracy points of ``choice`` above the hull of the ``frontier`` choices and the singles
    at ``choice``'s mean cost, and its paired bootstrap 95 % interval (same questions per draw)."""
    y, c = s["Y"].astype(float), s["C"]

    def gap(rows: np.ndarray) -> float:
        yy, cc = y[rows], c[rows]
        i = np.arange(len(rows))
        pts = [Point("f", cc[i, ch[rows]].mean(), yy[i, ch[rows]].mean()) for ch in frontier]
        pts += [Point("s", cc[:, j].mean(), yy[:, j].mean()) for j in range(y.shape[1])]
        cost = max(cc[i, choice[rows]].mean(), min(p.cost for p in pts))
        return float(100 * (yy[i, choice[rows]].mean() - hull_accuracy(cost, pts)))

    boots = [gap(d) for d in draws]
    mean = gap(np.arange(len(choice)))
    return {"mean": mean, "ci95": [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]}


def as_chosen(best: EvidenceModel, choice: str, plain: EvidenceModel, shrunk: EvidenceModel) -> EvidenceModel:
    """What ``fit_evidence(select=..., rule=...)`` fits when its rule picks ``choice``, without
    fitting the probes again: that candidate's arrays (the domain rates and neighbour index are
    ``best``'s; the shrunk and the plain probe are the same folds' fits; the stack only ever
    comes from ``best``)."""
    if choice == best.estimator:
        return best
    base = {"shrunk": shrunk, "probe": plain}.get(choice, best)
    if choice == "stack":
        raise ValueError("the stack is fitted only when it is the best; fit with that rule instead")
    return replace(
        base,
        estimator=choice,
        rate=best.rate,
        cost=best.cost,
        knn_emb=best.knn_emb,
        knn_y=best.knn_y,
        selection=best.selection,
        selection_se=best.selection_se,
        selection_logloss=best.selection_logloss,
    )


def reward_matrix_at(tr: dict[str, Any], weight: float, rc: Any) -> np.ndarray:
    """The training split's per-question rewards of every worker at another cost weight."""
    return np.asarray(reward_matrix(tr["out"], reward_config(rc, cost_weight=weight)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", default="routellm-replay")
    ap.add_argument("--dataset", default=None, help="default: the pool's default_dataset")
    ap.add_argument("--cost-weight", type=float, required=True)
    ap.add_argument("--reward-preset", default="cost-aware")
    ap.add_argument("--boot", type=int, default=1000, help="bootstrap draws of the paired intervals")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    pool = load_pool(args.pool, seed=0)
    dataset = args.dataset or pool.default_dataset()
    rc = reward_config(args.reward_preset, cost_weight=args.cost_weight)
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
            "out": out,
            "dom": np.array([t.domain for t in tasks]),
        }
    tr = data["train"]
    model, _ = fit_evidence(tr["tasks"], tr["emb"], names, tr["Y"], cost=tr["C"])
    shrunk, _ = fit_evidence(tr["tasks"], tr["emb"], names, tr["Y"], cost=tr["C"], shrink=True)
    best, _ = fit_evidence(tr["tasks"], tr["emb"], names, tr["Y"], cost=tr["C"], select=rc)
    assert best.selection is not None and best.selection_se is not None and best.selection_logloss is not None
    loss = best.selection_logloss
    selected = {
        "evidence-select": best,
        "evidence-select-1se": as_chosen(
            best, one_se_choice(best.selection, best.selection_se), model, shrunk
        ),
    }
    if min(CANDIDATES, key=loss.__getitem__) == "stack" != best.estimator:  # fit the stack
        selected["evidence-select-logloss"] = fit_evidence(
            tr["tasks"], tr["emb"], names, tr["Y"], cost=tr["C"], select=rc, rule="logloss"
        )[0]
    else:
        selected["evidence-select-logloss"] = as_chosen(
            best, min(CANDIDATES, key=loss.__getitem__), model, shrunk
        )
    estimators: dict[str, EvidenceModel] = {"evidence": model, "evidence-shrunk": shrunk, **selected}

    def rules(split: str) -> dict[str, np.ndarray]:
        s = data[split]
        n = len(s["tasks"])
        out: dict[str, np.ndarray] = {f"single:{w}": np.full(n, j) for j, w in enumerate(names)}
        out["domain-router"] = _domain_mean(tr["dom"], s["dom"], tr["R"]).argmax(axis=1)
        out["knn-all"] = knn_rule(tr, s, tr["R"], None)
        for k in KS:
            out[f"knn-{k}"] = knn_rule(tr, s, tr["R"], k)
        for label, m in estimators.items():
            est = estimated_rewards(m, s["tasks"], m.predict(s["tasks"], s["emb"]), rc)
            out[label] = est.argmax(axis=1)
        y, c = s["Y"], s["C"]
        out["oracle"] = np.where(y.any(axis=1), np.where(y, -c, -np.inf).argmax(axis=1), c.argmin(axis=1))
        return out

    results: dict[str, dict[str, dict[str, float]]] = {}
    versus: dict[str, dict[str, Any]] = {}
    shrunk_versus: dict[str, dict[str, Any]] = {}
    for split in ("validation", "test"):
        s = data[split]
        i = np.arange(len(s["tasks"]))
        chosen = rules(split)
        results[split] = {
            name: {
                "accuracy": float(100 * s["Y"][i, ch].mean()),
                "cost_usd": float(s["C"][i, ch].mean()),
                "reward": float(s["R"][i, ch].mean()),
            }
            for name, ch in chosen.items()
        }
        draws = np.random.default_rng(0).integers(0, len(i), size=(args.boot, len(i)))
        per = {name: s["R"][i, ch] for name, ch in chosen.items()}
        frontier = [
            knn_rule(tr, s, reward_matrix_at(tr, cw, rc), k) for cw in FRONTIER_WEIGHTS for k in (None, 100)
        ]
        versus[split] = {
            "reward_minus": {v: paired(per["evidence-select"], per[v], draws) for v in VERSUS},
            "accuracy_minus_knn_frontier": frontier_gap(s, chosen["evidence-select"], frontier, draws[:300]),
        }
        # the recordings preset's own rule (evidence: rank, the shrunk probe), which its trained
        # Conductor follows: against the two routers fitted at this reward and the shipped kNN
        # router's frontier (k = all, refitted at every weight of FRONTIER_WEIGHTS, with the singles)
        shipped = frontier[::2]  # the k = None half of the frontier above (k alternates None, 100)
        shrunk_versus[split] = {
            "reward_minus": {
                v: paired(per["evidence-shrunk"], per[v], draws) for v in ("knn-all", "domain-router")
            },
            "accuracy_minus_shipped_knn_frontier": frontier_gap(s, chosen["evidence-shrunk"], shipped, draws),
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
    rules = (
        (f"evidence-select ({selected['evidence-select'].estimator})", versus, "knn_frontier"),
        ("evidence-shrunk (the recordings preset's rule)", shrunk_versus, "shipped_knn_frontier"),
    )
    for label, by_split, frontier_key in rules:
        for split, v in by_split.items():
            gap = v[f"accuracy_minus_{frontier_key}"]
            Console().print(
                f"{split}: {label} minus "
                + ", ".join(
                    f"{k} {d['mean']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]"
                    for k, d in v["reward_minus"].items()
                )
                + f"; accuracy - {frontier_key.replace('_', ' ')} {gap['mean']:+.2f} points "
                f"{[round(x, 2) for x in gap['ci95']]}"
            )
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
                "selected": {
                    k: {
                        "estimator": m.estimator,
                        "oof_train_reward": m.selection,
                        "oof_reward_se_vs_best": m.selection_se,
                        "oof_logloss": m.selection_logloss,
                    }
                    for k, m in selected.items()
                },
                "results": results,
                "evidence_select_versus": versus,
                "evidence_shrunk_versus": shrunk_versus,
            },
        )


if __name__ == "__main__":
    main()
