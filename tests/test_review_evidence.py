"""The review's text evidence (``rl_conductor.review_evidence``): signals on crafted answers, the
probe, tau, and the saved estimator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rl_conductor.review_evidence import (
    FEATURES,
    FirstPlanEstimator,
    Probe,
    ReviewEvidence,
    answer_signals,
    choose_tau,
    design,
    fit_probe,
    text_features,
)
from rl_conductor.reward import RewardConfig

Q = "Tom has 5 apples and buys 7 more. How many apples does he have?"


def feat(text: str, key: str | None, question: str = Q) -> dict[str, float]:
    return dict(zip(FEATURES, text_features(text, key, question), strict=True))


def test_arithmetic_that_does_not_hold_is_counted_and_one_that_holds_is_not() -> None:
    # an annotation's inside is an inline equation too, so it is checked twice (as the benchmark did)
    s = answer_signals("He has 5 + 7 = 13 apples. <<5+7=12>> The answer is 12", "12", Q)
    assert (s.checked, s.wrong, s.annotations) == (3, 1, 1)
    ok = answer_signals("He has 5 + 7 = 12 apples. <<5+7=12>>12", "12", Q)
    assert (ok.checked, ok.wrong) == (3, 0)
    assert feat("5 + 7 = 13. So 13", "13")["any_wrong"] == 1.0
    assert feat("5 + 7 = 12. So 12", "12")["any_wrong"] == 0.0
    assert ok.is_last_result and feat("5 + 7 = 12. So 12", "12")["is_last_result"] == 1.0
    assert feat("5 + 7 = 12. So 11", "11")["is_last_result"] == 0.0


def test_a_final_number_copied_from_the_question_and_hedges_are_seen() -> None:
    f = feat("I think he probably has 7 apples. Wait, 7.", "7")
    assert f["copied_from_question"] == 1.0
    assert f["hedges"] == 3 / 2.0  # "I think", "probably", "wait"
    assert feat("He has 12 apples.", "12")["copied_from_question"] == 0.0
    assert feat("He has 12 apples.", "12")["hedges"] == 0.0
    assert feat("It is -2.5", "-2.5")["negative"] == 1.0 and feat("It is -2.5", "-2.5")["non_integer"] == 1.0


def test_a_missing_answer_or_a_non_numeric_one_is_a_defined_row_not_a_crash() -> None:
    empty = text_features("", None, Q)
    assert len(empty) == len(FEATURES) and all(math.isfinite(v) for v in empty)
    assert empty == [0.0] * len(FEATURES)
    unparsed = feat("I cannot tell from the text.", None)
    assert unparsed["has_answer"] == 0.0 and unparsed["log_chars"] > 0 and unparsed["hedges"] > 0
    letter = feat("The answer is (B).", "B")
    assert letter["has_answer"] == 1.0
    assert letter["log_magnitude"] == letter["copied_from_question"] == letter["non_integer"] == 0.0
    assert answer_signals("", None, "").text() == "0 chars, no answer"
    inf = feat("a lot", "1e999")  # not a finite number: treated as no number
    assert inf["log_magnitude"] == 0.0


#: answers a worker (or a question that steers it) could send a text review: each took minutes to
#: hours before the signals were linear and ``**`` bounded (1,000 digits: 16 s; the power: hangs)
_HOSTILE = """
import json, time
from rl_conductor.review_evidence import answer_signals
texts = ["1" * 100_000, "1," * 50_000, "1 + " * 25_000 + "a", "1x" * 50_000,
         "<<9**9**9=1>>", "<<10**10**8=1>>", "<<(2**50)**90=1>>", "<<2**3=8>> so 8"]
