"""Review targets and prompts that read the first answers' texts (``review_evidence: text``,
training/review_text.py; the Conductor's review prompt in policies/conductor.py).

The hand-built pool of test_adaptive_training: two cheap workers agree on the easy questions (both
right) and disagree on the hard ones (both wrong, apart), a dear worker is right on both; here the
cheap workers also write their work, and on the hard questions an equation that does not hold."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from _tiny import assert_refused_without
from rl_conductor.executor import Continuation, RoundRequest, execute
from rl_conductor.limits import RequestLimits
from rl_conductor.prompting import cut, review_prompt
from rl_conductor.rounds import summarize
from rl_conductor.tasks.base import Task
from rl_conductor.training.config import ConfigError, TrainConfig
from rl_conductor.training.data import PromptSpec
from rl_conductor.workers.pool import Pool
from rl_conductor.workflow import Workflow, parse
from test_adaptive_training import _cfg as cfg_of
from test_adaptive_training import _pool as pool_of
from test_adaptive_training import _tasks as tasks_of
from test_adaptive_training import rounds_micro_config


def _answer(name: str) -> Any:
    def reply(messages: Any, ctx: Any) -> str:
        n = int(ctx.task.answer)
        if ctx.task.id.startswith("hard") and name != "dear":
            off = {"a": 2, "b": 1}[name]
            return f"{n // 2} + {n // 2} = {n + off + 7}. So the answer is \\boxed{{{n + off}}}"
        return f"{n // 2} + {n // 2} = {n}. So the answer is \\boxed{{{n}}}"

    return reply


def _pool() -> Pool:
    return pool_of(_answer, "hand-built-text-rounds")


def _tasks(numbers: range = range(1, 11), *, kinds: tuple[str, ...] = ("easy", "hard")) -> list[Task]:
    return tasks_of(numbers, kinds=kinds)


def _cfg(tmp_path: Path, **kw: Any) -> TrainConfig:
    return cfg_of(tmp_path, max_rounds=2, **kw)


def test_review_evidence_is_a_review_s_option_only() -> None:
    with pytest.raises(ConfigError, match="review_evidence must be one of"):
        TrainConfig(review_evidence="probe", max_rounds=2, sft_targets="expected-best")
    with pytest.raises(ConfigError, match="max_rounds: 2"):
        TrainConfig(review_evidence="text", max_rounds=1, sft_targets="expected-best")
    assert TrainConfig().review_evidence == "none"


def test_only_the_text_rule_runs_a_pairs_continuations_of_every_domain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text rule is fitted per first plan across domains, so its rounds table runs each pair
    with every domain's continuations (``shared_continuations``); the agreement rule is fitted per
    domain and its recipe does not ask for it (its table and cache key as they were)."""
    from rl_conductor.training import adaptive
    from rl_conductor.training.train import _warm_start

    seen: list[bool] = []
    real = adaptive.cached_rounds_table

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(kw.get("shared_continuations", False))
        return real(*args, **kw)

    monkeypatch.setattr(adaptive, "cached_rounds_table", spy)
    pool, train = _pool(), _tasks()
    _warm_start(_cfg(tmp_path, review_evidence="text"), train, pool, text_rule=[])
    _warm_start(_cfg(tmp_path), train, pool)
    assert seen == [True, False]


def test_the_text_rule_is_fitted_on_the_training_questions_and_its_targets_follow_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_conductor.training import review_text
    from rl_conductor.training.adaptive import pair, review_records
    from rl_conductor.training.train import _warm_start

    # the text rule itself, on every question: a domain's agreement rule (which takes its place
    # where the texts do not earn more by a margin) is tested in test_review_rules.py
    monkeypatch.setattr(review_text, "MIN_SIGNAL_ITEMS", 10**9)

    pool, train = _pool(), _tasks()
    held_out = _tasks(range(20, 23), kinds=("heldhard",))  # never given to the fit
    texts: list[Any] = []
    targets, _, _, rule = _warm_start(_cfg(tmp_path, review_evidence="text"), train, pool, text_rule=texts)
    (text,) = texts
    name = pair("b", "a").name
    # fitted on every training question of the pair, and only on them
    assert {tid for tid, n in text.oof if n == name} == {t.id for t in train}
    assert not {tid for tid, _ in text.oof} & {t.id for t in held_out}
    assert text.summary[name]["n"] == len(train)
    # the rule: keep the easy (agreeing, arithmetic holds) answers, escalate the hard ones
    assert all(text.choice[(t.id, name)] == ("+dear" if t.id.startswith("hard") else "keep") for t in train)
    assert text.evidence.plans["b|a"].workers == ["dear"]  # a worker of the pair is no continuation
    # the first-plan target is the pair, valued under the text rule
    assert targets.target(train[0], pool.names(), None, None).workers() == [1, 0]

    specs = [PromptSpec(task=t, view=tuple(range(len(pool))), budget=None) for t in train]
    firsts = [targets.target(s.task, pool.names(), None, None) for s in specs]
    recs = review_records(
        specs, pool, RequestLimits(max_steps=2), firsts, rule, max_question_chars=120, text=text
    )
    assert recs
    for r in recs:
        prompt, completion = r["prompt"][-1]["content"], r["completion"][0]["content"]
        last = prompt.rstrip().splitlines()[-1]
        assert last in ("Best by estimate: @1", "Best by estimate: keep")
        assert "checks wrong]" in prompt and "Estimate: the answer so far is right ~" in prompt
        wf = parse(completion, pool_size=3, max_steps=2, allow_empty=True, first_index=2, ranking=[2])
        if last.endswith("@1"):
            assert "escalating to @1 (model 2)" in prompt and completion.startswith("model_id = [@1]")
            assert wf.workers() == [2]
        else:
            assert wf.steps == ()
    assert {r["prompt"][-1]["content"].rstrip().splitlines()[-1] for r in recs} == {
        "Best by estimate: @1",
        "Best by estimate: keep",
    }


