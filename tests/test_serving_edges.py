"""The predictor's edges found by the second outside attack: calls in flight when a request is
cancelled are charged, slow or unauthenticated clients cannot hold connections, and the small
wire-format holes (v2 shapes, duplicate names and keys, string flags, batch budgets, keys in
access logs, the egress rule, bounded per-request state).

Most checks run in process (the service, the guard as an ASGI app, the parsers); the connection
checks run against the real server process on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from predictor import FAKE_WORKERS, Predictor, predictor, write_pool
from rl_conductor.policies.fixed import FixedPlan
from rl_conductor.serving.request import ConductorRequest
from rl_conductor.serving.service import ConductorService
from rl_conductor.workers.pool import build_pool
from servers import LOOPBACK, free_ports

# -- cancelled with calls in flight --------------------------------------------------------------


def _slow_pool() -> Any:
    return build_pool(
        {
            "name": "slow",
            "workers": [
                {"name": "quick", "kind": "fake", "hosting": "self", "price_in": 0.1, "price_out": 0.2},
                {
                    "name": "slow",
                    "kind": "fake",
                    "hosting": "self",
                    "price_in": 0.2,
                    "price_out": 0.4,
                    "latency_s": 30.0,
                },
            ],
        }
    )


def _records(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.getMessage().startswith('{"event"')]


async def test_a_request_cancelled_with_a_call_in_flight_is_charged_that_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The chain quick -> slow is cancelled while ``slow`` is in flight: the call was sent and
    may be billed, so the log line charges its reservation (before: only ``quick``'s cost)."""
    from rl_conductor.serving import metrics as m

    service = ConductorService(FixedPlan([0, 1]), _slow_pool())
    steps: list[dict[str, Any]] = []
    caplog.set_level(logging.INFO, "rl_conductor.serving")
    cost_before = m.WORKER_COST.labels("slow")._value.get()
    task = asyncio.ensure_future(
        service.answer(ConductorRequest(question="What is 6*7?", max_cost_usd=0.5), on_step=steps.append)
    )
    while not steps:  # the first step answered: the second is in flight
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (record,) = _records(caplog)
    assert record["cancelled"] is True
    assert record["workers"] == ["quick", "slow"]
    assert record["statuses"] == ["ok", "cancelled"]
    quick = steps[0]["cost_usd"]
    assert record["cost_usd"] > quick > 0
    in_flight = record["cost_usd"] - quick
    assert m.WORKER_COST.labels("slow")._value.get() - cost_before == pytest.approx(in_flight)
    assert record["cost_usd"] <= 0.5


# -- connections: caps and deadlines (the real server process) ------------------------------------

