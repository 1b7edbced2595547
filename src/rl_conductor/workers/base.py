"""The Worker protocol: one async call, plus the static facts the executor and the prompt need.

Live clients (OpenAI-compatible, Anthropic, Gemini, KServe v1/v2), the simulated paper pool and
the replay pool all implement it. ``context`` is optional and carries the structured call
information that offline workers need (the task and its gold answer, the earlier answers this
step sees); live workers ignore it and see only ``messages``.
"""

from __future__ import annotations

import abc
import asyncio
import math
import statistics
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, runtime_checkable

from rl_conductor.limits import MIN_OUTPUT_TOKENS
from rl_conductor.trace import estimate_tokens as estimate_tokens  # the workers' import
from rl_conductor.validation import integer_at_least, non_negative_finite, positive_finite

if TYPE_CHECKING:
    from rl_conductor.tasks.base import Task

Hosting = Literal["self", "external"]
Message = dict[str, str]


@dataclass(frozen=True)
class Completion:
    """What one worker call produced and what it cost."""

    text: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    latency_s: float
    worker: str = ""
    cached: bool = False
    #: why generation ended as the server said it: "stop", "length" (cut at max_tokens), "" unknown
    finish_reason: str = ""
    #: token counts are estimates (the server reported no usage), not the server's figures
    tokens_estimated: bool = False
    #: the text, or the final-answer line appended to it, was made from a recorded correctness
    #: label (a replay pool's label-only response, or a recorded text normalised to grade as its
    #: label): it grades as recorded, and nothing else may read it — comparing two such answers
    #: would compare the labels (:func:`rl_conductor.rounds.summarize`)
    synthesised: bool = False


class VisibleStep(NamedTuple):
    """Who wrote one answer a call sees: the worker that answered, its step's index (the nonce
    the executor gave that call) and the step's instruction."""

    worker: str
    index: int
    instruction: str


@dataclass(frozen=True)
class CallContext:
    """Structured facts about a call, for offline workers (simulated, replay).

    Attributes:
        task: the task being answered (simulated and replay workers read its id and gold answer).
        step_index: position of the step in the workflow.
        instruction: the step's subtask.
        visible_answers: the answers of the earlier steps this step sees, in order.
        visible_steps: who wrote each of them (:class:`VisibleStep`), aligned with
            ``visible_answers``; empty when the caller does not say (the simulated pool then
            treats them as text it did not render).
        nonce: distinguishes repeated calls of one worker on one item (self-consistency samples).
        sensitivity: the request's (``RequestLimits.sensitivity``); a ``"private"`` call is never
            written to a store other requests read (:mod:`rl_conductor.workers.cache`).
    """

    task: Task
    step_index: int = 0
    instruction: str = ""
    visible_answers: tuple[str, ...] = ()
    visible_steps: tuple[VisibleStep, ...] = ()
    nonce: int = 0
    sensitivity: str = "public"


@dataclass(frozen=True)
class WorkerInfo:
    """Static facts about a worker: identity, prices, hosting, a one-line description."""

    name: str
    price_in: float  # USD per 1M input tokens
    price_out: float  # USD per 1M output tokens
    hosting: Hosting
    description: str = ""
    kind: str = ""
    max_output_tokens: int = 4096
    #: typical output length, used for pre-flight cost estimates
    typical_output_tokens: int = 512
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)
    #: latency model (median time to first token, decode and prefill speed); None = unknown.
    #: The executor plans a request's ``max_latency_s`` with it (see :meth:`tokens_within`).
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    prefill_tokens_per_s: float | None = None
    #: spread of the output length, the standard deviation of its logarithm (lognormal; a pool
    #: file may state a measured one): how long a slow answer takes (:meth:`quantile_latency_s`),
    #: which a plan for a deadline must allow for
    output_tokens_spread: float = 0.5

    def __post_init__(self) -> None:
        # the executor never starts a call with fewer output tokens: such a worker could never answer
        integer_at_least(f"worker {self.name!r} max_output_tokens", self.max_output_tokens, MIN_OUTPUT_TOKENS)
        for name in ("price_in", "price_out"):
            non_negative_finite(f"worker {self.name!r} {name}", getattr(self, name))
        if self.ttft_s is not None:
            non_negative_finite(f"worker {self.name!r} ttft_s", self.ttft_s)
        for name in ("tokens_per_s", "prefill_tokens_per_s"):
            if getattr(self, name) is not None:
                positive_finite(f"worker {self.name!r} {name}", getattr(self, name))
        spread = self.output_tokens_spread
        if isinstance(spread, bool) or not isinstance(spread, int | float) or not 0 <= spread <= 3:
            raise ValueError(
                f"worker {self.name!r} output_tokens_spread must be a number in [0, 3] "
                f"(the log-scale spread of its answer length), got {spread!r}"
            )

    def estimate_latency_s(self, input_tokens: int, output_tokens: int) -> float | None:
        """Median seconds for a call of this size, from the latency model; None when unknown."""
        if self.ttft_s is None or self.tokens_per_s is None:
            return None
        prefill = input_tokens / self.prefill_tokens_per_s if self.prefill_tokens_per_s else 0.0
        return self.ttft_s + prefill + output_tokens / self.tokens_per_s

    def quantile_latency_s(self, input_tokens: int, output_tokens: int, quantile: float) -> float | None:
        """Seconds within which a call whose median output is ``output_tokens`` answers with
        probability ``quantile`` (the output length lognormal with ``output_tokens_spread``;
        first-token and decode times at their medians); None when the latency is unknown."""
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile!r}")
        z = statistics.NormalDist().inv_cdf(quantile)
        slow = round(output_tokens * math.exp(z * self.output_tokens_spread))
        return self.estimate_latency_s(input_tokens, slow)

    def tokens_within(self, seconds: float, input_tokens: int) -> int | None:
        """Output tokens a call can decode in ``seconds`` (median model); None when unknown."""
        fixed = self.estimate_latency_s(input_tokens, 0)
        if fixed is None or self.tokens_per_s is None:
            return None
        return max(0, int((seconds - fixed) * self.tokens_per_s))

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.price_in + output_tokens * self.price_out) / 1_000_000

    def input_token_bound(self, messages: Sequence[Message]) -> int:
        """At most how many input tokens a call of ``messages`` can be billed for (budget
        reservations): :func:`utf8_token_bound` for a server's tokenizer, or, for the kinds that
        count their own input with :func:`estimate_tokens` (fake, simulated, replay), the tighter
        :func:`estimate_token_bound`."""
        if self.kind in LOCALLY_COUNTED_KINDS:
            return estimate_token_bound(messages)
        return utf8_token_bound(messages)

    def price_tier(self) -> str:
        """Coarse price label shown to the Conductor ($, $$, $$$)."""
        blended = self.price_in + 3 * self.price_out
        if blended < 2.0:
            return "$"
        if blended < 20.0:
            return "$$"
        return "$$$"


