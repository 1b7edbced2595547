"""The adaptive Conductor on gsm8k-six: two rounds vs the same model in one round, and the baselines.

Issue 22's bar for a Conductor trained to use rounds (``configs/train/gsm8k-six.yaml``,
``training/adaptive.py``): on the test split, at a cost weight where the most accurate model alone
is not reward-optimal, the adaptive Conductor (``max_rounds`` 2) against the same model planning
once (``max_rounds`` 1), the fitted escalation cascade, the kNN and domain routers (fitted at the
same reward on every training question), every single worker and the oracle; the paired 95 %
confidence intervals (normal approximation over the per-question differences) of the accuracy, cost
and reward differences of the adaptive Conductor minus each other policy, two rounds minus one
first; where the second round goes: its share among questions whose first two answers agreed,
disagreed, or where the first plan gave one answer; and how often the Conductor's own first plan
is the fitted cascade's pair and its review decides as the cascade's rule does (keep after
agreement, the cascade's escalation worker after disagreement). For a Conductor trained with
``review_evidence: text`` also how often its review decided as its prompt's estimate line said
(``review_follows_estimate``); ``--also NAME=SPEC`` adds other policies (another trained
Conductor, e.g. ``gsm8k-six``'s or the ``recordings`` preset's) with their paired differences.

Usage::

    python benchmarks/adaptive_conductor.py --model runs/gsm8k-six/final --cost-weight 0.25
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from rl_conductor.evaluation.runner import evaluate
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.catalog import make_policy
from rl_conductor.reward import reward_config
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.pool import load_pool

ROOT = Path(__file__).resolve().parents[1]


def paired_ci(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Mean of ``a - b`` and its normal-approximation 95 % interval."""
    d = a.astype(np.float64) - b.astype(np.float64)
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0
    m = float(d.mean())
    return {"mean": m, "low": m - 1.96 * se, "high": m + 1.96 * se}


def follows_cascade(res: Any, cascade: Any) -> dict[str, Any]:
    """How often ``res``'s first plan is ``cascade``'s pair (in its order), and among those, how
    often its review decided as the cascade's rule (keep after agreement, one step on the
    escalation worker after disagreement)."""
    pair = list(cascade.first)
    same = [r for r in res.records if r.workers[:2] == pair]
    rule = [r.workers == (pair if r.first_agree is not False else [*pair, cascade.escalate]) for r in same]
    return {
        "pair": list(pair),
        "escalate": cascade.escalate,
        "first_plan_is_pair": len(same) / max(len(res.records), 1),
        "reviews_as_rule": float(np.mean(rule)) if rule else None,
        "n_pair": len(same),
    }


class FollowsEstimate:
    """For a Conductor trained with ``review_evidence: text``: records each review's estimate
    (what its prompt's ``Best by estimate:`` line said) so that :meth:`summary` can say how often
    the review decided as the line did (escalate = it added steps)."""

    def __init__(self, conductor: Any) -> None:
        self.estimates: dict[str, bool] = {}
        ev = getattr(conductor, "review_evidence", None)
        if ev is None:
            return
        inner = ev.estimate

        def recorded(request: Any, summary: Any, **kw: Any) -> Any:
            out = inner(request, summary, **kw)
            if out[1] is not None:
                self.estimates[request.task.id] = bool(out[1].escalate and out[2] is not None)
            return out

        ev.estimate = recorded

    def summary(self, res: Any) -> dict[str, Any] | None:
        if not self.estimates:
            return None
        by = {r.task_id: r for r in res.records}
        pairs = [(esc, by[t].rounds > 1) for t, esc in self.estimates.items() if t in by]
        n_esc = sum(e for e, _ in pairs)
        return {
            "reviews_with_estimate": len(pairs),
            "line_says_escalate": n_esc,
            "decided_as_line": float(np.mean([e == d for e, d in pairs])) if pairs else None,
            "escalated_when_line_says_escalate": (
                float(np.mean([d for e, d in pairs if e])) if n_esc else None
            ),
            "escalated_when_line_says_keep": (
                float(np.mean([d for e, d in pairs if not e])) if len(pairs) > n_esc else None
            ),
        }


