"""The KServe predictor as a real server process on loopback: the official ``openai`` client (sync
and streaming), KServe v1 and v2 over plain HTTP, ``/metrics``, privacy and budgets through the
HTTP API, injected worker failures, a fuzz test of bad requests, and the micro Conductor loaded
from the MLflow registry with a trace per request.

The fake-pool server plans a fixed chain (``fixed:2,0``: the external worker first, then a
self-hosted one), so every test knows which workers a request would use if nothing stopped it.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _lazy import lazy
from _tiny import Micro
from predictor import HOSTING, Predictor, predictor, process, write_pool
from servers import free_ports

openai = lazy("openai")  # imported by the first test that uses it (tests/_lazy.py): it takes seconds

JSON_HEADERS = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Predictor]:
    root = tmp_path_factory.mktemp("predictor")
    pool = write_pool(root / "pool.yaml")
    with predictor(["--policy", "fixed:2,0", "--pool", str(pool)], root) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: Predictor) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def metric(http: httpx.Client, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0 when absent)."""
    text = http.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = ",".join(sorted(p for p in (m.group(2) or "").split(",") if p))
        if got == want:
            return float(m.group(3))
    return 0.0


def v1(http: httpx.Client, *instances: Any) -> httpx.Response:
    return http.post("/v1/models/conductor:predict", json={"instances": list(instances)})


# -- the official openai client ----------------------------------------------------------------


def test_openai_sdk_lists_the_model_and_answers_with_usage(server: Predictor) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key="not-needed", max_retries=0)
    assert [m.id for m in client.models.list()] == ["conductor"]
    resp = client.chat.completions.create(
        model="conductor",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 6*7?"}],
        extra_body={"max_cost_usd": 0.05, "max_steps": 2},
    )
    doc = resp.model_extra["conductor"]
    assert resp.choices[0].message.content == doc["answer"] == "A: 42"
    assert [s["worker"] for s in doc["steps"]] == ["cloud-x", "local-a"]
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == sum(s["input_tokens"] for s in doc["steps"])
    assert resp.usage.completion_tokens == sum(s["output_tokens"] for s in doc["steps"])
    assert resp.usage.total_tokens == doc["tokens"]
    assert doc["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in doc["steps"]))
    assert doc["fallback_plan"] is False and doc["budget_stop"] is False and doc["worker_fallback"] is False


def test_openai_sdk_streams_one_chunk_per_step_then_the_answer(server: Predictor) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key="not-needed", max_retries=0)
    stream = client.chat.completions.create(
        model="conductor", messages=[{"role": "user", "content": "What is 6*7?"}], stream=True
    )
    chunks = list(stream)
    steps = [c.model_extra["conductor_step"] for c in chunks if c.model_extra.get("conductor_step")]
    assert [s["worker"] for s in steps] == ["cloud-x", "local-a"]
    assert [s["index"] for s in steps] == [0, 1]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "A: 42"
    final = chunks[-1]
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is not None and final.usage.total_tokens == final.model_extra["conductor"]["tokens"]
    # the steps arrive before the answer
    first_answer = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content)
    last_step = max(i for i, c in enumerate(chunks) if c.model_extra.get("conductor_step"))
    assert last_step < first_answer


def test_openai_sdk_gets_4xx_errors_it_understands(server: Predictor) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key="not-needed", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="max_cost_usd"):
        client.chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": "q"}], extra_body={"max_cost_usd": -1}
        )
    with pytest.raises(openai.BadRequestError, match="unknown workers"):
        client.chat.completions.create(
            model="conductor",
            messages=[{"role": "user", "content": "q"}],
            extra_body={"allowed_workers": ["gpt-9"]},
            stream=True,
        )
    with pytest.raises(openai.NotFoundError, match="not served"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "q"}])


# -- KServe v1 / v2 over plain HTTP ---------------------------------------------------------------


def test_v1_predict_answers_each_instance(http: httpx.Client) -> None:
    resp = v1(http, {"question": "What is 6*7?", "max_cost_usd": 0.05}, "a bare question string")
    assert resp.status_code == 200, resp.text
    preds = resp.json()["predictions"]
    assert len(preds) == 2
    for doc in preds:
        assert doc["answer"] == "A: 42"
        assert [w["worker"] for w in doc["workflow"]] == ["cloud-x", "local-a"]
        assert {"worker", "input_tokens", "output_tokens", "cost_usd", "latency_s", "status"} <= set(
            doc["steps"][0]
        )
        assert doc["tokens"] == doc["input_tokens"] + doc["output_tokens"] > 0
        assert doc["calls"] == 2


