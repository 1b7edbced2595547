"""Policies: the LM Conductor and the baselines, behind one interface (see base.py)."""

from rl_conductor.policies.base import Episode, Plan, Policy
from rl_conductor.policies.catalog import make_policy

__all__ = ["Episode", "Plan", "Policy", "make_policy"]
