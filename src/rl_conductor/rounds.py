"""What a policy knows after a round: each answered step's extracted answer and whether they agree.

One summary for every reviewer, so the fixed cascade and the Conductor's review prompt read the
same facts: answers are extracted by the task's grader (math through math-verify) and compared
with :func:`rl_conductor.tasks.graders.answers_agree`. Only steps that answered count; a step
with nothing extractable shows as ``None`` and agrees with nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_conductor.executor import RoundRequest
from rl_conductor.tasks.graders import agreement, extract_answer
from rl_conductor.trace import ANSWERED


@dataclass(frozen=True)
class RoundSummary:
    """The answered steps of the rounds so far (indices), their extracted answers and agreement."""

    steps: tuple[int, ...]
    answers: tuple[str | None, ...]
    agree: bool | None

    def line(self) -> str:
        """The sentence a review prompt shows."""
        if self.agree is None:
            return "One answer so far." if self.steps else "No answer so far."
        return "The answers so far agree." if self.agree else "The answers so far disagree."


def summarize(request: RoundRequest) -> RoundSummary:
    """The :class:`RoundSummary` of ``request``'s steps so far."""
    answered = [r for r in request.records if r.status in ANSWERED and r.answer]
    texts = [r.answer for r in answered]
    return RoundSummary(
        steps=tuple(r.index for r in answered),
        answers=tuple(extract_answer(request.task, t) for t in texts),
        agree=agreement(request.task, texts),
    )
