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
from pathlib import Path

import grpc
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

from predictor import process, write_pool
from servers import LOOPBACK, free_ports


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
        tiny = _infer(stub, [b"What is 6*7?"], max_cost_usd=pb.InferParameter(string_param="1e-12"))
        doc = json.loads(next(o for o in tiny.outputs if o.name == "response").contents.bytes_contents[0])
        assert doc["budget_stop"] is True and doc["cost_usd"] == 0.0

        with pytest.raises(grpc.RpcError) as bad:
            _infer(stub, [b"What is 6*7?"], max_cost_usd=pb.InferParameter(string_param="lots"))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_cost_usd" in (bad.value.details() or "")
