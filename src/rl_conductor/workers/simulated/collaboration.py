"""Collaboration in the simulated pool: what a step gains from the earlier steps it sees.

Why it exists: the paper's Conductor beats every single worker by composing them (planners →
implementer → verifier on code, a check on knowledge questions). Without a model of that, the
best plan on the simulated pool is always a single worker and a Conductor can only learn routing.

What a step gains depends on three things the executor really provides — the step's instruction,
the earlier answers the step sees, and which worker wrote each of them — never on the quality of
the instruction's wording:

* **Role** of a step, from keyword classes of its instruction (:func:`classify_role`): the
  left-most keyword (whole words, :data:`ROLE_KEYWORDS`) wins; an instruction with none is
  ``solve``. Roles: ``plan`` (plan, outline, strategy, approach, decompose, sketch, ...),
  ``verify`` (verify, check, review, critique, debug, test, validate, ...), ``aggregate``
  (aggregate, combine, compare, synthesize, merge, vote, ...) and ``solve`` (solve, answer,
  compute, implement, write, ... or nothing).
* **A plan step** writes an outline, not a solution: shorter text (``PLAN_LENGTH_FACTOR``) with
  **no final answer** — a plan as the last step, or alone, is graded wrong. Its quality on this
  item is ``q = σ(planner's latent / PLAN_SOFTNESS)`` (its skill, the item's difficulty, its
  specialism and the call's noise), so a worker strong in the domain writes better plans.
  A later non-plan step that sees plans gains up to ``PLAN_GAIN[d]`` on its latent, the best
  plan's quality first and each further plan a fraction ``EXTRA_PLAN`` of the rest
  (:func:`plan_bonus`; its own plan counts ``SELF_PLAN`` as much): more plans saturate.
* **A verify step** that sees earlier answers checks them: for an answer by another worker the
  evidence rule's penalty for a wrong answer is scaled by ``1 − v`` (it catches the error with
  strength ``v``) and the pull of a correct one by ``1 + v``, with ``v = VERIFY[d]``, times
  ``SELF_VERIFY`` for its own answers and halved for every verify step it already sees
  (re-checking saturates). A verify step that sees no answer is a plain solve.
* ``solve`` and ``aggregate`` steps keep the plain evidence rule (``aggregate`` is what MoA and
  the random baseline write, so those baselines keep their paper rows).

The gains differ by domain (:data:`PAPER_COLLABORATION`): most on code and hard reasoning, least
on knowledge questions, fitted so that the best fixed workflow of the candidate set in
:mod:`rl_conductor.evaluation.calibrate`, chosen on half of the calibration items and measured on the
other half (held out), reaches the paper's Conductor row per domain.

Who wrote a visible answer is known only for text this pool rendered in this process (an
:class:`AuthorRegistry` per pool, keyed by a digest of the text and the call that rendered it,
which the executor names for each visible answer); other text — recorded elsewhere, or from
another process — counts as another worker's ``solve`` answer. A visible answer's role is its
step's instruction's, as for the call itself. Deliberate simplification: the wording of an
instruction beyond its role keyword never matters; only live workers can reward better text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rl_conductor.tasks.base import DOMAINS
from rl_conductor.workers.simulated.answers import remember, text_digest

Role = Literal["plan", "solve", "verify", "aggregate"]

#: Keyword patterns per role (regular expressions, whole words, case-insensitive). The left-most
#: match in an instruction decides its role.
ROLE_KEYWORDS: dict[Role, tuple[str, ...]] = {
    "plan": (
        r"plan(?:s|ned|ning)?",
        r"outlines?",
        r"strateg(?:y|ies)",
        r"approach(?:es)?",
        r"decompos(?:e|ition)",
        r"break (?:it |this |the \w+ )?down",
        r"sketch",
    ),
    "verify": (
        r"verif(?:y|ies|ied|ication)",
        r"(?:double-)?check(?:s|ed|ing)?",
        r"review",
        r"critique",
        r"critici[sz]e",
        r"debug",
        r"test(?:s|ing)?",
        r"validat(?:e|ion)",
        r"proofread",
        r"find (?:the |any )?errors?",
    ),
    "aggregate": (
        r"aggregat(?:e|ion)",
        r"combin(?:e|ing)",
        r"compar(?:e|ing|ison)",
        r"synthesi[sz]e",
        r"merge",
        r"vote",
        r"consensus",
        r"select the best",
    ),
    "solve": (
        r"solv(?:e|es|ing)",
        r"answer",
        r"comput(?:e|ation)",
        r"calculat(?:e|ion)",
        r"implement",
        r"write",
        r"code",
        r"derive",
        r"prove",
    ),
}
_ROLE_PATTERN = re.compile(
    "|".join(
        f"(?P<{role}>" + "|".join(rf"\b{k}\b" for k in keys) + ")" for role, keys in ROLE_KEYWORDS.items()
    ),
    re.IGNORECASE,
)

#: Canonical instructions per role (what the calibration's candidate workflows use).
ROLE_INSTRUCTIONS: dict[Role, str] = {
    "plan": "Plan the approach: outline the key steps and pitfalls, without solving it.",
    "solve": "Solve the problem completely and give the final answer.",
    "verify": "Verify the answer above: check each step, fix any error, and give the final answer.",
    "aggregate": "Compare the candidate answers above and give the single best final answer.",
}


def classify_role(instruction: str) -> Role:
    """The role of a step from its instruction: the class of the left-most role keyword, or
    ``solve`` when there is none."""
    m = _ROLE_PATTERN.search(instruction or "")
    if m is None or m.lastgroup is None:
        return "solve"
    role: Role = m.lastgroup  # type: ignore[assignment]
    return role


@dataclass(frozen=True)
class Collaboration:
    """Per-domain collaboration strengths (latent units, see the module docstring).

    Attributes:
        plan_gain: most a step gains from plans it sees, per domain.
        verify: ``v``, how much of a wrong visible answer's pull a verifier removes (and how much
            it strengthens a correct one's), per domain, in [0, 1].
    """

    plan_gain: dict[str, float] = field(default_factory=dict)
    verify: dict[str, float] = field(default_factory=dict)
    enabled: bool = True

    def __post_init__(self) -> None:
        for name, table in (("plan_gain", self.plan_gain), ("verify", self.verify)):
            unknown = set(table) - set(DOMAINS)
            if unknown:
                raise ValueError(f"collaboration {name}: unknown domains {sorted(unknown)}")
            for d, v in table.items():
                if not math.isfinite(v) or v < 0:
                    raise ValueError(f"collaboration {name}[{d}] must be a finite number >= 0, got {v!r}")
        bad = {d: v for d, v in self.verify.items() if v > 1}
        if bad:
            raise ValueError(f"collaboration verify must be <= 1, got {bad}")

    def plan_gain_for(self, domain: str) -> float:
        return self.plan_gain.get(domain, 0.0) if self.enabled else 0.0

    def verify_for(self, domain: str) -> float:
        return self.verify.get(domain, 0.0) if self.enabled else 0.0

    @classmethod
    def from_option(cls, value: Any) -> Collaboration:
        """The pool option ``collaboration``: ``"paper"`` (default: the fitted strengths),
        ``"off"`` (no collaboration: roles are ignored, as before issue 9) or a mapping with
        ``plan_gain`` and/or ``verify`` per domain overriding the paper's."""
        if value is None or value == "paper":
            return PAPER_COLLABORATION
        if value == "off" or value is False:
            return OFF
        if isinstance(value, dict):
            unknown = set(value) - {"plan_gain", "verify"}
            if unknown:
                raise ValueError(f"collaboration: unknown keys {sorted(unknown)} (plan_gain, verify)")
            return replace(
                PAPER_COLLABORATION,
                plan_gain={**PAPER_COLLABORATION.plan_gain, **_floats(value.get("plan_gain", {}))},
                verify={**PAPER_COLLABORATION.verify, **_floats(value.get("verify", {}))},
            )
        raise ValueError(f"collaboration must be 'paper', 'off' or a mapping, got {value!r}")


