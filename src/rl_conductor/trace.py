"""Request limits and execution traces: the typed values between execute, grade and report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Sensitivity = Literal["public", "private"]


@dataclass(frozen=True)
class Limits:
    """What a request allows, enforced by the executor whatever the policy wrote.

    Attributes:
        max_cost_usd: hard budget for all worker calls of the request (None = unlimited).
        allowed_workers: worker names that may be called (None = all).
        sensitivity: ``"private"`` keeps the request on ``hosting: self`` workers only.
        max_steps: most steps a workflow may run.
        step_timeout_s: per-call timeout; a timed-out (or failed) call is replaced by a
            fallback worker of the same hosting class, else the step fails.
        max_tokens: max output tokens per worker call.
        temperature: worker sampling temperature (paper: 0.2).
        recursion_depth: how deep the Conductor may call itself (0 = never).
    """

    max_cost_usd: float | None = None
    allowed_workers: frozenset[str] | None = None
    sensitivity: Sensitivity = "public"
    max_steps: int = 5
    step_timeout_s: float = 120.0
    max_tokens: int = 4096
    temperature: float = 0.2
    recursion_depth: int = 1

    def permits(self, name: str, hosting: str) -> bool:
        if self.allowed_workers is not None and name not in self.allowed_workers:
            return False
        return not (self.sensitivity == "private" and hosting != "self")


@dataclass
class StepRecord:
    """What one step did. ``status`` is ``ok``, ``skipped_budget``, ``skipped_forbidden``,
    ``failed`` or ``recursed``."""

    index: int
    worker: str
    instruction: str
    visible: list[int]
    status: str = "ok"
    answer: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    started_s: float = 0.0
    note: str = ""
    cached: bool = False
    #: how the worker's generation ended: "stop", "length" (truncated at max_tokens), "" unknown
    finish_reason: str = ""
    #: the token counts are estimates (the worker's server reported no usage)
    tokens_estimated: bool = False
    substeps: list[StepRecord] = field(default_factory=list)


@dataclass
class Trace:
    """Everything a run of a workflow did: per-step records, totals and the final answer."""

    task_id: str
    steps: list[StepRecord] = field(default_factory=list)
    final_answer: str = ""
    wall_s: float = 0.0
    stopped_reason: str = ""  # "" when every step ran; else why execution stopped early
    workflow_text: str = ""
    fallback_plan: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def cost_usd(self) -> float:
        return sum(s.cost_usd + sum(x.cost_usd for x in _flatten(s.substeps)) for s in self.steps)

    @property
    def input_tokens(self) -> int:
        return sum(s.input_tokens + sum(x.input_tokens for x in _flatten(s.substeps)) for s in self.steps)

    @property
    def output_tokens(self) -> int:
        return sum(s.output_tokens + sum(x.output_tokens for x in _flatten(s.substeps)) for s in self.steps)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def calls(self) -> int:
        """Worker calls actually made (recursion counts its inner calls)."""
        return sum(
            (1 if s.status == "ok" else 0) + sum(1 for x in _flatten(s.substeps) if x.status == "ok")
            for s in self.steps
        )

    @property
    def latency_s(self) -> float:
        """Critical-path latency from the workers' reported latencies (parallel steps overlap)."""
        return max((s.started_s + s.latency_s for s in self.steps), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            cost_usd=self.cost_usd,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            calls=self.calls,
            latency_s=self.latency_s,
        )
        return d


def _flatten(records: list[StepRecord]) -> list[StepRecord]:
    out: list[StepRecord] = []
    for r in records:
        out.append(r)
        out.extend(_flatten(r.substeps))
    return out
