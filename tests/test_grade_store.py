"""The grade store: a code answer's grade made in one process is reused by the next (make run's
evaluation step regraded what its training step had graded), keyed so a changed question is
graded again, and a store that fails never fails a grade."""

from __future__ import annotations

import os
import random
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from rl_conductor.tasks import grade_store, graders
from rl_conductor.tasks.base import Task
from rl_conductor.workers.simulated import answers
from rl_conductor.workers.simulated.answers import grade_cached, render_answer
from test_simulated import CODE_TASK

CODE = replace(CODE_TASK, id="store-code/0")  # add(a, b), two asserts
WRONG = "def add(a, b):\n    return a * b\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    monkeypatch.delenv(grade_store.ENV, raising=False)
    monkeypatch.setattr(answers, "_GRADE_CACHE", {})
    return tmp_path


def _forget(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A new process, as far as grading goes: no grade in memory, and a grader that records calls."""
    monkeypatch.setattr(answers, "_GRADE_CACHE", {})
    calls: list[str] = []
    real = graders.settled_grade

    def counted(task: Task, text: str) -> tuple[bool, bool]:
        calls.append(text)
        return real(task, text)

    monkeypatch.setattr(graders, "settled_grade", counted)
    return calls


def test_a_code_grade_without_a_runner_verdict_is_not_kept(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A code answer whose test runner gave no verdict (the wall-clock backstop under a loaded
    machine) is graded wrong here but not kept for other processes, which grade it again."""
    from rl_conductor.tasks import sandbox

    real = sandbox.TestVerdict
    monkeypatch.setattr(
        graders, "run_tests", lambda *a, **k: real(False, 0, 0, "the test runner gave no verdict", False, 0.1)
    )
    assert not grade_cached(CODE, _text(CODE.answer, 1))
    monkeypatch.undo()
    monkeypatch.setenv("CONDUCTOR_HOME", str(home))
    calls = _forget(monkeypatch)
    assert grade_cached(CODE, _text(CODE.answer, 2)) and len(calls) == 1  # graded again: right
    calls = _forget(monkeypatch)
    assert grade_cached(CODE, _text(CODE.answer, 3)) and calls == []  # now kept


def _text(value: str, seed: int) -> str:
    return render_answer(CODE, value, 40, random.Random(seed))


def test_a_grade_made_once_is_read_back_without_grading(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert grade_cached(CODE, _text(CODE.answer, 1)) and not grade_cached(CODE, _text(WRONG, 2))
    files = list((home / ".conductor" / "cache" / "grades").glob("*.sqlite"))
    assert len(files) == 1 and files[0].stem == grade_store.grading_version()
    calls = _forget(monkeypatch)
    assert grade_cached(CODE, _text(CODE.answer, 3)) and not grade_cached(CODE, _text(WRONG, 4))
    assert calls == []  # both from disk, other renderings of the same values
    calls = _forget(monkeypatch)
    changed = replace(CODE, metadata={**CODE.metadata, "tests": ["assert add(1, 2) == 4"]})
    assert not grade_cached(changed, _text(CODE.answer, 5)) and len(calls) == 1  # other tests: graded


def test_the_store_can_be_turned_off(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(grade_store.ENV, "0")
    assert grade_cached(CODE, _text(CODE.answer, 1))
    assert not (home / ".conductor" / "cache" / "grades").exists()


def test_a_store_that_cannot_be_written_never_fails_a_grade(
    home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() == 0:  # root writes into read-only folders: block the folder with a file
        (home / ".conductor").write_text("not a folder")
    else:
        home.chmod(stat.S_IRUSR | stat.S_IXUSR)
    monkeypatch.setattr(grade_store, "_DISABLED", set())
    monkeypatch.setattr(grade_store, "_STORES", {})
    try:
        calls = _forget(monkeypatch)
        assert grade_cached(CODE, _text(CODE.answer, 1)) and len(calls) == 1
        assert "grade store off" in caplog.text
        assert grade_store.shared_store() is None
    finally:
        home.chmod(stat.S_IRWXU)


def test_math_grades_stay_in_their_process(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A math grade is not kept on disk: one made while the math-verify helper stalled is wrong
    and would look settled (the helper's answers are cached in process), so the next process
    grades math itself."""
    task = Task("store-math/0", "What is 1 + 1?", "2", "math", "synthetic", grader="math")
    assert grade_cached(task, render_answer(task, "2", 20, random.Random(0)))
    calls = _forget(monkeypatch)
    assert grade_cached(task, render_answer(task, "2", 30, random.Random(1))) and len(calls) == 1


def test_grading_goes_on_when_the_working_directory_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.delenv("CONDUCTOR_HOME", raising=False)
    monkeypatch.setattr(grade_store, "_DISABLED", set())
    monkeypatch.setattr(answers, "_GRADE_CACHE", {})
    assert grade_cached(CODE, _text(CODE.answer, 1))
    assert "grade store off" in caplog.text