def test_v2_infer_takes_a_bytes_tensor_and_parameters(http: httpx.Client) -> None:
    body = {
        "inputs": [
            {"name": "question", "shape": [2], "datatype": "BYTES", "data": ["What is 6*7?", "And 2+2?"]}
        ],
        "parameters": {"sensitivity": "private", "max_steps": 1},
    }
    resp = http.post("/v2/models/conductor/infer", json=body)
    assert resp.status_code == 200, resp.text
    outputs = {o["name"]: o for o in resp.json()["outputs"]}
    assert outputs["answer"]["data"] == ["A: 42", "A: 42"]  # private: ordinal 2 wraps onto local-a
    docs = [json.loads(d) for d in outputs["response"]["data"]]
    assert all(len(d["steps"]) == 1 and HOSTING[d["steps"][0]["worker"]] == "self" for d in docs)
    assert outputs["cost_usd"]["data"] == pytest.approx([d["cost_usd"] for d in docs])


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b'{"instances": [', 400, "JSON"),
        (b"\xff\xfe", 400, "JSON"),
        (b'{"instances": [{"question": "q", "max_cost_usd": NaN}]}', 400, "JSON"),
        (b"[1, 2]", 400, "object"),
        (b'{"instances": []}', 400, "instances"),
        (b'{"instances": [{"question": ""}]}', 400, "question"),
        (b'{"instances": [{"question": " \\n\\t "}]}', 400, "whitespace"),
        (b'{"instances": [{"question": "q", "colour": "red"}]}', 400, "unknown field"),
        (b'{"instances": [{"question": "q", "max_cost_usd": -0.5}]}', 400, "max_cost_usd"),
        (b'{"instances": [{"question": "q", "max_cost_usd": 1e300}]}', 400, "max_cost_usd"),
        (b'{"instances": [{"question": "q", "max_cost_usd": "cheap"}]}', 400, "max_cost_usd"),
        (b'{"instances": [{"question": "q", "max_cost_usd": true}]}', 400, "max_cost_usd"),
        (b'{"instances": [{"question": 42}]}', 400, "question"),
        (b'{"instances": [{"question": "q", "allowed_workers": ["nobody"]}]}', 400, "unknown workers"),
        (b'{"instances": [{"question": "q", "sensitivity": "secret"}]}', 400, "sensitivity"),
        (b'{"instances": [{"question": "q", "max_steps": 0}]}', 400, "max_steps"),
        (b'{"instances": [{"question": "q", "pool": "/etc/passwd"}]}', 400, "pool"),
        (
            b'{"instances": [{"question": "q", "sensitivity": "private", "allowed_workers": ["cloud-x"]}]}',
            400,
            "no worker",
        ),
    ],
)
def test_bad_v1_requests_get_4xx_saying_what_is_wrong(
    http: httpx.Client, body: bytes, status: int, says: str
) -> None:
    resp = http.post("/v1/models/conductor:predict", content=body, headers=JSON_HEADERS)
    assert resp.status_code == status, resp.text
    assert says.lower() in resp.text.lower()


