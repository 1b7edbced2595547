"""The Conductor as an MLflow pyfunc model: ``mlflow.pyfunc.load_model(...).predict(requests)``.

Why it is in ``serving/``: a registered model must answer a request the same way however it is
loaded, so ``predict`` answers through :class:`~rl_conductor.serving.service.ConductorService`,
the engine of the KServe predictor (its budget floor, batched planning, deadline minus planning
time, response document), not through a second copy of the plan → execute → annotate sequence.
The registry (:mod:`rl_conductor.tracking.registry`) logs the model folder with a "models from
code" file, :data:`MODEL_CODE`, which its callers (the pipeline, the retraining loop) import from
here and pass down, so the dependency is an import the layer contract sees; the registry never
imports serving.

A pyfunc's ``predict`` is synchronous and may be called from any thread, while the service's
micro-batcher lives on one event loop: every service of this process runs on one event loop in
a daemon thread, and ``predict`` waits for its answers there. The worker pool is the operator's
choice (``answer_batch(..., pool=...)``) or the model's own (its ``conductor.json``), never a
field of the request.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from mlflow.pyfunc.model import PythonModel

from rl_conductor.policies.conductor import ConductorPolicy
from rl_conductor.serving.request import parse_batch
from rl_conductor.serving.service import ConductorService
from rl_conductor.tracking.registry import MODEL_DIR_ARTIFACT
from rl_conductor.workers.pool import load_pool

__all__ = ["MODEL_CODE", "ConductorPyfunc", "answer_batch", "as_records", "service_for"]

#: The "models from code" file the registry logs (``registry.log_conductor_model(...,
#: model_code=MODEL_CODE)``): MLflow rebuilds the model by running it, not by unpickling.
MODEL_CODE = """\
import mlflow.models

from rl_conductor.serving.pyfunc import ConductorPyfunc

mlflow.models.set_model(ConductorPyfunc())
"""


class ConductorPyfunc(PythonModel):
    """MLflow pyfunc wrapper: keeps the model folder's path and answers requests with it."""

    model_dir: str | None = None

    def load_context(self, context: Any) -> None:
        self.model_dir = context.artifacts[MODEL_DIR_ARTIFACT]

    # ``model_input`` stays unannotated on purpose: MLflow turns a type hint into a schema it
    # enforces (a DataFrame input then fails), and requests are free-form dicts that
    # parse_request validates. MLflow prints a UserWarning about the missing hint.
    def predict(self, context: Any, model_input, params: dict[str, Any] | None = None) -> Any:  # type: ignore[no-untyped-def]
        if self.model_dir is None:
            self.load_context(context)
        assert self.model_dir is not None
        return answer_batch(self.model_dir, as_records(model_input))


#: The request's integer fields (a DataFrame column with a missing value holds them as floats).
_INTEGER_FIELDS = frozenset({"max_steps", "max_rounds", "max_calls"})


def as_records(model_input: Any) -> list[Any]:
    """pyfunc hands over a DataFrame, a dict, a list or a string; answer_batch gets a list."""
    if hasattr(model_input, "to_dict"):  # pandas DataFrame
        # A column that some rows leave out holds NaN in those rows: that field was not given
        # there. A column that is NaN in every row was sent as NaN (a field no row gives has no
        # column), which stays NaN and is an error, as outside a DataFrame. Such a column also
        # turns integers into floats (3 -> 3.0): integral floats of integer fields are integers.
        rows = model_input.to_dict(orient="records")
        all_nan = {c for c in model_input.columns if bool(model_input[c].isna().all())}

        def clean(k: str, v: Any) -> Any:
            if k in _INTEGER_FIELDS and isinstance(v, float) and v.is_integer():
                return int(v)
            return v

        return [
            {k: clean(k, v) for k, v in row.items() if k in all_nan or not (isinstance(v, float) and v != v)}
            for row in rows
        ]
    if isinstance(model_input, Mapping):
        return [dict(model_input)]
    if isinstance(model_input, str):
        return [{"question": model_input}]
    return list(model_input)


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The event loop every pyfunc service of this process runs on (started on first use)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="conductor-pyfunc", daemon=True).start()
        return _LOOP


@lru_cache(maxsize=4)
def service_for(model_dir: str, pool: str | None = None) -> ConductorService:
    """The service answering with the Conductor in ``model_dir`` over ``pool`` (default: the pool
    its ``conductor.json`` names, else ``paper-sim``), built once per process."""
    policy = ConductorPolicy(model_dir)
    return ConductorService(policy, load_pool(pool or str(policy.meta.get("pool", "paper-sim"))))


def answer_batch(
    model_dir: str | Path, inputs: Sequence[Any], *, pool: str | None = None
) -> list[dict[str, Any]]:
    """One response document per input, in order, as :meth:`ConductorService.answer` makes it.

    Every input is validated before any runs, with the batch rules KServe applies (at most 64
    questions, their budgets within the request cap: :func:`~rl_conductor.serving.request.parse_batch`;
    :class:`~rl_conductor.serving.request.RequestError` names the input and field); ``pool`` is
    the operator's, never the request's."""
    requests = parse_batch(list(inputs))
    service = service_for(str(model_dir), pool)

    async def run_all() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(service.answer(r, endpoint="pyfunc") for r in requests)))

    return asyncio.run_coroutine_threadsafe(run_all(), _loop()).result()
