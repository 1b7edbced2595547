"""Graders: equivalent answers pass, different ones fail, odd input never raises."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

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
        (EIGHTEEN, "She makes 9 * 2 = $<<9*2=18>>18 a day\nA: 18"),  # OpenAI's GSM8K samples
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
        (EIGHTEEN, "She makes 9 * 2 = $<<9*2=18>>18 a day\nA: 19"),
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


def test_code_tests_as_one_string_of_asserts_run_as_asserts() -> None:
    """A recordings file may give ``tests`` as one string of asserts (not a HumanEval ``check``
    program): run as asserts, a right solution passes (before: it ran as a check program, and a
    right answer graded wrong)."""
    block = replace(
        MBPP, metadata={**MBPP.metadata, "tests": "assert add(1, 2) == 3\nassert add(0, 0) == 0\n"}
    )
    assert grade(block, "def add(a, b):\n    return a + b\n")
    assert not grade(block, "def add(a, b):\n    return a - b\n")


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
    assert set(GRADERS) == {"math", "choice", "qa", "code", "recorded"}  # recorded: replay as labelled


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


# --------------------------------------------------------------------------- attacks (issue 8)
# Wrong solutions to mbpp/127 and humaneval/100 with each trick of the probe added:
# every one used to be graded correct, every one must be graded wrong. The honest solutions pass.


@pytest.fixture(scope="module")
def mbpp127() -> Task:
    from rl_conductor.tasks.datasets import load_tasks

    return next(t for t in load_tasks("mbpp") if t.id == "mbpp/127")


@pytest.fixture(scope="module")
def he100() -> Task:
    from rl_conductor.tasks.datasets import load_tasks

    return next(t for t in load_tasks("humaneval") if t.id == "humaneval/100")


WRONG_MBPP = "def newman_prime(n):\n    return n\n"
WRONG_HE = "def make_a_pile(n):\n    return [n]\n"

EXIT_TRICKS = [
    "import sys\nsys.exit(0)",
    "raise SystemExit",
    "import os\nos._exit(0)",
    "quit()",
    "import atexit, os\natexit.register(os._exit, 0)",
    "import sys, os\nsys.excepthook = lambda *a: os._exit(0)",
    'def main():\n    return 0\n\nif __name__ == "__main__":\n    import sys\n    sys.exit(main())',
]


def test_honest_reference_solutions_pass(mbpp127: Task, he100: Task) -> None:
    assert grade(mbpp127, f"```python\n{mbpp127.answer}\n```")
    assert grade(he100, f"```python\n{he100.answer}\n```")
    assert not grade(mbpp127, f"```python\n{WRONG_MBPP}```")
    assert not grade(he100, f"```python\n{WRONG_HE}```")


@pytest.mark.parametrize("trick", EXIT_TRICKS)
def test_exiting_early_is_graded_wrong(trick: str, mbpp127: Task, he100: Task) -> None:
    assert not grade(mbpp127, f"```python\n{WRONG_MBPP}{trick}\n```")
    assert not grade(he100, f"```python\n{WRONG_HE}{trick}\n```")


def test_a_tracer_that_exits_when_check_runs_is_graded_wrong(he100: Task) -> None:
    tracer = (
        "import sys, os\n"
        "def _t(frame, event, arg):\n"
        "    if frame.f_code.co_name == 'check':\n"
        "        os._exit(0)\n"
        "    return _t\n"
        "sys.settrace(_t)\n"
    )
    assert not grade(he100, f"```python\n{tracer}{WRONG_HE}```")
    # a tracer inside the call itself only ends the candidate's own process
    inside = WRONG_HE.replace("    return [n]", "    import os\n    os._exit(0)")
    assert not grade(he100, f"```python\n{inside}```")


def test_an_always_equal_result_is_graded_wrong(mbpp127: Task, he100: Task) -> None:
    eq = (
        "class AlwaysEqual(list):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "    __hash__ = None\n"
    )
    assert not grade(mbpp127, f"```python\n{eq}def newman_prime(n):\n    return AlwaysEqual()\n```")
    assert not grade(he100, f"```python\n{eq}def make_a_pile(n):\n    return AlwaysEqual()\n```")
    int_eq = "class E(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
    assert not grade(mbpp127, f"```python\n{int_eq}def newman_prime(n):\n    return E(0)\n```")


def test_reading_the_asserts_from_the_solution_file_finds_nothing(mbpp127: Task, he100: Task) -> None:
    table_mbpp = (
        "import re, sys\n"
        "_src = open(__file__).read() if '__file__' in dir() else ''\n"
        "for _p in ('/sbx/solution.py', 'solution.py', '/work/solution.py'):\n"
        "    try:\n        _src += open(_p).read()\n    except OSError:\n        pass\n"
        "_table = {int(a): int(b) for a, b in re.findall(r'newman_prime\\((\\d+)\\) == (\\d+)', _src)}\n"
        "def newman_prime(n):\n    return _table.get(n, n)\n"
    )
    assert not grade(mbpp127, f"```python\n{table_mbpp}```")
    table_he = table_mbpp.replace("newman_prime", "make_a_pile").replace(
        "int(b) for a, b in re.findall(r'make_a_pile\\((\\d+)\\) == (\\d+)', _src)",
        "eval(b) for a, b in re.findall(r'candidate\\((\\d+)\\) == (\\[[^\\]]*\\])', _src)",
    )
    assert not grade(he100, f"```python\n{table_he}```")


def test_importing_the_gold_answers_is_graded_wrong(mbpp127: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    import sysconfig
    from pathlib import Path

    import rl_conductor
    from rl_conductor.tasks import graders

    verdicts = []
    real = graders.run_tests

    def recorded(*args: object, **kwargs: object) -> object:
        verdicts.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return verdicts[-1]

    monkeypatch.setattr(graders, "run_tests", recorded)
    cheat = (
        "from rl_conductor.tasks.datasets import load_tasks\n"
        "exec(next(t for t in load_tasks('mbpp') if t.id == 'mbpp/127').answer)\n"
    )
    assert not grade(mbpp127, f"```python\n{cheat}```")
    # the folders that hold the package, named outright: a search of the whole disk for them
    # (glob '/**/site-packages') ran out of CPU time before the import, so it tested nothing
    paths = [str(Path(rl_conductor.__file__).resolve().parents[1]), sysconfig.get_paths()["purelib"]]
    path_cheat = f"import sys\nsys.path[:0] = {paths!r}\n" + cheat
    assert not grade(mbpp127, f"```python\n{path_cheat}```")
    assert [v.timed_out for v in verdicts] == [False, False]  # refused, not cut short


def test_tampering_with_the_old_guards_and_killing_the_grader_changes_nothing(mbpp127: Task) -> None:
    tamper = (
        "import sys, os, signal, builtins\n"
        "sys.modules['__main__']._FORBIDDEN_PREFIXES = ()\n"
        "builtins.isinstance = lambda *a: True\n"
        "os.path.realpath = lambda p: '/work'\n"
        "try:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass\n"
    )
    assert not grade(mbpp127, f"```python\n{tamper}{WRONG_MBPP}```")
    kill = "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass\n"
    assert grade(
        mbpp127, f"```python\n{kill}{mbpp127.answer}\n```"
    )  # the grader survives, honest code passes


def test_a_setsid_child_process_cannot_be_started(mbpp127: Task) -> None:
    spawn = (
        "import subprocess, sys\n"
        "try:\n"
        "    cmd = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
        "    subprocess.Popen(cmd, start_new_session=True)\n"
        "except OSError:\n    raise SystemExit(0)\n"
    )
    assert not grade(mbpp127, f"```python\n{spawn}{WRONG_MBPP}```")


# --------------------------------------------------------------------------- hedged answers (issue 8)


MC_A = make("A", "choice", choices=["1", "2", "3", "4"])
MC_D = make("D", "choice", choices=["1", "2", "3", "4"])


@pytest.mark.parametrize(
    ("task", "text"),
    [
        (MC_A, "Answer: A or B"),
        (MC_A, "\\boxed{A, B, C, D}"),
        (MC_A, "The answer is A, B, C or D."),
        (MC_A, "The answer is (A) or (B)"),
        (MC_A, "Answer: either A or B"),
        (MC_A, "Answer: A/B"),
        (MC_D, "(A) (B) (C) (D)"),
    ],
)
def test_choice_answers_naming_several_options_are_wrong(task: Task, text: str) -> None:
    assert extract_answer(task, text) is None
    assert not grade(task, text)


def test_choice_answer_with_a_later_explanation_still_counts() -> None:
    assert grade(MC_A, "Answer: A. B is wrong because it is negative.")


PARIS = make("Paris", "qa")


@pytest.mark.parametrize(
    "text", ["Answer: not Paris", "Paris or London", "London, Berlin, Paris, Rome", "Either Paris or Rome"]
)
def test_short_answers_that_hedge_or_negate_are_wrong(text: str) -> None:
    assert not grade(PARIS, text)


def test_short_answers_keep_hedge_words_that_belong_to_the_gold() -> None:
    task = make("Simon and Garfunkel", "qa")
    assert grade(task, "It was Simon and Garfunkel.")
    assert grade(PARIS, "It is Paris.")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("\\boxed{5 = 7}", False),
        ("\\boxed{7 = 7}", False),
        ("\\boxed{x = 7}", True),
        ("\\boxed{a_1 = 7}", True),
        ("\\boxed{7 \\text{ or } 8}", False),
        ("\\boxed{7}", True),
    ],
)
def test_math_equations_are_not_their_right_hand_side(text: str, ok: bool) -> None:
    assert grade(make("7", "math"), text) is ok


def test_math_equation_gold_is_still_compared() -> None:
    assert grade(make("y = 2x + 3", "math"), "\\boxed{y = 2x + 3}")


def test_a_power_tower_returns_wrong_off_the_main_thread() -> None:
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(grade, make("7", "math"), "\\boxed{9^{9^{9}}}")
        assert future.result(timeout=120) is False  # a bound on hanging, not a speed test
        assert pool.submit(grade, HALF, "\\boxed{0.5}").result(timeout=120)  # the helper restarted


def test_the_math_time_limit_counts_cpu_time_not_waiting() -> None:
    """The math helper's per-call limit (``_cpu_time_limit``) counts this process's CPU time:
    waiting (for a core, on a loaded machine) does not use it up, computing does, so a grade
    does not depend on the machine's load."""
    import time

    from math_verify.errors import TimeoutException

    from rl_conductor.tasks.graders import _cpu_time_limit

    with _cpu_time_limit(0.2):
        time.sleep(0.5)  # 0.5 s of wall time, no CPU: no timeout
    with pytest.raises(TimeoutException), _cpu_time_limit(0.2):
        while True:
            pass


