"""``evidence-rule:DIR``: what a trained Conductor's evidence alone would do, without its LM.

Why it exists: a Conductor trained with ``evidence: rank`` is shown a ranking line (the workers the
request may use, best first by the estimated reward of its own evidence model, :class:`~rl_conductor.
policies.evidence.Ranker`) and trained to write its first worker. This policy sends each question
to that worker alone: the bar the LM is trained to reach, and a baseline in ``conductor compare``
beside ``knn`` and ``domain-router``. If the Conductor scores below it, the LM is not following its
evidence (evaluation reports the share of plans that do: ``evidence_agreement``). It reads only the
folder's ``conductor.json`` (the reward the model was trained with, which ranks the workers unless
an evaluation gives its own, as it fits the routers at it) and its evidence files; no weights are
loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl_conductor.errors import InvalidSpec, model_not_found
from rl_conductor.limits import RequestLimits
from rl_conductor.policies.base import Plan, Policy
from rl_conductor.policies.chains import single
from rl_conductor.policies.evidence import EvidenceModel, Ranker, check_known_workers
from rl_conductor.reward import RewardConfig, trained_reward
from rl_conductor.tasks.base import Task
from rl_conductor.workers.pool import Pool, PoolView


class EvidenceRule(Policy):
    """Each question to the first worker of its ranking line (see module docstring)."""

    def __init__(self, model_dir: str | Path, reward: RewardConfig | None = None) -> None:
        from rl_conductor.policies.conductor import model_source, read_conductor_meta
        from rl_conductor.policies.knn_embed import embed

        source = model_source(model_dir)
        if not isinstance(source, Path):
            raise model_not_found(
                str(model_dir), "evidence-rule needs a Conductor folder or URI, not a hub id"
            )
        meta = read_conductor_meta(source)
        if meta.get("evidence") != "rank" or not EvidenceModel.exists(source):
            raise model_not_found(
                str(model_dir), f"{source} was not trained with evidence: rank (conductor.json evidence)"
            )
        self.evidence = EvidenceModel.load(source)
        #: ranked by estimated reward at ``reward`` (an evaluation's, as the routers are fitted
        #: at it), else at the reward the folder was trained with
        self.ranker = Ranker(self.evidence, reward or trained_reward(meta))
        self._embed = embed
        self._embedded: dict[str, Any] = {}
        self.name = f"evidence-rule:{source.name}"

    @classmethod
    def from_spec(cls, arg: str, pool: Pool, **kw: Any) -> EvidenceRule:
        if not arg:
            raise InvalidSpec("evidence-rule needs a Conductor folder trained with evidence: rank")
        rule = cls(arg, reward=kw.get("reward_config"))
        check_known_workers(rule.evidence, pool.names(), rule.name)
        return rule

    async def plan_many(self, tasks: Sequence[Task], view: PoolView, limits: RequestLimits) -> list[Plan]:
        """Embed every question in one batch first (one at a time is far slower on a CPU)."""
        todo = list(dict.fromkeys(t.question for t in tasks if t.question not in self._embedded))
        if todo:
            self._embedded.update(zip(todo, self._embed(todo), strict=True))
        return await super().plan_many(tasks, view, limits)

    async def plan(self, task: Task, view: PoolView, limits: RequestLimits) -> Plan:
        if task.question not in self._embedded:
            if len(self._embedded) > 100_000:
                self._embedded.clear()
            self._embedded[task.question] = self._embed([task.question])[0]
        emb = np.asarray([self._embedded[task.question]])
        estimates = self.evidence.as_mapping(self.evidence.predict([task], emb)[0])
        best = self.ranker(task, estimates, view, limits)[0]
        return Plan(workflow=single(view.names()[best]).workflow(view.names()), evidence_plan=(best,))
