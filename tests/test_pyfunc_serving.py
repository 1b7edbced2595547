"""The same registered model answers the same request identically through the KServe predictor
(a real server process on loopback) and through ``mlflow.pyfunc.load_model``: both run
:class:`rl_conductor.serving.service.ConductorService`, so the budget floor, the response
document and the planning are one code path (only the request id and the wall time differ).
"""

from __future__ import annotations

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


def _same(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in PER_CALL}


@pytest.mark.slow
def test_kserve_and_pyfunc_answer_the_same_request_identically(
    micro: Micro, mlflow_local: dict[str, str], tmp_path: Path
) -> None:
    from rl_conductor.serving.pyfunc import MODEL_CODE
    from rl_conductor.tracking import registry

    (question, other) = [t.question for t in load_tasks("paper-mix", split="test", limit=2, seed=3)]
    requests: list[dict[str, Any]] = [
        {"question": question},
        {"question": other, "sensitivity": "private"},
        {"question": question, "max_cost_usd": 1e-7},  # below any call: the service's budget floor
        {"question": other, "max_cost_usd": 0.003, "max_steps": 2},
    ]
    info = registry.log_conductor_model(micro.final_dir, model_code=MODEL_CODE, alias="champion")
    with (
        predictor(["--model", info.model_uri, "--pool", "paper-sim"], tmp_path, env=mlflow_local) as srv,
        httpx.Client(base_url=srv.url, timeout=120) as client,
    ):
        resp = client.post("/v1/models/conductor:predict", json={"instances": requests})
    assert resp.status_code == 200, resp.text
    served = resp.json()["predictions"]
    loaded = mlflow.pyfunc.load_model(info.model_uri)
    answered = loaded.predict(requests)
    assert len(served) == len(answered) == len(requests)
    for over_http, in_process in zip(served, answered, strict=True):
        assert set(PER_CALL) <= set(over_http) and set(PER_CALL) <= set(in_process)
        assert _same(over_http) == _same(in_process)
    assert served[0]["answer"] and served[0]["cost_usd"] > 0
    assert served[2]["budget_stop"] and served[2]["cost_usd"] == 0.0 and served[2]["message"]
