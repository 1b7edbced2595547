"""``plan_hint`` (policies/plan_hint.py): the prompt's ``Plan by estimate:`` line names the first
plan a question's nearest training questions scored best with, the target writes it by place,
and a trained model reads the same line, from the lookup saved with it, in evaluation and
serving.

The hand-built group of test_adaptive_training: sums the cheap workers get right and remainders
only the dear worker gets right, in one (domain, source) group, so only per-question
neighbourhoods tell them apart.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rl_conductor.errors import ModelNotFound
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.knn_embed import embed
from rl_conductor.policies.plan_hint import PlanHint, plan_ids
from rl_conductor.prompting import conductor_prompt
from rl_conductor.tasks.base import Task
from rl_conductor.training.config import TrainConfig
from rl_conductor.training.data import PromptSpec, training_hint, warm_sft_records
from rl_conductor.workflow import parse
from test_adaptive_training import _cfg, _pool, _tasks, rounds_micro_config

LIMITS = RequestLimits(max_steps=2)


def _text(kind: str, i: str) -> str:
    if kind == "easy":
        return f"What is {i} + {i}?"
    return f"Find the remainder when {i} raised to the power 17 is divided by 13, modulo 13."


def _mixed() -> list[Task]:
    return [replace(t, question=_text(*t.id.split("/"))) for t in _tasks(range(1, 9))]


def _new(kind: str, i: int) -> Task:
    question = _text(kind, str(i))
    return Task(id=f"new-{kind}/{i}", question=question, answer="0", domain="math", source="t", grader="math")


def _hint(tmp_path: Path, **kw: object) -> tuple[PlanHint, object, list[Task]]:
    from rl_conductor.training.train import _warm_start

    tasks, pool = _mixed(), _pool()
    hints: list[PlanHint] = []
    targets, *_ = _warm_start(_cfg(tmp_path, plan_hint=True, **kw), tasks, pool, plan_hint=hints)
    return hints[0], targets, tasks


def test_a_new_question_gets_the_plan_of_its_nearest_training_questions(tmp_path: Path) -> None:
    hint, targets, tasks = _hint(tmp_path, warm_neighbours=4, warm_shrink=0.0)
    names = [w.info.name for w in _pool().workers]
    # a training question's line is its own (leave-one-out) target: what the warm start teaches
    for t in tasks:
        assert hint.candidate(t, names, LIMITS) == targets.best(t, names, None)  # type: ignore[attr-defined]
    # a question the table lacks: its neighbours in embedding space, sums to a cheap worker
    new = [_new("easy", 41), _new("hard", 41)]
    emb = embed([t.question for t in new])
    easy, hard = (hint.candidate(t, names, LIMITS, e) for t, e in zip(new, emb, strict=True))
    assert "dear" not in easy.workers and hard.workers == {"dear"}
    with pytest.raises(ValueError, match="embedding"):
        hint.candidate(new[0], names, LIMITS)
    # only the workers the request may use, by their place in its view
    cheap = hint.candidate(new[1], ["a", "b"], LIMITS, emb[1])
    assert cheap.workers <= {"a", "b"}
    # saved with a model and loaded: the same lines for new questions, no per-question targets
    hint.save(tmp_path / "model")
    back = PlanHint.load(tmp_path / "model")
    assert not back.targets.item_means and back.k == 4
    assert [back.candidate(t, names, LIMITS, e) for t, e in zip(new, emb, strict=True)] == [easy, hard]


def test_a_saved_lookup_names_the_same_plans_parallel_pairs_included(tmp_path: Path) -> None:
    """With rounds the first plans include parallel pairs (``solve:a|solve:b``); a lookup loaded
    from its files must name every plan as the one it was saved from (a pair read back as one
    worker called ``a|solve:b`` was never a candidate: every line named a single)."""
    from rl_conductor.policies.chains import Candidate

    hint, _, tasks = _hint(tmp_path, max_rounds=2, warm_neighbours=4)
    assert any("|" in c.name for c in hint.targets.candidates)
    assert all(Candidate.parse_name(c.name) == c for c in hint.targets.candidates)
    hint.save(tmp_path / "model")
    back = PlanHint.load(tmp_path / "model")
    hint.targets.item_means = {}  # both as for a question the table lacks
    names = [w.info.name for w in _pool().workers]
    emb = embed([t.question for t in tasks])
    plans = [hint.candidate(t, names, LIMITS, e) for t, e in zip(tasks, emb, strict=True)]
    assert [back.candidate(t, names, LIMITS, e) for t, e in zip(tasks, emb, strict=True)] == plans
    assert any(len(p.steps) == 2 for p in plans)  # the pair the rounds table values is a line
    with pytest.raises(ValueError, match="bad candidate name"):
        Candidate.parse_name("solve:a|verify:b")


def test_with_the_group_means_the_line_is_the_groups_plan_and_needs_no_embedding(tmp_path: Path) -> None:
    hint, targets, tasks = _hint(tmp_path)  # warm_neighbours 0
    names = [w.info.name for w in _pool().workers]
    new = _new("hard", 41)
    assert not hint.needs_embedding(new)
    assert hint.candidate(new, names, LIMITS) == targets.best(tasks[0], names, None)  # type: ignore[attr-defined]


def test_a_served_question_gets_the_plan_of_the_kind_its_neighbours_are(tmp_path: Path) -> None:
    """A served request carries no domain (``unknown``): the line reads the kind of question
    (domain and group) its nearest training questions are, as evaluation reads the label. Here
    the sums are one domain (a cheap worker's) and the remainders another (the dear worker's)."""
    from rl_conductor.training.train import _warm_start

    tasks = [replace(t, domain="arith" if t.id.startswith("easy") else "modular") for t in _mixed()]
    pool, hints = _pool(), []
    names = [w.info.name for w in pool.workers]
    targets, *_ = _warm_start(_cfg(tmp_path, plan_hint=True), tasks, pool, plan_hint=hints)
    hint = hints[0]
    easy, hard = (replace(_new(k, 41), domain="unknown") for k in ("easy", "hard"))
    assert hint.needs_embedding(easy)
    with pytest.raises(ValueError, match="embedding"):
        hint.candidate(hard, names, LIMITS)
    emb = embed([easy.question, hard.question])
    assert hint.kind(emb[1]) == ("modular", "modular/t")
    by_kind = {
        d: targets.best(next(t for t in tasks if t.domain == d), names, None) for d in ("arith", "modular")
    }
    assert by_kind["arith"] != by_kind["modular"]  # the two kinds want different plans
    assert hint.candidate(easy, names, LIMITS, emb[0]) == by_kind["arith"]
    assert hint.candidate(hard, names, LIMITS, emb[1]) == by_kind["modular"]
    hint.save(tmp_path / "model")  # the index is saved even without neighbourhoods: it finds the kind
    assert PlanHint.load(tmp_path / "model").candidate(hard, names, LIMITS, emb[1]) == by_kind["modular"]


def test_the_target_is_the_line_written_by_place(tmp_path: Path) -> None:
    hint, targets, tasks = _hint(tmp_path, warm_neighbours=4, warm_shrink=0.0)
    pool = _pool()
    specs = [PromptSpec(task=t, view=(2, 0, 1), budget=None) for t in tasks]  # shown: dear, a, b
    records = warm_sft_records(
        specs,
        pool,
        LIMITS,
        targets,
        max_question_chars=120,
        hint=training_hint(hint, tasks),  # type: ignore[arg-type]
    )
    for spec, rec in zip(specs, records, strict=True):
        view = spec.pool_view(pool)
        best = targets.best(spec.task, view.names(), None)  # type: ignore[attr-defined]
        ids = plan_ids(best, view.names())
        prompt = rec["prompt"][0]["content"]
        assert prompt.rstrip().endswith(f"Plan by estimate: {', '.join(map(str, ids))}")
        text = rec["completion"][0]["content"]
        assert "@1" in text and not any(f"[{i}" in text for i in range(3))  # by place, not by id
        assert parse(text, pool_size=3, max_steps=2, ranking=ids) == best.workflow(view.names())
    assert {r["prompt"][0]["content"].rstrip().splitlines()[-1] for r in records} == {
        "Plan by estimate: 0",  # the remainders: dear, shown first
        f"Plan by estimate: {', '.join(map(str, plan_ids(targets.best(tasks[0], ['dear', 'a', 'b'], None), ['dear', 'a', 'b'])))}",  # type: ignore[attr-defined]  # noqa: E501
    }


def test_a_prompt_shows_a_plan_line_or_a_ranking_and_the_recipe_refuses_other_evidence() -> None:
    task, view = _mixed()[0], _pool().view()
    assert conductor_prompt(task, view, LIMITS, plan=[2, 0]).rstrip().endswith("Plan by estimate: 2, 0")
    with pytest.raises(ValueError, match="not both"):
        conductor_prompt(task, view, LIMITS, plan=[2], ranking=[1, 2])
    for bad in ({"evidence": "rank", "max_rounds": 1}, {"sft_targets": "random"}):
        with pytest.raises(ValueError, match="plan_hint"):
            TrainConfig(pool="unused", plan_hint=True, **bad)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_trained_conductor_reads_its_saved_plan_line(tmp_path: Path) -> None:
    """A micro run with ``plan_hint``: the lookup is saved with the model, the trained policy's
    prompt ends with the line its training prompts ended with, a plan written by place parses
    against it, and a folder that lost the lookup is refused by name."""
    import shutil

    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.train import train
    from rl_conductor.workers.pool import load_pool

    cfg = rounds_micro_config(tmp_path, plan_hint=True, warm_neighbours=8)
    result = train(cfg, tmp_path / "out", progress=False)
    final = result.final_dir
    assert json.loads((final / "conductor.json").read_text())["plan_hint"] is True
    assert PlanHint.exists(final) and PlanHint.exists(tmp_path / "out" / "sft")
    policy = ConductorPolicy(final)
    pool = load_pool("gsm8k-six")
    task = load_tasks("gsm8k-six", split="validation", limit=1)[0]
    view, limits = pool.view(), RequestLimits(max_steps=2, max_rounds=2)
    ids = policy.plan_ids(task, view, limits)
    assert ids and policy.prompt(task, view, limits).rstrip().endswith(
        f"Plan by estimate: {', '.join(map(str, ids))}"
    )
    plan = asyncio.run(policy.plan(task, view, limits))
    assert plan.evidence_plan == tuple(ids)  # what evaluation's "follows evidence %" compares with
    if not plan.fallback:  # the micro model writes by place what it was taught to (parsed against the line)
        assert all(s.rank is not None and s.worker == ids[s.rank - 1] for s in plan.workflow.steps)
    episode = asyncio.run(policy.run(task, view, limits))
    assert episode.trace.steps and episode.trace.final_answer
    from rl_conductor.evaluation.runner import evaluate
    from rl_conductor.policies.base import follows

    result = evaluate(policy, view, [task], limits, progress=False)
    followed = not plan.fixed_fallback and follows(plan.workflow, ids)  # greedy: the same plan
    assert result.records[0].follows_evidence is followed
    # a served request carries no domain: the line is its neighbours' kind's, here the same
    served = replace(task, id="request-1", domain="unknown", source="serving")
    assert policy.plan_ids(served, view, limits) == ids
    broken = tmp_path / "broken"
    shutil.copytree(final, broken)
    (broken / "plan_hint.npz").unlink()
    with pytest.raises(ModelNotFound, match="plan hint"):
        ConductorPolicy(broken)
    shutil.copy(final / "plan_hint.npz", broken / "plan_hint.npz")
    meta = json.loads((final / "plan_hint.json").read_text())
    for tamper in (
        {"candidates": meta["candidates"][:-1]},
        {"domains": None},
        {"rows_by_key": {"x": [10**9]}},
    ):
        (broken / "plan_hint.json").write_text(json.dumps({**meta, **tamper}))
        with pytest.raises(ModelNotFound, match=r"plan hint .* does not load"):
            ConductorPolicy(broken)
    (broken / "plan_hint.json").write_text("{not json")
    with pytest.raises(ModelNotFound, match="does not load"):
        ConductorPolicy(broken)
    # conductor.json that drops (or garbles) the flag its train_config has: refused, not served blind
    shutil.copy(final / "plan_hint.json", broken / "plan_hint.json")
    doc = json.loads((final / "conductor.json").read_text())
    for flag in (False, "false"):
        (broken / "conductor.json").write_text(json.dumps({**doc, "plan_hint": flag}))
        with pytest.raises(ModelNotFound, match="is not what it was trained with"):
            ConductorPolicy(broken)


def test_the_line_names_only_workers_the_request_may_use_under_any_budget(tmp_path: Path) -> None:
    """The line follows the request's allow-list, and a budget on a lookup measured without
    budget columns reads its unbudgeted column (it raised, and the line vanished silently)."""
    hint, *_ = _hint(tmp_path, warm_neighbours=4, warm_shrink=0.0)
    view = _pool().view()
    new = _new("hard", 41)
    emb = embed([new.question])[0]
    assert [view.names()[i] for i in hint(new, view, LIMITS, emb)] == ["dear"]
    cheap_only = RequestLimits(max_steps=2, allowed_workers=frozenset({"a", "b"}))
    assert {view.names()[i] for i in hint(new, view, cheap_only, emb)} <= {"a", "b"}
    assert hint.targets.budgets == [None]
    budgeted = RequestLimits(max_steps=2, max_cost_usd=1000.0)
    assert [view.names()[i] for i in hint(new, view, budgeted, emb)] == ["dear"]


def test_the_line_names_the_cheapest_under_a_budget_none_affords_and_fast_workers_under_a_deadline(
    tmp_path: Path,
) -> None:
    """A budget below every worker's typical answer: the line names the cheapest workers (it named
    the dearest, whose answer the executor cuts most). A deadline on a lookup without deadline
    columns: the line names only workers that answer within it, where any does (it named a worker
    the deadline cuts)."""
    from dataclasses import replace as dc_replace

    from rl_conductor.prompting import typical_cost
    from rl_conductor.workers.fake import FakeWorker
    from rl_conductor.workers.pool import Pool

    hint, *_ = _hint(tmp_path, warm_neighbours=4, warm_shrink=0.0)
    new = _new("hard", 41)
    emb = embed([new.question])[0]

    def line(view: Any, limits: RequestLimits) -> list[str]:
        return [view.names()[i] for i in hint(new, view, limits, emb)]

    view = _pool().view()
    assert line(view, LIMITS) == ["dear"]
    none_affords = min(typical_cost(i) for i in view.infos()) / 2
    assert set(line(view, RequestLimits(max_steps=2, max_cost_usd=none_affords))) <= {"a", "b"}
    assert not hint.targets.deadlines
    timed = Pool(
        name="timed",
        workers=[
            FakeWorker(
                info=dc_replace(w.info, ttft_s=0.5, tokens_per_s=25.0 if w.info.name == "dear" else 1000.0),
                answer="1",
            )
            for w in _pool().workers
        ],
    ).view()
    assert line(timed, LIMITS) == ["dear"]
    assert set(line(timed, RequestLimits(max_steps=2, max_latency_s=5))) <= {"a", "b"}
    assert line(timed, RequestLimits(max_steps=2, max_latency_s=0.01)) == ["dear"]  # none fits: as before


def test_a_domain_of_one_training_question_gets_its_target_not_a_lookup_of_its_own_row(
    tmp_path: Path,
) -> None:
    """A domain with one training question has no leave-one-out neighbours: its line is its
    target (as every plan_hint line of a training question is), never a neighbourhood of one
    that is its own row."""
    from rl_conductor.training.train import _warm_start

    tasks = [*_mixed(), replace(_mixed()[-1], id="lonely/1", domain="lonely")]
    pool, hints = _pool(), []
    targets, *_ = _warm_start(_cfg(tmp_path, plan_hint=True, warm_neighbours=4), tasks, pool, plan_hint=hints)
    lonely = tasks[-1]
    assert lonely.id not in targets.item_means and not hints[0].needs_embedding(lonely)
    names = [w.info.name for w in pool.workers]
    assert hints[0].candidate(lonely, names, LIMITS) == targets.best(lonely, names, None)


def test_a_lookup_naming_unknown_workers_or_a_pool_without_its_workers_is_refused(tmp_path: Path) -> None:
    from rl_conductor.errors import InvalidArgument
    from rl_conductor.policies.plan_hint import check_plan_workers

    hint, _, _ = _hint(tmp_path)
    with pytest.raises(ValueError, match=r"not trained with: \['dear'\]"):
        check_plan_workers(hint, ["a", "b", "dear"], ["a", "b"], "conductor:x")
    with pytest.raises(InvalidArgument, match="none of"):
        check_plan_workers(hint, ["x", "y"], ["a", "b", "dear"], "conductor:x")
    check_plan_workers(hint, ["a", "dear"], ["a", "b", "dear"], "conductor:x")  # a subset: lines without b


def _each_refused(
    tmp_path: Path,
    meta: dict[str, Any],
    arrays: dict[str, np.ndarray],
    cases: list[tuple[dict[str, Any], dict[str, np.ndarray]]],
) -> None:
    """Each case (changes to the saved lookup's JSON, to its arrays) is refused when it loads."""
    for i, (m, a) in enumerate(cases):
        folder = tmp_path / f"bad{i}"
        folder.mkdir()
        (folder / "plan_hint.json").write_text(json.dumps({**meta, **m}))
        np.savez(folder / "plan_hint.npz", **{**arrays, **a})
        with pytest.raises(ValueError, match="does not load"):
            PlanHint.load(folder)


def test_a_tampered_lookup_or_kind_index_is_refused_when_it_loads(tmp_path: Path) -> None:
    """What an outside attack (H26) tampered with loaded and then failed every served request
    with a 500, or named another plan without a word: each is now refused when it loads."""
    from rl_conductor.policies.kinds import KindIndex

    hint, *_ = _hint(tmp_path, warm_neighbours=4)
    hint.save(tmp_path / "good")
    meta = json.loads((tmp_path / "good" / "plan_hint.json").read_text())
    arrays = dict(np.load(tmp_path / "good" / "plan_hint.npz"))
    bad_meta = {
        "group renamed": {"groups": ["nope"] * len(meta["groups"])},
        "a domain's rows": {"rows_by_key": {**meta["rows_by_key"], "math": meta["rows_by_key"]["math"][:-1]}},
        "duplicate keys": {"keys": [meta["keys"][0]] * len(meta["keys"])},
        "a budget that is no number": {"budgets": ["x"]},
        "negative k": {"k": -5},
        "shrink NaN": {"shrink": float("nan")},
    }
    bad_arrays = {
        "NaN embeddings": {"embeddings": np.full_like(arrays["embeddings"], np.nan)},
        "10-wide embeddings": {"embeddings": arrays["embeddings"][:, :10]},
    }
    cases = [(m, {}) for m in bad_meta.values()] + [({}, a) for a in bad_arrays.values()]
    _each_refused(tmp_path, meta, arrays, cases)
    emb = embed(["What is 1 + 1?", "What is 2 + 2?"])
    with pytest.raises(ValueError, match="384 wide"):
        KindIndex(emb[:, :10], ["math", "math"], ["math/t", "math/t"])
    with pytest.raises(ValueError, match="finite"):
        KindIndex(np.full_like(emb, np.nan), ["math", "math"], ["math/t", "math/t"])
    # a training file may name a domain "unknown": a served request's "unknown" is still inferred
    index = KindIndex(emb, ["unknown", "math"], ["unknown/t", "math/t"])
    assert index.infers(replace(_new("easy", 1), domain="unknown"))
    assert not index.infers(replace(_new("easy", 1), domain="math"))


def test_a_third_attacks_tampering_is_refused_too(tmp_path: Path) -> None:
    """H27: a tie-break rule, tables, candidates and k that loaded and then raised at the first
    request (a NaN rule) or named other plans (infinite means, duplicated names, k 3.7 read as 3)."""
    hint, *_ = _hint(tmp_path, warm_neighbours=4)
    hint.save(tmp_path / "good")
    meta = json.loads((tmp_path / "good" / "plan_hint.json").read_text())
    arrays = dict(np.load(tmp_path / "good" / "plan_hint.npz"))
    cases: list[tuple[dict[str, Any], dict[str, np.ndarray]]] = [
        ({"se_rule": float("nan")}, {}),
        ({"se_rule": -5}, {}),
        ({"k": 3.7}, {}),
        ({"k": True}, {}),
        ({"candidates": [meta["candidates"][0], *meta["candidates"][:-1]]}, {}),
        ({}, {"by_group": np.full_like(arrays["by_group"], np.inf)}),
        ({}, {"item_rewards": np.full_like(arrays["item_rewards"], -np.inf)}),
        ({}, {"cost_by_group": -arrays["cost_by_group"] - 1}),
    ]
    _each_refused(tmp_path, meta, arrays, cases)