# --------------------------------------------------------------------------- outside review of the graders


def _llmrouter_sammy() -> Task:
    from rl_conductor.tasks.datasets import load_tasks

    return next(t for t in load_tasks("llmrouter") if t.grader == "qa" and t.answer == "Sammy Davis, Jr")


@pytest.mark.parametrize(
    "text",
    [
        "Answer: Berlin Sammy Davis, Jr Madrid",
        "Answer: Sammy Davis, Jr is wrong",
        "Answer: maybe Sammy Davis, Jr maybe Rome",
    ],
)
def test_qa_candidate_lists_and_negations_of_a_real_gold_are_wrong(text: str) -> None:
    assert not grade(_llmrouter_sammy(), text)


def test_qa_real_gold_answered_plainly_passes() -> None:
    assert grade(_llmrouter_sammy(), "Answer: Sammy Davis, Jr")
    assert grade(_llmrouter_sammy(), "It was sung by Sammy Davis Jr.")


@pytest.mark.parametrize(
    "text",
    [
        "Answer: Paris London",
        "Answer: London Paris",
        "Paris | London",
        "Paris? London?",
        "Paris + London",
        "Paris is incorrect",
        "it is unlikely to be Paris",
        "Paris (wrong)",
        "It is probably Paris",
    ],
)
def test_qa_answers_with_more_than_the_gold_are_wrong(text: str) -> None:
    assert not grade(PARIS, text)


