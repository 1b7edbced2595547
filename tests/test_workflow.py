"""Workflow parsing, rendering and worker messages.

Property tests (hypothesis) check that no text, however malformed, makes ``parse`` raise anything
but :class:`ParseError`, and that ``render`` → ``parse`` round-trips generated workflows; the
named tests pin each documented error and rule of the format.
"""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rl_conductor.workflow import (
    DEFAULT_MAX_STEPS,
    LIST_NAMES,
    ParseError,
    Step,
    Workflow,
    normalize,
    parse,
    render,
    worker_message,
)

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------------- strategies

#: Characters that stress the list scanner and literal_eval: quotes, brackets, escapes, newlines.
_NASTY = "[]{}()'\"\\\n\t,:=#`$ \u00e9\u4e2d\U0001f600\u200b"
_TRICKY_INSTRUCTIONS = [
    "model_id = [1] is what I would write",
    "then access_list: [0] and subtasks = ['x']",
    "'''triple''' and \"\"\"double\"\"\"",
    "a backslash \\ at the end \\",
    "line one\nline two\n\nline four",
    "brackets ] [ ]] [[ unbalanced",
    "quotes ' \" '' \"\" mixed",
    "\u00bfQu\u00e9 es \u03c0? \u4e2d\u6587 \U0001f9ee",
]

_instruction = (
    st.one_of(
        st.sampled_from(_TRICKY_INSTRUCTIONS),
        st.text(
            alphabet=st.one_of(st.sampled_from(_NASTY), st.characters(codec="utf-8")), min_size=1, max_size=40
        ),
    )
    .map(str.strip)
    .filter(bool)
)


@st.composite
def workflows(draw: st.DrawFn, *, max_steps: int = DEFAULT_MAX_STEPS) -> tuple[Workflow, int]:
    """A valid workflow of 1..max_steps steps and the pool size it refers to."""
    pool_size = draw(st.integers(1, 7))
    n = draw(st.integers(1, max_steps))
    steps = []
    for i in range(n):
        worker = draw(st.integers(0, pool_size - 1))
        if i == 0:
            access: object = draw(st.sampled_from([(), "all"]))
        else:
            access = draw(
                st.one_of(
                    st.just("all"),
                    st.just(()),
                    st.lists(st.integers(0, i - 1), unique=True, max_size=i).map(lambda x: tuple(sorted(x))),
                )
            )
        steps.append(Step(worker=worker, instruction=draw(_instruction), access=access))  # type: ignore[arg-type]
    return Workflow(steps=tuple(steps)), pool_size


def _well_formed(wf: Workflow, pool_size: int, max_steps: int) -> None:
    """The invariants every parsed workflow satisfies."""
    assert 1 <= len(wf) <= max_steps
    for i, s in enumerate(wf.steps):
        assert 0 <= s.worker <= pool_size
        assert s.instruction and s.instruction == s.instruction.strip()
        assert s.access == "all" or all(0 <= r < i for r in s.access)


# ----------------------------------------------------------------------------- properties


@PROPERTY
@given(st.text(max_size=400))
def test_arbitrary_text_raises_only_parse_error(text: str) -> None:
    try:
        wf = parse(text, pool_size=4)
    except ParseError:
        return
    _well_formed(wf, 4, DEFAULT_MAX_STEPS)


_FRAGMENTS = [
    *(f"{n} = [" for n in LIST_NAMES),
    *(f"{n}: [" for n in LIST_NAMES),
    "[",
    "]",
    "'",
    '"',
    "'''",
    '"""',
    "\\",
    ",",
    " ",
    "\n",
    '"all"',
    "'all'",
    "[]",
    "0",
    "1",
    "-1",
    "7",
    "0x" + "f" * 4000,
    "9" * 5000,
    "1e400",
    "1j",
    "True",
    "None",
    "{1: 2}",
    "{1, 2}",
    "(0,)",
    "...",
    "[" * 300,
    "]" * 300,
    "\x00",
    "\u2028",
    "\ufeff",
    "x",
    "# c",
    "lambda: 0",
    "__import__('os')",
]


@PROPERTY
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=40).map("".join))
def test_fragment_soup_raises_only_parse_error(text: str) -> None:
    try:
        wf = parse(text, pool_size=3, allow_empty=True)
    except ParseError:
        return
    assert len(wf) <= DEFAULT_MAX_STEPS


