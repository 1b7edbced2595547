"""What a review can read from round 1's answer *texts*, and an estimate of whether escalating pays.

Why it exists: a review that sees only the extracted answers and whether they agree can learn no
more than the disagreement cascade (escalate on disagreement, keep on agreement). The texts say
more: a final number copied from the question, a calculator annotation (``<<6*3=18>>``) or an
inline equation whose arithmetic does not hold, hedging ("I think", "wait", "approximately"), an
answer with no final number, its length. Measured on recorded GSM8K answers
(``benchmarks/adaptive_text.py``), a stop/escalate rule fitted on these beats the best one-round
router at equal cost, so the Conductor's review prompt can show them (``review_evidence: text``
in the training config) with the estimate they give, and the review targets follow that estimate.

What is here, from the bottom up:

- :func:`answer_signals` / :class:`AnswerSignals`: the counts one answer text shows about itself
  and :data:`FEATURES`, their vector. Generic: the numeric and arithmetic ones apply when the
  extracted answer is a number; length, lines, hedges and "no answer found" apply to any answer.
  A missing signal is a defined value (an empty or unparsed answer is all zeros but its length),
  never an error.
- :func:`design`: one row of a review's inputs: each first-round answer's features in step order,
  the agreement of the answers (1, 0; 0.5 when fewer than two answered) and any extra columns
  (e.g. the per-question probes' estimates).
- :class:`Probe` and :func:`fit_probe`: a standardised L2 logistic regression with its strength
  chosen by out-of-fold log-loss, returning the out-of-fold predictions too.
- :func:`choose_tau`: the threshold on the estimated reward gain that maximises the reward of
  "escalate where gain > tau" on out-of-fold estimates (never on the rows the probes saw).
- :class:`FirstPlanEstimator` / :class:`ReviewEvidence`: per first plan (worker names in step
  order), the probe of "round 1's answer is right", one probe per continuation worker ("its
  answer is right"), the continuation's mean extra cost and ``tau``; saved next to the model
  (``review_evidence.json``) like the per-question evidence probe, and read at serving.
  :meth:`ReviewEvidence.estimate` turns a :class:`~rl_conductor.executor.RoundRequest` into an
  :class:`Estimate`: the chance the answer so far is right, the best continuation worker, its
  estimated reward gain, and whether the rule escalates (gain > tau).
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from rl_conductor.prompting import RoundSummary, over_budget, percent
from rl_conductor.reward import RewardConfig, reward_from_dict, reward_of

if TYPE_CHECKING:
    from rl_conductor.executor import RoundRequest

__all__ = [
    "FEATURES",
    "FILE",
    "AnswerSignals",
    "Estimate",
    "Estimator",
    "FirstPlanEstimator",
    "Probe",
    "ReviewEvidence",
    "SignalRule",
    "answer_signals",
    "choose_tau",
    "design",
    "fit_probe",
    "request_rows",
    "text_features",
]

FILE = "review_evidence.json"
FOLDS = 5
#: inverse L2 strengths tried per probe (out-of-fold log-loss)
CS = (0.03, 0.1, 0.3, 1.0)
_NUM = re.compile(r"-?\d[\d,]*\.?\d*")
_ANNOT = re.compile(r"<<([^<>=]+)=([^<>]+)>>")
# an inline equation: an arithmetic expression with an operator, "=", a number. Linear in the
# text (a worker's answer is untrusted; the plain form backtracked cubically on a run of digits):
# a number is possessive (what follows it is never a digit, comma or dot, so giving some back
# cannot help), the operands are atomic (fewer leave an operator where "=" must be), no match
# starts inside a digit run (the run's start reached the same end), and a chain of operands
# without its "= number" is consumed as a whole (:func:`_inline_equations` drops it): a match
# starting inside it reaches the same end and fails the same way.
_OPERAND = r"\$?(?<!\d)(?<!\d,)\d[\d,]*+(?:\.\d*+)?+"
_INLINE = re.compile(rf"((?>{_OPERAND}\s*[-+*/x×÷]\s*)++)(?:({_OPERAND})\s*=\s*\$?(-?\d[\d,]*(?:\.\d*)?))?")
#: longest expression :func:`_eval` evaluates, and the largest exponent a ``**`` may have (an
#: answer's ``<<9**9**9=1>>`` must not compute a number of hundreds of millions of digits)
_MAX_EXPR = 500
_MAX_EXPONENT = 100
_HEDGE = re.compile(
    r"\b(i think|approximately|about|around|assum\w*|not sure|cannot|can't|unclear|however|"
    r"estimate|roughly|likely|probably|seems|wait|mistake|actually|re-?evaluat\w*)\b",
    re.I,
)
FEATURES = (
    "has_answer",
    "log_chars",
    "lines",
    "annotations",
    "equations_checked",
    "equations_wrong",
    "any_wrong",
    "non_integer",
    "negative",
    "copied_from_question",
    "log_magnitude",
    "is_last_result",
    "hedges",
    "new_numbers",
)


def _inline_equations(text: str) -> list[tuple[str, str]]:
    """The inline equations of ``text`` (expression, stated result), in order (:data:`_INLINE`)."""
    return [(m.group(1) + m.group(2), m.group(3)) for m in _INLINE.finditer(text) if m.group(3) is not None]


def _number(s: str) -> float | None:
    """``s`` as a finite number (a 400-digit one is no number: float() reads it as infinity)."""
    try:
        v = float(s.replace(",", "").replace("$", "").strip().rstrip("."))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _eval(expr: str) -> float | None:
    e = expr.replace(",", "").replace("$", "").replace("x", "*").replace("×", "*").replace("÷", "/")
    if len(e) > _MAX_EXPR or not re.fullmatch(r"[\d.\s+\-*/()%]+", e) or not _small_powers(e):
        return None
    try:
        with warnings.catch_warnings():  # "2(3)" warns before it raises
            warnings.simplefilter("ignore", SyntaxWarning)
            v = float(eval(e, {"__builtins__": {}}, {}))  # digits and operators only (checked above)
        # float arithmetic overflows to inf (and inf - inf is nan) where ints raise: no value
        return v if math.isfinite(v) else None
    except (SyntaxError, ZeroDivisionError, TypeError, ValueError, OverflowError, MemoryError):
        return None


def _literal(node: ast.expr) -> bool:
    """A number written out (``3``, ``-2.5``), not computed."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float))