_Q = {"name": "question", "shape": [1], "datatype": "BYTES", "data": ["What is 6*7?"]}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"inputs": [_Q], "parameters": {"max_rounds": {"int64_param": 2}}}, "parameters.max_rounds: a v2"),
        ({"inputs": [_Q], "parameters": {"max_rounds": [2]}}, "parameters.max_rounds"),
        ({"inputs": [_Q], "parameters": {"max_rounds": "2"}}, "parameters.max_rounds"),
        # one line per field, not one per branch of the union (was "max_cost_usd.float: ...; .int: ...")
        (
            {"inputs": [_Q], "parameters": {"max_cost_usd": "0.01"}},
            "parameters.max_cost_usd: Input should be a number",
        ),
        ({"inputs": [_Q], "parameters": {"max_cost_usd": None}}, "parameters.max_cost_usd"),
        ({"inputs": [_Q], "parameters": {"allowed_workers": ["local-a"]}}, "comma-separated"),
        ({"inputs": [_Q], "parameters": [1]}, "parameters: expected an object"),
        ({"id": 5, "inputs": [_Q]}, "id: expected a string"),
        ({"inputs": [{**_Q, "name": 7}]}, "inputs.0.name"),
        ({"inputs": [{k: v for k, v in _Q.items() if k != "datatype"}]}, "inputs.0.datatype"),
        ({"inputs": [{k: v for k, v in _Q.items() if k != "shape"}]}, "inputs.0.shape"),
        ({"inputs": [{k: v for k, v in _Q.items() if k != "data"}]}, "inputs.0.data"),
        ({"inputs": [_Q], "outputs": [{"name": 5}]}, "outputs.0.name"),
        ({"inputs": [_Q], "outputs": [{}]}, "outputs.0.name"),
    ],
)
def test_malformed_v2_bodies_get_a_400_naming_the_field_not_fastapis_422(
    http: httpx.Client, body: dict[str, Any], says: str
) -> None:
    """KServe's own request model answered these with FastAPI's raw 422 (a list of union branches)."""
    resp = http.post("/v2/models/conductor/infer", json=body)
    assert resp.status_code == 400, resp.text
    assert says in resp.json()["error"], resp.text
    assert "detail" not in resp.json() and ".float" not in resp.text


