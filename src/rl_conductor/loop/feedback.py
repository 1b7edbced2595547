"""Feedback on a served request: a score in [0, 1] and/or a gold answer, kept beside the traffic.

Why: the traffic log says what the Conductor did; feedback says what it earned. The retraining
loop (:mod:`rl_conductor.loop.data`) reads both to value each executed workflow.

The wire body (``POST /v1/feedback``, ``POST /openai/v1/feedback``)::

    {"request_id": "...",        # the response's request_id (the OpenAI route's "id")
     "score": 0.8,               # optional: how good the answer was, 0 (useless) to 1 (right)
     "answer": "42",             # optional: the gold answer; the logged answer is graded with it
     "grader": "math",           # optional: math | choice | qa (default qa) for the gold answer
     "comment": "..."}           # optional, at most 2,000 characters

At least one of ``score`` and ``answer`` is required. The reward the loop uses is ``score`` when
given, else the grade (1.0 right, 0.0 wrong). Rules:

* unknown ``request_id`` → 404 that says where ids come from; a private request that was not
  recorded (no private store) → 422 that says why its feedback cannot be kept;
* idempotent: the same feedback again → 200 with ``"status": "duplicate"`` and one stored
  record; a *different* second feedback on the same id → 409 naming what is already recorded
  (feedback is never silently overwritten: a correction is a person's decision, made in the
  store);
* a private request's feedback goes to the private store, never the public one.

Storage: one JSON object per request id, ``<store>/feedback/<id>.json`` (ids that are not plain
``[A-Za-z0-9_.-]`` are stored under their SHA-256).
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rl_conductor import storage
from rl_conductor.loop.traffic import PRIVATE_NOT_RECORDED, TrafficLog

if TYPE_CHECKING:
    from rl_conductor.tasks.base import Task

FEEDBACK_DIR = "feedback"
#: Graders a gold answer may name (code needs tests, which feedback cannot carry).
FEEDBACK_GRADERS = ("math", "choice", "qa")
_PLAIN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class FeedbackError(Exception):
    """A feedback request that cannot be kept: ``status`` is its HTTP status, the message says why."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class FeedbackBody(BaseModel):
    """One feedback request (see module docstring)."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=200)
    score: float | None = None
    answer: str | None = Field(default=None, min_length=1, max_length=100_000)
    grader: str | None = None
    comment: str | None = Field(default=None, max_length=2_000)

    @field_validator("score", mode="before")
    @classmethod
    def _score(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= 1:
            raise ValueError(f"must be a number from 0 to 1, got {v!r}")
        return float(v)

    @field_validator("grader")
    @classmethod
    def _grader(cls, v: str | None) -> str | None:
        if v is not None and v not in FEEDBACK_GRADERS:
            raise ValueError(f"must be one of {list(FEEDBACK_GRADERS)}, got {v!r}")
        return v


def parse_feedback(raw: Any) -> FeedbackBody:
    """A validated body; raises :class:`FeedbackError` (400) naming the field."""
    if not isinstance(raw, Mapping):
        raise FeedbackError(400, f"the body must be a JSON object, got {type(raw).__name__}")
    try:
        body = FeedbackBody.model_validate(dict(raw))
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(map(str, e["loc"])) or "body"
        raise FeedbackError(400, f"{where}: {e['msg']}", where) from None
    if body.score is None and body.answer is None:
        raise FeedbackError(400, "give a score (0 to 1) or a gold answer, or both", "score")
    if body.grader is not None and body.answer is None:
        raise FeedbackError(400, "grader: names how to grade a gold answer; give the answer too", "grader")
    return body


def gold_feedback(request_id: str, task: Task, score: float = 0.0) -> dict[str, Any]:
    """The feedback a client that knows ``task``'s gold answer sends on ``request_id``: the answer
    and its grader where feedback may name it (:data:`FEEDBACK_GRADERS`), else ``score``."""
    body: dict[str, Any] = {"request_id": request_id}
    if task.grader in FEEDBACK_GRADERS:
        body |= {"answer": task.answer, "grader": task.grader}
    else:
        body["score"] = score
    return body


def feedback_uri(store: str, request_id: str) -> str:
    """Where the feedback on ``request_id`` lives in ``store``."""
    name = request_id if _PLAIN_ID.match(request_id) else hashlib.sha256(request_id.encode()).hexdigest()
    return storage.join(store, FEEDBACK_DIR, f"{name}.json")


def grade_answer(question: str, logged_answer: str, gold: str, grader: str) -> bool:
    """Whether the logged answer is right by the gold answer (the project's graders)."""
    from rl_conductor.tasks.base import Task
    from rl_conductor.tasks.graders import grade

    task = Task(
        id="feedback", question=question, answer=gold, domain="reasoning", source="feedback", grader=grader
    )
    return bool(grade(task, logged_answer))


class Feedback:
    """Keeps feedback for the requests of one traffic log (see module docstring)."""

    def __init__(self, traffic: TrafficLog) -> None:
        self.traffic = traffic
        self._lock = threading.Lock()

    def submit(self, body: FeedbackBody) -> dict[str, Any]:
        """Record ``body``; returns ``{"status": "recorded" | "duplicate", "feedback": {...}}``.

        Raises :class:`FeedbackError` (404 unknown id, 422 private and not recorded, 409 conflict).
        Blocking (storage, grading): the HTTP route runs it in a thread."""
        found = self.traffic.lookup(body.request_id)
        if found is None:
            raise FeedbackError(
                404,
                f"unknown request_id {body.request_id!r}: this predictor has no record of it (send the "
                "request_id of one of its responses, the OpenAI route's id; records past the traffic "
                "log's retention are gone)",
                "request_id",
            )
        if found == PRIVATE_NOT_RECORDED:
            raise FeedbackError(
                422,
                f"request {body.request_id!r} was private and this predictor keeps no private traffic "
                "store (--traffic_private_store), so its feedback cannot be kept",
                "request_id",
            )
        assert isinstance(found, dict)
        grader = body.grader or "qa"
        correct = (
            grade_answer(found["question"], found.get("answer", ""), body.answer, grader)
            if body.answer is not None
            else None
        )
        reward = body.score if body.score is not None else float(bool(correct))
        now = time.time()
        record = {
            "request_id": body.request_id,
            "score": body.score,
            "answer": body.answer,
            "grader": grader if body.answer is not None else None,
            "correct": correct,
            "reward": reward,
            "comment": body.comment,
            "sensitivity": found.get("sensitivity", "public"),
            "time": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds"),
            "ts": now,
        }
        uri = feedback_uri(self.traffic.store_of(found), body.request_id)
        with self._lock:
            if storage.exists(uri):
                before = storage.read_json(uri)
                if _same_feedback(before, record):
                    return {"status": "duplicate", "feedback": before}
                raise FeedbackError(
                    409,
                    f"request {body.request_id!r} already has different feedback "
                    f"(score={before.get('score')!r}, "
                    f"answer={_short(before.get('answer'))}); feedback is not overwritten",
                    "request_id",
                )
            storage.write_json(uri, record)
        return {"status": "recorded", "feedback": record}


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _same_feedback(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("score", "answer", "grader", "comment"))


def read_feedback(store: str) -> dict[str, dict[str, Any]]:
    """Every feedback record of ``store`` by request id."""
    root = storage.join(store, FEEDBACK_DIR)
    out: dict[str, dict[str, Any]] = {}
    for rel in storage.list_files(root):
        if rel.endswith(".json"):
            rec = storage.read_json(storage.join(root, *rel.split("/")))
            out[str(rec["request_id"])] = rec
    return out


__all__ = [
    "FEEDBACK_GRADERS",
    "Feedback",
    "FeedbackBody",
    "FeedbackError",
    "feedback_uri",
    "grade_answer",
    "parse_feedback",
    "read_feedback",
]
