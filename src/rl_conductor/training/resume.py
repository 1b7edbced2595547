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
(not resumed) run starts over: it clears the warm start, the checkpoints and the final folder an
earlier run left, and rebuilds the tiny base model where another recipe built it (a base of
other sizes or another tokenizer corpus). Local paths count by where they resolve, and the pool
by what its workers and recordings are, not only by its file's name.
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
    "pool_facts",
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


def _path_or(spec: str | None, *, prefix: str = "") -> str | None:
    """``spec`` with a local file's or folder's path resolved (after ``prefix``), else as given."""
    if not spec or not spec.startswith(prefix):  # "" (no observed file) is no path: not the cwd
        return spec
    p = Path(spec[len(prefix) :]).expanduser()
    return prefix + str(p.resolve()) if p.exists() else spec


def pool_facts(pool: Any) -> str:
    """A digest of what a loaded pool's workers are (names, prices, hosting, options) and of its
    recordings file's contents (:func:`rl_conductor.fingerprint.loaded_pool_parts`): a pool file
    edited in place keeps its path."""
    from rl_conductor.fingerprint import fingerprint, loaded_pool_parts

    return fingerprint(loaded_pool_parts(pool))


def recipe_of(cfg: TrainConfig, dataset: str, pool: Any = None) -> dict[str, Any]:
    """The fields of ``cfg`` that decide what is learnt, as JSON values: local paths (the pool file,
    a ``recordings:`` dataset, a model folder, observed requests) resolved, the dataset the run
    trains on, and with ``pool`` (loaded) a digest of its workers and recordings
    (:func:`pool_facts`) and of a ``recordings:`` dataset's file."""
    from rl_conductor.fingerprint import recordings_fingerprint
    from rl_conductor.tasks.recordings_format import PREFIX

    recipe = {k: v for k, v in cfg.to_dict().items() if k not in RUN_CONTROL}
    recipe["pool"] = _path_or(cfg.pool)
    recipe["model"] = cfg.model if cfg.model in ("tiny", "smol") else _path_or(cfg.model)
    recipe["observed_path"] = _path_or(cfg.observed_path)
    recipe["dataset"] = _path_or(dataset, prefix=PREFIX)
    if dataset.startswith(PREFIX):
        recipe["dataset_file"] = recordings_fingerprint({"recordings": dataset[len(PREFIX) :]})
    if pool is not None:
        recipe["pool_facts"] = pool_facts(pool)
    loaded: dict[str, Any] = json.loads(json.dumps(recipe))
    return loaded


def _read(path: Path) -> dict[str, Any]:
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume: cannot read {path} ({e}); train into a new OUT") from e
    if not isinstance(old, dict):
        raise ConfigError(f"--resume: {path} is not a recipe; train into a new OUT")
    return old


def check_resume(cfg: TrainConfig, out: str | Path, dataset: str, pool: Any = None) -> None:
    """Raise ConfigError when ``out`` holds a training of another recipe than ``cfg``'s (see the
    module docstring); warn when it holds a training without a recorded recipe."""
    path = Path(out) / RECIPE_FILE
    if not path.exists():
        if (Path(out) / "sft" / "config.json").exists():
            log.warning("%s has no %s (trained before it was written): resuming unchecked", out, RECIPE_FILE)
        return
    old = _read(path)
    new = recipe_of(cfg, dataset, pool)
    for key in set(new) - set(old):  # recorded by older code (or checked without the pool): not compared
        new.pop(key)
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if differ:
        what = {
            "pool_facts": "the pool's workers or recordings",
            "dataset_file": "the dataset file's contents",
        }
        shown = "; ".join(
            f"{what[k]} changed" if k in what else f"{k}: {old.get(k)!r} then, {new.get(k)!r} now"
            for k in differ[:4]
        )
        more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
        raise ConfigError(
            f"--resume: {out} was trained with another recipe ({shown}{more}); "
            "drop --resume to train it afresh, or train into a new OUT"
        )


def recipe_matches(cfg: TrainConfig, out: str | Path, dataset: str, pool: Any = None) -> bool:
    """Whether ``out`` records ``cfg``'s recipe (False without a readable ``recipe.json``): a
    fresh (not resumed) run may reuse the tiny base model it built only then."""
    try:
        return bool(json.loads((Path(out) / RECIPE_FILE).read_text()) == recipe_of(cfg, dataset, pool))
    except (OSError, ValueError):
        return False


def write_recipe(cfg: TrainConfig, out: str | Path, dataset: str, pool: Any = None) -> None:
    """Record ``cfg``'s recipe in ``out`` (what a later ``--resume`` is checked against)."""
    path = Path(out) / RECIPE_FILE
    if path.is_dir() or path.is_symlink():
        raise ConfigError(f"{path} is not a file; remove it or train into a new OUT")
    text = json.dumps(recipe_of(cfg, dataset, pool), indent=2, sort_keys=True) + "\n"
    write_text(str(path), text)


#: what a fresh run writes anew (``base/`` too where another recipe built it)
FRESH = ("sft", "grpo", "final")


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _trained(root: Path) -> bool:
    """Whether ``root`` shows a training's traces (a recorded recipe, a warm start, a checkpoint, a
    final Conductor): only then does a fresh run clear its folders, never a user's ``base/``."""
    return (
        (root / RECIPE_FILE).exists()
        or (root / "sft" / "config.json").exists()
        or (root / "final" / "conductor.json").exists()
        or any((root / "grpo").glob("checkpoint-*"))
    )


def prepare_out(
    cfg: TrainConfig, out: str | Path, dataset: str, *, resume: bool, writer: bool = True, pool: Any = None
) -> None:
    """Before a training into ``out``: on ``resume`` refuse a folder of another recipe. A fresh run
    starts over: in a folder that holds a training (:func:`_trained`) it removes the ``sft/``,
    ``grpo/`` and ``final/`` an earlier run left (else a later ``--resume`` would continue that
    run's highest checkpoint under this recipe's name), and the base model (``base/``) where another
    recipe built it; a link is unlinked, never followed. Before it removes anything, the model spec
    is checked and a ``--model`` inside what it would remove is refused. Then (the writing process
    only, ``writer``) it records ``cfg``'s recipe."""
    from rl_conductor.lm.models import check_spec

    root = Path(out)
    if resume:
        check_resume(cfg, root, dataset, pool)
    else:
        check_spec(cfg.model)  # a typo in --model must not cost the previous model
        src = Path(cfg.model).expanduser()
        if cfg.model not in ("tiny", "smol") and src.exists():
            for name in (*FRESH, "base"):
                inside = (root / name).resolve()
                if src.resolve() == inside or inside in src.resolve().parents:
                    raise ConfigError(
                        f"--model {cfg.model} is inside {root / name}, which a fresh run clears: copy it "
                        "elsewhere first (or continue that run with --resume)"
                    )
    if not writer:
        return
    if not resume and _trained(root):
        same = recipe_matches(cfg, root, dataset, pool)
        for name in (*FRESH, *(() if same else ("base",))):
            _remove(root / name)
    write_recipe(cfg, root, dataset, pool)