def test_v2_allowed_workers_is_a_comma_separated_string(http: httpx.Client) -> None:
    body = {"inputs": [_Q], "parameters": {"allowed_workers": "local-b, local-a", "max_steps": 1}}
    resp = http.post("/v2/models/conductor/infer", json=body)
    assert resp.status_code == 200, resp.text
    doc = json.loads({o["name"]: o for o in resp.json()["outputs"]}["response"]["data"][0])
    assert doc["workers_called"] and set(doc["workers_called"]) <= {"local-a", "local-b"}
    resp = http.post("/v2/models/conductor/infer", json={**body, "parameters": {"allowed_workers": "nobody"}})
    assert resp.status_code == 400 and "unknown workers ['nobody']" in resp.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/models/conductor:predict",
            {"instances": [{"question": "q", "max_rounds": {"int64_param": 2}}]},
        ),
        (
            "/openai/v1/chat/completions",
            {"model": "conductor", "messages": [{"role": "user", "content": "q"}], "max_rounds": [2]},
        ),
    ],
)
def test_a_wrongly_typed_max_rounds_is_a_400_on_v1_and_openai_too(
    http: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    resp = http.post(path, json=body)
    assert resp.status_code == 400, resp.text
    assert "max_rounds" in resp.text and "detail" not in resp.json()


def test_content_type_and_body_size_are_checked(http: httpx.Client) -> None:
    good = json.dumps({"instances": [{"question": "q"}]})
    for path in ("/v1/models/conductor:predict", "/v2/models/conductor/infer", "/openai/v1/chat/completions"):
        resp = http.post(path, content=good, headers={"content-type": "text/plain"})
        err = resp.json()["error"]  # the OpenAI route answers in OpenAI's error shape
        assert resp.status_code == 415 and "application/json" in (err["message"] if path[1] == "o" else err)
        resp = http.post(path, content=good)  # no content type at all
        assert resp.status_code == 415
    big = json.dumps({"instances": [{"question": "x" * 1_100_000}]})
    resp = http.post("/v1/models/conductor:predict", content=big, headers=JSON_HEADERS)
    assert resp.status_code == 413 and "exceeds 1000000" in resp.json()["error"]  # not 431: headers are small

    def chunked() -> Iterator[bytes]:  # no content-length: the guard counts what arrives
        yield b'{"instances": [{"question": "'
        for _ in range(12):
            yield b"y" * 100_000
        yield b'"}]}'

    resp = http.post("/v1/models/conductor:predict", content=chunked(), headers=JSON_HEADERS)
    assert resp.status_code == 413 and "exceeds 1000000 bytes" in resp.json()["error"]
    resp = http.post(
        "/v1/models/conductor:predict",
        content=good,
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert resp.status_code == 200, resp.text


# -- privacy, budgets, metrics ---------------------------------------------------------------


def test_private_requests_never_reach_the_external_worker(http: httpx.Client, server: Predictor) -> None:
    before = metric(http, "conductor_worker_calls_total", worker="cloud-x", outcome="ok")
    public = v1(http, {"question": "public q"}).json()["predictions"][0]
    assert "cloud-x" in [s["worker"] for s in public["steps"]]  # the plan does use it when allowed
    after_public = metric(http, "conductor_worker_calls_total", worker="cloud-x", outcome="ok")
    assert after_public == before + 1
    client = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key="x", max_retries=0)
    with ThreadPoolExecutor(8) as ex:
        docs = list(
            ex.map(lambda i: v1(http, {"question": f"secret {i}", "sensitivity": "private"}), range(24))
        )
        chats = list(
            ex.map(
                lambda i: client.chat.completions.create(
                    model="conductor",
                    messages=[{"role": "user", "content": f"secret {i}"}],
                    extra_body={"sensitivity": "private"},
                ),
                range(8),
            )
        )
    steps = [s for r in docs for s in r.json()["predictions"][0]["steps"]]
    steps += [s for c in chats for s in c.model_extra["conductor"]["steps"]]
    assert len(steps) == 64 and all(HOSTING[s["worker"]] == "self" for s in steps)
    assert metric(http, "conductor_worker_calls_total", worker="cloud-x", outcome="ok") == after_public
    log = server.log.read_text()
    assert "secret 3" not in log and '"sensitivity": "private"' in log  # no prompt text in logs


def test_budgets_are_never_exceeded_and_a_hopeless_budget_says_so(http: httpx.Client) -> None:
    budgets = [10 ** (-7 + k / 4) for k in range(24)]  # 1e-7 .. ~5e-2 USD
    with ThreadPoolExecutor(8) as ex:
        resps = list(
            ex.map(lambda b: v1(http, {"question": "What is 6*7? " * 20, "max_cost_usd": b}), budgets)
        )
    stopped = answered = 0
    for budget, resp in zip(budgets, resps, strict=True):
        doc = resp.json()["predictions"][0]
        # no 200 with an empty answer: a budget that bought none is a 422 that says so
        assert resp.status_code == (200 if doc["answer"] else 422), resp.text
        assert doc["cost_usd"] <= budget
        assert sum(s["cost_usd"] for s in doc["steps"]) <= budget
        stopped += doc["budget_stop"]
        answered += bool(doc["answer"])
        if not doc["answer"]:
            assert doc["budget_stop"] and resp.json()["error"] == doc["error"] == doc["message"]
        if not doc["steps"]:
            assert "cannot buy one worker call" in doc["message"] and doc["answer"] == ""
    assert stopped and answered  # the range covers hopeless, partial and ample budgets
    resp = v1(http, {"question": "q", "max_cost_usd": 1e-9})
    assert resp.status_code == 422 and "cannot buy one worker call" in resp.json()["error"]
    tiny = resp.json()["predictions"][0]
    assert tiny["budget_stop"] and "cannot buy one worker call" in tiny["message"]
    # the hopeless-budget document has every field an answered one has
    full = v1(http, {"question": "q"}).json()["predictions"][0]
    assert set(full) <= set(tiny), set(full) - set(tiny)


def test_a_streamed_request_whose_budget_bought_no_answer_says_budget_exhausted(http: httpx.Client) -> None:
    """Unstreamed, such a request is a 422 ``budget_exhausted``; streamed, the status line is sent
    before the budget runs out, so it is an error event, with the same code (it said
    ``workers_failed``, a server error, for the client's own budget)."""
    body = {
        "model": "conductor",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "max_cost_usd": 0.00005,  # affords local-a's call, not the plan's cloud-x first step
    }
    plain = http.post("/openai/v1/chat/completions", json={**body, "stream": False})
    assert plain.status_code == 422 and plain.json()["error"]["code"] == "budget_exhausted", plain.text
    events = [
        json.loads(line[len("data: ") :])
        for line in http.post("/openai/v1/chat/completions", json=body).text.splitlines()
        if line.startswith("data: {")
    ]
    errors = [e["error"] for e in events if "error" in e]
    assert len(errors) == 1 and errors[0]["code"] == "budget_exhausted", events
    assert errors[0]["type"] == "invalid_request_error"
    doc = next(e["conductor"] for e in events if "error" in e)
    assert doc["budget_stop"] and doc["cost_usd"] <= body["max_cost_usd"]


def test_metrics_count_requests_workers_tokens_cost_and_latency(http: httpx.Client) -> None:
    v1(http, {"question": "count me"})
    http.post("/v1/models/conductor:predict", content=b"{", headers=JSON_HEADERS)
    assert metric(http, "conductor_requests_total", endpoint="v1", status="2xx") >= 1
    assert metric(http, "conductor_requests_total", endpoint="v1", status="4xx") >= 1
    assert metric(http, "conductor_worker_tokens_total", worker="local-a", direction="output") > 0
    assert metric(http, "conductor_worker_cost_usd_total", worker="cloud-x") > 0
    assert metric(http, "conductor_worker_latency_seconds_count", worker="local-a") > 0
    assert metric(http, "conductor_request_latency_seconds_count", endpoint="v1") > 0
    assert metric(http, "conductor_errors_total", kind="bad_request") >= 1


# -- fuzz --------------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=12,
)
_FIELDS = ["question", "max_cost_usd", "sensitivity", "allowed_workers", "max_steps", "pool", "extra"]
_ENDPOINTS = ["/v1/models/conductor:predict", "/v2/models/conductor/infer", "/openai/v1/chat/completions"]


