"""KServe's gRPC v2 data plane (``ModelInfer``) through the predictor, with a plain grpcio client.

gRPC is off by default (its port would collide with the self-hosted workers' 8081) and refused
when API keys are on (the request guard is HTTP middleware; gRPC does not pass through it), so
this server runs with ``--enable_grpc true --auth none``. The request is the v2 one of the HTTP
route: a BYTES tensor ``question`` and the limits in ``parameters``; the Open Inference
Protocol's parameters have no double, so a fractional limit travels as a string.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from _lazy import lazy
from predictor import process, write_pool
from servers import LOOPBACK, free_ports

# imported by the first test that uses them (tests/_lazy.py): kserve's package imports pandas,
# fastapi and the Kubernetes client, over a CPU second at every worker's collection
pb = lazy("kserve.protocol.grpc.grpc_predict_v2_pb2")
pb_grpc = lazy("kserve.protocol.grpc.grpc_predict_v2_pb2_grpc")


def _infer(
    stub: pb_grpc.GRPCInferenceServiceStub, questions: list[bytes], **params: pb.InferParameter
) -> pb.ModelInferResponse:
    req = pb.ModelInferRequest(
        model_name="conductor",
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="question",
                datatype="BYTES",
                shape=[len(questions)],
                contents=pb.InferTensorContents(bytes_contents=questions),
            )
        ],
        parameters=params,
    )
    return stub.ModelInfer(req, timeout=60)


def test_grpc_model_infer_answers_with_the_request_limits(tmp_path: Path) -> None:
    http_port, grpc_port = free_ports(2)
    pool = write_pool(tmp_path / "pool.yaml")
    cmd = [
        sys.executable,
        "-m",
        "rl_conductor.serving",
        *("--policy", "fixed:2,0", "--pool", str(pool)),
        *("--http_port", str(http_port), "--grpc_port", str(grpc_port), "--host", LOOPBACK),
        *("--enable_grpc", "true", "--auth", "none"),
    ]
    with (
        process(cmd, tmp_path / "grpc.log", f"http://{LOOPBACK}:{http_port}/v2/health/ready"),
        grpc.insecure_channel(f"{LOOPBACK}:{grpc_port}") as channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        resp = _infer(
            stub,
            [b"What is 6*7?", b"And 5*8?"],
            max_cost_usd=pb.InferParameter(string_param="0.05"),
            max_steps=pb.InferParameter(int64_param=2),
            sensitivity=pb.InferParameter(string_param="private"),
        )
        out = {o.name: o for o in resp.outputs}
        assert list(out["answer"].contents.bytes_contents) == [b"A: 42", b"A: 42"]
        docs = [json.loads(d) for d in out["response"].contents.bytes_contents]
        # private: the external worker the plan starts with is never called
        assert all(d["workers_called"] and "cloud-x" not in d["workers_called"] for d in docs)
        assert list(out["cost_usd"].contents.fp64_contents) == pytest.approx([d["cost_usd"] for d in docs])
        assert all(d["cost_usd"] <= 0.05 for d in docs)

        # a tiny budget is honoured (it would be dropped if the string were not read as a number)
        # (a budget that buys no answer is RESOURCE_EXHAUSTED, as it is a 422 over HTTP, never an empty OK)
        with pytest.raises(grpc.RpcError) as poor:
            _infer(stub, [b"What is 6*7?"], max_cost_usd=pb.InferParameter(string_param="1e-12"))
        assert poor.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "cannot buy one worker call" in (poor.value.details() or "")

        with pytest.raises(grpc.RpcError) as bad:
            _infer(stub, [b"What is 6*7?"], max_cost_usd=pb.InferParameter(string_param="lots"))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_cost_usd" in (bad.value.details() or "")


# -- the gRPC server's address, its request checks and its repository RPCs (third attack) ---------


@pytest.fixture(scope="module")
def grpc_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[int, pb_grpc.GRPCInferenceServiceStub]]:
    root = tmp_path_factory.mktemp("grpc")
    http_port, grpc_port = free_ports(2)
    pool = write_pool(root / "pool.yaml")
    cmd = [sys.executable, "-m", "rl_conductor.serving", *("--policy", "fixed:2,0", "--pool", str(pool))]
    cmd += ["--http_port", str(http_port), "--grpc_port", str(grpc_port), "--host", LOOPBACK]
    cmd += ["--enable_grpc", "true", "--auth", "none"]
    with (
        process(cmd, root / "grpc.log", f"http://{LOOPBACK}:{http_port}/v2/health/ready"),
        grpc.insecure_channel(f"{LOOPBACK}:{grpc_port}") as channel,
    ):
        yield grpc_port, pb_grpc.GRPCInferenceServiceStub(channel)


def test_grpc_listens_on_the_host_only(grpc_server: tuple[int, Any]) -> None:
    """``--host 127.0.0.1``: the gRPC port is bound to loopback (KServe's own server binds ``[::]``,
    every interface, whatever --host says; gRPC checks no API key)."""
    port, _ = grpc_server
    listening = {
        c.laddr.ip for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port
    }
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening


def _tensor(questions: list[bytes], shape: list[int] | None = None, **params: pb.InferParameter) -> Any:
    return pb.ModelInferRequest.InferInputTensor(
        name="question",
        datatype="BYTES",
        shape=shape or [len(questions)],
        contents=pb.InferTensorContents(bytes_contents=questions),
        parameters=params,
    )


@pytest.mark.parametrize(
    ("make_inputs", "says"),  # the tensors are built when the test runs (pb is imported lazily)
    [
        # a misplaced sensitivity was dropped, and the request answered by the external worker
        (
            lambda: [_tensor([b"What is 6*7?"], sensitivity=pb.InferParameter(string_param="private"))],
            "inputs.0.parameters.sensitivity: unknown field",
        ),
        (lambda: [_tensor([b"first?"]), _tensor([b"second?"])], "a second input named 'question'"),
        (lambda: [_tensor([b"What is 6*7?"], shape=[5])], "[5] holds 5 elements, but data has 1"),
    ],
    ids=["tensor-parameters", "duplicate-tensors", "shape"],
)
def test_grpc_requests_get_the_http_v2_checks(
    grpc_server: tuple[int, Any], make_inputs: Callable[[], list[Any]], says: str
) -> None:
    _, stub = grpc_server
    inputs = make_inputs()
    with pytest.raises(grpc.RpcError) as bad:
        stub.ModelInfer(pb.ModelInferRequest(model_name="conductor", inputs=inputs), timeout=60)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in (bad.value.details() or "")


def test_grpc_repository_rpcs_are_refused_cleanly_and_the_model_stays(grpc_server: tuple[int, Any]) -> None:
    """PERMISSION_DENIED saying why (before: UNKNOWN, "'ModelNotReady' object has no attribute
    'reason'"), and the model still answers."""
    _, stub = grpc_server
    for rpc, req in (
        (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="conductor")),
        (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="conductor")),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            rpc(req, timeout=30)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "repository API is disabled" in (refused.value.details() or "")
    assert stub.ModelReady(pb.ModelReadyRequest(name="conductor"), timeout=30).ready
    resp = stub.ModelInfer(pb.ModelInferRequest(model_name="conductor", inputs=[_tensor([b"What is 6*7?"])]))
    assert list(next(o for o in resp.outputs if o.name == "answer").contents.bytes_contents) == [b"A: 42"]
