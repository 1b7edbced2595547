"""Swap test: does a trained ``evidence: rank`` Conductor's choice move when only its ranking line does?

Why: a Conductor that reads the prompt's evidence should follow the ranking line, and a tiny one
trained on ids was measured not to (its choice did not move with the line). This plans every
question of a split twice with the model's own prompt (per-worker estimates unchanged), once with
its ranking line as fitted and once with the line's first two workers swapped (questions whose
line shows one worker are left out), and reports how often the plan is the line's first worker
alone in each, how often it moved to the new first, how often it was written as a rank address
(``@k``) or by id, and how often it fell back. Planning only: no worker is called.

Usage: ``python benchmarks/rank_swap.py --model runs/mine/final --split validation
--json benchmarks/results/rank_swap.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _results import write_json  # benchmarks/_results.py (scripts run from this folder)

from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import Plan
from rl_conductor.policies.conductor import ConductorPolicy
from rl_conductor.prompting import shown_ranking
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.pool import load_pool


def swapped(order: Sequence[int] | None) -> list[int] | None:
    """``order`` with its first two entries exchanged (None stays None)."""
    if order is None:
        return None
    out = list(order)
    if len(out) > 1:
        out[0], out[1] = out[1], out[0]
    return out


def describe(plans: Sequence[Plan], firsts: Sequence[int]) -> dict[str, float]:
    """Shares of ``plans``: the shown first worker alone, written by rank / by id, fallbacks."""
    n = len(plans)
    alone = [p.workflow.workers() == [f] for p, f in zip(plans, firsts, strict=True)]
    return {
        "first_alone": sum(alone) / n,
        "by_rank": sum(p.workflow.by_rank() for p in plans) / n,
        "at_1": sum(p.workflow.steps[0].rank == 1 for p in plans) / n,
        "fallback": sum(p.fallback for p in plans) / n,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", type=Path, required=True, help="a Conductor folder trained with evidence: rank"
    )
    ap.add_argument("--split", default="validation")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    meta = json.loads((args.model / "conductor.json").read_text())
    if meta.get("evidence") != "rank":
        ap.error(f"{args.model} was not trained with evidence: rank")
    policy = ConductorPolicy(args.model)
    view = load_pool(meta["pool"], seed=0).view()
    tasks = load_tasks(str(meta["dataset"]), split=args.split, limit=args.limit)
    evidence = policy.task_evidence(tasks)
    own = policy.evidence_ranking
    orders = {
        t.id: shown_ranking(own(t, view, RequestLimits(), e)) for t, e in zip(tasks, evidence, strict=True)
    }
    tasks = [t for t in tasks if len(orders[t.id] or []) > 1]
    out: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "model": str(args.model),
        "split": args.split,
        "n": len(tasks),
    }
    plans: dict[str, list[Plan]] = {}
    for name, how in (("as_fitted", lambda o: o), ("swapped", swapped)):
        policy.evidence_ranking = lambda t, v, lim, e, how=how: how(own(t, v, lim, e))  # type: ignore[method-assign]
        plans[name] = policy.plan_batch([(t, view, RequestLimits()) for t in tasks])
        firsts = [how(orders[t.id])[0] for t in tasks]  # type: ignore[index]
        out[name] = describe(plans[name], firsts)
    moved = [
        a.workflow.workers() != b.workflow.workers()
        for a, b in zip(plans["as_fitted"], plans["swapped"], strict=True)
    ]
    followed = [
        a.workflow.workers() == [orders[t.id][0]] and b.workflow.workers() == [orders[t.id][1]]  # type: ignore[index]
        for t, a, b in zip(tasks, plans["as_fitted"], plans["swapped"], strict=True)
    ]
    out["choice_moved"] = sum(moved) / len(tasks)
    out["followed_both"] = sum(followed) / len(tasks)
    print(json.dumps(out, indent=1))
    if args.json:
        write_json(args.json, "rank_swap", out)


if __name__ == "__main__":
    main()
