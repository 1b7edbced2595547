"""The predictor's edges, against the real KServe server process on loopback: API keys on every
inference route, no model-repository routes, liveness that follows the model, v2 bodies checked
field by field (JSON and the binary extension), header and body timeouts, disconnects that leave
a log line and a cost, loud failures (502 with the reason), OpenAI fields and conversations,
``X-Request-ID``, probes not counted, and start-up errors as one line with exit status 2.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _lazy import lazy
from predictor import FAKE_WORKERS, Predictor, predictor, write_pool
from servers import LOOPBACK, free_ports
from test_serving_server import metric

openai = lazy("openai")  # imported by the first test that uses it (tests/_lazy.py): it takes seconds

KEYS = ("k-first-0123456789abcdef", "k-second-0123456789abcdef")
FILE_KEY = "k-file-0123456789abcdef00"
INFER = "/v2/models/conductor/infer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Predictor]:
    root = tmp_path_factory.mktemp("secure")
    pool = write_pool(root / "pool.yaml")
    key_file = root / "keys"
    key_file.write_text(f"# rotated keys\n{FILE_KEY}\n\n")
    args = ["--policy", "fixed:2,0", "--pool", str(pool), "--api-key-file", str(key_file)]
    args += ["--header_timeout_s", "1", "--body_timeout_s", "1"]
    env = {"CONDUCTOR_API_KEYS": ",".join(KEYS)}
    with predictor(args, root, env=env) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: Predictor) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.url, timeout=30, headers={"authorization": f"Bearer {KEYS[0]}"}
    ) as client:
        yield client


def sdk(server: Predictor, key: str = KEYS[1]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=key, max_retries=0)


def v2_body(*questions: str, **parameters: Any) -> dict[str, Any]:
    tensor = {"name": "question", "shape": [len(questions)], "datatype": "BYTES", "data": list(questions)}
    return {"inputs": [tensor], "parameters": parameters}


# -- authentication ------------------------------------------------------------------------------

ROUTES = [
    ("POST", "/v1/models/conductor:predict", {"instances": [{"question": "q"}]}),
    ("POST", INFER, v2_body("q")),
    (
        "POST",
        "/openai/v1/chat/completions",
        {"model": "conductor", "messages": [{"role": "user", "content": "q"}]},
    ),
    ("GET", "/openai/v1/models", None),
    ("GET", "/v1/models", None),
    ("GET", "/v2/models/conductor", None),
    ("GET", "/v2", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_every_inference_route_needs_a_configured_key(
    server: Predictor, method: str, path: str, body: Any
) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for headers in ({}, {"authorization": "Bearer wrong-key-0123456789"}, {"authorization": KEYS[0]}):
            resp = client.request(method, path, json=body, headers=headers)
            assert resp.status_code == 401, (headers, resp.text)
            assert resp.headers["www-authenticate"].startswith("Bearer")
        for key in (*KEYS, FILE_KEY):  # both sources, several keys each
            resp = client.request(method, path, json=body, headers={"authorization": f"Bearer {key}"})
            assert resp.status_code == 200, resp.text


def test_probes_and_metrics_need_no_key_and_probes_are_not_counted(server: Predictor) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = metric(client, "conductor_requests_total", endpoint="v2", status="2xx")
        before_other = metric(client, "conductor_requests_total", endpoint="other", status="2xx")
        for path in ("/", "/v2/health/live", "/v2/health/ready", "/v2/models/conductor/ready") * 3:
            assert client.get(path).status_code == 200, path
        assert metric(client, "conductor_requests_total", endpoint="v2", status="2xx") == before
        assert metric(client, "conductor_requests_total", endpoint="other", status="2xx") == before_other


def test_openai_sdk_with_a_wrong_key_gets_an_authentication_error(server: Predictor) -> None:
    with pytest.raises(openai.AuthenticationError, match="API key"):
        sdk(server, "not-a-key-0123456789").chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": "q"}]
        )
    resp = sdk(server).chat.completions.create(model="conductor", messages=[{"role": "user", "content": "q"}])
    assert resp.choices[0].message.content == "A: 42"


def test_model_repository_routes_are_refused_and_the_model_stays(http: httpx.Client) -> None:
    for path in (
        "/v2/repository/models/conductor/unload",
        "/v2/repository/models/conductor/load",
        "/v2/repository/index",
    ):
        resp = http.post(path, json={})
        assert resp.status_code == 404, resp.text
        assert "disabled" in resp.json()["error"]
    assert http.get("/v2/models/conductor/ready").status_code == 200
    assert http.get("/v2/health/live").status_code == 200
    resp = http.post("/v1/models/conductor:predict", json={"instances": ["still here?"]})
    assert resp.json()["predictions"][0]["answer"] == "A: 42"


def test_liveness_fails_once_the_model_is_gone() -> None:
    """The guard's liveness check, on an app of its own: the model's state is a flag here (the
    server offers no route that unloads it any more, which the test above checks)."""
    import asyncio

    from rl_conductor.serving.guard import RequestGuard

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"status": "alive"}'})

    loaded = [True]
    guard = RequestGuard(app, keys=None, is_live=lambda: loaded[0])

    async def probe(path: str) -> int:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://t") as c:
            return (await c.get(path)).status_code

    assert asyncio.run(probe("/v2/health/live")) == 200
    loaded[0] = False
    assert asyncio.run(probe("/v2/health/live")) == 503
    assert asyncio.run(probe("/")) == 503


# -- v2 bodies -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({**v2_body("q"), "sensitivity": "private"}, "sensitivity"),
        ({**v2_body("q"), "max_cost_usd": 0.01}, "max_cost_usd"),
        (
            {"inputs": [{**v2_body("q")["inputs"][0], "parameters": {"sensitivity": "private"}}]},
            "inputs.0.parameters.sensitivity",
        ),
        ({"inputs": [{**v2_body("q")["inputs"][0], "colour": "red"}]}, "inputs.0.colour"),
        ({**v2_body("q"), "outputs": [{"name": "answer", "parameters": {"x": 1}}]}, "outputs.0.parameters.x"),
    ],
)
def test_v2_rejects_unknown_and_misplaced_fields(http: httpx.Client, body: dict[str, Any], says: str) -> None:
    external = metric(http, "conductor_worker_calls_total", worker="cloud-x", outcome="ok")
    resp = http.post(INFER, json=body)
    assert resp.status_code == 400, resp.text
    assert says in resp.json()["error"]
    assert metric(http, "conductor_worker_calls_total", worker="cloud-x", outcome="ok") == external


def _binary(header: dict[str, Any], blob: bytes, length: str | None = None) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + blob, {
        "inference-header-content-length": length if length is not None else str(len(head)),
        "content-type": "application/octet-stream",
    }


def _elements(*texts: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(t)) + t for t in texts)


def _bin_header(size: int, datatype: str = "BYTES", **extra: Any) -> dict[str, Any]:
    tensor = {
        "name": "question",
        "shape": [1],
        "datatype": datatype,
        "parameters": {"binary_data_size": size},
    }
    return {"inputs": [{**tensor, **extra}], "parameters": {"max_steps": 1}}


def test_v2_binary_extension_is_answered_and_malformed_ones_are_4xx_and_counted(http: httpx.Client) -> None:
    blob = _elements(b"What is 6*7?")
    body, headers = _binary(_bin_header(len(blob)), blob)
    resp = http.post(INFER, content=body, headers=headers)
    assert resp.status_code == 200, resp.text
    outputs = {o["name"]: o for o in resp.json()["outputs"]}
    assert outputs["answer"]["data"] == ["X: 42"]  # max_steps 1: the plan's first worker only
    good = _elements(b"q")
    bad = [
        _binary(_bin_header(len(good)), good, "abc"),  # the length is not a number
        _binary(_bin_header(len(good)), good, "99999"),  # longer than the body
        _binary(_bin_header(len(good)), good, "3"),  # cuts the JSON header
        (b"[1, 2]" + good, {"inference-header-content-length": "6"}),  # header not an object
        _binary(_bin_header(len(good) + 5), good),  # fewer bytes than binary_data_size
        _binary(_bin_header(len(good) - 1), good),  # bytes left over
        _binary(_bin_header(len(good)), good[:3] + b"\x00"),  # ends inside a length
        _binary(_bin_header(5), struct.pack("<I", 50) + b"x"),  # element overruns the tensor
        _binary(_bin_header(6), _elements(b"\xff\xfe")),  # not UTF-8
        _binary(_bin_header(len(good), "FP32"), good),  # not a BYTES tensor
        _binary(_bin_header(len(good), data=["q"]), good),  # data and binary
        _binary(_bin_header(-1), good),  # negative size
        _binary({**_bin_header(len(good)), "sensitivity": "private"}, good),  # misplaced field
        _binary({"inputs": "nope"}, b""),
        _binary({"inputs": [{"name": "other", "shape": [1], "datatype": "BYTES", "data": ["q"]}]}, b""),
        (b"{}", {"inference-header-content-length": "2"}),
        (b"", {"inference-header-content-length": "0"}),
    ]
    bad_before = metric(http, "conductor_errors_total", kind="bad_request")
    fives = metric(http, "conductor_requests_total", endpoint="v2", status="5xx")
    for content, hdrs in bad:
        resp = http.post(INFER, content=content, headers=hdrs)
        assert 400 <= resp.status_code < 500, (content[:200], resp.status_code, resp.text[:300])
        assert resp.json()["error"]
    assert metric(http, "conductor_errors_total", kind="bad_request") == bad_before + len(bad)
    assert metric(http, "conductor_requests_total", endpoint="v2", status="5xx") == fives


# -- timeouts --------------------------------------------------------------------------------------


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before it closed the connection (raises if it stays open)."""
    sock.settimeout(seconds)
    got = b""
    while True:
        chunk = sock.recv(65536)  # socket.timeout (an OSError) if the server keeps it open
        if not chunk:
            return got
        got += chunk


