"""A many-model, multi-domain recordings file for developing evidence estimators, made by the simulator.

Why: the evidence estimator (:mod:`rl_conductor.policies.evidence`) was developed on two pools of
real recordings with one or two domains (``gsm8k-six``, ``routellm-replay``). The pool it lost on
(issue 21: eleven models, three benchmarks) is many workers over several domains, where a
worker's rate on the question's domain is most of what is knowable. The project ships no such
recordings, but its simulator (``paper-sim``: seven workers, four domains, the ``paper-mix``
questions) draws each outcome from the worker's domain skill and a hash of the item id, so on its
recordings the domain table is what a good estimator should find. This script records every
simulated worker alone on every item (``single_outcomes``, with another seed than the gate's) and
writes them in the bring-your-own format (``docs/recordings.md``: label and cost per response, a
``split`` per item, no gold, so every item replays as recorded) with a pool YAML beside it; the
benchmarks then load it like a user's file.

Usage: ``python benchmarks/sim_recordings.py --seed 7 --out .conductor/bench/paper-sim-s7``
(writes ``<out>.jsonl.gz`` and ``<out>.yaml``; a minute or two: the simulated calls).

``--texts`` records what a later round can read: each response's text (the simulated answer, with
its final answer line) beside its label, cost and tokens, and each item's gold answer and grader
metadata, so the project's graders extract answers and two workers' answers can be compared (a
simulated wrong answer is drawn from the item's wrong values, so wrong workers agree sometimes,
as real ones do). ``--domains`` keeps only the named domains (e.g. without ``code``, whose
sandboxed grading costs minutes).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import yaml

from rl_conductor.executor import execute
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.baselines import SOLVE
from rl_conductor.policies.routers import single_outcomes
from rl_conductor.reward import grade_trace
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.validation import DATA_SPLITS as SPLITS
from rl_conductor.workers.pool import Pool, load_pool, load_pool_config
from rl_conductor.workflow import Step, Workflow


async def _texts(pool: Pool, tasks: list[Task]) -> list[dict[str, dict[str, Any]]]:
    """Every worker alone on every task: its response as the recordings format keeps it."""
    view = pool.view()
    names = view.names()
    out: list[dict[str, dict[str, Any]]] = []
    for start in range(0, len(tasks), 64):
        chunk = tasks[start : start + 64]
        runs = [
            execute(Workflow(steps=(Step(j, SOLVE, ()),)), t, view, RequestLimits())
            for t in chunk
            for j in range(len(names))
        ]
        traces = await asyncio.gather(*runs)
        for i, t in enumerate(chunk):
            row = {}
            for j, name in enumerate(names):
                tr = traces[i * len(names) + j]
                step = tr.steps[0]
                row[name] = {
                    "text": step.answer,
                    "correct": bool(grade_trace(t, tr)),
                    "input_tokens": step.input_tokens,
                    "output_tokens": step.output_tokens,
                    "cost_usd": float(tr.cost_usd),
                    "latency_s": float(step.latency_s),
                }
            out.append(row)
    return out


def make(
    pool_name: str, seed: int, out: Path, *, texts: bool = False, domains: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """Record ``pool_name`` at ``seed`` on its default dataset's three splits into ``out``.jsonl.gz
    and a replay pool ``out``.yaml over it; returns both paths."""
    from rl_conductor.tasks.recordings_format import write_recordings

    cfg = load_pool_config(pool_name)
    pool = load_pool(pool_name, seed=seed)
    dataset = str(pool.options.get("default_dataset", "paper-mix"))
    items: list[dict[str, Any]] = []
    for split in SPLITS:
        tasks = [t for t in load_tasks(dataset, split=split) if not domains or t.domain in domains]
        if texts:
            for t, responses in zip(tasks, asyncio.run(_texts(pool, tasks)), strict=True):
                items.append(
                    {
                        "id": t.id,
                        "split": split,
                        "question": t.question,
                        "answer": t.answer,
                        "grader": t.grader,
                        "domain": t.domain,
                        "source": t.source,
                        "metadata": dict(t.metadata),
                        "responses": responses,
                    }
                )
            continue
        singles = single_outcomes(pool, tasks)
        for i, t in enumerate(tasks):
            items.append(
                {
                    "id": t.id,
                    "split": split,
                    "question": t.question,
                    "grader": t.grader,
                    "domain": t.domain,
                    "source": t.source,
                    "responses": {
                        name: {"correct": bool(singles.correct[i, j]), "cost_usd": float(singles.cost[i, j])}
                        for j, name in enumerate(singles.names)
                    },
                }
            )
    data = out.with_name(out.name + ".jsonl.gz")
    write_recordings(data, items)
    workers = [
        {
            "name": w["name"],
            "kind": "replay",
            "price_in": w["price_in"],
            "price_out": w["price_out"],
            "hosting": w.get("hosting", "external"),
            "description": w.get("description", ""),
        }
        for w in cfg["workers"]
    ]
    spec = {"name": out.name, "recordings": str(data.resolve()), "latency_scale": 0, "workers": workers}
    yml = out.with_name(out.name + ".yaml")
    yml.write_text(yaml.safe_dump(spec, sort_keys=False))
    return data, yml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", default="paper-sim")
    ap.add_argument("--seed", type=int, default=7, help="the simulator's seed (the gate's is 0)")
    ap.add_argument("--out", type=Path, default=Path(".conductor/bench/paper-sim-s7"))
    ap.add_argument("--texts", action="store_true", help="record each response's text and each item's gold")
    ap.add_argument("--domains", default="", help="comma-separated domains to keep (default: all)")
    args = ap.parse_args()
    domains = tuple(d for d in args.domains.split(",") if d)
    data, yml = make(args.pool, args.seed, args.out, texts=args.texts, domains=domains)
    print(f"wrote {data} and {yml}")


if __name__ == "__main__":
    main()
