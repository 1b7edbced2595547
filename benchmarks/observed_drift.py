"""Score-only feedback under drift: which served workflows the warm start's rule teaches.

Why: a score without a gold answer trains only through the observed path
(:mod:`rl_conductor.training.observed`): the executed workflow is an SFT target for its question
iff its observed reward is at least the warm-start table's expected reward for that prompt. This
measures what that rule does to the retrain's SFT data when a worker the champion relies on
degrades, without training anything: the same served requests (same questions, same workflows)
scored on the unchanged ``paper-sim`` and on ``paper-sim`` with ``--worker``'s accuracy degraded
(benchmarks/drift.py's ``--degrade`` change), each judged against the table built on that pool.

Served workflows: a worker alone per request, drawn from ``--mix`` (default: the served shares
of docs/closed-loop.md's tiny champion on the drift window, rounded: gemini-2.5-pro 64 %,
qwen3-32b-thinking 20 %, gpt-5 15 %, deepseek-r1-distill-qwen-32b 1 %), executed through the
real executor on the pool as its paper-mix item. The score is the executed answer's grade (a
user who can tell a right answer from a wrong one: 1 or 0). The questions are paper-mix
training items outside the table's, so each has a neighbourhood (its domain and source).

Reports, per pool: per worker, the requests served, their mean score and the share taught; the
share of the taught examples per worker (what the SFT data adds); and, paired per request, the
change in "taught" from the unchanged to the degraded pool for the degraded worker's requests
and for the others, with 95 % CIs (normal approximation, ``loop.retrain.paired_gain``).

Usage::

    nice python benchmarks/observed_drift.py --requests 400 --items 40 \
        --json benchmarks/results/observed_drift.json
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_json

MIX = "gemini-2.5-pro=0.64,qwen3-32b-thinking=0.20,gpt-5=0.15,deepseek-r1-distill-qwen-32b=0.01"


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _judged(pool_path: str, served: list[tuple[Any, str]], items: int, cache: Path) -> dict[str, Any]:
    """Execute each (item, worker) alone on the pool, score it by its grade and judge it
    against the table built on the same pool; returns the decisions and the figures."""
    from rl_conductor.limits import RequestLimits
    from rl_conductor.reward import grade_trace, reward_config
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.candidates import execute_workflows, single
    from rl_conductor.training.config import load_preset
    from rl_conductor.training.observed import Observed, judge
    from rl_conductor.training.train import warm_start_targets
    from rl_conductor.workers.pool import load_pool

    cfg = load_preset(
        "tiny", pool=pool_path, warm_items_per_domain=items, deadline_fraction=0.0, warm_cache_dir=str(cache)
    )
    pool = load_pool(pool_path, seed=0)
    targets = warm_start_targets(cfg, load_tasks("paper-mix", split="train"), pool)
    view = pool.view()
    names = view.names()
    traces = execute_workflows([(t, single(w).workflow(names), RequestLimits()) for t, w in served], view)
    observed = [
        Observed(
            request_id=f"r{i}",
            question=t.question,
            workflow=(
                {"worker": w, "instruction": "Solve step by step; give the final answer.", "access": []},
            ),
            score=float(grade_trace(t, tr)),
            cost_usd=tr.cost_usd,
            called=bool(tr.attempts),
            task_id=t.id,
            domain=t.domain,
            source=t.source,
            metadata=dict(t.metadata),
        )
        for i, ((t, w), tr) in enumerate(zip(served, traces, strict=True))
    ]
    rc = reward_config(cfg.reward_preset, cost_weight=cfg.cost_weight, cost_scale=cfg.cost_scale)
    decisions = judge(observed, names, targets, rc, max_steps=cfg.max_steps_per_workflow)
    per_worker: dict[str, dict[str, float]] = {}
    for w in sorted({w for _, w in served}):
        mine = [d for d, (_, ww) in zip(decisions, served, strict=True) if ww == w]
        per_worker[w] = {
            "served": len(mine),
            "mean_score": sum(d.example.score for d in mine) / len(mine),
            "taught_share": sum(d.taught for d in mine) / len(mine),
        }
    taught = Counter(w for d, (_, w) in zip(decisions, served, strict=True) if d.taught)
    n_taught = sum(taught.values())
    return {
        "decisions": decisions,
        "per_worker": per_worker,
        "taught": n_taught,
        "taught_composition": {w: taught[w] / n_taught for w in sorted(taught)} if n_taught else {},
        "mean_score": sum(d.example.score for d in decisions) / len(decisions),
        "mean_reward": sum(d.reward for d in decisions) / len(decisions),
        "mean_baseline": sum(d.baseline or 0.0 for d in decisions) / len(decisions),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--items", type=int, default=40, help="warm-start table items per domain")
    ap.add_argument("--worker", default="gemini-2.5-pro")
    ap.add_argument("--degrade-accuracy", default="math=0.30,knowledge=0.40,reasoning=0.12,code=0.08")
    ap.add_argument("--mix", default=MIX, help="worker=share,... of the served single-worker workflows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from drift import _changed_pool

    from rl_conductor.loop.retrain import paired_gain
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.candidates import select_items

    t0, c0 = time.perf_counter(), _cpu()
    mix = {w: float(p) for w, p in (kv.split("=") for kv in args.mix.split(","))}
    degrade = {k: float(v) for k, v in (kv.split("=") for kv in args.degrade_accuracy.split(","))}
    tasks = load_tasks("paper-mix", split="train")
    in_table = {t.id for t in select_items(tasks, args.items)}
    rng = random.Random(args.seed)
    pool_items = [t for t in tasks if t.id not in in_table]
    questions = rng.sample(pool_items, min(args.requests, len(pool_items)))
    served = [(t, rng.choices(list(mix), weights=list(mix.values()))[0]) for t in questions]
    with tempfile.TemporaryDirectory(prefix="observed-drift-") as tmp:
        out = Path(tmp)
        pools = {"unchanged": "paper-sim", "degraded": _changed_pool(out, args.worker, 1.0, degrade)}
        results = {name: _judged(path, served, args.items, out / name) for name, path in pools.items()}
    before, after = (results[k]["decisions"] for k in ("unchanged", "degraded"))
    paired: dict[str, Any] = {}
    for label, pick in (
        (args.worker, lambda w: w == args.worker),
        ("other workers", lambda w: w != args.worker),
    ):
        rows = [k for k, (_, w) in enumerate(served) if pick(w)]
        if len(rows) > 1:
            mean, low, high = paired_gain(
                [float(after[k].taught) for k in rows], [float(before[k].taught) for k in rows]
            )
            paired[label] = {"n": len(rows), "taught_change": mean, "ci_low": low, "ci_high": high}
    report = {
        "requests": len(served),
        "items_per_domain": args.items,
        "worker": args.worker,
        "degrade_accuracy": degrade,
        "mix": mix,
        "seed": args.seed,
        "pools": {k: {kk: vv for kk, vv in v.items() if kk != "decisions"} for k, v in results.items()},
        "paired_taught_change": paired,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": _cpu() - c0,
    }
    for name, r in report["pools"].items():
        print(f"{name}: taught {r['taught']}/{len(served)}, mean score {r['mean_score']:.3f}")
        for w, f in r["per_worker"].items():
            print(f"  {w}: n={f['served']} score {f['mean_score']:.3f} taught {f['taught_share']:.3f}")
        print(f"  taught composition {r['taught_composition']}")
    for label, p in paired.items():
        print(
            f"taught change ({label}, n={p['n']}): {p['taught_change']:+.3f} "
            f"[{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]"
        )
    print(f"{report['cpu_s']:.0f} CPU-s, {report['wall_s']:.0f} s wall")
    if args.json:
        write_json(args.json, "observed_drift", report)


if __name__ == "__main__":
    main()