def _envelope(path: str, instance: dict[str, Any]) -> Any:
    if path.startswith("/v1"):
        return {"instances": [instance]}
    if path.startswith("/v2"):
        q = instance.pop("question", None)
        return {
            "inputs": [{"name": "question", "shape": [1], "datatype": "BYTES", "data": [q]}],
            "parameters": instance,
        }
    q = instance.pop("question", None)
    return {"model": "conductor", "messages": [{"role": "user", "content": q}], **instance}


@st.composite
def bad_requests(draw: st.DrawFn) -> tuple[str, bytes, str]:
    path = draw(st.sampled_from(_ENDPOINTS))
    kind = draw(st.sampled_from(["bytes", "json", "field", "drop", "content-type"]))
    ctype = "application/json"
    if kind == "bytes":
        body = draw(st.binary(max_size=200))
    elif kind == "json":
        body = json.dumps(draw(_json)).encode()
    else:
        instance: dict[str, Any] = {"question": "What is 6*7?", "max_cost_usd": 0.01}
        if kind == "field":
            instance[draw(st.sampled_from(_FIELDS))] = draw(_json | st.floats() | st.text())
        elif kind == "drop":
            instance.pop("question")
        else:
            ctype = draw(
                st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "", "image/png"])
            )
        try:
            body = json.dumps(_envelope(path, instance)).encode()  # NaN/Infinity as JS literals
        except (TypeError, ValueError):
            body = b"{"
    return path, body, ctype


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(req=bad_requests())
def test_fuzzed_requests_never_get_a_5xx(http: httpx.Client, req: tuple[str, bytes, str]) -> None:
    path, body, ctype = req
    headers = {"content-type": ctype} if ctype else {}
    resp = http.post(path, content=body, headers=headers)
    assert resp.status_code < 500, (path, body[:300], resp.status_code, resp.text[:300])
    if resp.status_code >= 400:
        assert resp.text.strip(), "a 4xx must say what is wrong"


def test_server_still_answers_after_the_fuzz(http: httpx.Client) -> None:
    assert metric(http, "conductor_requests_total", endpoint="v1", status="5xx") == 0
    assert metric(http, "conductor_requests_total", endpoint="v2", status="5xx") == 0
    assert metric(http, "conductor_requests_total", endpoint="openai", status="5xx") == 0
    assert v1(http, {"question": "still there?"}).json()["predictions"][0]["answer"] == "A: 42"


# -- failing workers ---------------------------------------------------------------------------


