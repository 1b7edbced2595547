"""Warm-start targets for a Conductor that reviews: first plans valued by what their best review earns.

Why it exists: with one round, a first plan's value is its own reward, and two cheap workers
answering in parallel never pay (they cost two calls and answer like the better one). With a
review they do: where their answers agree the Conductor keeps the answer, where they disagree it
escalates to a stronger worker. So when ``TrainConfig.max_rounds > 1`` the candidate table's
first plans are valued *with* their best continuation (issue 22, item 2):

1. First plans: every single worker, and pairs of two *different* workers solving in parallel
   (both ``access []``; on a replay pool a second sample of the same worker is the same recorded
   answer). Pairs are drawn from the ``pair_k`` most accurate workers whose mean single cost is
   below the most accurate worker's (per domain, from the table's single rows); the less accurate
   one goes first, so that on agreement-or-keep the final answer is the better worker's.
2. Continuations: keep, or one fresh solve on one of the ``top_k`` most accurate workers
   (:func:`rl_conductor.training.rounds.continuations`, restricted); with ``shared_continuations``
   (the text rule, fitted per first plan across domains, which weighs only continuations run on
   all of its questions) after a pair those of every domain the pair is a first plan of. Each
   (question, first plan, continuation) is executed through the real executor with the review
   hook, on the same budget and deadline rule as a request: :class:`RoundsTable`, cached on disk
   like the candidate table.
3. The rule: per (domain, first plan, review signal) — the signal is :mod:`rl_conductor.rounds`'s
   agreement line (agree / disagree / one answer), what the review prompt shows — the
   continuation with the best mean reward on the training questions (what ``policies/cascade.py``
   fits for its one pair, here for every first plan); with ``warm_review_se_rule`` > 0 an
   escalation must beat keep by that many paired standard errors. A first plan's value on a question is its
   reward under that rule; :func:`adaptive_table` writes those values into the candidate table's
   unlimited column (and adds the pairs), so :class:`~rl_conductor.training.warmstart.ExpectedRewards`
   picks first plans as before (neighbourhoods, the standard-error rule, per-question evidence).

What it deliberately simplifies: the budget and deadline columns keep their one-round values and
pairs are not run there (a prompt with a budget or deadline gets a one-round target); singles
and the candidate table's chains keep their one-round value and the rule "keep" after them (after
one answer the review knows nothing a first plan could not, and measured on gsm8k-six the fitted
"escalate always after gpt3-6b" made the per-question evidence of the singles, which is about the
single's own answer, point at plans whose answer came from another worker); the rule is
fitted in-sample on the table's questions, as the fixed cascade is; one review (two rounds).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rl_conductor.executor import Continuation, RoundRequest
from rl_conductor.fingerprint import code_version, recordings_fingerprint
from rl_conductor.limits import DEFAULT_MAX_STEPS, RequestLimits
from rl_conductor.policies.base import GivenPlan
from rl_conductor.policies.baselines import SOLVE
from rl_conductor.policies.chains import PairCandidate, pair
from rl_conductor.policies.routers import own_final_answer
from rl_conductor.progress import run_with_progress
from rl_conductor.prompting import review_prompt
from rl_conductor.reward import RewardConfig, budget_stopped, grade_trace, reward_of
from rl_conductor.rounds import summarize
from rl_conductor.tasks.base import Task
from rl_conductor.training.candidates import (
    Candidate,
    CandidateTable,
    cache_or_build,
    items_digest,
    load_arrays,
    save_arrays,
    single,
)
from rl_conductor.training.rounds import KEEP, run_continued
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Step, Workflow, render

log = logging.getLogger(__name__)

__all__ = [
    "ADAPTIVE_VERSION",
    "PairCandidate",
    "RoundsTable",
    "adaptive_table",
    "build_rounds_table",
    "cached_rounds_table",
    "continuation_workflow",
    "fit_rule",
    "review_records",
    "rule_hook",
]

#: Bump when the rounds table's meaning changes (part of its cache key). 2: recorded texts without
#: a gold answer agree by their stated answers (``graders.RecordedGrader.extract``), not never.
#: 3: a cell is credited when its final answer is the named workers' own (``own_final_answer``),
#: not wrong wherever any step was replaced.
ADAPTIVE_VERSION = 3
#: bumped when :func:`cascade_sets` nominates other pairs (in the cache key of tables that use it)
CASCADE_SETS_VERSION = 4


def continuation_workflow(label: str, names: Sequence[str]) -> Workflow:
    """Keep (no steps) or ``+worker``: one fresh solve on that worker (an ordinal of ``names``)."""
    if label == KEEP:
        return Workflow(steps=())
    return Workflow(steps=(Step(list(names).index(label[1:]), SOLVE, ()),))


@dataclass
class RoundsTable:
    """Outcomes of (question, first plan, continuation), arrays ``[items, firsts, conts]``;
    ``signal[i][f]`` is the review's agreement line ("" where the first plan was not run)."""

    task_ids: list[str]
    domains: list[str]
    firsts: list[str]
    conts: list[str]
    signal: list[list[str]]
    correct: np.ndarray
    cost: np.ndarray
    stopped: np.ndarray
    calls: np.ndarray
    done: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def rewards(self, config: RewardConfig) -> np.ndarray:
        """``reward_of`` over the cells (NaN where not run)."""
        r = reward_of(
            config, correct=self.correct, cost=self.cost, called=self.calls > 0, budget_stopped=self.stopped
        )
        return np.where(self.done, r, np.nan)

    def save(self, path: Path) -> None:
        header = {k: getattr(self, k) for k in ("task_ids", "domains", "firsts", "conts", "signal", "meta")}
        arrays = {k: getattr(self, k) for k in ("correct", "cost", "stopped", "calls", "done")}
        save_arrays(path, header, **arrays)

    @classmethod
    def load(cls, path: Path) -> RoundsTable:
        header, arrays = load_arrays(path)
        return cls(**header, **arrays)