@runtime_checkable
class Worker(Protocol):
    """Anything that answers chat messages and reports its usage."""

    info: WorkerInfo

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float,
        context: CallContext | None = None,
    ) -> Completion: ...


@dataclass(frozen=True)
class WorkerCall:
    """One call of :meth:`Worker.complete`, as a :class:`WorkerWrapper` sees and forwards it."""

    messages: Sequence[Message]
    max_tokens: int
    temperature: float
    context: CallContext | None = None


class CallWorker(abc.ABC):
    """The one :meth:`Worker.complete`: it bundles the call's arguments into a
    :class:`WorkerCall` and hands it to :meth:`call`, which each worker (simulated, replay, fake,
    live) and each :class:`WorkerWrapper` implements. Callers keep calling ``complete``."""

    info: WorkerInfo

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        temperature: float,
        context: CallContext | None = None,
    ) -> Completion:
        return await self.call(WorkerCall(messages, max_tokens, temperature, context))

    @abc.abstractmethod
    async def call(self, call: WorkerCall) -> Completion:
        """Answer ``call``."""


class WorkerWrapper(CallWorker):
    """A worker around another (``inner``) that adds one concern to its calls: the response
    cache, the predictor's metrics, its step events, the answering step's settings. Every other
    attribute (``info``, ``stats()``, ``breaker``, ``model``, ...) is the wrapped worker's, so
    wrappers stack in any order. A subclass overrides :meth:`call` and hands the call (changed or
    not) on with :meth:`forward`; this one passes it through."""

    inner: Worker

    def __init__(self, inner: Worker) -> None:
        self.inner = inner
        self.info = inner.info

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def call(self, call: WorkerCall) -> Completion:
        """This wrapper's concern around ``call``."""
        return await self.forward(call)

    async def forward(self, call: WorkerCall) -> Completion:
        """``call`` made on the wrapped worker."""
        return await self.inner.complete(
            call.messages, max_tokens=call.max_tokens, temperature=call.temperature, context=call.context
        )


def innermost(worker: Any) -> Any:
    """The worker beneath its wrappers (:class:`WorkerWrapper`'s ``inner``)."""
    for _ in range(16):
        inner = getattr(worker, "inner", None)
        if inner is None:
            return worker
        worker = inner
    return worker


#: Tokens a chat format may add per message (role markers, separators, the reply's priming):
#: OpenAI documents 3-4 per message plus 3, Anthropic and Gemini a few; 16 is a wide margin.
MESSAGE_OVERHEAD_TOKENS = 16
#: Worker kinds whose input tokens are :func:`estimate_tokens` of the text (counted here, not by
#: a server): their reservation may use :func:`estimate_token_bound`.
LOCALLY_COUNTED_KINDS = frozenset({"fake", "simulated", "replay"})
_ESTIMATE_CHARS_PER_TOKEN = 2.5