@pytest.mark.slow
def test_10_percent_failing_worker_calls_still_answer_99_percent(tmp_path: Path) -> None:
    # nothing above a worker retries it (a live client retries its own transient errors, fakes do
    # not): what keeps requests answered here is the fallback to a worker of the same hosting
    pool = write_pool(tmp_path / "flaky.yaml", fail_rate=0.1, seed=11)
    # started through the CLI (`conductor serve`), which forwards KServe's flags
    with (
        predictor(["--policy", "fixed:2,0", "--pool", str(pool)], tmp_path, cli=True) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
        ThreadPoolExecutor(16) as ex,
    ):
        resps = list(ex.map(lambda i: v1(client, {"question": f"q{i}"}), range(300)))
        errors = metric(client, "conductor_worker_calls_total", worker="local-a", outcome="error")
        errors += metric(client, "conductor_worker_calls_total", worker="cloud-x", outcome="error")
        calls = sum(
            metric(client, "conductor_worker_calls_total", worker=w, outcome=o)
            for w in HOSTING
            for o in ("ok", "error")
        )
    # a request no worker could answer is a 502 that says why, never a 200 with no answer
    assert all(r.status_code == 200 or (r.status_code == 502 and r.json()["error"]) for r in resps)
    docs = [r.json()["predictions"][0] for r in resps]
    assert all(bool(d["answer"]) == (r.status_code == 200) for d, r in zip(docs, resps, strict=True))
    answered = sum(bool(d["answer"]) for d in docs)
    assert answered >= 0.99 * len(docs), f"only {answered}/{len(docs)} answered"
    assert 0.05 < errors / calls < 0.15  # failures were really injected, each call once (~10 %)
    assert any(d["worker_fallback"] for d in docs)  # some worker failed and was replaced


# -- the micro Conductor from the MLflow registry, with traces ---------------------------------


