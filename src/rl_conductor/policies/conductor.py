"""The LM Conductor as a Policy: prompt → generate → parse → (retry | fallback) → workflow.

It loads a trained model folder (weights, tokenizer, ``conductor.json``), plans greedily by
default and batches generation across tasks (``plan_many``, which ``run_many`` plans with). On an
unparseable plan it samples ``retries`` more times; if none parses it falls back
(:func:`salvaged_workflow`, else :func:`fallback_workflow`) and marks the plan (``Plan.fallback``,
``Trace.fallback_plan``; the fallback_rate of evaluations counts both kinds). Where the greedy
completion's ``model_id`` list is valid and its workers are usable under the request's limits
(permitted, each affordable and all together within the budget, within the deadline), those
workers run with the default instruction: the model's decision is which workers run (what it was
trained to weigh: the SFT loss weights those tokens), and a broken ``subtasks`` or ``access_list``
does not unmake it (the gsm8k-six case that showed it: benchmarks/README.md, "Measured design
choices of the LM Conductor"). Otherwise the documented default plan — one step on the view's
highest-priced usable worker, which is the safest single choice a platform team would make by
hand.

Under a budget, decoding is constrained (:func:`allowed_ids`): inside the plan's ``model_id`` list
the ids of workers the prompt flags ``over budget`` are masked, so the model's next choice among
the workers it can afford stands instead of a call the executor would cut short
(``constrain=False`` decodes as trained; requests without a budget decode identically either
way).

Rounds: where a request allows more than one (``RequestLimits.max_rounds``), :meth:`ConductorPolicy.review`
renders the review prompt (the workflow so far, each step's extracted answer, whether they agree;
:func:`~rl_conductor.prompting.review_prompt`) and generates the steps to add, numbered after the
steps so far; three empty lists keep the answer, and an unparseable review keeps it too. A model
trained with ``review_evidence: text`` (``conductor.json``) also reads the review estimator saved
with it (:mod:`rl_conductor.review_evidence`): its review prompt shows each answer's text signals
and the estimate, ending ``Best by estimate: @1`` or ``keep``, and ``@1`` in the review names the
estimate's worker (:meth:`ConductorPolicy.review_text`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rl_conductor.errors import InvalidSpec, model_not_found
from rl_conductor.executor import Continuation, ReviewHook, RoundRequest
from rl_conductor.limits import RequestLimits
from rl_conductor.lm.generate import apply_chat, generate, load_lm
from rl_conductor.lm.models import looks_like_hf_id
from rl_conductor.policies.base import Plan, Policy, follows
from rl_conductor.policies.evidence import EvidenceModel, Ranker, check_known_workers
from rl_conductor.policies.expected import NoUsablePlan
from rl_conductor.policies.kinds import KindIndex
from rl_conductor.policies.plan_hint import PlanHint, check_plan_workers
from rl_conductor.policies.usable import DEADLINE_QUANTILE, usable_workers, within_deadline
from rl_conductor.prompting import (
    DEFAULT_MAX_QUESTION_CHARS,
    RoundSummary,
    conductor_prompt,
    over_budget,
    quantile_seconds,
    review_prompt,
    shown_ranking,
    typical_cost,
)
from rl_conductor.review_evidence import ReviewEvidence
from rl_conductor.reward import trained_reward
from rl_conductor.rounds import continuation_within_limits, single_within_budget, summarize
from rl_conductor.tasks.base import Task
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import (
    Access,
    ParseError,
    Step,
    Workflow,
    access_entries,
    model_ids,
    parse,
)

CONFIG_FILE = "conductor.json"
FALLBACK_INSTRUCTION = "Solve the problem step by step and give the final answer."


def read_conductor_meta(folder: str | Path) -> dict[str, Any]:
    """The :data:`CONFIG_FILE` of a Conductor folder (what it was trained on, with which reward
    and for how many rounds), ``{}`` when the folder has none: the one reader of the file."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        return {}
    meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return meta


def model_source(spec: str | Path) -> Path | str:
    """Where to load a Conductor from, checked before any weights are read.

    A local folder holding ``conductor.json`` (or at least a model's ``config.json``) is returned
    as a ``Path``; ``s3://``, ``models:/`` and ``runs:/`` URIs are downloaded first (MLflow
    registry or object store); a Hugging Face id (``owner/name``, not a local path) is returned
    as is for ``from_pretrained``. Anything else raises :class:`~rl_conductor.errors.ModelNotFound`
    ("no Conductor model at PATH …") instead of a hub error about repo ids.
    """
    text = str(spec)
    if text.startswith(("s3://", "models:/", "runs:/")):
        from rl_conductor.tracking.registry import load_model_dir

        return Path(load_model_dir(text))
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / CONFIG_FILE).is_file() or (path / "config.json").is_file():
            return path
        raise model_not_found(text, f"{text} holds neither {CONFIG_FILE} nor config.json")
    if path.exists():
        raise model_not_found(text, f"{text} is a file, not a folder")
    if looks_like_hf_id(text):
        return text
    raise model_not_found(text, "no such folder")


