"""Score-only feedback trains (issue 26): a served request with a score and no gold answer is an
observed (question, executed workflow, reward) example, and the warm start teaches the executed
workflow only where it earned at least the table's expected reward for that prompt.

The rule is pinned on a hand-built table; the path from the traffic log to the SFT data runs on
the real pieces: the traffic log's writer and the feedback store (in-process, as the predictor
uses them), ``loop.data.collect``, the observed file, the warm start's candidate table on the
simulated pool and the trainer's prompts; the trainer itself at micro size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rl_conductor.limits import RequestLimits
from rl_conductor.reward import REWARD_PRESETS, reward_of
from rl_conductor.training.candidates import single
from rl_conductor.training.observed import Observed, counts, judge, read_observed, write_observed
from rl_conductor.training.warmstart import ExpectedRewards
from rl_conductor.workflow import parse
from test_warmstart import EASY_HARD, PRICES, _paper_sim_targets, _table, _task

COST_AWARE = REWARD_PRESETS["cost-aware"]

#: questions no dataset of the project holds: only a score can train on them
NEW_QUESTIONS = [
    "A shop sells pencils at 3 for $1. How many dollars do 27 pencils cost?",
    "Which is heavier, a kilogram of feathers or a kilogram of iron?",
    "Name the planet in our solar system with the shortest year.",
    "If every blick is a florp and no florp is a zorb, can a blick be a zorb?",
]


def _obs(rid: str, workflow: list[tuple[str, list[int]]], score: float, cost: float = 0.001) -> Observed:
    return Observed(
        request_id=rid,
        question=f"question {rid}",
        workflow=tuple({"worker": w, "instruction": "Solve.", "access": a} for w, a in workflow),
        score=score,
        cost_usd=cost,
        called=True,
        domain="math",
        source="t",
    )


def test_the_observed_reward_is_the_one_formula_with_the_score_as_correctness() -> None:
    ex = _obs("a", [("strong", [])], 0.8, cost=0.004)
    assert ex.reward(COST_AWARE) == pytest.approx(float(reward_of(COST_AWARE, correct=0.8, cost=0.004)))
    assert ex.reward(COST_AWARE) == pytest.approx(0.5 + 0.5 * 0.8 - 0.03 * 0.4)
    stopped = Observed(**{**ex.to_dict(), "budget_stopped": True, "workflow": ex.workflow})
    assert stopped.reward(COST_AWARE) == pytest.approx(ex.reward(COST_AWARE) - COST_AWARE.budget_penalty)


def test_value_is_the_targets_expected_reward() -> None:
    er = ExpectedRewards.fit(_table(EASY_HARD, PRICES), COST_AWARE, shrink=0.0)
    cand, value = er.value(_task(0), ["cheap", "strong"], None)
    assert cand == er.best(_task(0), ["cheap", "strong"], None) == single("strong")
    assert value == pytest.approx(0.5 + 0.5 * 0.8 - 0.03 * 0.5)
    # a kind of question the table lacks: the best single over every neighbourhood, with its mean
    other = _task(1, domain="code", source="c")
    assert er.value(other, ["cheap", "strong"], None) == (single("strong"), pytest.approx(value))


def test_a_high_scored_workflow_is_taught_a_low_scored_or_unusable_one_is_not(tmp_path: Path) -> None:
    er = ExpectedRewards.fit(_table(EASY_HARD, PRICES), COST_AWARE, shrink=0.0)
    examples = [
        _obs("right", [("cheap", []), ("strong", [0])], 1.0),  # 0.997 >= strong's 0.885
        _obs("wrong", [("strong", [])], 0.0),  # 0.497
        _obs("so-so", [("strong", [])], 0.7, cost=0.005),  # 0.835 < 0.885
        _obs("gone", [("retired", [])], 1.0),  # a worker the pool no longer has
        _obs("long", [("cheap", [])] * 3, 1.0),  # more steps than the Conductor may write
    ]
    path = tmp_path / "observed.jsonl"
    write_observed(path, examples)
    assert read_observed(path) == examples
    assert read_observed("") == []
    with pytest.raises(FileNotFoundError, match="is not a file"):
        read_observed(tmp_path / "typo.jsonl")
    decisions = judge(read_observed(path), ["cheap", "strong"], er, COST_AWARE, max_steps=2)
    assert [d.taught for d in decisions] == [True, False, False, False, False]
    assert decisions[0].advantage == pytest.approx(0.997 - 0.885)
    assert decisions[0].plan is not None and [s.worker for s in decisions[0].plan.steps] == [0, 1]
    assert decisions[0].plan.steps[1].access == "all"
    assert counts(decisions) == {
        "observed": 5,
        "observed_taught": 1,
        "observed_below_baseline": 2,
        "observed_unusable": 2,
    }


def _serve_log(store: Path, requests: list[dict[str, Any]]) -> list[str]:
    """Write ``requests`` (question, workflow over worker names, cost, feedback) to a traffic log
    the way the predictor does (the log's writer, then the feedback store); returns the ids."""
    from rl_conductor.loop.feedback import Feedback, parse_feedback
    from rl_conductor.loop.traffic import TrafficConfig, TrafficLog
    from rl_conductor.serving.request import ConductorRequest

    log = TrafficLog(TrafficConfig(store=str(store), batch_size=50, flush_interval_s=30))
    ids = []
    for i, r in enumerate(requests):
        rid = f"req-{i}"
        steps = [  # as serving.request.step_document writes them: one successful attempt each
            {
                "index": k,
                "worker": w,
                "status": "ok",
                "cost_usd": r["cost"] / len(r["workflow"]),
                "attempts": [{"worker": w, "status": "ok", "cost_usd": r["cost"] / len(r["workflow"])}],
            }
            for k, (w, _) in enumerate(r["workflow"])
        ]
        doc = {
            "request_id": rid,
            "answer": "an answer",
            "workflow": [{"worker": w, "instruction": "Solve it.", "access": a} for w, a in r["workflow"]],
            "steps": steps,
            "cost_usd": r["cost"],
            "wall_s": 1.0,
        }
        log.submit(ConductorRequest(question=r["question"]), doc, "v1")
        ids.append(rid)
    log.flush()
    fb = Feedback(log)
    for rid, r in zip(ids, requests, strict=True):
        assert fb.submit(parse_feedback({"request_id": rid, **r["feedback"]}))["status"] == "recorded"
    log.close()
    return ids


@pytest.fixture(scope="module")
def paper_sim_targets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """The warm start's targets on the simulated pool at tiny sizes (a real candidate table)."""
    pool, _, targets = _paper_sim_targets(tmp_path_factory.mktemp("candidates"), max_steps=2)
    return pool, targets


def test_an_observed_plan_is_written_by_place_where_the_recipe_writes_its_targets_so() -> None:
    """A recipe whose targets name workers by their place in the prompt's ranking or plan line
    (``plan_by_rank``, ``plan_hint``) is taught observed plans the same way: each worker the
    line shows by its place, any other by id (they had been written by id only, a second way
    of writing the same choice for the model to learn)."""
    from rl_conductor.training.observed import Decision, sft_records
    from rl_conductor.workflow import Step, Workflow

    plan = Workflow(steps=(Step(3, "Solve.", ()), Step(1, "Solve.", ()), Step(4, "Check.", (0, 1))))
    d = Decision(_obs("r", [("w3", [])], 1.0), 1.0, 0.5, True, plan, (0, 1, 2, 3, 4))
    by_id = sft_records([d], lambda d: "prompt")
    placed = sft_records([d], lambda d: "prompt", line=lambda d: [3, 0, 1])
    text = placed[0]["completion"][0]["content"]
    assert "[@1, @3, 4]" in text.replace('"', "")
    assert parse(text, pool_size=5, ranking=[3, 0, 1]).workers() == plan.workers()
    assert parse(by_id[0]["completion"][0]["content"], pool_size=5).workers() == plan.workers()
    assert sft_records([d], lambda d: "prompt", line=lambda d: None) == by_id  # no line shown: ids


def test_score_only_feedback_reaches_the_sft_data_where_it_scored_high(
    tmp_path: Path, paper_sim_targets: tuple[Any, Any]
) -> None:
    """Traffic log + feedback -> collect -> observed file -> the trainer's SFT records: the
    high-scored executed workflows are targets for their own questions, the low-scored are not,
    gold feedback keeps the task path, and a standing test question never trains."""
    from rl_conductor.loop import data as loop_data
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.observed import trainer_records

    pool, targets = paper_sim_targets
    test_item = load_tasks("paper-mix", "test", limit=1)[0]
    train_item = load_tasks("paper-mix", "train", limit=1, seed=4)[0]
    high = [("qwen3-32b", []), ("gpt-5", [0])]
    low = [("gpt-5", [])]
    requests = [
        {"question": NEW_QUESTIONS[0], "workflow": high, "cost": 0.004, "feedback": {"score": 1.0}},
        {"question": NEW_QUESTIONS[1], "workflow": low, "cost": 0.003, "feedback": {"score": 0.0}},
        {"question": NEW_QUESTIONS[2], "workflow": low, "cost": 0.003, "feedback": {"score": 0.9}},
        {"question": NEW_QUESTIONS[3], "workflow": high, "cost": 0.004, "feedback": {"answer": "no"}},
        {"question": test_item.question, "workflow": high, "cost": 0.004, "feedback": {"score": 1.0}},
        {"question": train_item.question, "workflow": low, "cost": 0.003, "feedback": {"score": 0.0}},
    ]
    ids = _serve_log(tmp_path / "traffic", requests)
    window = loop_data.collect(
        str(tmp_path / "traffic"), dataset="paper-mix", holdout_fraction=0.0, exclude_ids=[test_item.id]
    )
    # gold feedback keeps the task path; the standing test question is not observed
    assert f"traffic/{ids[3]}" in {t.id for t in window.train}
    assert [o.request_id for o in window.observed] == [ids[0], ids[1], ids[2], ids[5]]
    assert window.observed[3].task_id == train_item.id and window.observed[3].domain == train_item.domain
    assert window.summary()["observed"] == 4
    path = tmp_path / "observed.jsonl"
    write_observed(path, window.observed)
    records, decisions = trainer_records(
        path, pool, RequestLimits(max_steps=2), targets, COST_AWARE, max_steps=2, max_question_chars=120
    )
    taught = {d.example.request_id for d in decisions if d.taught}
    assert taught == {ids[0], ids[2]}  # 1.0 and 0.9 clear the table's expectation; 0.0 does not
    assert all(d.baseline is not None and d.reward < d.baseline for d in decisions if not d.taught)
    names = pool.names()
    by_question = {}
    for rec in records:
        plan = parse(rec["completion"][0]["content"], pool_size=len(names))
        by_question[rec["prompt"][0]["content"]] = [names[s.worker] for s in plan.steps]
    assert len(by_question) == 2
    for prompt, workers in by_question.items():
        want = high if NEW_QUESTIONS[0][:60] in prompt else low
        assert NEW_QUESTIONS[0][:60] in prompt or NEW_QUESTIONS[2][:60] in prompt
        assert workers == [w for w, _ in want]
    assert not any(NEW_QUESTIONS[1][:60] in p or train_item.question[:60] in p for p in by_question)


@pytest.mark.slow
def test_the_trainer_teaches_the_taught_workflows_and_says_so(
    tmp_path: Path, mlflow_db_template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end at micro size: the same training with and without an observed file; with it the
    SFT data grows by exactly the taught workflows (``copies`` each), the training run logs the
    counts and ``observed.json`` lists every decision."""
    import shutil

    from _tiny import micro_config
    from rl_conductor.tracking import mlflow_utils
    from rl_conductor.training.train import train

    db = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_db_template, db)
    uri = f"sqlite:///{db}"
    monkeypatch.setenv(mlflow_utils.HOME_ENV, str(tmp_path / "home"))
    examples = [
        Observed(
            request_id=f"r{i}",
            question=q,
            workflow=({"worker": "gpt-5", "instruction": "Solve it.", "access": []},),
            score=score,
            cost_usd=0.002,
            called=True,
        )
        for i, (q, score) in enumerate(zip(NEW_QUESTIONS, [1.0, 0.0, 1.0, 0.1], strict=True))
    ]
    path = tmp_path / "observed.jsonl"
    write_observed(path, examples)
    common = dict(
        sft_targets="expected-best",
        sft_examples=32,
        grpo_steps=1,
        warm_items_per_domain=3,
        warm_top_k=1,
        warm_cheap_k=1,
        budgets_usd=[0.002],
        warm_cache_dir=str(tmp_path / "candidates"),
    )
    try:
        with_observed = micro_config(uri, observed_path=str(path), observed_copies=3, **common)
        result = train(with_observed, tmp_path / "a")
        plain = train(micro_config(uri, **common), tmp_path / "b")
        assert result.sft_records["observed_taught"] == 2 and result.sft_records["observed_records"] == 6
        assert result.sft_records["observed_below_baseline"] == 2
        assert "observed" not in plain.sft_records
        assert result.sft_records["first_round"] == plain.sft_records["first_round"] == 32
        doc = json.loads((tmp_path / "a" / "observed.json").read_text())
        assert [d["taught"] for d in doc] == [True, False, True, False]
        assert doc[0]["plan"] is not None and doc[0]["reward"] > doc[0]["baseline"] > doc[1]["reward"]
        run = mlflow_utils.client().get_run(result.mlflow_run_id)
        assert run.data.metrics["sft/observed_taught"] == 2.0
        assert run.data.params["observed_path"] == str(path)
    finally:
        mlflow_utils.reset()


def test_a_recorded_request_made_a_call_as_the_reward_reads_its_trace() -> None:
    """The retraining loop's ``called`` is the training reward's: any attempt, failed ones
    included, even on a step a deadline then skipped; a record without attempt counts (written
    before they were kept) falls back to the steps that ran or failed."""
    from rl_conductor.loop.data import made_a_call
    from rl_conductor.loop.traffic import traffic_record
    from rl_conductor.serving.request import ConductorRequest

    attempt = {"worker": "w", "status": "timeout", "input_tokens": 5, "output_tokens": 0, "cost_usd": 0.0}
    doc = {
        "request_id": "r1",
        "steps": [{"index": 0, "worker": "w", "status": "skipped_deadline", "attempts": [attempt]}],
    }
    rec = traffic_record(ConductorRequest(question="2+2?"), doc, endpoint="v1")
    assert rec["steps"][0]["attempts"] == 1
    assert made_a_call(rec["steps"])  # the trace had an attempt: the format bonus is earned
    assert not made_a_call([{"status": "skipped_deadline", "attempts": 0}])
    assert made_a_call([{"status": "failed"}]) and not made_a_call([{"status": "skipped_budget"}])


def test_observed_plans_of_a_rank_model_parse_against_the_ranking_the_prompt_shows(tmp_path: Path) -> None:
    """A rank model's prompt shows the first three ids of its ranking: an observed plan on the
    fourth worker or later is written by id, never ``@4`` (which the served Conductor cannot
    parse; an outside attack found six of twelve such completions)."""
    from _tiny import micro_config
    from rl_conductor.policies.evidence import Ranker
    from rl_conductor.prompting import RANK_SHOWN
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.observed import trainer_records
    from rl_conductor.training.train import _warm_start
    from rl_conductor.workers.pool import load_pool

    cfg = micro_config(f"sqlite:///{tmp_path / 'ml.db'}", pool="gsm8k-six", sft_targets="expected-best",
                       evidence="rank", plan_by_rank=True, warm_items_per_domain=48, warm_top_k=2,
                       warm_cheap_k=1, budgets_usd=[], budget_prob=0.0, random_pool_prob=0.0,
                       warm_cache_dir=str(tmp_path / "cache"))  # fmt: skip
    pool = load_pool("gsm8k-six")
    names = pool.names()
    assert len(names) > RANK_SHOWN
    tasks = load_tasks("gsm8k-six", "train", limit=cfg.train_limit, seed=0)
    targets, model, evidence, _ = _warm_start(cfg, tasks, pool)
    examples = [
        Observed(request_id=f"r{i}{j}", question=q, score=1.0, cost_usd=0.0, called=True,
                 workflow=({"worker": w, "instruction": "Solve it.", "access": []},))
        for i, q in enumerate(NEW_QUESTIONS[:2]) for j, w in enumerate(names)
    ]  # fmt: skip
    path = tmp_path / "observed.jsonl"
    write_observed(path, examples)
    records, decisions = trainer_records(
        path, pool, RequestLimits(max_steps=cfg.max_steps_per_workflow), targets, cfg.reward(),
        max_steps=cfg.max_steps_per_workflow, max_question_chars=cfg.max_question_chars,
        evidence=evidence, evidence_model=model, rank=Ranker(model, cfg.reward()), by_place=True,
    )  # fmt: skip
    assert len(records) == sum(d.taught for d in decisions) > RANK_SHOWN
    placed = 0
    for rec in records:
        line = next(x for x in rec["prompt"][0]["content"].splitlines() if x.startswith(("Ranked", "Best")))
        shown = [int(x) for x in line.split(":")[1].split(",")]
        plan = parse(rec["completion"][0]["content"], pool_size=len(names), ranking=shown)
        placed += any(s.rank is not None for s in plan.steps)
    assert 0 < placed < len(records)  # the shown workers by place, the others by id
