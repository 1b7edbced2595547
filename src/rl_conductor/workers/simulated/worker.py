"""The simulated worker: profiles (lengths, latency), one call's outcome, tokens and cost.

See the package docstring (``rl_conductor.workers.simulated``) for the model.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rl_conductor.tasks.base import DOMAINS, Task
from rl_conductor.workers.base import (
    CallContext,
    CallWorker,
    Completion,
    VisibleStep,
    WorkerCall,
    WorkerInfo,
    estimate_tokens,
    innermost,
    offline_completion,
)
from rl_conductor.workers.kinds import PoolConfigError, info_from_spec, register_kind
from rl_conductor.workers.simulated.answers import (
    NO_ANSWER,
    NOT_RENDERED,
    PLACEHOLDER,
    grade_cached_async,
    render_answer,
    simulated_value,
)
from rl_conductor.workers.simulated.collaboration import (
    PAPER_COLLABORATION,
    PLAN_LENGTH_FACTOR,
    SHARED_AUTHORS,
    Authored,
    AuthorRegistry,
    Collaboration,
    Role,
    classify_role,
    plan_bonus,
    plan_quality,
    verify_strength,
)
from rl_conductor.workers.simulated.draws import normal, seeded_rng, unit
from rl_conductor.workers.simulated.skill import (
    DEFAULT_CALIBRATION,
    DEFAULT_CALIBRATION_N,
    SimulationModel,
    paper_targets,
    shared_model,
)

if TYPE_CHECKING:  # a kind never imports the pool module that loads it (workers/kinds.py)
    from rl_conductor.workers.pool import Pool

EVIDENCE_CORRECT = 0.8
EVIDENCE_WRONG = 0.9
LENGTH_SIGMA = 0.45
MAX_SIM_OUTPUT_TOKENS = 4000


@dataclass(frozen=True)
class WorkerProfile:
    """Behavioural numbers of one simulated worker (everything but prices and accuracy targets).

    Attributes:
        output_tokens: median output tokens per domain (lognormal, sigma ``LENGTH_SIGMA``).
        ttft_s: median time to first token.
        tokens_per_s: median decode speed.
        prefill_tokens_per_s: input tokens processed per second.
        feature_weight: λ, how much the visible difficulty features hurt this worker.
    """

    output_tokens: dict[str, int]
    ttft_s: float
    tokens_per_s: float
    prefill_tokens_per_s: float = 8000.0
    feature_weight: float = 1.0

    def mean_output_tokens(self) -> int:
        mean = statistics.fmean(self.output_tokens.values())
        return round(mean * math.exp(LENGTH_SIGMA**2 / 2))


def _lengths(math_: int, knowledge: int, reasoning: int, code: int) -> dict[str, int]:
    return {"math": math_, "knowledge": knowledge, "reasoning": reasoning, "code": code}


#: Built-in profiles of the paper's workers (constrained setting: minimal reasoning for the closed
#: models, full thinking for the two open reasoning models). A pool entry may override any field.
PROFILES: dict[str, WorkerProfile] = {
    "gpt-5": WorkerProfile(_lengths(480, 170, 430, 750), ttft_s=0.9, tokens_per_s=90, feature_weight=0.85),
    "claude-sonnet-4": WorkerProfile(
        _lengths(500, 180, 440, 760), ttft_s=1.1, tokens_per_s=60, feature_weight=0.95
    ),
    "gemini-2.5-pro": WorkerProfile(
        _lengths(540, 200, 470, 800), ttft_s=1.6, tokens_per_s=110, feature_weight=0.9
    ),
    "deepseek-r1-distill-qwen-32b": WorkerProfile(
        _lengths(1700, 700, 1800, 2300), ttft_s=0.35, tokens_per_s=38, feature_weight=1.05
    ),
    "gemma-3-27b-it": WorkerProfile(
        _lengths(380, 140, 320, 450), ttft_s=0.3, tokens_per_s=45, feature_weight=1.3
    ),
    "qwen3-32b": WorkerProfile(_lengths(450, 170, 400, 550), ttft_s=0.3, tokens_per_s=40, feature_weight=1.1),
    "qwen3-32b-thinking": WorkerProfile(
        _lengths(1500, 650, 1600, 2100), ttft_s=0.35, tokens_per_s=40, feature_weight=1.0
    ),
}
_GENERIC_PROFILE = WorkerProfile(_lengths(500, 180, 450, 700), ttft_s=0.5, tokens_per_s=50)

# --------------------------------------------------------------------------- the worker


@dataclass
class SimulatedWorker(CallWorker):
    """One simulated worker: static facts, behaviour profile, accuracy targets, shared model.

    Attributes:
        latency_scale: 0 reports latency without sleeping; > 0 sleeps ``latency_s * scale``.
        collaboration: plan and verify strengths per domain (:mod:`.collaboration`).
        authors: who rendered which text, shared by the simulated workers of one pool
            (:meth:`join_pool`).
    """

    info: WorkerInfo
    profile: WorkerProfile
    targets: dict[str, float]
    model: SimulationModel
    latency_scale: float = 0.0
    collaboration: Collaboration = PAPER_COLLABORATION
    authors: AuthorRegistry = field(default_factory=lambda: SHARED_AUTHORS, repr=False, compare=False)

    def join_pool(self, pool: Pool) -> None:
        """Share one :class:`AuthorRegistry` with the pool's other simulated workers (called by
        ``build_pool`` for each worker in order, through any wrappers): the first one starts a
        fresh registry. A :class:`Pool` assembled by hand from the workers of several loaded
        pools keeps their registries apart, so a step does not see who wrote an answer rendered
        by a worker of the other pool (it reads as another process's text)."""
        inner = (innermost(w) for w in pool.workers)
        first = next((w for w in inner if isinstance(w, SimulatedWorker)), self)
        self.authors = AuthorRegistry() if first is self else first.authors

    @property
    def seed(self) -> int:
        return self.model.seed

    def skill(self, domain: str) -> float:
        return self.model.skill(self.info.name, domain, self._target(domain), self.profile.feature_weight)

    def _target(self, domain: str) -> float:
        if domain not in self.targets:
            raise ValueError(
                f"simulated worker {self.info.name!r} has no accuracy target for domain {domain!r}"
            )
        return self.targets[domain]

    def margin(self, task: Task) -> float:
        """skill − difficulty + persistent effects for this worker on ``task`` (logit scale)."""
        return self.model.margin(self.info.name, task, self._target(task.domain), self.profile.feature_weight)

    def _authors(
        self, task: Task, visible: Sequence[str], steps: Sequence[VisibleStep]
    ) -> list[Authored | None]:
        """What the simulation knows of each visible answer's rendering (None: text it did not
        render for that call, or a caller that did not say who wrote it). The role is the visible
        step's instruction's: the same text is one worker's solve answer in one workflow and its
        verify answer in another."""
        if len(steps) != len(visible):
            return [None] * len(visible)
        out: list[Authored | None] = []
        for text, step in zip(visible, steps, strict=True):
            rec = self.authors.author_of(text, task.id, step.worker, step.index) if text else None
            if rec is not None and self.collaboration.enabled:
                role = classify_role(step.instruction)
                rec = rec if rec.role == role else replace(rec, role=role)
            out.append(rec)
        return out

    async def _evidence(
        self, task: Task, visible: Sequence[str], steps: Sequence[VisibleStep], role: Role
    ) -> tuple[float, str | None, float]:
        """(latent shift, most common visible wrong answer value, its weight) from the earlier
        answers a call sees: the evidence rule, plus the plan and verify effects of
        :mod:`.collaboration` (``role`` is this call's role)."""
        from rl_conductor.tasks.graders import extract_answer

        name, domain = self.info.name, task.domain
        authors = self._authors(task, visible, steps)
        known = [a for a in authors if a is not None]
        shift = 0.0
        if role != "plan":
            shift += plan_bonus(self.collaboration, domain, name, known)
        n_prior = sum(a.role == "verify" for a in known)
        pull_right = 0.0
        wrong: dict[str, float] = {}
        for text, author in zip(visible, authors, strict=True):
            if not text or not text.strip() or (author is not None and author.role == "plan"):
                continue  # a plan carries no answer
            v = (
                verify_strength(self.collaboration, domain, name, author, n_prior)
                if role == "verify"
                else 0.0
            )
            if await grade_cached_async(task, text):
                pull_right += 1.0 + v
                continue
            value = simulated_value(text)
            ans = extract_answer(task, text) if value is NOT_RENDERED else value
            if isinstance(ans, str) and ans.strip():
                wrong[ans.strip()] = wrong.get(ans.strip(), 0.0) + (1.0 - v)
        top, k_wrong = max(wrong.items(), key=lambda kv: kv[1]) if wrong else (None, 0.0)
        return shift + EVIDENCE_CORRECT * pull_right - EVIDENCE_WRONG * k_wrong, top, k_wrong

    def draw_length(self, domain: str, *parts: object) -> int:
        median = self.profile.output_tokens.get(domain, _GENERIC_PROFILE.output_tokens["reasoning"])
        n = median * math.exp(LENGTH_SIGMA * normal(self.seed, "len", self.info.name, *parts))
        return int(max(16, min(MAX_SIM_OUTPUT_TOKENS, round(n))))

    def draw_latency(self, input_tokens: int, output_tokens: int, *parts: object) -> float:
        p = self.profile
        ttft = p.ttft_s * math.exp(0.25 * normal(self.seed, "ttft", self.info.name, *parts))
        decode = (
            output_tokens / p.tokens_per_s * math.exp(0.15 * normal(self.seed, "tps", self.info.name, *parts))
        )
        return round(ttft + decode + input_tokens / p.prefill_tokens_per_s, 4)

    def latent(self, task: Task, ctx: CallContext) -> float:
        """The call's latent before evidence: margin + call noise."""
        return self.margin(task) + self.model.call_noise(self.info.name, task, ctx.nonce, ctx.step_index)

    async def answer(self, task: Task, ctx: CallContext) -> tuple[str | None, bool]:
        """(answer value, correct?) for one call, before length and truncation. A plan step
        (see :mod:`.collaboration`) gives no answer: ``(None, False)``."""
        name = self.info.name
        role = classify_role(ctx.instruction) if self.collaboration.enabled else "solve"
        if role == "plan":
            return None, False
        shift, top_wrong, k_wrong = (0.0, None, 0.0)
        if ctx.visible_answers:
            shift, top_wrong, k_wrong = await self._evidence(
                task, ctx.visible_answers, ctx.visible_steps, role
            )
        latent = self.latent(task, ctx) + shift
        if latent > 0:
            return task.answer, True
        key = (name, ctx.nonce, ctx.step_index)
        if top_wrong is not None and unit(self.seed, "adopt", task.id, *key) < k_wrong / (k_wrong + 1):
            probe = render_answer(task, top_wrong, 8, seeded_rng(self.seed, "render-check", task.id))
            if not await grade_cached_async(task, probe):  # re-rendered, it must still grade wrong
                return top_wrong, False
        return await self.model.pick_wrong(task, *key), False

    async def call(self, call: WorkerCall) -> Completion:
        """Answer one call (see the package docstring); ``temperature`` is ignored."""
        messages, max_tokens, context = call.messages, call.max_tokens, call.context
        input_tokens = sum(estimate_tokens(m.get("content", "")) for m in messages)
        value: str | None
        role: Role = "solve"
        if context is None or not context.task.answer.strip():
            joined = "\x1f".join(m.get("content", "") for m in messages)
            digest = hashlib.blake2b(joined.encode(), digest_size=8).hexdigest()
            ctx = CallContext(task=Task(f"adhoc/{digest}", "", "", "reasoning", "", "qa"))
            value = PLACEHOLDER
        else:
            ctx = context
            if self.collaboration.enabled:
                role = classify_role(ctx.instruction)
            value, _ = await self.answer(ctx.task, ctx)
            if value is None and role != "plan":  # no verified wrong answer exists: it gives up
                value = NO_ANSWER
        task = ctx.task
        parts = (task.id, ctx.nonce, ctx.step_index)
        want = self.draw_length(task.domain, *parts)
        if role == "plan":  # an outline: shorter, and no final answer
            want = max(16, round(want * PLAN_LENGTH_FACTOR))
        cap = max(1, max_tokens)
        if want > cap:  # the answer does not fit: cut before the final answer
            want, value = cap, None
        text = render_answer(task, value, want, seeded_rng(self.seed, "text", self.info.name, *parts))
        output_tokens = estimate_tokens(text)
        if output_tokens > cap:  # a long final block (code) under a tight cap: cut it too
            text = text[: cap * 4]
            output_tokens = min(cap, estimate_tokens(text))
        if context is not None and task.answer.strip():
            # the call's plan quality whatever its role: its text may be read as a plan when a
            # plan step of the same call renders the same text (a cut answer is filler only)
            quality = plan_quality(self.latent(task, ctx)) if self.collaboration.enabled else 0.0
            self.authors.remember(text, Authored(task.id, self.info.name, role, quality), ctx.step_index)
        latency = self.draw_latency(input_tokens, output_tokens, *parts)
        return await offline_completion(
            self.info,
            text,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            latency_s=latency,
            latency_scale=self.latency_scale,
        )


def _profile_from_spec(spec: dict[str, Any]) -> WorkerProfile:
    base = PROFILES.get(str(spec["name"]), _GENERIC_PROFILE)
    over: dict[str, Any] = {}
    if isinstance(spec.get("output_tokens"), dict):
        over["output_tokens"] = {
            **base.output_tokens,
            **{k: int(v) for k, v in spec["output_tokens"].items()},
        }
    for k in ("ttft_s", "tokens_per_s", "prefill_tokens_per_s", "feature_weight"):
        if k in spec:
            over[k] = float(spec[k])
    return replace(base, **over) if over else base


def _targets_from_spec(spec: dict[str, Any]) -> dict[str, float]:
    name = str(spec["name"])
    acc = spec.get("accuracy")
    if isinstance(acc, dict):
        out = {str(k): float(v) / (100.0 if float(v) > 1.0 else 1.0) for k, v in acc.items()}
    elif name in paper_targets():
        out = dict(paper_targets()[name])
    else:
        raise PoolConfigError(
            f"simulated worker {name!r} is not one of the paper's workers {sorted(paper_targets())}: "
            "give it `accuracy: {math: .., knowledge: .., reasoning: .., code: ..}`"
        )
    unknown = set(out) - set(DOMAINS)
    if unknown:
        raise PoolConfigError(f"simulated worker {name!r}: unknown domains in accuracy: {sorted(unknown)}")
    return out


@register_kind("simulated")
def build_simulated(spec: dict[str, Any], options: dict[str, Any]) -> SimulatedWorker:
    """Builder for ``kind: simulated``.

    Pool options: ``seed`` (0), ``latency_scale`` (0), ``calibration`` (``"paper-mix:all"`` or a
    list of Tasks), ``calibration_n`` (2000) and ``collaboration`` (``"paper"``, ``"off"`` or
    per-domain ``plan_gain`` / ``verify`` overrides, see :mod:`.collaboration`). Worker entries
    may override the profile (``output_tokens``, ``ttft_s``, ``tokens_per_s``,
    ``feature_weight``) and give ``accuracy`` per domain (required for workers that are not in
    the paper).
    """
    seed = int(options.get("seed", 0))
    scale = float(options.get("latency_scale", 0.0))
    if scale < 0:
        raise PoolConfigError("latency_scale must be >= 0")
    try:
        collaboration = Collaboration.from_option(options.get("collaboration", "paper"))
    except ValueError as exc:
        raise PoolConfigError(f"simulated pool: {exc}") from None
    profile = _profile_from_spec(spec)
    info = info_from_spec(spec)
    if "typical_output_tokens" not in spec:
        info = replace(info, typical_output_tokens=profile.mean_output_tokens())
    # the executor plans deadlines with the profile's medians (draws scatter around them)
    info = replace(
        info,
        ttft_s=profile.ttft_s,
        tokens_per_s=profile.tokens_per_s,
        prefill_tokens_per_s=profile.prefill_tokens_per_s,
        output_tokens_spread=LENGTH_SIGMA,
    )
    return SimulatedWorker(
        info=info,
        profile=profile,
        targets=_targets_from_spec(spec),
        model=shared_model(
            seed,
            options.get("calibration", DEFAULT_CALIBRATION),
            int(options.get("calibration_n", DEFAULT_CALIBRATION_N)),
        ),
        latency_scale=scale,
        collaboration=collaboration,
    )
