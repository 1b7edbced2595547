"""KFP component ``prepare_data``: a dataset → train / validation / test Dataset artifacts.

Thin adapter over :func:`rl_conductor.pipeline.steps.prepare_data`; see README.md.
"""

from typing import NamedTuple

from components.images import base_component
from kfp import dsl


@base_component
def prepare_data(
    train_data: dsl.Output[dsl.Dataset],
    validation_data: dsl.Output[dsl.Dataset],
    test_data: dsl.Output[dsl.Dataset],
    data_stats: dsl.Output[dsl.Metrics],
    dataset: str = "",
    pool: str = "paper-sim",
    train_limit: int = 0,
    eval_limit: int = 0,
    seed: int = 0,
    artifact_root: str = "",
    run_tag: str = "local",
) -> NamedTuple("PrepareOutputs", [("run_folder", str), ("dataset", str)]):
    """Split ``dataset`` (empty: the pool's default) into task files (JSON lines of Task dicts).

    ``train_limit`` caps the train split and ``eval_limit`` the validation and test splits (0:
    all). Each Dataset artifact's metadata holds its size and counts per domain; ``data_stats``
    logs them as metrics. Copies go to ``<artifact_root>/<run_tag>/data/``.
    """
    from collections import namedtuple

    from rl_conductor.pipeline import steps

    prepared = steps.call_same_named(
        steps.prepare_data,
        locals(),
        outputs={"train": train_data.path, "validation": validation_data.path, "test": test_data.path},
        train_limit=train_limit or None,
        eval_limit=eval_limit or None,
    )
    artifacts = {"train": train_data, "validation": validation_data, "test": test_data}
    for split, info in prepared.splits.items():
        artifacts[split].metadata.update({**info.metadata(), "dataset": prepared.dataset})
        data_stats.log_metric(f"{split}/tasks", info.n)
        for domain, count in info.domains.items():
            data_stats.log_metric(f"{split}/{domain}", count)
    PrepareOutputs = namedtuple("PrepareOutputs", ["run_folder", "dataset"])
    return PrepareOutputs(prepared.run_folder, prepared.dataset)
