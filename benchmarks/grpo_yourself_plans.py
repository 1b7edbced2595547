"""A short GRPO run on paper-sim that counts "yourself-only" plans (issue 7, finding 1).

Before the fix, training ran with ``recursion_depth=0`` but the reward parsed the "yourself" id
(the pool size) as valid and the executor turned it into a free step, so ``model_id = [7]`` (no
worker called, $0) earned the format bonus and beat a real wrong plan. This script trains the
tiny Conductor for a few steps with the fixed reward and records every GRPO completion the
reward scores: how many parse, how many name the Conductor itself at all, how many name only
it, and the mean reward of each kind. With the fix a "yourself" plan is unparseable (reward 0),
so GRPO has no reason to produce one. Writes JSON (default
``benchmarks/results/grpo_yourself_plans.json``).

Usage::

    python benchmarks/grpo_yourself_plans.py --out-dir /tmp/yourself --grpo-steps 8
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from rl_conductor.training import rewards as rewards_module
from rl_conductor.training.config import load_preset
from rl_conductor.training.train import train
from rl_conductor.workflow import ParseError, parse

ROOT = Path(__file__).resolve().parents[1]


def classify(text: str, pool_size: int, max_steps: int) -> str:
    """``unparseable`` / ``yourself-only`` / ``with-yourself`` / ``workers-only`` (recursion allowed
    here only to recognise the id; the reward itself rejects it)."""
    try:
        wf = parse(text, pool_size=pool_size, max_steps=max_steps, allow_recursion=True)
    except ParseError:
        return "unparseable"
    me = [s.worker == pool_size for s in wf.steps]
    if all(me):
        return "yourself-only"
    return "with-yourself" if any(me) else "workers-only"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, required=True, help="training output folder")
    ap.add_argument("--grpo-steps", type=int, default=8)
    ap.add_argument("--sft-examples", type=int, default=512)
    ap.add_argument("--sft-targets", default="random", help="random (the path that had yourself steps)")
    ap.add_argument("--max-steps", type=int, default=2, help="steps per workflow (short plans fit 72 tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "grpo_yourself_plans.json")
    args = ap.parse_args()

    seen: list[dict[str, Any]] = []
    original = rewards_module.ConductorReward.score

    async def recording(self: Any, text: str, task: Any, view_idx: Any, budget: Any) -> dict[str, float]:
        res = await original(self, text, task, view_idx, budget)
        kind = classify(text, len(view_idx), self.base_limits.max_steps)
        seen.append({"kind": kind, "reward": res["reward"], "batch": len(self.history)})
        return res

    rewards_module.ConductorReward.score = recording  # type: ignore[method-assign]
    overrides: dict[str, Any] = {
        "seed": args.seed,
        "sft_examples": args.sft_examples,
        "sft_targets": args.sft_targets,
        "grpo_steps": args.grpo_steps,
        "max_steps_per_workflow": args.max_steps,
        "save_steps": max(args.grpo_steps, 1),
        "torch_threads": 1,
        "mlflow_tracking_uri": f"sqlite:///{args.out_dir.resolve() / 'mlflow.db'}",
    }
    config = load_preset("tiny", **overrides)
    t0 = time.perf_counter()
    train(config, args.out_dir / "run", progress=False)
    seconds = time.perf_counter() - t0

    kinds = ("workers-only", "with-yourself", "yourself-only", "unparseable")
    counts: dict[str, int] = defaultdict(int)
    reward_sum: dict[str, float] = defaultdict(float)
    for s in seen:
        counts[s["kind"]] += 1
        reward_sum[s["kind"]] += s["reward"]
    n = len(seen)
    half = n // 2
    result = {
        "config": {k: v for k, v in overrides.items() if k != "mlflow_tracking_uri"},
        "completions": n,
        "share": {k: counts[k] / n if n else 0.0 for k in kinds},
        "mean_reward": {k: reward_sum[k] / counts[k] if counts[k] else None for k in kinds},
        "yourself_only_first_half": sum(s["kind"] == "yourself-only" for s in seen[:half]) / max(half, 1),
        "yourself_only_second_half": sum(s["kind"] == "yourself-only" for s in seen[half:])
        / max(n - half, 1),
        "seconds": seconds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
