"""Request limits and execution traces: the typed values between execute, grade and report.

``Limits`` validates itself, so every front door (CLI, pipeline, pyfunc, KServe, training) gets
the same rules from one place: a budget is a finite number above zero, ``max_tokens`` is at
least what the executor needs to start a call, and ``max_rounds`` is the one setting that
decides whether the policy may look at its workflow's answers and add steps (the executor, the
prompt and every front door read it). A :class:`StepRecord` keeps every attempt of its step, so
the money a trace reports is the money the budget was charged and the audit lists every worker
that saw the request; a :class:`RoundRecord` says what the policy saw and decided after each round.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from rl_conductor import validation

Sensitivity = Literal["public", "private"]
#: The values of :data:`Sensitivity` (the one list: the CLI, the request model and the wire use it).
SENSITIVITIES: tuple[str, ...] = get_args(Sensitivity)

#: A step whose call cannot afford this many output tokens is not started; ``Limits.max_tokens``
#: and a worker's ``max_output_tokens`` below it could never run a step.
MIN_OUTPUT_TOKENS = 64


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


@dataclass(frozen=True)
class Limits:
    """What a request allows, enforced by the executor whatever the policy wrote.

    Attributes:
        max_cost_usd: hard budget for all worker calls of the request (None = unlimited).
        max_latency_s: deadline for the request's critical path, in seconds (None = none): a
            step that cannot answer in the time left is skipped, its output is capped to what
            the time left affords, and an answer arriving after the deadline is dropped.
        allowed_workers: worker names that may be called (None = all).
        sensitivity: ``"private"`` keeps the request on ``hosting: self`` workers only.
        max_steps: most steps a workflow may run in one round.
        step_timeout_s: per-call timeout; a timed-out (or failed) call is replaced by a
            fallback worker of the same hosting class, else the step fails.
        max_tokens: max output tokens per worker call (at least ``MIN_OUTPUT_TOKENS``).
        temperature: worker sampling temperature (paper: 0.2).
        max_rounds: how many rounds the request allows (1 = plan once and run it). After each
            round but the last, the policy sees the workflow so far and its answers and either
            keeps the answer or adds at most ``max_steps`` steps, within the same budget,
            deadline, privacy rule and call cap.
        max_calls: most worker calls (attempts, fallbacks included) of the whole request across
            rounds (None = no cap beyond ``max_steps`` per round): a later round is cut to the
            steps the calls left afford, and no round starts when none are left.

    Raises:
        InvalidValue: (a ``ValueError``) for a value no request could mean, naming the field.
    """

    max_cost_usd: float | None = None
    allowed_workers: frozenset[str] | None = None
    sensitivity: Sensitivity = "public"
    max_steps: int = 5
    step_timeout_s: float = 120.0
    max_tokens: int = 4096
    temperature: float = 0.2
    max_latency_s: float | None = None
    max_rounds: int = 1
    max_calls: int | None = None

    def __post_init__(self) -> None:
        if self.max_cost_usd is not None:
            validation.positive_finite("max_cost_usd", self.max_cost_usd, validation.MAX_USD)
        if self.max_latency_s is not None:
            validation.positive_finite("max_latency_s", self.max_latency_s, validation.MAX_SECONDS)
        if self.allowed_workers is not None and not (
            isinstance(self.allowed_workers, frozenset)
            and all(isinstance(n, str) for n in self.allowed_workers)
        ):
            raise validation.InvalidValue(
                "allowed_workers", self.allowed_workers, "None or a frozenset of worker names"
            )
        if self.sensitivity not in SENSITIVITIES:
            raise validation.InvalidValue("sensitivity", self.sensitivity, "'public' or 'private'")
        validation.integer_at_least("max_steps", self.max_steps, 1)
        validation.positive_finite("step_timeout_s", self.step_timeout_s, validation.MAX_SECONDS)
        validation.integer_at_least("max_tokens", self.max_tokens, MIN_OUTPUT_TOKENS)
        validation.non_negative_finite("temperature", self.temperature)
        validation.integer_at_least("max_rounds", self.max_rounds, 1)
        if self.max_calls is not None:
            validation.integer_at_least("max_calls", self.max_calls, 1)

    def permits(self, name: str, hosting: str) -> bool:
        if self.allowed_workers is not None and name not in self.allowed_workers:
            return False
        return not (self.sensitivity == "private" and hosting != "self")


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
    requested_worker: str = ""
    attempts: list[Attempt] = field(default_factory=list)

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
        """Steps where a worker failed and another was called in its place. Each such step
        records who was asked (``requested_worker``), who answered (``worker``), every attempt
        with its error, and ``fallback to NAME`` in its note."""
        return sum(1 for s in self.steps if len({a.worker for a in s.attempts}) > 1)

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