@pytest.mark.parametrize(
    "text", ["Answer: Paris", "The answer is Paris.", "**Paris**", "Paris?", "It is Paris."]
)
def test_qa_honest_forms_pass(text: str) -> None:
    assert grade(PARIS, text)


def test_qa_gold_with_a_hedge_word_still_passes_as_the_answer() -> None:
    assert grade(make("Simon and Garfunkel", "qa"), "Answer: Simon and Garfunkel")


MC_C = make("C", "choice", choices=["1", "2", "3", "4"])


@pytest.mark.parametrize(
    "text",
    [
        "The answer is C A B D",
        "Answer: C. A. B. D.",
        "Answer: C (or possibly A)",
        "Answer: C and/or D",
        "Answer: C|D",
        "Answer: C (D)",
        "Answer: C, unless it is D",
        "Answer: C\nA\nB\nD",
    ],
)
def test_choice_final_answers_naming_other_letters_are_wrong(text: str) -> None:
    assert extract_answer(MC_C, text) is None
    assert not grade(MC_C, text)


@pytest.mark.parametrize(
    "text",
    [
        "Answer: C, a guess",
        "The answer is C; a quick check confirms it.",
        "Answer: C. A is tempting but wrong.",
    ],
)
def test_choice_the_article_a_is_not_option_a(text: str) -> None:
    assert grade(MC_C, text)


