"""What a trained Conductor's warm-start targets are worth on held-out questions, without its LM.

Why: a Conductor that loses to a baseline loses either because it does not write its targets (the
fit of ``training/sft_fit.py`` measures that on training prompts) or because the targets
themselves lose. This script separates the two: it rebuilds the targets of a trained folder's
recipe (its ``conductor.json`` ``train_config``: the candidate and rounds tables from the cache,
the review rule, the first-plan lookup) and runs them as a policy on the validation and test
questions: each question's first plan is the lookup's for it (its group's, or its nearest
training questions' where the recipe chose neighbourhoods: :class:`rl_conductor.policies.
plan_hint.PlanHint`), and the review decides as the rule the targets follow (the text rule fitted
on every training question, or the agreement rule). It scores the fitted fixed cascade
``cascade:all`` on the same questions at the same reward, question by question.

Measured with it (stop 48): on the latent-difficulty file the targets of ``recordings-text`` lost
to ``cascade:all`` on both splits and the trained model scored like its targets; the cause was a
pair's continuations, which the text rule saw only where every domain shared them
(``training/adaptive.py`` ``build_rounds_table``).

The targets are rebuilt with the code checked out, not the code the folder was trained with: to
measure the targets an older model learnt, run the script at that model's commit.

Usage: ``python benchmarks/warm_targets.py RUN_DIR/final --out results.json`` with the
``CONDUCTOR_HOME`` the folder was trained with (its caches: minutes on a replay pool; without
them the tables are rebuilt, which on a live pool calls its workers).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from _results import write_json  # benchmarks/_results.py (scripts run from this folder)

from rl_conductor.evaluation.runner import evaluate
from rl_conductor.executor import Continuation, RoundRequest
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import Plan, Policy
from rl_conductor.policies.catalog import make_policy
from rl_conductor.policies.knn import cached_embeddings
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.training.adaptive import rule_hook
from rl_conductor.training.config import TrainConfig
from rl_conductor.training.review_text import text_hook
from rl_conductor.training.train import _warm_start
from rl_conductor.workers.pool import PoolView, load_pool


class Targets(Policy):
    """The warm start's first plan for each question and the review rule its targets follow."""

    name = "targets"

    def __init__(self, hint: Any, review: Any, embeddings: dict[str, Any]) -> None:
        self.hint, self.hook, self.embeddings = hint, review, embeddings
        self.chosen: Counter[tuple[str, str]] = Counter()

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        c = self.hint.plan(task, view, limits, self.embeddings.get(task.id))
        self.chosen[(task.domain, c.name)] += 1
        return Plan(workflow=c.workflow(view.names()), text=c.name)

    async def review(self, request: RoundRequest) -> Continuation | None:
        return await self.hook(request)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a trained Conductor folder (its conductor.json)")
    ap.add_argument("--splits", default="validation,test")
    ap.add_argument("--baseline", default="cascade:all", help="the policy compared question by question")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    meta_path = Path(args.model) / "conductor.json"
    if not meta_path.is_file():
        raise SystemExit(f"{args.model}: no conductor.json here; give a trained Conductor folder (RUN/final)")
    meta = json.loads(meta_path.read_text())
    doc = dict(meta["train_config"])
    doc.pop("show_kind", None)
    cfg = TrainConfig.from_dict(doc)
    if cfg.max_rounds < 2 or cfg.sft_targets != "expected-best":
        raise SystemExit(
            f"{args.model}: this script measures a two-round recipe with expected-best targets "
            f"(max_rounds {cfg.max_rounds}, sft_targets {cfg.sft_targets})"
        )
    pool = load_pool(cfg.pool, seed=cfg.seed)
    dataset = cfg.dataset or pool.default_dataset()
    rc = cfg.reward()
    # built first: a bad spec fails in seconds, before minutes of tables; fitted on the folder's data
    baseline = make_policy(args.baseline, pool, seed=cfg.seed, reward_config=rc, dataset=dataset)
    texts: list[Any] = []
    hints: list[Any] = []
    train = load_tasks(dataset, split="train", limit=cfg.train_limit, seed=cfg.seed)  # as training read it
    _, _, _, rule = _warm_start(cfg, train, pool, text_rule=texts, plan_hint=hints)
    review = (
        text_hook(texts[0], max_question_chars=cfg.max_question_chars, out_of_fold=False)
        if texts
        else rule_hook(rule, max_question_chars=cfg.max_question_chars)
    )
    results: dict[str, Any] = {
        "model": str(args.model),
        "pool": pool.name,
        "reward": rc.to_dict(),
        "splits": {},
    }
    for split in args.splits.split(","):
        tasks = load_tasks(dataset, split=split, seed=cfg.seed)
        emb = dict(zip([t.id for t in tasks], cached_embeddings([t.question for t in tasks]), strict=True))
        targets = Targets(hints[0], review, emb)
        limits = RequestLimits(max_steps=cfg.max_steps_per_workflow, max_rounds=2)
        rows: dict[str, Any] = {}
        per_q: dict[str, np.ndarray] = {}
        for pol in (targets, baseline):
            recs = evaluate(pol, pool.view(), tasks, limits, reward_config=rc, progress=False).records
            per_q[pol.name] = np.array([r.reward for r in recs])
            rows[pol.name] = {
                "n": len(recs),
                "accuracy": float(np.mean([r.correct for r in recs])),
                "mean_cost_usd": float(np.mean([r.cost_usd for r in recs])),
                "mean_reward": float(per_q[pol.name].mean()),
                "by_domain": {
                    d: float(np.mean([r.reward for r in recs if r.domain == d]))
                    for d in sorted({r.domain for r in recs})
                },
            }
        diff = per_q["targets"] - per_q[baseline.name]
        rows["targets_minus_baseline"] = {
            "mean": float(diff.mean()),
            "se": float(diff.std(ddof=1) / np.sqrt(len(diff))),
        }
        rows["first_plans"] = {f"{d} {n}": c for (d, n), c in sorted(targets.chosen.items())}
        results["splits"][split] = rows
        print(split, json.dumps({k: v for k, v in rows.items() if k != "first_plans"}, indent=1))
    write_json(args.out, "warm_targets", results)


if __name__ == "__main__":
    main()