def allowed_ids(view: PoolView, limits: RequestLimits) -> frozenset[int] | None:
    """The ids the Conductor may write in its plan's ``model_id`` list under ``limits``, or None
    for every id (no constraint: decoding is exactly as trained).

    Only the budget constrains: a worker the prompt flags ``over budget`` (its typical answer
    costs more than the whole budget, :func:`~rl_conductor.prompting.over_budget`) is masked,
    unless every worker is. A worker the allow-list or a private request forbids is left to the
    executor, which replaces it with the permitted worker closest in price and says so in the
    trace: on the tiny Conductor that replacement scored better than masking the forbidden ids,
    and masking over-budget ids better than leaving the executor to cut their calls (the figures:
    benchmarks/README.md, "Measured design choices of the LM Conductor").
    """
    if limits.max_cost_usd is None:
        return None
    infos = view.infos()
    ids = {j for j, i in enumerate(infos) if not over_budget(i, limits.max_cost_usd)}
    if not any(limits.permits(infos[j].name, infos[j].hosting) for j in ids) or len(ids) == len(view):
        return None  # nothing usable is affordable (or everything is): nothing to prefer
    return frozenset(ids)


#: Question embeddings a Conductor keeps (keyed by a hash of the question, never its text; served
#: Conductors embed every request): at MiniLM's 384 floats, about 30 MB
EMBEDDED_KEPT = 20_000


def plan_seconds(workflow: Workflow, view: PoolView, quantile: float = 0.5) -> float:
    """The plan's critical path in seconds: each step starts when the steps it sees have finished
    and takes its worker's answer time at ``quantile`` (0.5: the typical answer,
    :func:`~rl_conductor.prompting.typical_seconds`; 0.9: a slow one,
    :func:`~rl_conductor.prompting.quantile_seconds`). ``inf`` when a step's time is unknown (no
    latency model), so such a plan is always planned again with the
    deadline in the prompt."""
    finish: list[float] = []
    for i, step in enumerate(workflow.steps):
        secs = quantile_seconds(view.worker(step.worker).info, quantile)
        if secs is None:
            return math.inf
        start = max((finish[j] for j in step.visible(i)), default=0.0)
        finish.append(start + secs)
    return max(finish, default=0.0)


def fallback_workflow(view: PoolView, limits: RequestLimits, preferred: str | None = None) -> Workflow:
    """One step on ``preferred`` (a trained Conductor's ``fallback_worker``: the best single worker
    on its training questions at its reward) where it is usable, else on the highest-priced usable
    worker (:func:`usable_workers`); under a deadline, among those that answer within it at
    ``DEADLINE_QUANTILE`` where any does. Why not always the priciest: on a user's pool that can be
    a worker no target ever chose (``gsm8k-six``'s best-of-100 verifier costs about $1 a question,
    and three unparseable plans of 321 made a Conductor's mean cost $0.0116 instead of $0.0019)."""
    usable = within_deadline(view, usable_workers(view, limits), limits.max_latency_s)
    names = view.names()
    if preferred in names and names.index(preferred) in usable:
        return Workflow(steps=(Step(names.index(preferred), FALLBACK_INSTRUCTION, ()),))
    best = max(usable, key=lambda j: (view.worker(j).info.price_out, -j))
    return Workflow(steps=(Step(best, FALLBACK_INSTRUCTION, ()),))


def salvaged_workflow(
    text: str,
    view: PoolView,
    limits: RequestLimits,
    quantile: float = DEADLINE_QUANTILE,
    ranking: Sequence[int] | None = None,
) -> Workflow | None:
    """The workers of an unparseable completion's own ``model_id`` list
    (:func:`~rl_conductor.workflow.model_ids`), each with :data:`FALLBACK_INSTRUCTION`; None (the
    caller falls back to :func:`fallback_workflow`) where that list is missing, invalid or longer
    than ``limits.max_steps``, or names a worker the limits forbid (allow-list, private →
    self-hosted), one the prompt flags ``over budget``, more than the budget affords together (the
    typical answers' cost, after :func:`~rl_conductor.rounds.single_within_budget`'s cut of
    parallel solves) or a plan whose critical path at ``quantile`` misses the deadline (or is
    unknown). Access: the completion's own ``access_list`` where it is valid for those steps; else,
    where the request allows more rounds than one, every step solves afresh (the parallel answers a
    review compares, as the adaptive targets' pairs do: answers that saw each other agree for
    the wrong reason), and in one round the earlier steps solve afresh and the last, whose output
    is the answer, sees them all. ``ranking``: the ids the prompt's ranking line showed (what
    ``@k`` entries name)."""
    try:
        ids = model_ids(text, pool_size=len(view), max_steps=limits.max_steps, ranking=ranking)
    except ParseError:
        return None
    infos = view.infos()
    budget = limits.max_cost_usd
    if not all(limits.permits(infos[j].name, infos[j].hosting) for j in ids):
        return None
    if budget is not None and any(over_budget(infos[j], budget) for j in ids):
        return None
    access = access_entries(text, len(ids))
    if access is None:
        last: Access = () if limits.max_rounds > 1 or len(ids) == 1 else "all"
        access = tuple(() if k < len(ids) - 1 else last for k in range(len(ids)))
    wf = Workflow(steps=tuple(Step(j, FALLBACK_INSTRUCTION, a) for j, a in zip(ids, access, strict=True)))
    wf = single_within_budget(wf, view, budget) or wf
    if budget is not None and sum(typical_cost(view.worker(s.worker).info) for s in wf.steps) > budget:
        return None
    if limits.max_latency_s is not None and plan_seconds(wf, view, quantile) > limits.max_latency_s:
        return None
    return wf