def domain_sets(table: CandidateTable, top_k: int, pair_k: int) -> dict[str, tuple[list[str], list[str]]]:
    """Domain -> (the continuation workers: the ``top_k`` most accurate alone; the pair workers:
    the ``pair_k`` most accurate of those cheaper on average than the most accurate), from the
    table's unlimited single-worker rows."""
    singles = {c.steps[0][0]: j for j, c in enumerate(table.candidates) if len(c.steps) == 1}
    out: dict[str, tuple[list[str], list[str]]] = {}
    for d in sorted(set(table.domains)):
        rows = [i for i, x in enumerate(table.domains) if x == d]
        acc = {w: float(table.correct[rows, j, 0].mean()) for w, j in singles.items()}
        cost = {w: float(table.cost[rows, j, 0].mean()) for w, j in singles.items()}
        ranked = sorted(acc, key=lambda w: (-acc[w], cost[w], w))
        cheap = [w for w in ranked if cost[w] < cost[ranked[0]]][:pair_k]
        out[d] = (ranked[:top_k], cheap)
    return out


def cascade_sets(
    tasks: Sequence[Task], pool: Pool, table: CandidateTable, config: RewardConfig, n: int
) -> dict[str, tuple[list[tuple[str, str]], list[str]]]:
    """Domain -> (the first pairs of the ``n`` best escalating fixed cascades fitted on the domain's table
    questions at ``config``, each ordered less accurate first as :func:`domain_firsts` orders; their
    escalation workers).

    Why: the pairs of :func:`domain_sets` are the most accurate cheap workers, but what makes a
    pair pay under a review is that its *disagreements* are informative, which accuracy alone does
    not say. On an eleven-worker simulated file the fixed cascade ``cascade:all`` (a pair of two
    cheap workers, neither among the four most accurate, escalating on disagreement) beat every
    Conductor on both splits, because its pair was never a first-plan candidate. The cascade fit
    (:func:`rl_conductor.policies.cascade.fit_cascade`: every pair and escalation worker on every
    question's measured answers) nominates the pairs that pay; the rounds table then runs them
    with every continuation and review like the others."""
    from rl_conductor.policies.cascade import fit_cascade, sample_outcomes

    singles = {c.steps[0][0]: j for j, c in enumerate(table.candidates) if len(c.steps) == 1}
    by_id = {t.id: t for t in tasks}
    out: dict[str, tuple[list[tuple[str, str]], list[str]]] = {}
    for d in sorted(set(table.domains)):
        rows = [i for i, x in enumerate(table.domains) if x == d]
        acc = {w: float(table.correct[rows, j, 0].mean()) for w, j in singles.items()}
        cost = {w: float(table.cost[rows, j, 0].mean()) for w, j in singles.items()}
        # domain_sets' ranking (accuracy, then cost, then name): the lower-ranked solves first
        rank = {w: k for k, w in enumerate(sorted(acc, key=lambda w: (-acc[w], cost[w], w)))}
        mine = [by_id[table.task_ids[i]] for i in rows]
        pairs: list[tuple[str, str]] = []
        ups: list[str] = []
        for fit in fit_cascade(sample_outcomes(pool, mine), mine, config):
            a, b = fit.first
            # a replay worker asked twice answers the same: no pair; a cascade that never escalates
            # is two answers and a keep, whose disagreements pay nothing: not what is nominated
            if a == b or fit.escalate is None:
                continue
            ordered = tuple(sorted((a, b), key=lambda w: -rank.get(w, len(rank))))
            if ordered not in pairs:
                if len(pairs) == n:
                    break
                pairs.append(ordered)  # type: ignore[arg-type]
                if fit.escalate is not None and fit.escalate not in ups:
                    ups.append(fit.escalate)
        out[d] = (pairs, ups)
    return out