CELL = make("B", "choice", choices=["nucleus", "mitochondrion", "ribosome", "golgi"])


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("B) mitochondrion", "B"),
        ("(B) mitochondrion", "B"),
        ("Thinking...\nB. mitochondrion", "B"),
        ("B) mitochondrion or C) ribosome", None),
    ],
)
def test_choice_a_final_line_with_letter_and_text(text: str, letter: str | None) -> None:
    assert extract_answer(CELL, text) == letter
    assert grade(CELL, text) is (letter == "B")


def test_choice_real_mmlu_task_hedges_are_wrong() -> None:
    from rl_conductor.tasks.datasets import load_tasks

    task = load_tasks("mmlu_stem")[0]
    assert task.answer == "C"
    assert grade(task, "Answer: C")
    assert not grade(task, "The answer is C A B D")
    assert not grade(task, "Answer: C (or possibly A)")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("\\boxed{5 \\Rightarrow 9}", False),
        ("\\boxed{0 \\to 9}", False),
        ("\\boxed{0 \\equiv 9}", False),
        ("\\boxed{5 \\rightarrow 9}", False),
        ("\\boxed{5 \\implies 9}", False),
        ("\\boxed{x \\geq 9}", False),
        ("\\boxed{\\left(9\\right)}", True),
        ("\\boxed{9}", True),
    ],
)
def test_math_relations_and_arrows_are_not_their_right_hand_side(text: str, ok: bool) -> None:
    assert grade(make("9", "math"), text) is ok


@pytest.mark.parametrize(
    ("text", "ok"),
    [("\\boxed{f(5) = 7}", True), ("\\boxed{g\\left(2\\right) = 7}", True), ("\\boxed{5(2) = 7}", False)],
)
def test_math_a_function_application_may_name_the_answer(text: str, ok: bool) -> None:
    assert grade(make("7", "math"), text) is ok


def test_math_relation_gold_is_still_compared() -> None:
    assert grade(make("x \\leq 3", "math"), "\\boxed{x \\le 3}")