def _mutate(text: str, rng: random.Random) -> str:
    kind = rng.randrange(7)
    pos = rng.randrange(len(text) + 1)
    if kind == 0:  # truncation
        return text[:pos]
    if kind == 1:  # bracket / quote insertion
        return text[:pos] + rng.choice("[]'\"\\(){}") * rng.randint(1, 3) + text[pos:]
    if kind == 2:  # swapped list names
        a, b = rng.sample(LIST_NAMES, 2)
        return text.replace(a, "\0").replace(b, a).replace("\0", b)
    if kind == 3:  # huge ints (decimal beyond the digit limit, hex far beyond it)
        big = rng.choice(["9" * 5000, "0x" + "f" * 5000, "-0x" + "f" * 5000, str(2**64)])
        return re.sub(r"\b\d\b", big, text, count=rng.randint(1, 3))
    if kind == 4:  # nested lists
        depth = rng.choice([2, 3, 50, 1000])
        return text.replace("[]", "[" * depth + "]" * depth, 1).replace(
            "[0", "[" * depth + "0" + "]" * (depth - 1), 1
        )
    if kind == 5:  # deletion of a span
        return text[:pos] + text[pos + rng.randint(1, 20) :]
    return (
        text[:pos] + rng.choice(["model_id = [", "access_list = [", "subtasks = ['", ", 'all'"]) + text[pos:]
    )


@PROPERTY
@given(workflows(), st.randoms(use_true_random=False), st.integers(1, 4))
def test_mutated_workflow_text_raises_only_parse_error(
    case: tuple[Workflow, int], rng: random.Random, rounds: int
) -> None:
    wf, pool_size = case
    text = render(wf, reasoning="Let me think about which model is best.")
    for _ in range(rounds):
        text = _mutate(text, rng)
    try:
        got = parse(text, pool_size=pool_size)
    except ParseError:
        return
    _well_formed(got, pool_size, DEFAULT_MAX_STEPS)


@PROPERTY
@given(workflows(), st.text(max_size=60).filter(lambda r: not any(n in r for n in LIST_NAMES)))
def test_render_parse_round_trip(case: tuple[Workflow, int], reasoning: str) -> None:
    wf, pool_size = case
    text = render(wf, reasoning=reasoning)
    got = parse(text, pool_size=pool_size)
    assert normalize(got) == normalize(wf)
    assert got.reasoning == reasoning.strip()
    # a parsed workflow renders to itself exactly (the canonical spelling is a fixed point)
    assert render(parse(render(got), pool_size=pool_size)) == render(got)
    # and parses back to itself: parse(render(w)) == w for every w that parse returns
    assert parse(render(got), pool_size=pool_size) == got


def test_round_trip_keeps_all_spelling_and_explicit_lists() -> None:
    wf = Workflow(steps=(Step(1, "a", ()), Step(0, "b", (0,)), Step(2, "c", "all"), Step(1, "d", (0, 2))))
    got = parse(render(wf), pool_size=3)
    assert got.steps[1].access == (0,)
    assert got.steps[2].access == "all"
    assert got.steps[3].access == (0, 2)
    assert got == wf


@pytest.mark.parametrize("instruction", _TRICKY_INSTRUCTIONS)
def test_instruction_mentioning_list_names_round_trips(instruction: str) -> None:
    wf = Workflow(steps=(Step(0, instruction.strip(), ()), Step(2, "check " + instruction.strip(), "all")))
    assert parse(render(wf), pool_size=3) == wf


# ----------------------------------------------------------------------------- named rules


def _text(ids: str, subs: str, acc: str, prefix: str = "") -> str:
    return f"{prefix}model_id = {ids}\nsubtasks = {subs}\naccess_list = {acc}"


