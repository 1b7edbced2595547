"""A window of traffic + feedback as the retraining loop's data: tasks, splits and what was earned.

Why: the trainer and the evaluation take :class:`~rl_conductor.tasks.base.Task` lists, and a
served request is a question without a gold answer. A logged request becomes a task when

* its question is an item of the pool's dataset (the same text): that item, with its gold answer,
  grader and id (the simulated and replay pools answer an item by its id), or
* its feedback carries a gold answer: a new task ``traffic/<request id>`` graded by the feedback's
  grader (domain ``reasoning``, the recordings format's default).

A request with only a score (no gold answer) cannot be re-executed and graded; it becomes an
*observed* example instead (:class:`~rl_conductor.training.observed.Observed`): its question, the
workflow that was executed, the score and what the execution cost, which the warm start teaches
when it earned at least what the table expects there (:mod:`rl_conductor.training.observed`).
Every request counts in the window's summary: what the served workflows cost and took, and the
reward they earned (the feedback's ``reward``: the score, else the grade).

Splits: the most recent ``holdout_fraction`` of the window's tasks (by request time) is the
held-out recent traffic the challenger and the champion are compared on; the rest is training
data. A task of the standing test split never enters training (it is evaluated there anyway).
Each task appears once per split (its first request wins). Private records are skipped unless
``include_private`` is set (an operator retraining from the private store, on self-hosted
machines).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from rl_conductor.loop.feedback import read_feedback
from rl_conductor.loop.traffic import read_traffic
from rl_conductor.tasks.base import Task
from rl_conductor.training.observed import Observed


@dataclass(frozen=True)
class Example:
    """One logged request with its feedback (None: none) and the task it stands for (None: none)."""

    record: dict[str, Any]
    feedback: dict[str, Any] | None
    task: Task | None


@dataclass
class TrafficData:
    """A window's examples split for retraining (see module docstring)."""

    examples: list[Example]
    train: list[Task] = field(default_factory=list)
    holdout: list[Task] = field(default_factory=list)
    #: requests with a score and no gold answer (none of a held-out or standing test question)
    observed: list[Observed] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Numbers of the window (logged as MLflow metrics ``traffic/*``)."""
        recs = [e.record for e in self.examples]
        rewards = [float(e.feedback["reward"]) for e in self.examples if e.feedback is not None]
        graded = [
            e.feedback["correct"] for e in self.examples if e.feedback and e.feedback["correct"] is not None
        ]
        lat = [float(r.get("latency_s", 0.0)) for r in recs]
        out = {
            "requests": float(len(recs)),
            "with_feedback": float(len(rewards)),
            "with_task": float(sum(e.task is not None for e in self.examples)),
            "train_tasks": float(len(self.train)),
            "holdout_tasks": float(len(self.holdout)),
            "observed": float(len(self.observed)),
            "mean_cost_usd": statistics.fmean(float(r.get("cost_usd", 0.0)) for r in recs) if recs else 0.0,
            "mean_tokens": statistics.fmean(float(r.get("tokens", 0)) for r in recs) if recs else 0.0,
            "p50_latency_s": statistics.median(lat) if lat else 0.0,
        }
        if rewards:
            out["earned_reward"] = statistics.fmean(rewards)
        if graded:
            out["feedback_accuracy"] = statistics.fmean(float(bool(c)) for c in graded)
        return out

    def worker_share(self) -> dict[str, float]:
        """Share of served steps per worker (what the champion routed to)."""
        steps = Counter(
            s["worker"] for e in self.examples for s in e.record.get("steps", []) if s.get("worker")
        )
        total = sum(steps.values()) or 1
        return {w: n / total for w, n in sorted(steps.items())}


@lru_cache(maxsize=4)
def _items_by_question(dataset: str) -> dict[str, Task]:
    from rl_conductor.tasks.datasets import load_tasks

    out: dict[str, Task] = {}
    for t in load_tasks(dataset, "all"):
        out.setdefault(t.question, t)
    return out


def task_of(record: dict[str, Any], feedback: dict[str, Any] | None, dataset: str | None) -> Task | None:
    """The task a logged request stands for (see module docstring), or None."""
    if dataset:
        item = _items_by_question(dataset).get(record["question"])
        if item is not None:
            return item
    if feedback is not None and feedback.get("answer"):
        return Task(
            id=f"traffic/{record['request_id']}",
            question=record["question"],
            answer=str(feedback["answer"]),
            domain="reasoning",
            source="traffic",
            grader=str(feedback.get("grader") or "qa"),
        )
    return None


def observed_of(example: Example) -> Observed | None:
    """A request with a score and no gold answer as an observed example (else None): its
    question, executed workflow and outcome as the reward reads a trace — a worker was called
    (:func:`made_a_call`), a budget or a deadline skipped a step."""
    fb = example.feedback
    if fb is None or fb.get("score") is None or fb.get("answer"):
        return None
    rec, task = example.record, example.task
    statuses = [str(s.get("status", "")) for s in rec.get("steps", [])]
    allowed = rec.get("allowed_workers")
    return Observed(
        request_id=str(rec["request_id"]),
        question=str(rec["question"]),
        workflow=tuple(dict(s) for s in rec.get("workflow", [])),
        score=float(fb["score"]),
        cost_usd=float(rec.get("cost_usd", 0.0)),
        called=made_a_call(rec.get("steps", [])),
        budget_stopped="skipped_budget" in statuses,
        deadline_stopped="skipped_deadline" in statuses,
        max_cost_usd=rec.get("max_cost_usd"),
        max_latency_s=rec.get("max_latency_s"),
        allowed_workers=None if allowed is None else tuple(allowed),
        task_id="" if task is None else task.id,
        domain="" if task is None else task.domain,
        source="traffic" if task is None else task.source,
        metadata={} if task is None else dict(task.metadata),
    )


def collect(
    store: str,
    *,
    dataset: str | None,
    since: float | None = None,
    until: float | None = None,
    holdout_fraction: float = 0.3,
    exclude_ids: Sequence[str] = (),
    include_private: bool = False,
) -> TrafficData:
    """The window ``[since, until)`` of ``store`` as :class:`TrafficData` (see module docstring)."""
    from rl_conductor import validation

    validation.probability("holdout_fraction", holdout_fraction)
    feedback = read_feedback(store)
    examples = []
    for rec in read_traffic(store, since=since, until=until):
        if rec.get("sensitivity", "public") != "public" and not include_private:
            continue
        fb = feedback.get(str(rec["request_id"]))
        examples.append(Example(record=rec, feedback=fb, task=task_of(rec, fb, dataset)))
    examples.sort(key=lambda e: float(e.record.get("ts", 0.0)))
    with_task = [e for e in examples if e.task is not None]
    n_hold = math.ceil(holdout_fraction * len(with_task)) if with_task else 0
    cut = len(with_task) - n_hold
    blocked = set(exclude_ids)
    data = TrafficData(examples=examples)
    seen: set[str] = set()
    for e in with_task[:cut]:
        assert e.task is not None
        if e.task.id not in blocked and e.task.id not in seen:
            seen.add(e.task.id)
            data.train.append(e.task)
    seen_hold: set[str] = set()
    for e in with_task[cut:]:
        assert e.task is not None
        if e.task.id not in seen_hold:
            seen_hold.add(e.task.id)
            data.holdout.append(e.task)
    held = blocked | seen_hold
    for e in examples:
        obs = observed_of(e)
        if obs is not None and obs.task_id not in held:
            data.observed.append(obs)
    return data


def made_a_call(steps: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a recorded request called any worker, failed calls included: as
    ``reward.trace_reward`` reads ``trace.attempts`` (a step the deadline skipped may still have
    made a call). Records written before steps kept their ``attempts`` count: a step that ran or
    failed."""
    if any("attempts" in s for s in steps):
        return any(int(s.get("attempts") or 0) > 0 for s in steps)
    return any(str(s.get("status", "")) in ("ok", "failed") for s in steps)


__all__ = ["Example", "TrafficData", "collect", "made_a_call", "observed_of", "task_of"]
