"""Execution traces: the typed values between execute, grade and report.

A :class:`StepRecord` keeps every attempt of its step, so the money a trace reports is the money
the budget was charged and the audit lists every worker that saw the request; a
:class:`RoundRecord` says what the policy saw and decided after each round. What a request
allows is :class:`rl_conductor.limits.RequestLimits`, one layer below.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args


def estimate_tokens(text: str) -> int:
    """Cheap, dependency-free token estimate (~4 characters per token), used for pre-flight
    cost estimates and for recorded text without a tokenizer (workers, recordings files). Never
    below 1 for non-empty text."""
    if not text:
        return 0
    return max(1, round(len(text) / 4))


#: What became of a step.
StepStatus = Literal["ok", "skipped_budget", "skipped_deadline", "skipped_forbidden", "failed"]
STEP_STATUSES: tuple[str, ...] = get_args(StepStatus)
#: Statuses whose step produced an answer later steps can see.
ANSWERED: tuple[StepStatus, ...] = ("ok",)

#: What became of one call to a worker: answered, raised, timed out, or answered with blank text.
AttemptStatus = Literal["ok", "error", "timeout", "empty"]
ATTEMPT_STATUSES: tuple[str, ...] = get_args(AttemptStatus)


@dataclass
class Attempt:
    """One call to a worker for a step: who, what became of it, what it used and cost.

    ``cost_usd`` is what the budget was charged for the call: the worker's reported cost, or the
    whole reservation for a call that timed out (it may still be billed)."""

    worker: str
    status: AttemptStatus
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    error: str = ""


@dataclass
class StepRecord:
    """What one step did (see :data:`StepStatus`).

    ``worker`` is the worker whose attempt decided the step (the one that answered, else the
    last one tried; empty when none was called), ``requested_worker`` the one the plan named.
    ``attempts`` lists every call made for the step; the step's tokens, cost and latency are
    their totals."""

    index: int
    worker: str
    instruction: str
    visible: list[int]
    status: StepStatus = "ok"
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
    #: the answer (or its final-answer line) was made from a recorded label
    #: (``Completion.synthesised``): graded, never read by a review or compared with another answer
    synthesised: bool = False
    requested_worker: str = ""
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def readable_answer(self) -> str:
        """The answer a review, a vote or a cascade's fit may read and compare: the step's text when
        it answered, "" otherwise or when the text was made from a recorded label (``synthesised``:
        comparing two such texts would compare the labels)."""
        return self.answer if self.status in ANSWERED and not self.synthesised else ""

    @property
    def replaced(self) -> bool:
        """Whether the executor turned to another worker in place of the one the plan named (it
        answered, or the step was skipped then by the deadline or budget): its answer is not the
        named worker's own, which no fit may credit it with (``policies/routers.own_answer``)."""
        return len({a.worker for a in self.attempts}) > 1 or _fell_back(self.note)

    def __post_init__(self) -> None:
        if self.status not in STEP_STATUSES:
            raise ValueError(f"step status {self.status!r} is not one of {STEP_STATUSES}")


RoundDecision = Literal["plan", "continue", "keep", "stop"]


@dataclass
class RoundRecord:
    """One round of a request: what the policy saw, what it decided, what the round cost.

    Round 1 is the plan made from the request alone (``decision`` ``"plan"``). Each later round
    starts with a review: ``"continue"`` added the steps ``steps`` (indices into the trace's
    steps), ``"keep"`` kept the answer so far, ``"stop"`` means no review was possible (``reason``
    says why: budget or deadline spent, call cap reached, the policy failed or wrote an invalid
    continuation). ``seen`` is a digest (sha256, 16 hex) of the prompt the policy decided from (""
    for a policy without one; the text itself is not kept, as it holds the request's question),
    ``answers`` the extracted answers (at most 200 characters each) of the steps answered before
    the decision and ``agree`` whether they agree (None with fewer than two)."""

    index: int
    decision: RoundDecision
    steps: list[int] = field(default_factory=list)
    reason: str = ""
    plan_text: str = ""
    seen: str = ""
    answers: list[str | None] = field(default_factory=list)
    agree: bool | None = None
    cost_usd: float = 0.0
    latency_s: float = 0.0


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
    #: the deadline cut the Conductor's plan to its answering step before it ran
    plan_cut: bool = False
    notes: list[str] = field(default_factory=list)
    #: what the executor's budget was charged in all (equals ``cost_usd``; kept to check that)
    charged_usd: float = 0.0
    #: each round of a request that allowed more than one (empty for a one-round request)
    rounds: list[RoundRecord] = field(default_factory=list)

    @property
    def cost_usd(self) -> float:
        return sum(s.cost_usd for s in self.steps)

    @property
    def input_tokens(self) -> int:
        return sum(s.input_tokens for s in self.steps)

    @property
    def output_tokens(self) -> int:
        return sum(s.output_tokens for s in self.steps)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def calls(self) -> int:
        """Steps a worker answered, in every round."""
        return sum(1 for s in self.steps if s.status == "ok")

    @property
    def attempts(self) -> list[Attempt]:
        """Every call made to a worker, first tries and fallbacks alike, in every round."""
        return [a for s in self.steps for a in s.attempts]

    @property
    def rounds_run(self) -> int:
        """Rounds whose steps ran: 1, plus one per review that added steps."""
        return 1 + sum(1 for r in self.rounds if r.decision == "continue")

    @property
    def workers_called(self) -> list[str]:
        """Names of the workers that received the request, in call order (the audit trail)."""
        return [a.worker for a in self.attempts]

    @property
    def worker_fallbacks(self) -> int:
        """Steps where a worker failed and the executor turned to another in its place (called,
        or skipped then by the deadline or budget). Each such step records who was asked
        (``requested_worker``), who answered (``worker``), every attempt with its error, and
        ``fallback to NAME`` in its note. What evaluation's fallback rate and a response's
        ``worker_fallback`` both read."""
        return sum(1 for s in self.steps if s.replaced)

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


def _fell_back(note: str) -> bool:
    """Whether a step's note has the executor's own ``fallback to NAME`` part (a worker's error
    text, also in the note, starts with the worker's name and cannot pass for one)."""
    return any(part.startswith("fallback to ") for part in note.split("; "))
