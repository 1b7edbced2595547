"""Train several recipes for one pool and keep the one that scores best on the validation split.

Why: which recipe wins depends on the recordings, and the difference is large. On ``gsm8k-six``
(one domain, real texts) the two-round ``recordings-text`` preset, whose review reads the first
answers, beats every router; on simulated files of eleven workers over three look-alike domains
the one-round ``recordings`` preset (a per-question router from evidence) beat it by 0.012 to
0.019 reward on test (docs/recordings.md, "Which preset"). A team bringing its own file cannot
know beforehand, and comparing by hand costs two commands per recipe and a careful reading of
the rewards. ``conductor train --preset recordings,recordings-text`` (or ``--preset auto`` on a
recordings pool) does it as it should be done:

- every candidate trains on the same pool, dataset and reward (refused otherwise, before any
  training: a choice between models trained for different objectives means nothing);
- each trains into ``OUT/candidates/<name>``; each is evaluated on the **validation** split
  with the rounds it was trained for, at that one reward, and so are the two routers a team
  would otherwise ship (kNN, the domain-router and the fixed cascade, fitted at that reward on
  every training question);
- the candidate with the highest mean validation reward is copied to ``OUT/final`` (ties: the
  first listed), ``OUT/choice.json`` keeps every figure, and the final ``conductor.json``
  records the choice (``preset_choice``);
- the test split is never read, so it stays an unbiased estimate of the chosen model. A choice
  among two on a few hundred validation questions is itself noisy; ``choice.json`` has the
  paired difference's standard error so a reader can see how close it was;
- when a baseline beats the chosen Conductor on validation, the caller says so (a warning, not
  an error: the model is still the best Conductor of the candidates). On the simulated
  eleven-worker file the fixed cascade did (validation 0.8344 against the chosen 0.8202).

A recordings file that names no validation item (train and test only) has one carved from its
training items (:func:`rl_conductor.tasks.registry.carve_validation`: about an eighth, by id
hash; they leave the training split). A dataset with no validation items even so (every item a
test item) is refused before training: a choice on training or test questions would be biased.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_conductor.errors import ConfigError

__all__ = [
    "AUTO",
    "CHOICE_FILE",
    "Choice",
    "candidate_presets",
    "check_candidates",
    "check_out",
    "folder_names",
    "train_and_choose",
]

log = logging.getLogger(__name__)

#: ``--preset auto``: the recordings presets, the text-reading one only where texts were kept
AUTO = "auto"
#: fewer validation items than this get a warning before a choice is made on them
SMALL_VALIDATION = 50
#: the presets ``auto`` chooses among, and the share of kept texts above which the second joins
AUTO_PRESETS = ("recordings", "recordings-text")
TEXT_SHARE = 0.5
#: where the figures of the choice are written, next to ``final/``
CHOICE_FILE = "choice.json"
#: the split a choice is made on
SPLIT = "validation"
#: the baselines every candidate is compared with (not candidates: a warning when one is better):
#: the two routers (kNN also with its neighbourhood chosen on the training split) and the fixed
#: cascades (one for every question, one per domain) a team would otherwise ship, each fitted at
#: the reward
BASELINES = ("knn", "knn:k=auto", "domain-router", "cascade:all", "cascade:domain")


def recordings_path(pool: Any, dataset: str) -> str | None:
    """The recordings file behind ``dataset`` on ``pool`` (a ``recordings:`` dataset, or the pool's
    own registered file such as ``gsm8k-six``), else None."""
    from rl_conductor.tasks.recordings_format import PREFIX

    if dataset.startswith(PREFIX):
        return dataset[len(PREFIX) :]
    return pool.options.get("recordings") if dataset == pool.default_dataset() else None


def candidate_presets(spec: str, pool: str | None, dataset: str | None) -> list[str]:
    """The presets named by ``--preset``: a comma-separated list, or ``auto`` (``recordings``,
    plus ``recordings-text`` when at least half of the pool's recorded responses keep their text;
    only on a recordings pool). A single name comes back alone."""
    names = [n.strip() for n in spec.split(",")]
    if any(not n for n in names):
        raise ConfigError(
            f"--preset {spec!r}: an empty name in the list (a YAML path cannot contain a comma)"
        )
    if len({_identity(n) for n in names}) != len(names):
        raise ConfigError(f"--preset {spec!r}: a preset is listed twice")
    if AUTO not in names:
        return names
    if names != [AUTO]:
        raise ConfigError("--preset auto stands alone (it names the recordings presets itself)")
    if pool is None:
        raise ConfigError("--preset auto needs --pool: a pool whose workers replay your recordings file")
    from rl_conductor.tasks.recordings_format import text_share
    from rl_conductor.workers.pool import load_pool

    p = load_pool(pool)
    path = recordings_path(p, dataset or p.default_dataset())
    if path is None:
        what = f"dataset {dataset!r} is not a" if dataset else f"pool {pool!r} replays no"
        raise ConfigError(
            f"--preset auto chooses among the recordings presets, and {what} recordings file; "
            "name the presets to compare, e.g. --preset tiny,tiny-rounds"
        )
    try:
        share = text_share(path) or 0.0
    except (OSError, ValueError) as exc:  # a missing or malformed file: one line, not a traceback
        raise ConfigError(f"--preset auto: cannot read the recordings {path!r}: {exc}") from None
    return list(AUTO_PRESETS) if share >= TEXT_SHARE else [AUTO_PRESETS[0]]


def _identity(spec: str) -> str:
    """What a preset spec names: a YAML file's resolved path, else the preset's name."""
    p = Path(spec).expanduser()
    return str(p.resolve()) if p.suffix in (".yaml", ".yml") and p.exists() else spec


def folder_names(specs: Sequence[str]) -> dict[str, str]:
    """spec -> the folder ``OUT/candidates/<name>`` it trains into: a shipped preset's name, a
    YAML file's stem (``../mine/a.yaml`` -> ``a``), never a path; made unique with ``-2``, ...
    ignoring case (``A.yaml`` and ``a.yaml`` are one folder on a case-insensitive disk)."""
    out: dict[str, str] = {}
    for spec in specs:
        stem = Path(spec).stem if Path(spec).suffix in (".yaml", ".yml") else spec
        name = re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip(".") or "preset"
        base, k = name, 2
        while name.lower() in {v.lower() for v in out.values()}:
            name, k = f"{base}-{k}", k + 1
        out[spec] = name
    return out


def check_out(out: str | Path) -> None:
    """Refuse, before training, an output folder a choice could not finish in: a file where the
    folder, ``final/`` or ``choice.json`` would go."""
    root = Path(out)
    for path, what in ((root, "a folder"), (root / "final", "a folder"), (root / "candidates", "a folder")):
        if path.exists() and not path.is_dir():
            raise ConfigError(f"--out {root}: {path} is a file, where {what} goes")
    if (root / CHOICE_FILE).is_dir():
        raise ConfigError(f"--out {root}: {root / CHOICE_FILE} is a folder, where the choice's figures go")


def _same_pool(cfgs: dict[str, Any]) -> bool:
    def key(pool: str) -> str:
        p = Path(pool).expanduser()
        return str(p.resolve()) if p.is_file() else pool

    return len({key(c.pool) for c in cfgs.values()}) == 1


def check_candidates(cfgs: dict[str, Any]) -> tuple[str, str]:
    """Refuse, before any training, candidates that a choice cannot compare: other pools, other
    datasets, other rewards; or a dataset with no validation items. Returns (pool, dataset)."""
    from rl_conductor.tasks.datasets import load_tasks, split_counts
    from rl_conductor.workers.pool import load_pool

    def describe(key: str, values: dict[str, Any]) -> str:
        return ", ".join(f"{name}: {value}" for name, value in values.items())

    from rl_conductor.lm.models import check_spec

    pools = {n: c.pool for n, c in cfgs.items()}
    if not _same_pool(cfgs):
        raise ConfigError(f"the presets train on different pools ({describe('pool', pools)}); give --pool")
    first = next(iter(cfgs.values()))
    pool = load_pool(first.pool)
    datasets = {n: c.dataset or pool.default_dataset() for n, c in cfgs.items()}
    if len(set(datasets.values())) > 1:
        raise ConfigError(
            f"the presets train on different datasets ({describe('dataset', datasets)}); give --dataset"
        )
    rewards = {n: c.reward() for n, c in cfgs.items()}
    if len(set(rewards.values())) > 1:
        shown = {n: f"{c.reward_preset} at cost weight {c.reward().cost_weight:g}" for n, c in cfgs.items()}
        if len(set(shown.values())) == 1:  # they differ in a term the presets set in their YAML
            shown = {n: repr(r) for n, r in rewards.items()}
        raise ConfigError(
            f"the presets train for different rewards ({describe('reward', shown)}); give "
            "--cost-weight (and --reward-preset) so that every candidate is trained and chosen at one"
        )
    for name, c in cfgs.items():
        try:
            check_spec(c.model)
        except (ConfigError, ValueError, OSError) as exc:
            raise ConfigError(f"preset {name}: {exc}") from None
    dataset = next(iter(datasets.values()))
    try:
        found = load_tasks(dataset, split=SPLIT)
    except (OSError, ValueError) as exc:  # a missing or malformed file: one line, not a traceback
        raise ConfigError(f"dataset {dataset!r}: {exc}") from None
    if not found:
        raise ConfigError(
            f"dataset {dataset!r} has no validation items ({split_counts(dataset)}); a choice among "
            'presets is made on them: give some items "split": "validation" (or drop the split field)'
        )
    if len(found) < SMALL_VALIDATION:
        log.warning(
            "dataset %r has %d validation items: a choice among presets on so few is mostly noise "
            '(give more items "split": "validation")',
            dataset,
            len(found),
        )
    return first.pool, dataset


@dataclass
class Choice:
    """What :func:`train_and_choose` decided, and on which figures (``choice.json``)."""

    chosen: str
    final_dir: Path
    split: str
    n: int
    reward: dict[str, Any]
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: paired difference in mean reward, chosen minus each other candidate: (difference, its SE;
    #: None on fewer than two questions)
    margins: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    #: the same, chosen minus each baseline: whether a baseline scoring above it is ahead by noise
    baseline_margins: dict[str, tuple[float, float | None]] = field(default_factory=dict)

    def better_baselines(self) -> list[str]:
        """Baselines whose validation reward is above the chosen Conductor's."""
        mine = self.candidates[self.chosen]["mean_reward"]
        return [r for r, s in self.baselines.items() if s["mean_reward"] > mine]

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "final_dir": str(self.final_dir),
            "split": self.split,
            "n": self.n,
            "reward": self.reward,
            "candidates": self.candidates,
            "baselines": self.baselines,
            "margins": {k: {"difference": d, "se": se} for k, (d, se) in self.margins.items()},
            "baseline_margins": {
                k: {"difference": d, "se": se} for k, (d, se) in self.baseline_margins.items()
            },
        }


