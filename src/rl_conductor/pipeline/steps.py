"""The training pipeline's steps as plain functions: what each KFP component calls.

Why: the components in ``components/`` are thin adapters (read their inputs, call one function
here, write their outputs), so every step can be run and tested without Kubeflow, and a
cluster run and a local run execute the same code.

Steps: :func:`prepare_data` → :func:`train_step` → :func:`evaluate_step` →
:func:`register_step` → :func:`promote_step`. Besides the KFP artifacts they return, steps copy
what a person looks at later below the *artifact root* (a local folder by default,
``s3://bucket/prefix`` on a cluster, written through :mod:`rl_conductor.storage`)::

    <artifact root>/<run tag>/data/{train,validation,test}.jsonl
    <artifact root>/<run tag>/checkpoints/      base/, sft/, grpo/, final/, metrics.json
    <artifact root>/<run tag>/reports/          report.md, report.html, pareto.png, results.json

Deliberate simplifications:
- The prepared splits are handed to training and evaluation by registering them, in the
  step's own process, as a dataset named ``prepared-<fingerprint>``
  (:func:`register_prepared`); ``train()`` and ``run_eval()`` then load them by name like any
  other dataset. Splits stay those of :func:`rl_conductor.tasks.datasets.split_of`.
- ``test_split_id`` (what the evaluation gate compares) fingerprints the test task ids, the
  pool file's contents, the evaluation seed and the code that produces outcomes
  (:func:`rl_conductor.fingerprint.evaluation_id`): accuracies measured in another
  world are not comparable. The evaluation also records its best baseline (best single worker
  or ``domain-router``) with the Conductor's metrics, and the gate refuses a Conductor below it.
- Dataset files are small JSON lines written in one piece; checkpoints are uploaded after
  training ends, not while it runs.
- MLflow artifacts follow the artifact root when it is on S3 (``<root>/mlflow``), and apply
  only to experiments created by that run (see ``tracking.mlflow_utils``).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rl_conductor import storage
from rl_conductor.errors import ConfigError
from rl_conductor.tasks.base import Task
from rl_conductor.validation import DATA_SPLITS  # the splits every prepared dataset has

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from rl_conductor.tracking.registry import VersionRow

__all__ = [
    "DATA_SPLITS",
    "DEFAULT_MODEL_NAME",
    "EvalOutcome",
    "ManualPromotion",
    "PreparedData",
    "PromoteOutcome",
    "RegisterOutcome",
    "SplitInfo",
    "TrainOutcome",
    "call_same_named",
    "deadline_parameters",
    "default_artifact_root",
    "evaluate_step",
    "parse_overrides",
    "prepare_data",
    "promote_by_hand",
    "promote_step",
    "read_tasks",
    "register_prepared",
    "register_step",
    "run_folder",
    "test_split_id",
    "train_step",
    "write_tasks",
]

_R = TypeVar("_R")

DEFAULT_MODEL_NAME = "conductor"
#: Per-request budgets (USD) under which the evaluation re-runs the Conductor and the routers.
BUDGETS: tuple[float, ...] = (0.002,)
#: Per-request deadlines (seconds) under which the evaluation re-runs them (latency vs accuracy);
#: one by default to keep the step short, more with the pipeline's ``eval_deadlines``.
DEADLINES: tuple[float, ...] = (5.0,)
CONDUCTOR_LABEL = "conductor"
#: Keys of the Conductor's evaluation summary that become MLflow metrics of the version.
REGISTERED_METRICS = (
    "accuracy",
    "mean_cost_usd",
    "mean_tokens",
    "mean_calls",
    "mean_steps",
    "parse_rate",
    "fallback_rate",
    "p50_latency_s",
    "p95_latency_s",
    "n",
    "mean_reward",
    "verify_rate",
    "baseline_accuracy",
    "baseline_mean_cost_usd",
    "baseline_mean_reward",
)


# --------------------------------------------------------------------------- components


def call_same_named(step: Callable[..., _R], scope: Mapping[str, Any], /, **arguments: Any) -> _R:
    """``step`` called with every value of ``scope`` (a KFP component's ``locals()``: its
    parameters) whose name is one of its parameters, then ``arguments``, which win: a component
    passes its parameters on without writing each name twice."""
    names = inspect.signature(step).parameters
    return step(**({name: scope[name] for name in names if name in scope} | arguments))


# --------------------------------------------------------------------------- locations


def default_artifact_root() -> str:
    """``<CONDUCTOR_HOME or cwd>/.conductor/artifacts``."""
    from rl_conductor.tracking.mlflow_utils import conductor_home

    return str(conductor_home() / ".conductor" / "artifacts")


def run_folder(artifact_root: str, run_tag: str) -> str:
    """The folder (or S3 prefix) of one pipeline run below the artifact root."""
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_tag).strip("-.") or "run"
    return storage.join(artifact_root or default_artifact_root(), tag)


def _mlflow_artifact_root(artifact_root: str) -> str | None:
    return storage.join(artifact_root, "mlflow") if storage.is_s3(artifact_root) else None


@contextlib.contextmanager
def mlflow_tracking(tracking_uri: str, artifact_root: str) -> Iterator[None]:
    """Point MLflow at ``tracking_uri`` (empty: the default) for the body, S3 artifacts included.

    ``train()`` configures MLflow itself from the environment, so the artifact location is
    passed through ``$CONDUCTOR_ARTIFACT_ROOT`` and restored afterwards.
    """
    from rl_conductor.tracking import mlflow_utils

    mlflow_root = _mlflow_artifact_root(artifact_root)
    saved = os.environ.get(mlflow_utils.ARTIFACT_ROOT_ENV)
    replace = bool(mlflow_root) and not saved  # an explicit setting wins
    if replace:
        os.environ[mlflow_utils.ARTIFACT_ROOT_ENV] = str(mlflow_root)
    try:
        mlflow_utils.configure(tracking_uri or None)
        yield
    finally:
        if replace:
            if saved is None:
                os.environ.pop(mlflow_utils.ARTIFACT_ROOT_ENV, None)
            else:
                os.environ[mlflow_utils.ARTIFACT_ROOT_ENV] = saved


# --------------------------------------------------------------------------- task files


def write_tasks(path: str | os.PathLike[str], tasks: Iterable[Task]) -> int:
    """Write tasks as JSON lines (``Task.to_dict``) to a local file; returns how many."""
    lines = [json.dumps(t.to_dict(), ensure_ascii=False) for t in tasks]
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def read_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Tasks from a JSON lines file written by :func:`write_tasks`."""
    text = Path(path).read_text(encoding="utf-8")
    return [Task.from_dict(json.loads(line)) for line in text.splitlines() if line.strip()]