def test_half_sent_headers_and_bodies_are_cut(server: Predictor) -> None:
    auth = f"Authorization: Bearer {KEYS[0]}\r\n".encode()
    with socket.create_connection((LOOPBACK, server.port)) as sock:
        sock.sendall(b"POST /v1/models/conductor:predict HTTP/1.1\r\nHost: x\r\nContent-Ty")
        assert _closed_within(sock, 30) == b""
    with socket.create_connection((LOOPBACK, server.port)) as sock:
        head = b"POST /v1/models/conductor:predict HTTP/1.1\r\nHost: x\r\n" + auth
        head += b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        sock.sendall(head + b'{"instances": [{"question": "' + b"x" * 400)
        reply = _closed_within(sock, 30)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"did not arrive" in reply
    with socket.create_connection((LOOPBACK, server.port)) as sock:  # endless headers
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        with pytest.raises(OSError):  # the server closes while we still send (reset or broken pipe)
            for _ in range(100):
                sock.sendall(b"X-Pad: " + b"p" * 1000 + b"\r\n")
            assert _closed_within(sock, 30).startswith(b"HTTP/1.1 431")
            raise ConnectionResetError  # closed cleanly after the 431: the same outcome
    with socket.create_connection((LOOPBACK, server.port)) as sock:  # small headers, large body
        head = b"POST /v1/models/conductor:predict HTTP/1.1\r\nHost: x\r\n" + auth
        head += b"Content-Type: application/json\r\nContent-Length: 1100000\r\n\r\n"
        # one write: the server's first read carries the headers and far more than 64 KiB of body,
        # which is the body's size (413), not the headers' (431)
        with contextlib.suppress(OSError):  # it may answer and close while we still send
            sock.sendall(head + b'{"instances": [{"question": "' + b"x" * 300_000)
        sock.settimeout(30)
        reply = b""
        with contextlib.suppress(ConnectionResetError):  # closed with our body unread: a reset
            while chunk := sock.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        assert b"exceeds 1000000" in reply
    with socket.create_connection((LOOPBACK, server.port)) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # a complete request is answered