def domain_firsts(top: Sequence[str], cheap: Sequence[str], names: Sequence[str]) -> list[Candidate]:
    """Every single of ``names`` and every pair of two different ``cheap`` workers (ranked best
    first: the less accurate solves first, the better one gives the answer kept)."""
    out: list[Candidate] = [single(w) for w in names]
    for i, b in enumerate(cheap):
        for a in cheap[i + 1 :]:
            out.append(pair(a, b))
    return out


async def _execute_cell(
    task: Task, view: PoolView, first: Workflow, cont: Workflow, limits: RequestLimits
) -> tuple[str, bool, float, bool, int]:
    trace, seen = await run_continued(task, view, first, cont, limits)
    correct = grade_trace(task, trace) and own_final_answer(trace)
    line = seen[1] if seen is not None else ""
    return (line, correct, trace.cost_usd, budget_stopped(trace), len(trace.attempts))


def build_rounds_table(
    tasks: Sequence[Task],
    pool: Pool,
    table: CandidateTable,
    *,
    top_k: int = 3,
    pair_k: int = 4,
    max_steps: int = DEFAULT_MAX_STEPS,
    cascade_pairs: int = 0,
    config: RewardConfig | None = None,
    shared_continuations: bool = False,
    progress: bool = False,
) -> RoundsTable:
    """Execute every (question of ``table``, first plan, continuation) (module docstring); with
    ``cascade_pairs``, also the first pairs (and escalation workers) of that many best fixed
    cascades per domain at ``config`` (:func:`cascade_sets`); with ``shared_continuations`` a
    pair's continuations are those of all its domains together, on each of its questions."""
    view = pool.view()
    names = view.names()
    by_id = {t.id: t for t in tasks}
    items = [by_id[i] for i in table.task_ids]
    sets = domain_sets(table, top_k, pair_k)
    per_domain = {d: domain_firsts(top, cheap, names) for d, (top, cheap) in sets.items()}
    # domain -> nominated pair's name -> its cascades' escalation workers (continuations run after
    # that pair only: after the others they would be cells no rule reads)
    nominated: dict[str, dict[str, set[str]]] = {}
    if cascade_pairs > 0:
        if config is None:
            raise ValueError("cascade_pairs needs the reward the cascades are fitted at")
        for d, (extra, ups) in cascade_sets(items, pool, table, config, cascade_pairs).items():
            known = {c.name for c in per_domain[d]}
            for a, b in extra:
                name = next((n for n in (pair(a, b).name, pair(b, a).name) if n in known), None)
                if name is None:
                    per_domain[d].append(pair(a, b))
                    name = pair(a, b).name
                    known.add(name)
                nominated.setdefault(d, {})[name] = set(ups)
    firsts = list(dict.fromkeys(c.name for cs in per_domain.values() for c in cs))
    ups_all = sorted({w for by_pair in nominated.values() for ws in by_pair.values() for w in ws})
    conts = [
        KEEP,
        *dict.fromkeys([*(f"+{w}" for top, _ in sets.values() for w in top), *(f"+{w}" for w in ups_all)]),
    ]
    shape = (len(items), len(firsts), len(conts))
    arrays = {
        "correct": np.zeros(shape, dtype=bool),
        "cost": np.zeros(shape),
        "stopped": np.zeros(shape, dtype=bool),
        "calls": np.zeros(shape, dtype=np.int32),
        "done": np.zeros(shape, dtype=bool),
    }
    signal = [["" for _ in firsts] for _ in items]
    jobs: list[tuple[Task, Workflow, Workflow]] = []
    where: list[tuple[int, int, int]] = []
    # with shared_continuations, a pair's continuations are the same on every question it is run
    # on: those its domains nominate, together. The text rule (training/review_text.py) is fitted
    # per first plan across domains and weighs only continuations run on all of its questions;
    # without this it saw only the escalations every domain shared (on a latent-difficulty file
    # never the one that paid). The agreement rule is fitted per domain and needs none of it.
    shared: dict[str, set[str]] = defaultdict(set)
    for d, cs in per_domain.items():
        for c in cs:
            if shared_continuations and "|" in c.name:
                shared[c.name] |= set(sets[d][0]) | nominated.get(d, {}).get(c.name, set())
    for i, t in enumerate(items):
        top = set(sets[t.domain][0])
        for c in per_domain[t.domain]:
            f = firsts.index(c.name)
            allowed = shared.get(c.name) or top | nominated.get(t.domain, {}).get(c.name, set())
            for k, label in enumerate(conts):
                if label != KEEP and label[1:] not in allowed:
                    continue
                jobs.append((t, c.workflow(names), continuation_workflow(label, names)))
                where.append((i, f, k))
    log.info(
        "rounds table: %d items x %d first plans x %d continuations, %d executions",
        len(items),
        len(firsts),
        len(conts),
        len(jobs),
    )
    limits = RequestLimits(max_steps=max_steps)
    outs = run_with_progress(  # minutes on a large file: a log must show that work goes on
        [_execute_cell(t, view, first, cont, limits) for t, first, cont in jobs],
        label="rounds table",
        enabled=progress,
    )
    for (i, f, k), (line, correct, cost, stopped, calls) in zip(where, outs, strict=True):
        arrays["correct"][i, f, k] = correct
        arrays["cost"][i, f, k] = cost
        arrays["stopped"][i, f, k] = stopped
        arrays["calls"][i, f, k] = calls
        arrays["done"][i, f, k] = True
        if k == 0:
            signal[i][f] = line
    return RoundsTable(
        task_ids=list(table.task_ids),
        domains=list(table.domains),
        firsts=firsts,
        conts=conts,
        signal=signal,
        meta={
            "top_k": top_k,
            "pair_k": pair_k,
            "version": ADAPTIVE_VERSION,
            "pool": pool.name,
            **({"cascade_pairs": cascade_pairs} if cascade_pairs else {}),
            **({"shared_continuations": True} if shared_continuations else {}),
        },
        **arrays,
    )


