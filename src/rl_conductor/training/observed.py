"""Served requests that got a score but no gold answer, as warm-start examples.

Why: a question the pool's dataset does not hold, with feedback that carries only a score, cannot
be re-executed and graded, so the candidate table (:mod:`rl_conductor.training.candidates`) has
no row for it. What it does have is one observed outcome: the workflow the champion executed and
what that earned — the reward of the one formula (:func:`rl_conductor.reward.reward_of`) with the
score as the correctness and the recorded cost, calls and budget / deadline stops.

The rule (advantage-filtered imitation): an observed workflow is an SFT target for its own
question when its observed reward is at least the expected reward of the warm start's own target
for that prompt (:meth:`rl_conductor.training.warmstart.ExpectedRewards.value`: the best
candidate of the question's neighbourhood, under the request's workers, budget and deadline,
i.e. what replays from the table). At or above that baseline the served workflow did at least as
well as what the table would teach, so it is taught (``copies`` times); below it, it is not
taught at all: imitating a workflow that earned less than the alternative would pull the
Conductor towards it, and one question with a low score says nothing about which other
workflow would have earned more. A wrong answer (score 0) earns about the format bonus minus
its cost, below any baseline a useful candidate has, so it is never taught; a right one (score
1) is taught unless it cost more than the table's best expected reward leaves room for.

A workflow that names a worker the pool no longer has, or has more steps than the Conductor may
write, is not taught either (counted as ``unusable``). Graded feedback (a gold answer) is not
here: its question is a task and goes through the table like any training question.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_conductor.reward import RewardConfig, reward_of
from rl_conductor.tasks.base import Task
from rl_conductor.training.data import chat
from rl_conductor.workflow import Access, Step, Workflow, render


@dataclass(frozen=True)
class Observed:
    """One served request with a score: its question, executed workflow (steps over worker
    *names*: ``worker``, ``instruction``, ``access``) and what it cost, as the traffic log has it."""

    request_id: str
    question: str
    workflow: tuple[dict[str, Any], ...]
    score: float
    cost_usd: float
    called: bool
    budget_stopped: bool = False
    deadline_stopped: bool = False
    max_cost_usd: float | None = None
    max_latency_s: float | None = None
    allowed_workers: tuple[str, ...] | None = None
    #: the dataset item the question is ("" for a question the dataset does not hold)
    task_id: str = ""
    domain: str = ""
    source: str = "traffic"
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def reward(self, config: RewardConfig) -> float:
        """What the executed workflow earned: :func:`~rl_conductor.reward.reward_of` with the
        score as the correctness."""
        return float(
            reward_of(
                config,
                correct=self.score,
                cost=self.cost_usd,
                called=self.called,
                budget_stopped=self.budget_stopped,
                deadline_stopped=self.deadline_stopped,
            )
        )

    def task(self) -> Task:
        """The question as a task for the prompt and the table's neighbourhood look-up (no gold:
        never graded)."""
        return Task(
            id=self.task_id or f"traffic/{self.request_id}",
            question=self.question,
            answer="",
            domain=self.domain,
            source=self.source,
            grader="qa",
            metadata=dict(self.metadata),
        )

    def plan(self, names: Sequence[str], max_steps: int) -> Workflow | None:
        """The executed workflow over the ordinals of ``names`` (None when a step's worker is not
        among them, an access list points forward, or it has more than ``max_steps`` steps)."""
        if not self.workflow or len(self.workflow) > max_steps:
            return None
        steps = []
        for i, s in enumerate(self.workflow):
            if s.get("worker") not in names:
                return None
            seen = tuple(int(a) for a in s.get("access", ()))
            if any(not 0 <= a < i for a in seen):
                return None
            # every earlier step is written "all", as the table's chains are
            access: Access = "all" if i and seen == tuple(range(i)) else seen
            steps.append(
                Step(
                    worker=list(names).index(s["worker"]),
                    instruction=str(s.get("instruction", "")),
                    access=access,
                )
            )
        return Workflow(steps=tuple(steps))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Observed:
        allowed = d.get("allowed_workers")
        return cls(
            **{
                **d,
                "workflow": tuple(dict(s) for s in d.get("workflow", ())),
                "allowed_workers": None if allowed is None else tuple(allowed),
                "metadata": dict(d.get("metadata") or {}),
            }
        )


def write_observed(path: str | Path, examples: Sequence[Observed]) -> int:
    """Write observed examples as JSON lines; returns how many."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(
        "".join(json.dumps(e.to_dict(), ensure_ascii=False) + "\n" for e in examples), encoding="utf-8"
    )
    return len(examples)


def read_observed(path: str | Path) -> list[Observed]:
    """Observed examples from a file written by :func:`write_observed` (none for an empty path;
    a path that does not exist is an error, not a silent "nothing observed")."""
    if not path:
        return []
    if not Path(path).is_file():
        from rl_conductor.errors import MissingFile

        raise MissingFile(f"observed_path {str(path)!r} is not a file (the collect step's observed_data)")
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [Observed.from_dict(json.loads(line)) for line in lines if line.strip()]


