"""Test doubles shipped in the library (pydantic-ai's ``TestModel`` idea): deterministic workers
with a fixed latency, scripted answers and failure modes. Tests, benchmarks and demos use them.

They honour the Worker contract the executor relies on: output tokens never exceed
``max_tokens`` and input tokens are counted with :func:`estimate_tokens`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rl_conductor.workers.base import (
    CallContext,
    CallWorker,
    Completion,
    Hosting,
    Message,
    WorkerCall,
    WorkerError,
    WorkerInfo,
    estimate_tokens,
)
from rl_conductor.workers.kinds import register_kind

Responder = Callable[[Sequence[Message], CallContext | None], str]

#: Most recent calls a fake worker keeps for tests to inspect (a server that runs on fake workers,
#: such as the soak benchmark, would otherwise keep every message it ever saw).
MAX_KEPT_CALLS = 1000


class CallLog(list[dict[str, object]]):
    """A list of a worker's calls that keeps only the latest :data:`MAX_KEPT_CALLS` (a list, so
    tests compare it with ``[]`` and slice it as before)."""

    maxlen: int = MAX_KEPT_CALLS

    def append(self, call: dict[str, object]) -> None:
        super().append(call)
        if len(self) > self.maxlen:
            del self[: len(self) - self.maxlen]


@dataclass
class FakeWorker(CallWorker):
    """A worker that answers with ``answer`` (or ``responder(messages, context)``) after ``latency_s``.

    Attributes:
        fail_times: the first N calls raise :class:`WorkerError` (then it recovers).
        hang: every call sleeps forever (to test timeouts).
        output_tokens: reported output tokens (capped at ``max_tokens``).
        fail_rate: each call raises :class:`WorkerError` with this probability (seeded by
            ``seed``, so a run is reproducible): injected failures for resilience tests.
        calls: the latest :data:`MAX_KEPT_CALLS` calls (messages, ``max_tokens``, context).
    """

    info: WorkerInfo
    answer: str = "The answer is 42."
    latency_s: float = 0.0
    responder: Responder | None = None
    fail_times: int = 0
    hang: bool = False
    output_tokens: int = 50
    fail_rate: float = 0.0
    seed: int = 0
    calls: list[dict[str, object]] = field(default_factory=CallLog)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.info.name}|{self.seed}")

    async def call(self, call: WorkerCall) -> Completion:
        messages, max_tokens, context = call.messages, call.max_tokens, call.context
        t0 = time.perf_counter()
        self.calls.append({"messages": list(messages), "max_tokens": max_tokens, "t": t0, "context": context})
        if self.hang:
            await asyncio.sleep(3600)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self.fail_times > 0:
            self.fail_times -= 1
            raise WorkerError(f"{self.info.name}: scripted failure")
        if self.fail_rate and self._rng.random() < self.fail_rate:
            raise WorkerError(f"{self.info.name}: injected failure")
        text = self.responder(messages, context) if self.responder else self.answer
        in_tok = sum(estimate_tokens(m.get("content", "")) for m in messages)
        out_tok = min(self.output_tokens, max_tokens)
        return Completion(
            text=text,
            input_tokens=in_tok,
            output_tokens=out_tok,
            cost_usd=self.info.cost(in_tok, out_tok),
            latency_s=self.latency_s or (time.perf_counter() - t0),
            worker=self.info.name,
        )


def fake_info(
    name: str, *, price_in: float = 1.0, price_out: float = 2.0, hosting: Hosting = "external"
) -> WorkerInfo:
    return WorkerInfo(name=name, price_in=price_in, price_out=price_out, hosting=hosting, kind="fake")


@register_kind("fake")
def _build_fake(spec: dict[str, object], options: dict[str, object]) -> FakeWorker:
    from rl_conductor.workers.kinds import info_from_spec

    return FakeWorker(
        info=info_from_spec(spec),
        answer=str(spec.get("answer", "The answer is 42.")),
        latency_s=float(spec.get("latency_s", 0.0)),  # type: ignore[arg-type]
        output_tokens=int(spec.get("output_tokens", 50)),  # type: ignore[call-overload]
        fail_rate=float(spec.get("fail_rate", options.get("fail_rate", 0.0))),  # type: ignore[arg-type]
        seed=int(options.get("seed", 0)),  # type: ignore[call-overload]
        hang=bool(spec.get("hang", False)),
    )