def _small_powers(expr: str) -> bool:
    """Whether every ``**`` in ``expr`` raises a written-out number to a written-out exponent of
    at most :data:`_MAX_EXPONENT` (the only operator whose result can outgrow the text by far);
    False also when ``expr`` does not parse (:func:`_eval` would not evaluate it either)."""
    if "**" not in expr:
        return True
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            if not (_literal(node.left) and _literal(node.right)):
                return False
            exponent = ast.literal_eval(node.right)
            if abs(exponent) > _MAX_EXPONENT:
                return False
    return True


def _holds(lhs: float, rhs: float) -> bool:
    """A stated result holds when it equals the expression up to the rounding a text would do."""
    return abs(lhs - rhs) <= max(0.011, 0.006 * abs(lhs)) or abs(round(lhs) - rhs) < 1e-9


@dataclass(frozen=True)
class AnswerSignals:
    """What one answer text shows about itself (module docstring); :meth:`vector` is its
    :data:`FEATURES` row, :meth:`text` the short phrase a review prompt shows."""

    has_answer: bool
    chars: int
    lines: int
    annotations: int
    checked: int
    wrong: int
    #: the extracted answer as a number (None: no answer, or not a number)
    number: float | None
    copied_from_question: bool
    is_last_result: bool
    hedges: int
    new_numbers: int

    def vector(self) -> list[float]:
        k = self.number
        return [
            float(self.has_answer),
            math.log1p(self.chars),
            min(self.lines, 40) / 10.0,
            min(self.annotations, 20) / 5.0,
            min(self.checked, 20) / 5.0,
            min(self.wrong, 10) / 2.0,
            float(self.wrong > 0),
            float(k is not None and abs(k - round(k)) > 1e-9),
            float(k is not None and k < 0),
            float(k is not None and self.copied_from_question),
            math.log10(abs(k) + 1.0) if k is not None else 0.0,
            float(k is not None and self.is_last_result),
            min(self.hedges, 10) / 2.0,
            min(self.new_numbers, 40) / 10.0,
        ]

    def text(self) -> str:
        """E.g. ``412 chars; 1 of 3 checks wrong; from question; 2 hedges`` (only what is there)."""
        parts = [f"{self.chars} chars" if self.has_answer else f"{self.chars} chars, no answer"]
        if self.checked:
            parts.append(f"{self.wrong} of {self.checked} checks wrong")
        if self.number is not None and self.copied_from_question:
            parts.append("from question")
        if self.hedges:
            parts.append(f"{min(self.hedges, 9)} hedges")
        return "; ".join(parts)


