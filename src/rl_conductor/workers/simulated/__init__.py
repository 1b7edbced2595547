"""The ``simulated`` worker kind: an offline stand-in for the paper's seven workers.

Why it exists: training and evaluating a Conductor needs thousands of worker calls. The simulated
pool answers them in microseconds, for free, deterministically, with single-worker accuracies equal
to the paper's constrained-setting table (Table 7, ``data/calibration``) and prices from
``worker_prices.json``. Its answers are real text that the project's real graders grade. The
numbers are documented in ``docs/simulated-pool.md``.

The model: for worker ``w``, item ``i`` of domain ``d`` and a call ``k`` = (nonce, step index)::

    latent = skill[w,d] − (λ_w·f_i + 1.5·z_i) + topic[w,subject(i)] + ε[w,i] + η[w,i,k] + evidence
    correct ⇔ latent > 0

* ``f_i``: visible difficulty, from the question's own features (MATH level, reference-solution
  length, question length, number and length of choices, number of tests), z-scored per domain on
  the calibration items, weighted and standardised. ``λ_w`` (``feature_weight``): how much it
  hurts this worker (frontier and thinking models < 1, gemma > 1), so routing by it pays.
* ``z_i ~ N(0,1)``: hidden difficulty, a stable hash of (seed, task id), shared by all workers —
  their errors are correlated, as real models' are.
* ``topic ~ N(0, 0.5²)`` per (worker, domain, subject): specialisms a router can learn.
* ``ε ~ N(0, 0.8²)`` per (worker, item): persistent; a worker mostly agrees with itself.
* ``η ~ Logistic(0, 0.35)`` per call (hash of seed, worker, task id, nonce, step): sampling noise;
  self-consistency gains one or two points (Table 5), not more.
* ``evidence``, when the call sees earlier answers (``CallContext.visible_answers``, graded with
  the task's real grader): ``+EVIDENCE_CORRECT`` per correct one, ``−EVIDENCE_WRONG × k`` with
  ``k`` the largest group of identical wrong ones. A worker adopts a correct visible answer more
  readily the closer it was to solving the item itself (the stronger it is) and the more answers
  agree; agreeing wrong answers mislead it, and a wrong worker then repeats that wrong answer with
  probability ``k/(k+1)``. Three strong proposers plus an aggregator beat one answer but stay far
  from the best of the three: Mixture-of-Agents lands near the paper's MoA row.
* ``collaboration`` (:mod:`.collaboration`): the step's *role* — plan, solve, verify or
  aggregate, from keyword classes of its instruction — and who wrote the answers it sees. A plan
  (an outline without a final answer) by a worker strong on the item helps the steps that see it;
  a verifier removes part of the pull of another worker's wrong answer. Strengths differ by
  domain and are fitted so that the best fixed workflow per domain reaches the paper's Conductor
  row. Beyond the role keyword, the wording of an instruction never matters — only live workers
  can reward good instructions — and temperature is ignored (``η`` is the sampling noise).

Calibration: ``skill[w,d]`` is solved on the *realised* outcomes of the deterministic
single-worker call (nonce 0, step 0) on the calibration items (default: ``paper-mix``, all splits,
≤ 500 items per domain by :func:`calibration_subset`). Item ``i`` is correct iff ``skill > c_i``
(``c_i`` = difficulty − topic − ε − η), so realised accuracy is a step function of the skill and
the solution is the order statistic that makes ``round(target·n)`` items correct — the limit of a
bisection, computed directly. Independent draws would add binomial sampling noise per domain
on top of the paper's numbers; fitting to the realised draws removes it on the
calibration items, while other items (a split alone, another seed, other datasets) keep honest
sampling noise, as a real worker's accuracy would.

Answers: correct → filler reasoning, then the gold in the grader's format (``\\boxed{gold}``,
``Answer: X``, ``Answer: gold``, the reference code in a python block); wrong → one of a small,
popularity-weighted per-item set of wrong answers (perturbed numbers, other letters, mutated
reference code), each checked once with the real grader and replaced if it passes, so wrong
answers of different workers often coincide. The filler has no digits, lone letters or answer
phrases, so it never changes a grade, and it makes the text as long as the drawn output length
(lognormal per worker and domain, thinking models ≈3× longer, capped at 4,000 tokens):
``output_tokens == estimate_tokens(text)`` and visible context costs realistic input tokens.

Layout: :mod:`.draws` (stable hashed randomness), :mod:`.skill` (paper numbers, difficulty
features, fitted skills, the shared model), :mod:`.answers` (text, wrong answers, cached grading),
:mod:`.collaboration` (roles, plan and verify effects), :mod:`.worker` (profiles, one call's
outcome, tokens, cost, latency, the ``simulated`` pool kind). Everything public is re-exported
here.

Deliberate simplifications: a ``max_tokens`` below the drawn length cuts the text before its
answer (wrong); truncation at the paper's 4,096 limit is already inside its accuracies. A call
without a ``CallContext`` or gold answer (a serving request) gets a placeholder answer. Wrong
answers are crude perturbations, not real model mistakes.
"""

