"""What ``train --resume`` may continue: only a folder trained with the same recipe.

Why: ``--resume`` skips the SFT warm start when ``OUT/sft`` exists and continues GRPO from the
last checkpoint in ``OUT/grpo``. Before this module it did so whatever the folder had been trained
with, so a resumed run with another preset, pool, cost weight or model (or ``train --preset a,b
--resume`` after a list's names came to stand for other presets) silently finished a model of
another recipe and recorded the new one in ``conductor.json`` (an outside attack, H22, found it).

Now every training writes ``OUT/recipe.json``: the config fields that decide what is learnt, the
pool (a YAML file by its resolved path) and the dataset. A resume compares it with the new
config and refuses, naming the fields that differ, before anything is trained. The fields of
:data:`RUN_CONTROL` only steer the run (where it logs, how long it may take, how many GRPO steps
it runs in all, threads, checkpoint cadence, GPU memory) and may change between the first run and
its resume. A folder from before this file (no ``recipe.json``) resumes with a warning. A fresh
(not resumed) run into a folder of another recipe rebuilds the tiny base model it would otherwise
reuse (a base of other sizes or another tokenizer corpus).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from rl_conductor.storage import write_text
from rl_conductor.training.config import ConfigError, TrainConfig

log = logging.getLogger(__name__)

__all__ = [
    "RECIPE_FILE",
    "RUN_CONTROL",
    "check_resume",
    "prepare_out",
    "recipe_matches",
    "recipe_of",
    "write_recipe",
]

RECIPE_FILE = "recipe.json"

#: Config fields a resumed run may change: they steer the run, not what it learns.
RUN_CONTROL = frozenset(
    {
        "grpo_steps",
        "time_limit_s",
        "save_steps",
        "logging_steps",
        "torch_threads",
        "train_torch_threads",
        "warm_cache_dir",
        "mlflow_experiment",
        "mlflow_tracking_uri",
        "use_vllm",
        "vllm_mode",
        "vllm_gpu_memory_utilization",
        "gradient_checkpointing",
    }
)


def recipe_of(cfg: TrainConfig, dataset: str) -> dict[str, Any]:
    """The fields of ``cfg`` that decide what is learnt, as JSON values, with the pool file's
    resolved path and the dataset the run trains on."""
    recipe = {k: v for k, v in cfg.to_dict().items() if k not in RUN_CONTROL}
    pool = Path(cfg.pool)
    recipe["pool"] = str(pool.resolve()) if pool.is_file() else cfg.pool
    recipe["dataset"] = dataset
    loaded: dict[str, Any] = json.loads(json.dumps(recipe))
    return loaded


def check_resume(cfg: TrainConfig, out: str | Path, dataset: str) -> None:
    """Raise ConfigError when ``out`` holds a training of another recipe than ``cfg``'s (see the
    module docstring); warn when it holds a training without a recorded recipe."""
    path = Path(out) / RECIPE_FILE
    if not path.is_file():
        if (Path(out) / "sft" / "config.json").exists():
            log.warning("%s has no %s (trained before it was written): resuming unchecked", out, RECIPE_FILE)
        return
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume: cannot read {path} ({e}); train into a new OUT") from e
    if not isinstance(old, dict):
        raise ConfigError(f"--resume: {path} is not a recipe; train into a new OUT")
    new = recipe_of(cfg, dataset)
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if differ:
        shown = "; ".join(f"{k}: {old.get(k)!r} then, {new.get(k)!r} now" for k in differ[:4])
        more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
        raise ConfigError(
            f"--resume: {out} was trained with another recipe ({shown}{more}); "
            "drop --resume to train it afresh, or train into a new OUT"
        )


def recipe_matches(cfg: TrainConfig, out: str | Path, dataset: str) -> bool:
    """Whether ``out`` records ``cfg``'s recipe (False without a readable ``recipe.json``): a
    fresh (not resumed) run may reuse the tiny base model it built only then."""
    try:
        return bool(json.loads((Path(out) / RECIPE_FILE).read_text()) == recipe_of(cfg, dataset))
    except (OSError, ValueError):
        return False


def write_recipe(cfg: TrainConfig, out: str | Path, dataset: str) -> None:
    """Record ``cfg``'s recipe in ``out`` (what a later ``--resume`` is checked against)."""
    text = json.dumps(recipe_of(cfg, dataset), indent=2, sort_keys=True) + "\n"
    write_text(str(Path(out) / RECIPE_FILE), text)


def prepare_out(
    cfg: TrainConfig, out: str | Path, dataset: str, *, resume: bool, writer: bool = True
) -> None:
    """Before a training into ``out``: on ``resume`` refuse a folder of another recipe; on a fresh
    run drop a tiny base model (``out/base``) that another recipe built; then (the writing process
    only, ``writer``) record ``cfg``'s recipe."""
    if resume:
        check_resume(cfg, out, dataset)
    if not writer:
        return
    base = Path(out) / "base"
    if not resume and base.exists() and not recipe_matches(cfg, out, dataset):
        shutil.rmtree(base)
    write_recipe(cfg, out, dataset)