def answer_signals(text: str, key: str | None, question: str) -> AnswerSignals:
    """The signals of one answer ``text`` whose extracted answer is ``key`` (None: none found)."""
    text = text or ""
    results: list[float] = []
    checked = wrong = 0
    equations = [(m.group(1), m.group(2)) for m in _ANNOT.finditer(text)]
    for lhs_text, rhs_text in equations + _inline_equations(text):
        lhs, rhs = _eval(lhs_text), _number(rhs_text)
        if lhs is None or rhs is None:
            continue
        checked += 1
        wrong += not _holds(lhs, rhs)
        results.append(rhs)
    k = _number(key) if key is not None else None
    if k is not None and not math.isfinite(k):
        k = None
    q_numbers = {_number(x) for x in _NUM.findall(question or "")}
    t_numbers = {_number(x) for x in _NUM.findall(text)}
    return AnswerSignals(
        has_answer=key is not None,
        chars=len(text),
        lines=text.count("\n"),
        annotations=len(_ANNOT.findall(text)),
        checked=checked,
        wrong=wrong,
        number=k,
        copied_from_question=k is not None and k in q_numbers,
        is_last_result=k is not None and bool(results) and abs(results[-1] - k) < 1e-9,
        hedges=len(_HEDGE.findall(text)),
        new_numbers=len(t_numbers - q_numbers),
    )


def text_features(text: str, key: str | None, question: str) -> list[float]:
    """:data:`FEATURES` of one answer (:func:`answer_signals`)."""
    return answer_signals(text, key, question).vector()


def agreement_value(agree: bool | None) -> float:
    """The agreement column: 1 agree, 0 disagree, 0.5 with fewer than two answers."""
    return 0.5 if agree is None else float(agree)


def design(
    per_answer: Sequence[Sequence[float]], agree: bool | float | None, extra: Sequence[float] = ()
) -> NDArray[np.float64]:
    """One input row: each answer's features in step order, the agreement column (only with two
    or more answers) and ``extra``."""
    cols = [float(v) for row in per_answer for v in row]
    if len(per_answer) >= 2:
        cols.append(agree if isinstance(agree, float) else agreement_value(agree))
    return np.array([*cols, *(float(v) for v in extra)], dtype=np.float64)


def request_rows(
    request: RoundRequest, summary: RoundSummary
) -> tuple[list[AnswerSignals], NDArray[np.float64]]:
    """The signals of each first-round step of ``request`` (a step that did not answer: an empty
    answer) and its :func:`design` row."""
    keys = dict(zip(summary.steps, summary.answers, strict=True))
    question = request.task.question
    sig = [
        answer_signals(rec.answer if i in keys else "", keys.get(i), question)
        for i, rec in enumerate(request.records)
    ]
    return sig, design([s.vector() for s in sig], summary.agree)


@dataclass
class Probe:
    """``P(y = 1 | x)``: a logistic regression on standardised inputs, or a constant rate."""

    mean: list[float]
    scale: list[float]
    coef: list[float]
    intercept: float
    constant: float | None = None

    def predict(self, x: NDArray[np.floating]) -> NDArray[np.float64]:
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        if self.constant is not None:
            return np.full(len(x), self.constant)
        if x.shape[1] != len(self.coef):
            raise ValueError(f"the probe reads {len(self.coef)} features, got {x.shape[1]}")
        z = ((x - np.array(self.mean)) / np.array(self.scale)) @ np.array(self.coef) + self.intercept
        return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)


