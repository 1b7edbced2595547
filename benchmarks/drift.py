"""Drift: after a pool change the closed loop retrains a Conductor that beats the old champion at
the new prices, and the gate promotes it; with no change the gate keeps the champion.

Why: the loop (rl_conductor.loop) is worth having only if it (a) follows a pool change — here
``--worker``'s prices x ``--price-factor`` (gemini-2.5-pro x4), or with ``--degrade`` that
worker's accuracy per domain set to ``--degrade-accuracy`` (an endpoint that got worse: in the
simulated pool file, the worker's ``accuracy``) — and (b) does not churn when nothing changed.
Both are measured with the loop's own steps on ``paper-sim``:

1. a champion: ``--champion DIR`` (a trained paper-sim Conductor; docs/closed-loop.md's figures
   use the ``tiny`` preset exactly as ``make run`` trains it, which clears the gate's floor on
   the unchanged pool), else one trained here from the ``tiny`` preset, smaller
   (``--champion-sft`` SFT examples, 2 GRPO steps, no deadline prompts: a smoke run, below the
   floor); registered and aliased ``champion``;
2. **drift**: ``--requests`` questions (paper-mix train and validation items, shuffled) served by
   the champion through the predictor's service (:class:`ConductorService` with the traffic log
   hooked in, in-process) on the *changed* pool, each with feedback (its gold answer); then
   ``collect_step(only_on_pool_change=True)`` (it must see the change) → ``retrain_step``
   (warm start from the champion, keeping its prompt evidence) → ``gate_step`` on the held-out
   recent traffic + ``--eval-limit`` standing test questions, under the changed pool, against
   the training pipeline's floor (every single worker, domain-router and knn fitted on the
   retrain's training tasks, ``--fit-limit`` of them, 0 = all);
3. **no change**: the original champion again, the same traffic window (or, with
   ``--serve-again``, the same questions served anew on paper-sim), retrained on the unchanged
   pool ``--retrains`` times (seeds 1..N), each gated against the champion of the moment;
   ``--same-only TRAFFIC --seed N`` runs one such retrain on a stored window (one process per
   seed, each with its own ``--out``).

Reports, per retrain: challenger and champion mean reward / accuracy / cost on the same questions,
the paired reward gain with its 95 % CI, the gate's floor (the best single worker or router), the
gate's decision, wall and CPU seconds (this process and its children); and the traffic window's
figures.

Which change: the one that matters is a worker the champion relies on. A re-pricing
(``--price-factor``, gemini-2.5-pro x4 at the cost-aware reward) barely moves the optimum, so no
retrain can win it by a margin a gate can see; ``--degrade`` sets the worker's simulated accuracy
per domain (``--degrade-accuracy``). Which worker to degrade depends on the champion's routing
(the window's ``served_share``): degrading one it rarely calls changes nothing, rightly.

The retrain's size matters as much as the change: a retrain smaller than the champion's own
training (fewer table items, SFT examples or standing training questions) loses reward even with
no change and can fall short of the routers after one. ``--retrain-items``, ``--retrain-sft`` and
``--base-train`` at the champion's own table, step count and training split are the full size.

Simplifications: the simulated pool answers a served request (no gold) with a placeholder, so the
served answers earn nothing and the feedback grades them wrong: the retraining reads the
questions, re-executed as their paper-mix items (what a live pool's response cache would replay);
the simulation cannot reward good instructions. One GRPO step per retrain (it only polishes at
this size).

Usage (docs/closed-loop.md's figures: the full-size retrain after gemini-2.5-pro degraded, and
the no-change retrains at the same size)::

    A="--champion DIR --retrain-items 500 --retrain-sft 4800 --base-train 1671 --eval-limit 300 --fit-limit 0"
    nice python benchmarks/drift.py --out /tmp/drift-gem --requests 100 --retrains 0 \
        --worker gemini-2.5-pro --degrade $A --json drift-gem.json
    nice python benchmarks/drift.py --out /tmp/same1 --same-only /tmp/drift-gem/traffic-drift \
        --seed 1 $A --json same1.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_json

COMMON: dict[str, Any] = {
    "deadline_fraction": 0.0,
    # one small GRPO step: at this size GRPO only polishes (configs/train/tiny.yaml), and a step of
    # 32 rollouts took ~250 s on the loaded machine
    "grpo_steps": 1,
    "prompts_per_step": 2,
    "num_generations": 4,
    "torch_threads": 1,
    "logging_steps": 1,
    "save_steps": 1000,
    "time_limit_s": 900,
}


def _changed_pool(out: Path, worker: str, factor: float, degrade: dict[str, float] | None) -> str:
    from rl_conductor.workers.pool import load_pool_config

    cfg = load_pool_config("paper-sim")
    for w in cfg["workers"]:
        if w["name"] == worker:
            if degrade:
                w["accuracy"] = dict(degrade)
            else:
                w["price_in"] = round(float(w["price_in"]) * factor, 6)
                w["price_out"] = round(float(w["price_out"]) * factor, 6)
            break
    else:
        raise SystemExit(f"paper-sim has no worker {worker!r}")
    cfg["name"] = "paper-sim"  # same pool, changed worker (the file is what changed)
    what = "degraded" if degrade else f"x{factor:g}"
    path = out / f"paper-sim-{worker}-{what}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(path)


def _champion(out: Path, sft: int, items: int, model_name: str, reuse: Path | None) -> tuple[str, float]:
    from rl_conductor.serving.pyfunc import MODEL_CODE
    from rl_conductor.tracking import registry
    from rl_conductor.training.config import load_preset
    from rl_conductor.training.train import train

    t = time.perf_counter()
    if reuse is not None:
        final = reuse
    else:
        cfg = load_preset("tiny", **COMMON, sft_examples=sft, warm_items_per_domain=items)
        final = train(cfg, out / "champion-train", progress=False).final_dir
    mv = registry.log_conductor_model(
        final, model_code=MODEL_CODE, name=model_name, alias=registry.CHALLENGER
    )
    registry.promote(model_name, mv.version)
    return str(final), time.perf_counter() - t


async def _serve(champion_dir: str, pool: str, store: str, questions: list[Any]) -> dict[str, Any]:
    """Serve ``questions`` through the predictor's service with the traffic log, then feedback."""
    from rl_conductor.loop.feedback import Feedback, gold_feedback, parse_feedback
    from rl_conductor.loop.traffic import TrafficConfig, TrafficLog
    from rl_conductor.serving.request import ConductorRequest
    from rl_conductor.serving.service import ConductorService, load_policy
    from rl_conductor.workers.pool import load_pool

    p = load_pool(pool)
    service = ConductorService(load_policy(champion_dir, None, p), p)
    log = TrafficLog(TrafficConfig(store=store, batch_size=100, flush_interval_s=1.0))
    service.on_answered.append(log.submit)
    t, cpu = time.perf_counter(), _cpu()
    docs = []
    for i in range(0, len(questions), 16):  # 16 in flight: the planner batches them
        chunk = questions[i : i + 16]
        docs += await asyncio.gather(*(service.answer(ConductorRequest(question=q.question)) for q in chunk))
        await asyncio.sleep(0.002)  # distinct request times (the holdout is the latest)
    served_s = time.perf_counter() - t
    log.flush()
    fb = Feedback(log)
    for task, doc in zip(questions, docs, strict=True):
        await asyncio.to_thread(fb.submit, parse_feedback(gold_feedback(doc["request_id"], task)))
    log.close()
    return {
        "requests": len(docs),
        "served_s": served_s,
        "requests_per_s": len(docs) / served_s,
        "cpu_s": _cpu() - cpu,
    }


