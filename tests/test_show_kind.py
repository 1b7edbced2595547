"""``show_kind`` (training config; the kind line): the prompt shows the question's domain, a
served request's (which says none) read from its nearest training questions, so that the tiny
Conductor need not tell look-alike domains apart from a question's first characters.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from rl_conductor.errors import ConfigError, ModelNotFound
from rl_conductor.limits import RequestLimits
from rl_conductor.prompting import conductor_prompt
from rl_conductor.tasks.base import Task
from rl_conductor.training.config import TrainConfig
from rl_conductor.workers.pool import load_pool
from test_adaptive_training import rounds_micro_config


def test_the_kind_line_stands_before_the_question_and_is_one_short_line() -> None:
    view = load_pool("gsm8k-six").view()
    task = Task(id="t", question="What is 2 + 2?", answer="4", domain="math", source="s", grader="math")
    plain = conductor_prompt(task, view, RequestLimits())
    shown = conductor_prompt(task, view, RequestLimits(), kind="math")
    assert "Kind:" not in plain
    assert shown == plain.replace("Question: ", "Kind: math\nQuestion: ")
    odd = conductor_prompt(task, view, RequestLimits(), kind="competition\nmath " + "x" * 80)
    line = next(x for x in odd.splitlines() if x.startswith("Kind: "))
    assert line == "Kind: " + ("competition math " + "x" * 80)[:40]


def test_training_prompts_show_the_kind_only_with_show_kind() -> None:
    from rl_conductor.training.data import PromptSpec, spec_prompt

    pool = load_pool("gsm8k-six")
    task = Task(id="t", question="What is 2 + 2?", answer="4", domain="stem", source="s", grader="math")
    spec = PromptSpec(task=task, view=tuple(range(len(pool))), budget=None)
    args = (spec, spec.pool_view(pool), spec.limits(RequestLimits()), 120, None, "head")
    assert "Kind: stem\nQuestion: " in spec_prompt(*args, show_kind=True)
    assert "Kind:" not in spec_prompt(*args)


def test_show_kind_needs_the_warm_starts_targets() -> None:
    with pytest.raises(ConfigError, match="show_kind"):
        TrainConfig(pool="paper-sim", show_kind=True, sft_targets="random")


def test_a_trained_model_shows_its_kind_line_and_a_served_request_gets_its_neighbours_kind(
    tmp_path: Path,
) -> None:
    """A micro run with ``show_kind``: the training prompts and the trained policy's prompt
    show ``Kind: math``; a served request (domain ``unknown``) is shown the kind of its nearest
    training questions; a folder that lost its kind index, or whose flag disagrees with its
    recipe, is refused by name."""
    from rl_conductor.policies.conductor import ConductorPolicy
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.train import train

    result = train(rounds_micro_config(tmp_path, show_kind=True), tmp_path / "out", progress=False)
    final = result.final_dir
    meta = json.loads((final / "conductor.json").read_text())
    assert meta["show_kind"] is True and meta["kinds"] is True
    policy = ConductorPolicy(final)
    view, limits = load_pool("gsm8k-six").view(), RequestLimits(max_steps=2, max_rounds=2)
    task = load_tasks("gsm8k-six", split="validation", limit=1)[0]
    assert "Kind: math\nQuestion: " in policy.prompt(task, view, limits)
    served = replace(task, id="request-1", domain="unknown", source="serving")
    assert "Kind: math\nQuestion: " in policy.prompt(served, view, limits)
    plan = asyncio.run(policy.plan(served, view, limits))
    assert plan.workflow.steps
    broken = tmp_path / "broken"
    shutil.copytree(final, broken)
    (broken / "kinds.npz").unlink()
    with pytest.raises(ModelNotFound, match="kind index"):
        ConductorPolicy(broken)
    shutil.copy(final / "kinds.npz", broken / "kinds.npz")
    for flag in (False, "yes"):
        (broken / "conductor.json").write_text(json.dumps({**meta, "show_kind": flag}))
        with pytest.raises(ModelNotFound, match=r"show_kind .* is not what it was trained with"):
            ConductorPolicy(broken)
