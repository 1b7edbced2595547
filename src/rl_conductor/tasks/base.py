"""The Task record every dataset loader yields and every grader reads.

A Task is immutable and hashable by ``id``; ``metadata`` carries what a grader or a simulated
worker needs beyond question/answer (multiple-choice options, unit tests, difficulty hints).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Domains the project knows. The simulated pool is calibrated per domain (see workers/simulated.py).
DOMAINS = ("math", "knowledge", "reasoning", "code")


@dataclass(frozen=True)
class Task:
    """One question with a verifiable gold answer.

    Attributes:
        id: stable identifier, unique across datasets (``"<source>/<native id>"``).
        question: the text the Conductor and the workers see.
        answer: the gold answer (a math expression, a choice letter, a short string; for code,
            the reference solution).
        domain: one of ``DOMAINS``.
        source: dataset name (``"math500"``, ``"gsm8k"``, ...).
        grader: grader name, see ``rl_conductor.tasks.graders.GRADERS``.
        metadata: free-form extras (``choices``, ``tests``, ``entry_point``, ``level`` ...).
    """

    id: str
    question: str
    answer: str
    domain: str
    source: str
    grader: str
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "domain": self.domain,
            "source": self.source,
            "grader": self.grader,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Task:
        return cls(
            id=str(d["id"]),
            question=str(d["question"]),
            answer=str(d["answer"]),
            domain=str(d["domain"]),
            source=str(d["source"]),
            grader=str(d["grader"]),
            metadata=dict(d.get("metadata") or {}),
        )