# -- request ids, logs ---------------------------------------------------------------------------


def test_x_request_id_is_honoured_or_generated_on_every_route_and_logged(
    http: httpx.Client, server: Predictor
) -> None:
    for method, path, body in [*ROUTES, ("GET", "/v2/health/live", None)]:
        resp = http.request(method, path, json=body, headers={"x-request-id": "trace-abc.123"})
        assert resp.headers["x-request-id"] == "trace-abc.123", path
        resp = http.request(method, path, json=body)
        assert len(resp.headers["x-request-id"]) == 32, path  # generated
    resp = http.post("/openai/v1/models", headers={"x-request-id": "bad id with spaces"})
    assert resp.headers["x-request-id"] != "bad id with spaces"
    unauth = httpx.post(f"{server.url}/v1/models/conductor:predict", headers={"x-request-id": "no-key-1"})
    assert unauth.status_code == 401 and unauth.headers["x-request-id"] == "no-key-1"
    http.post(
        "/v1/models/conductor:predict", json={"instances": ["logged?"]}, headers={"x-request-id": "find-me-7"}
    )
    lines = [json.loads(x) for x in server.log.read_text().splitlines() if x.startswith('{"event"')]
    assert any(r["http_request_id"] == "find-me-7" for r in lines)


def test_4xx_are_one_warning_line_without_traceback(http: httpx.Client, server: Predictor) -> None:
    resp = http.post("/v1/models/conductor:predict", json={"instances": [{"question": "q", "max_steps": 0}]})
    assert resp.status_code == 400
    resp = http.post(INFER, json=v2_body("q", max_steps=0))
    assert resp.status_code == 400
    assert http.post("/v2/models/other/infer", json=v2_body("q")).status_code == 404
    assert http.get("/v1/models/other").status_code == 404
    log = server.log.read_text()
    assert "Traceback" not in log
    assert "/v1/models/conductor:predict -> 400" in log and f"{INFER} -> 400" in log