def _fingerprint(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:12]


def register_prepared(paths: Sequence[str | os.PathLike[str]]) -> str:
    """Register the tasks of ``paths`` as a dataset of this process; returns its name.

    The name (``prepared-<fingerprint of the task ids>``) is stable, so re-registering the
    same files is harmless and caches keyed by dataset name (the kNN router's) stay valid.
    """
    from rl_conductor.tasks.datasets import register_dataset

    tasks: list[Task] = []
    for p in paths:
        tasks.extend(read_tasks(p))
    if not tasks:
        raise ValueError(f"no tasks in {[str(p) for p in paths]}")
    name = f"prepared-{_fingerprint(sorted(t.id for t in tasks))}"
    frozen = tuple(tasks)

    def load_prepared() -> list[Task]:
        return list(frozen)

    register_dataset(name)(load_prepared)
    return name


def test_split_id(tasks: Iterable[Task], pool: str, seed: int = 0) -> str:
    """Identifier of an evaluation: ``<pool>-n<count>-<fingerprint>`` of the task ids, the pool
    file's contents, the seed and the code version (``fingerprint.evaluation_id``)."""
    from rl_conductor.fingerprint import evaluation_id

    return evaluation_id((t.id for t in tasks), pool, seed=seed)


# --------------------------------------------------------------------------- prepare