def _floats(table: Any) -> dict[str, float]:
    if not isinstance(table, dict):
        raise ValueError(f"collaboration: expected a mapping domain -> number, got {table!r}")
    return {str(k): float(v) for k, v in table.items()}


#: A plan is an outline: its length relative to the worker's solution length.
PLAN_LENGTH_FACTOR = 0.5
#: Softness of a plan's quality in the planner's latent (larger: quality depends less on the item).
PLAN_SOFTNESS = 1.0
#: A worker's own plan helps it this much less (it knew it already).
SELF_PLAN = 0.5
#: What a second (third, ...) plan adds, relative to the first.
EXTRA_PLAN = 0.3
#: A worker checking its own answer catches this fraction of what another worker would.
SELF_VERIFY = 0.25
#: Each verify step a verifier already sees halves its own strength.
VERIFY_DECAY = 0.5

#: Fitted on 2026-12-01 with ``python -m rl_conductor.evaluation.calibrate --fit-collaboration`` on
#: ``paper-mix`` (seed 0, 2,000 calibration items; ``FIT_SHAPE`` there; scales math 0.4694,
#: knowledge 0.1279 (verify only), reasoning 0.2816, code 0.8749; 15 full candidate passes, 13 min
#: on two busy cores) to the **held-out** target: the best candidate workflow chosen on one half of
#: the items and measured on the other (``held_out_accuracy``) reaches the paper's Conductor row
#: (Table 7, a test figure) — math 89.40, knowledge 94.00, reasoning 42.80, code 64.05 vs 89.33 /
#: 93.14 / 42.63 / 64.29. Knowledge's held-out jumps between 92.0 and 94.0 with the scale (which
#: workflow a half picks flips), so it lands 0.86 above. The previous fit (math 0.44, knowledge
#: 0.1, reasoning 0.11, code 0.79) targeted the in-sample best, which selection among 128
#: candidates inflates: its held-out row was 88.80 / 92.00 / 40.60 / 63.10.
PAPER_COLLABORATION = Collaboration(
    plan_gain={"math": 0.4694, "knowledge": 0.0, "reasoning": 0.2816, "code": 0.8749},
    verify={"math": 0.2347, "knowledge": 0.064, "reasoning": 0.1408, "code": 0.4375},
)
OFF = Collaboration(enabled=False)