# -- OpenAI fields and conversations ---------------------------------------------------------------


def test_openai_sdk_common_fields_are_accepted_and_n_above_1_is_a_clear_400(server: Predictor) -> None:
    client = sdk(server)
    resp = client.chat.completions.create(
        model="conductor",
        messages=[{"role": "user", "content": "What is 6*7?"}],
        stop=["\n\n"],
        top_p=0.9,
        n=1,
        presence_penalty=0.1,
        frequency_penalty=0.1,
        seed=7,
        user="someone",
        logit_bias={"50256": -100},
        response_format={"type": "text"},
        temperature=0.3,
        max_tokens=7,
        metadata={"team": "x"},
    )
    doc = resp.model_extra["conductor"]
    assert resp.choices[0].message.content == "A: 42"
    assert [s["output_tokens"] for s in doc["steps"]] == [50, 7]  # max_tokens: the final step only
    stream = client.chat.completions.create(
        model="conductor",
        messages=[{"role": "user", "content": "q"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "A: 42"
    with pytest.raises(openai.BadRequestError, match="only n=1"):
        client.chat.completions.create(model="conductor", messages=[{"role": "user", "content": "q"}], n=2)
    with pytest.raises(openai.BadRequestError, match="tool"):
        client.chat.completions.create(
            model="conductor",
            messages=[{"role": "user", "content": "q"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    # a limit misplaced in OpenAI's free-form metadata would be silently ignored: refused
    with pytest.raises(openai.BadRequestError, match="sensitivity is a top-level field"):
        client.chat.completions.create(
            model="conductor",
            messages=[{"role": "user", "content": "q"}],
            metadata={"sensitivity": "private"},
        )


def test_the_whole_conversation_reaches_the_workers(server: Predictor) -> None:
    client = sdk(server)
    alone = client.chat.completions.create(
        model="conductor", messages=[{"role": "user", "content": "And 3?"}]
    )
    system = "You are a terse assistant for arithmetic. " * 20
    talk = client.chat.completions.create(
        model="conductor",
        messages=[
            {"role": "system", "content": system},
            {"role": "user", "content": "What is 6*7?"},
            {"role": "assistant", "content": "42"},
            {"role": "user", "content": "And 3?"},
        ],
    )
    grown = [
        b["input_tokens"] - a["input_tokens"]
        for a, b in zip(
            alone.model_extra["conductor"]["steps"], talk.model_extra["conductor"]["steps"], strict=True
        )
    ]
    assert all(g >= len(system) // 8 for g in grown), grown  # every step read the system prompt
    assert talk.model_extra["conductor"]["cost_usd"] > alone.model_extra["conductor"]["cost_usd"]


# -- loud failures, disconnects ------------------------------------------------------------------


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Predictor]:
    root = tmp_path_factory.mktemp("broken")
    workers = [{**w, "fail_rate": 1.0} for w in FAKE_WORKERS]
    pool = write_pool(root / "pool.yaml", workers=workers)
    with predictor(["--policy", "fixed:2,0", "--pool", str(pool)], root) as srv:
        yield srv


def test_a_batch_with_some_questions_unanswered_is_a_200_whose_documents_say_which(
    http: httpx.Client,
) -> None:
    resp = http.post(
        "/v1/models/conductor:predict",
        json={"instances": [{"question": "q", "max_latency_s": 1e-6}, "What is 6*7?"]},
    )
    assert resp.status_code == 200, resp.text
    late, answered = resp.json()["predictions"]
    assert late["answer"] == "" and "deadline" in late["error"] and late["deadline_cut"]
    assert answered["answer"] == "A: 42" and "error" not in answered
    alone = http.post(
        "/v1/models/conductor:predict", json={"instances": [{"question": "q", "max_latency_s": 1e-6}]}
    )
    assert alone.status_code == 504 and "deadline" in alone.json()["error"]


def test_no_worker_answering_is_a_502_that_says_why(broken: Predictor) -> None:
    with httpx.Client(base_url=broken.url, timeout=30) as client:
        resp = client.post("/v1/models/conductor:predict", json={"instances": ["q"]})
        assert resp.status_code == 502, resp.text
        assert "injected failure" in resp.json()["error"]
        assert resp.json()["predictions"][0]["answer"] == ""
        resp = client.post(INFER, json=v2_body("q"))
        assert resp.status_code == 502 and "no worker could answer" in resp.json()["error"]
        assert metric(client, "conductor_request_flags_total", flag="no_answer") >= 2
    oa = openai.OpenAI(base_url=f"{broken.url}/openai/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError, match="no worker could answer") as err:
        oa.chat.completions.create(model="conductor", messages=[{"role": "user", "content": "q"}])
    assert err.value.status_code == 502
    with pytest.raises(openai.APIError, match="no worker could answer"):
        list(
            oa.chat.completions.create(
                model="conductor", messages=[{"role": "user", "content": "q"}], stream=True
            )
        )


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Predictor]:
    root = tmp_path_factory.mktemp("slow")
    workers = [{**FAKE_WORKERS[0], "latency_s": 0.05}, {**FAKE_WORKERS[1], "latency_s": 2.0}]
    pool = write_pool(root / "pool.yaml", workers=workers)
    env = {"PYTHONASYNCIODEBUG": "0"}
    with predictor(["--policy", "fixed:0,1", "--pool", str(pool)], root, env=env) as srv:
        yield srv


def test_clients_that_leave_mid_stream_leave_a_log_line_a_cost_and_no_pending_task(slow: Predictor) -> None:
    body = {"model": "conductor", "messages": [{"role": "user", "content": "q"}], "stream": True}
    with httpx.Client(base_url=slow.url, timeout=30) as client:
        costed = metric(client, "conductor_request_cost_usd_count")
        for _ in range(4):
            with client.stream("POST", "/openai/v1/chat/completions", json=body) as resp:
                for line in resp.iter_lines():
                    if "conductor_step" in line:  # the first step is done: leave mid-workflow
                        break
        deadline = time.monotonic() + 30
        while metric(client, "conductor_request_cost_usd_count") < costed + 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert metric(client, "conductor_request_cost_usd_count") == costed + 4
        assert metric(client, "conductor_request_flags_total", flag="cancelled") >= 4
    # the server is another process: its log says what its event loop saw
    records = [json.loads(x) for x in slow.log.read_text().splitlines() if x.startswith('{"event"')]
    cancelled = [r for r in records if r["cancelled"]]
    assert len(cancelled) >= 4
    for r in cancelled:  # local-b was in flight: it was sent, so it is charged (before: $0, unlisted)
        assert r["workers"] == ["local-a", "local-b"] and r["statuses"] == ["ok", "cancelled"], r
        assert r["cost_usd"] > 0
    assert "Task was destroyed but it is pending" not in slow.log.read_text()


# -- start-up errors -------------------------------------------------------------------------------


def _serve(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    import os

    pool = write_pool(tmp_path / "pool.yaml")
    full_env = {k: v for k, v in os.environ.items() if k != "CONDUCTOR_API_KEYS"} | (env or {})
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rl_conductor.cli",
            "serve",
            "--policy",
            "fixed:0",
            "--pool",
            str(pool),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=full_env,
    )


@pytest.mark.slow
def test_start_up_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    taken = socket.socket()
    taken.bind((LOOPBACK, port))
    taken.listen()
    key_env = {"CONDUCTOR_API_KEYS": KEYS[0]}
    short = tmp_path / "short"
    short.write_text("abc\n")
    try:
        cases = [
            ([], {}, "no API keys"),
            (["--api-key-file", str(tmp_path / "missing")], {}, "cannot read"),
            (["--api-key-file", str(short)], {}, "at least 16"),
            (["--http_port", str(port), "--host", LOOPBACK], key_env, "cannot listen"),
            (["--host", "no-such-host.invalid"], key_env, "cannot resolve"),
            (["--enable_grpc", "true"], key_env, "gRPC"),
            (["--auth", "none"], key_env, "--auth none"),
        ]
        for args, env, says in cases:
            proc = _serve(args, tmp_path, env)
            assert proc.returncode == 2, (args, proc.stderr[-2000:])
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], (
                args,
                proc.stderr,
            )
    finally:
        taken.close()


def test_grpc_is_off_by_default(tmp_path: Path) -> None:
    (grpc_port,) = free_ports(1)
    pool = write_pool(tmp_path / "pool.yaml")
    args = ["--policy", "fixed:0", "--pool", str(pool), "--grpc_port", str(grpc_port)]
    # predictor() passes --enable_grpc false itself; this server is started without it
    from predictor import process

    (port,) = free_ports(1)
    cmd = [sys.executable, "-m", "rl_conductor.serving", *args, "--http_port", str(port), "--auth", "none"]
    with (
        process(cmd, tmp_path / "grpc.log", f"http://{LOOPBACK}:{port}/v2/health/ready"),
        pytest.raises(ConnectionRefusedError),
    ):
        socket.create_connection((LOOPBACK, grpc_port), timeout=5).close()


# -- manifests -------------------------------------------------------------------------------------


def test_manifests_turn_authentication_on_and_limit_who_reaches_the_predictor() -> None:
    import re

    import yaml

    from rl_conductor.serving import server
    from test_manifests import MANIFESTS, kinds, render

    docs = render("prod")
    pod = kinds(docs, "InferenceService")["conductor"]["spec"]["predictor"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    args = server.build_parser().parse_args(
        [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    )
    assert args.auth == "keys" and args.enable_grpc is False and args.host == "0.0.0.0"
    mount = next(v for v in container["volumeMounts"] if args.api_key_file.startswith(v["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    secret = yaml.safe_load((MANIFESTS / "secrets" / "conductor-client-keys.template.yaml").read_text())
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert args.api_key_file.removeprefix(mount["mountPath"] + "/") in secret["stringData"]
    assert not volume["secret"].get("optional")  # no Secret, no pod: never an open predictor
    policy = kinds(docs, "NetworkPolicy")["conductor"]
    for rule in policy["spec"]["ingress"]:
        assert rule.get("from"), "an ingress rule without 'from' admits every pod and address"


@pytest.mark.slow
def test_grpc_when_turned_on_refuses_the_repository_rpcs(tmp_path: Path) -> None:
    import grpc
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

    from predictor import process

    http_port, grpc_port = free_ports(2)
    pool = write_pool(tmp_path / "pool.yaml")
    cmd = [sys.executable, "-m", "rl_conductor.serving", "--policy", "fixed:0", "--pool", str(pool)]
    cmd += ["--http_port", str(http_port), "--grpc_port", str(grpc_port), "--host", LOOPBACK]
    cmd += ["--auth", "none", "--enable_grpc", "true"]  # gRPC checks no key: only without auth
    ready = f"http://{LOOPBACK}:{http_port}/v2/health/ready"
    with process(cmd, tmp_path / "grpc.log", ready), grpc.insecure_channel(f"{LOOPBACK}:{grpc_port}") as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        for rpc, req in (
            (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="conductor")),
            (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="conductor")),
        ):
            with pytest.raises(grpc.RpcError):
                rpc(req, timeout=30)
        assert stub.ModelReady(pb.ModelReadyRequest(name="conductor"), timeout=30).ready
        assert httpx.get(ready).status_code == 200


@pytest.mark.slow
def test_check_pool_refuses_to_start_on_a_pool_whose_workers_do_not_answer(tmp_path: Path) -> None:
    broken_pool = write_pool(
        tmp_path / "broken.yaml", workers=[{**w, "fail_rate": 1.0} for w in FAKE_WORKERS]
    )
    cmd = [sys.executable, "-m", "rl_conductor.cli", "serve", "--policy", "fixed:0"]
    flags = ["--auth", "none", "--check_pool", "true"]
    proc = subprocess.run(
        [*cmd, "--pool", str(broken_pool), *flags], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "local-a" in lines[0], proc.stderr
    ok_pool = write_pool(tmp_path / "ok.yaml")
    with predictor(["--policy", "fixed:0", "--pool", str(ok_pool), "--check_pool", "true"], tmp_path) as srv:
        assert httpx.get(f"{srv.url}/v2/health/ready").status_code == 200
