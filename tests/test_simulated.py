"""The simulated paper pool: determinism, calibration to the paper, context rules, tokens and cost.

The tests use small synthetic item sets as the pool's calibration set (fast graders: choice,
math). The calibration gate over ``paper-mix`` (slow: real graders, code in the sandbox) is in
``test_collaboration.py``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import replace

import pytest

from rl_conductor.evaluation.calibrate import calibrate
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.graders import grade
from rl_conductor.workers.base import CallContext, Completion, Worker, estimate_tokens
from rl_conductor.workers.pool import Pool, PoolConfigError, load_pool
from rl_conductor.workers.simulated import (
    PROFILES,
    SimulatedWorker,
    SimulationModel,
    grade_cached,
    paper_targets,
    render_answer,
    worker_prices,
)
from rl_conductor.workflow import worker_message

LETTERS = "ABCD"


def choice_tasks(n: int, domain: str = "knowledge") -> list[Task]:
    tasks = []
    for i in range(n):
        choices = [f"option {w} of item {i}" for w in ("red", "green", "blue", "white")]
        body = f"Item {i}: which colour is meant here? " + "detail " * (i % 7)
        question = body + "\n\n" + "\n".join(f"{c}. {t}" for c, t in zip(LETTERS, choices, strict=True))
        tasks.append(
            Task(
                id=f"syn-{domain}/{i}",
                question=question,
                answer=LETTERS[(i * 7) % 4],
                domain=domain,
                source="synthetic",
                grader="choice",
                metadata={"choices": choices, "subject": f"subject-{i % 5}"},
            )
        )
    return tasks


def math_tasks(n: int) -> list[Task]:
    golds = ["42", "\\frac{3}{7}", "2\\sqrt{5}", "17", "x^2+1", "-4"]
    return [
        Task(
            id=f"syn-math/{i}",
            question=f"Compute the value of problem {i}." + " Carefully." * (i % 4),
            answer=golds[i % len(golds)],
            domain="math",
            source="synthetic",
            grader="math",
            metadata={"level": 1 + i % 5, "ref_len": 100 + 37 * i % 400},
        )
        for i in range(n)
    ]


CODE_TASK = Task(
    id="syn-code/0",
    question="Write a function add(a, b) that returns the sum of a and b.",
    answer="def add(a, b):\n    return a + b\n",
    domain="code",
    source="synthetic",
    grader="code",
    metadata={"tests": ["assert add(1, 2) == 3", "assert add(-1, 5) == 4"], "entry_point": "add"},
)

QA_TASK = Task(
    id="syn-qa/0",
    question="Which city is the capital of France, on the river Seine?",
    answer="Paris",
    domain="knowledge",
    source="synthetic",
    grader="qa",
    metadata={"aliases": ["Paris"]},
)

SYN = choice_tasks(400) + choice_tasks(200, "reasoning") + math_tasks(60) + [CODE_TASK]


def syn_pool(**kw: object) -> Pool:
    """The ``paper-sim`` pool from YAML, calibrated on the synthetic items."""
    return load_pool("paper-sim", calibration=SYN, **kw)


def sim(pool: Pool, name: str) -> SimulatedWorker:
    worker = pool.get(name)
    assert isinstance(worker, SimulatedWorker)
    return worker


def call(worker: Worker, task: Task, *, nonce: int = 0, step_index: int = 0) -> Completion:
    """One call without earlier answers, in a fresh event loop."""
    return asyncio.run(acall(worker, task, nonce=nonce, step_index=step_index))


async def acall(
    worker: Worker, task: Task, visible: tuple[str, ...] = (), *, nonce: int = 0, step_index: int = 0
) -> Completion:
    """One call that sees ``visible`` earlier answers (the executor's message and context)."""
    vis = [(i, "Solve it.", a) for i, a in enumerate(visible)]
    instruction = "Check and answer." if visible else "Solve it."
    msg = [{"role": "user", "content": worker_message(task.question, vis, instruction)}]
    context = CallContext(task=task, step_index=step_index, nonce=nonce, visible_answers=visible)
    return await worker.complete(msg, max_tokens=4096, temperature=0.2, context=context)


def test_pool_yaml_has_paper_workers_prices_and_hosting() -> None:
    pool = syn_pool()
    prices = worker_prices()
    assert sorted(pool.names()) == sorted(paper_targets()) and len(pool) == 7
    for w in pool.workers:
        assert isinstance(w, SimulatedWorker)
        p = prices[w.info.name]
        assert (w.info.price_in, w.info.price_out, w.info.hosting) == (p["input"], p["output"], p["hosting"])
        assert w.info.kind == "simulated" and w.info.description
        assert not any(name in w.info.description for name in pool.names())  # names stay hidden
        assert w.targets == paper_targets()[w.info.name]
    assert sim(pool, "gpt-5").targets["code"] == pytest.approx(0.575)
    assert pool.options["seed"] == 0 and pool.options["latency_scale"] == 0


def test_same_seed_same_text_other_seed_other_draws() -> None:
    a = sim(syn_pool(), "qwen3-32b")
    fresh = replace(a, model=SimulationModel(seed=0, calibration=SYN))  # nothing cached
    other = sim(syn_pool(seed=7), "qwen3-32b")
    items = [*SYN[:30], *math_tasks(6)]
    texts = [call(a, t).text for t in items]
    assert texts == [call(fresh, t).text for t in items]
    assert texts != [call(other, t).text for t in items]


def test_nonce_and_step_change_draws_but_keep_most_outcomes() -> None:
    w = syn_pool().get("qwen3-32b")
    items = [t for t in SYN if t.domain == "knowledge"]
    base = [grade_cached(t, call(w, t).text) for t in items]
    by_nonce = [grade_cached(t, call(w, t, nonce=1).text) for t in items]
    by_step = [grade_cached(t, call(w, t, step_index=2).text) for t in items]
    for other in (by_nonce, by_step):
        flips = sum(x != y for x, y in zip(base, other, strict=True))
        assert 0 < flips < 0.25 * len(items)  # varies, but a worker mostly agrees with itself


def test_single_worker_accuracy_matches_targets_on_its_calibration_set() -> None:
    pool = syn_pool()
    items = [t for t in SYN if t.domain in ("knowledge", "reasoning")]  # all of both domains
    rows = calibrate(pool, items, n=len(SYN) * 4, workers=["gemini-2.5-pro", "gemma-3-27b-it"])
    assert [(r["worker"], r["domain"], r["n"]) for r in rows] == [
        (w, d, n)
        for w in ("gemini-2.5-pro", "gemma-3-27b-it")
        for d, n in (("knowledge", 400), ("reasoning", 200))
    ]
    for r in rows:
        assert abs(r["simulated"] - r["target"]) <= 0.5, r


def test_correct_answers_grade_correct_and_wrong_ones_wrong() -> None:
    pool = syn_pool()
    worker = sim(pool, "gemma-3-27b-it")
    for task in [*SYN[:8], *math_tasks(6), CODE_TASK, QA_TASK]:
        for nonce in range(6):
            text = call(worker, task, nonce=nonce).text
            ok = grade(task, text)  # the real grader, uncached
            value, correct = asyncio.run(worker.answer(task, CallContext(task=task, nonce=nonce)))
            assert ok == correct, (task.id, value)
        wrong = asyncio.run(worker.model.verified_wrong(task))
        assert wrong and all(not grade(task, render_answer(task, v, 50, seeded_rng())) for v in wrong)


def seeded_rng():  # a fixed RNG for rendering in tests
    import random

    return random.Random(0)


def test_filler_never_changes_a_grade() -> None:
    """The grade cache keys simulated text on its answer value: the filler must be inert."""
    for task in [*SYN[:3], *math_tasks(6)]:
        for value in (task.answer, "B", "7", "\\frac{1}{2}"):
            bare = render_answer(task, value, 1, seeded_rng())
            for n in (30, 400, 3000):
                assert grade(task, render_answer(task, value, n, seeded_rng())) == grade(task, bare)
        assert not grade(task, render_answer(task, None, 800, seeded_rng()))  # cut before the answer


def test_a_trace_grade_costs_one_grading_per_simulated_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """reward.grade_trace grades a simulated text by its value: renderings with different filler
    cost one real grading (a sandbox start for code) between them, with the real grader's verdict;
    a text the simulation did not render is graded as it is."""
    import random

    from rl_conductor import reward
    from rl_conductor.tasks import graders
    from rl_conductor.trace import Trace

    task = replace(CODE_TASK, id="syn-code/once")
    monkeypatch.setenv("RL_CONDUCTOR_GRADE_CACHE", "0")  # what this process grades, not the disk's
    calls: list[str] = []
    real, real_settled = graders.grade, graders.settled_grade

    def counted(t: Task, text: str) -> bool:
        calls.append(text)
        return real(t, text)

    def counted_settled(t: Task, text: str) -> tuple[bool, bool]:
        calls.append(text)
        return real_settled(t, text)

    monkeypatch.setattr(graders, "grade", counted)
    monkeypatch.setattr(graders, "settled_grade", counted_settled)

    def trace(text: str) -> Trace:
        return Trace(task_id=task.id, final_answer=text)

    right = [render_answer(task, task.answer, n, random.Random(n)) for n in (5, 50, 400)]
    wrong = render_answer(task, "def add(a, b):\n    return a - b\n", 30, random.Random(1))
    assert len(set(right)) == 3  # three texts, one value
    assert [reward.grade_trace(task, trace(t)) for t in right] == [True] * 3
    assert not reward.grade_trace(task, trace(wrong))
    assert len(calls) == 2  # one per value, not one per text
    assert all(real(task, t) for t in right) and not real(task, wrong)
    own = "```python\ndef add(a, b):\n    return b + a\n```"  # no simulation rendered it
    assert reward.grade_trace(task, trace(own)) and calls[-1] == own


def test_wrong_answers_of_different_workers_often_coincide() -> None:
    pool = syn_pool()
    items = [t for t in SYN if t.domain == "reasoning"][:120]
    same = total = 0
    for t in items:
        a = call(pool.get("gemma-3-27b-it"), t).text
        b = call(pool.get("qwen3-32b"), t).text
        if not grade_cached(t, a) and not grade_cached(t, b):
            total += 1
            same += a.rsplit("Answer: ", 1)[-1] == b.rsplit("Answer: ", 1)[-1]
    assert total > 30 and 0.3 < same / total < 0.9


def test_visible_answers_help_when_right_and_mislead_when_wrong() -> None:
    pool = syn_pool()
    agg = pool.get("qwen3-32b")
    items = [t for t in SYN if t.domain == "reasoning"]

    async def accuracy(kind: str) -> float:
        oks = []
        for t in items:
            wrong = next(c for c in LETTERS if c != t.answer)
            visible = {
                "none": (),
                "right": (f"Answer: {t.answer}",),
                "wrong": (f"Answer: {wrong}", f"Answer: {wrong}"),
            }[kind]
            comp = await acall(agg, t, visible, step_index=1, nonce=1)
            oks.append(grade_cached(t, comp.text))
        return sum(oks) / len(oks)

    none, right, wrong = (asyncio.run(accuracy(k)) for k in ("none", "right", "wrong"))
    assert right > none + 0.1 and wrong < none - 0.05
    assert right < 1.0


def test_aggregating_three_proposers_beats_one_answer_but_is_not_perfect() -> None:
    pool = syn_pool()
    props = ["claude-sonnet-4", "gpt-5", "gemini-2.5-pro"]
    items = [t for t in SYN if t.domain == "reasoning"]

    async def run() -> tuple[float, float, float]:
        single = moa = any_right = 0
        for t in items:
            answers = tuple(
                [(await acall(pool.get(p), t, step_index=i, nonce=i)).text for i, p in enumerate(props)]
            )
            final = await acall(pool.get("claude-sonnet-4"), t, answers, step_index=3, nonce=3)
            single += grade_cached(t, answers[0])
            moa += grade_cached(t, final.text)
            any_right += any(grade_cached(t, a) for a in answers)
        return single / len(items), moa / len(items), any_right / len(items)

    single, moa, any_right = asyncio.run(run())
    assert single < moa < any_right


def test_tokens_and_cost_follow_messages_text_and_prices() -> None:
    pool = syn_pool()
    task = SYN[3]
    for w in pool.workers:
        comp = call(w, task)
        msg = worker_message(task.question, [], "Solve it.")
        assert comp.input_tokens == estimate_tokens(msg)
        assert comp.output_tokens == estimate_tokens(comp.text) <= 4096
        assert comp.cost_usd == pytest.approx(w.info.cost(comp.input_tokens, comp.output_tokens))
        assert comp.cost_usd == pytest.approx(
            (comp.input_tokens * w.info.price_in + comp.output_tokens * w.info.price_out) / 1e6
        )
        assert comp.latency_s > 0 and comp.worker == w.info.name
    # visible context adds input tokens
    w = pool.get("gpt-5")
    big = asyncio.run(acall(w, task, (call(w, task).text,), step_index=1))
    assert big.input_tokens > call(w, task).input_tokens + 50


def test_lengths_costs_and_latency_are_plausible() -> None:
    pool = syn_pool()
    items = [t for t in SYN if t.domain == "knowledge"][:150]

    def mean(name: str, attr: str) -> float:
        return statistics.fmean(getattr(call(pool.get(name), t), attr) for t in items)

    assert mean("qwen3-32b-thinking", "output_tokens") > 2.5 * mean("qwen3-32b", "output_tokens")
    assert mean("qwen3-32b-thinking", "latency_s") > mean("qwen3-32b", "latency_s")
    assert 0.001 < mean("gpt-5", "cost_usd") < 0.01  # MMLU-like: Table 5 has ~$0.003 per call
    assert mean("gemma-3-27b-it", "cost_usd") < mean("gpt-5", "cost_usd") / 10
    assert (
        pool.get("qwen3-32b-thinking").info.typical_output_tokens
        == PROFILES["qwen3-32b-thinking"].mean_output_tokens()
    )


def test_tight_max_tokens_cuts_the_answer() -> None:
    w = syn_pool().get("gemini-2.5-pro")
    task = SYN[5]
    msg = [{"role": "user", "content": task.question}]
    comp = asyncio.run(w.complete(msg, max_tokens=20, temperature=0.2, context=CallContext(task=task)))
    assert comp.output_tokens <= 20 and not grade(task, comp.text)


def test_latency_scale_sleeps() -> None:
    w = syn_pool(latency_scale=0.02).get("qwen3-32b")
    t0 = time.perf_counter()
    comp = call(w, SYN[1])
    assert time.perf_counter() - t0 >= comp.latency_s * 0.02 * 0.9


def test_without_context_a_placeholder_answer() -> None:
    w = syn_pool().get("gpt-5")
    comp = asyncio.run(w.complete([{"role": "user", "content": "hi"}], max_tokens=512, temperature=0.2))
    assert "no reference answer" in comp.text and comp.output_tokens <= 512


def test_custom_simulated_worker_needs_accuracy() -> None:
    from rl_conductor.workers.pool import build_pool

    spec = {"name": "my-model", "kind": "simulated", "price_in": 1, "price_out": 2, "hosting": "self"}
    with pytest.raises(PoolConfigError, match="accuracy"):
        build_pool({"name": "x", "workers": [spec]}, calibration=SYN)
    pool = build_pool(
        {"name": "x", "workers": [{**spec, "accuracy": {"knowledge": 70, "reasoning": 0.5}, "ttft_s": 2}]},
        calibration=SYN,
    )
    w = sim(pool, "my-model")
    assert w.targets == {"knowledge": 0.7, "reasoning": 0.5} and w.profile.ttft_s == 2.0
    with pytest.raises(ValueError, match="no accuracy target"):
        call(w, math_tasks(1)[0])


# The calibration gate over paper-mix (slow) lives in test_collaboration.py, which checks the single
# workers and the collaboration table from one run of the workers.