# --------------------------------------------------------------------------- who wrote what


@dataclass(frozen=True)
class Authored:
    """What the simulation knows about a text it rendered."""

    task_id: str
    worker: str
    role: Role
    plan_quality: float = 0.0


#: Most renderings an author registry keeps (the older half goes first, see
#: ``answers.evict_oldest``).
_AUTHORED_MAX = 500_000


@dataclass
class AuthorRegistry:
    """What the simulation knows of the texts one pool rendered, by the call that rendered them.

    Keyed by (text digest, task id, worker, step index), not by the text alone: one text is
    rendered by several calls (a worker's solve and verify answers at one step index are the same
    draws; a short cut text recurs across items and workers), and a registry keyed by the text
    kept whichever came last — an order that asyncio's scheduling of threaded code grades and the
    candidate table's forked chunks change, so the table differed between builds.

    One registry per pool (:meth:`SimulatedWorker.join_pool`), not per process: two pools with
    the same seed and worker names but other accuracy targets render the same text for the same
    call with another plan quality, and a shared registry let whichever pool ran last decide the
    other's outcomes."""

    entries: dict[tuple[bytes, str, str, int], Authored] = field(default_factory=dict)

    def remember(self, text: str, record: Authored, step_index: int) -> None:
        key = (text_digest(text), record.task_id, record.worker, step_index)
        remember(self.entries, key, record, _AUTHORED_MAX)  # not clear(): see answers.evict_oldest

    def author_of(self, text: str, task_id: str, worker: str, step_index: int) -> Authored | None:
        """The record of ``text`` as rendered by ``worker`` at ``step_index`` for ``task_id``
        (None if this pool did not render it in this process)."""
        return self.entries.get((text_digest(text), task_id, worker, step_index))


#: The registry of simulated workers built outside a pool file (tests, hand-built workers).
SHARED_AUTHORS = AuthorRegistry()


def plan_quality(latent: float) -> float:
    """Quality of a plan in (0, 1) from the planner's latent on the item."""
    return 1.0 / (1.0 + math.exp(-latent / PLAN_SOFTNESS))


def plan_bonus(collab: Collaboration, domain: str, worker: str, seen: list[Authored]) -> float:
    """Latent gain of a non-plan step from the plans it sees: ``PLAN_GAIN[d] · q_eff`` with
    ``q_eff = q₁ + (1 − q₁)·(1 − Π_{k≥2} (1 − EXTRA_PLAN·q_k))`` over the plans' qualities
    (best first, each times ``SELF_PLAN`` if the step's own worker wrote it): a second plan adds
    a little, a third less, and the sum never exceeds ``PLAN_GAIN[d]``."""
    gain = collab.plan_gain_for(domain)
    qs = sorted(
        (p.plan_quality * (SELF_PLAN if p.worker == worker else 1.0) for p in seen if p.role == "plan"),
        reverse=True,
    )
    if gain <= 0 or not qs:
        return 0.0
    miss = 1.0
    for q in qs[1:]:
        miss *= 1.0 - EXTRA_PLAN * q
    return gain * (qs[0] + (1.0 - qs[0]) * (1.0 - miss))


def verify_strength(
    collab: Collaboration, domain: str, worker: str, author: Authored | None, n_prior: int
) -> float:
    """``v`` for one visible answer checked by a verify step of ``worker``."""
    v = collab.verify_for(domain) * VERIFY_DECAY**n_prior
    if author is not None and author.worker == worker:
        v *= SELF_VERIFY
    return v