def _review_request(task: Task, pool: Pool, first: Workflow, limits: RequestLimits) -> RoundRequest:
    got: list[RoundRequest] = []

    async def hook(req: RoundRequest) -> Continuation:
        got.append(req)
        return Continuation(workflow=Workflow(steps=()))

    asyncio.run(execute(first, task, pool.view(), limits, review=hook))
    return got[0]


def test_the_estimate_weighs_only_workers_the_request_may_use(tmp_path: Path) -> None:
    from rl_conductor.training.adaptive import pair
    from rl_conductor.training.train import _warm_start

    pool, train = _pool(), _tasks()
    texts: list[Any] = []
    _warm_start(_cfg(tmp_path, review_evidence="text"), train, pool, text_rule=texts)
    ev = texts[0].evidence
    hard = _tasks(range(30, 31), kinds=("hard",))[0]
    first = pair("b", "a").workflow(pool.names())
    req = _review_request(hard, pool, first, RequestLimits(max_steps=2, max_rounds=2))
    sig, est, wid = ev.estimate(req, summarize(req))
    assert est is not None and est.escalate and wid == 2 and est.worker == "dear"
    assert sig[0].wrong == 1 and sig[1].wrong == 1
    # dear is not permitted: the estimate keeps and names no worker
    barred = _review_request(
        hard, pool, first, RequestLimits(max_steps=2, max_rounds=2, allowed_workers=frozenset({"a", "b"}))
    )
    _, est2, wid2 = ev.estimate(barred, summarize(barred))
    assert est2 is not None and not est2.escalate and wid2 is None
    assert est2.line(wid2).endswith("Best by estimate: keep")
    # a first plan no estimator covers (one worker): no estimate
    single = Workflow(steps=(first.steps[0],))
    one = _review_request(hard, pool, single, RequestLimits(max_steps=2, max_rounds=2))
    assert ev.estimate(one, summarize(one))[1] is None
    plain = review_prompt(one, summarize(one), max_question_chars=120)
    assert plain == review_prompt(one, summarize(one), max_question_chars=120, signals=None, estimate=None)
    assert "Estimate:" not in plain and "Best by estimate" not in plain


