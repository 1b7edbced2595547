"""Candidate workflows and the table of what each one scores when really executed.

Why it exists: the warm start needs targets that carry *skill*, not luck. Fine-tuning on each
training item's own best workflow teaches cheapness (the cheapest worker is right on the easy
items, every worker is wrong on the hard ones). Instead, a documented set of candidate workflows
is executed through the real executor on many training questions, and the warm start
(:mod:`rl_conductor.training.warmstart`) picks, for a prompt, the candidate with the best *mean*
reward over questions like it. Nothing here knows how a pool produces its answers: candidates
are plain workflows, outcomes come from :func:`rl_conductor.executor.execute` and the task's
grader.

The candidate set (all chains: every step after the first sees all earlier steps, ``"all"``):

* ``S``     solve(a) — every worker of the pool;
* ``SV``    solve(a) → verify(b) and ``PS`` plan(a) → solve(b), for a, b in ``T ∪ C``;
* ``PSV``   plan(a) → solve(b) → verify(c), for a, b, c all in ``T`` or all in ``C``;
* ``PPSV``  plan(a) → plan(b) → solve(T₀) → verify(d), a ≠ b in ``T``, d in ``T`` \\ {T₀};
* ``PSVV``  plan(a) → solve(T₀) → verify(c) → verify(d), a in ``T``, c ≠ d in ``T`` \\ {T₀};
* ``PPSVV`` plan(a) → plan(b) → solve(T₀) → verify(c) → verify(d) (5 steps, the paper's cap),

where ``T`` are the ``top_k`` workers with the best single-call accuracy in the domain (``T₀``
the best) and ``C`` the ``cheap_k`` most accurate of the cheaper half of the pool (by output
price) — so small random subsets and small budgets still find composed plans of cheap workers.
The sets are chosen per domain from the single-worker rows of the table itself.

Budgets: each candidate is also scored under every training budget ``B``. A candidate whose
mean unbudgeted cost in the domain exceeds ``B`` is marked unaffordable (not executed). For the
others, an item whose unbudgeted run cost at most ``B/2`` reuses that run (a chain's budget
reservations never bind then: the executor's conservative input estimate is well under 2x);
every other item is executed again under ``B`` for real.

Deadlines: each candidate is also scored under every warm-start deadline ``D`` (extra condition
columns after the budgets), on at most ``deadline_items_per_domain`` items of each domain (the
first of the same stable hash order as :func:`select_items`; the others stay not run). An item
reuses its unconstrained run when the deadline provably changes nothing in it
(:func:`unchanged_under_deadline`): replaying the executor's deadline check on that trace, every
call starts with time left, is given an output cap above the length it produced and answered
within its time left. A simulated worker depends on ``max_tokens`` only by cutting its answer
when its drawn length exceeds the cap, and its rendered text is never shorter than the drawn
length minus one token, so a cap of at least the reported output + 1 changes nothing; its
latency is a deterministic function of the call. So the deadline run would be the same run,
step for step: the reuse is exact, not an approximation (``DEADLINE_MARGIN`` is applied exactly
as the executor applies it; benchmarks/README.md, table_build, has the check on paper-sim).
Every other item is executed under ``RequestLimits(max_latency_s=D)`` for
real; a run the deadline cut (a ``skipped_deadline`` step) is marked in ``cut`` so the reward's
``deadline_penalty`` applies.

Grading: a final answer is graded once per (task, the grader's normalised answer key — the key
self-consistency votes with), so a code answer runs in the sandbox once, not once per rollout.

Parallel build (the default: one process per CPU this process may use, at most 16;
``workers=N`` or ``RL_CONDUCTOR_TABLE_WORKERS=N|auto``, 1 = serial, in process): the executions
are CPU-bound (simulated workers, graders) and asyncio uses one core, so a large job list is
split into contiguous chunks run in forked worker processes (:func:`_outcomes`); each child
executes *and grades* its chunk and sends back only compact :class:`_Outcome` tuples, which the
parent puts in job order. The table is the serial one array for array (tested on fake pools and
on paper-sim): what a simulated worker answers never depends on the process it runs in, because
its caches drop their oldest half when full rather than everything
(``workers.simulated.answers.evict_oldest``) and every answer it can give is graded before the
build (:func:`prepare_grades`), so no child grades under load what the serial build graded
otherwise. Nor does a grade depend on the machine's load: the graders' limits count CPU time
(the code sandbox's ``RLIMIT_CPU``, math-verify's calls under CPU-time timers; see
:func:`rl_conductor.tasks.sandbox.run_tests` and :mod:`rl_conductor.tasks.graders`). With
wall-clock limits, two full-size builds under load 8-24 differed in 212 of 335,750 cells, all
on 18 code and math items (149 of them on two items whose correct answer was graded wrong once
and cached). Known remaining difference (``benchmarks/README.md``, table_build): at 100 items
per domain 7 of 102,600 cells differed, in cost and tokens too, because the simulated workers'
text → author registry keeps the last writer of a text and one worker renders byte-identical
texts for different roles, so what a later step reads depends on the order of the executions.
Small job lists and platforms without ``fork`` stay serial.

The table is deterministic for a pool, seed and task list; it is cached on disk (``.npz``) under
a key that includes a probe of the pool's actual answers, so a changed pool never reuses a
stale table.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np

from rl_conductor.executor import DEADLINE_MARGIN, reserve_input_tokens
from rl_conductor.fingerprint import code_version, recordings_fingerprint
from rl_conductor.limits import DEFAULT_MAX_STEPS, MIN_OUTPUT_TOKENS, RequestLimits
from rl_conductor.policies.base import GivenPlan
from rl_conductor.policies.chains import ROLE_TEXT, Candidate, single
from rl_conductor.policies.expected import group_of
from rl_conductor.policies.routers import own_answer, replacement_reason, warn_replaced
from rl_conductor.tasks import forked
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Trace
from rl_conductor.workers.pool import Pool, PoolView
from rl_conductor.workflow import Workflow, worker_message

log = logging.getLogger(__name__)

#: Bump when the candidate set or the table's meaning changes (part of the cache key).
TABLE_VERSION = 3


def composed_candidates(top: Sequence[str], cheap: Sequence[str]) -> list[Candidate]:
    """The multi-step candidates over a domain's strong workers ``top`` (best first) and its
    cheap workers ``cheap`` (see module docstring)."""
    out: list[Candidate] = []
    both = list(dict.fromkeys([*top, *cheap]))
    for a, b in itertools.product(both, repeat=2):
        out.append(Candidate(((a, "solve"), (b, "verify"))))
        out.append(Candidate(((a, "plan"), (b, "solve"))))
    for group in (top, cheap):
        for a, b, c in itertools.product(group, repeat=3):
            out.append(Candidate(((a, "plan"), (b, "solve"), (c, "verify"))))
    if top:
        t0, rest = top[0], list(top[1:])
        for a, b in itertools.permutations(top, 2):
            for d in rest:
                out.append(Candidate(((a, "plan"), (b, "plan"), (t0, "solve"), (d, "verify"))))
            for c, d in itertools.permutations(rest, 2):
                out.append(Candidate(((a, "plan"), (b, "plan"), (t0, "solve"), (c, "verify"), (d, "verify"))))
        for a in top:
            for c, d in itertools.permutations(rest, 2):
                out.append(Candidate(((a, "plan"), (t0, "solve"), (c, "verify"), (d, "verify"))))
    return list(dict.fromkeys(out))


def save_arrays(path: Path, header: dict[str, Any], **arrays: np.ndarray) -> None:
    """One ``.npz`` of ``arrays`` and a JSON ``header`` (key ``header``), written in one piece so
    that concurrent builders of one cache key never tear it (the candidate and rounds tables)."""
    from rl_conductor.storage import write_bytes

    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays, header=np.array(json.dumps(header)))
    write_bytes(str(path), buf.getvalue())


class _Saves(Protocol):
    def save(self, path: Path) -> None: ...


_Table = TypeVar("_Table", bound=_Saves)


def cache_or_build(
    path: Path,
    load: Callable[[Path], _Table],
    build: Callable[[], _Table],
    *,
    what: str,
    logger: logging.Logger,
) -> _Table:
    """The table cached at ``path``, else ``build()`` saved there: a torn or foreign file (one that
    ``load`` cannot read) is rebuilt, with a warning on ``logger`` naming ``what``."""
    if path.exists():
        try:
            return load(path)
        except Exception as exc:  # a torn or foreign file: rebuild it
            logger.warning("%s %s unreadable (%s): rebuilding", what, path, exc)
    table = build()
    table.save(path)
    return table


def load_arrays(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """What :func:`save_arrays` wrote: the header and every array by name."""
    with np.load(path) as z:
        return json.loads(str(z["header"])), {k: z[k] for k in z.files if k != "header"}


@dataclass
class CandidateTable:
    """Outcomes of candidates on items: arrays of shape ``[items, candidates, conditions]``.

    The conditions are ``budgets`` (``budgets[0]`` is ``None``: no limit) then ``deadlines``
    (column ``len(budgets) + k`` is deadline ``deadlines[k]``, no budget). ``done`` is False where
    a candidate was not run (not in the item's domain set, unaffordable under that budget, or an
    item outside a deadline column's subset). ``cut``: the deadline skipped a step."""

    task_ids: list[str]
    domains: list[str]
    groups: list[str]
    candidates: list[Candidate]
    budgets: list[float | None]
    correct: np.ndarray
    cost: np.ndarray
    stopped: np.ndarray
    tokens: np.ndarray
    done: np.ndarray
    calls: np.ndarray | None = None  # worker calls made (None: every executed cell made some)
    meta: dict[str, Any] = field(default_factory=dict)
    deadlines: list[float] = field(default_factory=list)
    cut: np.ndarray | None = None  # a deadline skipped a step (None: no deadline columns)

    def index(self, name: str) -> int:
        return [c.name for c in self.candidates].index(name)

    def save(self, path: Path) -> None:
        header = {
            "task_ids": self.task_ids,
            "domains": self.domains,
            "groups": self.groups,
            "candidates": [c.name for c in self.candidates],
            "budgets": self.budgets,
            "deadlines": self.deadlines,
            "meta": self.meta,
        }
        save_arrays(
            path,
            header,
            correct=self.correct,
            cost=self.cost,
            stopped=self.stopped,
            tokens=self.tokens,
            done=self.done,
            calls=self.calls if self.calls is not None else self.done.astype(np.int32),
            cut=self.cut if self.cut is not None else np.zeros_like(self.done),
        )

    @classmethod
    def load(cls, path: Path) -> CandidateTable:
        h, z = load_arrays(path)
        return cls(
            task_ids=h["task_ids"],
            domains=h["domains"],
            groups=h["groups"],
            candidates=[Candidate.parse_name(n) for n in h["candidates"]],
            budgets=h["budgets"],
            correct=z["correct"],
            cost=z["cost"],
            stopped=z["stopped"],
            tokens=z["tokens"],
            done=z["done"],
            calls=z.get("calls"),
            meta=h["meta"],
            deadlines=[float(d) for d in h.get("deadlines", [])],
            cut=z.get("cut"),
        )


def select_items(tasks: Sequence[Task], per_domain: int) -> list[Task]:
    """At most ``per_domain`` tasks of each domain, chosen by a hash of the id (stable, spread
    over sources)."""
    by: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by[t.domain].append(t)
    out: list[Task] = []
    for d in sorted(by):
        ranked = sorted(by[d], key=lambda t: hashlib.sha256(f"cand/{t.id}".encode()).hexdigest())
        out += ranked[:per_domain]
    return out


class _Grader:
    """Grades final answers once per (task, what the grade depends on: ``answers.answer_key``)."""

    def __init__(self) -> None:
        self.memo: dict[tuple[str, str], bool] = {}

    def __call__(self, task: Task, trace: Trace) -> bool:
        from rl_conductor.reward import grade_trace
        from rl_conductor.workers.simulated.answers import answer_key, grade_simulated

        text = trace.final_answer
        if not text:
            return False
        simulated = grade_simulated(task, text)
        if simulated is not None:
            # a simulated worker's text: the grade the simulation cached for its value (prepared
            # before the build, see prepare_grades), so a forked child never grades it itself
            return simulated
        # what the grade depends on: the extracted answer, or the whole text where the grader reads
        # it (qa; recorded, whose two texts stating one answer may carry different labels)
        key = answer_key(task, text)
        if key == "none":
            return grade_trace(task, trace)
        k = (task.id, key)
        if k not in self.memo:
            self.memo[k] = grade_trace(task, trace)
        return self.memo[k]


def prepare_grades(view: PoolView, tasks: Sequence[Task]) -> None:
    """Grade, in this process and before any execution, every answer the simulated workers of
    ``view`` can give on ``tasks`` (:meth:`SimulationModel.prepare`, once per distinct model).

    Why: the parallel build's forked children inherit these grades instead of grading on their
    own, so the code sandbox's and math-verify's wall-clock limits, which can flip a grade under
    the children's load, cannot make a parallel table differ from the serial one (measured
    before: 1 to 5 code cells of 24 paper-sim items differed, a different verified wrong answer).
    The serial build prepares the same way, so both start from the same grades. Other pools
    have nothing to prepare."""
    from rl_conductor.workers.simulated.skill import SimulationModel

    models: list[SimulationModel] = []
    for j in range(len(view)):
        model = getattr(view.worker(j), "model", None)
        if isinstance(model, SimulationModel) and all(model is not m for m in models):
            models.append(model)
    for model in models:
        asyncio.run(model.prepare(list(tasks)))


async def _run_all(
    jobs: list[tuple[Task, Workflow, RequestLimits]], view: PoolView, concurrency: int
) -> list[Trace]:
    sem = asyncio.Semaphore(concurrency)
    given = GivenPlan()

    async def one(task: Task, wf: Workflow, lim: RequestLimits) -> Trace:
        async with sem:  # the episode path of every policy: a given plan, executed and annotated
            return await given.run_workflow(wf, task, view, lim)

    return list(await asyncio.gather(*(one(*j) for j in jobs)))


def execute_workflows(
    jobs: list[tuple[Task, Workflow, RequestLimits]], view: PoolView, concurrency: int = 256
) -> list[Trace]:
    """The traces of (task, workflow, limits) jobs run as given plans on ``view``, ``concurrency``
    at a time, in the jobs' order (``GivenPlan.run_workflow``: the episode path)."""
    return asyncio.run(_run_all(jobs, view, concurrency)) if jobs else []


class _Outcome(NamedTuple):
    """What the table keeps of one execution (and, for the deadline columns, whether the same
    run provably stands under each deadline: :func:`unchanged_under_deadline`)."""

    correct: bool
    cost: float
    stopped: bool
    cut: bool
    tokens: int
    calls: int
    unchanged: tuple[bool, ...]
    #: why another worker answered in the plan's worker's place (None: it answered itself)
    replaced: str | None = None


#: Env override of the number of worker processes for the table build (1: serial, in process).
WORKERS_ENV = forked.WORKERS_ENV
#: Job lists shorter than this run in process (forking costs more than it saves).
PARALLEL_MIN_JOBS = 400


def table_workers(workers: int | None = None) -> int:
    """The number of processes to build with (:func:`rl_conductor.tasks.forked.fork_workers`:
    ``workers`` if given, else ``$RL_CONDUCTOR_TABLE_WORKERS``, else every CPU, at most 16).

    Parallel is the default since the forked children stopped grading simulated answers
    themselves (before, some paper-sim cells differed from the serial build: benchmarks/README.md,
    table_build) and the graders' limits count CPU time, not wall time (module docstring)."""
    return forked.fork_workers(workers)


def _outcome(
    task: Task, trace: Trace, view: PoolView, grader: _Grader, deadlines: Sequence[float]
) -> _Outcome:
    from rl_conductor.reward import budget_stopped, deadline_stopped

    return _Outcome(
        correct=grader(task, trace) and own_answer(trace),
        cost=trace.cost_usd,
        stopped=budget_stopped(trace),
        cut=deadline_stopped(trace),
        tokens=trace.tokens,
        calls=_worker_calls(trace),
        unchanged=tuple(unchanged_under_deadline(trace, task, view, d) for d in deadlines),
        replaced=None if own_answer(trace) else replacement_reason(trace),
    )


def _serial_outcomes(
    jobs: Sequence[tuple[Task, Workflow, RequestLimits]],
    view: PoolView,
    grader: _Grader,
    deadlines: Sequence[Sequence[float]],
) -> list[_Outcome]:
    traces = execute_workflows(list(jobs), view)
    return [_outcome(j[0], tr, view, grader, d) for j, tr, d in zip(jobs, traces, deadlines, strict=True)]


def _outcomes(
    jobs: list[tuple[Task, Workflow, RequestLimits]],
    view: PoolView,
    grader: _Grader,
    deadlines: Sequence[Sequence[float]],
    workers: int,
    min_jobs: int = PARALLEL_MIN_JOBS,
    advance: Callable[[int], None] | None = None,
) -> list[_Outcome]:
    """Execute and grade ``jobs`` (``deadlines[k]``: the deadlines to check job ``k``'s run
    against), in job order; in ``workers`` forked processes when the list is long enough.
    ``advance(n)`` is told of each finished chunk of ``n`` jobs (a progress display).

    Why fork is safe here: a child only runs the executor's asyncio loop over the pool's
    in-memory (simulated or fake) workers and the graders, in a fresh event loop (the parent is
    not inside one: this is called from synchronous code). It never touches torch, which the
    training process has imported (and maybe initialised CUDA) before the table is built; the
    math grader's helper process is dropped in the child (``tasks.graders`` registers
    ``os.register_at_fork(after_in_child=...)``) and code answers start their own sandbox
    subprocess. Children return compact outcome tuples only. Each child grades with a copy of
    the parent's grade cache (a code answer is graded once per (task, key) per process)."""
    n = len(jobs)
    workers = min(workers, n)
    tell = advance or (lambda _n: None)
    if workers <= 1 or n < min_jobs:
        serial = _serial_outcomes(jobs, view, grader, deadlines)
        tell(n)
        return serial

    def chunk(lo: int, hi: int) -> list[_Outcome]:
        return _serial_outcomes(jobs[lo:hi], view, grader, deadlines[lo:hi])

    # contiguous chunks, several per worker: evens out slow chunks
    out = []
    for part in forked.fork_map(chunk, forked.chunk_bounds(n, workers * 4), workers):
        out.extend(part)
        tell(len(part))
    assert len(out) == n
    return out


def items_digest(tasks: Sequence[Task]) -> str:
    """A digest of what grades ``tasks``' answers (grader, gold, metadata: a no-gold item's labels
    and the grader its file named live there): part of the tables' cache keys with the recordings
    file's own digest (:func:`~rl_conductor.fingerprint.recordings_fingerprint`, which covers the
    responses' texts and labels), so an edited dataset is re-run, not read from a stale table."""
    h = hashlib.sha256()
    for t in tasks:
        h.update(json.dumps([t.id, t.grader, t.answer, t.metadata], sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def pool_probe(pool: Pool, tasks: Sequence[Task], n: int = 12) -> str:
    """A digest of the pool's actual answers (single calls and a chain) on a few tasks: part of
    the cache key, so a changed pool (new calibration, new collaboration model) is re-run."""
    view = pool.view()
    names = view.names()
    probe = list(tasks[:: max(1, len(tasks) // n)])[:n]
    cands = [single(w) for w in names] + [
        Candidate(((names[0], "plan"), (names[-1], "solve"), (names[0], "verify")))
    ]
    jobs = [(t, c.workflow(names), RequestLimits()) for t in probe for c in cands]
    h = hashlib.sha256()
    for tr in execute_workflows(jobs, view):
        h.update(tr.final_answer.encode())
        h.update(f"{tr.cost_usd:.9f}".encode())
    return h.hexdigest()[:16]


def _worker_calls(trace: Trace) -> int:
    """Worker calls the trace made (the reward pays its format bonus only when there was one)."""
    attempts = getattr(trace, "attempts", None)
    return len(attempts) if attempts is not None else trace.calls


def unchanged_under_deadline(trace: Trace, task: Task, view: PoolView, deadline: float) -> bool:
    """Whether executing the same workflow under ``deadline`` provably reproduces ``trace`` (an
    unconstrained run): the executor's deadline check (``executor._run_step``) replayed on every
    attempt finds time left, an output cap (``DEADLINE_MARGIN`` of the time left, by the
    worker's latency model) above the attempt's output length, and the answer within the time
    left. Exact for workers that depend on ``max_tokens`` only by truncating at their drawn
    length and whose latency is a deterministic function of the call (the simulated workers;
    see the module docstring). False for anything it cannot replay (skipped steps)."""
    infos = {i.name: i for i in view.infos()}
    records = {r.index: r for r in trace.steps}
    for rec in trace.steps:
        if rec.status not in ("ok", "failed") or not rec.attempts:
            return False
        visible = [(i, records[i].instruction, records[i].answer) for i in rec.visible]
        message = worker_message(task.question, visible, rec.instruction)
        reserve = reserve_input_tokens([{"role": "user", "content": message}])
        elapsed = 0.0
        for a in rec.attempts:
            info = infos.get(a.worker)
            time_left = deadline - rec.started_s - elapsed
            if info is None or time_left <= 0 or not a.latency_s <= time_left:
                return False
            fits = info.tokens_within(time_left * DEADLINE_MARGIN, reserve)
            if fits is not None and fits < max(MIN_OUTPUT_TOKENS, a.output_tokens + 1):
                return False
            elapsed += a.latency_s
    return True


def build_table(
    tasks: Sequence[Task],
    pool: Pool,
    *,
    budgets: Iterable[float] = (),
    deadlines: Iterable[float] = (),
    deadline_items_per_domain: int | None = None,
    top_k: int = 3,
    cheap_k: int = 2,
    max_steps: int = DEFAULT_MAX_STEPS,
    limits: RequestLimits | None = None,
    progress: bool = False,
    workers: int | None = None,
    parallel_min_jobs: int = PARALLEL_MIN_JOBS,
    _bar: Any = None,
) -> CandidateTable:
    """Execute the candidate set (candidates of at most ``max_steps`` steps) on ``tasks`` (see
    module docstring) and return the table. ``deadlines`` add condition columns scored on at
    most ``deadline_items_per_domain`` items per domain (None: all). ``workers``: processes
    (:func:`table_workers`; 1 = serial); lists under ``parallel_min_jobs`` jobs run serially.
    ``progress``: a line per execution stage (``_bar``: the display, opened here)."""
    if _bar is None:
        from rl_conductor.progress import progress as progress_display

        # the table is the first minutes of a training run, which showed nothing at all when
        # output was not a terminal (issue 21)
        with progress_display(progress) as bar:
            return build_table(
                tasks, pool, budgets=budgets, deadlines=deadlines,
                deadline_items_per_domain=deadline_items_per_domain, top_k=top_k, cheap_k=cheap_k,
                max_steps=max_steps, limits=limits, progress=progress, workers=workers,
                parallel_min_jobs=parallel_min_jobs, _bar=bar,
            )  # fmt: skip
    bar = _bar
    n_workers = table_workers(workers)
    base = limits or RequestLimits(max_steps=max_steps)
    view = pool.view()
    names = view.names()
    budget_list: list[float | None] = [None, *sorted({float(b) for b in budgets})]
    deadline_list = sorted({float(d) for d in deadlines})
    if any(not d > 0 for d in deadline_list):
        raise ValueError(f"deadlines must be > 0 seconds, got {deadline_list}")
    grader = _Grader()
    prepare_grades(view, tasks)
    # the deadline columns' items (a subset per domain): their unconstrained runs are checked
    # against every deadline as they are graded (the reuse rule of step 4)
    in_subset = {t.id for t in select_items(tasks, deadline_items_per_domain or len(tasks))}
    no_check: tuple[float, ...] = ()

    def checks(t: Task) -> tuple[float, ...]:
        return tuple(deadline_list) if deadline_list and t.id in in_subset else no_check

    def run(
        jobs: list[tuple[Task, Workflow, RequestLimits]], deadlines: Sequence[Sequence[float]], stage: str
    ) -> list[_Outcome]:
        if not jobs:
            return _outcomes(jobs, view, grader, deadlines, n_workers, parallel_min_jobs)
        pid = bar.add_task(f"candidate table, {stage}", total=len(jobs))
        return _outcomes(
            jobs, view, grader, deadlines, n_workers, parallel_min_jobs, advance=lambda n: bar.advance(pid, n)
        )

    # 1. every worker alone, on every item: picks each domain's strong and cheap workers
    singles = [single(w) for w in names]
    first = [(t, c.workflow(names), base) for t in tasks for c in singles]
    outs = run(first, [checks(t) for t, _, _ in first], "every worker alone")
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    single_rows: dict[tuple[str, str], _Outcome] = {}
    replaced: dict[str, list[Any]] = {}
    k = 0
    for t in tasks:
        for c in singles:
            o = outs[k]
            k += 1
            single_rows[(t.id, c.name)] = o
            acc[t.domain][c.steps[0][0]].append(float(o.correct))
            if o.replaced is not None:
                replaced.setdefault(c.steps[0][0], [0, o.replaced])[0] += 1
    warn_replaced("the warm start's candidate table", replaced, len(tasks))
    price = {i.name: i.price_out for i in view.infos()}
    median = float(np.median(list(price.values())))
    domain_sets: dict[str, list[Candidate]] = {}
    for d, per in acc.items():
        ranked = sorted(per, key=lambda w: (-float(np.mean(per[w])), price[w], w))
        top = ranked[:top_k]
        cheap = [w for w in ranked if price[w] <= median and w not in top][:cheap_k]
        domain_sets[d] = [c for c in composed_candidates(top, cheap) if len(c.steps) <= max_steps]
        log.info("candidates %s: top %s, cheap %s, %d composed", d, top, cheap, len(domain_sets[d]))
    cands = list(dict.fromkeys([*singles, *itertools.chain.from_iterable(domain_sets.values())]))
    col = {c: j for j, c in enumerate(cands)}
    n_i, n_c, n_b = len(tasks), len(cands), len(budget_list) + len(deadline_list)
    cut = np.zeros((n_i, n_c, n_b), dtype=bool)
    correct = np.zeros((n_i, n_c, n_b), dtype=bool)
    cost = np.zeros((n_i, n_c, n_b), dtype=np.float64)
    stopped = np.zeros((n_i, n_c, n_b), dtype=bool)
    tokens = np.zeros((n_i, n_c, n_b), dtype=np.int32)
    done = np.zeros((n_i, n_c, n_b), dtype=bool)
    calls = np.zeros((n_i, n_c, n_b), dtype=np.int32)

    def put(i: int, j: int, b: int, o: _Outcome) -> None:
        correct[i, j, b] = o.correct
        cost[i, j, b] = o.cost
        stopped[i, j, b] = o.stopped
        cut[i, j, b] = o.cut
        tokens[i, j, b] = o.tokens
        calls[i, j, b] = o.calls
        done[i, j, b] = True

    # 2. unbudgeted: singles everywhere, composed candidates on their domain's items
    jobs: list[tuple[Task, Workflow, RequestLimits]] = []
    where: list[tuple[int, int]] = []
    # the deadline columns' items and their unconstrained runs
    keep: dict[tuple[int, int], _Outcome] = {}
    for i, t in enumerate(tasks):
        for c in singles:
            put(i, col[c], 0, single_rows[(t.id, c.name)])
            if deadline_list and t.id in in_subset:
                keep[(i, col[c])] = single_rows[(t.id, c.name)]
        for c in domain_sets.get(t.domain, []):
            jobs.append((t, c.workflow(names), base))
            where.append((i, col[c]))
    if progress:
        log.info("candidate table: %d items x %d candidates, %d executions", n_i, n_c, len(jobs))
    composed = run(jobs, [checks(t) for t, _, _ in jobs], "composed workflows")
    for (i, j), o in zip(where, composed, strict=True):
        put(i, j, 0, o)
        if deadline_list and tasks[i].id in in_subset:
            keep[(i, j)] = o

    # 3. budgets: affordable candidates only; cheap runs reused, the rest executed under B
    domains = [t.domain for t in tasks]
    dom_idx: dict[str, list[int]] = defaultdict(list)
    for i, d in enumerate(domains):
        dom_idx[d].append(i)
    for b, B in enumerate(budget_list[1:], start=1):
        assert B is not None
        lim = RequestLimits(**{**base.__dict__, "max_cost_usd": B})
        jobs, where = [], []
        for idx in dom_idx.values():
            rows = np.array(idx)
            for j in range(n_c):
                if not done[rows, j, 0].all() or cost[rows, j, 0].mean() > B:
                    continue
                for i in idx:
                    if cost[i, j, 0] <= B / 2:
                        correct[i, j, b], cost[i, j, b] = correct[i, j, 0], cost[i, j, 0]
                        stopped[i, j, b], tokens[i, j, b] = stopped[i, j, 0], tokens[i, j, 0]
                        calls[i, j, b] = calls[i, j, 0]
                        done[i, j, b] = True
                    else:
                        jobs.append((tasks[i], cands[j].workflow(names), lim))
                        where.append((i, j))
        for (i, j), o in zip(where, run(jobs, [no_check] * len(jobs), f"budget ${B:g}"), strict=True):
            put(i, j, b, o)

    # 4. deadlines: every candidate run unconstrained on a subset item; reused where provably
    # unchanged under D (unchanged_under_deadline), else executed under D for real
    reused = 0
    for k, D in enumerate(deadline_list):
        b = len(budget_list) + k
        lim = RequestLimits(**{**base.__dict__, "max_latency_s": D})
        jobs, where = [], []
        for (i, j), o in keep.items():
            if o.unchanged[k]:
                for arr in (correct, cost, stopped, tokens, calls, cut, done):
                    arr[i, j, b] = arr[i, j, 0]
                reused += 1
            else:
                jobs.append((tasks[i], cands[j].workflow(names), lim))
                where.append((i, j))
        for (i, j), o in zip(where, run(jobs, [no_check] * len(jobs), f"deadline {D:g} s"), strict=True):
            put(i, j, b, o)
    if deadline_list:
        log.info(
            "deadline columns %s: %d cells, %d reused", deadline_list, len(keep) * len(deadline_list), reused
        )

    return CandidateTable(
        task_ids=[t.id for t in tasks],
        domains=domains,
        groups=[group_of(t) for t in tasks],
        candidates=cands,
        budgets=budget_list,
        correct=correct,
        cost=cost,
        stopped=stopped,
        tokens=tokens,
        done=done,
        calls=calls,
        meta={
            "pool": pool.name,
            "top_k": top_k,
            "cheap_k": cheap_k,
            "max_steps": max_steps,
            "version": TABLE_VERSION,
            "deadline_items_per_domain": deadline_items_per_domain,
            "deadline_reused": reused,
            # worker -> [calls another worker (or none) answered for it, the first reason]: a
            # table read from the cache warns as the build did (only when there were any, so
            # the meta, part of the rounds table's key, is as before on a clean pool)
            **({"replaced": replaced} if replaced else {}),
        },
        deadlines=deadline_list,
        cut=cut,
    )


def cached_table(
    tasks: Sequence[Task],
    pool: Pool,
    cache_dir: Path | None,
    *,
    budgets: Iterable[float] = (),
    deadlines: Iterable[float] = (),
    deadline_items_per_domain: int | None = None,
    top_k: int = 3,
    cheap_k: int = 2,
    max_steps: int = DEFAULT_MAX_STEPS,
    progress: bool = False,
    workers: int | None = None,
) -> CandidateTable:
    """:func:`build_table`, read from / written to ``cache_dir`` when given (see module docstring).
    ``workers`` only changes how fast it is built, not the table (not part of the key)."""
    budgets = sorted({float(b) for b in budgets})
    deadline_list = sorted({float(d) for d in deadlines})
    per_domain = deadline_items_per_domain if deadline_list else None
    kw: dict[str, Any] = {
        "budgets": budgets,
        "deadlines": deadline_list,
        "deadline_items_per_domain": per_domain,
        "top_k": top_k,
        "cheap_k": cheap_k,
        "max_steps": max_steps,
        "progress": progress,
        "workers": workers,
    }
    if cache_dir is None:
        return build_table(tasks, pool, **kw)
    key_src = json.dumps(
        {
            "version": TABLE_VERSION,
            "pool": pool.name,
            "options": {k: str(v) for k, v in sorted(pool.options.items())},
            "workers": [[i.name, i.price_in, i.price_out, i.hosting] for i in pool.view().infos()],
            "tasks": [t.id for t in tasks],
            "budgets": budgets,
            "deadlines": deadline_list,
            "deadline_items_per_domain": per_domain,
            "deadline_margin": DEADLINE_MARGIN,
            "top_k": top_k,
            "cheap_k": cheap_k,
            "max_steps": max_steps,
            "roles": ROLE_TEXT,
            "probe": pool_probe(pool, tasks),
            "items": items_digest(tasks),
            "code": code_version(),  # graders, executor, workers: what turns a plan into a grade
            "recordings": recordings_fingerprint(pool.options),  # an edited file's texts and labels
            # tables record their replaced workers (meta["replaced"]) since this marker: an older
            # file, which cannot say, is rebuilt once (in the key, not the meta, which the rounds
            # table's key hashes: a clean pool's rounds tables stay valid)
            "replaced_meta": 1,
        },
        sort_keys=True,
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:20]
    path = Path(cache_dir) / f"candidates-{pool.name}-{key}.npz"
    table = cache_or_build(
        path, CandidateTable.load, lambda: build_table(tasks, pool, **kw), what="candidate table", logger=log
    )
    # a cached table says what its build said: a worker others answered for (once per process)
    warn_replaced("the warm start's candidate table", table.meta.get("replaced") or {}, len(table.task_ids))
    return table
