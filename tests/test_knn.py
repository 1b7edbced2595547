"""The routers fitted on the training split: single-worker measurements, the kNN router's choice
on a hand-built neighbour set (expected reward, budgets, permissions, view ordinals), the same
router over real MiniLM embeddings, the domain router, and the cached ``knn:N`` /
``domain-router:N`` specs on paper-sim.

Measurements run on scripted fake workers that are right or wrong per task; the hand-built
neighbour set fixes embeddings, correctness and costs, so each expected choice can be worked
out by hand from the reward preset.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from _pools import fake_pool
from rl_conductor.errors import InvalidSpec
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.catalog import make_policy
from rl_conductor.policies.knn import SOLVE, KnnRouter
from rl_conductor.policies.knn_embed import EMBED_DIM, embed
from rl_conductor.policies.routers import DomainRouter, SingleOutcomes, measure_singles, reward_matrix
from rl_conductor.reward import REWARD_PRESETS
from rl_conductor.tasks.base import Task
from rl_conductor.workers.base import CallContext, Hosting, Message
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool, load_pool
from test_warmstart import _task  # 't/i': 'What is i + i?'


def _right_on(ids: set[str]) -> Any:
    def respond(messages: Sequence[Message], context: CallContext | None) -> str:
        assert context is not None
        ok = context.task.id in ids
        return f"\\boxed{{{context.task.answer if ok else 'no idea'}}}"

    return respond


def _worker(name: str, price: float, right: set[str], hosting: Hosting = "external") -> FakeWorker:
    return FakeWorker(
        info=fake_info(name, price_in=price, price_out=price, hosting=hosting), responder=_right_on(right)
    )


def _pool() -> Pool:
    """dear (external), cheap (external), local (self-hosted), in that order."""
    return Pool(
        name="route",
        workers=[
            _worker("dear", 10.0, set()),
            _worker("cheap", 0.1, set()),
            _worker("local", 0.2, set(), hosting="self"),
        ],
    )


# ----------------------------------------------------------------------------- measurement


async def test_measure_singles_runs_every_worker_alone_and_grades_it() -> None:
    pool = Pool(
        name="fake",
        workers=[
            _worker("dear", 50.0, {"t/0", "t/1", "t/2"}),
            _worker("mid", 5.0, {"t/0", "t/1"}),
            _worker("cheap", 1.0, {"t/0"}),
        ],
    )
    tasks = [_task(i) for i in range(4)]
    out = await measure_singles(pool, tasks)
    assert out.names == ["dear", "mid", "cheap"] and out.task_ids == [t.id for t in tasks]
    assert out.correct.tolist() == [
        [True, True, True],
        [True, True, False],
        [True, False, False],
        [False, False, False],
    ]
    assert (out.cost > 0).all() and (out.cost[:, 0] > out.cost[:, 1]).all()  # priced by the call
    for w in pool.workers:  # every worker answered every task alone, once
        assert isinstance(w, FakeWorker) and len(w.calls) == len(tasks)
        assert all(SOLVE in str(c["messages"]) for c in w.calls)


async def test_measuring_singles_shows_progress_when_output_is_not_a_terminal(capsys) -> None:
    """Off a terminal (a log, CI, a pod) the measurement prints progress lines: the routers' fit
    ran for minutes with no output (attack 31 F11)."""
    pool = Pool(name="fake", workers=[_worker("dear", 50.0, {"t/0"}), _worker("cheap", 1.0, set())])
    await measure_singles(pool, [_task(i) for i in range(3)])
    assert "measure 2 workers alone: 3/3 (100 %)" in capsys.readouterr().err


# ----------------------------------------------------------------------------- hand-built neighbours


def _unit(*xs: float) -> list[float]:
    v = np.asarray(xs, dtype=np.float64)
    return list(v / np.linalg.norm(v))


#: Three training questions near the query (1, 0, 0), one far away (0, 0, 1).
EMB = np.asarray([_unit(1, 0, 0), _unit(0.9, 0.1, 0), _unit(0.8, 0.2, 0), _unit(0, 0, 1)], dtype=np.float32)
#                     dear   cheap  local
CORRECT = np.array(
    [
        [True, True, True],  # t/0: everybody right
        [True, False, True],  # t/1
        [True, False, False],  # t/2: only dear
        [True, False, True],  # t/3 (far): dear and local
    ]
)
COST = np.array([[0.01, 0.0001, 0.0002]] * 4)  # dear costs 0.03 reward per question (cost-aware)


def _outcomes() -> SingleOutcomes:
    return SingleOutcomes(
        names=["dear", "cheap", "local"],
        task_ids=[f"t/{i}" for i in range(4)],
        domains=["math", "math", "math", "code"],
        correct=CORRECT.copy(),
        cost=COST.copy(),
    )


@pytest.fixture
def hand() -> KnnRouter:
    return KnnRouter(EMB, _outcomes(), k=3)


def test_expected_reward_is_the_similarity_weighted_mean_of_the_neighbours(hand: KnnRouter) -> None:
    q = np.asarray([1.0, 0.0, 0.0])
    expected, cost = hand.expected(q)
    sims = EMB[:3] @ q
    w = sims / sims.sum()
    r = reward_matrix(_outcomes(), REWARD_PRESETS["cost-aware"])[:3]
    assert expected == pytest.approx({"dear": w @ r[:, 0], "cheap": w @ r[:, 1], "local": w @ r[:, 2]})
    assert expected["dear"] == pytest.approx(0.5 + 0.5 - 0.03)  # right on all three, minus its cost term
    assert cost == pytest.approx({"dear": 0.01, "cheap": 0.0001, "local": 0.0002})


def test_knn_picks_the_best_permitted_affordable_worker(hand: KnnRouter) -> None:
    view = _pool().view()
    q = np.asarray([1.0, 0.0, 0.0])
    # dear is right on all three neighbours: worth its cost term
    assert hand.route_vector(q, view, RequestLimits()) == 0
    # a budget below dear's cost there: local (right on 2 of 3) beats cheap (1 of 3)
    assert hand.route_vector(q, view, RequestLimits(max_cost_usd=0.005)) == 2
    # a budget nobody fits: the cheapest
    assert hand.route_vector(q, view, RequestLimits(max_cost_usd=0.00001)) == 1
    # private: only the self-hosted worker may see the request
    assert hand.route_vector(q, view, RequestLimits(sensitivity="private")) == 2
    assert hand.route_vector(q, view, RequestLimits(allowed_workers=frozenset({"cheap"}))) == 1
    # ids are the view's ordinals, not the pool's
    assert hand.route_vector(q, _pool().view([2, 1, 0]), RequestLimits()) == 2
    # the neighbours' best worker is not in the view: the next best of the view
    assert hand.route_vector(q, _pool().view([1, 2]), RequestLimits()) == 1


def test_knn_breaks_equal_accuracy_by_cost_and_ignores_dissimilar_questions() -> None:
    view = _pool().view()
    far = np.asarray([0.0, 0.0, 1.0])
    # nearest neighbour t/3: dear and local both right; local's cost term is smaller
    assert KnnRouter(EMB, _outcomes(), k=1).route_vector(far, view, RequestLimits()) == 2
    # with the paper's reward (no cost term) they tie, and the tie goes to the cheaper one
    paper = KnnRouter(EMB, _outcomes(), k=1, reward=REWARD_PRESETS["paper"])
    assert paper.route_vector(far, view, RequestLimits()) == 2
    # k=4 around (1,0,0): t/3 is orthogonal (weight 0), so the choice is that of k=3
    four = KnnRouter(EMB, _outcomes(), k=4)
    e4, _ = four.expected(np.asarray([1.0, 0.0, 0.0]))
    e3, _ = KnnRouter(EMB, _outcomes(), k=3).expected(np.asarray([1.0, 0.0, 0.0]))
    assert e4 == pytest.approx(e3)


def test_knn_validates_its_inputs() -> None:
    with pytest.raises(ValueError, match="embeddings"):
        KnnRouter(EMB[:2], _outcomes())
    with pytest.raises(ValueError, match="k must be"):
        KnnRouter(EMB, _outcomes(), k=0)


def test_save_load_round_trip(hand: KnnRouter, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "index"
    hand.save(path)
    loaded = KnnRouter.load(path)
    assert np.array_equal(loaded.embeddings, hand.embeddings) and loaded.k == hand.k
    assert loaded.reward == hand.reward and loaded.outcomes.names == hand.outcomes.names
    view = _pool().view()
    for q in (np.asarray([1.0, 0, 0]), np.asarray([0, 0, 1.0])):
        for lim in (RequestLimits(), RequestLimits(max_cost_usd=0.005)):
            assert loaded.route_vector(q, view, lim) == hand.route_vector(q, view, lim)
    assert isinstance(make_policy(f"knn:{path}", _pool()), KnnRouter)
    # a saved router's path may hold "=" (not read as k=/n= options); its k names it
    odd = tmp_path / "k=3" / "index"
    KnnRouter(hand.embeddings, hand.outcomes, k=3, reward=hand.reward).save(odd)
    again = make_policy(f"knn:{odd}", _pool())
    assert isinstance(again, KnnRouter) and again.k == 3 and again.name == "knn:k=3"


# ----------------------------------------------------------------------------- real embeddings

MATH = [
    "What is the derivative of x^3 + 2x with respect to x?",
    "Solve for x: 3x + 7 = 22.",
    "Compute the integral of 2x from 0 to 3.",
    "Find all real roots of x^2 - 5x + 6 = 0.",
]
CODE = [
    "Write a Python function that reverses a linked list.",
    "Implement binary search in Python and return the index of the target.",
    "Write a Python class for a stack with push and pop methods.",
    "Write a Python function that parses a CSV file and returns the rows.",
]


async def test_routes_questions_by_their_real_neighbours() -> None:
    # "dear" is right on the code questions only, "local" on the math questions only
    n = len(MATH) + len(CODE)
    correct = np.zeros((n, 3), dtype=bool)
    correct[len(MATH) :, 0] = True
    correct[: len(MATH), 2] = True
    outcomes = SingleOutcomes(
        names=["dear", "cheap", "local"],
        task_ids=[f"q/{i}" for i in range(n)],
        domains=["math"] * len(MATH) + ["code"] * len(CODE),
        correct=correct,
        cost=np.tile([0.01, 0.0001, 0.0002], (n, 1)),
    )
    router = KnnRouter(embed(MATH + CODE), outcomes, k=3)
    view = _pool().view()
    assert router.route("Differentiate sin(x) * x^2.", view, RequestLimits()) == 2
    assert (
        router.route("Write a Python function that sorts a dictionary by value.", view, RequestLimits()) == 0
    )
    task = Task(
        id="m", question="Differentiate sin(x) * x^2.", answer="0", domain="math", source="t", grader="math"
    )
    episodes = await router.run_many([task], view, RequestLimits())
    assert [s.worker for s in episodes[0].trace.steps] == ["local"]


# ----------------------------------------------------------------------------- domain router


async def test_domain_router_sends_each_domain_to_its_best_worker() -> None:
    router = DomainRouter.from_outcomes(_outcomes())
    # math (t/0..t/2): dear right 3/3 (reward 0.97), local 2/3; code (t/3): local right and cheaper
    assert router.table["math"]["dear"] == pytest.approx(0.97)
    view = _pool().view()
    assert router.choose("math", view, RequestLimits()) == 0
    assert router.choose("code", view, RequestLimits()) == 2
    assert router.choose("math", view, RequestLimits(max_cost_usd=0.005)) == 2  # dear does not fit
    assert router.choose("math", view, RequestLimits(sensitivity="private")) == 2
    assert router.choose("math", _pool().view([1, 2]), RequestLimits()) == 1  # local is ordinal 1 there
    assert router.prior == ["dear", "local", "cheap"]  # by mean reward over every domain
    assert router.choose("history", view, RequestLimits()) == 0  # an unseen domain: the prior
    assert router.choose("history", view, RequestLimits(sensitivity="private")) == 2
    plan = await router.plan(_task(0, "code"), view, RequestLimits())
    assert plan.workflow.workers() == [2] and "model_id" in plan.text


# ----------------------------------------------------------------------------- specs on paper-sim


def test_router_specs_fit_on_paper_sim_and_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    pool = load_pool("paper-sim")
    first = make_policy("knn:40", pool)
    assert isinstance(first, KnnRouter)
    assert first.embeddings.shape == (40, EMBED_DIM)
    assert first.outcomes.correct.shape == (40, len(pool))
    assert first.outcomes.names == pool.names() and first.outcomes.correct.any()
    cached = sorted(p.suffix for p in (tmp_path / ".conductor" / "routers").iterdir())
    assert cached == [".json", ".npy", ".npz"]  # outcomes (json + npz) and embeddings

    def no_refit(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the cached measurement should have been loaded")

    monkeypatch.setattr("rl_conductor.policies.routers._run_sync", no_refit)
    monkeypatch.setattr("rl_conductor.policies.knn_embed.embed", no_refit)
    second = make_policy("knn:40", pool)
    assert isinstance(second, KnnRouter)
    assert np.array_equal(second.outcomes.correct, first.outcomes.correct)
    assert np.array_equal(second.embeddings, first.embeddings)
    router = make_policy("domain-router:40", pool)  # the same measurement, no new calls
    assert isinstance(router, DomainRouter) and set(router.prior) == set(pool.names())
    assert set(router.table) <= {"math", "knowledge", "reasoning", "code"}
    with pytest.raises(ValueError, match="number of training tasks"):
        make_policy("domain-router:abc", pool)
    # k= is the neighbourhood, n= the fit size (knn:40 is a fit size): the same measurement
    near = make_policy("knn:k=5,n=40", pool)
    assert isinstance(near, KnnRouter) and near.k == 5 and near.name == "knn:k=5,n=40"
    assert np.array_equal(near.outcomes.correct, first.outcomes.correct) and first.k is None
    assert make_policy("knn:n=40", pool).k is None
    assert "not below" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="rl_conductor.policies.knn"):
        assert make_policy("knn:k=40,n=40", pool).k == 40  # as many as the fit: said, not refused
    assert "k=40 is not below the 40 training questions" in caplog.text
    bad_specs = {"k=0": "whole number >= 1", "k=5,k=6": "given twice", "m=3": "options are k=N, n=N",
                 "k=five": "whole number >= 1", "k=5,40": "options are", "k=²": "whole number"}  # fmt: skip
    for bad, why in bad_specs.items():
        with pytest.raises(InvalidSpec, match=why):
            make_policy(f"knn:{bad}", pool)


def test_a_served_router_keeps_a_bounded_number_of_question_embeddings_and_no_text(
    hand: KnnRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every distinct question routed was kept (its text and its embedding) for the process's
    life; now the most recent QUERY_CACHE_SIZE, keyed by a hash of the question."""
    from rl_conductor.policies import knn as knn_module

    monkeypatch.setattr(
        "rl_conductor.policies.knn_embed.embed", lambda qs: np.tile(np.float32([1, 0, 0]), (len(qs), 1))
    )
    view = _pool().view()
    for i in range(knn_module.QUERY_CACHE_SIZE + 50):
        hand.route(f"private question number {i}", view, RequestLimits())
    assert len(hand._query) == knn_module.QUERY_CACHE_SIZE
    assert not any("question" in key for key in hand._query._items)
    assert hand._query.get("private question number 0") is None  # the oldest went first
    assert hand._query.get(f"private question number {knn_module.QUERY_CACHE_SIZE + 49}") is not None


