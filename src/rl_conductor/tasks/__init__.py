"""Tasks: the Task record, the dataset registry and loaders, graders and the code sandbox.

Everything here is cheap to import: ``math-verify`` (and so sympy) loads on the first math grade.
"""

from rl_conductor.tasks.base import DOMAINS, Task
from rl_conductor.tasks.datasets import (
    UnknownDatasetError,
    available_datasets,
    domain_counts,
    load_tasks,
    register_dataset,
    split_of,
)
from rl_conductor.tasks.graders import GRADERS, Grader, extract_answer, grade
from rl_conductor.tasks.sandbox import (
    SandboxResult,
    SandboxUnavailableError,
    TestSpec,
    TestVerdict,
    run_python,
    run_tests,
)

__all__ = [
    "DOMAINS",
    "GRADERS",
    "Grader",
    "SandboxResult",
    "SandboxUnavailableError",
    "Task",
    "TestSpec",
    "TestVerdict",
    "UnknownDatasetError",
    "available_datasets",
    "domain_counts",
    "extract_answer",
    "grade",
    "load_tasks",
    "register_dataset",
    "run_python",
    "run_tests",
    "split_of",
]
