"""The policy catalog: a policy spec (``single:gpt-5``, ``knn``, ``conductor:DIR`` …) to a Policy.

Why a module of its own, above the policy kinds: each kind builds on :mod:`rl_conductor.policies.base`
(the Policy interface and the episode runner); the catalog names the kinds and imports one only
when a spec asks for it (the Conductor's kind pulls in torch), so the base never refers to the
modules built on it.
"""

from __future__ import annotations

import importlib
from typing import Any

from rl_conductor.errors import InvalidSpec, UnknownName, UserError
from rl_conductor.policies.base import Policy
from rl_conductor.workers.pool import Pool

#: Each policy kind of a spec (``kind:arg``) and the ``module:Class`` that builds it.
POLICY_KINDS = {
    "single": "rl_conductor.policies.baselines:SingleWorker",
    "random": "rl_conductor.policies.baselines:RandomWorkflow",
    "moa": "rl_conductor.policies.baselines:MixtureOfAgents",
    "self-consistency": "rl_conductor.policies.baselines:SelfConsistency",
    "oracle": "rl_conductor.policies.baselines:Oracle",
    "knn": "rl_conductor.policies.knn:KnnRouter",
    "conductor": "rl_conductor.policies.conductor:ConductorPolicy",
    "evidence-rule": "rl_conductor.policies.evidence_rule:EvidenceRule",
    "domain-router": "rl_conductor.policies.routers:DomainRouter",
    "cascade": "rl_conductor.policies.cascade:Cascade",
    "fixed": "rl_conductor.policies.fixed:FixedPlan",
}


#: Kinds fitted at (or ranking by) the evaluation's reward, so that refitting them at each cost weight
#: traces a cost-accuracy frontier (``conductor compare --frontier``); the others do not move with it.
FRONTIER_KINDS = ("cascade", "domain-router", "evidence-rule", "knn")


def policy_names() -> list[str]:
    return sorted(POLICY_KINDS)


def make_policy(spec: str, pool: Pool, **kwargs: Any) -> Policy:
    """Build a policy from a spec like ``single:gpt-5``, ``moa``, ``moa:a,b>c``,
    ``self-consistency:gpt-5``, ``random``, ``oracle``, ``knn``, ``domain-router``,
    ``fixed:0,1``, ``conductor:PATH`` or ``evidence-rule:PATH``: the one parser of policy specs,
    used by ``conductor eval``/``compare``, ``conductor serve --policy`` and the pipeline alike."""
    kind, _, arg = spec.partition(":")
    if kind not in POLICY_KINDS:
        raise UnknownName(f"unknown policy {spec!r}; known kinds: {', '.join(policy_names())}")
    module, _, cls_name = POLICY_KINDS[kind].partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    try:
        return cls.from_spec(arg, pool, **kwargs)
    except UserError:
        raise
    except ValueError as exc:
        # from_spec parses what the user wrote after the colon; its ValueErrors are about that
        raise InvalidSpec(f"policy {spec!r}: {exc}") from exc
