"""How far can the warm start's targets take a Conductor on paper-sim? Targets executed directly,
for several target rules, against the bars of the "Conductor conducts" issue.

Why: the tiny preset's Conductor learns its warm-start targets (``training/warmstart.py``); on
the test split it reproduces them almost exactly. So the accuracy a target *rule* reaches when
its targets are executed directly is the ceiling of the recipe, and comparing rules there (in
seconds, without training) says which bars a trained Conductor can clear at all. A rule is a
training cost weight (the reward the targets maximise), an ``se_rule`` (a composed plan must
beat a simpler one by more than that many paired standard errors) and a neighbourhood
(``warm_group_by``: ``domain``, or ``task``, which also splits a source's task types). The tiny
preset's rule is cost weight 0.03 (the evaluation reward's), ``se_rule`` 0.5 and ``task``,
chosen on the validation split.

Setup: the tiny preset's candidate table on the training split (read from the cache that
``conductor train`` writes, else built: ~2 min), neighbourhoods as the preset sets them; for each
rule the target of each question (full pool, no budget, no deadline; the question's true
neighbourhood, which the trained Conductor must read from the text) is executed on the validation and test
splits through the same executor and grader as every policy; the evaluation reward is the
preset's (cost weight 0.03). Alongside, on the same questions: the domain-router, the kNN router
(its mean reward is a bar) and MoA (half its tokens is a bar), optionally trained Conductors
(``--model DIR``), and, from a candidate table built on the split itself, the best single worker
of the split (the +5 bar's reference) and two hindsight figures: the best single worker per
domain and the best fixed candidate per domain, each chosen *on that split* (what no policy
chosen beforehand can be expected to reach).

Usage: ``python benchmarks/target_ceiling.py --json benchmarks/results/target_ceiling.json``
(``--rules 0.03:0.5:task,0:0.5`` to choose rules, COST_WEIGHT:SE_RULE[:GROUP_BY] with the
preset's grouping by default; ``--model runs/x/final`` to add a trained model).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json  # benchmarks/_results.py (scripts run from this folder)
from rich.console import Console
from rich.progress import track
from rich.table import Table

from rl_conductor.evaluation.runner import evaluate
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import Plan, Policy
from rl_conductor.policies.catalog import make_policy
from rl_conductor.reward import RewardConfig
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.training.candidates import build_table, group_of
from rl_conductor.training.config import TrainConfig, load_preset
from rl_conductor.training.train import warm_start_targets
from rl_conductor.training.warmstart import ExpectedRewards
from rl_conductor.workers.pool import PoolView, load_pool
from rl_conductor.workflow import render


class TargetPolicy(Policy):
    """Executes, for each question, the warm-start target of its true neighbourhood (full pool,
    no limits): the plan a Conductor that learnt its targets perfectly would write."""

    def __init__(self, targets: ExpectedRewards, name: str) -> None:
        self.targets = targets
        self.name = name

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        wf = self.targets.target(task, view.names(), None)
        return Plan(workflow=wf, text=render(wf))


def summary(policy: Policy, view: PoolView, tasks: list[Task], reward: RewardConfig) -> dict[str, Any]:
    res = evaluate(policy, view, tasks, RequestLimits(), progress=False, reward_config=reward)
    s = res.summary()
    return {
        "accuracy": round(100 * s["accuracy"], 2),
        "reward": round(s["mean_reward"], 4),
        "mean_tokens": round(s["mean_tokens"]),
        "mean_cost_usd": round(s["mean_cost_usd"], 5),
        "by_domain": {d: round(100 * v["accuracy"], 1) for d, v in sorted(s["by_domain"].items())},
    }


def hindsight(tasks: list[Task], pool: Any) -> dict[str, Any]:
    """Best single worker and best fixed candidate per domain, chosen on ``tasks`` themselves."""
    table = build_table(tasks, pool)
    done = table.done[:, :, 0]
    correct = np.where(done, table.correct[:, :, 0], np.nan)
    tokens = np.where(done, table.tokens[:, :, 0], np.nan)
    domains = np.array(table.domains)
    singles = [j for j, c in enumerate(table.candidates) if len(c.steps) == 1]
    out: dict[str, Any] = {"by_domain": {}}
    tot = {"single": 0.0, "fixed": 0.0, "fixed_tokens": 0.0}
    for d in sorted(set(domains)):
        rows = domains == d  # never empty: the domains are the table's own
        with np.errstate(invalid="ignore"):  # candidates outside the domain's set: all NaN
            means = np.nan_to_num(np.nanmean(correct[rows], axis=0), nan=-1.0)
        s, f = max(singles, key=lambda j: means[j]), int(np.argmax(means))
        out["by_domain"][d] = {
            "best_single": table.candidates[s].name,
            "best_single_accuracy": round(100 * means[s], 1),
            "best_fixed": table.candidates[f].name,
            "best_fixed_accuracy": round(100 * means[f], 1),
            "best_fixed_tokens": round(float(np.nanmean(tokens[rows, f]))),
        }
        tot["single"] += means[s] * rows.sum()
        tot["fixed"] += means[f] * rows.sum()
        tot["fixed_tokens"] += float(np.nanmean(tokens[rows, f])) * rows.sum()
    n = len(tasks)
    overall = {table.candidates[j].name: float(np.nanmean(correct[:, j])) for j in singles}
    name = max(overall, key=lambda k: (overall[k], k))
    out["best_single_overall"] = {"worker": name.split(":", 1)[1], "accuracy": round(100 * overall[name], 2)}
    out["routing_accuracy"] = round(100 * tot["single"] / n, 2)
    out["fixed_accuracy"] = round(100 * tot["fixed"] / n, 2)
    out["fixed_mean_tokens"] = round(tot["fixed_tokens"] / n)
    return out


def parse_rules(text: str, preset: str, ap: argparse.ArgumentParser) -> list[tuple[str, TrainConfig]]:
    """``COST_WEIGHT:SE_RULE[:GROUP_BY],…`` as (label, the preset with that rule); a malformed,
    invalid (``TrainConfig``'s own checks) or repeated rule is a one-line usage error before
    anything is built."""
    rules: list[tuple[str, TrainConfig]] = []
    for r in text.split(","):
        parts = r.strip().split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError("expected COST_WEIGHT:SE_RULE[:GROUP_BY]")
            over: dict[str, Any] = {"cost_weight": float(parts[0]), "warm_se_rule": float(parts[1])}
            if len(parts) == 3:
                over["warm_group_by"] = parts[2]
            cfg = load_preset(preset, **over)  # ConfigError is a ValueError
        except ValueError as exc:
            ap.error(f"--rules: bad rule {r!r}: {exc}")
        label = f"targets cw={cfg.cost_weight:g} se={cfg.warm_se_rule:g} {cfg.warm_group_by}"
        if any(label == seen for seen, _ in rules):
            ap.error(f"--rules: rule {r!r} is given twice")
        rules.append((label, cfg))
    return rules


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument(
        "--rules",
        default="0.03:0.5:task,0.03:0.5:domain,0.03:0:task,0.02:0.5:task,0.01:0.5:task,0:0.5:task",
        help="comma-separated COST_WEIGHT:SE_RULE[:GROUP_BY] target rules (default grouping: the preset's)",
    )
    ap.add_argument("--splits", default="validation,test")
    ap.add_argument(
        "--model", action="append", default=[], help="a trained Conductor: DIR or LABEL=DIR (repeatable)"
    )
    args = ap.parse_args(argv)

    rules = parse_rules(args.rules, args.preset, ap)
    base = load_preset(args.preset)
    pool = load_pool(base.pool, seed=base.seed)
    view = pool.view()
    dataset = base.dataset or str(pool.options.get("default_dataset", "paper-mix"))
    train = load_tasks(dataset, split="train", limit=base.train_limit, seed=base.seed)
    reward = base.reward()  # the evaluation reward: the preset's cost weight
    splits = {s: load_tasks(dataset, split=s, seed=0) for s in args.splits.split(",")}

    policies: list[tuple[str, Policy, dict[str, Any]]] = []
    for label, cfg in rules:
        targets = warm_start_targets(cfg, train, pool, progress=True)
        first: dict[str, Task] = {}  # one training question per neighbourhood
        for t in train:
            first.setdefault(group_of(t, cfg.warm_group_by), t)
        plans = {g: targets.best(first[g], view.names(), None).name for g in sorted(first)}
        policies.append((label, TargetPolicy(targets, "targets"), {"targets": plans}))
    for spec in ("domain-router", "knn", "moa"):
        policies.append((spec, make_policy(spec, pool, seed=0, dataset=dataset), {}))
    for m in args.model:
        label, _, folder = m.rpartition("=")
        pol = make_policy(f"conductor:{folder}", pool, seed=0, dataset=dataset)
        policies.append((label or f"conductor:{folder}", pol, {}))

    results: dict[str, Any] = {"preset": args.preset, "pool": pool.name, "splits": {}}
    for split, tasks in splits.items():
        rows: dict[str, Any] = {}
        for label, pol, extra in track(policies, description=f"{split}: policies"):
            rows[label] = {**summary(pol, view, tasks, reward), **extra}
        results["splits"][split] = {"n": len(tasks), "policies": rows, "hindsight": hindsight(tasks, pool)}

    console = Console(width=150)
    for split, res in results["splits"].items():
        rows = res["policies"]
        best_single = res["hindsight"]["best_single_overall"]["accuracy"]  # the bar's reference
        knn_reward = rows["knn"]["reward"]
        token_bar = rows["moa"]["mean_tokens"] / 2
        table = Table(
            title=f"{split} (n={res['n']}): bars +5 over the best single ({best_single + 5:.2f} %), "
            f"reward >= kNN ({knn_reward:.4f}), tokens <= MoA/2 ({token_bar:.0f})"
        )
        for col in ("policy", "accuracy %", "vs best single", "reward", "tokens", "cost $", "bars met"):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for label, r in rows.items():
            met = [
                r["accuracy"] >= best_single + 5,
                r["reward"] >= knn_reward,
                r["mean_tokens"] <= token_bar,
            ]
            r["bars_met"] = {"plus5": met[0], "reward_ge_knn": met[1], "tokens_le_half_moa": met[2]}
            table.add_row(
                label,
                f"{r['accuracy']:.2f}",
                f"{r['accuracy'] - best_single:+.2f}",
                f"{r['reward']:.4f}",
                str(r["mean_tokens"]),
                f"{r['mean_cost_usd']:.4f}",
                "".join("Y" if m else "-" for m in met),
            )
        h = res["hindsight"]
        table.add_row(
            "hindsight: best single per domain",
            f"{h['routing_accuracy']:.2f}",
            f"{h['routing_accuracy'] - best_single:+.2f}",
            "",
            "",
            "",
            "",
        )
        table.add_row(
            "hindsight: best fixed per domain",
            f"{h['fixed_accuracy']:.2f}",
            f"{h['fixed_accuracy'] - best_single:+.2f}",
            "",
            str(h["fixed_mean_tokens"]),
            "",
            "",
        )
        console.print(table)
    for label, _, extra in policies:
        if extra:
            console.print(f"{label}: {extra['targets']}")
    if args.json:
        write_json(args.json, "target_ceiling", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
