"""What each candidate workflow is expected to score for a kind of question, and the best one.

Why here, in the policy layer: the warm start's targets are made by this lookup
(:mod:`rl_conductor.training.warmstart` says how and why), and a Conductor trained with
``plan_hint`` shows the same lookup's answer for a new question in its prompt, in evaluation and in
serving (:mod:`rl_conductor.policies.plan_hint`), which may not import the training layer. One
function picks the best plan for both, so the line a trained model reads at serving time is made
as its training targets were.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl_conductor.policies.chains import Candidate, single
from rl_conductor.reward import RewardConfig, reward_of
from rl_conductor.tasks.base import Task
from rl_conductor.workflow import Workflow

#: a :class:`rl_conductor.training.candidates.CandidateTable` (the training layer builds it; named
#: here by its attributes only, so the policy layer imports nothing from above)
CandidateTable = Any


class NoUsablePlan(ValueError):
    """No candidate of the lookup uses only the workers a request shows."""


#: How questions are grouped into warm-start neighbourhoods (``TrainConfig.warm_group_by``,
#: :func:`group_of`).
GROUP_BY = ("source", "subject", "domain", "task")


def group_of(task: Task, by: str = "source") -> str:
    """The neighbourhood a question belongs to: its domain and source; with ``by="subject"``
    also its subject where the task has one (``metadata["subject"]``, e.g. an MMLU subject);
    with ``by="domain"`` its domain alone (for sources the Conductor cannot tell apart); with
    ``by="task"`` its domain and its task type (``metadata["task_name"]``: one source may mix
    tasks as different as llmrouter's multiple-choice commonsense questions and its logic-grid
    puzzles, which different workers solve best and which the first words of a question tell
    apart); a domain's questions without a task type form the group ``domain/*`` (a key of its
    own: the domain's key stands for all of its questions, see ``ExpectedRewards.fit``)."""
    if by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {GROUP_BY}, not {by!r}")
    if by == "domain":
        return task.domain
    if by == "task":
        name = task.metadata.get("task_name")
        return f"{task.domain}/{name if isinstance(name, str) and name else '*'}"
    subject = task.metadata.get("subject") if by == "subject" else None
    return f"{task.domain}/{task.source}/{subject}" if subject else f"{task.domain}/{task.source}"


def reward_array(table: CandidateTable, config: RewardConfig) -> np.ndarray:
    """The reward of every executed cell (``reward_of`` over the cells; NaN where not run): the
    format bonus only where a worker was called."""
    called = table.done if table.calls is None else table.calls > 0
    r = reward_of(
        config,
        correct=table.correct,
        cost=table.cost,
        called=called,
        budget_stopped=table.stopped,
        deadline_stopped=False if table.cut is None else table.cut,
    )
    return np.where(table.done, r, np.nan)


