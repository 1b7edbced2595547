"""Names of the run params/tags a registered version carries for the evaluation gate.

They live apart from ``registry`` (which imports MLflow, seconds of CPU) so that the gate's
decision rules (``gate.decide``, ``gate.best_baseline``) import without MLflow.
"""

from __future__ import annotations

TEST_SPLIT_KEY = "test_split_id"
#: Run param naming the best baseline of the version's evaluation (what the gate compares with).
BASELINE_POLICY_KEY = "baseline_policy"