def differences(a: Any, b: Any) -> dict[str, dict[str, float]]:
    """Paired CIs of ``a`` minus ``b`` (the same questions in the same order)."""
    if [r.task_id for r in a.records] != [r.task_id for r in b.records]:
        raise ValueError("the two evaluations are not on the same questions")
    out = {}
    for key in ("correct", "cost_usd", "reward"):
        x = np.array([getattr(r, key) for r in a.records], dtype=np.float64)
        y = np.array([getattr(r, key) for r in b.records], dtype=np.float64)
        out[key] = paired_ci(x, y)
    return out


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
        "by_domain": {
            d: {
                "n": sum(r.domain == d for r in recs),
                "accuracy": float(np.mean([r.correct for r in recs if r.domain == d])),
                "mean_cost_usd": float(np.mean([r.cost_usd for r in recs if r.domain == d])),
                "multi_round_rate": share([r for r in recs if r.domain == d]),
            }
            for d in sorted({r.domain for r in recs})
        },
        "shapes": s.get("shapes"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="the trained Conductor's folder")
    ap.add_argument("--pool", default="gsm8k-six")
    ap.add_argument("--cost-weight", type=float, default=0.25)
    ap.add_argument("--splits", nargs="+", default=["validation", "test"])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "adaptive_conductor.json")
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="another policy to compare, e.g. 'gsm8k-six Conductor=conductor:runs/gsm8k-six/final' "
        "(evaluated with max_rounds 2; a Conductor trained for one round plans once)",
    )
    ap.add_argument(
        "--no-baselines",
        dest="baselines",
        action="store_false",
        help="only the Conductor (two rounds and one) and the --also policies",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    rc = reward_config("cost-aware", cost_weight=args.cost_weight)
    pool = load_pool(args.pool)
    # the dataset the Conductor was trained for (a built-in pool such as paper-sim names none)
    trained = json.loads((args.model / "conductor.json").read_text())
    dataset = str(trained.get("dataset") or pool.default_dataset())
    view = pool.view()
    kw: dict[str, Any] = {"seed": 0, "dataset": dataset, "reward_config": rc, "fit_limit": None}
    conductor = make_policy(f"conductor:{args.model}", pool, **kw)
    baselines = (
        ["cascade", "knn", "domain-router", "oracle", *(f"single:{n}" for n in pool.names())]
        if args.baselines
        else []
    )
    built = [make_policy(spec, pool, **kw) for spec in baselines]
    also = [(n, make_policy(s, pool, **kw)) for n, _, s in (a.rpartition("=") for a in args.also)]
    follow = FollowsEstimate(conductor)
    result: dict[str, Any] = {"pool": args.pool, "cost_weight": args.cost_weight, "reward": asdict(rc)}
    for split in args.splits:
        tasks = load_tasks(dataset, split=split)
        follow.estimates.clear()
        two = evaluate(conductor, view, tasks, RequestLimits(max_rounds=2), progress=False, reward_config=rc)
        one = evaluate(conductor, view, tasks, RequestLimits(max_rounds=1), progress=False, reward_config=rc)
        rows = [row("conductor (max_rounds 2)", two), row("conductor (max_rounds 1)", one)]
        diffs = {"conductor (max_rounds 1)": differences(two, one)}
        cascade = None
        for spec, pol in zip(baselines, built, strict=True):
            res = evaluate(pol, view, tasks, RequestLimits(max_rounds=2), progress=False, reward_config=rc)
            name = pol.name if spec == "cascade" else spec
            rows.append(row(name, res))
            diffs[name] = differences(two, res)
            if spec == "cascade":
                cascade = pol
        for name, pol in also:
            res = evaluate(pol, view, tasks, RequestLimits(max_rounds=2), progress=False, reward_config=rc)
            rows.append(row(name, res))
            diffs[name] = differences(two, res)
        result[split] = {
            "policies": rows,
            "two_minus": diffs,
            "accuracy_two_minus_one": diffs["conductor (max_rounds 1)"]["correct"],
            "cost_two_minus_one": diffs["conductor (max_rounds 1)"]["cost_usd"],
            "review": follows_cascade(two, cascade) if cascade is not None else None,
            "review_follows_estimate": follow.summary(two),
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
        print("\n| two rounds minus | accuracy, points [95 % CI] | $/question | reward [95 % CI] |")
        print("|---|---:|---:|---:|")
        for name, d in diffs.items():
            a, c, w = d["correct"], d["cost_usd"], d["reward"]
            print(
                f"| {name} | {100 * a['mean']:+.1f} [{100 * a['low']:+.1f}, {100 * a['high']:+.1f}] "
                f"| {c['mean']:+.6f} | {w['mean']:+.4f} [{w['low']:+.4f}, {w['high']:+.4f}] |"
            )
        print("\nby domain (acc % / $ per question / rounds>1 %):")
        for r in rows[:2]:
            cells = [
                f"{d} (n={v['n']}): {pct(v['accuracy'])} / {v['mean_cost_usd']:.6f} "
                f"/ {pct(v['multi_round_rate'])}"
                for d, v in r["by_domain"].items()
            ]
            print(f"  {r['policy']}: " + "; ".join(cells))
        print("review vs the cascade's rule:", result[split]["review"])
        print("review vs its estimate line:", result[split]["review_follows_estimate"])
    result["seconds"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
