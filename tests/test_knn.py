"""The kNN router baseline: labels (cheapest correct worker), routing by real MiniLM embeddings
under the request's view and limits, save/load, and the cached ``knn:N`` spec on paper-sim.

Labelling runs on scripted fake workers that are right or wrong per task; routing uses the real
offline all-MiniLM-L6-v2 embeddings, so "nearest" means what it means in evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rl_conductor.policies import make_policy
from rl_conductor.policies.knn import SOLVE, KnnRouter, label_tasks
from rl_conductor.policies.knn_embed import EMBED_DIM, embed
from rl_conductor.tasks.base import Task
from rl_conductor.trace import Limits
from rl_conductor.workers.base import CallContext, Hosting, Message
from rl_conductor.workers.fake import FakeWorker, fake_info
from rl_conductor.workers.pool import Pool, load_pool

torch.set_num_threads(1)  # two threads on the shared 2-core machine are far slower under load


def _task(i: int) -> Task:
    return Task(
        id=f"t/{i}",
        question=f"What is {i} + {i}?",
        answer=str(2 * i),
        domain="math",
        source="t",
        grader="math",
    )


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


async def test_label_tasks_picks_the_cheapest_correct_worker() -> None:
    # listed dearest first, so the label cannot come from the pool's order
    pool = Pool(
        name="fake",
        workers=[
            _worker("dear", 50.0, {"t/0", "t/1", "t/2"}),
            _worker("mid", 5.0, {"t/0", "t/1"}),
            _worker("cheap", 1.0, {"t/0"}),
        ],
    )
    tasks = [_task(i) for i in range(4)]
    labels, counts = await label_tasks(pool, tasks)
    assert labels == ["cheap", "mid", "dear", None]  # t/3: nobody was right
    assert counts == {"dear": 3, "mid": 2, "cheap": 1}
    for w in pool.workers:  # every worker answered every task alone, once
        assert isinstance(w, FakeWorker) and len(w.calls) == len(tasks)
        assert all(SOLVE in str(c["messages"]) for c in w.calls)


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


@pytest.fixture(scope="module")
def router() -> KnnRouter:
    """Math questions labelled "mathw", code questions "coder"; prior: coder, then local."""
    emb = embed(MATH + CODE)
    labels: list[str | None] = ["mathw"] * len(MATH) + ["coder"] * len(CODE)
    return KnnRouter(emb, labels, prior=["coder", "local", "mathw"], k=3)


def _routing_pool() -> Pool:
    return Pool(
        name="route",
        workers=[
            _worker("coder", 10.0, set()),
            _worker("mathw", 5.0, set()),
            _worker("local", 0.5, set(), hosting="self"),
        ],
    )


def test_routes_to_the_label_of_the_nearest_questions(router: KnnRouter) -> None:
    pool = _routing_pool()
    view = pool.view()
    assert router.route("Differentiate sin(x) * x^2.", view, Limits()) == 1
    assert router.route("Write a Python function that sorts a dictionary by value.", view, Limits()) == 0
    # ids are the view's ordinals, not the pool's
    reordered = pool.view([2, 1, 0])
    assert router.route("Differentiate sin(x) * x^2.", reordered, Limits()) == 1
    assert router.route("Write a Python function that sorts a dictionary by value.", reordered, Limits()) == 2


async def test_routing_respects_the_view_and_the_request(router: KnnRouter) -> None:
    pool = _routing_pool()
    question = "Differentiate sin(x) * x^2."
    # private: the neighbours' workers are external, so the best self-hosted one by prior
    assert router.route(question, pool.view(), Limits(sensitivity="private")) == 2
    # the neighbours' worker is not allowed: the first allowed worker of the prior
    assert router.route(question, pool.view(), Limits(allowed_workers=frozenset({"coder", "local"}))) == 0
    # the neighbours' worker is not in the view at all
    assert router.route(question, pool.view([2, 0]), Limits()) == 1  # "coder" leads the prior
    plan = await router.plan(_task(1), pool.view(), Limits(sensitivity="private"))
    assert plan.workflow.workers() == [2] and not plan.fallback
    episode = await router.run(
        Task(id="m", question=question, answer="0", domain="math", source="t", grader="math"),
        pool.view(),
        Limits(sensitivity="private"),
    )
    assert [s.worker for s in episode.trace.steps] == ["local"]


def test_save_load_round_trip(router: KnnRouter, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "index"
    router.save(path)
    assert path.with_suffix(".npy").is_file() and path.with_suffix(".json").is_file()
    loaded = KnnRouter.load(path)
    assert np.array_equal(loaded.embeddings, router.embeddings)
    assert (loaded.labels, loaded.prior, loaded.k) == (router.labels, router.prior, router.k)
    view = _routing_pool().view()
    for q in ("Differentiate sin(x) * x^2.", "Write a Python function that sorts a dictionary by value."):
        assert loaded.route(q, view, Limits()) == router.route(q, view, Limits())
    assert isinstance(make_policy(f"knn:{path}", _routing_pool()), KnnRouter)


def test_knn_spec_fits_on_paper_sim_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    pool = load_pool("paper-sim")
    first = make_policy("knn:40", pool)
    assert isinstance(first, KnnRouter)
    assert first.embeddings.shape == (40, EMBED_DIM)
    assert len(first.labels) == 40
    assert {lab for lab in first.labels if lab is not None} <= set(pool.names())
    assert any(lab is not None for lab in first.labels)
    assert sorted(first.prior) == sorted(pool.names())
    cached = sorted(p.name for p in (tmp_path / ".conductor" / "knn").iterdir())
    assert cached == ["paper-sim-paper-mix-seed0-n40.json", "paper-sim-paper-mix-seed0-n40.npy"]

    def no_refit(*args: Any, **kwargs: Any) -> KnnRouter:
        raise AssertionError("the cached index should have been loaded")

    monkeypatch.setattr(KnnRouter, "fit", classmethod(no_refit))
    second = make_policy("knn:40", pool)
    assert isinstance(second, KnnRouter)
    assert second.labels == first.labels and np.array_equal(second.embeddings, first.embeddings)