def fit_probe(
    x: NDArray[np.floating], y: NDArray[Any], *, seed: int = 0
) -> tuple[Probe, NDArray[np.float64]]:
    """A :class:`Probe` fitted on every row (its strength in :data:`CS` chosen by out-of-fold
    log-loss over :data:`FOLDS` stratified folds) and its out-of-fold predictions on ``x``. With
    one outcome only (or fewer of either than the folds), the rate, shrunk a little towards 1/2."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y).astype(int)

    def model(c: float) -> Any:
        return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))

    if len(y) == 0 or np.bincount(y, minlength=2).min() < FOLDS:
        rate = (float(y.sum()) + 0.5) / (len(y) + 1.0)
        return Probe([], [], [], 0.0, constant=rate), np.full(len(y), rate)
    folds = list(StratifiedKFold(FOLDS, shuffle=True, random_state=seed).split(x, y))
    best: tuple[float, float, NDArray[np.float64]] | None = None
    for c in CS:
        pred = np.zeros(len(x))
        for tr, held in folds:
            pred[held] = model(c).fit(x[tr], y[tr]).predict_proba(x[held])[:, 1]
        q = np.clip(pred, 1e-6, 1 - 1e-6)
        loss = float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)))
        if best is None or loss < best[0]:
            best = (loss, c, pred)
    assert best is not None
    full = model(best[1]).fit(x, y)
    scaler, lr = full[0], full[1]
    probe = Probe(
        mean=[float(v) for v in scaler.mean_],
        scale=[float(v) for v in scaler.scale_],
        coef=[float(v) for v in lr.coef_[0]],
        intercept=float(lr.intercept_[0]),
    )
    return probe, best[2]


def choose_tau(gain: NDArray[np.floating], keep: NDArray[np.floating], go: NDArray[np.floating]) -> float:
    """The ``tau`` (among the gains' percentiles and +inf = never) maximising the mean of ``go``
    where ``gain > tau`` and ``keep`` elsewhere (per-row rewards); ties: the lowest."""
    gain = np.asarray(gain, dtype=np.float64)
    if not len(gain):
        return math.inf
    taus = np.unique(np.concatenate([np.quantile(gain, np.linspace(0, 1, 101)), [np.inf]]))
    return float(max(taus, key=lambda t: float(np.mean(np.where(gain > t, go, keep)))))


def gain_of(config: RewardConfig, p_stay: Any, p_go: Any, extra_cost: float) -> Any:
    """The estimated reward gain of a continuation: ``correct_weight`` x (its chance of being
    right − the answer so far's) − the cost term of its mean extra cost, linear (uncapped: an
    expensive continuation is not made to look cheaper by the cap). Written with the one reward
    formula (:func:`rl_conductor.reward.reward_of`): the reward is linear in ``correct`` and both
    answers called a worker (no format bonus between them), so the gain is the reward of the
    difference in chances at the extra cost."""
    return reward_of(
        config,
        correct=np.asarray(p_go) - np.asarray(p_stay),
        cost=float(extra_cost),
        called=False,
        capped=False,
    )


@dataclass(frozen=True)
class Estimate:
    """A review's estimate: the answer so far right with ``p_right``; the best continuation's
    worker (a name), its chance of being right and its estimated reward gain; ``escalate`` = the
    fitted rule's decision (gain > tau)."""

    p_right: float
    worker: str | None
    p_worker: float
    gain: float
    escalate: bool

    def line(self, worker_id: int | None) -> str:
        """The estimate as the review prompt shows it, ``Best by estimate: @1`` (or ``keep``) last:
        following it is copying a constant, as with the plan's rank address."""
        head = f"Estimate: the answer so far is right ~{percent(self.p_right)}%"
        if self.worker is None or worker_id is None:
            return f"{head}.\nBest by estimate: keep"
        best = "@1" if self.escalate else "keep"
        return (
            f"{head}; escalating to @1 (model {worker_id}) gains ~{self.gain:+.2f}.\nBest by estimate: {best}"
        )


@dataclass
class FirstPlanEstimator:
    """The fitted rule after one first plan (module docstring)."""

    first: list[str]
    stay: Probe
    workers: list[str]
    right: list[Probe]
    extra_cost: list[float]
    tau: float

    def gains(
        self, config: RewardConfig, p_stay: NDArray[np.floating], p_go: NDArray[np.floating]
    ) -> NDArray[np.float64]:
        """``[rows, workers]`` estimated gains from the probes' predictions ``p_go[rows, workers]``."""
        return np.stack(
            [gain_of(config, p_stay, p_go[:, k], c) for k, c in enumerate(self.extra_cost)], axis=1
        ).reshape(len(p_stay), len(self.workers))


@dataclass
class SignalRule:
    """The agreement rule as a review's estimator: per review signal (the round's agreement line,
    :meth:`rl_conductor.rounds.RoundSummary.line`) the worker to escalate to (None: keep), the
    training rate at which the answer kept was right, that worker's, and the decision's mean
    reward gain. ``fallback`` answers a signal training never saw (keep).

    Why: it is the disagreement cascade fitted per domain, the rule ``cascade:domain`` follows; the
    text probes' rule (:class:`FirstPlanEstimator`) was measured to do worse than it on an outside
    tester's file, where answers shared their wrong answers. Training keeps it for a (domain,
    first plan) where its out-of-fold reward beats the probes' (``training/review_text.py``)."""

    first: list[str]
    #: signal -> (the best continuation's worker, the answer kept right, that worker right, the
    #: mean reward gain of escalating to it, whether the rule escalates): the review line names
    #: the worker and its gain whichever it decides, as the probes' line does
    by_signal: dict[str, tuple[str | None, float, float, float, bool]]
    fallback: tuple[str | None, float, float, float, bool] = (None, 0.5, 0.0, 0.0, False)


#: what a review reads after one first plan
Estimator = FirstPlanEstimator | SignalRule


@dataclass
class ReviewEvidence:
    """Per first plan (``"a|b"``: worker names in step order) its :class:`FirstPlanEstimator`,
    and the reward the gains are in."""

    config: RewardConfig
    plans: dict[str, Estimator] = field(default_factory=dict)
    #: domain -> first plan key -> the estimator fitted on that domain's questions alone, where it
    #: beat the shared one there (``training/review_text.py`` ``fit_text_rule``); a review of a
    #: question of that domain reads it in place of :attr:`plans`'
    domain_plans: dict[str, dict[str, Estimator]] = field(default_factory=dict)

    @staticmethod
    def key(names: Sequence[str]) -> str:
        return "|".join(names)

    def estimator(self, domain: str, names: Sequence[str]) -> Estimator | None:
        """The estimator a review of a ``domain`` question after first plan ``names`` reads: the
        domain's own where it has one, else the shared one (None: no estimator covers it)."""
        key = self.key(names)
        return self.domain_plans.get(domain, {}).get(key) or self.plans.get(key)

    def estimate(
        self,
        request: RoundRequest,
        summary: RoundSummary,
        *,
        probs: tuple[float, Sequence[float]] | None = None,
    ) -> tuple[list[AnswerSignals], Estimate | None, int | None]:
        """The signals of ``request``'s first round, the estimate (None where no estimator covers
        its first plan) and the view's ordinal of the estimate's worker (None: keep). Only
        continuation workers the view shows, the limits permit and the budget left affords are
        weighed. ``probs``: the probes' predictions to use instead (out of fold for a training
        prompt): the answer so far's, and each of :attr:`FirstPlanEstimator.workers`'."""
        sig, row = request_rows(request, summary)
        view, limits = request.view, request.limits
        names = view.names()
        steps = request.workflow.steps
        first = [names[s.worker] for s in steps]
        # estimators are fitted on fresh solves in parallel: a chain of the same workers (a later
        # step sees an earlier answer) is another first plan, which none covers
        chained = any(s.visible(i) for i, s in enumerate(steps))
        est = None if chained else self.estimator(request.task.domain, first)
        if est is None or request.round != 2 or len(request.records) != len(first):
            return sig, None, None
        if isinstance(est, SignalRule):
            worker, p_keep, p_up, gain, escalate = est.by_signal.get(summary.line(), est.fallback)
            if worker is None or worker not in names:
                return sig, Estimate(p_keep, None, 0.0, 0.0, False), None
            info = view.worker(names.index(worker)).info
            if over_budget(info, limits.max_cost_usd) or not limits.permits(info.name, info.hosting):
                return sig, Estimate(p_keep, None, 0.0, 0.0, False), None
            return sig, Estimate(p_keep, worker, p_up, gain, escalate), names.index(worker)
        if probs is None:
            p_stay = float(est.stay.predict(row)[0])
            p_go = [float(p.predict(row)[0]) for p in est.right]
        else:
            p_stay, p_go = float(probs[0]), [float(v) for v in probs[1]]
        gains = est.gains(self.config, np.array([p_stay]), np.array([p_go]))[0]
        best: tuple[float, int, int] | None = None
        for k, w in enumerate(est.workers):
            if w not in names:
                continue
            info = view.worker(names.index(w)).info
            if over_budget(info, limits.max_cost_usd) or not limits.permits(info.name, info.hosting):
                continue
            if best is None or gains[k] > best[0]:
                best = (float(gains[k]), k, names.index(w))
        if best is None:
            return sig, Estimate(p_stay, None, 0.0, 0.0, False), None
        g, k, wid = best
        return sig, Estimate(p_stay, est.workers[k], p_go[k], g, g > est.tau), wid

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "rl-conductor/review-evidence/1",
            "features": list(FEATURES),
            "reward": self.config.to_dict(),
            "plans": {k: _estimator_dict(e) for k, e in self.plans.items()},
            # absent in files written before per-domain rules: they load with none
            **(
                {
                    "domain_plans": {
                        d: {k: _estimator_dict(e) for k, e in plans.items()}
                        for d, plans in self.domain_plans.items()
                    }
                }
                if self.domain_plans
                else {}
            ),
        }

    def save(self, folder: str | Path) -> None:
        d = Path(folder)
        d.mkdir(parents=True, exist_ok=True)
        (d / FILE).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ReviewEvidence:
        if list(doc.get("features", [])) != list(FEATURES):
            raise ValueError("review evidence was fitted on other features; train the model again")
        plans = {k: _estimator_from(e) for k, e in doc["plans"].items()}
        domain_plans = {
            d: {k: _estimator_from(e) for k, e in ps.items()} for d, ps in doc.get("domain_plans", {}).items()
        }
        return cls(config=reward_from_dict(doc["reward"]), plans=plans, domain_plans=domain_plans)

    @classmethod
    def load(cls, folder: str | Path) -> ReviewEvidence:
        return cls.from_dict(json.loads((Path(folder) / FILE).read_text()))

    @staticmethod
    def exists(folder: str | Path) -> bool:
        return (Path(folder) / FILE).is_file()


