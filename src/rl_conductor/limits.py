"""The limits a request states, checked once for every front door.

``RequestLimits`` validates itself, so every front door (CLI, pipeline, pyfunc, KServe, training)
gets the same rules from one place: a budget is a finite number above zero, ``max_tokens`` is at
least what the executor needs to start a call, and ``max_rounds`` is the one setting that decides
whether the policy may look at its workflow's answers and add steps (the executor, the prompt and
every front door read it). The caps of every request (``MAX_USD``, ``MAX_STEPS``, ...) are
defined here once and read by every front door. It sits below ``trace`` and ``workers`` because
both read its constants, and it depends only on ``validation``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from rl_conductor import validation

Sensitivity = Literal["public", "private"]
#: The values of :data:`Sensitivity` (the one list: the CLI, the request model and the wire use it).
SENSITIVITIES: tuple[str, ...] = get_args(Sensitivity)
#: How an error message names the allowed values (``'public' or 'private'``), built from the list.
SENSITIVITY_CHOICES = " or ".join(repr(s) for s in SENSITIVITIES)

# The caps of every request: the one definition. ``RequestLimits`` enforces them, and the request
# model (``serving.request``), the wire schemas (``serving.schemas``), the server's and the CLI's
# options and the training config read them, so no front door accepts what another refuses.
#: Largest budget (USD) and duration (seconds) one request, one question of an evaluation or one
#: step may state. A day or $10,000 per question is a client bug, not a limit; both stay far below
#: where products with token counts or rates overflow a float.
MAX_USD = 10_000.0
MAX_SECONDS = 3_600.0
#: Most steps one round of a workflow may run, rounds one request may use, and worker calls one
#: request may make over all its rounds: more is a client bug, not a request.
MAX_STEPS = 10
MAX_ROUNDS = 5
MAX_CALLS = 50
#: The steps a workflow may run in one round when nothing says otherwise (the paper's 5).
DEFAULT_MAX_STEPS = 5

#: A step whose call cannot afford this many output tokens is not started; ``RequestLimits.max_tokens``
#: and a worker's ``max_output_tokens`` below it could never run a step.
MIN_OUTPUT_TOKENS = 64


@dataclass(frozen=True)
class RequestLimits:
    """What a request allows, enforced by the executor whatever the policy wrote.

    Attributes:
        max_cost_usd: hard budget for all worker calls of the request (None = unlimited).
        max_latency_s: deadline for the request's critical path, in seconds (None = none): a
            step that cannot answer in the time left is skipped, its output is capped to what
            the time left affords, and an answer arriving after the deadline is dropped.
        allowed_workers: worker names that may be called (None = all).
        sensitivity: ``"private"`` keeps the request on ``hosting: self`` workers only.
        max_steps: most steps a workflow may run in one round (at most ``MAX_STEPS``).
        step_timeout_s: per-call timeout; a timed-out (or failed) call is replaced by a
            fallback worker of the same hosting class, else the step fails.
        max_tokens: max output tokens per worker call (at least ``MIN_OUTPUT_TOKENS``).
        temperature: worker sampling temperature (paper: 0.2).
        max_rounds: how many rounds the request allows (1 = plan once and run it; at most
            ``MAX_ROUNDS``). After each round but the last, the policy sees the workflow so far
            and its answers and either keeps the answer or adds at most ``max_steps`` steps,
            within the same budget, deadline, privacy rule and call cap.
        max_calls: most worker calls (attempts, fallbacks included) of the whole request across
            rounds (None = no cap beyond ``max_steps`` per round; at most ``MAX_CALLS``): a later
            round is cut to the steps the calls left afford, and no round starts when none are
            left.

    Raises:
        InvalidValue: (a ``ValueError``) for a value no request could mean, naming the field.
    """

    max_cost_usd: float | None = None
    allowed_workers: frozenset[str] | None = None
    sensitivity: Sensitivity = "public"
    max_steps: int = DEFAULT_MAX_STEPS
    step_timeout_s: float = 120.0
    max_tokens: int = 4096
    temperature: float = 0.2
    max_latency_s: float | None = None
    max_rounds: int = 1
    max_calls: int | None = None

    def __post_init__(self) -> None:
        if self.max_cost_usd is not None:
            validation.positive_finite("max_cost_usd", self.max_cost_usd, MAX_USD)
        if self.max_latency_s is not None:
            validation.positive_finite("max_latency_s", self.max_latency_s, MAX_SECONDS)
        if self.allowed_workers is not None and not (
            isinstance(self.allowed_workers, frozenset)
            and all(isinstance(n, str) for n in self.allowed_workers)
        ):
            raise validation.InvalidValue(
                "allowed_workers", self.allowed_workers, "None or a frozenset of worker names"
            )
        if self.sensitivity not in SENSITIVITIES:
            raise validation.InvalidValue("sensitivity", self.sensitivity, SENSITIVITY_CHOICES)
        validation.integer_at_least("max_steps", self.max_steps, 1, MAX_STEPS)
        validation.positive_finite("step_timeout_s", self.step_timeout_s, MAX_SECONDS)
        validation.integer_at_least("max_tokens", self.max_tokens, MIN_OUTPUT_TOKENS)
        validation.non_negative_finite("temperature", self.temperature)
        validation.integer_at_least("max_rounds", self.max_rounds, 1, MAX_ROUNDS)
        if self.max_calls is not None:
            validation.integer_at_least("max_calls", self.max_calls, 1, MAX_CALLS)

    def permits(self, name: str, hosting: str) -> bool:
        if self.allowed_workers is not None and name not in self.allowed_workers:
            return False
        return not (self.sensitivity == "private" and hosting != "self")
