"""Benchmark runner: every policy runs the same tasks through ``Policy.run`` → grade.

``evaluate`` returns per-task records and a summary in the schema the CLI writes::

    {"policy", "pool", "n", "accuracy", "mean_tokens", "mean_cost_usd", "mean_calls",
     "mean_steps", "p50_latency_s", "p95_latency_s", "parse_rate", "fallback_rate" (the plan: the
     Conductor's text did not parse), "worker_fallback_rate" (share of questions where a worker failed
     and the executor turned to another of its hosting class: ``Trace.worker_fallbacks``),
     "deadline_cut_rate" (share of questions where the deadline skipped a step, capped an answer
     or cut the plan to its answering step before it ran), "failed_call_rate" (share of worker
     calls that failed: error, timeout or empty answer), "call_errors" (the most frequent failure
     messages with their counts), "reward" (the reward config every record was scored with),
     "by_domain": {domain: {...same metrics}}}

Accuracy is in [0, 1]; latency is the critical path of the workers' reported latencies (what the
simulated pool models); tokens are worker input + output tokens.

What a policy *does* is summarised too (per domain as well), so a collapse onto one worker shows
at a glance: ``worker_shares`` (share of steps per worker), ``verify_rate`` (share of
questions with a step that sees earlier answers: a verifier or an aggregator) and ``shapes``
(share of questions per workflow shape, e.g. ``gemini-2.5-pro`` or
``gpt-5→claude-sonnet-4(all)``; the most frequent ``SHAPES_KEPT``, the rest as ``other``).
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl_conductor import reward
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import Episode, Policy, follows
from rl_conductor.reward import (
    RewardConfig,
    deadline_shortened,
    grade_trace,
    trace_reward,
)
from rl_conductor.tasks.base import Task
from rl_conductor.trace import StepRecord
from rl_conductor.workers.pool import PoolView

#: Workflow shapes listed by name in a summary; rarer ones are counted as ``other``.
SHAPES_KEPT = 8
#: Distinct call failure messages kept in a summary (``call_errors``), most frequent first.
ERRORS_KEPT = 3


@dataclass
class Record:
    task_id: str
    domain: str
    correct: bool
    tokens: int
    cost_usd: float
    calls: int
    steps: int
    latency_s: float
    parsed: bool = True
    fallback: bool = False
    reward: float = 0.0
    workers: list[str] = field(default_factory=list)
    shape: str = ""
    sees_earlier: bool = False
    deadline_cut: bool = False
    worker_fallback: bool = False
    attempts: int = 0
    failed_calls: int = 0
    #: rounds whose steps ran (1 = the plan alone), and whether the answers the first review saw
    #: agreed (None: no review, or fewer than two answers)
    rounds: int = 1
    first_agree: bool | None = None
    errors: list[str] = field(default_factory=list)
    #: the plan's steps are the workers its evidence names (``Plan.evidence_plan``: the worker
    #: ranked first, alone, or the plan line's workers; None: the policy reads no evidence)
    follows_evidence: bool | None = None


#: How a step that never reached a worker (skipped before any call) is named in the views.
NO_WORKER = "(skipped)"


def _step_label(step: StepRecord) -> str:
    name = step.worker or NO_WORKER
    if not step.visible:
        return name
    if step.visible == list(range(step.index)):
        return f"{name}(all)"
    return f"{name}({','.join(map(str, step.visible))})"


def workflow_shape(steps: Sequence[StepRecord]) -> str:
    """``a→b(all)``: the executed steps' workers with what each saw; repeats as ``5×a``."""
    labels = [_step_label(s) for s in steps]
    runs: list[list[Any]] = []
    for label in labels:
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    return "→".join(label if n == 1 else f"{n}×{label}" for label, n in runs) or "(none)"


def _behaviour(records: Sequence[Record]) -> dict[str, Any]:
    calls: Counter[str] = Counter(w or NO_WORKER for r in records for w in r.workers)
    total = sum(calls.values())
    shapes = Counter(r.shape for r in records).most_common()
    kept = dict(shapes[:SHAPES_KEPT])
    rest = sum(n for _, n in shapes[SHAPES_KEPT:])
    if rest:
        kept["other"] = rest
    return {
        "verify_rate": float(np.mean([r.sees_earlier for r in records])),
        "worker_shares": {w: n / total for w, n in calls.most_common()} if total else {},
        "shapes": {k: n / len(records) for k, n in kept.items()},
    }


