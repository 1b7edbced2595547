"""The dataset catalog: every benchmark the project trains or evaluates on, as Tasks.

Why a catalog: importing this module registers every dataset the package ships, so
:func:`load_tasks` here knows them all. The mechanics (registry, hash splits, the ``split`` field
of a recordings file, ``recordings:<path>`` names) live in :mod:`rl_conductor.tasks.registry`,
below the modules that register; this module imports those modules, and none of them imports it
(no import circle, no import by string).

Registered datasets:

* :mod:`rl_conductor.tasks.builtin`: ``math500``, ``gsm8k``, ``mmlu_stem``, ``mbpp``,
  ``humaneval``, ``llmrouter``, ``paper-mix``;
* :mod:`rl_conductor.tasks.routellm`: ``routellm``, ``routellm-mmlu``, ``routellm-gsm8k`` (the
  RouteLLM recorded benchmarks);
* :mod:`rl_conductor.tasks.gsm8k_six`: ``gsm8k-six`` (six real models' GSM8K solutions);
* a name ``recordings:<path>``: the items of a bring-your-own recordings file
  (:mod:`rl_conductor.tasks.recordings_format`).

Other code adds datasets with :func:`register_dataset` (and drops them with
:func:`unregister_dataset`).
"""

from __future__ import annotations

from rl_conductor.tasks import builtin, gsm8k_six, routellm
from rl_conductor.tasks.builtin import PAPER_MIX_DOMAIN_CAP, format_choices, read_jsonl
from rl_conductor.tasks.registry import (
    SPLIT_BOUNDS,
    Loader,
    UnknownDatasetError,
    available_datasets,
    domain_counts,
    hash_fraction,
    load_tasks,
    register_dataset,
    split_counts,
    split_of,
    split_of_task,
    unregister_dataset,
)

#: The modules whose import registers the package's datasets (imported above).
DATASET_MODULES = (builtin, routellm, gsm8k_six)

__all__ = [
    "DATASET_MODULES",
    "PAPER_MIX_DOMAIN_CAP",
    "SPLIT_BOUNDS",
    "Loader",
    "UnknownDatasetError",
    "available_datasets",
    "domain_counts",
    "format_choices",
    "hash_fraction",
    "load_tasks",
    "read_jsonl",
    "register_dataset",
    "split_counts",
    "split_of",
    "split_of_task",
    "unregister_dataset",
]
