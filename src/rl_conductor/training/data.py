"""Training prompts: which question, which workers are shown (randomised pools), which budget
and which deadline.

One :class:`PromptSpec` feeds both stages. SFT pairs it either with the prompt's expected-best
workflow (:func:`warm_sft_records`, the default: routing and composition that pay for questions
like this one, see :mod:`rl_conductor.training.warmstart`) or with a synthesised random valid
workflow (:func:`sft_records`: the format only, the ablation baseline). GRPO turns it into a
prompt whose columns (``task_id``, ``view``, ``budget``, ``deadline``) reach the reward
function, which executes the completion on exactly that view under exactly those limits.
Deadlines are drawn for a share of prompts (:mod:`rl_conductor.training.deadlines`); with a
share of 0 no random state is touched, so the specs are those of the recipe without deadlines.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rl_conductor.limits import RequestLimits
from rl_conductor.policies.plan_hint import PlanHint, by_place, plan_ids
from rl_conductor.prompting import conductor_prompt, shown_ranking
from rl_conductor.tasks.base import Task
from rl_conductor.training.candidates import Candidate, single
from rl_conductor.training.deadlines import draw_deadline
from rl_conductor.training.warmstart import ExpectedRewards
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow, render

#: a question's ranking line from its estimates (:class:`rl_conductor.policies.evidence.Ranker`)
Rank = Callable[[Task, Mapping[str, float], PoolView, RequestLimits], Sequence[int]]
#: a question's ``Plan by estimate:`` line and its plan (``plan_hint``, :func:`training_hint`)
Hint = Callable[[Task, PoolView, RequestLimits], Candidate]

#: Subtask wording by role; the simulated pool ignores wording, live workers do not.
INSTRUCTIONS: dict[str, tuple[str, ...]] = {
    "solve": ("Solve step by step; give the final answer.", "Answer the question; state the final answer."),
    "plan": ("Outline the solution steps only.",),
    "facts": ("List the relevant facts and formulas.",),
    "code": ("Write complete, correct Python code.",),
    "verify": ("Check the answer above; fix errors; give the final answer.",),
    "aggregate": ("Compare the answers above; give the best final answer.",),
    "review": ("Review the workflow; keep or improve the answer.",),
}
_FIRST_ROLES = ("solve", "solve", "plan", "facts", "code")
_LATER_ROLES = ("verify", "aggregate", "solve", "code")


@dataclass(frozen=True)
class PromptSpec:
    """One training prompt: a task, the workers shown (pool indices, in order), a budget or None,
    a deadline in seconds or None."""

    task: Task
    view: tuple[int, ...]
    budget: float | None
    deadline: float | None = None

    def limits(self, base: RequestLimits) -> RequestLimits:
        return RequestLimits(**{**base.__dict__, "max_cost_usd": self.budget, "max_latency_s": self.deadline})

    def pool_view(self, pool: Pool) -> PoolView:
        return pool.view(self.view)


def make_specs(
    tasks: Sequence[Task],
    pool: Pool,
    n: int,
    *,
    rng: random.Random,
    budget_prob: float,
    budgets: Sequence[float],
    random_pool_prob: float,
    min_pool_size: int = 2,
    deadline_fraction: float = 0.0,
    deadline_range_s: Sequence[float] = (5.0, 60.0),
    balance_domains: bool = False,
) -> list[PromptSpec]:
    """``n`` prompt specs cycling through shuffled tasks, with random budgets, deadlines and pool
    subsets. The deadline is drawn after the budget, so ``deadline_fraction == 0`` (no draw)
    leaves the random stream, and thus every spec, as without deadlines.

    ``balance_domains``: every domain gets the same share of specs (its tasks repeated as often
    as needed), so a rare domain's plans (code, on paper-mix) are learnt as well as the common
    ones (the tiny preset's comments have the measurement)."""
    order = balanced(tasks, rng) if balance_domains else list(tasks)
    if n > 0 and not order:
        raise ValueError("make_specs needs at least one task")  # else the cycle below never ends
    specs: list[PromptSpec] = []
    while len(specs) < n:
        rng.shuffle(order)
        for t in order:
            if len(specs) >= n:
                break
            view = (
                pool.random_view(rng, min_size=min_pool_size).indices
                if rng.random() < random_pool_prob
                else tuple(range(len(pool)))
            )
            budget = rng.choice(list(budgets)) if budgets and rng.random() < budget_prob else None
            deadline = draw_deadline(rng, deadline_fraction, deadline_range_s)
            specs.append(PromptSpec(task=t, view=view, budget=budget, deadline=deadline))
    return specs


def balanced(tasks: Sequence[Task], rng: random.Random) -> list[Task]:
    """The tasks with every domain's list repeated (shuffled, then cycled) to the largest
    domain's size."""
    by_domain: dict[str, list[Task]] = {}
    for t in tasks:
        by_domain.setdefault(t.domain, []).append(t)
    size = max((len(v) for v in by_domain.values()), default=0)
    out: list[Task] = []
    for d in sorted(by_domain):
        mine = list(by_domain[d])
        rng.shuffle(mine)
        out += [mine[i % len(mine)] for i in range(size)]
    return out


def synth_workflow(rng: random.Random, pool_size: int, *, max_steps: int) -> Workflow:
    """A random valid workflow: 1–max_steps steps (short ones likelier), uniform workers,
    access lists "all", [] or index lists, instructions from :data:`INSTRUCTIONS`."""
    weights = [0.45, 0.3, 0.14, 0.07, 0.04][:max_steps]
    n = rng.choices(range(1, len(weights) + 1), weights=weights)[0]
    steps = []
    for i in range(n):
        if i > 0:
            # a draw kept from when a later step could name the Conductor: seeded random workflows
            # stay those every earlier version made (the ``random`` ablation, the test models)
            rng.random()
        worker = rng.randrange(pool_size)
        if i == 0:
            access: Any = ()
            role = rng.choice(_FIRST_ROLES)
        else:
            r = rng.random()
            access = (
                "all"
                if r < 0.6
                else (() if r < 0.8 else tuple(sorted(rng.sample(range(i), rng.randint(1, i)))))
            )
            role = rng.choice(_LATER_ROLES) if access else "solve"
        steps.append(Step(worker=worker, instruction=rng.choice(INSTRUCTIONS[role]), access=access))
    return Workflow(steps=tuple(steps))


def spec_prompt(
    spec: PromptSpec,
    view: PoolView,
    limits: RequestLimits,
    max_question_chars: int,
    evidence: Mapping[str, Mapping[str, float]] | None,
    question_cut: str,
    rank: Rank | None = None,
    hint: Hint | None = None,
) -> str:
    """The Conductor prompt of a spec; ``evidence`` maps task ids to the per-worker estimates the
    prompt shows (out-of-fold for training questions, :mod:`rl_conductor.policies.evidence`);
    with ``rank`` (``evidence: rank``) the prompt ends with their ranking line, with ``hint``
    (``plan_hint``) with its plan line."""
    mine = None if evidence is None else evidence.get(spec.task.id)
    return conductor_prompt(
        spec.task,
        view,
        limits,
        max_question_chars=max_question_chars,
        evidence=mine,
        question_cut=question_cut,
        ranking=None if rank is None or mine is None else rank(spec.task, mine, view, limits),
        plan=None if hint is None else plan_ids(hint(spec.task, view, limits), view.names()),
    )


def spec_ranking(
    spec: PromptSpec,
    pool: Pool,
    base: RequestLimits,
    evidence: Mapping[str, Mapping[str, float]] | None,
    rank: Rank | None,
    hint: Hint | None = None,
) -> list[int] | None:
    """The ranking (or plan) line's ids :func:`spec_prompt` shows for ``spec`` (None when it
    shows none)."""
    if hint is not None:
        view = spec.pool_view(pool)
        return plan_ids(hint(spec.task, view, spec.limits(base)), view.names())
    mine = None if evidence is None else evidence.get(spec.task.id)
    if rank is None or mine is None:
        return None
    return list(rank(spec.task, mine, spec.pool_view(pool), spec.limits(base)))


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def sft_records(
    specs: Sequence[PromptSpec],
    pool: Pool,
    base: RequestLimits,
    *,
    rng: random.Random,
    max_question_chars: int,
) -> list[dict[str, Any]]:
    """Conversational prompt/completion pairs for TRL's SFTTrainer."""
    out = []
    for s in specs:
        view = s.pool_view(pool)
        lim = s.limits(base)
        wf = synth_workflow(rng, len(view), max_steps=lim.max_steps)
        out.append(
            {
                "prompt": chat(conductor_prompt(s.task, view, lim, max_question_chars=max_question_chars)),
                "completion": [{"role": "assistant", "content": render(wf)}],
            }
        )
    return out


def warm_sft_records(
    specs: Sequence[PromptSpec],
    pool: Pool,
    base: RequestLimits,
    targets: ExpectedRewards,
    *,
    max_question_chars: int,
    evidence: Mapping[str, Mapping[str, float]] | None = None,
    question_cut: str = "head",
    rank: Rank | None = None,
    by_rank: bool = False,
    hint: Hint | None = None,
) -> list[dict[str, Any]]:
    """Prompt/completion pairs whose completion is the prompt's expected-best workflow
    (:mod:`rl_conductor.training.warmstart`): only the shown workers, affordable under the
    prompt's budget and planned for its deadline, ids as the prompt shows them. With ``rank``
    (``evidence: rank``) the completion is the first worker of the prompt's ranking line alone
    (the line and the target come from the same :class:`~rl_conductor.policies.evidence.Ranker`);
    with ``by_rank`` that worker is written as its rank address, ``model_id = [@1]``. With
    ``hint`` (``plan_hint``) the completion is the plan the prompt's plan line names, its workers
    written by place (``model_id = [@1, @2]``)."""
    out = []
    for s in specs:
        view = s.pool_view(pool)
        lim = s.limits(base)
        mine = None if evidence is None else evidence.get(s.task.id)
        if rank is not None and mine is not None:
            best = rank(s.task, mine, view, lim)[0]
            wf = single(view.names()[best]).workflow(view.names())
            if by_rank:
                wf = Workflow(steps=tuple(replace(st, rank=1) for st in wf.steps))
        elif hint is not None:
            wf = by_place(
                hint(s.task, view, lim).workflow(view.names()),
                plan_ids(hint(s.task, view, lim), view.names()),
            )
        else:
            wf = targets.target(s.task, view.names(), s.budget, s.deadline)
        out.append(
            {
                "prompt": chat(
                    spec_prompt(s, view, lim, max_question_chars, evidence, question_cut, rank, hint)
                ),
                "completion": [{"role": "assistant", "content": render(wf)}],
            }
        )
    return out


def grpo_records(
    specs: Sequence[PromptSpec],
    pool: Pool,
    base: RequestLimits,
    *,
    max_question_chars: int,
    evidence: Mapping[str, Mapping[str, float]] | None = None,
    question_cut: str = "head",
    rank: Rank | None = None,
    hint: Hint | None = None,
) -> list[dict[str, Any]]:
    """Conversational prompts for GRPOTrainer; extra columns reach the reward function."""
    return [
        {
            "prompt": chat(
                spec_prompt(
                    s,
                    s.pool_view(pool),
                    s.limits(base),
                    max_question_chars,
                    evidence,
                    question_cut,
                    rank,
                    hint,
                )
            ),
            "task_id": s.task.id,
            "view": list(s.view),
            # the ids the prompt's ranking (or plan) line showed (what a plan's @k names; [] for none)
            "ranking": (
                spec_ranking(s, pool, base, evidence, rank, hint)
                if hint is not None
                else shown_ranking(spec_ranking(s, pool, base, evidence, rank))
            )
            or [],
            "budget": -1.0 if s.budget is None else float(s.budget),
            "deadline": -1.0 if s.deadline is None else float(s.deadline),
        }
        for s in specs
    ]


def training_hint(plan_hint: PlanHint, tasks: Sequence[Task] = ()) -> Hint:
    """The plan line of a training prompt (``plan_hint``): a table question's leave-one-out target
    (what the warm start teaches for it); any other question's nearest table questions, with the
    questions of ``tasks`` the table lacks embedded at once (the kNN router's cached index) and
    any other (an observed request) on first use."""
    from rl_conductor.policies.knn import cached_embeddings
    from rl_conductor.policies.knn_embed import embed

    embedded: dict[str, Any] = {}
    rest = list(dict.fromkeys(t.question for t in tasks if plan_hint.needs_embedding(t)))
    if rest:
        embedded.update(zip(rest, cached_embeddings(rest), strict=True))

    def hint(task: Task, view: PoolView, limits: RequestLimits) -> Candidate:
        emb = None
        if plan_hint.needs_embedding(task):
            if task.question not in embedded:
                embedded[task.question] = embed([task.question])[0]
            emb = embedded[task.question]
        return plan_hint.plan(task, view, limits, emb)

    return hint