def _rounds(records: Sequence[Record]) -> dict[str, Any]:
    """``mean_rounds``, ``multi_round_rate`` (share of questions with more than one round) and
    that share among questions whose first answers agreed / disagreed (None where there were none)."""

    def share(rs: Sequence[Record]) -> float | None:
        return float(np.mean([r.rounds > 1 for r in rs])) if rs else None

    return {
        "mean_rounds": float(np.mean([r.rounds for r in records])),
        "multi_round_rate": share(records),
        "multi_round_rate_agree": share([r for r in records if r.first_agree is True]),
        "multi_round_rate_disagree": share([r for r in records if r.first_agree is False]),
    }


def summarize(records: Sequence[Record]) -> dict[str, Any]:
    """Aggregate metrics of a list of records (see module docstring)."""
    if not records:
        return {"n": 0}
    lat = np.array([r.latency_s for r in records])
    attempts = sum(r.attempts for r in records)
    errors = Counter(e for r in records for e in r.errors).most_common(ERRORS_KEPT)
    return {
        "n": len(records),
        "accuracy": float(np.mean([r.correct for r in records])),
        "mean_tokens": float(np.mean([r.tokens for r in records])),
        "mean_cost_usd": float(np.mean([r.cost_usd for r in records])),
        "mean_calls": float(np.mean([r.calls for r in records])),
        "mean_steps": float(np.mean([r.steps for r in records])),
        "p50_latency_s": float(np.percentile(lat, 50)),
        "p95_latency_s": float(np.percentile(lat, 95)),
        "parse_rate": float(np.mean([r.parsed for r in records])),
        "fallback_rate": float(np.mean([r.fallback for r in records])),
        "worker_fallback_rate": float(np.mean([r.worker_fallback for r in records])),
        "deadline_cut_rate": float(np.mean([r.deadline_cut for r in records])),
        "mean_reward": float(np.mean([r.reward for r in records])),
        "failed_call_rate": sum(r.failed_calls for r in records) / attempts if attempts else 0.0,
        **_rounds(records),
        "call_errors": {e: n for e, n in errors},
        **_behaviour(records),
        **_agreement(records),
    }


def _agreement(records: Sequence[Record]) -> dict[str, float]:
    """``evidence_agreement``: the share of plans that are the worker their evidence ranks first
    (only for a policy that reads a ranking, ``evidence: rank``)."""
    seen = [r.follows_evidence for r in records if r.follows_evidence is not None]
    return {"evidence_agreement": float(np.mean(seen))} if seen else {}


@dataclass
class EvalResult:
    policy: str
    pool: str
    records: list[Record]

    reward: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.policy, "pool": self.pool, **summarize(self.records)}
        out["reward"] = dict(self.reward)
        by: dict[str, list[Record]] = defaultdict(list)
        for r in self.records:
            by[r.domain].append(r)
        out["by_domain"] = {d: summarize(rs) for d, rs in sorted(by.items())}
        return out


def _record(task: Task, ep: Episode, reward_config: RewardConfig) -> Record:
    t = ep.trace
    correct = grade_trace(task, t)
    return Record(
        task_id=task.id,
        domain=task.domain,
        correct=correct,
        reward=trace_reward(t, correct, reward_config, parsed=not ep.plan.fallback),
        tokens=t.tokens,
        cost_usd=t.cost_usd,
        calls=t.calls,
        steps=len(ep.plan.workflow.steps) + sum(len(r.steps) for r in t.rounds[1:]),
        latency_s=t.latency_s,
        parsed=ep.plan.parse_error is None,
        fallback=ep.plan.fallback,
        workers=[s.worker for s in t.steps],
        shape=workflow_shape(t.steps),
        sees_earlier=any(s.visible for s in t.steps),
        deadline_cut=deadline_shortened(t),
        worker_fallback=t.worker_fallbacks > 0,
        rounds=t.rounds_run,
        first_agree=t.rounds[1].agree if len(t.rounds) > 1 else None,
        attempts=len(t.attempts),
        failed_calls=sum(a.status != "ok" for a in t.attempts),
        errors=[a.error or a.status for a in t.attempts if a.status != "ok"],
        follows_evidence=None
        if ep.plan.evidence_plan is None
        else ep.plan.follows_evidence
        if ep.plan.follows_evidence is not None
        else not ep.plan.fixed_fallback and follows(ep.plan.workflow, ep.plan.evidence_plan),
    )


