"""The same registered model answers the same request identically through the KServe predictor
(a real server process on loopback) and through ``mlflow.pyfunc.load_model``: both run
:class:`rl_conductor.serving.service.ConductorService`, so the budget floor, the deadline, the
rounds, the allow-list, the response document and the planning are one code path (only the
request id and the wall time differ), and a request one refuses the other refuses too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from _lazy import lazy
from _tiny import Micro
from predictor import predictor
from rl_conductor.tasks.datasets import load_tasks

mlflow = lazy("mlflow")  # imported by the first test that uses it (tests/_lazy.py): it takes seconds

#: Per-request values: a fresh id and the wall-clock time of each answer.
PER_CALL = ("request_id", "wall_s")
#: A deadline's time left counts the planning's wall time (``ConductorService``), so the numbers
#: of a step's ``deadline: output capped at N tokens (Ts left)`` note are per call too.
TIME_LEFT = re.compile(r"capped at \d+ tokens \([\d.]+s left\)")


def _same(doc: dict[str, Any]) -> dict[str, Any]:
    steps = [{**s, "note": TIME_LEFT.sub("capped (time left)", s["note"])} for s in doc.get("steps", [])]
    return {k: v for k, v in doc.items() if k not in PER_CALL} | {"steps": steps}


@pytest.mark.slow
def test_kserve_and_pyfunc_answer_the_same_request_identically(
    micro: Micro, mlflow_local: dict[str, str], tmp_path: Path
) -> None:
    from rl_conductor.limits import MAX_CALLS, MAX_ROUNDS
    from rl_conductor.serving.pyfunc import MODEL_CODE
    from rl_conductor.tracking import registry

    (question, other) = [t.question for t in load_tasks("paper-mix", split="test", limit=2, seed=3)]
    requests: list[dict[str, Any]] = [
        {"question": question},
        {"question": other, "sensitivity": "private"},
        {"question": question, "max_cost_usd": 1e-7},  # below any call: the service's budget floor
        {"question": other, "max_cost_usd": 0.003, "max_steps": 2},
        {"question": question, "max_latency_s": 120},  # a deadline
        {"question": other, "max_rounds": 2, "max_calls": 4},  # rounds (a one-round model: no review)
        {"question": question, "allowed_workers": ["qwen3-32b", "gemma-3-27b-it"]},
        {"question": other, "max_latency_s": 60, "allowed_workers": ["gpt-5", "qwen3-32b"], "max_rounds": 2},
    ]
    #: refused by both, each naming the field: over a cap, an unknown worker, no time at all
    refused: list[dict[str, Any]] = [
        {"question": question, "max_rounds": MAX_ROUNDS + 1},
        {"question": question, "max_calls": MAX_CALLS + 1},
        {"question": question, "allowed_workers": ["no-such-worker"]},
        {"question": question, "max_latency_s": 0},
    ]
    info = registry.log_conductor_model(micro.final_dir, model_code=MODEL_CODE, alias="champion")
    loaded = mlflow.pyfunc.load_model(info.model_uri)
    with (
        predictor(["--model", info.model_uri, "--pool", "paper-sim"], tmp_path, env=mlflow_local) as srv,
        httpx.Client(base_url=srv.url, timeout=120) as client,
    ):
        resp = client.post("/v1/models/conductor:predict", json={"instances": requests})
        refusals = [client.post("/v1/models/conductor:predict", json={"instances": [bad]}) for bad in refused]
    for bad, over_http in zip(refused, refusals, strict=True):
        field = next(k for k in bad if k != "question")
        assert over_http.status_code == 400, (bad, over_http.text)
        with pytest.raises(Exception, match=field) as in_process:
            loaded.predict([bad])
        assert field in over_http.json()["error"], (bad, over_http.text, str(in_process.value))
    assert resp.status_code == 200, resp.text
    served = resp.json()["predictions"]
    answered = loaded.predict(requests)
    assert len(served) == len(answered) == len(requests)
    for over_http, in_process in zip(served, answered, strict=True):
        assert set(PER_CALL) <= set(over_http) and set(PER_CALL) <= set(in_process)
        assert _same(over_http) == _same(in_process)
    assert served[0]["answer"] and served[0]["cost_usd"] > 0
    assert served[2]["budget_stop"] and served[2]["cost_usd"] == 0.0 and served[2]["message"]
    assert any(n.startswith("planning:") for n in served[4]["notes"])  # the deadline was planned for
    assert set(served[6]["workers_called"]) <= {"qwen3-32b", "gemma-3-27b-it"}  # the allow-list held
    assert set(served[7]["workers_called"]) <= {"gpt-5", "qwen3-32b"}