def _retrain(
    out: Path,
    store: str,
    pool: str,
    model_name: str,
    *,
    seed: int,
    sft: int,
    items: int,
    only_on_change: bool,
    eval_limit: int,
    base_train: int,
    lr: float,
    fit_limit: int,
) -> dict[str, Any]:
    from rl_conductor.loop import retrain

    folder = out / f"retrain-{Path(store).name}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {k: str(folder / f"{k}.jsonl") for k in ("train", "holdout", "test")}
    paths["champion"] = str(folder / "champion")
    t0, c0 = time.perf_counter(), _cpu()
    collected = retrain.collect_step(
        traffic_store=store,
        outputs=paths,
        pool=pool,
        model_name=model_name,
        eval_limit=eval_limit,
        base_train_limit=base_train,
        only_on_pool_change=only_on_change,
        seed=0,
        run_tag=folder.name,
    )
    row: dict[str, Any] = {
        "seed": seed,
        "should_train": collected.should_train,
        "trigger": collected.reason,
        "champion_before": collected.champion_version,
        "traffic": collected.summary,
        "served_share": collected.worker_share,
    }
    if not collected.should_train:
        return row
    trained = retrain.retrain_step(
        train_path=paths["train"],
        champion_dir=paths["champion"],
        model_dir=str(folder / "challenger"),
        preset="tiny",
        pool=pool,
        overrides={
            **COMMON,
            "sft_examples": sft,
            "warm_items_per_domain": items,
            "sft_epochs": 1.0,
            "sft_learning_rate": lr,
            "evidence": _champion_evidence(paths["champion"]),
        },
        seed=seed,
        run_tag=folder.name,
    )
    t1, c1 = time.perf_counter(), _cpu()
    gated = retrain.gate_step(
        challenger_dir=str(folder / "challenger"),
        champion_dir=paths["champion"],
        holdout_path=paths["holdout"],
        test_path=paths["test"],
        pool=pool,
        model_name=model_name,
        champion_version=collected.champion_version,
        seed=0,
        run_tag=folder.name,
        reason=collected.reason,
        train_path=paths["train"],
        fit_limit=fit_limit or None,
    )
    row |= {
        "train_s": t1 - t0,
        "gate_s": time.perf_counter() - t1,
        "train_cpu_s": c1 - c0,
        "gate_cpu_s": _cpu() - c1,
        "n_train": collected.n_train,
        "floor": gated.challenger.get("baseline_policy")
        or {k: v for k, v in gated.challenger.items() if k.startswith("baseline")},
        "global_step": trained.global_step,
        "n_compared": gated.n,
        "challenger": gated.challenger,
        "champion": gated.champion_metrics,
        "reward_gain": gated.reward_gain,
        "ci95": [gated.ci_low, gated.ci_high],
        "promoted": gated.promoted,
        "gate_reason": gated.reason,
        "version": gated.version,
        "champion_after": gated.champion,
    }
    return row