def test_code_that_does_not_parse_is_wrong_without_a_sandbox(
    mbpp127: Task, he100: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cut-short or prose answer fails at the parser; only parseable code reaches the sandbox."""
    from rl_conductor.tasks import graders

    runs: list[str] = []
    real = graders.run_tests

    def counted(program: str, *a: object, **k: object) -> object:
        runs.append(program)
        return real(program, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(graders, "run_tests", counted)
    cut = mbpp127.answer[: len(mbpp127.answer) // 2] + "("
    assert not grade(mbpp127, f"```python\n{cut}\n```")
    assert not grade(mbpp127, "I would loop over the list and add the numbers, then return it.")
    assert not grade(he100, "```python\n    return [n + 2 * i for i in range(n)\n```")
    assert runs == []
    assert grade(mbpp127, f"```python\n{mbpp127.answer}\n```") and len(runs) == 1
    # parseable but wrong still goes to the sandbox, which fails it
    assert not grade(mbpp127, f"```python\n{WRONG_MBPP}\n```") and len(runs) == 2
    assert graders.compiles("x = 1\n") and not graders.compiles("def f(:\n")
    assert not graders.compiles("(" * 10_000)  # a SyntaxError: too many nested parentheses
    # the compiler gives up (RecursionError): not certainly invalid, so the sandbox decides
    assert graders.compiles("x = " + "+".join(["1"] * 200_000))


def test_warnings_made_errors_here_do_not_fail_code_the_sandbox_accepts(
    mbpp127: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under -W error, compile() raises SyntaxError for a SyntaxWarning; the sandbox's
    interpreter (-I) would still run the program, so the pre-check must not fail it."""
    import warnings

    from rl_conductor.tasks import graders

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert graders.compiles("x = 'a' is 'a'\ny = '\\d'\n")
        assert not graders.compiles("def f(:\n")
        assert grade(mbpp127, f"```python\n{mbpp127.answer}\nz = 'a' is 'a'\n```")


def test_the_precheck_prints_no_compile_warnings_about_a_workers_code() -> None:
    """A worker's ``assert (x, y)``, ``1 is 1`` or ``'\\d'`` made compile() print a warning to
    stderr on every grade (thousands in a table build); the sandbox decides what such code means.
    Run with ``-W default`` and no PYTHONWARNINGS, so the result does not depend on the caller's
    environment; other code's warnings must still show."""
    import os
    import subprocess
    import sys

    code = (
        "import warnings\n"
        "from rl_conductor.tasks.graders import compiles\n"
        "programs = ['assert (1, 2)\\n', 'x = 1 is 1\\n', 'y = \"\\\\d\"\\n']\n"
        "with warnings.catch_warnings():  # as pytest wraps a test: a filter added later goes first\n"
        "    warnings.simplefilter('default')\n"
        "    inside = all(compiles(p) for p in programs)\n"
        "print(inside, all(compiles(p) for p in programs), compiles('def f(:\\n'))\n"
        "warnings.warn_explicit('still shown', SyntaxWarning, 'other.py', 1)\n"
        "warnings.warn_explicit('also shown', DeprecationWarning, 'other.py', 2)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    out = subprocess.run(
        [sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["True", "True", "False"]
    # only the pre-check's own warnings are silenced, not SyntaxWarning or DeprecationWarning
    assert "rl-conductor-candidate" not in out.stderr, out.stderr
    assert "still shown" in out.stderr and "also shown" in out.stderr


def test_the_precheck_is_silent_inside_a_test_too(recwarn: pytest.WarningsRecorder) -> None:
    """pytest's per-test warning capture (and ``simplefilter("error")``) put filters in front of
    the pre-check's; it puts its own back first on the next call."""
    import warnings

    from rl_conductor.tasks import graders

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert graders.compiles("assert (1, 2)\n") and graders.compiles("y = '\\d'\n")
    assert graders.compiles("x = 1 is 1\n")
    assert not [w for w in recwarn.list if "rl-conductor-candidate" in str(w.filename)]


def test_a_candidates_future_import_stays_first() -> None:
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.tasks.graders import candidate_program, compiles

    task = next(t for t in load_tasks("mbpp") if t.metadata.get("test_imports"))
    code = f"from __future__ import annotations\n{task.answer}"
    program = candidate_program(task, code)
    assert program.startswith("from __future__ import annotations\n") and compiles(program)
    assert grade(task, f"```python\n{code}\n```")


def test_a_function_named_like_a_builtin_is_the_candidates() -> None:
    """MBPP asks for functions named like builtins (``def sum(a, b)``, tested with
    "assert sum(10, 15) == 6"); the tests called Python's own ``sum``, so even the reference
    solution graded wrong (an outside tester's MBPP recordings: item 67). A builtin the candidate
    does not define is still Python's."""
    gcd_sum = (
        "def sum(a, b):\n    s = 0\n    for i in range(1, min(a, b)):\n"
        "        if a % i == 0 and b % i == 0:\n            s += i\n    return s\n"
    )
    task = Task(id="mbpp/67", question="q", answer=gcd_sum, domain="code", source="mbpp", grader="code",
                 metadata={"tests": ["assert sum(10, 15) == 6", "assert sum(4, 6) == 3"]})  # fmt: skip
    assert grade(task, gcd_sum)
    assert not grade(task, gcd_sum.replace("s += i", "s += 2 * i"))
    assert not grade(task, "def total(a, b):\n    return 6\n")  # Python's sum(10, 15) fails
    tests = ["assert f(3) == 6", "assert sum([f(1), f(2)]) == 6"]
    uses_builtin = Task(id="t/2", question="q", answer="", domain="code", source="t", grader="code",
                        metadata={"tests": tests})  # fmt: skip
    assert grade(uses_builtin, "def f(x):\n    return 2 * x\n")