def _with_evidence(plan: Plan, shown: Sequence[int] | None) -> Plan:
    """``plan`` with the plan its prompt's evidence named (``shown``: the line's ids, or the top
    ranked worker) and whether the model's plan followed it, judged now: before a deadline or a
    budget cuts the plan, which the policy does, not the model. A fixed fallback (the model wrote
    no usable plan) does not follow, even where it runs the line's worker."""
    ids = tuple(shown or ())
    if not ids:
        return replace(plan, evidence_plan=None, follows_evidence=None)
    return replace(
        plan, evidence_plan=ids, follows_evidence=not plan.fixed_fallback and follows(plan.workflow, ids)
    )


def rank_names(wf: Workflow) -> str:
    """How a plan named its workers, for the trace: ``@1 -> 3, 0`` (rank references resolved)."""
    return ", ".join(str(s.worker) if s.rank is None else f"@{s.rank} -> {s.worker}" for s in wf.steps)


class ConductorPolicy(Policy):
    """A trained Conductor model (see module docstring)."""

    batches_plans = True  # one batched generation for several prompts (plan_batch)

    def __init__(
        self,
        model_dir: str | Path,
        *,
        greedy: bool = True,
        retries: int = 2,
        retry_temperature: float = 0.7,
        max_new_tokens: int | None = None,
        batch_size: int = 32,
        seed: int = 0,
        device: str = "cpu",
        constrain: bool = True,
        deadline_check: bool = True,
        deadline_quantile: float = DEADLINE_QUANTILE,
        deadline_trim: bool = True,
    ) -> None:
        source = model_source(model_dir)
        self.model_dir = Path(source)
        self.meta: dict[str, Any] = read_conductor_meta(self.model_dir)
        try:
            self.model, self.tokenizer = load_lm(source, device=device)
        except OSError as exc:
            if isinstance(source, Path):
                raise
            # a hub id that the hub (or the offline cache) cannot serve
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise model_not_found(source, f"as a Hugging Face id it did not load: {first}") from exc
        self.greedy = greedy
        self.retries = retries
        self.retry_temperature = retry_temperature
        self.max_new_tokens = int(max_new_tokens or self.meta.get("max_completion_length", 256))
        self.max_question_chars = int(self.meta.get("max_question_chars", DEFAULT_MAX_QUESTION_CHARS))
        self.question_cut = str(self.meta.get("question_cut", "head"))
        #: per-question evidence the model was trained to read (conductor.json ``evidence``)
        self.evidence: EvidenceModel | None = None
        if self.meta.get("evidence", "none") != "none":
            if not EvidenceModel.exists(self.model_dir):
                raise model_not_found(
                    str(model_dir),
                    f"conductor.json asks for {self.meta['evidence']} evidence; its files are missing",
                )
            self.evidence = EvidenceModel.load(self.model_dir)
        #: the kinds of its training questions, for a request whose domain the evidence does not
        #: know (policies/kinds.py); absent in folders from before it (such requests then read
        #: every domain's rates together)
        self.kinds: KindIndex | None = None
        if self.meta.get("kinds") and not KindIndex.exists(self.model_dir):
            raise model_not_found(
                str(model_dir),
                "conductor.json says its kind index was saved; kinds.npz or kinds.json is missing",
            )
        if self.evidence is not None and KindIndex.exists(self.model_dir):
            try:
                self.kinds = KindIndex.load(self.model_dir)
            except ValueError as exc:
                raise model_not_found(str(model_dir), str(exc)) from exc
        #: with ``evidence: rank`` the prompt's last line ranks the usable workers by estimated
        #: reward under the reward the model was trained with (conductor.json ``reward``)
        self.ranker: Ranker | None = None
        if self.meta.get("evidence") == "rank" and self.evidence is not None:
            self.ranker = Ranker(self.evidence, trained_reward(self.meta))
        #: with ``review_evidence: text`` the review prompt shows each answer's text signals and
        #: the estimate of the review estimator saved with the model (rl_conductor/review_evidence.py)
        self.review_evidence: ReviewEvidence | None = None
        if self.meta.get("review_evidence", "none") != "none":
            if not ReviewEvidence.exists(self.model_dir):
                raise model_not_found(
                    str(model_dir),
                    f"conductor.json asks for {self.meta['review_evidence']} review evidence; "
                    "its file is missing",
                )
            try:
                self.review_evidence = ReviewEvidence.load(self.model_dir)
            except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:  # a bad file: one line
                what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                why = f"its review evidence file does not load: {what}"
                raise model_not_found(str(model_dir), why) from exc
        #: with ``plan_hint`` the prompt's last line names the first plan the question's nearest
        #: training questions scored best with (policies/plan_hint.py), saved with the model
        self.plan_hint: PlanHint | None = None
        if self._trained_flag("plan_hint"):
            if not PlanHint.exists(self.model_dir):
                raise model_not_found(
                    str(model_dir), "conductor.json asks for a plan hint; its files are missing"
                )
            try:
                self.plan_hint = PlanHint.load(self.model_dir)
                check_plan_workers(self.plan_hint, (), self.meta.get("pool_workers") or (), str(model_dir))
            except ValueError as exc:
                raise model_not_found(str(model_dir), str(exc)) from exc
        self._embedded: dict[str, Any] = {}
        self.batch_size = batch_size
        self.seed = seed
        #: decode only worker ids the request can use (:func:`allowed_ids`); off = as trained
        self.constrain = constrain
        #: plan for a deadline only where the unconstrained plan would not meet it (see
        #: :meth:`_plan_requests`); off = every deadline in the prompt
        self.deadline_check = deadline_check
        #: the latency quantile a plan must meet its deadline at (:func:`plan_seconds`)
        if isinstance(deadline_quantile, bool) or not 0 < deadline_quantile < 1:
            raise ValueError(f"deadline_quantile must be in (0, 1), got {deadline_quantile!r}")
        self.deadline_quantile = deadline_quantile
        #: a plan that misses its deadline is cut to its answering step where that fits
        #: (:meth:`_answerer_alone`); off = planned again with the deadline in the prompt
        self.deadline_trim = deadline_trim
        self.name = f"conductor:{self.model_dir.name}"
        self._lock = threading.Lock()  # generation is synchronous; guards the model across threads
        #: reviews queued per event loop, generated together (:meth:`review`)
        self._reviews: dict[Any, list[tuple[RoundRequest, asyncio.Future[Continuation]]]] = {}

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **kw: Any) -> ConductorPolicy:
        if not arg:
            raise InvalidSpec("conductor needs a model folder or URI: conductor:DIR")
        policy = cls(arg, seed=int(kw.get("seed", 0)))
        if policy.evidence is not None:
            check_known_workers(policy.evidence, pool.names(), policy.name)
        if policy.plan_hint is not None:
            check_plan_workers(
                policy.plan_hint, pool.names(), policy.meta.get("pool_workers") or (), policy.name
            )
        return policy

    # -- generation -------------------------------------------------------------------------
    def _chat(self, prompt: str) -> str:
        return apply_chat(self.tokenizer, "", prompt)  # the prompt is one user message

    def _generate(
        self,
        prompts: Sequence[str],
        *,
        greedy: bool,
        seed: int,
        allowed: Sequence[frozenset[int] | None] | None = None,
    ) -> list[str]:
        return generate(
            self.model,
            self.tokenizer,
            [self._chat(p) for p in prompts],
            max_new_tokens=self.max_new_tokens,
            temperature=self.retry_temperature,
            greedy=greedy,
            seed=seed,
            batch_size=self.batch_size,
            allowed_ids=allowed,
        )

    def _parse_all(
        self,
        prompts: list[str],
        views: list[PoolView],
        limits: list[RequestLimits],
        *,
        allow_empty: bool = False,
        first_index: int = 0,
        rankings: Sequence[Sequence[int] | None] | None = None,
    ) -> list[Plan]:
        """Generate for every prompt, retry the unparseable ones, fall back where retries fail.
        ``rankings``: per prompt, the ids its ranking line showed (``@k`` in a plan names the k-th;
        None or absent: the prompt showed none and a rank reference does not parse)."""
        shown = list(rankings) if rankings is not None else [None] * len(prompts)
        plans: list[Plan | None] = [None] * len(prompts)
        errors: list[str] = [""] * len(prompts)
        failed: list[str] = [""] * len(prompts)  # the completion whose error ``errors`` holds
        first_texts: list[str] = [""] * len(prompts)  # the first (greedy) completion, for the salvage
        todo = list(range(len(prompts)))
        for attempt in range(self.retries + 1):
            if not todo:
                break
            greedy = self.greedy and attempt == 0
            masks = [allowed_ids(views[i], limits[i]) if self.constrain else None for i in todo]
            texts = self._generate(
                [prompts[i] for i in todo], greedy=greedy, seed=self.seed + attempt, allowed=masks
            )
            still = []
            for i, text, mask in zip(todo, texts, masks, strict=True):
                if attempt == 0:
                    first_texts[i] = text
                try:
                    wf = parse(
                        text,
                        pool_size=len(views[i]),
                        max_steps=limits[i].max_steps,
                        allow_empty=allow_empty,
                        first_index=first_index,
                        ranking=shown[i],
                    )
                    if mask is not None and not set(wf.workers()) <= mask:
                        # a spelling the decoding mask did not follow (e.g. 0x1): retried as unparseable
                        raise ParseError(f"the plan names workers over the budget: {wf.workers()}")
                    notes = (f"planning: named by evidence rank: {rank_names(wf)}",) if wf.by_rank() else ()
                    plans[i] = Plan(workflow=wf, text=text, parse_error=errors[i] or None, notes=notes)
                except ParseError as exc:
                    errors[i], failed[i] = str(exc), text
                    still.append(i)
            todo = still
        for i in todo:
            # a review's fallback is to keep its answer (review_many): only plans are salvaged
            wf = (
                None
                if allow_empty
                else salvaged_workflow(first_texts[i], views[i], limits[i], self.deadline_quantile, shown[i])
            )
            notes: tuple[str, ...] = ()
            fixed = wf is None
            if wf is not None:
                notes = (f"planning: unparseable; salvaged its model_id list: workers {wf.workers()}",)
            else:
                wf = fallback_workflow(views[i], limits[i], self.meta.get("fallback_worker"))
            # the text is the model's completion that did not parse (what the trace's raw plan and
            # `conductor plan` show), not a rendering of the fallback, which would read as a
            # well-formed plan called unparseable; the workflow that ran is ``wf``
            plans[i] = Plan(
                workflow=wf,
                text=failed[i],
                fallback=True,
                parse_error=errors[i],
                notes=notes,
                fixed_fallback=fixed,
            )
        return [p for p in plans if p is not None]

    def _plan_requests(
        self, tasks: Sequence[Task], views: list[PoolView], limits: list[RequestLimits]
    ) -> list[Plan]:
        """Plan top-level requests; a deadline is planned for only where it binds.

        With ``deadline_check`` (the default), a request with a deadline is first planned as if
        it had none. Where that plan's critical path at ``deadline_quantile`` of its workers'
        answer times (:func:`plan_seconds`) fits the deadline, it stands. Where it does not, it is
        cut to its answering step (:meth:`_answerer_alone`: the last step's worker, asked to
        answer directly) if that fits, and only the rest are planned again with the deadline in
        the prompt (and such a plan that still misses is cut in the same way).

        Why: a deadline the plan already meets changes nothing about which plan is best, and a
        small Conductor plans unconstrained requests best (most of its training), so putting
        every deadline in the prompt loses accuracy and routes worse; a chain that fits at the
        median answer time is cut by the executor more often than not, so the check is at a high
        quantile, and cutting to the answering step before replanning kept the most accuracy
        (the tiny Conductor's figures for each variant: benchmarks/README.md, "Measured design
        choices of the LM Conductor"). Set ``deadline_trim`` off to replan without cutting."""
        tasks = self._with_kinds(tasks)  # a served request says no domain (policies/kinds.py)
        evidence = self.task_evidence(tasks)
        if self.plan_hint is not None:  # one batch, before the prompts look them up one by one
            self._embeddings([t for t in tasks if self.plan_hint.needs_embedding(t)])
        first = [
            replace(lim, max_latency_s=None) if self.deadline_check and lim.max_latency_s is not None else lim
            for lim in limits
        ]
        orders = [
            self.evidence_ranking(t, v, lim, e)
            for t, v, lim, e in zip(tasks, views, first, evidence, strict=True)
        ]
        lines = [self.plan_ids(t, v, lim) for t, v, lim in zip(tasks, views, first, strict=True)]
        plans = self._parse_all(
            [
                self._prompt(t, v, lim, e, line)
                for t, v, lim, e, line in zip(tasks, views, first, evidence, lines, strict=True)
            ],
            views,
            first,
            rankings=[
                shown_ranking(o) if self.plan_hint is None else line
                for o, line in zip(orders, lines, strict=True)
            ],
        )
        if self.plan_hint is not None:  # a prompt without the line its model was trained with
            missing = "planning: no plan line: no plan of its lookup uses only this request's workers"
            plans = [
                p if line is not None else replace(p, notes=(*p.notes, missing))
                for p, line in zip(plans, lines, strict=True)
            ]
        if self.ranker is not None:  # what the evidence alone would pick (evaluation: agreement)
            plans = [_with_evidence(p, (o or [])[:1]) for p, o in zip(plans, orders, strict=True)]
        elif self.plan_hint is not None:  # the plan the line named (evaluation: how often followed)
            plans = [_with_evidence(p, line) for p, line in zip(plans, lines, strict=True)]
        again: list[int] = []
        why: dict[int, str] = {}
        for i, (plan, view, lim) in enumerate(zip(plans, views, limits, strict=True)):
            if lim.max_latency_s is None or first[i] is lim:
                continue
            secs = plan_seconds(plan.workflow, view, self.deadline_quantile)
            if not plan.fallback and secs <= lim.max_latency_s:
                note = f"planning: the plan made without the deadline fits it ({self._path(secs)}); kept"
                plans[i] = replace(plan, notes=(*plan.notes, note))
                continue
            misses = f"misses {lim.max_latency_s:.4g} s ({self._path(secs)})"
            what = "is unparseable" if plan.fallback else misses
            why[i] = f"planning: the plan made without the deadline {what}"
            cut = self._answerer_alone(replace(plan, notes=(*plan.notes, why[i])), view, lim)
            if cut is not None:
                plans[i] = cut
            else:
                again.append(i)
        if again:
            shown = {  # what the prompts with the deadline show: a ranking, or the plan line
                i: (
                    self.evidence_ranking(tasks[i], views[i], limits[i], evidence[i])
                    if self.plan_hint is None
                    else self.plan_ids(tasks[i], views[i], limits[i])
                )
                for i in again
            }
            redo = self._parse_all(
                [self.prompt(tasks[i], views[i], limits[i], evidence[i]) for i in again],
                [views[i] for i in again],
                [limits[i] for i in again],
                rankings=[shown[i] if self.plan_hint is not None else shown_ranking(shown[i]) for i in again],
            )
            for i, plan in zip(again, redo, strict=True):
                plan = replace(plan, notes=(f"{why[i]}; planned again with it", *plan.notes))
                if self.ranker is not None:  # counted against what its own prompt showed
                    plan = _with_evidence(plan, (shown[i] or [])[:1])
                elif self.plan_hint is not None:
                    plan = _with_evidence(plan, shown[i])
                if plan_seconds(plan.workflow, views[i], self.deadline_quantile) > (
                    limits[i].max_latency_s or math.inf
                ):  # _answerer_alone leaves unparseable and one-step plans alone
                    plan = self._answerer_alone(plan, views[i], limits[i]) or plan
                plans[i] = plan
        for i, (plan, view, lim) in enumerate(zip(plans, views, limits, strict=True)):
            single = None if plan.fallback else single_within_budget(plan.workflow, view, lim.max_cost_usd)
            if single is not None:  # parallel solves the budget cannot afford all of (rounds.py)
                note = f"planning: cut to one step, ${lim.max_cost_usd:.4g} affords no parallel answers"
                plans[i] = replace(plan, workflow=single, notes=(*plan.notes, note))
        return plans

    def _path(self, secs: float) -> str:
        q = f"p{100 * self.deadline_quantile:.0f}"
        return f"critical path {secs:.4g} s at {q}" if math.isfinite(secs) else f"unknown time at {q}"

    def _answerer_alone(self, plan: Plan, view: PoolView, limits: RequestLimits) -> Plan | None:
        """``plan`` cut, before it starts, to its answering step — the last step's worker, asked to
        answer directly — when that meets the deadline at ``deadline_quantile``; None when it
        does not, the plan is unparseable or one step, or ``deadline_trim`` is off. Why: the
        executor would otherwise stop the chain part way and answer with an earlier step's text
        (on a plan → solve chain, an outline without an answer)."""
        steps = plan.workflow.steps
        deadline = limits.max_latency_s
        if not self.deadline_trim or deadline is None or plan.fallback or len(steps) < 2:
            return None
        last = steps[-1].worker
        info = view.worker(last).info
        if not limits.permits(info.name, info.hosting):
            return None  # a worker the executor would replace
        short = Workflow(steps=(Step(last, FALLBACK_INSTRUCTION, ()),))
        secs = plan_seconds(short, view, self.deadline_quantile)
        if secs > deadline:
            return None
        note = f"planning: cut to its last step's worker alone ({self._path(secs)})"
        return replace(plan, workflow=short, notes=(*plan.notes, note), deadline_cut=True)

    # -- Policy -----------------------------------------------------------------------------
    def task_evidence(self, tasks: Sequence[Task]) -> list[dict[str, float] | None]:
        """Per task, the evidence the prompt shows (None for each when the model reads none).
        Questions are embedded once per policy (kept in memory: serving embeds each new one)."""
        if self.evidence is None:
            return [None] * len(tasks)
        emb = self._embeddings(tasks)
        return [self.evidence.as_mapping(r) for r in self.evidence.predict(tasks, emb)]

    def _embeddings(self, tasks: Sequence[Task]) -> np.ndarray:
        """The questions' MiniLM embeddings (the kNN router's), each embedded once per policy."""
        from rl_conductor.policies.knn_embed import embed

        keys = [hashlib.sha256(t.question.encode("utf-8", "surrogatepass")).hexdigest() for t in tasks]
        todo = {k: t.question for k, t in zip(keys, tasks, strict=True) if k not in self._embedded}
        if todo:
            if len(self._embedded) + len(todo) > EMBEDDED_KEPT:  # keyed by hash, bounded: no texts kept
                self._embedded.clear()
            self._embedded.update(zip(todo, embed(list(todo.values())), strict=True))
        return np.array([self._embedded[k] for k in keys])

    def plan_ids(self, task: Task, view: PoolView, limits: RequestLimits) -> list[int] | None:
        """The ids of the prompt's ``Plan by estimate:`` line (``plan_hint``; None for other
        models, or where no plan of the lookup uses only the request's workers)."""
        if self.plan_hint is None:
            return None
        emb = self._embeddings([task])[0] if self.plan_hint.needs_embedding(task) else None
        try:
            return self.plan_hint(task, view, limits, emb)
        except NoUsablePlan:  # none of the lookup's workers is in this view (the plan's notes say so)
            return None

    def _trained_flag(self, name: str) -> bool:
        """A flag ``conductor.json`` records only when on (``plan_hint``), refused
        (:class:`~rl_conductor.errors.ModelNotFound`) where it is not a boolean or is not what its
        ``train_config`` says: a model served without the line it was trained with plans blind."""
        flag, recipe = self.meta.get(name), self.meta.get("train_config")
        trained_with = recipe.get(name) if isinstance(recipe, dict) else None
        if flag not in (None, True, False) or (trained_with is not None and bool(flag) != bool(trained_with)):
            raise model_not_found(
                str(self.model_dir),
                f"conductor.json's {name} ({flag!r}) is not what it was trained with ({trained_with!r})",
            )
        return bool(flag)

    def prompt(
        self, task: Task, view: PoolView, limits: RequestLimits, evidence: Mapping[str, float] | None = None
    ) -> str:
        """The prompt for ``task``; ``evidence`` defaults to this model's own (:meth:`task_evidence`)."""
        task = self._with_kinds([task])[0]
        if evidence is None and self.evidence is not None:
            evidence = self.task_evidence([task])[0]
        return self._prompt(task, view, limits, evidence, self.plan_ids(task, view, limits))

    def _review_task(self, task: Task) -> Task:
        """``task`` with its domain read as :meth:`_with_kinds` reads it, by the evidence's index
        or, in a model without evidence (the ``recordings-text`` preset), the plan line's: the
        domain a review rule is chosen by."""
        kinds = self.kinds if self.kinds is not None else getattr(self.plan_hint, "kinds", None)
        return self._with_kinds([task], kinds)[0]

    def _with_kinds(self, tasks: Sequence[Task], kinds: KindIndex | None = None) -> list[Task]:
        """``tasks`` with each domain the model does not know (a served request says none) read
        from the nearest training questions (policies/kinds.py), as evaluation reads the
        dataset's label: what the evidence and the plan line read. ``kinds``: another index than
        the evidence's (the review's, :meth:`review_text`)."""
        kinds = self.kinds if kinds is None else kinds
        if kinds is not None and any(kinds.infers(t) for t in tasks):
            return kinds.with_domains(tasks, self._embeddings(tasks))
        return list(tasks)

    def _prompt(
        self,
        task: Task,
        view: PoolView,
        limits: RequestLimits,
        evidence: Mapping[str, float] | None,
        line: Sequence[int] | None,
    ) -> str:
        """:meth:`prompt` with its plan line already looked up (:meth:`plan_ids`)."""
        return conductor_prompt(
            task,
            view,
            limits,
            max_question_chars=self.max_question_chars,
            evidence=evidence,
            question_cut=self.question_cut,
            ranking=self.evidence_ranking(task, view, limits, evidence),
            plan=line,
        )

    def evidence_ranking(
        self, task: Task, view: PoolView, limits: RequestLimits, evidence: Mapping[str, float] | None
    ) -> list[int] | None:
        """The prompt's ranking line (``evidence: rank``; None for other models): the ordinals of
        ``view`` the request may use, best first by estimated reward (:class:`Ranker`)."""
        if self.ranker is None or evidence is None:
            return None
        return self.ranker(task, evidence, view, limits)

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        with self._lock:
            return self._plan_requests([task], [view], [limits])[0]

    def plan_batch(self, items: Sequence[tuple[Task, PoolView, RequestLimits]]) -> list[Plan]:
        """Plan several requests, each with its own view and limits, in one batched generation.

        Synchronous and thread-safe (the serving micro-batcher calls it from a worker thread)."""
        with self._lock:
            return self._plan_requests(
                [t for t, _, _ in items], [v for _, v, _ in items], [lim for _, _, lim in items]
            )

    @property
    def trained_rounds(self) -> int:
        """The rounds the model was trained for (``conductor.json`` ``max_rounds``; 1 without it)."""
        return int(self.meta.get("max_rounds", 1))

    def review_hook(self, limits: RequestLimits) -> ReviewHook | None:
        """None for a model trained to plan once, whatever the request allows: it never learnt the
        review prompt, and what it writes there is no decision (such a model adds steps after
        nearly every question at a multiple of the cost: benchmarks/README.md, "Measured design
        choices of the LM Conductor"). A request's ``max_rounds`` is an allowance, not an order."""
        if self.trained_rounds <= 1:
            return None
        return super().review_hook(limits)

    async def review(self, request: RoundRequest) -> Continuation:
        """Read the workflow so far and its answers; keep the answer or add steps (module docstring).

        Reviews that reach the event loop together (the rounds of requests run together, which
        end together: ``run_many``, an evaluation, concurrent served requests) are generated in
        one batch (:meth:`review_many`): one generation per review costs more than planning the
        whole batch. An unparseable review keeps the answer (its fallback
        would be a fresh one-step plan, which is no review); the continuation's text is kept on
        the trace's round record."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Continuation] = loop.create_future()
        queue = self._reviews.setdefault(loop, [])
        queue.append((request, done))
        if len(queue) == 1:  # the first of a batch: generate once the others have queued
            loop.call_soon(self._review_queued, loop)
        return await done

    def _review_queued(self, loop: Any) -> None:
        batch = self._reviews.pop(loop, [])
        try:
            out = self.review_many([r for r, _ in batch])
        except Exception as exc:  # the executor keeps each answer and records the error
            for _, f in batch:
                if not f.done():
                    f.set_exception(exc)
            return
        for (_, f), cont in zip(batch, out, strict=True):
            if not f.done():
                f.set_result(cont)

    def review_text(self, request: RoundRequest, summary: RoundSummary) -> tuple[str, list[int] | None]:
        """The review prompt of ``request`` and the ids its estimate line lets ``@k`` name (with
        ``review_evidence: text`` and an estimate that weighs a continuation worker: ``[its id]``;
        else None, and a rank reference does not parse)."""
        if self.review_evidence is None:
            chars, how = self.max_question_chars, self.question_cut
            return review_prompt(request, summary, max_question_chars=chars, question_cut=how), None
        # the question's domain (a served request says none): a domain's own review rule reads it
        task = self._review_task(request.task)
        known = request if task is request.task else replace(request, task=task)
        signals, estimate, worker = self.review_evidence.estimate(known, summary)
        prompt = review_prompt(
            request,
            summary,
            max_question_chars=self.max_question_chars,
            signals=[s.text() for s in signals],
            estimate=None if estimate is None else estimate.line(worker),
            question_cut=self.question_cut,
        )
        return prompt, None if worker is None else [worker]

    def review_many(self, requests: Sequence[RoundRequest]) -> list[Continuation]:
        """:meth:`review` of each request, generated in one batch per workflow length (the
        continuation's steps are numbered after the steps so far)."""
        summaries = [summarize(r) for r in requests]
        prompts, shown = [], []
        for r, s in zip(requests, summaries, strict=True):
            prompt, ranking = self.review_text(r, s)
            prompts.append(prompt)
            shown.append(ranking)
        plans: list[Plan | None] = [None] * len(requests)
        by_length: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            by_length.setdefault(len(r.workflow.steps), []).append(i)
        with self._lock:
            for first, rows in by_length.items():
                got = self._parse_all(
                    [prompts[i] for i in rows],
                    [requests[i].view for i in rows],
                    [requests[i].limits for i in rows],
                    allow_empty=True,
                    first_index=first,
                    rankings=[shown[i] for i in rows],
                )
                for i, plan in zip(rows, got, strict=True):
                    plans[i] = plan
        out = []
        for request, summary, prompt, plan in zip(requests, summaries, prompts, plans, strict=True):
            assert plan is not None
            steps = () if plan.fallback else plan.workflow.steps
            # what the budget and time left afford (the executor would stop the rest part way)
            wf = continuation_within_limits(
                Workflow(steps=steps),
                request.view,
                request.limits,
                len(request.workflow.steps),
                self.deadline_quantile,
            )
            out.append(
                Continuation(
                    workflow=wf, text=plan.text, seen=prompt, answers=summary.answers, agree=summary.agree
                )
            )
        return out