KEY = "k-edges-0123456789abcdef"
AUTH = f"Authorization: Bearer {KEY}\r\n".encode()
CAP = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Predictor]:
    root = tmp_path_factory.mktemp("edges")
    workers = [{**FAKE_WORKERS[0]}, {**FAKE_WORKERS[1], "latency_s": 4.0}]
    pool = write_pool(root / "pool.yaml", workers=workers)
    args = ["--policy", "fixed:0,1", "--pool", str(pool), "--max_connections", str(CAP)]
    args += ["--header_timeout_s", "2", "--body_timeout_s", "2"]
    with predictor(args, root, env={"CONDUCTOR_API_KEYS": KEY}) as srv:
        yield srv


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before it closed the connection (raises if it stays open)."""
    sock.settimeout(seconds)
    got = b""
    with contextlib.suppress(ConnectionResetError):  # closed with our body unread: a reset
        while chunk := sock.recv(65536):
            got += chunk
    return got


def _post_head(path: str, length: int, *, auth: bytes = b"", method: str = "POST") -> bytes:
    return (
        (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n"
        ).encode()
        + auth
        + b"\r\n"
    )


def test_an_unauthenticated_trickling_body_gets_401_and_its_connection_closes(server: Predictor) -> None:
    """The 401 is sent without reading the body, then the connection closes (before: kept open
    while the client trickled its body, past both timeouts)."""
    socks = [socket.create_connection((LOOPBACK, server.port)) for _ in range(3)]
    try:
        for sock in socks:
            sock.sendall(_post_head("/v1/models/conductor:predict", 100_000) + b'{"instances": [')
        for sock in socks:
            # well inside the 2 s body timeout: it is the early answer that closes, not the timer
            reply = _closed_within(sock, 1.5)
            assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
            assert b"connection: close" in reply.lower()
    finally:
        for sock in socks:
            sock.close()


def test_a_route_answering_without_reading_the_body_closes_the_connection(server: Predictor) -> None:
    """An authenticated PUT (405 from the router, which never reads the body) closes too."""
    with socket.create_connection((LOOPBACK, server.port)) as sock:
        sock.sendall(_post_head("/v1/models/conductor:predict", 100_000, auth=AUTH, method="PUT") + b"{")
        reply = _closed_within(sock, 1.5)
        assert reply.startswith(b"HTTP/1.1 405"), reply[:200]


def test_connections_past_the_cap_get_503_and_close(server: Predictor) -> None:
    """CAP - 1 requests in flight (the second worker takes 4 s) and one more connection reach the
    cap (uvicorn counts the connection asking too): that request is refused with 503 and its
    connection closed, and once they finish the server answers again."""
    body = json.dumps({"instances": ["q"]}).encode()
    held = [socket.create_connection((LOOPBACK, server.port)) for _ in range(CAP - 1)]
    try:
        for sock in held:
            sock.sendall(_post_head("/v1/models/conductor:predict", len(body), auth=AUTH) + body)
        time.sleep(0.5)  # let the server start them (they run for 4 s)
        with socket.create_connection((LOOPBACK, server.port)) as extra:
            extra.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
            reply = _closed_within(extra, 3.0)
            assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
        for sock in held:
            sock.settimeout(60)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()
    resp = httpx.get(f"{server.url}/v1/models", headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert resp.status_code == 200


def test_probes_answer_while_clients_hold_every_connection(server: Predictor) -> None:
    """CAP - 1 requests in flight and clients that never finish their headers hold the cap: the
    liveness and readiness probes still get 200 (before: 503, and the kubelet restarted a healthy
    pod), while any other request still gets 503."""
    body = json.dumps({"instances": ["q"]}).encode()
    held = [socket.create_connection((LOOPBACK, server.port)) for _ in range(CAP - 1)]
    idle: list[socket.socket] = []
    try:
        for sock in held:
            sock.sendall(_post_head("/v1/models/conductor:predict", len(body), auth=AUTH) + body)
        time.sleep(0.3)  # the held requests are in before the idle clients connect
        idle += [socket.create_connection((LOOPBACK, server.port)) for _ in range(2)]
        for sock in idle:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")  # headers never end
        time.sleep(0.5)  # let the server start the requests (they run for 4 s)
        for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/conductor/ready", "/"):
            with socket.create_connection((LOOPBACK, server.port)) as probe:
                probe.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                reply = _closed_within(probe, 3.0)
                assert reply.startswith(b"HTTP/1.1 200"), (path, reply[:200])
        with socket.create_connection((LOOPBACK, server.port)) as extra:
            extra.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
            assert _closed_within(extra, 3.0).startswith(b"HTTP/1.1 503")
        for sock in held:
            sock.settimeout(60)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        for sock in held + idle:
            sock.close()


def test_a_401_on_a_get_closes_the_connection(server: Predictor) -> None:
    """Wrong-key GETs pipelined on one connection: one 401, then the connection closes (before:
    a 401 per request, so a client could guess keys on one connection without end)."""
    guess = (
        b"GET /openai/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong-guess-0000000000\r\n\r\n"
    )
    with socket.create_connection((LOOPBACK, server.port)) as sock:
        sock.sendall(guess * 10)
        reply = _closed_within(sock, 3.0)
    assert reply.count(b"HTTP/1.1 401") == 1, reply[:400]
    assert b"connection: close" in reply.lower()


def test_a_dropped_non_streaming_request_is_logged_with_every_call_charged(server: Predictor) -> None:
    """The client leaves while the second call is in flight: its log line charges both calls
    (it either ran to its end or was cancelled with the call charged its reservation)."""
    body = json.dumps({"instances": ["dropped?"]}).encode()
    with socket.create_connection((LOOPBACK, server.port)) as sock:
        head = _post_head("/v1/models/conductor:predict", len(body), auth=AUTH)
        sock.sendall(head[:-2] + b"X-Request-ID: dropped-1\r\n\r\n" + body)
        time.sleep(0.5)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in server.log.read_text().splitlines() if x.startswith('{"event"')]
        mine = [r for r in lines if r["http_request_id"] == "dropped-1"]
        if mine:
            break
        time.sleep(0.2)
    (record,) = mine
    assert record["workers"] == ["local-a", "local-b"] and record["cost_usd"] > 0, record


def test_keys_in_query_strings_are_not_written_to_the_access_log(server: Predictor) -> None:
    secret = "s3cr3t-value-in-a-url-0123"
    for query in (f"api_key={secret}", f"x=1&token={secret}", f"API-KEY={secret}&y=2"):
        assert httpx.get(f"{server.url}/v1/models?{query}", timeout=30).status_code == 401
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.get("/v2/health/live?probe=1")  # an access line that must stay as it is
    log = server.log.read_text()
    assert "probe=1" in log  # the access log is on, and query strings show
    assert secret not in log
    assert "api_key=REDACTED" in log


def test_credentials_under_any_name_and_the_api_key_itself_are_not_logged(server: Predictor) -> None:
    """Names the redaction missed (``x-api-key``, ``api%5Fkey``, ``client_secret``, ``access_key``,
    ``bearer``, ``jwt``, ``sig``, a ``;api_key=`` path parameter) and the configured key under a
    name no list holds: none reaches the access log or the guard's 4xx line."""
    secret = "an0ther-s3cret-in-a-url-987"
    names = ["x-api-key", "api%5Fkey", "client_secret", "access_key", "bearer", "jwt", "sig", "apiKey"]
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for name in names:
            client.get(f"/v1/models?{name}={secret}")  # no key: 401, written by the guard too
        client.get(f"/v1/models;api_key={secret}")
        auth = {"authorization": f"Bearer {KEY}"}
        assert client.get(f"/v1/models?q={KEY}", headers=auth).status_code == 200
        assert client.get(f"/v1/models/nope;whatever={KEY}", headers=auth).status_code == 404
    log = server.log.read_text()
    assert "x-api-key=REDACTED" in log and "api_key=REDACTED" in log  # the lines are there
    assert secret not in log
    assert KEY not in log