from __future__ import annotations

from rl_conductor.workers.simulated.answers import (
    WRONG_SET_SIZE,
    WRONG_WEIGHTS,
    answer_key,
    grade_cached,
    grade_cached_async,
    render_answer,
    simulated_value,
    wrong_candidates,
)
from rl_conductor.workers.simulated.collaboration import (
    PAPER_COLLABORATION,
    ROLE_INSTRUCTIONS,
    ROLE_KEYWORDS,
    Collaboration,
    Role,
    classify_role,
)
from rl_conductor.workers.simulated.draws import logistic, normal, unit
from rl_conductor.workers.simulated.skill import (
    CALL_NOISE_SCALE,
    DEFAULT_CALIBRATION,
    DEFAULT_CALIBRATION_N,
    DOMAIN_COLUMNS,
    HIDDEN_DIFFICULTY_SD,
    IDIOSYNCRATIC_SD,
    PAPER_TABLE,
    TOPIC_SD,
    FeatureScaler,
    SimulationModel,
    calibration_subset,
    paper_rows,
    paper_targets,
    raw_features,
    shared_model,
    worker_prices,
)
from rl_conductor.workers.simulated.worker import (
    EVIDENCE_CORRECT,
    EVIDENCE_WRONG,
    LENGTH_SIGMA,
    MAX_SIM_OUTPUT_TOKENS,
    PROFILES,
    SimulatedWorker,
    WorkerProfile,
    build_simulated,
)

__all__ = [
    "CALL_NOISE_SCALE",
    "DEFAULT_CALIBRATION",
    "DEFAULT_CALIBRATION_N",
    "DOMAIN_COLUMNS",
    "EVIDENCE_CORRECT",
    "EVIDENCE_WRONG",
    "HIDDEN_DIFFICULTY_SD",
    "IDIOSYNCRATIC_SD",
    "LENGTH_SIGMA",
    "MAX_SIM_OUTPUT_TOKENS",
    "PAPER_COLLABORATION",
    "PAPER_TABLE",
    "PROFILES",
    "ROLE_INSTRUCTIONS",
    "ROLE_KEYWORDS",
    "TOPIC_SD",
    "WRONG_SET_SIZE",
    "WRONG_WEIGHTS",
    "Collaboration",
    "FeatureScaler",
    "Role",
    "SimulatedWorker",
    "SimulationModel",
    "WorkerProfile",
    "answer_key",
    "build_simulated",
    "calibration_subset",
    "classify_role",
    "grade_cached",
    "grade_cached_async",
    "logistic",
    "normal",
    "paper_rows",
    "paper_targets",
    "raw_features",
    "render_answer",
    "shared_model",
    "simulated_value",
    "unit",
    "worker_prices",
    "wrong_candidates",
]