def cached_rounds_table(
    tasks: Sequence[Task],
    pool: Pool,
    table: CandidateTable,
    cache_dir: Path | None,
    *,
    top_k: int = 3,
    pair_k: int = 4,
    max_steps: int = DEFAULT_MAX_STEPS,
    cascade_pairs: int = 0,
    config: RewardConfig | None = None,
    shared_continuations: bool = False,
    progress: bool = False,
) -> RoundsTable:
    """:func:`build_rounds_table`, read from / written to ``cache_dir`` (the key covers the
    candidate table's questions and single-worker outcomes, the pool and the sizes; with
    ``cascade_pairs`` also the reward the cascades are fitted at; with ``shared_continuations``
    that flag, so a table without it keeps its key)."""

    def build() -> RoundsTable:
        return build_rounds_table(
            tasks, pool, table, top_k=top_k, pair_k=pair_k, max_steps=max_steps,
            cascade_pairs=cascade_pairs, config=config, shared_continuations=shared_continuations,
            progress=progress,
        )  # fmt: skip

    if cache_dir is None:
        return build()
    nominated = (
        {
            "cascade_pairs": cascade_pairs,
            "cascade_sets": CASCADE_SETS_VERSION,  # what cascade_sets nominates (code_version omits it)
            "reward": None if config is None else repr(config),
        }
        if cascade_pairs
        else {}  # the key of a table without them is as before: existing caches stay valid
    )
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                "version": ADAPTIVE_VERSION,
                "pool": pool.name,
                "workers": [[i.name, i.price_in, i.price_out] for i in pool.view().infos()],
                "tasks": table.task_ids,
                "top_k": top_k,
                "pair_k": pair_k,
                "max_steps": max_steps,
                "table": table.meta,
                "items": items_digest(tasks),
                "code": code_version(),  # the graders' answer keys decide agreement
                "recordings": recordings_fingerprint(pool.options),  # an edited file's texts
                **nominated,
                # only when set: the key of a table without it is as before
                **({"shared_continuations": True} if shared_continuations else {}),
            },
            sort_keys=True,
        ).encode()
    )
    h.update(np.ascontiguousarray(table.correct[:, :, 0]).tobytes())
    h.update(np.ascontiguousarray(table.cost[:, :, 0]).tobytes())
    path = Path(cache_dir) / f"rounds-{pool.name}-{h.hexdigest()[:20]}.npz"
    return cache_or_build(
        path,
        RoundsTable.load,
        build,
        what="rounds table",
        logger=log,
    )