def test_paper_example_parses() -> None:
    text = (
        "I will let model 2 solve it and model 0 check.\n"
        'model_id = [2, 0]\nsubtasks = ["Solve.", "Check."]\naccess_list = [[], "all"]'
    )
    wf = parse(text, pool_size=3)
    assert wf.workers() == [2, 0]
    assert [s.instruction for s in wf.steps] == ["Solve.", "Check."]
    assert wf.dependencies() == [(), (0,)]
    assert wf.reasoning == "I will let model 2 solve it and model 0 check."


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_text("[0, 1]", "['a']", "[[], []]"), "unequal lengths"),
        (_text("[0, 1]", "['a', 'b']", "[[], [1]]"), "not earlier than step 1"),
        (_text("[0, 1]", "['a', 'b']", "[[1], []]"), "not earlier than step 0"),
        (_text("[0]", "['a']", "[[0]]"), "not earlier than step 0"),
        (_text("[0, 1]", "['a', 'b']", "[[], [-1]]"), "negative"),
        (_text("[0, 4]", "['a', 'b']", "[[], []]"), "out of range 0..2"),
        (_text("[-1]", "['a']", "[[]]"), "out of range"),
        (_text("[True]", "['a']", "[[]]"), "must be an int"),
        (_text("[0]", "['  ']", "[[]]"), "is empty"),
        (_text("[0]", "[1]", "[[]]"), "must be a string"),
        (_text("[0, 0]", "['a', 'b']", "[[], ['0']]"), "step indices"),
        (_text("[0, 0]", "['a', 'b']", "[[], 'some']"), '"all" or a list'),
        (_text("[0]", "['a']", "[[]"), "not closed"),
        (_text("[0]", "['a]", "[[]]"), "unterminated string"),
        (_text("[x]", "['a']", "[[]]"), "not a Python list literal"),
        ("model_id = [0]\naccess_list = [[]]", "missing `subtasks"),
        (_text("[]", "[]", "[]"), "no steps"),
    ],
)
def test_specific_errors(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        parse(text, pool_size=3)


def test_all_means_every_earlier_step_and_self_reference_is_an_error() -> None:
    assert parse(_text("[0, 0]", "['a', 'b']", '[[], "all"]'), pool_size=1).steps[1].visible(1) == (0,)
    with pytest.raises(ParseError, match="refers to step 1"):
        parse(_text("[0, 0]", "['a', 'b']", "[[], [0, 1]]"), pool_size=1)


def test_an_id_beyond_the_view_is_out_of_range() -> None:
    """Finding 1: the pool size (once "yourself") is no worker id."""
    text = _text("[0, 3]", "['solve', 'reconsider']", '[[], "all"]')
    with pytest.raises(ParseError, match=r"out of range 0\.\.2"):
        parse(text, pool_size=3)
    with pytest.raises(ParseError, match=r"out of range 0\.\.2"):
        parse(_text("[3]", "['do nothing']", "[[]]"), pool_size=3)


def test_a_continuation_is_numbered_after_the_steps_so_far() -> None:
    """A later round's steps may see any earlier step of the request, none of their own later ones."""
    text = _text("[1, 0]", "['check', 'decide']", '[[0, 2], "all"]')
    wf = parse(text, pool_size=2, first_index=3)
    assert wf.steps[0].visible(3) == (0, 2) and wf.steps[1].visible(4) == (0, 1, 2, 3)
    with pytest.raises(ParseError, match="refers to step 3"):
        parse(_text("[1]", "['check']", "[[3]]"), pool_size=2, first_index=3)
    with pytest.raises(ParseError, match="refers to step 0"):
        parse(text, pool_size=2)  # without the offset, the first step sees nothing


def test_too_many_steps() -> None:
    six = _text(str([0] * 6), str(["a"] * 6), str([[]] * 6))
    with pytest.raises(ParseError, match="6 steps; at most 5"):
        parse(six, pool_size=1)
    assert len(parse(six, pool_size=1, max_steps=6)) == 6
    with pytest.raises(ParseError, match="at most 2"):
        parse(_text("[0, 0, 0]", "['a', 'b', 'c']", "[[], [], []]"), pool_size=1, max_steps=2)


def test_empty_lists_only_with_allow_empty() -> None:
    text = "Keep the previous answer.\nmodel_id = []\nsubtasks = []\naccess_list = []"
    with pytest.raises(ParseError, match="no steps"):
        parse(text, pool_size=3)
    wf = parse(text, pool_size=3, allow_empty=True)
    assert len(wf) == 0
    assert wf.reasoning == "Keep the previous answer."


def test_last_occurrence_wins_after_reasoning() -> None:
    text = (
        "First idea: model_id = [0, 1] and subtasks = ['x', 'y'] with access_list = [[], 'all'].\n"
        "Better: only one step.\n" + _text("[2]", "['Solve it.']", "[[]]")
    )
    wf = parse(text, pool_size=3)
    assert wf.workers() == [2]
    assert wf.steps[0].instruction == "Solve it."
    assert wf.reasoning.startswith("First idea:")
    # a broken draft before the final lists does not matter, a broken final list does
    assert parse("model_id = [oops\n" + _text("[1]", "['a']", "[[]]"), pool_size=3).workers() == [1]
    with pytest.raises(ParseError):
        parse(_text("[1]", "['a']", "[[]]") + "\nmodel_id = [oops", pool_size=3)


def test_colon_spelling_and_python_tuples_are_accepted() -> None:
    wf = parse('model_id: [1, 0]\nsubtasks: ["a", "b"]\naccess_list: [[], (0,)]', pool_size=2)
    assert wf.steps[1].access == (0,)


def test_access_all_on_step_zero_means_nothing() -> None:
    wf = parse(_text("[0, 1]", "['a', 'b']", '["all", "all"]'), pool_size=2)
    assert wf.steps[0].access == ()
    assert wf.steps[0].visible(0) == ()
    assert wf.steps[1].access == "all"
    assert wf.dependencies() == [(), (0,)]


def test_access_indices_are_deduplicated_and_sorted() -> None:
    wf = parse(_text("[0, 0, 0]", "['a', 'b', 'c']", "[[], [], [1, 0, 1]]"), pool_size=1)
    assert wf.steps[2].access == (0, 1)


def test_parse_never_evaluates_code() -> None:
    text = _text("[__import__('os').getpid()]", "['a']", "[[]]")
    with pytest.raises(ParseError, match="not a Python list literal"):
        parse(text, pool_size=3)


@example(visible_idx=[0, 2], n=4)
@given(st.lists(st.integers(0, 4), unique=True).map(sorted), st.integers(1, 5))
def test_worker_message_shows_exactly_the_visible_steps(visible_idx: list[int], n: int) -> None:
    answers = {i: f"ANSWER-{i}-\u00e9" for i in range(5)}
    subtasks = {i: f"SUBTASK-{i} [with] {{braces}}" for i in range(5)}
    visible = [(i, subtasks[i], answers[i]) for i in visible_idx]
    msg = worker_message("What is {x}?", visible, "Give the final answer.")
    assert "What is {x}?" in msg
    assert msg.rstrip().endswith("Your subtask: Give the final answer.")
    for i in range(5):
        assert (answers[i] in msg) == (i in visible_idx)
        assert (subtasks[i] in msg) == (i in visible_idx)
        assert (f"[Step {i}]" in msg) == (i in visible_idx)
    assert ("Earlier steps" in msg) == bool(visible_idx)
    # visible steps appear in the given order, before the step's own subtask
    positions = [msg.index(answers[i]) for i in visible_idx]
    assert positions == sorted(positions)
    assert all(p < msg.index("Your subtask:") for p in positions)


def test_full_explicit_access_list_round_trips_exactly() -> None:
    """``render`` spelled (0, 1) at step 2 as "all", so parse(render(w)) != w."""
    wf = Workflow(steps=(Step(0, "a", ()), Step(1, "b", (0,)), Step(0, "c", (0, 1)), Step(1, "d", "all")))
    assert parse(render(wf), pool_size=2) == wf


@pytest.mark.parametrize("value", [None, 1, b"model_id = [0]", ["model_id = [0]"]])
def test_non_text_is_a_parse_error(value: object) -> None:
    with pytest.raises(ParseError, match="not text"):
        parse(value, pool_size=3)  # type: ignore[arg-type]


def test_triple_quoted_instructions_parse() -> None:
    subtasks = "subtasks = ['''Solve ] this''', \"\"\"Check [it] \"\"\"]"
    text = f'model_id = [0, 1]\n{subtasks}\naccess_list = [[], "all"]'
    wf = parse(text, pool_size=2)
    assert [s.instruction for s in wf.steps] == ["Solve ] this", "Check [it]"]
    with pytest.raises(ParseError, match="unterminated"):
        parse("model_id = [0]\nsubtasks = ['''never closed ]\naccess_list = [[]]", pool_size=1)
    # a quote character inside a triple-quoted string does not end it
    quoted = "model_id = [0]\nsubtasks = ['''it's ] done''']\naccess_list = [[]]"
    assert parse(quoted, pool_size=1).steps[0].instruction == "it's ] done"


def test_list_followed_directly_by_semicolon() -> None:
    wf = parse("model_id = [1];subtasks = ['a'];access_list = [[]];", pool_size=2)
    assert wf.workers() == [1] and wf.steps[0].instruction == "a"


def test_error_messages_shorten_long_values_to_80_characters() -> None:
    from rl_conductor.workflow import _show

    exact = "x" * 78  # repr adds the quotes: 80 characters, kept whole
    assert _show(exact) == repr(exact)
    long = _show("y" * 200)
    assert len(long) == 80 and long.endswith("...") and long.startswith("'yyy")


def test_blank_reasoning_renders_no_leading_line() -> None:
    wf = Workflow(steps=(Step(0, "a", ()),))
    assert render(wf, reasoning="   ") == render(wf) == render(wf, reasoning="")
    assert render(wf).startswith("model_id = [0]")