def test_measuring_alone_in_forked_chunks_gives_the_same_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The routers' measurement of every worker alone, split over two forked processes, is the
    one-process measurement array for array (paper-sim: simulated answers, code graded in the
    sandbox, math through its helper), and live pools are never forked."""
    import asyncio

    from rl_conductor.policies import routers
    from rl_conductor.tasks.datasets import load_tasks

    pool = load_pool("paper-sim", seed=0)
    tasks = [t for t in load_tasks("paper-mix", split="train") if t.domain in ("code", "math")][:48]
    tasks += [t for t in load_tasks("paper-mix", split="train") if t.domain == "knowledge"][:24]
    alone = asyncio.run(measure_singles(pool, tasks, progress=False))
    forked = routers._forked(pool, tasks, 2)
    assert forked.task_ids == alone.task_ids and forked.names == alone.names
    assert np.array_equal(forked.correct, alone.correct) and np.array_equal(forked.cost, alone.cost)
    assert alone.correct.any() and not alone.correct.all()

    calls: list[int] = []
    monkeypatch.setattr(routers, "_forked", lambda p, ts, w: calls.append(w))
    monkeypatch.setattr(routers, "FORK_MIN_TASKS", 0)
    monkeypatch.setenv("RL_CONDUCTOR_TABLE_WORKERS", "2")
    many = [_task(i) for i in range(130)]
    routers._measure(pool, many)
    assert calls == [2]  # an in-memory pool is forked
    fakes = routers._measure(fake_pool(2), many)  # fake workers stand for live ones: in process
    assert calls == [2] and fakes.correct.shape == (130, 2)


def test_knn_k_auto_chooses_the_neighbourhood_that_routes_the_training_questions_best() -> None:
    """Ninety questions of one kind, where worker a is best, and eight of a nearby kind, where b
    is: every training question as a neighbour (the default) sends the eight to a as well; routed
    by the others (leave one out), a small neighbourhood routes both kinds right and is chosen."""
    from rl_conductor.policies.knn import choose_k

    rng = np.random.default_rng(0)
    n_a, n_b = 90, 8
    centre_a, centre_b = np.zeros(EMBED_DIM), np.zeros(EMBED_DIM)
    centre_a[0], centre_b[0], centre_b[1] = 1.0, 0.6, 0.8  # the kinds' cosine similarity: 0.6
    emb = np.vstack(
        [
            centre_a + 0.01 * rng.normal(size=(n_a, EMBED_DIM)),
            centre_b + 0.01 * rng.normal(size=(n_b, EMBED_DIM)),
        ]
    )
    emb = (emb / np.linalg.norm(emb, axis=1, keepdims=True)).astype(np.float32)
    correct = np.zeros((n_a + n_b, 2), dtype=bool)
    correct[:n_a, 0] = True
    correct[n_a:, 1] = True
    outcomes = SingleOutcomes(
        names=["a", "b"],
        task_ids=[f"q{i}" for i in range(n_a + n_b)],
        domains=["x"] * (n_a + n_b),
        correct=correct,
        cost=np.full((n_a + n_b, 2), 1e-5),
    )
    router = KnnRouter(emb, outcomes)
    assert router.k is None
    k = choose_k(router)
    assert k is not None and k <= 10
    assert choose_k(router, grid=(None,)) is None