def utf8_token_bound(messages: Sequence[Message]) -> int:
    """An upper bound of the input tokens any byte-level tokenizer can make of ``messages``.

    A byte-level BPE (GPT, Claude, Llama, Qwen) starts from one token per UTF-8 byte and only
    merges, and a SentencePiece model with byte fallback (Gemini, Gemma) emits a piece per
    character or one per byte of it, so no text yields more tokens than it has UTF-8 bytes:
    3 per CJK character, 4 per emoji. Plus :data:`MESSAGE_OVERHEAD_TOKENS` per message for the
    chat format (a role joined to the system field costs its separator, well within that)."""
    return sum(len(m.get("content", "").encode("utf-8")) for m in messages) + MESSAGE_OVERHEAD_TOKENS * len(
        messages
    )


def estimate_token_bound(messages: Sequence[Message]) -> int:
    """An upper bound of :func:`estimate_tokens` summed over ``messages`` (characters / 2.5 + 16
    a message; ``estimate_tokens`` is characters / 4, rounded): only for workers that count
    their input with it (:data:`LOCALLY_COUNTED_KINDS`)."""
    chars = sum(len(m.get("content", "")) for m in messages)
    return math.ceil(chars / _ESTIMATE_CHARS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS * len(messages)


async def offline_completion(
    info: WorkerInfo,
    text: str,
    *,
    input_tokens: int,
    output_tokens: int,
    latency_s: float,
    latency_scale: float = 0.0,
    synthesised: bool = False,
) -> Completion:
    """The Completion of an offline worker (simulated, replay): priced from ``info``; the modelled
    latency is reported, and slept (scaled) only when ``latency_scale > 0``."""
    if latency_scale > 0:
        await asyncio.sleep(latency_s * latency_scale)
    return Completion(
        text=text,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=info.cost(input_tokens, output_tokens),
        latency_s=latency_s,
        worker=info.name,
        synthesised=synthesised,
    )


#: Where a worker notes what its unanswered attempts may still be billed (USD each): a request
#: that timed out was sent, and the vendor may bill it although no answer came back. The executor
#: sets a list here around each call (the call's task shares it) and charges what is noted on top
#: of the call's own cost, whether the call then answers, fails or is cut by the step timeout.
UNANSWERED_BILLS: ContextVar[list[float] | None] = ContextVar("conductor_unanswered_bills", default=None)


def note_unanswered_bill(usd: float) -> None:
    """Note an attempt that got no answer but may be billed (no-op outside an executor call)."""
    bills = UNANSWERED_BILLS.get()
    if bills is not None:
        bills.append(usd)


#: Where the executor lets a worker reserve one more attempt's worst case (USD) against the
#: request's budget, before a retry that follows an attempt charged its own worst case (timed out,
#: stream cut): True when it fits and is now held for the call, False when the retry must not be
#: sent. Set around each executor call; a call outside an executor has no request budget.
RETRY_ALLOWANCE: ContextVar[Callable[[float], bool] | None] = ContextVar(
    "conductor_retry_allowance", default=None
)


def reserve_retry(usd: float) -> bool:
    """Hold ``usd`` of the request's budget for a retry (True outside an executor call)."""
    allow = RETRY_ALLOWANCE.get()
    return True if allow is None else allow(usd)


@dataclass
class TokenSink:
    """Where the call that answers a streaming request sends its text as the worker produces it.

    Set in :data:`STREAM_SINK` around that one call (the serving layer does, for the final step of
    a ``stream: true`` request). A worker whose API streams passes each text delta to
    :meth:`delta`; one that does not ignores the sink and the answer is sent whole when the step
    ends. Once a delta has been forwarded the text cannot be taken back, so a failure after it is
    reported with :meth:`broken` (the client gets an error event) instead of being retried, and
    the sink forwards nothing more (a fallback's text would not continue the same answer).
    """

    on_delta: Callable[[str], None]
    on_broken: Callable[[str], None]
    #: deltas forwarded so far
    sent: int = 0
    closed: bool = False
    #: why the stream broke ("" while it has not)
    reason: str = ""
    #: the client left before the stream broke or ended (:meth:`abandon`)
    abandoned: bool = False

    def delta(self, text: str) -> None:
        if text and not self.closed:
            self.sent += 1
            self.on_delta(text)

    def broken(self, why: str) -> None:
        if not self.closed:
            self.closed, self.reason = True, why
            self.on_broken(why)

    def abandon(self) -> None:
        """The client left: nothing more is forwarded, and a failure after this is not the
        stream's (the request is cancelled because nobody reads it, not because it broke)."""
        if not self.closed:
            self.closed, self.abandoned = True, True


#: The :class:`TokenSink` of the call running in this context (None: the call answers whole).
STREAM_SINK: ContextVar[TokenSink | None] = ContextVar("conductor_stream_sink", default=None)


class WorkerError(RuntimeError):
    """A worker failed (HTTP error, timeout, garbage) after its retries."""


class RetryRefusedError(WorkerError):
    """A retry was not sent: its worst case does not fit what the request's budget (``by ==
    "request"``, :data:`RETRY_ALLOWANCE`) or the pool's ``max_usd`` (``by == "pool"``) has left,
    after the attempts before it were charged theirs."""

    def __init__(self, message: str, *, by: str) -> None:
        super().__init__(message)
        self.by = by