@dataclass(frozen=True)
class SplitInfo:
    """One prepared split: where it went and what is in it."""

    split: str
    n: int
    domains: dict[str, int]
    uri: str

    def metadata(self) -> dict[str, Any]:
        return {"split": self.split, "n": self.n, "domains": dict(self.domains), "uri": self.uri}


@dataclass(frozen=True)
class PreparedData:
    """What :func:`prepare_data` did."""

    dataset: str
    run_folder: str
    splits: dict[str, SplitInfo]


def dataset_of_pool(pool: str) -> str:
    """The default dataset of pool ``pool`` (its ``default_dataset`` option, else ``paper-mix``)."""
    from rl_conductor.workers.pool import load_pool

    return load_pool(pool).default_dataset()


def prepare_data(
    *,
    outputs: Mapping[str, str | os.PathLike[str]],
    dataset: str = "",
    pool: str = "paper-sim",
    train_limit: int | None = None,
    eval_limit: int | None = None,
    seed: int = 0,
    artifact_root: str = "",
    run_tag: str = "local",
) -> PreparedData:
    """Split ``dataset`` (default: the pool's) into train / validation / test task files.

    ``outputs`` maps each split name to a local file to write. ``train_limit`` caps the train
    split and ``eval_limit`` the validation and test splits (a seeded sample). The files are
    also copied to ``<artifact root>/<run tag>/data/``.
    """
    from rl_conductor.tasks.datasets import domain_counts, load_tasks

    missing = [s for s in DATA_SPLITS if s not in outputs]
    if missing:
        raise ValueError(f"outputs lacks the splits {missing}")
    name = dataset or dataset_of_pool(pool)
    folder = run_folder(artifact_root, run_tag)
    infos: dict[str, SplitInfo] = {}
    for split in DATA_SPLITS:
        limit = train_limit if split == "train" else eval_limit
        tasks = load_tasks(name, split, limit=limit or None, seed=seed)
        if not tasks:
            raise ValueError(f"dataset {name!r} has no {split} tasks")
        write_tasks(outputs[split], tasks)
        uri = storage.join(folder, "data", f"{split}.jsonl")
        storage.write_bytes(uri, Path(outputs[split]).read_bytes())
        infos[split] = SplitInfo(split=split, n=len(tasks), domains=domain_counts(tasks), uri=uri)
    return PreparedData(dataset=name, run_folder=folder, splits=infos)


# --------------------------------------------------------------------------- train


