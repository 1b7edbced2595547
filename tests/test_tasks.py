"""Datasets: every one loads, splits are disjoint and stable, gold answers grade as correct."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from rl_conductor.errors import UnknownName
from rl_conductor.tasks import datasets as ds
from rl_conductor.tasks.base import DOMAINS, Task
from rl_conductor.tasks.datasets import (
    PAPER_MIX_DOMAIN_CAP,
    UnknownDatasetError,
    available_datasets,
    domain_counts,
    load_tasks,
    register_dataset,
    split_of,
)
from rl_conductor.tasks.graders import GRADERS, grade

OWN = ["math500", "gsm8k", "mmlu_stem", "mbpp", "humaneval", "llmrouter", "paper-mix"]
EXPECTED_DOMAINS = {
    "math500": {"math"},
    "gsm8k": {"math"},
    "mmlu_stem": {"knowledge"},
    "mbpp": {"code"},
    "humaneval": {"code"},
    "llmrouter": {"math", "knowledge", "reasoning", "code"},
    "paper-mix": {"math", "knowledge", "reasoning", "code"},
}


def test_registry_lists_every_dataset() -> None:
    assert set(OWN) <= set(available_datasets())


@pytest.mark.parametrize("name", OWN)
def test_dataset_loads_with_valid_tasks(name: str) -> None:
    tasks = load_tasks(name)
    assert len(tasks) > 100
    assert len({t.id for t in tasks}) == len(tasks)
    assert {t.domain for t in tasks} == EXPECTED_DOMAINS[name]
    for t in tasks:
        assert t.domain in DOMAINS and t.grader in GRADERS
        assert t.id.startswith(t.source + "/")
        assert t.question.strip() and t.answer.strip()
        if t.grader == "choice":
            letters = "ABCDEFGHIJ"[: len(t.metadata["choices"])]
            assert t.answer in letters
            assert "\nA. " in t.question and f"\n{letters[-1]}. " in t.question
        if t.grader == "code":
            assert t.metadata["tests"] and t.metadata["entry_point"]


@pytest.mark.parametrize("name", OWN)
def test_splits_are_disjoint_complete_and_deterministic(name: str) -> None:
    parts = {s: load_tasks(name, s) for s in ("train", "validation", "test")}
    ids = {s: {t.id for t in ts} for s, ts in parts.items()}
    assert not ids["train"] & ids["validation"]
    assert not ids["train"] & ids["test"]
    assert not ids["validation"] & ids["test"]
    assert ids["train"] | ids["validation"] | ids["test"] == {t.id for t in load_tasks(name)}
    n = sum(len(v) for v in ids.values())
    assert 0.6 < len(ids["train"]) / n < 0.8 and 0.12 < len(ids["test"]) / n < 0.28


def test_split_uses_a_stable_hash_not_python_hash() -> None:
    # Pinned values: Python's hash() is salted per process, SHA-256 is not.
    assert split_of("math500/1") == "train"
    assert split_of("gsm8k/2") == "test"
    assert split_of("gsm8k/3") == "validation"
    assert split_of("math500/0") == "test"


def test_limit_is_a_seeded_sample_of_the_split() -> None:
    full = load_tasks("gsm8k", "train")
    a = load_tasks("gsm8k", "train", limit=25, seed=1)
    assert a == load_tasks("gsm8k", "train", limit=25, seed=1)
    assert a != load_tasks("gsm8k", "train", limit=25, seed=2)
    assert len(a) == 25 and set(a) <= set(full)
    order = {t.id: i for i, t in enumerate(full)}
    assert [order[t.id] for t in a] == sorted(order[t.id] for t in a)


def test_unknown_dataset_and_split_errors_name_the_options() -> None:
    with pytest.raises(UnknownDatasetError, match="math500"):
        load_tasks("no-such-dataset")
    with pytest.raises(ValueError, match="validation"):
        load_tasks("math500", "dev")


@pytest.fixture
def scratch_dataset() -> Iterator[str]:
    name = "test-scratch"
    yield name
    ds.unregister_dataset(name)


def test_register_dataset_makes_a_loader_available(scratch_dataset: str) -> None:
    @register_dataset(scratch_dataset)
    def _load() -> list[Task]:
        return [Task(f"scratch/{i}", "1+1?", "2", "math", "scratch", "math") for i in range(50)]

    assert scratch_dataset in available_datasets()
    assert len(load_tasks(scratch_dataset)) == 50
    with pytest.raises(ValueError, match="already registered"):

        @register_dataset(scratch_dataset)
        def _other() -> list[Task]:
            return []


def test_dataset_specific_fields() -> None:
    m = load_tasks("math500")[0]
    assert 1 <= m.metadata["level"] <= 5 and m.metadata["subject"] and m.metadata["ref_len"] > 0
    g = load_tasks("gsm8k")[0]
    assert g.answer == "18"
    he = load_tasks("humaneval")[0]
    assert he.answer.startswith(he.metadata["prompt"]) and "def check" in he.metadata["tests"]
    router = load_tasks("llmrouter")
    kinds = {t.metadata["task_name"] for t in router}
    assert "commongen" not in kinds
    reasoning = {t.metadata["task_name"] for t in router if t.domain == "reasoning"}
    assert reasoning == {"agentverse-logicgrid", "commonsense_qa"}
    assert {t.grader for t in router if t.metadata["task_name"] == "trivia_qa"} == {"qa"}
    assert "mbpp/64" not in {t.id for t in load_tasks("mbpp")}


def test_paper_mix_is_balanced() -> None:
    counts = domain_counts(load_tasks("paper-mix"))
    assert list(counts) == ["math", "knowledge", "reasoning", "code"]
    assert max(counts.values()) <= PAPER_MIX_DOMAIN_CAP
    assert counts["knowledge"] == PAPER_MIX_DOMAIN_CAP  # mmlu_stem has 3,018: it was capped
    assert counts["math"] == len(load_tasks("math500"))
    test_counts = domain_counts(load_tasks("paper-mix", "test"))
    assert min(test_counts.values()) > 60


def test_domain_counts_orders_known_domains_first() -> None:
    tasks = [Task(f"x/{i}", "q", "a", d, "x", "qa") for i, d in enumerate(["code", "zeta", "math", "code"])]
    assert domain_counts(tasks) == {"math": 1, "code": 2, "zeta": 1}


def _reference_reply(task: Task) -> str:
    if task.grader == "math":
        return f"Working...\nThe final answer is $\\boxed{{{task.answer}}}$."
    if task.grader == "choice":
        return f"Let me think.\nAnswer: {task.answer}"
    if task.grader == "code":
        return f"```python\n{task.answer}\n```"
    return task.answer


@pytest.mark.parametrize("name", OWN)
def test_reference_answers_grade_correct_on_a_sample(name: str) -> None:
    tasks = load_tasks(name)
    rng = random.Random(name)
    text_tasks = [t for t in tasks if t.grader != "code"]
    code_tasks = [t for t in tasks if t.grader == "code"]
    sample = rng.sample(text_tasks, min(30, len(text_tasks))) + rng.sample(
        code_tasks, min(12, len(code_tasks))
    )
    failures = [t.id for t in sample if not grade(t, _reference_reply(t))]
    assert failures == []
    # ...and a wrong reply fails, so the check above can fail.
    wrong = [t for t in sample[:5] if t.grader != "code"]
    for t in wrong:
        assert not grade(t, "I do not know.")


def test_the_cli_offers_the_dataset_splits() -> None:
    """The CLI writes its ``--split`` choices out (its help is built before any import of tasks):
    they are the datasets' own."""
    from rl_conductor.cli.core import SPLIT_CHOICES as CLI_SPLITS
    from rl_conductor.validation import SPLIT_CHOICES

    assert CLI_SPLITS == SPLIT_CHOICES
    with pytest.raises(UnknownName, match="expected one of train, validation, test, all"):
        ds.load_tasks("math500", "dev")


def test_the_catalog_registers_every_dataset_on_import_and_no_dataset_module_imports_it() -> None:
    """Every shipped dataset is registered by importing the catalog (none found lazily by a
    string import), and the dataset modules build on ``tasks.registry``, never on the catalog."""
    import ast
    import inspect

    from rl_conductor.tasks import builtin, gsm8k_six, registry, routellm

    for module in (registry, builtin, routellm, gsm8k_six):
        source = inspect.getsource(module)
        tree = ast.parse(source)
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "rl_conductor.tasks.datasets" not in imported, module.__name__
        assert "import_module" not in source and "__import__" not in source, module.__name__
    assert set(ds.DATASET_MODULES) == {builtin, routellm, gsm8k_six}
    assert {"routellm", "routellm-gsm8k", "gsm8k-six", "paper-mix", "mbpp"} <= set(available_datasets())