def _estimator_dict(e: Estimator) -> dict[str, Any]:
    if isinstance(e, SignalRule):
        return {
            "kind": "signal",
            "first": e.first,
            "by_signal": {k: list(v) for k, v in e.by_signal.items()},
            "fallback": list(e.fallback),
        }
    return {
        "first": e.first,
        "stay": vars(e.stay),
        "workers": e.workers,
        "right": [vars(p) for p in e.right],
        "extra_cost": e.extra_cost,
        "tau": e.tau if math.isfinite(e.tau) else "inf",
    }


def _signal_entry(v: Sequence[Any]) -> tuple[str | None, float, float, float, bool]:
    # four fields: a file written before the line named a kept answer's best continuation
    escalate = bool(v[4]) if len(v) > 4 else v[0] is not None
    return (None if v[0] is None else str(v[0]), float(v[1]), float(v[2]), float(v[3]), escalate)


def _estimator_from(e: Mapping[str, Any]) -> Estimator:
    if e.get("kind") == "signal":
        return SignalRule(
            first=list(e["first"]),
            by_signal={str(k): _signal_entry(v) for k, v in e["by_signal"].items()},
            fallback=_signal_entry(e["fallback"]),
        )
    return FirstPlanEstimator(
        first=list(e["first"]),
        stay=Probe(**e["stay"]),
        workers=list(e["workers"]),
        right=[Probe(**p) for p in e["right"]],
        extra_cost=[float(c) for c in e["extra_cost"]],
        tau=math.inf if e["tau"] == "inf" else float(e["tau"]),
    )
