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

   Per domain of the pair's questions, a simpler or a more local rule may take that rule's place
   (``ReviewEvidence.domain_plans``; the review reads the question's domain): the agreement rule
   (:class:`~rl_conductor.review_evidence.SignalRule`, keep or escalate per agreement line, the
   disagreement cascade ``cascade:domain`` follows) unless the shared text rule earns more by half
   a paired standard error of held-out reward (``tau`` chosen on the other folds, the agreement
   rule refitted per fold), and a text rule fitted on the domain alone where it earns more than
   both by that margin (:data:`REVIEW_SE_RULE`). Where the agreement rule decides, the training
   prompts show its line, not the probes'.
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
    Estimator,
    FirstPlanEstimator,
    ReviewEvidence,
    SignalRule,
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
    #: per first plan: domain -> the rule its reviews follow where it is not the shared text rule
    #: (``domain text`` or ``agreement``)
    domain_rules: dict[str, dict[str, str]] = field(default_factory=dict)

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


#: a domain's own text rule is fitted for a pair first plan of several domains only where the
#: domain has at least this many of its questions (fewer: the shared rule alone)
MIN_DOMAIN_ITEMS = 100
#: the agreement rule (:class:`~rl_conductor.review_evidence.SignalRule`) is weighed for a domain
#: with at least this many questions of the first plan; its out-of-fold folds
MIN_SIGNAL_ITEMS = 20
SIGNAL_FOLDS = 5
#: a rule with more parameters replaces a simpler one for a domain (a domain's own text rule the
#: shared one; any text rule the agreement rule) only where its held-out reward there is higher by
#: more than this many paired standard errors: out of fold, a text rule fitted on noise still beat
#: the agreement rule on 5 of 30 small (30-question) domains by chance, 1 with the margin
REVIEW_SE_RULE = 0.5


def _beats(new: np.ndarray, old: np.ndarray) -> bool:
    """Whether per-item rewards ``new`` beat ``old`` by more than :data:`REVIEW_SE_RULE` paired
    standard errors (a gain with no spread counts when positive)."""
    gain = np.asarray(new, dtype=np.float64) - np.asarray(old, dtype=np.float64)
    if len(gain) < 2:
        return False
    return bool(gain.mean() > REVIEW_SE_RULE * gain.std(ddof=1) / np.sqrt(len(gain)))


@dataclass
class _Fit:
    """One estimator fitted on some rows of the rounds table, with its out-of-fold decisions."""

    estimator: FirstPlanEstimator
    s_oof: np.ndarray
    p_go: np.ndarray
    go: np.ndarray
    best: np.ndarray
    conts: list[int]
    reward: np.ndarray  # per item: the out-of-fold rule's reward (tau chosen on every item)
    keep_r: np.ndarray
    #: per item: the reward where each fold's ``tau`` was chosen on the other folds, what the
    #: rules of one domain are compared by (``reward`` picks ``tau`` on the rows it scores)
    held_out: np.ndarray

    def decision(self, rounds: RoundsTable, n: int) -> str:
        """Item ``n``'s continuation label under this rule."""
        return rounds.conts[self.conts[self.best[n]]] if self.go[n] else KEEP

    def shown(self, n: int) -> tuple[float, list[float]]:
        """Item ``n``'s out-of-fold estimates, what its training prompt shows."""
        return float(self.s_oof[n]), [float(v) for v in self.p_go[n]]


def _fit_rule_on(
    rounds: RoundsTable, rows: Rows, r: np.ndarray, f: int, items: list[int], config: RewardConfig, seed: int
) -> _Fit | None:
    """The probes, gains and ``tau`` of first plan ``f`` fitted on ``items`` alone (None: too few
    items or no continuation run on all of them)."""
    name = rounds.firsts[f]
    first = _pair_names(name)
    # a worker of the first plan would answer again as it did (replay), so it is no continuation
    conts = [
        k
        for k, lab in enumerate(rounds.conts)
        if lab != KEEP and lab[1:] not in first and items and rounds.done[items, f, k].all()
    ]
    if len(items) < 2 or not conts:
        return None
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
    top = gains[rows_i, best]
    tau = choose_tau(top, keep_r, go_r)
    go = top > tau
    held_out = np.where(go, go_r, keep_r)
    fold = rows_i % SIGNAL_FOLDS
    for k in range(SIGNAL_FOLDS) if len(items) >= SIGNAL_FOLDS else []:
        out = fold == k
        t_k = choose_tau(top[~out], keep_r[~out], go_r[~out])
        held_out[out] = np.where(top[out] > t_k, go_r[out], keep_r[out])
    workers = [rounds.conts[k][1:] for k in conts]
    est = FirstPlanEstimator(first=first, stay=stay, workers=workers, right=probes, extra_cost=extra, tau=tau)
    return _Fit(est, s_oof, p_go, go, best, conts, np.where(go, go_r, keep_r), keep_r, held_out)


def _signal_choice(
    rounds: RoundsTable, r: np.ndarray, f: int, fit_on: Sequence[int], conts: Sequence[int]
) -> dict[str, int]:
    """Per signal of first plan ``f``: the column (keep = 0, or one of ``conts``) of the best mean
    reward over the rows ``fit_on`` of that signal; ties keep."""
    groups: dict[str, list[int]] = {}
    for i in fit_on:
        groups.setdefault(rounds.signal[i][f], []).append(i)
    out: dict[str, int] = {}
    for sig, rows_s in groups.items():
        means = [(float(r[rows_s, f, k].mean()), -n, k) for n, k in enumerate([0, *conts])]
        out[sig] = max(means)[2]
    return out


def _fit_signal_on(
    rounds: RoundsTable, r: np.ndarray, f: int, items: list[int]
) -> tuple[SignalRule, np.ndarray, list[str]] | None:
    """The agreement rule of first plan ``f`` on ``items``: the rule fitted on all of them, its
    out-of-fold reward per item (each fold decided by the rule of the others) and its in-sample
    decision per item (a continuation label); None where no continuation ran on every item."""
    first = _pair_names(rounds.firsts[f])
    conts = [
        k
        for k, lab in enumerate(rounds.conts)
        if lab != KEEP and lab[1:] not in first and rounds.done[items, f, k].all()
    ]
    if len(items) < 2 or not conts:
        return None
    idx = np.arange(len(items))
    oof = np.zeros(len(items))
    for fold in range(SIGNAL_FOLDS):
        held = idx % SIGNAL_FOLDS == fold
        choice = _signal_choice(rounds, r, f, [items[n] for n in idx[~held]], conts)
        for n in idx[held]:
            i = items[n]
            oof[n] = r[i, f, choice.get(rounds.signal[i][f], 0)]
    full = _signal_choice(rounds, r, f, items, conts)
    by_signal: dict[str, tuple[str | None, float, float, float, bool]] = {}
    for sig, k in full.items():
        rows_s = [i for i in items if rounds.signal[i][f] == sig]
        p_keep = float(rounds.correct[rows_s, f, 0].mean())
        # the line names the best continuation and its gain whether or not the rule takes it
        up = k if k else max(conts, key=lambda c: (float(r[rows_s, f, c].mean()), -c))
        gain = float((r[rows_s, f, up] - r[rows_s, f, 0]).mean())
        p_up = float(rounds.correct[rows_s, f, up].mean())
        by_signal[sig] = (rounds.conts[up][1:], p_keep, p_up, gain, bool(k))
    fallback = (None, float(rounds.correct[items, f, 0].mean()), 0.0, 0.0, False)
    labels = [rounds.conts[full[rounds.signal[i][f]]] if full[rounds.signal[i][f]] else KEEP for i in items]
    return SignalRule(first=first, by_signal=by_signal, fallback=fallback), oof, labels


def fit_text_rule(rounds: RoundsTable, rows: Rows, config: RewardConfig, *, seed: int = 0) -> TextRule:
    """Fit the estimator and the rule per pair first plan (module docstring).

    A pair that is a first plan in several domains gets one rule fitted on all of their questions
    (the shared rule) and, for each domain with at least :data:`MIN_DOMAIN_ITEMS` of them, a rule
    fitted on that domain's alone, kept where its out-of-fold reward there is above the shared
    rule's on the same questions (``ReviewEvidence.domain_plans``; the review reads the
    question's domain). Why: on an outside tester's file the pair ``deepseek-v3 | gpt-4o`` was a
    first plan of code and science; the one rule over both escalated where science's answers
    said keep, so science's targets never chose the pair, while the cascade fitted on science
    alone (keep when they agree, else claude) beat its best single on test."""
    r = rounds.rewards(config)
    ev = ReviewEvidence(config=config)
    rule = TextRule(evidence=ev)
    for f, name in enumerate(rounds.firsts):
        if "|" not in name:
            continue
        items = [i for i, tid in enumerate(rounds.task_ids) if (tid, name) in rows and rounds.done[i, f, 0]]
        shared = _fit_rule_on(rounds, rows, r, f, items, config, seed)
        if shared is None:
            continue
        key = ReviewEvidence.key(shared.estimator.first)
        ev.plans[key] = shared.estimator
        pos = {i: n for n, i in enumerate(items)}
        # per item: its out-of-fold reward, the decision that values it, and its training estimate
        oof_reward = shared.reward.copy()  # what the summary reports (as before)
        held = shared.held_out.copy()  # what the rules of a domain are compared by
        decision = [shared.decision(rounds, n) for n in range(len(items))]
        probs: list[tuple[float, list[float]] | None] = [shared.shown(n) for n in range(len(items))]
        domains = sorted({rounds.domains[i] for i in items})
        kept: dict[str, str] = {}
        for d in domains:
            mine = [i for i in items if rounds.domains[i] == d]
            at = [pos[i] for i in mine]
            # the held-out rewards of the rule kept so far; the simplest first: the agreement rule
            # (a keep-or-escalate per signal), then the text rules, each kept only by a margin
            best_kind, best_held = "shared text", held[at]
            found: Estimator | None = None
            agree = _fit_signal_on(rounds, r, f, mine) if len(mine) >= MIN_SIGNAL_ITEMS else None
            if agree is not None and not _beats(held[at], agree[1]):
                best_kind, best_held, found = "agreement", agree[1], agree[0]
                for n, i in enumerate(mine):
                    oof_reward[pos[i]] = agree[1][n]
                    decision[pos[i]] = agree[2][n]
                    probs[pos[i]] = None  # the rule reads the signal, not probes
            if len(domains) > 1 and len(mine) >= MIN_DOMAIN_ITEMS:
                own = _fit_rule_on(rounds, rows, r, f, mine, config, seed)
                if own is not None and _beats(own.held_out, best_held) and _beats(own.held_out, held[at]):
                    best_kind, best_held, found = "domain text", own.held_out, own.estimator
                    for n, i in enumerate(mine):
                        oof_reward[pos[i]] = own.reward[n]
                        decision[pos[i]] = own.decision(rounds, n)
                        probs[pos[i]] = own.shown(n)
            if found is not None:
                ev.domain_plans.setdefault(d, {})[key] = found
                kept[d] = best_kind
        for n, i in enumerate(items):
            tid = rounds.task_ids[i]
            shown = probs[n]
            if shown is not None:
                rule.oof[(tid, name)] = shown
            rule.choice[(tid, name)] = decision[n]
        rule.summary[name] = {
            "tau": float(shared.estimator.tau),
            "n": float(len(items)),
            "escalated": float(np.mean([c != KEEP for c in decision])),
            "reward_rule_oof": float(oof_reward.mean()),
            "reward_keep": float(shared.keep_r.mean()),
            "reward_best_escalation_always": float(max(r[items, f, k].mean() for k in shared.conts)),
        }
        if kept:
            rule.domain_rules[name] = kept
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
