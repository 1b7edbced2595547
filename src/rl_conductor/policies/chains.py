"""Chain workflows over worker names: the candidates the warm start scores and the one-worker
plan of the evidence rule.

A :class:`Candidate` names its workers, not a view's ordinal ids, so one candidate applies to
every view that holds its workers (:meth:`Candidate.workflow` remaps the ids). It sits in the
policies layer because a policy (``evidence-rule``) plans with it; the training code that scores
candidates (:mod:`rl_conductor.training.candidates`) builds on it from above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rl_conductor.workflow import Step, Workflow

#: Short role instructions (short: the tiny Conductor writes them token by token). Each names
#: its role with the usual word (plan / solve / verify) so that workers that read roles can.
ROLE_TEXT: dict[str, str] = {
    "plan": "Plan the approach; do not solve.",
    "solve": "Solve it; give the final answer.",
    "verify": "Verify the answer above; fix errors.",
}


@dataclass(frozen=True)
class Candidate:
    """A chain workflow over worker *names*: ``steps`` = ((worker, role), ...)."""

    steps: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        return ">".join(f"{role}:{w}" for w, role in self.steps)

    @property
    def workers(self) -> frozenset[str]:
        return frozenset(w for w, _ in self.steps)

    @property
    def shape(self) -> str:
        return "".join(role[0].upper() for _, role in self.steps)

    def workflow(self, names: Sequence[str]) -> Workflow:
        """The workflow for a view whose ordinal ids name ``names`` (ids remapped)."""
        try:
            ids = [list(names).index(w) for w, _ in self.steps]
        except ValueError:
            raise ValueError(f"candidate {self.name} uses a worker outside the view {list(names)}") from None
        return Workflow(
            steps=tuple(
                Step(worker=j, instruction=ROLE_TEXT[role], access=() if i == 0 else "all")
                for i, (j, (_, role)) in enumerate(zip(ids, self.steps, strict=True))
            )
        )

    @classmethod
    def parse_name(cls, name: str) -> Candidate:
        """The candidate named ``name`` (:attr:`name`; ``solve:a|solve:b`` is a parallel pair)."""
        if "|" in name:
            parts = [p.partition(":") for p in name.split("|")]
            if len(parts) != 2 or any(role != "solve" or not w for role, _, w in parts):
                raise ValueError(f"bad candidate name {name!r}")
            return pair(parts[0][2], parts[1][2])
        steps = []
        for part in name.split(">"):
            role, _, w = part.partition(":")
            if role not in ROLE_TEXT or not w:
                raise ValueError(f"bad candidate name {name!r}")
            steps.append((w, role))
        return cls(tuple(steps))


@dataclass(frozen=True)
class PairCandidate(Candidate):
    """Two fresh solves in parallel (each sees nothing): ``steps`` = ((a, "solve"), (b, "solve"))."""

    @property
    def name(self) -> str:
        return "|".join(f"{role}:{w}" for w, role in self.steps)

    def workflow(self, names: Sequence[str]) -> Workflow:
        try:
            ids = [list(names).index(w) for w, _ in self.steps]
        except ValueError:
            raise ValueError(f"candidate {self.name} uses a worker outside the view {list(names)}") from None
        return Workflow(steps=tuple(Step(worker=j, instruction=ROLE_TEXT["solve"], access=()) for j in ids))


def pair(a: str, b: str) -> PairCandidate:
    return PairCandidate(((a, "solve"), (b, "solve")))


def single(worker: str) -> Candidate:
    return Candidate(((worker, "solve"),))