#: (domain, first plan name, signal) -> continuation label
Rule = dict[tuple[str, str, str], str]


def fit_rule(rounds: RoundsTable, config: RewardConfig, se_rule: float = 0.0) -> Rule:
    """Per (domain, first plan, signal): the continuation with the best mean reward over the
    questions in that group (ties: keep first, then the table's order).

    ``se_rule`` (``TrainConfig.warm_review_se_rule``): the best continuation replaces keep only
    where its mean gain over keep exceeds ``se_rule`` paired standard errors of that gain. Why:
    the rule is fitted in-sample, one argmax per group; a group where escalating pays a fraction
    of a standard error more than keeping is noise that costs a call on every later question like
    it (0 = the best mean, as before). With the rule, a group of fewer than two questions run
    with both keeps; a gain that is the same on every question (no spread) escalates."""
    r = rounds.rewards(config)
    groups: dict[tuple[str, str, str], list[tuple[int, int]]] = defaultdict(list)
    for i, d in enumerate(rounds.domains):
        for f, name in enumerate(rounds.firsts):
            if rounds.signal[i][f]:
                groups[(d, name, rounds.signal[i][f])].append((i, f))
    rule: Rule = {}
    keep = rounds.conts.index(KEEP) if KEEP in rounds.conts else None
    for key, cells in groups.items():
        if "|" not in key[1]:
            continue  # a single keeps (module docstring)
        rows = np.array([i for i, _ in cells])
        f = cells[0][1]
        vals = r[rows, f, :]
        ok = ~np.isnan(vals).any(axis=0)
        if not ok.any():
            continue  # no continuation measured on every question of the group: keep (the default)
        means = np.where(ok, np.nan_to_num(vals).mean(axis=0), -np.inf)
        best = int(np.argmax(means))
        if keep is not None and ok[keep] and means[keep] >= means[best]:
            best = keep  # a tie keeps
        if se_rule > 0 and keep is not None and best != keep:
            # the gain over the questions where both were run; fewer than two: no evidence, keep
            both = ~np.isnan(vals[:, keep])
            gain = vals[both, best] - vals[both, keep]
            if len(gain) < 2 or gain.mean() <= se_rule * gain.std(ddof=1) / np.sqrt(len(gain)):
                best = keep
        rule[key] = rounds.conts[best]
    return rule