@pytest.mark.slow
def test_a_trained_text_conductor_shows_its_estimate_and_one_round_is_unchanged(tmp_path: Path) -> None:
    """Trained on gsm8k-six's training split with ``review_evidence: text``: the estimator is saved
    with the model, fitted on training questions only; the review prompt shows the estimate where
    the model has one and not where its file says none; max_rounds 1 gives the same traces."""
    from one_round_cases import project
    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.review_evidence import ReviewEvidence
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.train import train
    from rl_conductor.workers.pool import load_pool

    cfg = rounds_micro_config(tmp_path, review_evidence="text")
    res = train(cfg, tmp_path / "out", progress=False)
    final = res.final_dir
    meta = json.loads((final / "conductor.json").read_text())
    assert meta["review_evidence"] == "text" and ReviewEvidence.exists(final)
    ev = ReviewEvidence.load(final)
    assert ev.plans and ev.config.cost_weight == pytest.approx(meta["reward"]["cost_weight"])
    # the estimator saw training questions only: its fit covered the warm start's 48 (train split)
    train_ids = {t.id for t in load_tasks("gsm8k-six", split="train", limit=48, seed=cfg.seed)}
    assert len(train_ids) == 48
    held = {t.id for s in ("validation", "test") for t in load_tasks("gsm8k-six", split=s)}
    assert not train_ids & held

    pool = load_pool("gsm8k-six")
    tasks = load_tasks("gsm8k-six", split="validation", limit=6)
    text_policy = ConductorPolicy(final)
    plain_dir = tmp_path / "plain"
    shutil.copytree(final, plain_dir)
    doc = json.loads((plain_dir / "conductor.json").read_text())
    del doc["review_evidence"]
    (plain_dir / "conductor.json").write_text(json.dumps(doc))
    (plain_dir / "review_evidence.json").unlink()
    plain_policy = ConductorPolicy(plain_dir)
    # a damaged estimator file is refused in one line that names it, not with a traceback
    from rl_conductor.errors import ModelNotFound

    damaged = tmp_path / "damaged"
    shutil.copytree(final, damaged)
    for text in ("{not json", json.dumps({"plans": 3})):
        (damaged / "review_evidence.json").write_text(text)
        with pytest.raises(ModelNotFound, match="review evidence file does not load"):
            ConductorPolicy(damaged)
    assert plain_policy.review_evidence is None and text_policy.review_evidence is not None

    # max_rounds 1: the same plans, the same traces (no review runs)
    one = RequestLimits(max_steps=2, max_rounds=1)
    for t in tasks:
        a = asyncio.run(text_policy.run(t, pool.view(), one)).trace
        b = asyncio.run(plain_policy.run(t, pool.view(), one)).trace
        assert json.dumps(project(a.to_dict()), sort_keys=True) == json.dumps(
            project(b.to_dict()), sort_keys=True
        )
        assert len(a.rounds) <= 1
    # a review of a covered first plan shows the estimate; the plain model's does not
    key = next(iter(ev.plans))
    names = pool.view().names()
    from rl_conductor.training.adaptive import pair

    first = pair(*key.split("|")).workflow(names)
    req = _review_request(tasks[0], pool, first, RequestLimits(max_steps=2, max_rounds=2))
    shown, ranking = text_policy.review_text(req, summarize(req))
    assert "\nEstimate: the answer so far is right ~" in shown and "Best by estimate:" in shown
    estimate = ev.estimate(req, summarize(req))[1]
    assert estimate is not None
    assert ranking is not None and len(ranking) == 1  # "@1" names the estimate's worker
    assert shown.rstrip().endswith("@1" if estimate.escalate else "keep")
    plain_prompt, none = plain_policy.review_text(req, summarize(req))
    assert none is None and "Estimate:" not in plain_prompt and "chars" not in plain_prompt
    assert plain_prompt == review_prompt(
        req, summarize(req), max_question_chars=plain_policy.max_question_chars
    )
    # a model whose conductor.json cuts from both ends reviews with the same cut
    plain_policy.question_cut = text_policy.question_cut = "ends"
    for policy in (plain_policy, text_policy):
        ends = policy.review_text(req, summarize(req))[0]
        assert cut(req.task.question, policy.max_question_chars, "ends") in ends
    assert_refused_without(final, "review_evidence.json", "review evidence", tmp_path)


def test_the_text_preset_is_gsm8k_six_with_the_text_review() -> None:
    from rl_conductor.training.config import load_preset

    text, base = load_preset("gsm8k-six-text"), load_preset("gsm8k-six")
    assert text.review_evidence == "text" and base.review_evidence == "none"
    assert {k: v for k, v in text.to_dict().items() if k != "review_evidence"} == {
        k: v for k, v in base.to_dict().items() if k != "review_evidence"
    }


def test_a_chain_of_the_pair_workers_gets_no_estimate_and_keeps(tmp_path: Path) -> None:
    """The estimators are fitted on the pair's fresh parallel solves. A chain of the same two
    workers (the second sees the first's answer) is another first plan: before, it was looked up
    by its workers' names, got the pair's estimate and a review target that escalated, after the
    very plans whose review must keep."""
    from rl_conductor.training.adaptive import review_records
    from rl_conductor.training.train import _warm_start
    from rl_conductor.workflow import Step

    pool, train = _pool(), _tasks()
    texts: list[Any] = []
    _, _, _, rule = _warm_start(_cfg(tmp_path, review_evidence="text"), train, pool, text_rule=texts)
    (text,) = texts
    hard = _tasks(range(30, 34), kinds=("hard",))
    chain = Workflow(steps=(Step(1, "Solve it.", ()), Step(0, "Check the answer.", "all")))
    specs = [PromptSpec(task=t, view=(0, 1, 2), budget=None) for t in hard]
    for txt in (None, text):
        recs = review_records(
            specs, pool, RequestLimits(max_steps=2), [chain] * 4, rule, max_question_chars=120, text=txt
        )
        assert len(recs) == 4
        for r in recs:
            assert "Best by estimate" not in r["prompt"][-1]["content"]
            done = parse(r["completion"][0]["content"], pool_size=3, allow_empty=True, first_index=2)
            assert done.workers() == []


