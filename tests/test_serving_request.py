"""Request validation shared by every front door, and the MLflow pyfunc's answers (through the
KServe predictor's service) from the session's micro Conductor on the paper-sim pool, with the
request's privacy rule and budget enforced whatever the Conductor planned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from _lazy import lazy
from _tiny import Micro
from rl_conductor.serving.request import ConductorRequest, RequestError, parse_request
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.workers.pool import load_pool

# imported by the first test that uses it (tests/_lazy.py): it imports MLflow, seconds of CPU
pyfunc = lazy("rl_conductor.serving.pyfunc")


@pytest.fixture(scope="module")
def questions() -> list[str]:
    return [t.question for t in load_tasks("paper-mix", split="test", limit=4, seed=7)]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({}, "question"),
        ({"question": ""}, "question"),
        ({"question": "2+2?", "sensitivity": "secret"}, "sensitivity"),
        ({"question": "2+2?", "max_cost_usd": -0.01}, "max_cost_usd"),
        ({"question": "2+2?", "max_cost_usd": 0}, "max_cost_usd"),
        ({"question": "2+2?", "max_cost_usd": "lots"}, "max_cost_usd"),
        ({"question": "2+2?", "max_steps": 0}, "max_steps"),
        ({"question": "2+2?", "temperature": 0.3}, "temperature"),
        ({"question": "2+2?", "allowed_workers": "gpt-5"}, "allowed_workers"),
        # finding 2: these read as "no budget", an infinite one, and $1
        ({"question": "2+2?", "max_cost_usd": float("nan")}, "max_cost_usd"),
        ({"question": "2+2?", "max_cost_usd": float("inf")}, "max_cost_usd"),
        ({"question": "2+2?", "max_cost_usd": "inf"}, "max_cost_usd"),
        ({"question": "2+2?", "max_cost_usd": "NaN"}, "max_cost_usd"),
        ({"question": "2+2?", "max_cost_usd": True}, "max_cost_usd"),
        ({"question": "2+2?", "max_cost_usd": "0.01"}, "max_cost_usd"),
        ({"question": " \n\t "}, "question"),
        # finding 7: a request cannot name a pool (path or name)
        ({"question": "2+2?", "pool": "../../../../tmp/evil"}, "pool"),
        ({"question": "2+2?", "pool": "/tmp/evil.yaml"}, "pool"),
        ({"question": "2+2?", "pool": "paper-sim"}, "pool"),
        ({"question": "2+2?", "pool": None}, "pool"),
    ],
)
def test_parse_request_names_the_bad_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_request(raw)
    assert str(info.value).startswith(field) or f"{field}:" in str(info.value)


def test_parse_request_accepts_strings_and_drops_missing_values() -> None:
    assert parse_request("What is 2+2?") == ConductorRequest(question="What is 2+2?")
    req = parse_request({"question": "q", "max_cost_usd": None, "sensitivity": "private"})
    assert req.max_cost_usd is None and req.sensitivity == "private"
    assert parse_request({"question": "q", "max_cost_usd": 1}).max_cost_usd == 1.0
    with pytest.raises(RequestError, match="object"):
        parse_request(["q"])


def test_answer_batch_returns_answer_workflow_steps_and_cost(micro: Micro, questions: list[str]) -> None:
    out = pyfunc.answer_batch(micro.final_dir, questions[:3])
    assert len(out) == 3
    names = set(load_pool("paper-sim").names())
    for res in out:
        assert {"answer", "workflow", "steps", "cost_usd", "tokens", "fallback_plan", "raw_plan"} <= set(res)
        assert res["workflow"] and all(w["worker"] in names | {"conductor"} for w in res["workflow"])
        assert len(res["steps"]) == len(res["workflow"])
        # "" = no worker was called for that step (skipped)
        assert all(s["worker"] in names | {"conductor", ""} for s in res["steps"])
        assert res["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in res["steps"]))
        attempts = [a for s in res["steps"] for a in s["attempts"]]
        assert res["workers_called"] == [a["worker"] for a in attempts]
        assert res["cost_usd"] == pytest.approx(sum(a["cost_usd"] for a in attempts))
        if any(s["status"] == "ok" for s in res["steps"]):
            assert res["answer"] and res["cost_usd"] > 0 and res["tokens"] > 0


def test_a_request_states_its_rounds_and_the_response_shows_them(
    micro: Micro, questions: list[str], tmp_path: Path
) -> None:
    """max_rounds 1 (the micro model's conductor.json default) records no rounds; max_rounds 2 to a
    model trained for two rounds (the micro model's folder with ``max_rounds: 2`` in its
    conductor.json) records the plan and the review (the micro model's review rarely parses: it
    keeps then), and a later round's steps are in the workflow and the steps alike. The micro
    model itself, trained to plan once, does not review whatever the request allows."""
    import json
    import shutil

    reviewer = tmp_path / "two-rounds"
    shutil.copytree(micro.final_dir, reviewer)
    meta = json.loads((reviewer / "conductor.json").read_text())
    (reviewer / "conductor.json").write_text(json.dumps({**meta, "max_rounds": 2}))
    q = questions[0]
    assert [
        r["rounds"] for r in pyfunc.answer_batch(micro.final_dir, [q, {"question": q, "max_rounds": 2}])
    ] == [
        [],
        [],
    ]
    one, two, own = pyfunc.answer_batch(
        reviewer, [{"question": q, "max_rounds": 1}, {"question": q, "max_rounds": 2}, q]
    )
    assert one["rounds"] == []
    assert [r["index"] for r in own["rounds"]] == [1, 2]  # a request that states none: the model's 2
    first, review = two["rounds"]
    assert first["decision"] == "plan" and first["steps"] == list(range(len(first["steps"])))
    assert review["decision"] in ("keep", "continue", "stop") and review["index"] == 2
    assert len(two["workflow"]) == len(two["steps"]) == len(first["steps"]) + len(review["steps"])
    assert sum(r["cost_usd"] for r in two["rounds"]) == pytest.approx(two["cost_usd"])
    with pytest.raises(RequestError, match="max_rounds"):
        pyfunc.answer_batch(micro.final_dir, [{"question": questions[0], "max_rounds": 0}])


def test_private_requests_only_reach_self_hosted_workers(micro: Micro, questions: list[str]) -> None:
    pool = load_pool("paper-sim")
    hosting = {w.info.name: w.info.hosting for w in pool.workers}
    out = pyfunc.answer_batch(micro.final_dir, [{"question": q, "sensitivity": "private"} for q in questions])
    ran = [s for res in out for s in res["steps"] if s["status"] == "ok"]
    assert ran, "no step ran at all"
    assert all(hosting[s["worker"]] == "self" for s in ran)
    # finding 5: no step, attempt or audit entry names an external worker
    assert all(hosting[w] == "self" for res in out for w in res["workers_called"])
    assert all(hosting[s["worker"]] == "self" for res in out for s in res["steps"] if s["worker"])
    assert all(
        hosting[w["worker"]] == "self" for res in out for w in res["workflow"] if w["worker"] in hosting
    )


def test_allowed_workers_are_honoured_and_unknown_ones_rejected(micro: Micro, questions: list[str]) -> None:
    out = pyfunc.answer_batch(
        micro.final_dir, [{"question": q, "allowed_workers": ["gemma-3-27b-it"]} for q in questions[:2]]
    )
    assert {s["worker"] for res in out for s in res["steps"] if s["status"] == "ok"} == {"gemma-3-27b-it"}
    with pytest.raises(RequestError, match="allowed_workers"):
        pyfunc.answer_batch(micro.final_dir, [{"question": "q", "allowed_workers": ["gpt-17"]}])
    with pytest.raises(RequestError, match="no worker"):
        pyfunc.answer_batch(
            micro.final_dir, [{"question": "q", "allowed_workers": ["gpt-5"], "sensitivity": "private"}]
        )


@pytest.mark.parametrize("budget", [1e-5, 2e-4, 3e-3])
def test_a_budget_is_never_exceeded(micro: Micro, questions: list[str], budget: float) -> None:
    out = pyfunc.answer_batch(micro.final_dir, [{"question": q, "max_cost_usd": budget} for q in questions])
    for res in out:
        assert res["cost_usd"] <= budget
    if budget == 1e-5:  # too small for any call: the service's budget floor, nothing is spent
        assert all(res["cost_usd"] == 0.0 for res in out)
        assert all(res["budget_stop"] and res["stopped_reason"] == "budget" for res in out)


def test_the_operator_picks_the_pool(micro: Micro, questions: list[str], tmp_path: Path) -> None:
    """Finding 7: the pool comes from the operator (or the model), never from the request."""
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: evil\nworkers:\n  - {name: spy, kind: fake, hosting: self}\n")
    with pytest.raises(RequestError, match="cannot choose the worker pool"):
        pyfunc.answer_batch(micro.final_dir, [{"question": questions[0], "pool": str(evil)}])
    (res,) = pyfunc.answer_batch(micro.final_dir, [questions[0]], pool=str(evil))
    assert res["workers_called"] and set(res["workers_called"]) == {"spy"}


@pytest.mark.parametrize(
    "field",
    [
        {"max_cost_usd": 1e303},
        {"max_cost_usd": 10**400},
        {"max_latency_s": 1e308},
        {"max_steps": True},
        {"max_steps": "3"},
        {"question": "\u200b"},
        {"question": "\x00 \u2060"},
    ],
)
def test_absurd_or_disguised_values_are_request_errors(field: dict) -> None:
    from rl_conductor.serving.request import RequestError, parse_request

    with pytest.raises(RequestError):
        parse_request({"question": "What is 2 + 2?", **field})


def test_huge_limits_are_invalid_values_not_overflows() -> None:
    from rl_conductor.limits import MAX_SECONDS, MAX_USD, RequestLimits
    from rl_conductor.validation import InvalidValue

    for kwargs in ({"max_cost_usd": 1e303}, {"max_latency_s": 1e308}, {"step_timeout_s": 1e300}):
        with pytest.raises(InvalidValue):
            RequestLimits(**kwargs)
    assert RequestLimits(max_cost_usd=MAX_USD, max_latency_s=MAX_SECONDS).max_cost_usd == MAX_USD
    for kwargs in ({"max_cost_usd": MAX_USD * 1.5}, {"max_latency_s": MAX_SECONDS * 1.5}):
        with pytest.raises(InvalidValue):  # the request caps: one set for every RequestLimits
            RequestLimits(**kwargs)


def test_pyfunc_dataframe_rows_nan_means_absent_and_an_all_nan_budget_is_an_error() -> None:
    import pandas as pd

    from rl_conductor.serving.pyfunc import as_records
    from rl_conductor.serving.request import RequestError, parse_request

    # dataframe_records where only some rows set a field: those columns turn float with NaN
    frame = pd.DataFrame.from_records(
        [{"question": "a", "max_steps": 3}, {"question": "b", "max_cost_usd": 0.01}, {"question": "c"}]
    )
    requests = [parse_request(r) for r in as_records(frame)]
    assert [r.max_steps for r in requests] == [3, 5, 5]
    assert [r.max_cost_usd for r in requests] == [None, 0.01, None]
    for bad in (float("nan"), float("inf")):  # sent as NaN/inf: never "no budget"
        (row,) = as_records(pd.DataFrame.from_records([{"question": "q", "max_cost_usd": bad}]))
        with pytest.raises(RequestError, match="max_cost_usd"):
            parse_request(row)


def test_the_request_caps_are_one_definition_for_http_pyfunc_and_the_library() -> None:
    """Every cap is :mod:`rl_conductor.limits`'s: the request model (HTTP and pyfunc) and every
    ``RequestLimits`` accept a value at the cap and refuse one above it, counts included."""
    from rl_conductor import limits
    from rl_conductor.limits import RequestLimits
    from rl_conductor.serving.request import RequestError, parse_request
    from rl_conductor.validation import InvalidValue

    caps = {
        "max_cost_usd": limits.MAX_USD,
        "max_latency_s": limits.MAX_SECONDS,
        "max_steps": limits.MAX_STEPS,
        "max_rounds": limits.MAX_ROUNDS,
        "max_calls": limits.MAX_CALLS,
    }
    for field, cap in caps.items():
        assert getattr(parse_request({"question": "q", field: cap}), field) == cap
        assert getattr(RequestLimits(**{field: cap}), field) == cap
        over = cap * 1.5 if isinstance(cap, float) else cap + 1
        with pytest.raises(RequestError, match=field):
            parse_request({"question": "q", field: over})
        with pytest.raises(InvalidValue, match=field):
            RequestLimits(**{field: over})
    assert parse_request({"question": "q"}).max_steps == RequestLimits().max_steps == limits.DEFAULT_MAX_STEPS


def test_the_pyfunc_takes_a_batch_by_kserves_rules(tmp_path: Path) -> None:
    """A batch through ``mlflow.pyfunc`` obeys what KServe's v1/v2 endpoints enforce, before any
    model loads: the request cap bounds the budgets of the whole batch, at most 64 questions, an
    error names the input. Before, the pyfunc answered two $6,000 questions KServe refused."""
    from rl_conductor.serving.schemas import WireError, parse_v1

    missing = str(tmp_path / "no-model")  # never loaded: validation comes first
    rich = [{"question": "a", "max_cost_usd": 6000}, {"question": "b", "max_cost_usd": 6000}]
    with pytest.raises(RequestError, match="add up to 12000 USD"):
        pyfunc.answer_batch(missing, rich)
    with pytest.raises(WireError, match="add up to 12000 USD"):
        parse_v1({"instances": rich})
    with pytest.raises(RequestError, match="at most 64 questions"):
        pyfunc.answer_batch(missing, ["q"] * 65)
    with pytest.raises(RequestError, match=r"inputs\.1: question"):
        pyfunc.answer_batch(missing, ["fine", " \n\t "])
    with pytest.raises(RequestError, match="at least one question"):  # KServe answers 400 too
        pyfunc.answer_batch(missing, [])


def test_a_dataframe_keeps_the_integer_fields_of_rows_that_leave_them_out() -> None:
    """A DataFrame column that some rows leave out holds floats (2 -> 2.0): every integer field of
    a request comes back an integer, not only max_steps (max_rounds 2.0 was refused)."""
    import pandas as pd

    frame = pd.DataFrame(
        [{"question": "a", "max_rounds": 2, "max_calls": 3, "max_steps": 4}, {"question": "b"}]
    )
    first, second = pyfunc.as_records(frame)
    assert first == {"question": "a", "max_rounds": 2, "max_calls": 3, "max_steps": 4}
    assert all(type(first[k]) is int for k in ("max_rounds", "max_calls", "max_steps"))
    assert second == {"question": "b"}
    assert parse_request(first).max_rounds == 2


@pytest.mark.parametrize("value", [0, -1, 1e9, float("inf")])
def test_a_capped_amount_is_refused_with_one_message_at_every_front_door(value: float) -> None:
    """The request model and the wire schemas (v1 instances, OpenAI bodies) check the caps with
    one function, so the same bad budget gets the same reason wherever it comes in."""
    from rl_conductor.serving import schemas

    reasons = []
    for parse in (
        lambda: parse_request({"question": "q", "max_cost_usd": value}),
        lambda: schemas.parse_v1({"instances": [{"question": "q", "max_cost_usd": value}]}),
        lambda: schemas.parse_chat(
            {"model": "conductor", "messages": [{"role": "user", "content": "q"}], "max_cost_usd": value}
        ),
    ):
        with pytest.raises(ValueError) as err:
            parse()
        reasons.append(str(err.value))
    for reason in reasons:
        assert "max_cost_usd" in reason and "must be a finite number of USD > 0 and <= 10000" in reason


def test_a_service_config_the_request_caps_would_refuse_fails_when_built() -> None:
    """A per-call timeout above the request cap (every request's step_timeout_s) is refused when
    the service is configured, in the pyfunc as in the KServe server, not on every request."""
    from rl_conductor.limits import MAX_SECONDS
    from rl_conductor.serving.service import ServiceConfig
    from rl_conductor.validation import InvalidValue

    assert ServiceConfig(step_timeout_s=MAX_SECONDS).step_timeout_s == MAX_SECONDS
    for bad in ({"step_timeout_s": MAX_SECONDS * 2}, {"max_rounds": 0}, {"max_batch": 0}):
        with pytest.raises(InvalidValue):
            ServiceConfig(**bad)