def neighbour_means(
    table: CandidateTable,
    rewards: np.ndarray,
    by_group: dict[str, np.ndarray],
    embeddings: np.ndarray,
    k: int,
    shrink: float,
) -> dict[str, np.ndarray]:
    """Each table item's expected rewards from its ``k`` nearest *other* items of its domain.

    Why: a group mean gives every question of a (domain, source) group one target, though the
    group mixes questions that different plans serve best (on a simulated eleven-worker file,
    commonsense questions and logic puzzles inside "reasoning"; 5-fold on its training split, the
    first plan chosen from 50 neighbours earned 0.830 against the group mean's 0.820). The
    neighbours are by cosine similarity of ``embeddings`` (the kNN router's MiniLM index),
    leave-one-out so that a question's own outcome never sets its own target (a Conductor cannot
    see it). The neighbourhood's sum is shrunk with ``shrink`` items' weight towards the group's
    mean *without the question* (itself shrunk towards its domain's without it, as
    :meth:`ExpectedRewards.fit` shrinks groups), so no part of the target reads the question's own
    row; only the budget columns are replaced (deadline columns are scored on a subset), and a
    candidate the group lacks (NaN) stays lacking. Returns task id -> [candidates, conditions]."""
    if embeddings.shape[0] != len(table.task_ids):
        raise ValueError(f"{embeddings.shape[0]} embeddings for {len(table.task_ids)} table items")
    e = np.asarray(embeddings, dtype=np.float32)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    nb = len(table.budgets)
    rows_of: dict[str, list[int]] = defaultdict(list)
    for i, d in enumerate(table.domains):
        rows_of[d].append(i)
    out: dict[str, np.ndarray] = {}
    for rows_list in rows_of.values():
        rows = np.array(rows_list)
        kk = min(int(k), len(rows) - 1)
        if kk < 1:
            continue
        sim = e[rows] @ e[rows].T
        np.fill_diagonal(sim, -np.inf)
        near = np.argpartition(-sim, kk - 1, axis=1)[:, :kk]
        rb = rewards[rows][:, :, :nb]
        filled = np.nan_to_num(rb)
        dom_sum, n_dom = filled.sum(axis=0), len(rows)
        groups = [table.groups[i] for i in rows]
        grp_sum = {g: filled[[a for a, x in enumerate(groups) if x == g]].sum(axis=0) for g in set(groups)}
        grp_n = {g: groups.count(g) for g in set(groups)}
        for a, i in enumerate(rows):
            x = rb[near[a]]  # [k, candidates, budgets]
            own, n_g = filled[a], grp_n[groups[a]] - 1  # the group and the domain without the question
            dom = (dom_sum - own) / (n_dom - 1)
            grp = (grp_sum[groups[a]] - own) / max(n_g, 1)
            prior = (grp * n_g + shrink * dom) / (n_g + shrink) if n_g + shrink > 0 else dom
            g = by_group[table.groups[i]].copy()
            with np.errstate(invalid="ignore", divide="ignore"):  # shrink 0, no neighbour ran it: NaN
                est = (np.nansum(x, axis=0) + shrink * prior) / ((~np.isnan(x)).sum(axis=0) + shrink)
            g[:, :nb] = np.where(np.isnan(g[:, :nb]), np.nan, est)
            out[table.task_ids[i]] = g
    return out