async def test_the_protocol_closes_a_body_that_nobody_reads_at_the_body_deadline() -> None:
    """An app that neither reads the body nor answers: the protocol's own body deadline ends the
    connection (the guard's 408 covers the routes it reads; this is the backstop for all)."""
    import uvicorn

    from rl_conductor.serving.guard import header_timeout_protocol

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await asyncio.sleep(3600)

    (port,) = free_ports(1)
    protocol = header_timeout_protocol(5.0, 0.5)
    config = uvicorn.Config(
        app,
        host=LOOPBACK,
        port=port,
        http=protocol,
        log_level="error",
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    srv = uvicorn.Server(config)
    serving = asyncio.ensure_future(srv.serve())
    try:
        while not srv.started:
            await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        writer.write(_post_head("/x", 1000) + b"{")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 30) == b""  # closed, nothing sent
        writer.close()
    finally:
        srv.should_exit = True
        await serving


# -- wire formats ------------------------------------------------------------------------------------

INFER = "/v2/models/conductor/infer"


def _v2(*questions: str, **parameters: Any) -> dict[str, Any]:
    tensor = {"name": "question", "shape": [len(questions)], "datatype": "BYTES", "data": list(questions)}
    return {"inputs": [tensor], "parameters": parameters}


@pytest.fixture(scope="module")
def http(server: Predictor) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60, headers={"authorization": f"Bearer {KEY}"}) as client:
        yield client


