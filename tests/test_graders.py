"""Graders: equivalent answers pass, different ones fail, odd input never raises."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_conductor.tasks.base import Task
from rl_conductor.tasks.graders import GRADERS, extract_answer, extract_code, grade


def make(answer: str, grader: str, **metadata: object) -> Task:
    return Task(
        id="t/1", question="q", answer=answer, domain="math", source="t", grader=grader, metadata=metadata
    )


HALF = make("\\frac{1}{2}", "math")
EIGHTEEN = make("18", "math")
POLAR = make("\\left( 3, \\frac{\\pi}{2} \\right)", "math")


@pytest.mark.parametrize(
    ("task", "text"),
    [
        (HALF, "so the probability is \\boxed{\\frac{1}{2}}."),
        (HALF, "\\boxed{0.5}"),
        (HALF, "The answer is 1/2"),
        (HALF, "Answer: $\\dfrac{1}{2}$."),
        (HALF, "#### 0.5"),
        (EIGHTEEN, "#### 18"),
        (EIGHTEEN, "She makes $18 every day."),
        (EIGHTEEN, "The answer is 18.0"),
        (EIGHTEEN, "\\boxed{\\$18}"),
        (EIGHTEEN, "The answer is 18 dollars."),
        (make("70000", "math"), "#### 70,000"),
        (POLAR, "\\boxed{\\left(3, \\frac{\\pi}{2}\\right)}"),
        (make("2\\sqrt{3}", "math"), "\\boxed{\\sqrt{12}}"),
    ],
)
def test_math_equivalent_forms_pass(task: Task, text: str) -> None:
    assert grade(task, text)


@pytest.mark.parametrize(
    ("task", "text"),
    [
        (HALF, "\\boxed{0.6}"),
        (HALF, "The answer is 2"),
        (EIGHTEEN, "#### 19"),
        (EIGHTEEN, "I computed 18 first, then the answer is 20."),
        (POLAR, "\\boxed{\\left(3, \\pi\\right)}"),
        (HALF, ""),
        (HALF, "no numbers here at all"),
    ],
)
def test_math_different_values_fail(task: Task, text: str) -> None:
    assert not grade(task, text)


def test_math_voting_key_merges_equivalent_numbers() -> None:
    keys = {extract_answer(HALF, t) for t in ("\\boxed{\\frac12}", "#### 0.5", "The answer is 1/2")}
    assert keys == {"1/2"}
    assert extract_answer(HALF, "\\boxed{3}") == "3"
    assert extract_answer(HALF, "") is None


MC = make("C", "choice", choices=["1", "2", "3", "4"])


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("Answer: C", "C"),
        ("after thought: (C)", "C"),
        ("\\boxed{C}", "C"),
        ("\\boxed{\\text{C}}", "C"),
        ("The answer is C.", "C"),
        ("**Answer:** C", "C"),
        ("Reasoning ...\nC", "C"),
        ("The correct answer is option B", "B"),
        ("The answer is 3", "C"),  # repeats the text of option C
        ("(A) looks tempting but (D) is right", "D"),
        ("The answer is a tricky one", None),
        ("", None),
    ],
)
def test_choice_extraction(text: str, letter: str | None) -> None:
    assert extract_answer(MC, text) == letter
    assert grade(MC, text) == (letter == "C")


def test_choice_ignores_letters_beyond_the_options() -> None:
    assert extract_answer(MC, "Answer: F") is None


QA = make("Sammy Davis, Jr", "qa", aliases=["Sammy Davis, Jr", "Sammy Davis Junior"])


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("Sammy Davis Jr.", True),
        ("The answer is: the Sammy Davis Junior", True),
        ("Thinking...\nFinal answer: Sammy Davis, Jr.", True),
        ("It was sung by Sammy Davis Jr.", True),
        ("Frank Sinatra", False),
        ("Sammy", False),
        (
            "Many singers covered it over the decades but the original, recorded long ago, is Sammy Davis Jr",
            False,
        ),
        ("", False),
    ],
)
def test_qa_normalised_match(text: str, ok: bool) -> None:
    assert grade(QA, text) is ok


def test_qa_aliases_from_answer_delimiter() -> None:
    task = make("seats|||car seats", "qa")
    assert grade(task, "Car seats.") and grade(task, "seats")
    assert not grade(task, "tyres")
    assert extract_answer(task, "Answer: The Car Seats!") == "car seats"


MBPP = make(
    "def add(a, b):\n    return a + b\n",
    "code",
    tests=["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
    entry_point="add",
    test_imports=[],
)
HUMANEVAL = make(
    "",
    "code",
    prompt='def inc(x: int) -> int:\n    """Return x + 1."""\n',
    tests="def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n",
    entry_point="inc",
)


def test_code_correct_and_wrong_solutions() -> None:
    assert grade(MBPP, "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```")
    assert not grade(MBPP, "```python\ndef add(a, b):\n    return a - b\n```")
    assert grade(HUMANEVAL, "```python\ndef inc(x):\n    return x + 1\n```")
    assert grade(HUMANEVAL, "    return x + 1\n")  # body-only completion, appended to the prompt
    assert not grade(HUMANEVAL, "    return x\n")


def test_code_prefers_the_block_that_defines_the_entry_point() -> None:
    text = "```python\ndef add(a, b):\n    return a + b\n```\nUsage:\n```python\nprint(add(1, 2))\n```"
    assert "def add" in extract_code(text, "add")
    assert grade(MBPP, text)
    assert extract_answer(MBPP, text) == "def add(a, b): return a + b"


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 5000,
        "\\boxed{\\frac{1}{" + "}" * 3,
        "(" * 3000 + "1" + ")" * 3000,
        "\\boxed{" + "1+" * 2000 + "1}",
        "9" * 100000,
        "\x00\xff\ud800 junk \\boxed{\x00}",
        "The answer is " + "\\sqrt{" * 200 + "2" + "}" * 200,
    ],
)
def test_adversarial_text_never_raises(text: str) -> None:
    for task in (HALF, MC, QA):
        assert grade(task, text) in (True, False)
        extract_answer(task, text)


def test_grading_works_outside_the_main_thread() -> None:
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(grade, HALF, "\\boxed{0.5}").result()
        assert not pool.submit(grade, HALF, "\\boxed{0.7}").result()


def test_unknown_grader_is_a_programming_error() -> None:
    with pytest.raises(KeyError, match="unknown grader"):
        grade(make("1", "nope"), "1")
    assert set(GRADERS) == {"math", "choice", "qa", "code"}


_odd_text = st.one_of(
    st.text(max_size=300),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.lists(
        st.sampled_from(["\\boxed{", "}", "{", "\\frac", "####", "Answer:", "(C)", "$", "1/0", "\n", "```"])
    ).map("".join),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_odd_text)
def test_text_graders_never_raise(text: str) -> None:
    for task in (HALF, EIGHTEEN, MC, QA):
        assert isinstance(grade(task, text), bool)
        key = extract_answer(task, text)
        assert key is None or isinstance(key, str)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_odd_text)
def test_code_grader_never_raises(text: str) -> None:
    assert grade(MBPP, text) is False