def adaptive_table(
    table: CandidateTable,
    rounds: RoundsTable,
    rule: Rule,
    choice: Mapping[tuple[str, str], str] | None = None,
) -> CandidateTable:
    """The candidate table with the rounds table's first plans valued under ``rule`` in the
    unlimited column (pairs appended; not run under budgets or deadlines) — module docstring.
    ``choice``: per (task id, first plan) the continuation of another rule (the text rule of
    ``training/review_text.py``), used instead of ``rule`` where it has one."""
    pos = {c.name: j for j, c in enumerate(table.candidates)}
    new = [Candidate.parse_name(n) for n in rounds.firsts if n not in pos]
    cands = [*table.candidates, *new]
    pos.update({c.name: len(table.candidates) + k for k, c in enumerate(new)})
    n_i, _, n_b = table.correct.shape
    extra = len(new)

    def grow(a: np.ndarray, fill: Any) -> np.ndarray:
        return np.concatenate([a, np.full((n_i, extra, n_b), fill, dtype=a.dtype)], axis=1)

    out = replace(
        table,
        candidates=cands,
        correct=grow(table.correct, False),
        cost=grow(table.cost, 0.0),
        stopped=grow(table.stopped, False),
        tokens=grow(table.tokens, 0),
        done=grow(table.done, False),
        calls=grow(table.calls if table.calls is not None else table.done.astype(np.int32), 0),
        cut=None if table.cut is None else grow(table.cut, False),
        meta={**table.meta, "rounds": rounds.meta},
    )
    row = {tid: i for i, tid in enumerate(rounds.task_ids)}
    for i, tid in enumerate(table.task_ids):
        ri = row.get(tid)
        if ri is None:
            continue
        for f, name in enumerate(rounds.firsts):
            sig = rounds.signal[ri][f]
            if not sig or "|" not in name:
                continue
            label = rule.get((rounds.domains[ri], name, sig), KEEP)
            if choice is not None:
                label = choice.get((tid, name), label)
            k = rounds.conts.index(label)
            if not rounds.done[ri, f, k]:
                continue
            j = pos[name]
            out.correct[i, j, 0] = rounds.correct[ri, f, k]
            out.cost[i, j, 0] = rounds.cost[ri, f, k]
            out.stopped[i, j, 0] = rounds.stopped[ri, f, k]
            assert out.calls is not None
            out.calls[i, j, 0] = rounds.calls[ri, f, k]
            out.done[i, j, 0] = True
    return out


def _first_name(workflow: Workflow, names: Sequence[str]) -> str | None:
    """The first-plan name of ``workflow`` if it is a single fresh solve or a parallel pair."""
    steps = workflow.steps
    if len(steps) == 1:
        return single(names[steps[0].worker]).name
    if len(steps) == 2 and all(tuple(s.visible(i)) == () for i, s in enumerate(steps)):
        return pair(names[steps[0].worker], names[steps[1].worker]).name
    return None


def rule_hook(
    rule: Rule,
    *,
    max_question_chars: int,
    seen: list[tuple[str, str]] | None = None,
    question_cut: str = "head",
) -> Any:
    """A review hook that continues by ``rule`` (keep where the first plan has no rule, or the
    continuation's worker is not shown). With ``seen``, each review's (prompt, continuation
    rendered as the Conductor writes it) is appended."""

    async def review(req: RoundRequest) -> Continuation:
        summary = summarize(req)
        names = req.view.names()
        name = _first_name(req.workflow, names)
        label = rule.get((req.task.domain, name, summary.line()), KEEP) if name else KEEP
        if label != KEEP and label[1:] not in names:
            label = KEEP
        cont = continuation_workflow(label, names)
        if seen is not None:
            prompt = review_prompt(
                req, summary, max_question_chars=max_question_chars, question_cut=question_cut
            )
            seen.append((prompt, render(cont)))
        return Continuation(workflow=cont, text=render(cont), agree=summary.agree)

    return review