@dataclass(frozen=True)
class Decision:
    """What the rule did with one observed example (see module docstring)."""

    example: Observed
    reward: float
    baseline: float | None  # the warm start's target's expected reward (None: unusable)
    taught: bool
    plan: Workflow | None
    view: tuple[int, ...]

    @property
    def advantage(self) -> float | None:
        return None if self.baseline is None else self.reward - self.baseline

    def to_dict(self) -> dict[str, Any]:
        """What the trainer writes to ``observed.json`` (one entry per example)."""
        return {
            "request_id": self.example.request_id,
            "question": self.example.question[:200],
            "score": self.example.score,
            "reward": self.reward,
            "baseline": self.baseline,
            "taught": self.taught,
            "plan": None if self.plan is None else render(self.plan),
        }


def judge(
    examples: Sequence[Observed],
    pool_names: Sequence[str],
    targets: Any,
    config: RewardConfig,
    *,
    max_steps: int,
) -> list[Decision]:
    """The rule of the module docstring for each example: taught iff its observed reward is at
    least the expected reward of ``targets``' (an
    :class:`~rl_conductor.training.warmstart.ExpectedRewards`) target for the same prompt."""
    out = []
    for ex in examples:
        allowed = None if ex.allowed_workers is None else set(ex.allowed_workers)
        view = tuple(i for i, n in enumerate(pool_names) if allowed is None or n in allowed)
        names = [pool_names[i] for i in view]
        plan = ex.plan(names, max_steps) if names else None
        r = ex.reward(config)
        if plan is None:
            out.append(Decision(ex, r, None, False, None, view))
            continue
        _, baseline = targets.value(ex.task(), names, ex.max_cost_usd, ex.max_latency_s)
        out.append(Decision(ex, r, baseline, r >= baseline - 1e-12, plan, view))
    return out


def counts(decisions: Sequence[Decision]) -> dict[str, int]:
    """How many examples were taught, fell below their baseline, or could not be used."""
    return {
        "observed": len(decisions),
        "observed_taught": sum(d.taught for d in decisions),
        "observed_below_baseline": sum(d.plan is not None and not d.taught for d in decisions),
        "observed_unusable": sum(d.plan is None for d in decisions),
    }


def sft_records(
    decisions: Sequence[Decision],
    prompt: Any,
    *,
    copies: int = 1,
    line: Any = None,
) -> list[dict[str, Any]]:
    """Prompt/completion pairs of the taught examples, ``copies`` each; ``prompt(decision)`` is
    the prompt text of a decision's question, view and limits (the trainer's, so an observed
    example is prompted exactly as a table target is). ``line(decision)``: the ids of the
    ranking or plan line that prompt shows (None: none), for a recipe whose targets write workers
    by their place in it; each observed worker the line shows is then written by place
    (``model_id = [@1, @2]``), as the recipe's own targets are, and any other by id."""
    from rl_conductor.policies.plan_hint import by_place

    out = []
    for d in decisions:
        if not d.taught or d.plan is None:
            continue
        shown = None if line is None else line(d)
        plan = d.plan if not shown else by_place(d.plan, shown)
        rec = {"prompt": chat(prompt(d)), "completion": [{"role": "assistant", "content": render(plan)}]}
        out += [rec] * copies
    return out


def trainer_records(
    path: str | Path,
    pool: Any,
    base: Any,
    targets: Any,
    config: RewardConfig,
    *,
    max_steps: int,
    max_question_chars: int,
    question_cut: str = "head",
    copies: int = 1,
    evidence: Mapping[str, Mapping[str, float]] | None = None,
    evidence_model: Any = None,
    rank: Any = None,
    hint: Any = None,
    by_place: bool = False,
) -> tuple[list[dict[str, Any]], list[Decision]]:
    """The SFT records of ``path``'s observed examples (:func:`judge`, :func:`sft_records`),
    prompted as :func:`rl_conductor.training.data.spec_prompt` prompts a table target: the
    request's workers, budget and deadline; with prompt evidence, the evidence model's estimates
    for the question (it never saw it, like any question it did not fit on). ``by_place``: the
    recipe writes its targets by place in the prompt's ranking (``plan_by_rank``) or plan line
    (``plan_hint`` always does): so are the observed plans."""
    from rl_conductor.prompting import shown_ranking
    from rl_conductor.training.data import PromptSpec, spec_prompt, spec_ranking

    decisions = judge(read_observed(path), pool.names(), targets, config, max_steps=max_steps)
    shown = dict(evidence) if evidence is not None else None
    if shown is not None and evidence_model is not None:
        from rl_conductor.policies.evidence import evidence_for

        new = [d.example.task() for d in decisions if d.taught and d.example.task().id not in shown]
        shown.update({t.id: e for t, e in zip(new, evidence_for(evidence_model, new), strict=True)})

    def spec(d: Decision) -> PromptSpec:
        return PromptSpec(d.example.task(), d.view, d.example.max_cost_usd, d.example.max_latency_s)

    def prompt(d: Decision) -> str:
        s = spec(d)
        view = s.pool_view(pool)
        return spec_prompt(s, view, s.limits(base), max_question_chars, shown, question_cut, rank, hint)

    def line(d: Decision) -> list[int] | None:
        ids = spec_ranking(spec(d), pool, base, shown, rank, hint)
        # a ranking line shows its first few ids (what @k can name); a plan line shows them all
        return ids if hint is not None else shown_ranking(ids)

    placed = by_place or hint is not None
    return sft_records(decisions, prompt, copies=copies, line=line if placed else None), decisions


__all__ = [
    "Decision",
    "Observed",
    "counts",
    "judge",
    "read_observed",
    "sft_records",
    "trainer_records",
    "write_observed",
]
