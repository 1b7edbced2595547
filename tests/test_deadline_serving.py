"""A request's deadline (``max_latency_s``) through the real predictor process: KServe v1, v2 and
the OpenAI-compatible body all accept it, the executor shortens the workflow to fit it, and the
response says so (``deadline_cut`` plus the steps' ``skipped_deadline`` status).

The pool is two fake workers that each take 1 s and state that latency model (``ttft_s``,
``tokens_per_s``), planned as a fixed chain ``fixed:0,1``: without a deadline both steps run
(2 s); with 1.5 s the second step cannot answer in the 0.5 s left and is skipped before it is
called, so the answer is the first worker's. The wall-time check allows a stated margin of
:data:`MARGIN_S` for the HTTP round trip and process scheduling on a loaded machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from predictor import Predictor, predictor, write_pool

#: Seconds the server's measured wall time may exceed the deadline (scheduling, not workers).
MARGIN_S = 0.5
SLOW = [
    {
        "name": "slow-a",
        "kind": "fake",
        "hosting": "self",
        "price_in": 0.1,
        "price_out": 0.2,
        "answer": "A: 42",
        "latency_s": 1.0,
        "ttft_s": 0.9,
        "tokens_per_s": 1000.0,
    },
    {
        "name": "slow-b",
        "kind": "fake",
        "hosting": "self",
        "price_in": 0.1,
        "price_out": 0.2,
        "answer": "B: 42",
        "latency_s": 1.0,
        "ttft_s": 0.9,
        "tokens_per_s": 1000.0,
    },
]


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("deadline-predictor")
    pool = write_pool(root / "pool.yaml", workers=SLOW)
    srv: Predictor
    with (
        predictor(["--policy", "fixed:0,1", "--pool", str(pool)], root) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        yield client


def _v1(http: httpx.Client, instance: dict[str, Any]) -> dict[str, Any]:
    resp = http.post("/v1/models/conductor:predict", json={"instances": [instance]})
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["predictions"][0])


def test_without_a_deadline_the_whole_chain_runs(http: httpx.Client) -> None:
    doc = _v1(http, {"question": "What is 6*7?"})
    assert [s["status"] for s in doc["steps"]] == ["ok", "ok"]
    assert doc["deadline_cut"] is False and doc["answer"] == "B: 42"
    assert doc["wall_s"] >= 2.0  # two 1 s workers in a row: the deadline below must cut


def test_a_deadline_cuts_the_chain_answers_in_time_and_says_so(http: httpx.Client) -> None:
    doc = _v1(http, {"question": "What is 6*7?", "max_latency_s": 1.5})
    assert [s["status"] for s in doc["steps"]] == ["ok", "skipped_deadline"]
    assert [a["worker"] for s in doc["steps"] for a in s["attempts"]] == ["slow-a"]  # b never called
    assert doc["deadline_cut"] is True and doc["answer"] == "A: 42"
    assert "deadline" in doc["message"] and "deadline" in doc["steps"][1]["note"]
    assert doc["latency_s"] <= 1.5
    assert doc["wall_s"] <= 1.5 + MARGIN_S


def test_an_ample_deadline_changes_nothing(http: httpx.Client) -> None:
    doc = _v1(http, {"question": "What is 6*7?", "max_latency_s": 30})
    assert [s["status"] for s in doc["steps"]] == ["ok", "ok"] and doc["deadline_cut"] is False


def test_v2_parameters_and_the_openai_body_carry_the_deadline(http: httpx.Client) -> None:
    body = {
        "inputs": [{"name": "question", "shape": [1], "datatype": "BYTES", "data": ["What is 6*7?"]}],
        "parameters": {"max_latency_s": 1.5},
    }
    resp = http.post("/v2/models/conductor/infer", json=body)
    assert resp.status_code == 200, resp.text
    outputs = {o["name"]: o for o in resp.json()["outputs"]}
    (doc,) = [json.loads(d) for d in outputs["response"]["data"]]
    assert doc["deadline_cut"] is True and outputs["answer"]["data"] == ["A: 42"]

    chat = {
        "model": "conductor",
        "messages": [{"role": "user", "content": "What is 6*7?"}],
        "max_latency_s": 1.5,
    }
    resp = http.post("/openai/v1/chat/completions", json=chat)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["choices"][0]["message"]["content"] == "A: 42"
    assert out["conductor"]["deadline_cut"] is True
    assert [s["status"] for s in out["conductor"]["steps"]] == ["ok", "skipped_deadline"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"instances": [{"question": "q", "max_latency_s": -1}]}',
        b'{"instances": [{"question": "q", "max_latency_s": 0}]}',
        b'{"instances": [{"question": "q", "max_latency_s": "soon"}]}',
        b'{"instances": [{"question": "q", "max_latency_s": true}]}',
        b'{"instances": [{"question": "q", "max_latency_s": 1e9}]}',
        b'{"instances": [{"question": "q", "max_latency_s": NaN}]}',
    ],
)
def test_bad_deadlines_get_400_naming_the_field(http: httpx.Client, body: bytes) -> None:
    resp = http.post(
        "/v1/models/conductor:predict", content=body, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400, resp.text
    assert "max_latency_s" in resp.text or "JSON" in resp.text


def test_the_request_model_validates_the_deadline_for_the_pyfunc_path(tmp_path: Path) -> None:
    from rl_conductor.serving.request import RequestError, parse_request, request_limits

    req = parse_request({"question": "q", "max_latency_s": 5})
    assert request_limits(req).max_latency_s == 5.0
    for bad in (-1, 0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(RequestError, match="max_latency_s"):
            parse_request({"question": "q", "max_latency_s": bad})