def _champion_evidence(champion_dir: str) -> str:
    """The champion's prompt evidence: a warm start keeps the prompt it was trained on."""
    meta = json.loads((Path(champion_dir) / "conductor.json").read_text())
    return str(meta.get("evidence", "none"))


def _line(r: dict[str, Any]) -> str:
    if not r["should_train"]:
        return f"  no retrain: {r['trigger']}"
    c, k = r["challenger"], r["champion"]

    def fig(m: dict[str, Any]) -> str:
        return f"{m['mean_reward']:.4f} ({100 * m['accuracy']:.1f} %, ${m['mean_cost_usd']:.5f})"

    lo, hi = r["ci95"]
    verdict = "PROMOTED" if r["promoted"] else "kept"
    return (
        f"  challenger {fig(c)} vs champion {fig(k)}; gain {r['reward_gain']:+.4f} "
        f"CI [{lo:+.4f}, {hi:+.4f}] n={r['n_compared']} -> {verdict}: {r['gate_reason']}"
    )


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the table's workers, graders)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="work folder (MLflow sqlite, models, traffic)")
    ap.add_argument("--requests", type=int, default=600, help="served requests per scenario")
    ap.add_argument("--worker", default="gemini-2.5-pro")
    ap.add_argument("--price-factor", type=float, default=4.0)
    ap.add_argument("--degrade", action="store_true", help="change --worker's accuracy, not its prices")
    ap.add_argument(
        "--degrade-accuracy",
        default="math=0.30,knowledge=0.40,reasoning=0.12,code=0.08",
        help="the degraded worker's accuracy per domain (with --degrade)",
    )
    ap.add_argument(
        "--base-train", type=int, default=0, help="standing training questions added to the traffic's"
    )
    ap.add_argument("--retrain-lr", type=float, default=3e-3, help="SFT learning rate of each retrain")
    ap.add_argument("--fit-limit", type=int, default=0, help="training tasks the gate's routers fit on")
    ap.add_argument("--retrains", type=int, default=3, help="retrains without a pool change")
    ap.add_argument("--champion-sft", type=int, default=1200, help="SFT examples of the champion")
    ap.add_argument("--retrain-sft", type=int, default=800, help="SFT examples of each retrain")
    ap.add_argument("--eval-limit", type=int, default=300, help="standing test questions compared on")
    ap.add_argument(
        "--champion-items", type=int, default=80, help="warm-start table items per domain (champion)"
    )
    ap.add_argument(
        "--retrain-items", type=int, default=40, help="warm-start table items per domain (retrains)"
    )
    ap.add_argument("--champion", type=Path, default=None, help="reuse a trained champion folder")
    ap.add_argument(
        "--serve-again",
        action="store_true",
        help="serve the no-change scenario's requests anew on paper-sim (default: reuse the drift traffic)",
    )
    ap.add_argument(
        "--same-only",
        type=Path,
        default=None,
        metavar="TRAFFIC",
        help="run only no-change retrain --seed on this traffic store (parallel runs, each its own --out)",
    )
    ap.add_argument("--seed", type=int, default=1, help="the retrain's seed with --same-only")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("CONDUCTOR_HOME", str(out))
    logging.getLogger("rl_conductor").setLevel(logging.WARNING)
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.tracking import mlflow_utils

    # every step configures MLflow from the environment (steps.mlflow_tracking): point it here
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{out / 'mlflow.db'}"
    mlflow_utils.configure()
    model_name = "conductor-drift"
    t0 = time.perf_counter()
    champion_dir, champion_s = _champion(
        out, args.champion_sft, args.champion_items, model_name, args.champion
    )
    print(f"champion trained in {champion_s:.0f} s: {champion_dir}", flush=True)

    def retrain(store: str, pool: str, *, seed: int, only_on_change: bool) -> dict[str, Any]:
        """One retrain of this run's champion at the command line's retrain sizes."""
        return _retrain(
            out,
            store,
            pool,
            model_name,
            seed=seed,
            sft=args.retrain_sft,
            items=args.retrain_items,
            only_on_change=only_on_change,
            eval_limit=args.eval_limit,
            base_train=args.base_train,
            lr=args.retrain_lr,
            fit_limit=args.fit_limit,
        )

    if args.same_only is not None:  # one no-change retrain against this champion
        row = retrain(str(args.same_only), "paper-sim", seed=args.seed, only_on_change=False)
        print(f"no-change retrain {args.seed}:\n" + _line(row), flush=True)
        if args.json:
            write_json(args.json, "drift-same", {"config": {"seed": args.seed}, "same": [row]})
        return
    items = load_tasks("paper-mix", "train") + load_tasks("paper-mix", "validation")
    random.Random(0).shuffle(items)
    degrade = (
        {k: float(v) for k, v in (kv.split("=") for kv in args.degrade_accuracy.split(","))}
        if args.degrade
        else None
    )
    changed = _changed_pool(out, args.worker, args.price_factor, degrade)
    results: dict[str, Any] = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    }
    results["champion_train_s"] = champion_s
    # drift: serve on the re-priced pool, retrain only because the pool changed
    store = str(out / "traffic-drift")
    results["drift_serving"] = asyncio.run(_serve(champion_dir, changed, store, items[: args.requests]))
    print(f"drift: served {results['drift_serving']}", flush=True)
    drift = retrain(store, changed, seed=1, only_on_change=True)
    print("drift retrain:\n" + _line(drift), flush=True)
    results["drift"] = drift
    # no change: a fresh champion of the old world (the one just trained), served on paper-sim
    from rl_conductor.tracking import registry

    first = 1
    registry.promote(model_name, first)
    if args.serve_again:
        store = str(out / "traffic-same")
        results["same_serving"] = asyncio.run(
            _serve(champion_dir, "paper-sim", store, items[: args.requests])
        )
    # else: the drift scenario's served questions again (what the retrain reads of them are the
    # questions and their feedback; their recorded costs are not used), on the unchanged pool
    results["same"] = []
    for seed in range(1, args.retrains + 1):
        row = retrain(store, "paper-sim", seed=seed, only_on_change=False)
        print(f"no-change retrain {seed}:\n" + _line(row), flush=True)
        results["same"].append(row)
    results["churn"] = sum(bool(r.get("promoted")) for r in results["same"])
    results["total_s"] = time.perf_counter() - t0
    results["total_cpu_s"] = _cpu()
    print(json.dumps({"drift_promoted": drift.get("promoted"), "churn": results["churn"]}))
    if args.json:
        write_json(args.json, "drift", results)


if __name__ == "__main__":
    main()
