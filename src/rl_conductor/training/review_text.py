"""Review targets that follow the text evidence (``review_evidence: text``, issue 22).

Why: the agreement rule of :func:`rl_conductor.training.adaptive.fit_rule` (per domain, first plan
and agree / disagree: keep or escalate) is the disagreement cascade; the texts of round 1's
answers say more about whether the answer kept is right (:mod:`rl_conductor.review_evidence`).
This module fits, on the training questions of the rounds table only, the estimator the review
prompt shows and the rule its targets follow:

1. :func:`review_rows`: every (training question, pair first plan) is executed once (the same
   executor and review hook as a request) and the review's input row is read from what came
   back: each answer's text signals and their agreement.
2. :func:`fit_text_rule`: per pair first plan, the probe "round 1's answer is right" and one probe
   per continuation worker "its answer is right" (:func:`~rl_conductor.review_evidence.fit_probe`,
   out-of-fold predictions kept), the estimated reward gain of each continuation at the trained
   reward, and ``tau`` chosen on the out-of-fold gains (:func:`~rl_conductor.review_evidence.
   choose_tau`). The decision per training question (escalate to the best-gain worker where its
   out-of-fold gain > tau) values the first plans (``adaptive_table(choice=...)``) and is the
   review target; the training prompts show the out-of-fold estimates, so they look like test
   prompts. Validation and test questions never reach a fit: only the rounds table's questions,
   which are the training split's.
3. :func:`text_hook`: the review hook that decides by that rule and renders the review prompt with
   the signals and the estimate line (``Best by estimate: @1`` or ``keep``); the escalation is
   written as the rank address ``@1`` (one constant for the model to copy, as issue 21's plans).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rl_conductor.executor import Continuation, RoundRequest
from rl_conductor.policies.base import GivenPlan
from rl_conductor.policies.baselines import SOLVE
from rl_conductor.policies.chains import Candidate
from rl_conductor.progress import run_with_progress
from rl_conductor.prompting import review_prompt
from rl_conductor.review_evidence import (
    FirstPlanEstimator,
    ReviewEvidence,
    choose_tau,
    fit_probe,
    gain_of,
    request_rows,
)
from rl_conductor.reward import RewardConfig
from rl_conductor.rounds import summarize
from rl_conductor.tasks.base import Task
from rl_conductor.training.adaptive import RoundsTable, pair
from rl_conductor.training.rounds import KEEP
from rl_conductor.workers.pool import Pool
from rl_conductor.workflow import Step, Workflow, render

__all__ = ["TextRule", "escalation", "fit_text_rule", "review_rows", "text_hook"]

#: (task id, first plan name) -> the review's input row
Rows = dict[tuple[str, str], np.ndarray]


def _pair_names(name: str) -> list[str]:
    return [w for w, _ in Candidate.parse_name(name).steps]


def review_rows(
    tasks: Sequence[Task], pool: Pool, rounds: RoundsTable, limits: Any, *, progress: bool = False
) -> Rows:
    """The review's input row of every (question, pair first plan) the rounds table ran
    (``progress``: a progress display, lines off a terminal)."""
    view = pool.view()
    names = view.names()
    by_id = {t.id: t for t in tasks}
    jobs = [
        (by_id[tid], name)
        for i, tid in enumerate(rounds.task_ids)
        for f, name in enumerate(rounds.firsts)
        if "|" in name and rounds.signal[i][f] and tid in by_id
    ]

    async def one(task: Task, name: str) -> np.ndarray | None:
        got: list[np.ndarray] = []

        async def hook(req: RoundRequest) -> Continuation:
            got.append(request_rows(req, summarize(req))[1])
            return Continuation(workflow=Workflow(steps=()))

        wf = Candidate.parse_name(name).workflow(names)
        await GivenPlan(review=hook).run_workflow(wf, task, view, replace(limits, max_rounds=2))
        return got[0] if got else None

    out = run_with_progress([one(t, n) for t, n in jobs], label="review rows", enabled=progress)
    return {(t.id, n): row for (t, n), row in zip(jobs, out, strict=True) if row is not None}


@dataclass
class TextRule:
    """The fitted estimator (saved with the model), the out-of-fold probe predictions of each
    training (question, first plan) — what its training prompt shows — and the rule's decision
    there (a continuation label of the rounds table)."""

    evidence: ReviewEvidence
    oof: dict[tuple[str, str], tuple[float, list[float]]] = field(default_factory=dict)
    choice: dict[tuple[str, str], str] = field(default_factory=dict)
    #: per first plan: tau, the out-of-fold train reward of the rule, of keep always, of the
    #: agreement rule's decisions, and how often it escalates
    summary: dict[str, dict[str, float]] = field(default_factory=dict)

    def hook(
        self,
        *,
        max_question_chars: int,
        seen: list[tuple[str, str]] | None = None,
        question_cut: str = "head",
    ) -> Any:
        """The review hook that continues by this rule (:func:`text_hook`): what callers that
        hold a rule use, so the rounds code need not import this module."""
        return text_hook(self, max_question_chars=max_question_chars, seen=seen, question_cut=question_cut)


def fit_text_rule(rounds: RoundsTable, rows: Rows, config: RewardConfig, *, seed: int = 0) -> TextRule:
    """Fit the estimator and the rule per pair first plan (module docstring)."""
    r = rounds.rewards(config)
    ev = ReviewEvidence(config=config)
    rule = TextRule(evidence=ev)
    for f, name in enumerate(rounds.firsts):
        if "|" not in name:
            continue
        items = [i for i, tid in enumerate(rounds.task_ids) if (tid, name) in rows and rounds.done[i, f, 0]]
        first = _pair_names(name)
        # a worker of the first plan would answer again as it did (replay), so it is no continuation
        conts = [
            k
            for k, lab in enumerate(rounds.conts)
            if lab != KEEP and lab[1:] not in first and items and rounds.done[items, f, k].all()
        ]
        if len(items) < 2 or not conts:
            continue
        x = np.stack([rows[(rounds.task_ids[i], name)] for i in items])
        stay, s_oof = fit_probe(x, rounds.correct[items, f, 0], seed=seed)
        probes, oofs, extra = [], [], []
        for k in conts:
            p, o = fit_probe(x, rounds.correct[items, f, k], seed=seed)
            probes.append(p)
            oofs.append(o)
            extra.append(float(np.mean(rounds.cost[items, f, k] - rounds.cost[items, f, 0])))
        p_go = np.stack(oofs, axis=1)
        gains = np.stack([gain_of(config, s_oof, p_go[:, c], extra[c]) for c in range(len(conts))], axis=1)
        best = np.argmax(gains, axis=1)
        rows_i = np.arange(len(items))
        keep_r = r[items, f, 0]
        go_r = r[items, f, np.array(conts)[best]]
        tau = choose_tau(gains[rows_i, best], keep_r, go_r)
        go = gains[rows_i, best] > tau
        workers = [rounds.conts[k][1:] for k in conts]
        ev.plans[ReviewEvidence.key(first)] = FirstPlanEstimator(
            first=first, stay=stay, workers=workers, right=probes, extra_cost=extra, tau=tau
        )
        for n, i in enumerate(items):
            tid = rounds.task_ids[i]
            rule.oof[(tid, name)] = (float(s_oof[n]), [float(v) for v in p_go[n]])
            rule.choice[(tid, name)] = rounds.conts[conts[best[n]]] if go[n] else KEEP
        rule.summary[name] = {
            "tau": float(tau),
            "n": float(len(items)),
            "escalated": float(go.mean()),
            "reward_rule_oof": float(np.mean(np.where(go, go_r, keep_r))),
            "reward_keep": float(keep_r.mean()),
            "reward_best_escalation_always": float(max(r[items, f, k].mean() for k in conts)),
        }
    return rule


def escalation(worker_id: int) -> Workflow:
    """The review's escalation: one fresh solve on ``worker_id``, written as ``@1`` (the estimate
    line's worker)."""
    return Workflow(steps=(Step(worker_id, SOLVE, (), rank=1),))


