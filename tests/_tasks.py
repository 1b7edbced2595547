"""Hand-made tasks the tests share (tests/test_routellm_conductor.py, tests/test_rounds.py)."""

from __future__ import annotations

from rl_conductor.tasks.base import Task


def choice_task(
    id: str, question: str, domain: str, source: str, metadata: dict[str, object], *, answer: str = "A"
) -> Task:
    """A multiple-choice task (answer A unless told otherwise)."""
    return Task(id, question, answer, domain, source, grader="choice", metadata=metadata)