@pytest.mark.parametrize(
    ("tensor", "says"),
    [
        ({"shape": [3]}, "inputs.0.shape: [3] holds 3 elements, but data has 1"),
        ({"shape": [1, 2]}, "holds 2 elements"),
        ({"shape": [0]}, "holds 0 elements"),
        ({"shape": [-1]}, "inputs.0.shape: expected a list of counts"),
        ({"shape": "1"}, "inputs.0.shape: expected a list of counts"),
        ({"shape": [True]}, "inputs.0.shape: expected a list of counts"),
    ],
)
def test_v2_a_shape_that_does_not_match_the_data_is_a_400(
    http: httpx.Client, tensor: dict[str, Any], says: str
) -> None:
    body = _v2("What is 6*7?")
    body["inputs"][0].update(tensor)
    resp = http.post(INFER, json=body)
    assert resp.status_code == 400, resp.text
    assert says in resp.json()["error"]


def test_v2_matching_shapes_are_answered(http: httpx.Client) -> None:
    body = _v2("q1", "q2", max_steps=1)
    assert http.post(INFER, json=body).status_code == 200
    body["inputs"][0]["shape"] = [2, 1]  # the product counts
    assert http.post(INFER, json=body).status_code == 200


def test_v2_duplicate_input_names_are_a_400(http: httpx.Client) -> None:
    first = _v2("public question")["inputs"][0]
    body = {"inputs": [first, {**first, "data": ["the other one"]}]}
    resp = http.post(INFER, json=body)
    assert resp.status_code == 400, resp.text
    assert "inputs.1.name: a second input named 'question'" in resp.json()["error"]


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/models/conductor:predict", '{"instances": [{"question": "q", "question": "other"}]}'),
        (INFER, '{"inputs": [], "inputs": [{"name": "question"}]}'),
        (
            "/openai/v1/chat/completions",
            '{"model": "conductor", "messages": [{"role": "user", "content": "q"}], '
            '"sensitivity": "private", "sensitivity": "public"}',
        ),
    ],
)
def test_a_key_twice_in_a_json_object_is_a_400(http: httpx.Client, path: str, raw: str) -> None:
    resp = http.post(path, content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert "duplicate key" in resp.text


def test_duplicate_keys_in_a_binary_extension_header_are_a_400(http: httpx.Client) -> None:
    tensor = b'{"name": "question", "shape": [1], "datatype": "BYTES", "data": ["q"]}'
    head = b'{"inputs": [' + tensor + b'], "id": "a", "id": "b"}'
    resp = http.post(
        INFER,
        content=head,
        headers={
            "inference-header-content-length": str(len(head)),
            "content-type": "application/octet-stream",
        },
    )
    assert resp.status_code == 400 and "duplicate key" in resp.json()["error"], resp.text


@pytest.mark.parametrize("value", ["true", 1, "yes"])
def test_stream_must_be_a_boolean(http: httpx.Client, value: Any) -> None:
    body = {"model": "conductor", "messages": [{"role": "user", "content": "q"}], "stream": value}
    resp = http.post("/openai/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "stream"
    assert "text/event-stream" not in resp.headers.get("content-type", "")


def test_the_request_cap_bounds_a_whole_batch(http: httpx.Client) -> None:
    """$10,000 is the cap of one request: a batch's budgets add up under it (before: each
    question could state $10,000)."""
    from rl_conductor.limits import MAX_USD

    half = MAX_USD / 2 + 1
    resp = http.post(
        "/v1/models/conductor:predict", json={"instances": [{"question": "q", "max_cost_usd": half}] * 2}
    )
    assert resp.status_code == 400, resp.text
    assert "for the whole batch" in resp.json()["error"]
    resp = http.post(INFER, json=_v2("q1", "q2", max_cost_usd=half))
    assert resp.status_code == 400, resp.text
    assert "for the whole batch" in resp.json()["error"]
    ok = http.post(
        "/v1/models/conductor:predict", json={"instances": [{"question": "q", "max_cost_usd": half - 2}] * 2}
    )
    assert ok.status_code == 200, ok.text


# -- egress ------------------------------------------------------------------------------------------

#: Address ranges inside a cluster or its cloud: never "external" for the egress rule.
INTERNAL = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10")


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_the_external_egress_rule_excludes_every_internal_range(overlay: str) -> None:
    """Carrier-grade NAT (100.64.0.0/10) is internal like RFC 1918 (before: admitted)."""
    import ipaddress

    from test_manifests import kinds, render

    blocks = [
        peer["ipBlock"]
        for policy in kinds(render(overlay), "NetworkPolicy").values()
        for rule in policy["spec"].get("egress", [])
        for peer in rule.get("to", [])
        if "ipBlock" in peer
    ]
    assert blocks
    for block in blocks:
        excluded = [ipaddress.ip_network(n) for n in block.get("except", [])]
        for internal in map(ipaddress.ip_network, INTERNAL):
            if internal.overlaps(ipaddress.ip_network(block["cidr"])):
                assert any(e.supernet_of(internal) for e in excluded), (block, str(internal))  # type: ignore[arg-type]


# -- memory per request ----------------------------------------------------------------------------


async def test_what_a_server_keeps_per_request_stays_bounded() -> None:
    """The soak's RSS grew about 2 MB per 1,000 requests: each fake worker kept every call's
    messages (a server on fake workers is the soak's and the demos'). 3,000 requests later the
    service's per-request state is empty and each worker keeps at most MAX_KEPT_CALLS calls."""
    from rl_conductor.workers.fake import MAX_KEPT_CALLS

    pool = build_pool(
        {
            "name": "mem",
            "workers": [
                {"name": "a", "kind": "fake", "hosting": "self", "price_in": 0.1, "price_out": 0.2},
                {"name": "b", "kind": "fake", "hosting": "self", "price_in": 0.2, "price_out": 0.4},
            ],
        }
    )
    service = ConductorService(FixedPlan([0, 1]), pool)
    n = 3 * MAX_KEPT_CALLS
    for start in range(0, n, 250):
        await asyncio.gather(
            *(service.answer(ConductorRequest(question=f"question {i}")) for i in range(start, start + 250))
        )
    await service.drain()
    inner = [w.inner for w in service.pool.workers]  # type: ignore[attr-defined]
    assert [len(w.calls) for w in inner] == [MAX_KEPT_CALLS, MAX_KEPT_CALLS]
    assert f"question {n - 1}\n" in inner[0].calls[-1]["messages"][0]["content"]  # the latest kept
    assert not service._background
    assert service._planner is None or not service._planner._queue


def test_a_replay_pool_answers_a_recorded_question_when_served() -> None:
    """A replay worker answers the items it has recordings for: a served request that asks a
    recorded question is that item (H26: every served request to a replay pool failed with 502,
    while ``conductor plan`` matched the item by its text); other text still gets no answer."""
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.workers.pool import load_pool

    service = ConductorService(FixedPlan([0]), load_pool("gsm8k-six"))
    item = load_tasks("gsm8k-six", split="test", limit=1)[0]
    doc = asyncio.run(service.answer(ConductorRequest(question=item.question)))
    assert not doc.get("error") and doc["answer"].strip()
    other = asyncio.run(service.answer(ConductorRequest(question=item.question + " Also, why?")))
    assert other.get("error")
