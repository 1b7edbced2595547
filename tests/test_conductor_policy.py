"""The LM Conductor policy on the session's micro model: real generation and parsing, retries and
the fallback plan on garbage, batched planning, and the review after a round (a request with
``max_rounds > 1``: the Conductor reads the workflow so far and its answers, then keeps the
answer or adds steps).

Where a test needs a particular completion (garbage, a known inner plan), the policy's generation
method is replaced by a scripted one; everything after it (parse, fallback, execute) is real.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from _tiny import Micro
from rl_conductor.limits import RequestLimits
from rl_conductor.lm.generate import generate, ids_prefix_ok
from rl_conductor.policies.catalog import make_policy
from rl_conductor.policies.conductor import (
    FALLBACK_INSTRUCTION,
    ConductorPolicy,
    allowed_ids,
    fallback_workflow,
)
from rl_conductor.policies.usable import usable_workers, within_deadline
from rl_conductor.prompting import conductor_prompt, typical_cost
from rl_conductor.tasks.base import Task
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.tasks.graders import extract_answer
from rl_conductor.workers.base import Hosting
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool, load_pool
from rl_conductor.workflow import Step, Workflow, parse, render

GARBAGE = "lorem ipsum dolor sit amet"


@pytest.fixture(scope="module")
def policy(micro: Micro) -> ConductorPolicy:
    return ConductorPolicy(micro.final_dir)


def _task(i: int = 0) -> Task:
    return Task(
        id=f"q/{i}", question=f"What is {i} + 1?", answer=str(i + 1), domain="math", source="t", grader="math"
    )


def _pool(hosting: Sequence[Hosting] = ("external", "external")) -> Pool:
    """w0, w1, ... with rising prices; each answers "\\boxed{<its name>}"."""
    workers = [
        FakeWorker(
            info=fake_info(f"w{i}", price_in=i + 1.0, price_out=2.0 * (i + 1), hosting=h),
            answer=f"\\boxed{{w{i}}}",
        )
        for i, h in enumerate(hosting)
    ]
    return Pool(name="fake", workers=list(workers))


class Script:
    """A stand-in for ``ConductorPolicy._generate``: records every call, answers from ``reply``."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: Sequence[str], *, greedy: bool, seed: int, allowed: Any = None) -> list[str]:
        self.calls.append({"prompts": list(prompts), "greedy": greedy, "seed": seed, "allowed": allowed})
        return [self.reply(p, len(self.calls)) for p in prompts]


def _plan_text(ids: Sequence[int], access: Sequence[str] | None = None) -> str:
    subs = ", ".join(f"'step {i}'" for i in range(len(ids)))
    acc = ", ".join(access) if access is not None else ", ".join(["[]"] + ['"all"'] * (len(ids) - 1))
    return f"model_id = [{', '.join(map(str, ids))}]\nsubtasks = [{subs}]\naccess_list = [{acc}]"


# --------------------------------------------------------------------------- real generation


def test_loads_the_trained_folder(policy: ConductorPolicy, micro: Micro) -> None:
    assert policy.meta["format"] == "rl-conductor/1"
    assert policy.max_new_tokens == micro.config.max_completion_length
    assert policy.max_question_chars == micro.config.max_question_chars
    assert policy.name == "conductor:final"
    assert isinstance(make_policy(f"conductor:{micro.final_dir}", load_pool("paper-sim")), ConductorPolicy)
    with pytest.raises(ValueError, match="model folder"):
        make_policy("conductor", load_pool("paper-sim"))


async def test_greedy_plans_of_the_trained_model_parse(policy: ConductorPolicy, micro: Micro) -> None:
    """The SFT warm start taught the format: greedy completions mostly parse without retries."""
    pool = load_pool("paper-sim")
    view = pool.view()
    limits = RequestLimits(max_steps=micro.config.max_steps_per_workflow)
    tasks = load_tasks("paper-mix", split="test", limit=8, seed=3)
    strict = ConductorPolicy(micro.final_dir, retries=0)
    plans = await strict.plan_many(tasks, view, limits)
    parsed = [p for p in plans if not p.fallback]
    assert len(parsed) >= 4, [p.text for p in plans]
    for p in parsed:
        assert p.parse_error is None
        assert parse(p.text, pool_size=len(view), max_steps=limits.max_steps) == p.workflow
    # greedy planning is deterministic
    again = await strict.plan_many(tasks, view, limits)
    assert [p.text for p in again] == [p.text for p in plans]