def _figures(summary: dict[str, Any], **extra: Any) -> dict[str, Any]:
    keys = (
        "n", "accuracy", "mean_cost_usd", "mean_reward", "parse_rate", "fallback_rate", "mean_calls",
        "failed_call_rate",
    )  # fmt: skip
    return {**{k: summary[k] for k in keys if k in summary}, **extra}


def _paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float | None]:
    """Mean and standard error of the per-question difference a - b."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(d) / len(d) if d else 0.0
    if len(d) < 2:  # no spread to measure: JSON null, not NaN
        return mean, None
    var = sum((x - mean) ** 2 for x in d) / (len(d) - 1)
    return mean, math.sqrt(var / len(d))


def train_and_choose(
    cfgs: dict[str, Any],
    out: str | Path,
    *,
    resume: bool = False,
    fit_limit: int | None = None,
    progress: bool = True,
    labels: dict[str, str] | None = None,
    trainer: Any = None,
) -> Choice:
    """Train every candidate config (folder name -> TrainConfig; ``labels``: folder name -> the
    preset spec it came from, for the record) into ``OUT/candidates/<name>``,
    score each and the routers on the validation split at their one reward, and copy the best to
    ``OUT/final`` (see the module docstring). Raises ConfigError before training when the
    candidates cannot be compared. ``trainer(cfg, out)`` trains one candidate (default
    :func:`rl_conductor.training.train.train`; the pipeline's step passes one that trains on every
    GPU of its node)."""
    from rl_conductor.evaluation.runner import every_call_failed
    from rl_conductor.evaluation.suite import GridPoint, eval_limits, sweep
    from rl_conductor.tasks.datasets import load_tasks
    from rl_conductor.training.train import train
    from rl_conductor.workers.pool import load_pool

    if not cfgs:
        raise ConfigError("no preset to train")
    bad = [n for n in cfgs if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", n)]
    if bad:  # a name is a folder under OUT/candidates: never a path (folder_names makes them)
        raise ConfigError(f"candidate names must be plain folder names, not {bad}")
    pool_name, dataset = check_candidates(cfgs)
    check_out(out)
    root = Path(out).resolve()  # choice.json's paths read from any working directory
    if resume:  # every candidate folder holds its own recipe, or none yet: before any training
        from rl_conductor.training.resume import check_resume

        for name, cfg in cfgs.items():
            check_resume(cfg, root / "candidates" / name, dataset, load_pool(cfg.pool, seed=cfg.seed))
    if (root / CHOICE_FILE).is_file():  # it would describe another run's final/, replaced below
        (root / CHOICE_FILE).unlink()
    finals: dict[str, Path] = {}
    run = trainer or (lambda c, f: train(c, f, resume=resume, progress=progress))
    for name, cfg in cfgs.items():
        log.info("candidate %s: training into %s", name, root / "candidates" / name)
        finals[name] = run(cfg, root / "candidates" / name).final_dir
    first = next(iter(cfgs.values()))
    reward = first.reward()
    pool = load_pool(pool_name, seed=first.seed)
    tasks = load_tasks(dataset, split=SPLIT)

    def run(specs: Sequence[str], rounds: int) -> list[Any]:
        grid = [(GridPoint(None, None), eval_limits(None, "public", None, max_rounds=rounds))]
        found = sweep(
            specs, grid, pool, tasks, fit_on=dataset, reward_config=reward, seed=first.seed,
            fit_limit=fit_limit, progress=progress,
        )  # fmt: skip
        return [res for _, _, res in found]

    scored: dict[str, dict[str, Any]] = {}
    per_question: dict[str, list[float]] = {}
    for name, final in finals.items():
        rounds = int(cfgs[name].max_rounds)
        (res,) = run([f"conductor:{final}"], rounds)
        summary = res.summary()
        failed = every_call_failed(summary)
        if failed:
            raise ConfigError(f"candidate {name}: {failed}")
        label = (labels or {}).get(name, name)
        scored[name] = _figures(summary, preset=label, max_rounds=rounds, final_dir=str(final))
        per_question[name] = [r.reward for r in sorted(res.records, key=lambda r: r.task_id)]
    found = run(BASELINES, 1)  # a cascade lifts itself to its two rounds
    baselines = {b: _figures(r.summary(), policy=r.policy) for b, r in zip(BASELINES, found, strict=True)}
    best = max(scored, key=lambda n: (scored[n]["mean_reward"], -list(scored).index(n)))
    margins = {n: _paired(per_question[best], per_question[n]) for n in scored if n != best}
    baseline_margins = {
        b: _paired(per_question[best], [x.reward for x in sorted(r.records, key=lambda x: x.task_id)])
        for b, r in zip(BASELINES, found, strict=True)
    }
    final_dir = root / "final"
    if final_dir.exists():
        shutil.rmtree(final_dir)
    shutil.copytree(finals[best], final_dir)
    choice = Choice(
        chosen=best,
        final_dir=final_dir,
        split=SPLIT,
        n=int(scored[best].get("n", 0)),
        reward={
            "reward_preset": first.reward_preset,
            "cost_weight": reward.cost_weight,
            "cost_scale": reward.cost_scale,
        },
        candidates=scored,
        baselines=baselines,
        margins=margins,
        baseline_margins=baseline_margins,
    )
    meta_path = final_dir / "conductor.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta["preset_choice"] = {
        "chosen": best,
        "preset": (labels or {}).get(best, best),
        "split": SPLIT,
        "validation_reward": {n: s["mean_reward"] for n, s in scored.items()},
    }
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (root / CHOICE_FILE).write_text(json.dumps(choice.to_dict(), indent=2) + "\n", encoding="utf-8")
    return choice