def parse_overrides(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Training-config overrides from a JSON object (the pipeline passes them as a string)."""
    from rl_conductor.training.config import TrainConfig

    if text is None or text == "":
        return {}
    data = json.loads(text) if isinstance(text, str) else dict(text)
    if not isinstance(data, dict):
        raise ValueError(f"training overrides must be a JSON object, got {text!r}")
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown training config keys in overrides: {unknown}")
    fixed = sorted({"dataset", "train_limit"} & set(data))
    if fixed:
        raise ValueError(
            f"{fixed} come from the prepared train split: set the pipeline's dataset / train_limit instead"
        )
    return data


@dataclass(frozen=True)
class TrainOutcome:
    """What :func:`train_step` produced."""

    model_dir: str
    checkpoints_uri: str
    global_step: int
    seconds: dict[str, float]
    base_model: str
    n_train_tasks: int
    first_reward: float | None = None
    last_reward: float | None = None
    mlflow_run_id: str | None = None
    #: with a list of presets: the chosen one, and the baselines that scored above it on validation
    chosen_preset: str = ""
    better_baselines: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        out = {"global_step": float(self.global_step), "n_train_tasks": float(self.n_train_tasks)}
        out.update({f"seconds_{k}": float(v) for k, v in self.seconds.items()})
        if self.first_reward is not None:
            out["first_reward"] = self.first_reward
        if self.last_reward is not None:
            out["last_reward"] = self.last_reward
        return out


def train_step(
    *,
    train_path: str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    preset: str = "tiny",
    pool: str = "",
    reward_preset: str = "",
    cost_weight: float | None = None,
    grpo_steps: int | None = None,
    sft_examples: int | None = None,
    overrides: Mapping[str, Any] | str | None = None,
    seed: int = 0,
    mlflow_tracking_uri: str = "",
    artifact_root: str = "",
    run_tag: str = "local",
    progress: bool = False,
    gpus: int = 1,
    validation_path: str | os.PathLike[str] | None = None,
    dataset: str = "",
) -> TrainOutcome:
    """Train a Conductor on the prepared train split; the servable folder lands in ``model_dir``.

    Empty / None arguments keep the preset's value. The whole training folder (checkpoints
    included) goes to ``<artifact root>/<run tag>/checkpoints``: trained there directly when the
    root is local, uploaded after training when it is on S3. With ``gpus`` > 1 and that many GPUs
    visible, training runs one process per GPU (``accelerate launch``, training/launch.py).

    ``preset`` may list several (``recordings,recordings-text``) or be ``auto``, as for
    ``conductor train``: each candidate trains into ``checkpoints/candidates/<name>``, they and
    the baselines are scored on the prepared ``validation_path`` split at one reward, and the best
    is the model (``checkpoints/choice.json``; pipeline/choose.py). The test split is not read.
    ``dataset`` (the pipeline's, before preparation) is what ``auto`` reads to see whether the
    recordings keep their texts, as ``conductor train --dataset`` does.
    """
    from rl_conductor.pipeline.choose import CHOICE_FILE, candidate_presets, folder_names, train_and_choose
    from rl_conductor.training.config import load_preset
    from rl_conductor.training.launch import train_on_all_gpus, visible_gpus
    from rl_conductor.training.train import train

    trained: dict[str, Any] = {}

    def run_training(cfg: Any, out: str | Path) -> Any:
        if gpus > 1 and visible_gpus() >= gpus:
            res = train_on_all_gpus(cfg, str(out), processes=gpus)
        else:
            res = train(cfg, out, progress=progress)
        trained[str(Path(out).resolve())] = res
        return res

    extra = parse_overrides(overrides)
    specs = candidate_presets(preset, pool or extra.get("pool"), dataset or None)
    if len(specs) > 1 and not validation_path:
        raise ConfigError(f"preset {preset!r} chooses among presets on the validation split: give its data")
    # one preset trains on the train split alone (its dataset name, and so every cache, as before)
    prepared = register_prepared([train_path] if len(specs) == 1 else [train_path, str(validation_path)])

    def config(spec: str) -> Any:
        cfg = load_preset(
            spec,
            **{
                **extra,
                "pool": pool or extra.get("pool"),
                "dataset": prepared,
                "reward_preset": reward_preset or extra.get("reward_preset"),
                "cost_weight": cost_weight if cost_weight is not None else extra.get("cost_weight"),
                "grpo_steps": grpo_steps or extra.get("grpo_steps"),
                "sft_examples": sft_examples or extra.get("sft_examples"),
                "seed": seed,
                "mlflow_tracking_uri": mlflow_tracking_uri or extra.get("mlflow_tracking_uri"),
            },
        )
        cfg.train_limit = None  # the prepared split is already the sample to train on
        return cfg

    folders = folder_names(specs)
    cfgs = {folders[spec]: config(spec) for spec in specs}
    cfg = next(iter(cfgs.values()))
    chosen, better = "", []
    checkpoints = storage.join(run_folder(artifact_root, run_tag), "checkpoints")
    with contextlib.ExitStack() as stack:
        stack.enter_context(mlflow_tracking(mlflow_tracking_uri, artifact_root))
        work = checkpoints
        if storage.is_s3(checkpoints):
            work = stack.enter_context(tempfile.TemporaryDirectory(prefix="conductor-train-"))
        if len(specs) == 1:
            result = run_training(cfg, work)
            final_dir = result.final_dir
        else:
            labels = {folders[spec]: spec for spec in specs}
            choice = train_and_choose(cfgs, work, progress=progress, labels=labels, trainer=run_training)
            cfg = cfgs[choice.chosen]
            result = trained[str((Path(work) / "candidates" / choice.chosen).resolve())]
            final_dir = choice.final_dir
            chosen, better = labels[choice.chosen], choice.better_baselines()
            mine = choice.candidates[choice.chosen]["mean_reward"]
            for b in better:  # said, as conductor train says it
                theirs = choice.baselines[b]["mean_reward"]
                log.warning(
                    "on the validation split %s (%.4f) scores above the chosen Conductor %s (%.4f)",
                    b, theirs, chosen, mine,
                )  # fmt: skip
        if storage.is_s3(checkpoints):
            record = Path(work) / CHOICE_FILE
            if record.is_file():  # its paths name the temporary folder: name the uploaded one
                local = str(Path(work).resolve())
                record.write_text(
                    record.read_text(encoding="utf-8").replace(local, checkpoints), encoding="utf-8"
                )
            storage.upload_dir(work, checkpoints)
        out = Path(model_dir)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(final_dir, out)
    rewards = [r["reward"] for r in result.reward_curve if "reward" in r]
    return TrainOutcome(
        model_dir=str(out),
        checkpoints_uri=checkpoints,
        global_step=result.global_step,
        seconds=dict(result.seconds),
        base_model=cfg.model,
        n_train_tasks=len(read_tasks(train_path)),
        first_reward=rewards[0] if rewards else None,
        last_reward=rewards[-1] if rewards else None,
        mlflow_run_id=result.mlflow_run_id,
        chosen_preset=chosen,
        better_baselines=better,
    )


# --------------------------------------------------------------------------- evaluate


@dataclass(frozen=True)
class EvalOutcome:
    """What :func:`evaluate_step` measured and wrote."""

    test_split_id: str
    conductor: dict[str, Any]
    summaries: list[dict[str, Any]]
    files: dict[str, str]
    uris: dict[str, str] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """The Conductor's numbers plus accuracy and cost of every other policy (flat)."""
        out = {k: float(self.conductor[k]) for k in REGISTERED_METRICS if self.conductor.get(k) is not None}
        for s in self.summaries:
            if s["policy"] == CONDUCTOR_LABEL:
                continue
            out[f"{s['policy']}/accuracy"] = float(s["accuracy"])
            out[f"{s['policy']}/mean_cost_usd"] = float(s["mean_cost_usd"])
        return out


def deadline_parameters(max_latency_s: float, deadlines: str) -> tuple[float | None, tuple[float, ...]]:
    """The evaluation's deadline settings from pipeline parameters: ``max_latency_s`` 0 means no
    deadline for the main evaluation; ``deadlines`` is ``""`` (:data:`DEADLINES`), ``"none"`` (no
    deadline view) or seconds like ``"60,15,5"``. Bad values raise ``ValueError`` naming them."""
    from rl_conductor.evaluation.report import parse_deadlines
    from rl_conductor.validation import non_negative_finite

    limit = non_negative_finite("max_latency_s", max_latency_s)
    text = deadlines.strip()
    if not text:
        return (limit or None), DEADLINES
    if text.lower() == "none":
        return (limit or None), ()
    return (limit or None), tuple(d for d in parse_deadlines(text) if d is not None)


def evaluate_step(
    *,
    model_dir: str | os.PathLike[str],
    train_path: str | os.PathLike[str],
    test_path: str | os.PathLike[str],
    outputs: Mapping[str, str | os.PathLike[str]],
    pool: str = "paper-sim",
    seed: int = 0,
    artifact_root: str = "",
    run_tag: str = "local",
    budgets: Sequence[float] = BUDGETS,
    deadlines: Sequence[float] = DEADLINES,
    max_latency_s: float | None = None,
) -> EvalOutcome:
    """Run the Conductor and every baseline (routers included) on the prepared test split.

    ``outputs`` names local files for ``report_md``, ``report_html``, ``pareto_png`` and
    ``results_json``; they are also copied to ``<artifact root>/<run tag>/reports/``. Every
    policy is scored with the reward the Conductor was trained with (its ``conductor.json``), and
    the kNN and domain routers are fitted at that reward on the whole prepared train split. The
    best of the gate's baselines at that reward (``tracking.gate.best_baseline``) is attached to
    the Conductor's summary as ``baseline_*``.
    Under each of ``budgets`` (USD per request) the Conductor and the two routers run the same
    questions again; the report shows them side by side and ``results.json`` keeps them under
    ``budget_results``. (Single workers under a budget: ``conductor compare --budgets``; left out
    here to keep ``make run`` short: they would run every worker again under every budget.)
    Likewise under each of ``deadlines`` (seconds per request): the report's latency-vs-accuracy
    view, ``deadline_results`` in ``results.json`` and, when
    ``outputs`` names ``latency_png``, its chart. ``max_latency_s`` is a deadline for every
    request of the whole evaluation (None: none), so the gate compares the Conductor with the
    baselines under the deadline it will be served with.
    """
    from rl_conductor.evaluation.paired import paired_rows
    from rl_conductor.evaluation.suite import GridPoint, baseline_specs, run_sweep
    from rl_conductor.lm.generate import torch_threads, trained_threads
    from rl_conductor.pipeline.report import write_reports
    from rl_conductor.policies.conductor import read_conductor_meta
    from rl_conductor.tracking.gate import best_baseline
    from rl_conductor.validation import positive_finite

    missing = [k for k in ("report_md", "report_html", "pareto_png", "results_json") if k not in outputs]
    if missing:
        raise ValueError(f"outputs lacks {missing}")
    if max_latency_s is not None:
        positive_finite("max_latency_s", max_latency_s)
    budgets = [positive_finite("budgets", b) for b in budgets]
    deadlines = [positive_finite("deadlines", d) for d in deadlines]
    dataset = register_prepared([train_path, test_path])
    tests = read_tasks(test_path)
    split_id = test_split_id(tests, pool, seed)
    conductor_spec = f"conductor:{model_dir}"
    specs = [conductor_spec, *baseline_specs(pool)]
    # every evaluation of this step: the same pool, prepared test split and seed, and the rounds
    # the Conductor was trained for (``max_rounds`` in its conductor.json; the pipeline's
    # train_overrides set it)
    trained = read_conductor_meta(model_dir)
    rounds = int(trained.get("max_rounds", 1))
    same_questions: dict[str, Any] = dict(
        pool=pool, dataset=dataset, split="test", limit=None, seed=seed, progress=False, max_rounds=rounds
    )

    # the Conductor and the routers again on the same questions under each budget and deadline
    again = (conductor_spec, *(p for p in specs[1:] if p in ("domain-router", "knn")))
    points = [
        GridPoint(max_latency_s=max_latency_s),
        *(GridPoint(b, max_latency_s, {"budget": f"{b:g}"}, again) for b in budgets),
        *(GridPoint(None, d, {"deadline": f"{d:g}"}, again) for d in deadlines),
    ]
    # torch on the threads the Conductor trained with (the same outputs as on one per core)
    with torch_threads(trained_threads(trained)):
        runs = iter(run_sweep(specs, points, **same_questions))
    by_kind: dict[str, list[dict[str, Any]]] = {"": [], "budget": [], "deadline": []}
    for point in points:
        for spec in point.only or specs:
            s = next(runs)  # tagged with the dataset, the split id, the Conductor under its report name
            s["policy"] = CONDUCTOR_LABEL if spec == conductor_spec else s["policy"]
            s.update(dataset=dataset, test_split_id=split_id)
            by_kind[next(iter(point.label), "")].append(s)
    summaries, budget_summaries, deadline_summaries = by_kind[""], by_kind["budget"], by_kind["deadline"]
    conductor = summaries[0]
    baseline = best_baseline(summaries[1:])
    if baseline is not None:
        conductor.update(baseline)
    ordered = [*summaries[1:], conductor]  # baselines first, the Conductor last (as in the paper's tables)
    meta = {
        "test_split_id": split_id,
        "pool": pool,
        "run_tag": run_tag,
        "n": len(tests),
        "seed": seed,
        "best_baseline": baseline,
        "max_latency_s": max_latency_s,
        "reward": conductor.get("reward"),
        # the Conductor minus each policy, question by question (95 % paired intervals)
        "paired": paired_rows(ordered, CONDUCTOR_LABEL),
    }
    write_reports(
        ordered,
        meta,
        md_path=outputs["report_md"],
        html_path=outputs["report_html"],
        png_path=outputs["pareto_png"],
        budget_summaries=budget_summaries,
        deadline_summaries=deadline_summaries,
        latency_png_path=outputs.get("latency_png"),
    )
    storage_payload = {
        "meta": meta,
        "results": ordered,
        "budget_results": budget_summaries,
        "deadline_results": deadline_summaries,
    }
    Path(outputs["results_json"]).parent.mkdir(parents=True, exist_ok=True)
    Path(outputs["results_json"]).write_text(json.dumps(storage_payload, indent=2), encoding="utf-8")
    reports = storage.join(run_folder(artifact_root, run_tag), "reports")
    names = {
        "report_md": "report.md",
        "report_html": "report.html",
        "pareto_png": "pareto.png",
        "results_json": "results.json",
    }
    uris = {}
    if deadline_summaries and outputs.get("latency_png"):
        names["latency_png"] = "latency.png"
    for key, filename in names.items():
        uris[key] = storage.join(reports, filename)
        storage.write_bytes(uris[key], Path(outputs[key]).read_bytes())
    files = {k: str(outputs[k]) for k in names}
    return EvalOutcome(test_split_id=split_id, conductor=conductor, summaries=ordered, files=files, uris=uris)


def read_results(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(meta, summaries)`` from a ``results.json`` written by :func:`evaluate_step`."""
    payload = json.loads(Path(path).read_text(encoding="utf-8"))
    return dict(payload["meta"]), list(payload["results"])


# --------------------------------------------------------------------------- register


@dataclass(frozen=True)
class RegisterOutcome:
    """The registered version."""

    name: str
    version: int
    model_uri: str
    run_id: str
    aliases: tuple[str, ...]


def register_step(
    *,
    model_dir: str | os.PathLike[str],
    results_path: str | os.PathLike[str],
    report_files: Mapping[str, str | os.PathLike[str]] | None = None,
    model_name: str = DEFAULT_MODEL_NAME,
    params: Mapping[str, Any] | None = None,
    mlflow_tracking_uri: str = "",
    artifact_root: str = "",
    run_tag: str = "local",
) -> RegisterOutcome:
    """Log the model folder to MLflow as a new version of ``model_name`` aliased ``challenger``.

    The version's run carries the Conductor's evaluation metrics (``accuracy``,
    ``mean_cost_usd``, ...), a ``test_split_id`` param and tag, the training config, and the
    evaluation reports under ``eval/`` (``report_files`` maps a file name there to a local file).
    """
    from rl_conductor.policies.conductor import read_conductor_meta
    from rl_conductor.serving.pyfunc import MODEL_CODE
    from rl_conductor.tracking import registry

    meta, summaries = read_results(results_path)
    conductor = next((s for s in summaries if s["policy"] == CONDUCTOR_LABEL), None)
    if conductor is None:
        raise ValueError(f"{results_path} has no {CONDUCTOR_LABEL!r} row")
    metrics = {k: conductor[k] for k in REGISTERED_METRICS if conductor.get(k) is not None}
    best = (meta.get("best_baseline") or {}).get(registry.BASELINE_POLICY_KEY)
    against = next((r for r in meta.get("paired") or [] if r.get("against") == best), None)
    if against is not None:  # the margin over the best baseline, question by question (95 % interval)
        low, high = against["reward"]["ci95"]
        metrics.update(
            paired_reward_diff=against["reward"]["diff"], paired_reward_ci_low=low, paired_reward_ci_high=high
        )
    folder = Path(model_dir)
    info = read_conductor_meta(folder)
    all_params: dict[str, Any] = {
        registry.TEST_SPLIT_KEY: meta["test_split_id"],
        "pool": meta.get("pool", ""),
        "run_tag": run_tag,
        "base_model": info.get("base_model", ""),
        "reward_preset": info.get("reward_preset", ""),
        registry.BASELINE_POLICY_KEY: (meta.get("best_baseline") or {}).get(registry.BASELINE_POLICY_KEY, ""),
        **dict(params or {}),
    }
    choice = info.get("preset_choice")
    if isinstance(choice, dict) and choice.get("preset"):  # a list of presets: record the chosen one
        all_params["preset_candidates"] = all_params.get("preset", "")
        all_params["preset"] = choice["preset"]
    artifacts = {f"eval/{name}": path for name, path in (report_files or {}).items()}
    artifacts["eval/results.json"] = results_path
    with mlflow_tracking(mlflow_tracking_uri, artifact_root):
        mv = registry.log_conductor_model(
            folder,
            model_code=MODEL_CODE,
            name=model_name,
            metrics=metrics,
            params=all_params,
            artifact_files=artifacts,
            tags={"pipeline.run_tag": run_tag},
            experiment=model_name,
            run_name=f"register-{run_tag}",
            alias=registry.CHALLENGER,
        )
    return RegisterOutcome(
        name=mv.name, version=mv.version, model_uri=mv.model_uri, run_id=mv.run_id, aliases=mv.aliases
    )


# --------------------------------------------------------------------------- promote


@dataclass(frozen=True)
class PromoteOutcome:
    """The gate's decision and where ``champion`` points afterwards (0: nowhere)."""

    promoted: bool
    reason: str
    champion: int
    previous_champion: int


def promote_step(
    *,
    version: int,
    model_name: str = DEFAULT_MODEL_NAME,
    min_accuracy_gain: float = 0.0,
    max_cost_ratio: float = 1.0,
    min_accuracy: float = 0.0,
    mlflow_tracking_uri: str = "",
) -> PromoteOutcome:
    """Gate ``version`` against the current champion (``tracking.gate``) and move the alias if it passes."""
    from rl_conductor.tracking import gate, registry

    thresholds = gate.GateThresholds(
        min_accuracy_gain=min_accuracy_gain, max_cost_ratio=max_cost_ratio, min_accuracy=min_accuracy
    )
    with mlflow_tracking(mlflow_tracking_uri, ""):
        before = registry.get_alias_version(model_name, registry.CHAMPION)
        decision = gate.promote_if_better(model_name, int(version), thresholds=thresholds)
        after = registry.get_alias_version(model_name, registry.CHAMPION)
    return PromoteOutcome(
        promoted=decision.promote, reason=decision.reason, champion=after or 0, previous_champion=before or 0
    )


@dataclass(frozen=True)
class ManualPromotion:
    """A promotion by hand: the version that held the alias before (if any) and the new one."""

    alias: str
    previous: VersionRow | None
    current: VersionRow


def promote_by_hand(
    version: int,
    *,
    model_name: str = DEFAULT_MODEL_NAME,
    alias: str = "champion",
    mlflow_tracking_uri: str = "",
) -> ManualPromotion:
    """Point ``alias`` at ``version`` without the gate (a person decided); tags the version."""
    from rl_conductor.tracking import registry

    with mlflow_tracking(mlflow_tracking_uri, ""):
        rows = {r.version: r for r in registry.list_versions(model_name)}
        if int(version) not in rows:
            known = ", ".join(str(v) for v in sorted(rows)) or "none"
            raise ValueError(f"{model_name} has no version {version} (versions: {known})")
        before = registry.get_alias_version(model_name, alias)
        registry.promote(model_name, int(version), alias=alias)
        registry.tag_version(
            model_name,
            int(version),
            {"promoted_by": "hand", f"{alias}.previous": "" if before is None else str(before)},
        )
        current = next(r for r in registry.list_versions(model_name) if r.version == int(version))
    return ManualPromotion(
        alias=alias, previous=rows.get(before) if before is not None else None, current=current
    )
