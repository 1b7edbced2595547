"""Cases of the one-round trace comparison (``test_rounds.py``): the same policies, tasks and
limits, run by today's code and by the code with rounds, must give the same traces.

``tests/data/one_round_traces.jsonl.gz`` was written by :func:`write_golden` from the code at commit
2310b55, before rounds existed (the executor's recursion hook was the only multi-round path). The
projection leaves out what no round could change and what the rounds code removed or added:
``wall_s`` (measured time), the recursion field ``substeps`` (always empty there) and ``rounds``;
and the step field ``synthesised``, added later (a replay answer made from a recorded label).
"""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "data" / "one_round_traces.jsonl.gz"

#: (pool, dataset, policy specs, tasks per case)
POOLS = (
    (
        "paper-sim",
        "paper-mix",
        ("single:qwen3-32b", "single:gpt-5", "moa", "random", "self-consistency:gemma-3-27b-it*3"),
        8,
    ),
    ("routellm-replay", "routellm", ("single:gpt-4-1106-preview", "moa", "random"), 8),
)


def limit_cases() -> list[tuple[str, Any]]:
    from rl_conductor.limits import RequestLimits

    return [
        ("none", RequestLimits()),
        ("budget", RequestLimits(max_cost_usd=0.002)),
        ("deadline", RequestLimits(max_latency_s=15.0)),
        ("private", RequestLimits(sensitivity="private")),
    ]


def project(trace_dict: dict[str, Any]) -> dict[str, Any]:
    d = {k: v for k, v in trace_dict.items() if k not in ("wall_s", "rounds")}
    d["steps"] = [{k: v for k, v in s.items() if k not in ("substeps", "synthesised")} for s in d["steps"]]
    return d


def run_cases() -> list[str]:
    """One JSON line per (pool, policy, limits, task): the projected trace."""
    from rl_conductor.policies.catalog import make_policy
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.workers.pool import load_pool

    lines: list[str] = []
    for pool_name, dataset, specs, n in POOLS:
        pool = load_pool(pool_name)
        view = pool.view()
        tasks = load_tasks(dataset, "test", limit=n, seed=3)
        for spec in specs:
            policy = make_policy(spec, pool)
            for label, limits in limit_cases():
                for task in tasks:
                    ep = asyncio.run(policy.run(task, view, limits))
                    row = {
                        "pool": pool_name,
                        "policy": spec,
                        "limits": label,
                        "trace": project(ep.trace.to_dict()),
                    }
                    lines.append(json.dumps(row, sort_keys=True))
    return lines


def write_golden() -> None:
    # mtime 0: the same traces give the same file bytes
    GOLDEN.write_bytes(gzip.compress(("\n".join(run_cases()) + "\n").encode(), mtime=0))


def golden_lines() -> list[str]:
    return gzip.decompress(GOLDEN.read_bytes()).decode().splitlines()


if __name__ == "__main__":
    write_golden()