@pytest.mark.slow
def test_micro_conductor_from_the_registry_plans_in_batches_and_traces(
    micro: Micro, mlflow_local: dict[str, str], tmp_path: Path
) -> None:
    import mlflow

    from rl_conductor.serving.pyfunc import MODEL_CODE
    from rl_conductor.tracking import mlflow_utils, registry

    registry.log_conductor_model(micro.final_dir, model_code=MODEL_CODE, alias="champion")
    with (
        predictor(["--pool", "paper-sim"], tmp_path, env=mlflow_local) as srv,
        httpx.Client(base_url=srv.url, timeout=120) as client,
    ):  # no --model: the default is models:/conductor@champion
        questions = [{"question": f"What is {i} + {i}?"} for i in range(6)]
        # a 1 s deadline no paper-sim worker meets: that request is planned twice, and says so
        rushed = {"question": "What is 7 + 7?", "max_latency_s": 1}
        private = {"question": "Keep this private", "sensitivity": "private"}
        resp = v1(client, *questions, rushed, private)
        assert resp.status_code == 200, resp.text
        docs = resp.json()["predictions"]
        batch_sum = metric(client, "conductor_plan_batch_size_sum")
        batch_count = metric(client, "conductor_plan_batch_size_count")
        exp = mlflow_utils.client().get_experiment_by_name("conductor-serving")
        deadline = time.monotonic() + 60
        traces: list[Any] = []
        # a trace is listed once its first span is exported; wait until each has its root
        while time.monotonic() < deadline and (
            len(traces) < len(docs) or not all(any(s.parent_id is None for s in t.data.spans) for t in traces)
        ):
            time.sleep(0.5)
            if exp is None:
                exp = mlflow_utils.client().get_experiment_by_name("conductor-serving")
                continue
            traces = mlflow.search_traces(locations=[exp.experiment_id], return_type="list")
    for doc in docs:
        assert doc["workflow"] and doc["raw_plan"]
        assert doc["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in doc["steps"]))
    assert not any(n.startswith("planning:") for n in docs[0]["notes"])  # no deadline: one pass
    assert docs[-2]["notes"][0].startswith("planning: the plan made without the deadline")
    assert docs[-2]["notes"][0].endswith("planned again with it")  # no worker answers in 1 s
    assert batch_sum / batch_count > 1, "concurrent questions were planned one by one"
    assert len(traces) == len(docs)
    for tr in traces:
        spans = tr.data.spans
        root = next(s for s in spans if s.parent_id is None)
        doc = next(d for d in docs if d["request_id"] == root.attributes["request_id"])
        assert len(spans) == 1 + len(doc["steps"])
        assert "Keep this private" not in json.dumps([s.inputs for s in spans] + [s.outputs for s in spans])


# -- live local workers (`conductor worker serve`) ---------------------------------------------


@pytest.mark.slow
def test_local_live_pool_end_to_end_keeps_private_requests_home(tmp_path: Path) -> None:
    """The predictor on the `local-live` pool: two real `conductor worker serve` processes (the tiny
    model), one self-hosted and one posing as an external API. The fixed plan asks the external
    worker first; its access log proves private requests never reached it over HTTP."""
    self_port, ext_port = free_ports(2)
    env = {
        "CONDUCTOR_SELF_PORT": str(self_port),
        "CONDUCTOR_EXTERNAL_PORT": str(ext_port),
        "CONDUCTOR_SELF_MODEL": "tiny",
        "CONDUCTOR_EXTERNAL_MODEL": "tiny",
        "CONDUCTOR_CACHE": str(tmp_path / "cache.sqlite"),
    }
    # the local-live pool as shipped, with 64 output tokens a call: the tiny model generates a
    # few tokens a second on a busy two-core machine, and what this test checks is the routing
    from rl_conductor.workers.pool import builtin_pool_dir

    cfg = yaml.safe_load((builtin_pool_dir() / "local-live.yaml").read_text())
    for spec in cfg["workers"]:
        spec["max_output_tokens"] = 64  # the least a pool accepts
    pool = tmp_path / "local-live.yaml"
    pool.write_text(yaml.safe_dump(cfg))
    worker = [sys.executable, "-m", "rl_conductor.cli", "worker", "serve", "--model", "tiny"]
    worker += ["--model-dir", str(tmp_path / "models"), "--default-max-tokens", "32"]
    chat = "POST /openai/v1/chat/completions"
    with (
        process(
            [*worker, "--port", str(self_port)],
            tmp_path / "self.log",
            f"http://127.0.0.1:{self_port}/openai/v1/models",
            env=env,
        ),
        process(
            [*worker, "--port", str(ext_port)],
            tmp_path / "ext.log",
            f"http://127.0.0.1:{ext_port}/openai/v1/models",
            env=env,
        ) as ext_log,
        predictor(["--policy", "fixed:1,0", "--pool", str(pool)], tmp_path, env=env) as srv,
        httpx.Client(base_url=srv.url, timeout=300) as client,
    ):
        public = v1(client, {"question": "What is 2 + 3?", "max_cost_usd": 0.01})
        assert public.status_code == 200, public.text
        doc = public.json()["predictions"][0]
        assert [s["worker"] for s in doc["steps"]] == ["smol-external", "smol-self"]
        assert all(s["status"] == "ok" and s["input_tokens"] > 0 for s in doc["steps"]), doc["steps"]
        assert doc["answer"] and 0 < doc["cost_usd"] <= 0.01
        external_calls = ext_log.read_text().count(chat)
        assert external_calls >= 1
        private = v1(
            client,
            *(
                {"question": f"My salary is {i}00 EUR; what is 10 %?", "sensitivity": "private"}
                for i in range(2)
            ),
        )
        assert private.status_code == 200, private.text
        steps = [s for d in private.json()["predictions"] for s in d["steps"]]
        assert steps and all(s["worker"] == "smol-self" for s in steps)
        assert ext_log.read_text().count(chat) == external_calls


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--pool", "paper-sim", "--model", "/nonexistent/conductor"], "cannot load"),
        (["--pool", "no-such-pool", "--policy", "fixed:0"], "no pool named"),
        (["--pool", "paper-sim", "--policy", "fixed:0", "--step_timeout_s", "-1"], "step_timeout_s"),
        # above the request cap: a server that started would fail every request
        (["--pool", "paper-sim", "--policy", "fixed:0", "--step_timeout_s", "7200"], "<= 3600"),
        (["--pool", "paper-sim", "--policy", "fixed:0", "--model", "x"], "either"),
    ],
)
def test_conductor_serve_refuses_bad_flags_with_a_message(args: list[str], says: str, tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "rl_conductor.cli", "serve", *args, "--auth", "none"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert says in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_the_predictor_runs_torch_on_the_threads_its_conductor_trained_with(
    micro: Micro, tmp_path: Path
) -> None:
    """A served tiny Conductor generated on torch's default of one thread per core."""
    import shutil

    import torch

    from rl_conductor.serving.server import ConductorModel

    model = tmp_path / "model"
    shutil.copytree(micro.final_dir, model)
    meta = json.loads((model / "conductor.json").read_text())
    trained = int(meta["train_config"]["torch_threads"])
    meta["train_config"]["torch_threads"] = 3 - trained  # 1 <-> 2: not what this process runs on
    (model / "conductor.json").write_text(json.dumps(meta))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(trained)
        assert ConductorModel(pool="paper-sim", model=str(model)).load()
        assert torch.get_num_threads() == 3 - trained
    finally:
        torch.set_num_threads(before)