async def test_run_many_batches_generation_and_keeps_task_order(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rl_conductor.policies.conductor as conductor

    real = conductor.generate
    batches: list[int] = []

    def spy(model: Any, tokenizer: Any, prompts: list[str], **kw: Any) -> list[str]:
        batches.append(len(prompts))
        return real(model, tokenizer, prompts, **kw)

    monkeypatch.setattr(conductor, "generate", spy)
    pool = load_pool("paper-sim")
    tasks = load_tasks("paper-mix", split="test", limit=5, seed=1)
    episodes = await policy.run_many(tasks, pool.view(), RequestLimits(max_steps=2))
    assert [e.trace.task_id for e in episodes] == [t.id for t in tasks]
    assert batches[0] == len(tasks)  # one forward batch for all tasks, then only the retries
    assert sum(batches[1:]) <= len(tasks) * policy.retries
    for e in episodes:
        assert e.trace.workflow_text == e.plan.text
        assert e.trace.fallback_plan == e.plan.fallback
        assert len(e.trace.steps) == len(e.plan.workflow.steps)


# --------------------------------------------------------------------------- retries and fallback


async def test_garbage_retries_then_falls_back_and_marks_the_trace(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(lambda prompt, call: GARBAGE)
    monkeypatch.setattr(policy, "_generate", script)
    pool = _pool()
    ep = await policy.run(_task(), pool.view(), RequestLimits())
    assert len(script.calls) == policy.retries + 1
    assert [c["greedy"] for c in script.calls] == [True] + [False] * policy.retries
    assert len({c["seed"] for c in script.calls}) == len(script.calls)  # each retry samples afresh
    assert ep.plan.fallback and ep.trace.fallback_plan
    assert ep.plan.parse_error and "model_id" in ep.plan.parse_error
    # the documented default: one step on the highest-priced permitted worker
    assert ep.plan.workflow == Workflow(steps=(Step(1, FALLBACK_INSTRUCTION, ()),))
    assert ep.plan.text == GARBAGE and ep.trace.workflow_text == GARBAGE  # what the model wrote
    assert [s.worker for s in ep.trace.steps] == ["w1"]
    assert ep.trace.final_answer == "\\boxed{w1}"


async def test_fallback_respects_the_request(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy, "_generate", Script(lambda prompt, call: GARBAGE))
    pool = _pool(("self", "external", "self", "external"))
    private = RequestLimits(sensitivity="private")
    assert fallback_workflow(pool.view(), private).workers() == [2]  # dearest self-hosted
    ep = await policy.run(_task(), pool.view(), private)
    assert ep.plan.fallback and [s.worker for s in ep.trace.steps] == ["w2"]
    only_w0 = RequestLimits(allowed_workers=frozenset({"w0"}))
    assert fallback_workflow(pool.view(), only_w0).workers() == [0]


#: a plan whose worker choice is readable but whose subtasks are not (a gsm8k-six test completion)
BROKEN_SUBTASKS = "model_id = [{ids}]\nsubtasks = [[], []]"


async def test_an_unparseable_plan_keeps_the_workers_of_its_model_id_list(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every attempt fails to parse, but the greedy completion's model_id list names usable
    workers: those run (default instruction), not the dearest worker; the plan stays marked a
    fallback and the trace says what was salvaged. Access: in one round the last step sees the
    earlier ones, with more rounds the steps are parallel solves, and the completion's own
    valid access list wins."""
    script = Script(lambda prompt, call: BROKEN_SUBTASKS.format(ids="0, 2") if call == 1 else GARBAGE)
    monkeypatch.setattr(policy, "_generate", script)
    view = _pool(("external",) * 4).view()
    ep = await policy.run(_task(), view, RequestLimits())
    assert len(script.calls) == policy.retries + 1
    assert ep.plan.fallback and ep.trace.fallback_plan and ep.plan.parse_error
    assert ep.plan.workflow == Workflow(
        steps=(Step(0, FALLBACK_INSTRUCTION, ()), Step(2, FALLBACK_INSTRUCTION, "all"))
    )
    assert [s.worker for s in ep.trace.steps] == ["w0", "w2"] and ep.trace.final_answer == "\\boxed{w2}"
    assert ep.plan.text == GARBAGE and ep.trace.workflow_text == GARBAGE  # the last attempt's, as parse_error
    assert any("salvaged its model_id list: workers [0, 2]" in n for n in ep.trace.notes)
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: BROKEN_SUBTASKS.format(ids="0, 2")))
    apart = (await policy.plan(_task(), view, RequestLimits(max_rounds=2))).workflow
    assert apart.workers() == [0, 2] and [s.access for s in apart.steps] == [(), ()]
    own = "model_id = [0, 2]\nsubtasks = [1, 2]\naccess_list = [[], []]"
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: own))
    kept = (await policy.plan(_task(), view, RequestLimits())).workflow
    assert kept.workers() == [0, 2] and [s.access for s in kept.steps] == [(), ()]


@pytest.mark.parametrize(
    ("ids", "hosting", "limits", "expected"),
    [
        ("0, 9", ("external",) * 4, RequestLimits(), [3]),  # an id outside the view
        ("0, 'w2'", ("external",) * 4, RequestLimits(), [3]),  # not an int
        ("", ("external",) * 4, RequestLimits(), [3]),  # no workers
        ("0, 2", ("external",) * 4, RequestLimits(max_steps=1), [3]),  # more steps than allowed
        ("0, 1", ("self", "external", "self", "external"), RequestLimits(sensitivity="private"), [2]),
        ("0, 2", ("external",) * 4, RequestLimits(allowed_workers=frozenset({"w0", "w1"})), [1]),
        ("0, 2", ("external",) * 4, RequestLimits(max_cost_usd=0.003), [1]),  # w2 alone is over budget
        # each fits, both do not (0.0053 > 0.0045): a chain is not cut, the fallback stands
        ("2, 0", ("external",) * 4, RequestLimits(max_cost_usd=0.0045), [2]),
    ],
)
async def test_a_model_id_list_the_limits_forbid_gets_the_default_fallback(
    policy: ConductorPolicy,
    monkeypatch: pytest.MonkeyPatch,
    ids: str,
    hosting: tuple[Hosting, ...],
    limits: RequestLimits,
    expected: list[int],
) -> None:
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: BROKEN_SUBTASKS.format(ids=ids)))
    view = _pool(hosting).view()
    plan = await policy.plan(_task(), view, limits)
    assert plan.fallback and plan.workflow == fallback_workflow(view, limits)
    assert plan.workflow.workers() == expected and not plan.notes


async def test_a_salvaged_plan_meets_the_budget_and_the_deadline(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parallel solves that the budget affords one of are cut to the answering step, as a parsed
    plan is (rounds.single_within_budget); a salvaged chain that misses the deadline falls back
    to the default plan (the fast worker)."""
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: BROKEN_SUBTASKS.format(ids="2, 0")))
    view = _pool(("external",) * 4).view()
    cut = await policy.plan(_task(), view, RequestLimits(max_cost_usd=0.0045, max_rounds=2))
    assert cut.fallback and cut.workflow == Workflow(steps=(Step(0, FALLBACK_INSTRUCTION, ()),))
    timed = _timed_pool().view()
    monkeypatch.setattr(policy, "_generate", Script(lambda p, c: BROKEN_SUBTASKS.format(ids="0, 1")))
    assert (await policy.plan(_task(), timed, RequestLimits())).workflow.workers() == [0, 1]
    late = await policy.plan(_task(), timed, RequestLimits(max_latency_s=5))
    assert late.fallback and late.workflow == Workflow(steps=(Step(0, FALLBACK_INSTRUCTION, ()),))
    assert not any("salvaged" in n for n in late.notes)


async def test_a_retry_that_parses_is_used(policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(lambda prompt, call: GARBAGE if call == 1 else _plan_text([0, 1]))
    monkeypatch.setattr(policy, "_generate", script)
    plan = await policy.plan(_task(), _pool().view(), RequestLimits())
    assert len(script.calls) == 2
    assert not plan.fallback and plan.workflow.workers() == [0, 1]
    assert plan.parse_error  # the first attempt's error is kept for diagnosis


async def test_plan_many_retries_only_the_failures(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reply(prompt: str, call: int) -> str:
        n = int(re.search(r"What is (\d+) \+ 1", prompt).group(1))  # type: ignore[union-attr]
        return _plan_text([n % 2]) if n % 2 == 0 or call > 1 else GARBAGE

    script = Script(reply)
    monkeypatch.setattr(policy, "_generate", script)
    plans = await policy.plan_many([_task(i) for i in range(4)], _pool().view(), RequestLimits())
    assert [len(c["prompts"]) for c in script.calls] == [4, 2]
    assert [p.workflow.workers() for p in plans] == [[0], [1], [0], [1]]
    assert not any(p.fallback for p in plans)


async def test_too_many_steps_or_unknown_worker_is_unparseable(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy, "_generate", Script(lambda prompt, call: _plan_text([0, 1, 0])))
    plan = await policy.plan(_task(), _pool().view(), RequestLimits(max_steps=2))
    assert plan.fallback and "at most 2" in str(plan.parse_error)
    monkeypatch.setattr(policy, "_generate", Script(lambda prompt, call: _plan_text([7])))
    plan = await policy.plan(_task(), _pool().view(), RequestLimits())
    assert plan.fallback and "out of range" in str(plan.parse_error)


async def test_a_refused_plan_shows_the_completion_that_was_refused_not_the_fallbacks_rendering(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A well-formed completion refused by the request (more steps than max_steps, a worker out of
    range) falls back; the raw plan shown (``conductor plan``'s "raw completion", the response's
    ``raw_plan``) is that completion. It was the fallback's own rendering: a well-formed plan,
    called unparseable next to it (attack 31)."""
    for text, limits, why in (
        (_plan_text([0, 1, 0]), RequestLimits(max_steps=2), "at most 2"),
        (_plan_text([7]), RequestLimits(), "out of range"),
    ):
        monkeypatch.setattr(policy, "_generate", Script(lambda prompt, call, t=text: t))
        ep = await policy.run(_task(), _pool().view(), limits)
        assert ep.plan.fallback and why in str(ep.plan.parse_error)
        assert ep.plan.text == text and ep.plan.text != render(ep.plan.workflow)
        assert ep.trace.workflow_text == text and ep.trace.fallback_plan


# --------------------------------------------------------------------------- rounds


@pytest.fixture
def reviewer(micro: Micro) -> ConductorPolicy:
    """The micro Conductor standing in for a model trained for two rounds (``conductor.json``
    ``max_rounds: 2``); the tests script what it writes."""
    p = ConductorPolicy(micro.final_dir)
    p.meta["max_rounds"] = 2
    return p


async def test_a_model_trained_for_one_round_never_reviews(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's max_rounds is an allowance: a model trained to plan once never learnt the review
    prompt, so it keeps its answer (before, its untrained review added steps on most questions)."""
    assert policy.trained_rounds == 1
    script = _review_script(_plan_text([0]), _plan_text([1]))
    monkeypatch.setattr(policy, "_generate", script)
    ep = await policy.run(_task(), _pool().view(), RequestLimits(max_rounds=2))
    assert len(script.calls) == 1 and ep.trace.rounds == [] and ep.trace.calls == 1
    assert policy.review_hook(RequestLimits(max_rounds=2)) is None


def _review_script(first: str, review: str) -> Script:
    return Script(lambda prompt, call: review if "Workflow so far:" in prompt else first)


async def test_a_second_round_adds_steps_that_see_the_first(
    reviewer: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = _pool()
    # the review adds one step on w1 that sees step 0 (numbered after the steps so far)
    script = _review_script(_plan_text([0]), _plan_text([1], ["[0]"]))
    monkeypatch.setattr(reviewer, "_generate", script)
    ep = await reviewer.run(_task(), pool.view(), RequestLimits(max_rounds=2))
    assert [s.worker for s in ep.trace.steps] == ["w0", "w1"]
    assert ep.trace.steps[1].visible == [0]
    assert ep.trace.final_answer == "\\boxed{w1}" and ep.trace.calls == 2
    first, second = ep.trace.rounds
    assert (first.decision, first.steps, second.decision, second.steps) == ("plan", [0], "continue", [1])
    key = extract_answer(_task(), "\\boxed{w0}")  # the math grader's key (math-verify)
    assert key and second.answers == [key] and second.agree is None and len(second.seen) == 16
    review_prompt = script.calls[1]["prompts"][0]
    assert "[0] model 0, sees []: step 0 -> " + key in review_prompt
    assert "One answer so far." in review_prompt
    fake = pool.get("w1")
    assert (
        isinstance(fake, FakeWorker)
        and "[Step 0] Answer:\n\\boxed{w0}" in fake.calls[0]["messages"][0]["content"]
    )


async def test_one_round_never_reviews(reviewer: ConductorPolicy, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _review_script(_plan_text([0]), _plan_text([1]))
    monkeypatch.setattr(reviewer, "_generate", script)
    ep = await reviewer.run(_task(), _pool().view(), RequestLimits())
    assert len(script.calls) == 1 and ep.trace.rounds == [] and ep.trace.calls == 1


async def test_an_empty_review_keeps_the_answer(
    reviewer: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = "model_id = []\nsubtasks = []\naccess_list = []"
    monkeypatch.setattr(reviewer, "_generate", _review_script(_plan_text([0, 1], ["[]", "[]"]), empty))
    ep = await reviewer.run(_task(), _pool().view(), RequestLimits(max_rounds=3))
    assert [r.decision for r in ep.trace.rounds] == ["plan", "keep"]
    assert ep.trace.rounds[1].agree is False  # w0 and w1 answered differently
    assert ep.trace.final_answer == "\\boxed{w1}" and ep.trace.calls == 2
    # an empty plan is only acceptable in a review
    monkeypatch.setattr(reviewer, "_generate", Script(lambda prompt, call: empty))
    assert (await reviewer.plan(_task(), _pool().view(), RequestLimits())).fallback


async def test_an_unparseable_review_keeps_the_answer(
    reviewer: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reviewer, "_generate", _review_script(_plan_text([0]), "no lists here"))
    ep = await reviewer.run(_task(), _pool().view(), RequestLimits(max_rounds=2))
    assert [r.decision for r in ep.trace.rounds] == ["plan", "keep"] and ep.trace.calls == 1


async def test_later_rounds_share_the_budget(
    reviewer: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = _pool()
    monkeypatch.setattr(reviewer, "_generate", _review_script(_plan_text([0]), _plan_text([1, 1, 1])))
    # room for the first call only: the review sees the budget left and adds none of the three
    # steps, each of which a typical answer of w1 would overrun (rounds.continuation_within_limits;
    # before, they were planned and stopped by the executor)
    limits = RequestLimits(max_rounds=2, max_cost_usd=0.0008)
    ep = await reviewer.run(_task(), pool.view(), limits)
    assert ep.trace.cost_usd <= 0.0008
    assert ep.trace.rounds[1].decision == "keep" and ep.trace.calls == 1
    assert not any(s.status == "skipped_budget" for s in ep.trace.steps)


# --------------------------------------------------------------------------- budget masking


@pytest.mark.parametrize(
    ("body", "ok"),
    [
        ("", True),
        ("1", True),
        ("1, ", True),
        ("1, 3", True),  # "3" may still become 3x
        ("1, 3,", False),
        ("2", False),
        ("2,", False),
        ("1, 2]", False),
        ("1]", True),
        ("3 ", False),  # a space ends the entry: 3 is not allowed
        ("31", True),
        ("31, 4", False),
        ("x, y", True),  # not ids: left to the parser
        ("[2", False),  # digits anywhere in the list count
        ("'step 2'", False),
        ("01", True),
    ],
)
def test_ids_prefix_ok(body: str, ok: bool) -> None:
    assert ids_prefix_ok(body, frozenset({1, 31})) is ok


def test_allowed_ids_masks_only_workers_over_the_budget() -> None:
    pool = _pool(("self", "external", "self", "external"))
    view = pool.view()
    costs = [typical_cost(i) for i in view.infos()]
    assert costs == sorted(costs)
    assert allowed_ids(view, RequestLimits()) is None  # no budget: decoding as trained
    between = (costs[1] + costs[2]) / 2
    assert allowed_ids(view, RequestLimits(max_cost_usd=between)) == frozenset({0, 1})
    assert allowed_ids(view, RequestLimits(max_cost_usd=costs[-1])) is None  # every worker affordable
    assert allowed_ids(view, RequestLimits(max_cost_usd=costs[0] / 2)) is None  # none: nothing to prefer
    # a private request is not masked: the executor replaces a forbidden worker (and says so)
    assert allowed_ids(view, RequestLimits(sensitivity="private")) is None
    # the fallback plan is the dearest worker that is permitted and affordable
    assert fallback_workflow(view, RequestLimits(max_cost_usd=between)).workers() == [1]
    assert fallback_workflow(view, RequestLimits(max_cost_usd=between, sensitivity="private")).workers() == [
        0
    ]


async def test_the_policy_passes_the_budget_mask_to_generation(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(lambda prompt, call: _plan_text([0]))
    monkeypatch.setattr(policy, "_generate", script)
    view = _pool(("self", "external", "self")).view()
    cheap = (typical_cost(view.infos()[0]) + typical_cost(view.infos()[1])) / 2
    await policy.plan(_task(), view, RequestLimits(max_cost_usd=cheap))
    await policy.plan(_task(), view, RequestLimits())
    assert [c["allowed"] for c in script.calls] == [[frozenset({0})], [None]]


def test_masked_generation_never_writes_a_masked_id(micro: Micro, policy: ConductorPolicy) -> None:
    """The real micro model, sampled hot so that it tries every id: with a mask, every id it writes
    in its model_id list is an allowed one; without, it writes others (so the mask did the work)."""
    pool = load_pool(micro.config.pool, seed=0)
    view = pool.view()
    tasks = load_tasks("paper-mix", split="train")[:24]
    prompts = [
        policy._chat(conductor_prompt(t, view, RequestLimits(), max_question_chars=120)) for t in tasks
    ]
    allowed = frozenset({1})
    kw: dict[str, Any] = {"max_new_tokens": 40, "temperature": 1.3, "seed": 3, "num_return_sequences": 4}
    free = generate(policy.model, policy.tokenizer, prompts, **kw)
    masked = generate(policy.model, policy.tokenizer, prompts, allowed_ids=[allowed] * len(prompts), **kw)

    def ids(texts: list[str]) -> set[int]:
        found: set[int] = set()
        for text in texts:
            m = re.search(r"\bmodel_id\s*(?:=|:)\s*\[([^\]]*)", text)  # as parse reads it
            if m:
                found |= {int(x) for x in re.findall(r"\d+", m.group(1))}
        return found

    assert ids(free) - allowed, "the hot unmasked samples should name other workers too"
    assert ids(masked) and ids(masked) <= allowed
    with pytest.raises(ValueError, match="one entry per prompt"):
        generate(policy.model, policy.tokenizer, prompts, allowed_ids=[allowed], **kw)


# --------------------------------------------------------------------------- deadlines


def _timed_pool() -> Pool:
    """w0 answers in ~1 s, w1 in ~20 s (their typical answer, from the latency model)."""
    from dataclasses import replace as dc_replace

    infos = [
        dc_replace(
            fake_info("w0", price_out=2.0), ttft_s=0.5, tokens_per_s=1000.0, typical_output_tokens=500
        ),
        dc_replace(fake_info("w1", price_out=4.0), ttft_s=0.5, tokens_per_s=25.0, typical_output_tokens=500),
    ]
    return Pool(name="timed", workers=[FakeWorker(info=i, answer=f"\\boxed{{{i.name}}}") for i in infos])


def test_plan_seconds_is_the_typical_critical_path() -> None:
    from rl_conductor.policies.conductor import plan_seconds

    view = _timed_pool().view()
    fast, slow = (typical_seconds_of(view, j) for j in (0, 1))
    assert 0.5 < fast < 2 and 15 < slow < 25
    chain = parse(_plan_text([1, 0]), pool_size=2, max_steps=5)
    apart = parse(_plan_text([1, 0], ["[]", "[]"]), pool_size=2, max_steps=5)
    assert plan_seconds(chain, view) == pytest.approx(slow + fast)  # the second step waits
    assert plan_seconds(apart, view) == pytest.approx(slow)  # independent steps overlap


def typical_seconds_of(view: Any, j: int) -> float:
    from rl_conductor.prompting import typical_seconds

    secs = typical_seconds(view.worker(j).info)
    assert secs is not None
    return secs


async def test_a_deadline_is_planned_for_only_where_it_binds(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unconstrained, the (scripted) Conductor picks the slow w1; with the deadline in its prompt,
    the fast w0. A deadline w1 meets keeps the first plan (one generation); a shorter one is
    planned again with the deadline in the prompt."""
    script = Script(lambda prompt, call: _plan_text([0] if "Deadline:" in prompt else [1]))
    monkeypatch.setattr(policy, "_generate", script)
    view = _timed_pool().view()
    roomy = await policy.plan(_task(), view, RequestLimits(max_latency_s=60))
    assert roomy.workflow.workers() == [1] and len(script.calls) == 1
    assert "Deadline:" not in script.calls[0]["prompts"][0]
    tight = await policy.plan(_task(), view, RequestLimits(max_latency_s=5))
    assert tight.workflow.workers() == [0] and len(script.calls) == 3
    assert "Deadline: 5 s" in script.calls[2]["prompts"][0]
    # the plan says which pass it came from, and the trace carries it (before the executor's notes)
    assert len(roomy.notes) == 1 and "fits it" in roomy.notes[0] and roomy.notes[0].endswith("kept")
    assert len(tight.notes) == 1 and "misses 5 s (" in tight.notes[0]
    assert tight.notes[0].endswith("planned again with it")
    from rl_conductor.prompting import quantile_seconds

    slow = f"{quantile_seconds(view.worker(1).info, policy.deadline_quantile):.4g} s"
    assert slow in roomy.notes[0] and slow in tight.notes[0]
    episode = await policy.run(_task(), view, RequestLimits(max_latency_s=5))
    assert episode.trace.notes[0] == tight.notes[0]
    [ran] = await policy.run_many([_task()], view, RequestLimits(max_latency_s=5))
    assert ran.trace.notes[0] == tight.notes[0]
    # batched: only the requests whose first plan misses their deadline are planned again
    plans = policy.plan_batch(
        [
            (_task(0), view, RequestLimits(max_latency_s=60)),
            (_task(1), view, RequestLimits(max_latency_s=5)),
            (_task(2), view, RequestLimits()),
        ]
    )
    assert [p.workflow.workers() for p in plans] == [[1], [0], [1]]
    assert [len(p.notes) for p in plans] == [1, 1, 0]  # no deadline, no note
    assert len(script.calls[-1]["prompts"]) == 1
    # deadline_check off: every deadline goes into the prompt
    monkeypatch.setattr(policy, "deadline_check", False)
    assert (await policy.plan(_task(), view, RequestLimits(max_latency_s=60))).workflow.workers() == [0]


def test_the_mask_follows_every_spelling_the_parser_reads(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_conductor.lm.generate import _OPEN_LIST

    assert _OPEN_LIST.search("model_id: [1, ") and _OPEN_LIST.search("x\nmodel_id=[")
    # a plan naming a masked worker in a spelling the mask cannot see is retried, then falls back
    view = _pool(("self", "external", "self")).view()
    cheap = (typical_cost(view.infos()[0]) + typical_cost(view.infos()[1])) / 2
    sneaky = "model_id = [0x1]\nsubtasks = ['s']\naccess_list = [[]]"
    script = Script(lambda prompt, call: sneaky if call == 1 else _plan_text([0]))
    monkeypatch.setattr(policy, "_generate", script)
    plan = await_(policy.plan(_task(), view, RequestLimits(max_cost_usd=cheap)))
    assert plan.workflow.workers() == [0] and "over the budget" in (plan.parse_error or "")


def await_(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


def test_no_mask_when_no_permitted_worker_is_affordable() -> None:
    view = _pool(("external", "external", "self")).view()
    costs = [typical_cost(i) for i in view.infos()]
    between = (costs[1] + costs[2]) / 2  # w0, w1 affordable; the only self-hosted one is not
    assert allowed_ids(view, RequestLimits(max_cost_usd=between)) == frozenset({0, 1})
    assert allowed_ids(view, RequestLimits(max_cost_usd=between, sensitivity="private")) is None


async def test_unknown_latency_puts_the_deadline_in_the_prompt(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(lambda prompt, call: _plan_text([0]))
    monkeypatch.setattr(policy, "_generate", script)
    await policy.plan(
        _task(), _pool().view(), RequestLimits(max_latency_s=0.5)
    )  # fake workers: no latency model
    assert len(script.calls) == 2 and "Deadline: 0.5 s" in script.calls[1]["prompts"][0]


def test_the_fallback_prefers_a_worker_that_meets_the_deadline() -> None:
    view = _timed_pool().view()
    assert fallback_workflow(view, RequestLimits()).workers() == [1]  # the dearer one
    assert fallback_workflow(view, RequestLimits(max_latency_s=5)).workers() == [0]  # the one that fits
    assert fallback_workflow(view, RequestLimits(max_latency_s=0.1)).workers() == [1]  # none fits: as before


def test_a_budget_no_worker_affords_gets_the_cheapest_permitted_worker_not_the_dearest() -> None:
    """Under a budget below every worker's typical answer, the fallback plan is the cheapest
    permitted worker: the executor cuts its output least (the dearest had spent the budget on
    the shortest answer)."""
    pool = _pool(("self", "external", "self", "external"))
    view = pool.view()
    costs = [typical_cost(i) for i in view.infos()]
    assert costs == sorted(costs) and costs[0] < costs[1]
    tiny = costs[0] / 2
    assert usable_workers(view, RequestLimits(max_cost_usd=tiny)) == [0]
    assert fallback_workflow(view, RequestLimits(max_cost_usd=tiny)).workers() == [0]
    only_dear = RequestLimits(max_cost_usd=tiny, allowed_workers=frozenset({"w2", "w3"}))
    assert fallback_workflow(view, only_dear).workers() == [2]  # the cheapest the allow-list permits
    assert within_deadline(_timed_pool().view(), [0, 1], 5) == [0]
    assert within_deadline(_timed_pool().view(), [0, 1], 0.1) == [0, 1]  # none fits: every one
    assert within_deadline(_timed_pool().view(), [0, 1], None) == [0, 1]


def test_a_slow_answer_is_what_a_plan_must_fit() -> None:
    """``quantile_latency_s``: the output length at its quantile (lognormal spread), the rest at
    the medians; the default spread is stated, a pool file or the simulated profile sets it."""
    from dataclasses import replace as dc_replace

    from rl_conductor.policies.conductor import plan_seconds
    from rl_conductor.workers.kinds import info_from_spec
    from rl_conductor.workers.simulated import LENGTH_SIGMA

    info = dc_replace(fake_info("w"), ttft_s=0.5, tokens_per_s=100.0)
    assert info.quantile_latency_s(0, 500, 0.5) == info.estimate_latency_s(0, 500) == pytest.approx(5.5)
    assert info.quantile_latency_s(0, 500, 0.9) == pytest.approx(0.5 + round(500 * 1.8984) / 100, abs=0.02)
    assert info.quantile_latency_s(0, 500, 0.1) < 5.5
    with pytest.raises(ValueError, match="quantile"):
        info.quantile_latency_s(0, 500, 1.0)
    for bad in (float("nan"), -0.1, 600.0, True):
        with pytest.raises(ValueError, match="output_tokens_spread"):
            dc_replace(info, output_tokens_spread=bad)
    spec = {"name": "v", "kind": "fake", "ttft_s": 0.2, "tokens_per_s": 50, "output_tokens_spread": 0.3}
    assert info_from_spec(spec).output_tokens_spread == 0.3
    assert all(i.output_tokens_spread == LENGTH_SIGMA for i in load_pool("paper-sim").view().infos())
    view = _timed_pool().view()
    chain = parse(_plan_text([1, 0]), pool_size=2, max_steps=5)
    assert plan_seconds(chain, view, 0.9) > plan_seconds(chain, view) * 1.5


async def test_a_deadline_the_typical_answer_meets_but_a_slow_one_misses_is_planned_for(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """w1 answers in ~20 s typically, ~38 s at p90: a 30 s deadline keeps w1's plan only when
    plans are checked at the median."""
    script = Script(lambda prompt, call: _plan_text([0] if "Deadline:" in prompt else [1]))
    monkeypatch.setattr(policy, "_generate", script)
    view = _timed_pool().view()
    assert (await policy.plan(_task(), view, RequestLimits(max_latency_s=30))).workflow.workers() == [0]
    monkeypatch.setattr(policy, "deadline_quantile", 0.5)
    assert (await policy.plan(_task(), view, RequestLimits(max_latency_s=30))).workflow.workers() == [1]


async def test_a_deadline_plan_that_still_misses_is_cut_to_its_answering_step(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the deadline in the prompt the (scripted) Conductor still chains slow w1 into w0. At
    5 s that chain cannot finish: the plan becomes w0 alone (its last step) before anything
    runs, and says so. A chain ending on the slow worker is kept (the executor enforces the
    deadline), and so is every chain with ``deadline_trim`` off."""
    from rl_conductor.policies.conductor import FALLBACK_INSTRUCTION

    ends_fast = _plan_text([1, 0])
    script = Script(lambda prompt, call: ends_fast if "Deadline:" in prompt else _plan_text([1]))
    monkeypatch.setattr(policy, "_generate", script)
    view = _timed_pool().view()
    plan = await policy.plan(_task(), view, RequestLimits(max_latency_s=5))
    assert plan.workflow.steps == (Step(0, FALLBACK_INSTRUCTION, ()),)
    assert plan.text == ends_fast  # what the Conductor wrote stays on record
    assert len(plan.notes) == 2 and "cut to its last step's worker alone" in plan.notes[1]
    episode = await policy.run(_task(), view, RequestLimits(max_latency_s=5))
    assert [s.status for s in episode.trace.steps] == ["ok"] and episode.trace.notes[:2] == list(plan.notes)
    ends_slow = _plan_text([0, 1])
    monkeypatch.setattr(
        policy, "_generate", Script(lambda p, c: ends_slow if "Deadline:" in p else _plan_text([1]))
    )
    assert (await policy.plan(_task(), view, RequestLimits(max_latency_s=5))).workflow.workers() == [0, 1]
    monkeypatch.setattr(policy, "_generate", script)
    monkeypatch.setattr(policy, "deadline_trim", False)
    assert (await policy.plan(_task(), view, RequestLimits(max_latency_s=5))).workflow.workers() == [1, 0]


async def test_a_chain_that_misses_is_cut_to_its_answering_step_before_any_replanning(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unconstrained plan chains slow w1 into fast w0: at 5 s it is cut to w0 alone with no
    second generation (the Conductor's own choice of answerer stands). Ending on w1, which
    misses alone too, it is planned again with the deadline in the prompt."""
    from rl_conductor.policies.conductor import FALLBACK_INSTRUCTION

    script = Script(lambda prompt, call: _plan_text([0]) if "Deadline:" in prompt else _plan_text([1, 0]))
    monkeypatch.setattr(policy, "_generate", script)
    view = _timed_pool().view()
    plan = await policy.plan(_task(), view, RequestLimits(max_latency_s=5))
    assert plan.workflow.steps == (Step(0, FALLBACK_INSTRUCTION, ()),) and len(script.calls) == 1
    assert "misses 5 s" in plan.notes[0] and "cut to its last step's worker alone" in plan.notes[1]
    # the deadline shortened the workflow, before it ran: the trace and deadline_cut say so
    from rl_conductor.reward import deadline_shortened, deadline_stopped

    episode = await policy.run(_task(), view, RequestLimits(max_latency_s=5))
    assert plan.deadline_cut and episode.trace.plan_cut
    assert deadline_shortened(episode.trace) and not deadline_stopped(episode.trace)
    with pytest.raises(ValueError, match="deadline_quantile"):
        ConductorPolicy(policy.model_dir, deadline_quantile=1.0)
    assert (await policy.plan(_task(), view, RequestLimits(max_latency_s=60))).workflow.workers() == [1, 0]
    script = Script(lambda prompt, call: _plan_text([0]) if "Deadline:" in prompt else _plan_text([0, 1]))
    monkeypatch.setattr(policy, "_generate", script)
    assert (await policy.plan(_task(), view, RequestLimits(max_latency_s=5))).workflow.workers() == [0]
    assert len(script.calls) == 2  # w1 alone misses 5 s too: planned again
    # a private request whose answering worker is external is planned again, not cut
    ext = Pool(
        name="mixed",
        workers=[
            FakeWorker(info=dc(view.worker(0).info, hosting="external"), answer="a"),
            FakeWorker(info=dc(view.worker(1).info, hosting="self"), answer="b"),
        ],
    ).view()
    script = Script(lambda prompt, call: _plan_text([1]) if "Deadline:" in prompt else _plan_text([1, 0]))
    monkeypatch.setattr(policy, "_generate", script)
    await policy.plan(_task(), ext, RequestLimits(max_latency_s=5, sensitivity="private"))
    assert len(script.calls) == 2


def dc(info: Any, **kw: Any) -> Any:
    from dataclasses import replace as dc_replace

    return dc_replace(info, **kw)


def test_two_conductors_of_one_folder_name_are_told_apart(micro: Micro, tmp_path: Path) -> None:
    """``conductor:runs/a/final`` and ``conductor:runs/b/final`` are both named ``conductor:final``:
    side by side in ``eval`` / ``compare`` (their table, JSON and plot) they are named by their
    spec, and a policy of its own name keeps it."""
    import shutil

    from rl_conductor.evaluation.suite import run_eval

    specs = []
    for run in ("a", "b"):
        shutil.copytree(micro.final_dir, tmp_path / run / "final")
        specs.append(f"conductor:{tmp_path / run / 'final'}")
    rows = run_eval([*specs, "single:gpt-5"], pool="paper-sim", dataset=None, split="test", limit=2, seed=0,
                    progress=False)  # fmt: skip
    assert [r["policy"] for r in rows] == [*specs, "single:gpt-5"]


async def test_a_trained_fallback_worker_answers_an_unparseable_plan_where_the_request_permits_it(
    policy: ConductorPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """conductor.json's ``fallback_worker`` (the best single worker on the training questions)
    replaces the priciest worker as the fallback, within the request's limits only: on gsm8k-six
    the priciest is a ~$1 verifier that no warm-start target chose."""
    monkeypatch.setattr(policy, "_generate", Script(lambda prompt, call: GARBAGE))
    monkeypatch.setitem(policy.meta, "fallback_worker", "w0")
    pool = _pool(("self", "external", "self", "external"))
    ep = await policy.run(_task(), pool.view(), RequestLimits())
    assert ep.plan.fallback and [s.worker for s in ep.trace.steps] == ["w0"]
    assert fallback_workflow(pool.view(), RequestLimits(), "w0").workers() == [0]
    # not permitted (external under a private request; not on the allow-list): the rule as before
    monkeypatch.setitem(policy.meta, "fallback_worker", "w1")
    ep = await policy.run(_task(), pool.view(), RequestLimits(sensitivity="private"))
    assert [s.worker for s in ep.trace.steps] == ["w2"]
    only_w3 = RequestLimits(allowed_workers=frozenset({"w3"}))
    assert fallback_workflow(pool.view(), only_w3, "w1").workers() == [3]
    assert fallback_workflow(pool.view(), RequestLimits(), "gone").workers() == [
        3
    ]  # not in this pool: priciest