async def evaluate_async(
    policy: Policy,
    view: PoolView,
    tasks: Sequence[Task],
    limits: RequestLimits | None = None,
    *,
    concurrency: int = 32,
    progress: bool = True,
    description: str | None = None,
    reward_config: RewardConfig | None = None,
) -> EvalResult:
    """Run ``policy`` on every task, ``concurrency`` tasks at a time (one ``run_many`` batch, so
    LM policies batch their generation), and collect records in task order, each scored with
    ``reward_config`` (the default reward when None). Progress: a bar on a terminal, plain lines
    elsewhere (:mod:`rl_conductor.progress`)."""
    from rl_conductor.progress import progress as progress_display

    limits = limits or RequestLimits()
    records: list[Record] = []
    rc = reward_config or reward.reward_config()
    with progress_display(progress) as bar:
        pid = bar.add_task(description or f"eval {policy.name}", total=len(tasks))
        for start in range(0, len(tasks), concurrency):
            chunk = list(tasks[start : start + concurrency])
            episodes = await policy.run_many(chunk, view, limits)
            records.extend(_record(t, ep, rc) for t, ep in zip(chunk, episodes, strict=True))
            bar.advance(pid, len(chunk))
    return EvalResult(policy=policy.name, pool=view.pool.name, records=records, reward=rc.to_dict())


def every_call_failed(summary: dict[str, Any]) -> str | None:
    """Why a policy's evaluation measured nothing — every worker call it made failed — or None.
    The CLI exits non-zero with this line: a 0 % that is a broken pool must not look like a
    result."""
    rate, n = summary.get("failed_call_rate"), summary.get("n", 0)
    if not n or rate is None or rate < 1.0:
        return None
    errors = summary.get("call_errors") or {}
    top = next(iter(errors), "no message")
    return f"policy {summary.get('policy')!r}: every worker call failed on all {n} questions; e.g. {top}"


def measurement_warnings(summary: dict[str, Any]) -> list[str]:
    """What makes a policy's row measure less than it says, short of every call failing: worker
    calls that failed (a replacement worker or no answer stood in), steps answered by a
    replacement worker (``single:X`` then reports partly another worker's answers), and plans
    that did not parse (the fallback plan answered). The CLI prints each as a warning under the
    table: a recordings file or pool with such holes must not read as a clean result."""
    name, out = summary.get("policy"), []
    errors = summary.get("call_errors") or {}
    top = f"; e.g. {next(iter(errors))}" if errors else ""
    failed = summary.get("failed_call_rate") or 0.0
    replaced = summary.get("worker_fallback_rate") or 0.0
    stood_in = (
        f"on {100 * replaced:.1f} % of questions a replacement worker answered a step whose own worker "
        "failed (its row is partly another worker's answers; see the workers table)"
    )
    # one line per policy: the failures and the replacements they caused are one fact
    if 0 < failed < 1:
        also = f", and {stood_in}" if replaced > 0 else ""
        out.append(f"policy {name!r}: {100 * failed:.1f} % of its worker calls failed{also}{top}")
    elif replaced > 0:
        out.append(f"policy {name!r}: {stood_in}")
    parsed = summary.get("parse_rate")
    if parsed is not None and parsed < 1:  # only an LM's plans can fail to parse
        fell = summary.get("fallback_rate") or 0.0
        out.append(
            f"policy {name!r}: {100 * (1 - parsed):.1f} % of its plans did not parse"
            + (f"; the fallback plan answered {100 * fell:.1f} % of questions" if fell else "")
        )
    return out


def evaluate(
    policy: Policy, view: PoolView, tasks: Sequence[Task], limits: RequestLimits | None = None, **kw: Any
) -> EvalResult:
    """Synchronous wrapper of :func:`evaluate_async`."""
    return asyncio.run(evaluate_async(policy, view, tasks, limits, **kw))