def review_records(
    specs: Sequence[Any],
    pool: Pool,
    base: RequestLimits,
    first_targets: Sequence[Workflow],
    rule: Rule,
    *,
    max_question_chars: int,
    text: Any = None,
    question_cut: str = "head",
) -> list[dict[str, Any]]:
    """SFT pairs for the review: each spec's target first plan executed (the spec's view and
    limits, two rounds), the review prompt the Conductor then sees, and the continuation the
    rule picks for (first plan, signal): keep where the rule has none (a single, a chain, a
    prompt with a budget or deadline — the table valued those first plans without a review).
    The decisions after singles and pairs are balanced (:func:`balance_decisions`); the keeps
    after chains and limited prompts are interleaved with them, at most as many.

    Why every first plan, not only the rule's pairs: a Conductor that never saw a review after
    a chain generalises from the pairs' reviews — it escalates after a chain (on paper-sim the
    best code plan) to a fresh solve that sees nothing, and loses what the chain had earned
    (benchmarks/README.md, measured design choices). With ``text`` (a
    ``training.review_text.TextRule``) the prompt shows the text evidence and the continuation
    follows its estimate instead."""
    from rl_conductor.training.data import chat

    async def one(spec: Any, wf: Workflow) -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        view = spec.pool_view(pool)
        hook = (
            rule_hook(rule, max_question_chars=max_question_chars, seen=seen, question_cut=question_cut)
            if text is None
            else text.hook(max_question_chars=max_question_chars, seen=seen, question_cut=question_cut)
        )
        limits = replace(spec.limits(base), max_rounds=2)
        await GivenPlan(review=hook).run_workflow(wf, spec.task, view, limits)
        return seen

    jobs = list(zip(specs, first_targets, strict=True))
    keep = render(Workflow(steps=()))

    async def run_all() -> list[list[tuple[str, str]]]:
        return list(await asyncio.gather(*(one(s, wf) for s, wf in jobs)))

    ruled: list[dict[str, Any]] = []  # a single or a pair, unlimited: what the rule decides
    other: list[dict[str, Any]] = []  # a chain, a budget or a deadline: keep
    for (spec, wf), seen in zip(jobs, asyncio.run(run_all()), strict=True):
        covered = (
            spec.budget is None
            and spec.deadline is None
            and _first_name(wf, spec.pool_view(pool).names()) is not None
        )
        for prompt, completion in seen:
            # the prompt as the hook showed it; the target keep where the rule does not decide
            target = completion if covered else keep
            rec = {"prompt": chat(prompt), "completion": [{"role": "assistant", "content": target}]}
            (ruled if covered else other).append(rec)
    ruled = balance_decisions(ruled)
    # as many keeps after the other first plans as there are ruled reviews (all of them when there
    # are none): enough to learn "keep after a chain" without drowning the ruled decisions
    other = other[: len(ruled)] if ruled else other
    return [r for pair_ in itertools.zip_longest(ruled, other) for r in pair_ if r is not None]


def balance_decisions(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The review records with each decision (keep, or add steps) repeated, in turn, up to the
    count of the more common one; order: alternating between the decisions.

    Why: where a cheap pair mostly disagrees, most review targets escalate, and a tiny Conductor
    trained on them escalated after every review, agreeing answers included — the same collapse
    onto the most common target its first plans showed (benchmarks/README.md, measured design
    choices). Balanced, the decision
    can only be learnt from what tells the cases apart: the agreement line and the answers."""
    keep = render(Workflow(steps=()))
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by[KEEP if r["completion"][0]["content"] == keep else "continue"].append(r)
    if len(by) < 2:
        return list(records)
    most = max(len(v) for v in by.values())
    return [by[k][i % len(by[k])] for i in range(most) for k in sorted(by)]