def test_the_recordings_text_preset_is_the_text_recipe_on_the_pools_own_data() -> None:
    """What docs/recordings.md tells a user with response texts to train: gsm8k-six-text's recipe,
    with the pool's own dataset (no dataset pinned) and every training question."""
    from rl_conductor.training.config import load_preset

    mine, text = load_preset("recordings-text"), load_preset("gsm8k-six-text")
    assert mine.dataset is None and mine.warm_items_per_domain >= 5000 and mine.max_rounds == 2
    # one domain there: no effect; cascade pairs: the same figures on gsm8k-six (the preset's comment)
    # per-question neighbourhoods: auto keeps gsm8k-six's group means (its training split decides)
    differ = {
        "dataset",
        "warm_items_per_domain",
        "sft_examples_per_domain",
        "warm_cascade_pairs",
        "warm_neighbours",
        "sft_examples_per_domain_neighbours",
        # the fit rule (training/sft_fit.py): measured on the files users bring, not on gsm8k-six
        "sft_fit_target",
        "sft_fit_epochs",
        "sft_fit_max_passes",
        # the plan line: first plans over several domains (the unseen-file measurement in the preset)
        "plan_hint",
    }
    assert mine.warm_neighbours == "auto" and text.warm_neighbours == 0
    assert mine.plan_hint and not text.plan_hint
    assert mine.sft_fit_target > 0 and mine.sft_fit_max_passes > 0 and text.sft_fit_target == 0
    assert {k: v for k, v in mine.to_dict().items() if k not in differ} == {
        k: v for k, v in text.to_dict().items() if k not in differ
    }


def test_sft_examples_per_domain_raises_the_first_round_count_with_the_domains() -> None:
    """A per-domain target over many workers is learnt per domain: the text preset asks for 200
    first plans per domain, so a three-domain file gets 600 and one domain (gsm8k-six) keeps 200."""
    from rl_conductor.tasks.base import Task
    from rl_conductor.training.config import TrainConfig, load_preset
    from rl_conductor.training.train import sft_count
    from rl_conductor.validation import InvalidValue

    cfg = load_preset("recordings-text")
    assert cfg.sft_examples == 200 and cfg.sft_examples_per_domain == 200

    def tasks(*domains: str) -> list[Task]:
        return [
            Task(id=f"{d}/{i}", question="q", answer="1", domain=d, source=d, grader="qa")
            for d in domains
            for i in range(3)
        ]

    assert sft_count(cfg, tasks("math")) == 200
    assert sft_count(cfg, tasks("math", "knowledge", "reasoning")) == 600
    tiny = load_preset("tiny")  # per domain off: the fixed count
    assert sft_count(tiny, tasks("a", "b", "c", "d")) == tiny.sft_examples
    with pytest.raises(InvalidValue, match="sft_examples_per_domain"):
        TrainConfig(sft_examples_per_domain=-1)
    # per-question targets (auto decided for 50 neighbours): 600 per domain; undecided or 0: 200
    from dataclasses import replace

    assert cfg.warm_neighbours == "auto" and cfg.sft_examples_per_domain_neighbours == 600
    assert sft_count(replace(cfg, warm_neighbours=50), tasks("math", "knowledge", "reasoning")) == 1800
    assert sft_count(replace(cfg, warm_neighbours=0), tasks("math", "knowledge", "reasoning")) == 600
    with pytest.raises(InvalidValue, match="sft_examples_per_domain_neighbours"):
        TrainConfig(sft_examples_per_domain_neighbours=-1)


def test_a_shared_opening_makes_training_cut_questions_from_both_ends() -> None:
    """Recordings of few-shot prompts open every question with the same text: cut from the head,
    every prompt would be the same and the Conductor would learn one plan for all of them."""
    from rl_conductor.tasks.base import Task
    from rl_conductor.training.config import load_preset
    from rl_conductor.training.train import cut_for_shared_openings

    shots = "Answer the question. Here are examples. " * 20  # 800 characters every item shares

    def tasks(opening: str) -> list[Task]:
        return [
            Task(id=f"d/{i}", question=f"{opening}What is {i} + {i}?", answer=str(2 * i), domain="math",
                 source="d", grader="math")
            for i in range(40)
        ]  # fmt: skip

    cfg = load_preset("recordings-text")
    assert cfg.question_cut == "head"
    assert cut_for_shared_openings(cfg, tasks(shots)).question_cut == "ends"
    assert cut_for_shared_openings(cfg, tasks("")) is cfg  # distinct questions: as configured
    ends = load_preset("recordings")  # already both ends
    assert cut_for_shared_openings(ends, tasks(shots)) is ends
    assert cut_for_shared_openings(cfg, []) is cfg