def text_hook(
    rule: TextRule,
    *,
    max_question_chars: int,
    seen: list[tuple[str, str]] | None = None,
    out_of_fold: bool = True,
    question_cut: str = "head",
) -> Any:
    """A review hook that continues by ``rule``'s estimate (keep where no estimator covers the
    first plan). With ``seen``, each review's (prompt, continuation as the Conductor writes it)
    is appended; ``out_of_fold``: training questions show their out-of-fold estimates;
    ``question_cut``: how the prompt cuts the question (the first round's cut)."""

    async def review(req: RoundRequest) -> Continuation:
        summary = summarize(req)
        first = _first_key(req)
        probs = rule.oof.get((req.task.id, first)) if out_of_fold and first else None
        sig, est, wid = rule.evidence.estimate(req, summary, probs=probs)
        cont = escalation(wid) if est is not None and est.escalate and wid is not None else Workflow(steps=())
        if seen is not None:
            prompt = review_prompt(
                req,
                summary,
                max_question_chars=max_question_chars,
                signals=[s.text() for s in sig],
                estimate=None if est is None else est.line(wid),
                question_cut=question_cut,
            )
            seen.append((prompt, render(cont)))
        return Continuation(workflow=cont, text=render(cont), agree=summary.agree)

    return review


def _first_key(req: RoundRequest) -> str | None:
    """The rounds table's name of ``req``'s first plan when it is a pair of fresh solves."""
    steps, names = req.workflow.steps, req.view.names()
    if len(steps) != 2 or any(s.visible(i) for i, s in enumerate(steps)):
        return None
    return pair(names[steps[0].worker], names[steps[1].worker]).name
