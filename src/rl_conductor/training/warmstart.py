"""Warm-start targets: for a prompt, the candidate workflow with the best *expected* reward.

Why: per-item labels (each training question's own best workflow) reward cheapness — the
cheapest worker is right on the easy items and every worker is wrong on the hard ones, so such
targets send everything to the cheapest worker. What a Conductor can know before it calls
anyone is what kind of question it faces and which workers and budget it has. So the target of a
prompt is the workflow whose reward, averaged over the question's neighbourhood, is highest.

Neighbourhood: the question's (domain, source) group of the candidate table
(:mod:`rl_conductor.training.candidates`), shrunk towards its domain's mean with a weight of
``shrink`` items (a small group leans on its domain). The tiny Conductor sees ~120 characters of
a question: that tells it the kind of question, not the item's hidden difficulty, so finer
neighbourhoods would ask it to learn labels it cannot see.

Budgets and subsets: the target for a prompt with budget ``B`` and shown workers ``S`` is the
best candidate that uses only workers of ``S`` and whose expected reward was measured under the
largest table budget not above ``B`` (candidates unaffordable there are never targets); its
worker ids are remapped to the ordinals the prompt shows. Ties go to fewer steps, then the lower
mean cost, then the name, so targets are deterministic.

Noise: with ``se_rule = k > 0`` (``TrainConfig.warm_se_rule``) a candidate whose mean is within
``k`` paired standard errors of the best's (the standard error of the per-item reward difference,
over the group's items) counts as tied — the one-standard-error rule of model selection. On
paper-sim most composed plans beat the best single by less than a point on some domains; the
best *mean* among dozens of candidates is then partly luck (targets chosen that way put two steps on
knowledge questions, where composition pays least, at the same accuracy on the test split and
twice the tokens). The rule keeps a composed plan only where its edge is larger than the noise.

Deadlines: a table built with deadlines (``candidates.build_table(deadlines=...)``) has one
condition column per deadline, scored on a subset of items (the group mean of such a column is
over the group's scored items; a group without any leans wholly on its domain). A prompt with
deadline ``D`` takes its target from the column of the table deadline nearest ``D`` on a log scale
(:meth:`ExpectedRewards.deadline_index`); with a
budget as well, the candidate must also be affordable under the prompt's budget column as above
(its domain mean unbudgeted cost within that table budget), since the deadline columns are run
without a budget. A table without deadline columns ignores the deadline.
"""

from __future__ import annotations

from rl_conductor.policies.expected import ExpectedRewards, neighbour_means, reward_array

__all__ = ["ExpectedRewards", "neighbour_means", "reward_array"]