def _group_means(
    table: CandidateTable, item_evidence: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Group (and domain) key -> worker -> mean evidence over the key's table items that have it."""
    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for tid, d, g in zip(table.task_ids, table.domains, table.groups, strict=True):
        for w, p in item_evidence.get(tid, {}).items():
            sums[g][w].append(p)
            if g != d:
                sums[d][w].append(p)
    return {k: {w: float(np.mean(v)) for w, v in ws.items()} for k, ws in sums.items()}


@dataclass
class ExpectedRewards:
    """Mean reward (and cost) per neighbourhood, candidate and budget, with the lookup rules."""

    candidates: list[Candidate]
    budgets: list[float | None]
    by_group: dict[str, np.ndarray]  # group -> [candidates, budgets + deadlines] expected reward (NaN = n/a)
    cost_by_group: dict[str, np.ndarray]
    deadlines: list[float] = field(default_factory=list)  # columns len(budgets) + k
    #: the one-standard-error rule (see :meth:`best`): candidates within ``se_rule`` paired
    #: standard errors of the best count as tied, and the tie goes to fewer steps (0 = off)
    se_rule: float = 0.0
    item_rewards: np.ndarray | None = None  # [items, candidates, conditions] reward (NaN = not run)
    scored: np.ndarray | None = None  # [items, conditions]: the items a condition was scored on
    rows_by_key: dict[str, np.ndarray] = field(default_factory=dict)  # group or domain -> item rows
    #: how a prompt's question finds its group (:func:`~rl_conductor.training.candidates.group_of`);
    #: the table's ``groups`` must have been made the same way
    group_by: str = "source"
    #: per-question evidence (task id -> worker -> estimated probability that the worker alone is
    #: right, :mod:`rl_conductor.policies.evidence`; out-of-fold for training questions): where a
    #: prompt's question has it, a single's expected reward is its group's mean plus
    #: ``evidence_weight`` x (the question's estimate - the group's mean estimate), see :meth:`best`
    item_evidence: dict[str, dict[str, float]] = field(default_factory=dict)
    evidence_weight: float = 0.0
    _group_evidence: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)
    #: per-question neighbourhoods (``TrainConfig.warm_neighbours``): task id -> its own
    #: [candidates, conditions] table, the group's with the budget columns replaced by the mean
    #: over the question's nearest training questions of its domain, shrunk towards the group's
    #: mean (:func:`neighbour_means`); where a task has one, :meth:`value` reads it in place of
    #: its group's
    item_means: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    #: with ``warm_neighbours: auto``, what the training split decided (training/neighbours.py)
    neighbour_choice: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def fit(
        cls,
        table: CandidateTable,
        config: RewardConfig,
        *,
        shrink: float = 20.0,
        se_rule: float = 0.0,
        group_by: str = "source",
        item_evidence: dict[str, dict[str, float]] | None = None,
        neighbours: int = 0,
        embeddings: np.ndarray | None = None,
    ) -> ExpectedRewards:
        """The expected rewards of ``table``'s candidates per neighbourhood (module docstring);
        with ``neighbours`` > 0 and ``embeddings`` (one row per table item) also each item's own
        neighbourhood (:func:`neighbour_means`)."""
        r = reward_array(table, config)
        cost = np.where(table.done, table.cost, np.nan)
        dom_rows: dict[str, list[int]] = defaultdict(list)
        grp_rows: dict[str, list[int]] = defaultdict(list)
        for i, (d, g) in enumerate(zip(table.domains, table.groups, strict=True)):
            dom_rows[d].append(i)
            grp_rows[g].append(i)
        by_group: dict[str, np.ndarray] = {}
        cost_by_group: dict[str, np.ndarray] = {}
        # the items each condition was scored on: all for the budgets, a subset for a deadline
        scored = table.done.any(axis=1)
        scored[:, : len(table.budgets)] = True

        def mean_all(x: np.ndarray, s: np.ndarray) -> np.ndarray:
            # defined only where every scored item of the rows was run
            n = s.sum(axis=0)
            ok = ~(np.isnan(x) & s[:, None, :]).any(axis=0) & (n > 0)
            return np.where(ok, (np.nan_to_num(x) * s[:, None, :]).sum(axis=0) / np.maximum(n, 1), np.nan)

        for d, rows in dom_rows.items():
            dom_mean = mean_all(r[rows], scored[rows])
            by_group[d] = dom_mean
            cost_by_group[d] = mean_all(cost[rows], scored[rows])
            for g in {table.groups[i] for i in rows}:
                gr = grp_rows[g]
                n = scored[gr].sum(axis=0)  # len(gr) for the budget columns
                g_mean = np.where(n > 0, mean_all(r[gr], scored[gr]), 0.0)
                by_group[g] = (g_mean * n + shrink * dom_mean) / (n + shrink)
                cost_by_group[g] = np.where(n > 0, mean_all(cost[gr], scored[gr]), cost_by_group[d])
        rows_by_key = {k: np.array(v) for k, v in (*dom_rows.items(), *grp_rows.items())}
        return cls(
            list(table.candidates),
            list(table.budgets),
            by_group,
            cost_by_group,
            list(table.deadlines),
            se_rule=float(se_rule),
            item_rewards=r,
            scored=scored,
            rows_by_key=rows_by_key,
            group_by=group_by,
            item_evidence=dict(item_evidence or {}),
            evidence_weight=float(config.correct_weight) if item_evidence else 0.0,
            _group_evidence=_group_means(table, item_evidence or {}),
            item_means=(
                neighbour_means(table, r, by_group, embeddings, neighbours, shrink)
                if neighbours > 0 and embeddings is not None
                else {}
            ),
        )

    def best_single(self) -> str | None:
        """The worker whose fresh solve alone has the best mean training reward with no budget
        (over every question it was run on), or None without item rewards or single candidates:
        the trained Conductor's fallback where a plan does not parse (``conductor.json``'s
        ``fallback_worker``), where the untrained rule, the highest-priced worker, may be one no
        target ever used (a $1 verifier on ``gsm8k-six``)."""
        if self.item_rewards is None or self.scored is None:
            return None
        col = next((k for k, b in enumerate(self.budgets) if b is None), 0)
        best: tuple[float, str] | None = None
        for j, c in enumerate(self.candidates):
            if len(c.steps) != 1 or c.steps[0][1] != "solve":  # one worker solving alone
                continue
            rows = self.scored[:, col] & ~np.isnan(self.item_rewards[:, j, col])
            if rows.any():
                mean = float(self.item_rewards[rows, j, col].mean())
                if best is None or mean > best[0]:
                    best = (mean, str(c.steps[0][0]))
        return None if best is None else best[1]

    def _simplest_near_best(self, key: str, col: int, options: list[tuple[Any, ...]]) -> int:
        """The one-standard-error rule over ``options`` (tuples as in :meth:`best`, ``j`` last):
        the fewest-step candidate whose mean reward is within ``se_rule`` paired standard errors
        of the best's (the standard error of the per-item reward difference on the key's scored
        items), ties to the higher mean. A composed plan must beat a simpler one by more than
        the noise of the table; else the simpler plan (cheaper, fewer tokens) is the target."""
        top = min(options)
        if (
            self.se_rule <= 0
            or self.item_rewards is None
            or self.scored is None
            or key not in self.rows_by_key
        ):
            return int(top[-1])
        rows = self.rows_by_key[key]
        rows = rows[self.scored[rows, col]]
        if len(rows) < 2:
            return int(top[-1])
        cols = np.array([o[-1] for o in options])
        r = np.nan_to_num(self.item_rewards[rows][:, :, col])
        diff = r[:, cols] - r[:, [int(top[-1])]]
        se = diff.std(axis=0, ddof=1) / np.sqrt(len(rows))
        near = [
            o for o, s in zip(options, se, strict=True) if -o[0] >= -top[0] - self.se_rule * float(s) - 1e-12
        ]
        return int(min(near, key=lambda o: (o[1], o[0], o[2], o[3]))[-1])

    def budget_index(self, budget: float | None) -> int:
        """The column of the largest table budget not above ``budget`` (0 = no budget)."""
        if budget is None or all(b is None for b in self.budgets):
            return 0  # no budget, or a table measured without budgets: its unbudgeted column
        fitting = [(b, j) for j, b in enumerate(self.budgets) if b is not None and b <= budget + 1e-12]
        if fitting:
            return max(fitting)[1]
        return min((b, j) for j, b in enumerate(self.budgets) if b is not None)[1]

    def deadline_index(self, deadline: float) -> int:
        """The column of the table deadline nearest ``deadline`` on a log scale (ties to the
        shorter one).

        Why nearest, not the largest one below: with columns at 5 and 15 s, a 14 s prompt took the
        5 s column's plans (a fast worker everywhere) and a 15 s prompt the 15 s column's, so the
        prompts nearest an evaluated deadline had the most conflicting targets; a small Conductor
        cannot tell 14 from 15 in text. Nearest on a log scale puts each column in the middle of
        the deadlines that learn from it (5 | 8.7 | 15 | 24.5 | 40 s). A plan from a slightly longer
        column may be cut under the prompt's deadline; the executor enforces it either way."""
        if not self.deadlines:
            raise ValueError("the table has no deadline columns")
        x = math.log(max(deadline, 1e-9))
        k = min(range(len(self.deadlines)), key=lambda k: (abs(math.log(self.deadlines[k]) - x), k))
        return len(self.budgets) + k

    def best(
        self, task: Task, names: Sequence[str], budget: float | None, deadline: float | None = None
    ) -> Candidate:
        """The expected-best candidate for ``task`` over the workers ``names`` under ``budget``
        and ``deadline`` (see the module docstring)."""
        return self.value(task, names, budget, deadline)[0]

    def value(
        self,
        task: Task,
        names: Sequence[str],
        budget: float | None,
        deadline: float | None = None,
        own: np.ndarray | None = None,
        kind: str | None = None,
    ) -> tuple[Candidate, float]:
        """:meth:`best` and its expected reward: its neighbourhood's mean at the prompt's column
        (with the question's evidence shift), or for a kind of question the table lacks the
        fallback single's mean over every neighbourhood. What an observed workflow is compared
        with (:mod:`rl_conductor.training.observed`). ``own``: a question's own table in place of
        the first neighbourhood the table has for it (:meth:`near_table`, a question the table
        lacks); ``kind``: the neighbourhood to read in place of the question's group (a question
        whose kind its label does not say, :class:`~rl_conductor.policies.plan_hint.PlanHint`)."""
        shown = set(names)
        b = self.budget_index(budget)
        afford: int | None = None  # a budget column the candidate must also be affordable in
        if deadline is not None and self.deadlines:
            afford = b if budget is not None else None
            b = self.deadline_index(deadline)
        group = group_of(task, self.group_by) if kind is None else kind
        for key in (group, task.domain):
            table = self.by_group.get(key)
            if table is None:
                continue
            if own is not None:  # a new question's neighbourhood (near_table)
                table, own = own, None
            elif key == group and task.id in self.item_means:  # the question's own neighbourhood
                table = self.item_means[task.id]
            costs = self.cost_by_group[key]
            shift = self._evidence_shift(task, key)
            options = [
                (-float(table[j, b]) - shift.get(c.name, 0.0), len(c.steps), float(costs[j, b]), c.name, j)
                for j, c in enumerate(self.candidates)
                if c.workers <= shown
                and not np.isnan(table[j, b])
                and (afford is None or not np.isnan(table[j, afford]))
            ]
            if options:
                j = self._simplest_near_best(key, b, options)
                return self.candidates[j], -next(o[0] for o in options if o[-1] == j)
        # an unknown kind of question (or nothing affordable): the best-scoring single overall
        means = {
            c.steps[0][0]: float(np.nanmean([t[j, 0] for t in self.by_group.values()]))
            for j, c in enumerate(self.candidates)
            if len(c.steps) == 1 and c.workers <= shown
        }
        if not means:
            raise NoUsablePlan(f"no candidate uses only the shown workers {sorted(shown)}")
        w = max(means, key=lambda w: (means[w], w))
        return single(w), means[w]

    def key_of(self, task: Task) -> str | None:
        """The neighbourhood :meth:`value` reads first for ``task``: its group, else its domain
        (None for a kind of question the table lacks)."""
        return next((k for k in (group_of(task, self.group_by), task.domain) if k in self.by_group), None)

    def near_table(self, key: str, near: np.ndarray, shrink: float) -> np.ndarray:
        """``key``'s table with its budget columns replaced by the mean over the table items
        ``near`` (row indices), shrunk with ``shrink`` items' weight towards ``key``'s mean: what
        :func:`neighbour_means` makes for a training question, for a question the table lacks
        (its neighbours are all table items, so nothing is left out). Needs ``item_rewards``."""
        if self.item_rewards is None:
            raise ValueError("near_table needs the table's item rewards")
        nb = len(self.budgets)
        g = self.by_group[key].copy()
        x = self.item_rewards[np.asarray(near, dtype=int)][:, :, :nb]
        with np.errstate(invalid="ignore", divide="ignore"):  # shrink 0, no neighbour ran it: NaN
            est = (np.nansum(x, axis=0) + shrink * g[:, :nb]) / ((~np.isnan(x)).sum(axis=0) + shrink)
        g[:, :nb] = np.where(np.isnan(g[:, :nb]), np.nan, est)
        return g

    def _evidence_shift(self, task: Task, key: str) -> dict[str, float]:
        """Single candidate name -> how much more (or less) reward than its group's mean the
        question's own evidence predicts (empty without evidence for it or for the group)."""
        mine = self.item_evidence.get(task.id)
        group = self._group_evidence.get(key)
        if not mine or not group or self.evidence_weight <= 0:
            return {}
        return {single(w).name: self.evidence_weight * (p - group[w]) for w, p in mine.items() if w in group}

    def target(
        self, task: Task, names: Sequence[str], budget: float | None, deadline: float | None = None
    ) -> Workflow:
        """:meth:`best` as a workflow over the ordinals of ``names`` (the prompt's ids)."""
        return self.best(task, names, budget, deadline).workflow(names)