start = time.perf_counter()
rows = [(s.checked, s.wrong) for s in (answer_signals(t, "8", "What is 2**3?") for t in texts)]
print(json.dumps({"rows": rows, "s": time.perf_counter() - start}))
"""


def test_hostile_answer_texts_are_read_in_linear_time_and_huge_powers_are_not_computed() -> None:
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-c", _HOSTILE]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["s"] < 10.0
    # no equation in the runs and chains; the huge powers are not checked; a small one is, and holds
    assert got["rows"] == [[0, 0]] * 7 + [[1, 0]]


def test_arithmetic_that_overflows_a_float_is_not_checked_and_does_not_raise() -> None:
    """``<<1e400-ish*2=...>>`` evaluated to inf, whose check raised OverflowError in round() (and
    ``inf - inf`` to nan): one such answer failed a whole batch of reviews."""
    big = "1" + "0" * 400 + ".0"
    p99 = "*".join(["10.0**99"] * 4)
    for text in (f"<<{big}*2={big}>>", f"<<{p99}-{p99}=1>>", f"<<{p99}=1>>", f"{big} + 1 = {big}"):
        s = answer_signals(text, big, Q)
        assert (s.checked, s.wrong, s.number) == (0, 0, None), text
        assert all(math.isfinite(v) for v in s.vector())
    ok = answer_signals("<<10.0**2=100>>", "100", Q)
    assert (ok.checked, ok.wrong) == (1, 0)


def test_the_prompt_phrase_names_only_the_signals_that_are_there() -> None:
    s = answer_signals("I think 5 + 7 = 13, so 7", "7", Q)
    assert (
        s.text() == f"{len('I think 5 + 7 = 13, so 7')} chars; 1 of 1 checks wrong; from question; 1 hedges"
    )
    assert answer_signals("12", "12", Q).text() == "2 chars"


def test_design_adds_agreement_only_with_two_answers() -> None:
    a, b = text_features("12", "12", Q), text_features("13", "13", Q)
    assert len(design([a], None)) == len(FEATURES)
    two = design([a, b], False, extra=[0.3])
    assert len(two) == 2 * len(FEATURES) + 2
    assert two[2 * len(FEATURES)] == 0.0 and two[-1] == 0.3
    assert design([a, b], True)[-1] == 1.0 and design([a, b], None)[-1] == 0.5


def test_the_probe_learns_a_signal_out_of_fold_and_a_one_outcome_target_is_its_rate() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3))
    y = (x[:, 0] + 0.3 * rng.normal(size=400) > 0).astype(int)
    probe, oof = fit_probe(x, y)
    assert oof.shape == (400,) and np.mean((oof > 0.5) == y) > 0.85
    assert probe.predict(np.array([[3.0, 0, 0]]))[0] > 0.9 > 0.1 > probe.predict(np.array([[-3.0, 0, 0]]))[0]
    flat, oof1 = fit_probe(x, np.ones(400, dtype=int))
    assert flat.constant == pytest.approx(400.5 / 401) and np.all(oof1 == flat.constant)
    with pytest.raises(ValueError, match="reads 3 features"):
        probe.predict(np.zeros((1, 4)))


def test_tau_escalates_exactly_where_it_pays_on_the_rows_given() -> None:
    gain = np.linspace(-1, 1, 200)
    keep = np.zeros(200)
    go = np.where(gain > 0.2, 1.0, -1.0)  # escalating pays only above 0.2
    tau = choose_tau(gain, keep, go)
    assert np.mean(np.where(gain > tau, go, keep)) == pytest.approx(np.mean(np.maximum(go, 0)))
    assert 0.15 <= tau <= 0.25
    never = choose_tau(gain, keep, -np.ones(200))  # never pays: no row escalates
    assert not np.any(gain > never)
    assert choose_tau(np.array([]), keep[:0], keep[:0]) == math.inf


def test_the_estimator_round_trips_through_its_file(tmp_path: object) -> None:
    probe = Probe(mean=[0.0, 1.0], scale=[1.0, 2.0], coef=[0.5, -1.0], intercept=0.1)
    ev = ReviewEvidence(
        config=RewardConfig(cost_weight=0.25),
        plans={
            "a|b": FirstPlanEstimator(
                first=["a", "b"],
                stay=probe,
                workers=["c"],
                right=[Probe([], [], [], 0.0, constant=0.9)],
                extra_cost=[0.004],
                tau=math.inf,
            )
        },
    )
    ev.save(tmp_path)  # type: ignore[arg-type]
    back = ReviewEvidence.load(tmp_path)  # type: ignore[arg-type]
    assert back.config == ev.config and back.plans["a|b"].tau == math.inf
    x = np.array([[0.3, 2.0]])
    assert back.plans["a|b"].stay.predict(x) == pytest.approx(probe.predict(x))
    assert back.plans["a|b"].right[0].predict(x)[0] == 0.9
