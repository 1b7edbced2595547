"""``train(config, out_dir)``: model bootstrap → SFT warm start → GRPO (TRL) → a servable folder.

Output layout (``out_dir``)::

    base/         the model before training (tiny: built here; smol: unpacked from the GGUF)
    sft/          after the SFT warm start (skipped on --resume when present)
    grpo/         GRPO checkpoints (checkpoint-N); --resume continues from the last one
    final/        the trained Conductor: weights, tokenizer, conductor.json, prompt templates
    metrics.json  timings, reward curve, config

Metrics (reward, accuracy, cost, parse rate, steps, entropy) go to MLflow (local sqlite under
``.conductor/`` by default) and to a rich progress bar. Why SFT first: GRPO from a model that
never writes a parseable plan learns nothing (every completion scores 0, advantages are 0).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import random
import resource
import shutil
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from rl_conductor.errors import ConfigError
from rl_conductor.training.config import TrainConfig

log = logging.getLogger(__name__)


def _cpu_s() -> float:
    """CPU seconds of this process and of its subprocesses that have ended and been waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class TrainResult:
    out_dir: Path
    final_dir: Path
    seconds: dict[str, float] = field(default_factory=dict)
    #: CPU seconds per stage (this process and the subprocesses it has waited for: the table's
    #: forked builders, sandboxes): unlike ``seconds``, hardly changed by other load on the machine
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    reward_curve: list[dict[str, float]] = field(default_factory=list)
    global_step: int = 0
    mlflow_run_id: str | None = None
    time_limit_fired_at_step: int | None = None  # set when the time-limit safety net stopped GRPO
    #: SFT records by kind: first-round plans and (with max_rounds > 1) reviews
    sft_records: dict[str, int] = field(default_factory=dict)
    #: the warm start's fit to its own decisions (training/sft_fit.py): before and after any
    #: extra passes, per record kind; empty when SFT did not run (a resumed run)
    sft_fit: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "final_dir": str(self.final_dir),
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "reward_curve": self.reward_curve,
            "global_step": self.global_step,
            "mlflow_run_id": self.mlflow_run_id,
            "time_limit_fired_at_step": self.time_limit_fired_at_step,
            "sft_records": self.sft_records,
            "sft_fit": self.sft_fit,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainResult:
        """What :meth:`to_dict` wrote (rank 0's result file of a launch); keys it lacks keep
        their defaults."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "out_dir": Path(data["out_dir"]), "final_dir": Path(data["final_dir"])})


def _quiet() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    for name in ("transformers", "trl", "accelerate", "datasets", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - both are dependencies
        pass


def _corpus(tasks: list[Any], sft: list[dict[str, Any]]) -> list[str]:
    texts = [t.question for t in tasks]
    texts += [r["prompt"][0]["content"] + "\n" + r["completion"][0]["content"] for r in sft]
    return texts


def _last_checkpoint(d: Path) -> Path | None:
    cks = sorted(d.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1])) if d.exists() else []
    return cks[-1] if cks else None


def save_final(
    model_src: Path,
    final_dir: Path,
    cfg: TrainConfig,
    pool_names: list[str],
    dataset: str | None = None,
    fallback_worker: str | None = None,
    neighbour_choice: dict[str, Any] | None = None,
) -> Path:
    """Copy the model folder and write what serving needs next to it (conductor.json, prompts)."""
    if final_dir.exists():
        shutil.rmtree(final_dir)
    shutil.copytree(
        model_src,
        final_dir,
        ignore=shutil.ignore_patterns(
            "optimizer.pt", "scheduler.pt", "rng_state*", "trainer_state.json", "training_args.bin"
        ),
    )
    prompts = final_dir / "prompts"
    prompts.mkdir(exist_ok=True)
    for name in ("conductor.txt", "conductor_review.txt", "worker.txt"):
        (prompts / name).write_text(resources.files("rl_conductor.prompts").joinpath(name).read_text())
    meta = conductor_meta(cfg, pool_names, dataset, fallback_worker, neighbour_choice)
    (final_dir / "conductor.json").write_text(json.dumps(meta, indent=2))
    return final_dir


def conductor_meta(
    cfg: TrainConfig,
    pool_names: list[str],
    dataset: str | None = None,
    fallback_worker: str | None = None,
    neighbour_choice: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What serving and evaluation read next to the weights (``conductor.json``): also the pool,
    the dataset and the reward it was trained with, which ``plan`` and ``eval`` default to, and
    the worker an unparseable plan falls back to (the best single worker on the warm start's
    training questions at that reward, :meth:`ExpectedRewards.best_single`; absent without a
    warm-start table), and with ``warm_neighbours: auto`` what the training split decided
    (``warm_neighbours_choice``, :func:`rl_conductor.training.neighbours.choose_neighbours`)."""
    return {
        "format": "rl-conductor/1",
        "base_model": cfg.model,
        "pool": cfg.pool,
        "dataset": dataset or cfg.dataset,
        "reward": cfg.reward().to_dict(),
        "pool_workers": pool_names,
        "max_question_chars": cfg.max_question_chars,
        "question_cut": cfg.question_cut,
        "evidence": cfg.evidence,
        "max_completion_length": cfg.max_completion_length,
        "max_steps": cfg.max_steps_per_workflow,
        "max_rounds": cfg.max_rounds,
        "reward_preset": cfg.reward_preset,
        "train_config": cfg.to_dict(),
        # only when on: the conductor.json of every other model is as before
        **({"review_evidence": cfg.review_evidence} if cfg.review_evidence != "none" else {}),
        **({"fallback_worker": fallback_worker} if fallback_worker else {}),
        **({"warm_neighbours_choice": neighbour_choice} if neighbour_choice else {}),
        **({"plan_hint": True} if cfg.plan_hint else {}),
        # its training questions' kinds are saved with its evidence (policies/kinds.py)
        **({"kinds": True} if cfg.evidence != "none" and cfg.sft_targets == "expected-best" else {}),
    }


def train(
    cfg: TrainConfig, out_dir: str | Path, *, resume: bool = False, progress: bool = True
) -> TrainResult:
    """Run the whole training recipe (see module docstring) and return where things landed."""
    _quiet()
    import mlflow
    import torch
    from datasets import Dataset

    from rl_conductor.limits import RequestLimits
    from rl_conductor.lm.generate import torch_threads
    from rl_conductor.tasks.datasets import load_tasks, split_counts
    from rl_conductor.tracking import mlflow_utils
    from rl_conductor.training.data import grpo_records, make_specs, sft_records, warm_sft_records
    from rl_conductor.training.grpo_reward import ConductorReward
    from rl_conductor.workers.pool import load_pool

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(max(1, cfg.torch_threads))
    rng = random.Random(cfg.seed)
    result = TrainResult(out_dir=out, final_dir=out / "final")
    t_all, c_all = time.perf_counter(), _cpu_s()

    pool = load_pool(cfg.pool, seed=cfg.seed)
    dataset = cfg.dataset or pool.default_dataset()
    tasks = load_tasks(dataset, split="train", limit=cfg.train_limit, seed=cfg.seed)
    if not tasks:  # a one-line usage error: the file decides the split, not the code
        raise ConfigError(
            f"dataset {dataset!r} has no training tasks ({split_counts(dataset)}); give some items "
            "`split: train` (or no `split`: the id's hash picks one)"
        )
    from rl_conductor.training.resume import prepare_out

    with main_process_writes() as writer:  # resume only a folder of this recipe (training/resume.py)
        prepare_out(cfg, out, dataset, resume=resume, writer=writer, pool=pool)
    cfg = cut_for_shared_openings(cfg, tasks)
    base_limits = RequestLimits(max_steps=cfg.max_steps_per_workflow)
    spec_kw = dict(
        rng=rng,
        budget_prob=cfg.budget_prob,
        budgets=cfg.budgets_usd,
        random_pool_prob=cfg.random_pool_prob,
        min_pool_size=cfg.min_pool_size,
        deadline_fraction=cfg.deadline_fraction,
        deadline_range_s=cfg.deadline_range_s,
        balance_domains=cfg.balance_domains,
    )
    t0, c0 = time.perf_counter(), _cpu_s()
    evidence_model: Any = None
    evidence: dict[str, dict[str, float]] | None = None
    rule: dict[tuple[str, str, str], str] | None = None
    rank: Any = None
    text_rule: Any = None  # review_evidence: text (training/review_text.py)
    plan_hint: Any = None  # plan_hint (policies/plan_hint.py) and its training prompts' lines
    kinds: Any = None  # with evidence, the training questions' kinds (policies/kinds.py)
    hint: Any = None
    fallback: str | None = None  # conductor.json's fallback_worker
    neighbour_choice: dict[str, Any] | None = None  # conductor.json's warm_neighbours_choice
    if cfg.sft_targets == "expected-best":
        texts: list[Any] = []
        hints: list[Any] = []
        targets, evidence_model, evidence, rule = _warm_start(
            cfg, tasks, pool, progress=progress, text_rule=texts, plan_hint=hints if cfg.plan_hint else None
        )
        text_rule = texts[0] if texts else None
        if hints:
            from rl_conductor.training.data import training_hint

            plan_hint = hints[0]
            hint = training_hint(plan_hint, tasks)
        fallback = targets.best_single()
        if targets.neighbour_choice:  # warm_neighbours: auto, decided on the training split
            cfg = replace(cfg, warm_neighbours=targets.neighbour_choice["k"])
            neighbour_choice = targets.neighbour_choice
        # drawn after the warm start (which draws nothing from rng): their count may follow its choice
        sft_specs = make_specs(tasks, pool, sft_count(cfg, tasks), **spec_kw)
        if cfg.evidence == "rank":
            from rl_conductor.policies.evidence import Ranker

            rank = Ranker(evidence_model, cfg.reward())
        if evidence_model is not None:  # what a served request's kind is (policies/kinds.py)
            from rl_conductor.policies.kinds import KindIndex

            kinds = KindIndex.of(tasks, cfg.warm_group_by)
        sft = warm_sft_records(
            sft_specs,
            pool,
            base_limits,
            targets,
            max_question_chars=cfg.max_question_chars,
            evidence=evidence,
            question_cut=cfg.question_cut,
            rank=rank,
            by_rank=cfg.plan_by_rank,
            hint=hint,
        )
        domain_of = _first_plan_domains(sft_specs, sft)
        if rule is not None:  # rounds: the review prompt after each target first plan, and its target
            from rl_conductor.training.adaptive import review_records

            firsts = [
                targets.target(s.task, s.pool_view(pool).names(), s.budget, s.deadline)
                if hint is None
                else hint(s.task, s.pool_view(pool), s.limits(base_limits)).workflow(
                    s.pool_view(pool).names()
                )
                for s in sft_specs
            ]
            reviews = review_records(
                sft_specs,
                pool,
                base_limits,
                firsts,
                rule,
                max_question_chars=cfg.max_question_chars,
                text=text_rule,
                question_cut=cfg.question_cut,
            )
            result.sft_records["review"] = len(reviews)
            sft = [r for pair in itertools.zip_longest(sft, reviews) for r in pair if r is not None]
        result.seconds["candidates"] = time.perf_counter() - t0
        result.cpu_seconds["candidates"] = _cpu_s() - c0
    else:
        sft_specs = make_specs(tasks, pool, sft_count(cfg, tasks), **spec_kw)
        sft = sft_records(
            sft_specs,
            pool,
            base_limits,
            rng=rng,
            max_question_chars=cfg.max_question_chars,
        )
        domain_of = _first_plan_domains(sft_specs, sft)
    result.sft_records["first_round"] = len(sft) - result.sft_records.get("review", 0)
    # the fit's kinds and groups (training/sft_fit.py): first plans by domain, the rest are reviews
    kinds_of = ["first" if id(r) in domain_of else "review" for r in sft]
    groups_of: list[str | None] = [domain_of.get(id(r)) for r in sft]
    observed: list[dict[str, Any]] = []
    if cfg.observed_path:  # served workflows with a score and no gold (training/observed.py)
        from rl_conductor.training.observed import counts, trainer_records

        observed, decisions = trainer_records(
            cfg.observed_path,
            pool,
            base_limits,
            targets,
            cfg.reward(),
            max_steps=cfg.max_steps_per_workflow,
            max_question_chars=cfg.max_question_chars,
            question_cut=cfg.question_cut,
            copies=cfg.observed_copies,
            evidence=evidence,
            evidence_model=evidence_model,
            rank=rank,
            hint=hint,
            by_place=cfg.plan_by_rank,
        )
        result.sft_records.update(counts(decisions))
        result.sft_records["observed_records"] = len(observed)
        (out / "observed.json").write_text(
            json.dumps([d.to_dict() for d in decisions], indent=1), encoding="utf-8"
        )
        sft += observed
        kinds_of += ["observed"] * len(observed)
        groups_of += [None] * len(observed)
    # an optimizer step consumes prompts_per_step prompts per accumulated micro-batch (TRL's
    # generation batch is per_device_train_batch_size x gradient_accumulation_steps completions)
    n_grpo = cfg.grpo_steps * cfg.prompts_per_step * cfg.gradient_accumulation_steps
    grpo_specs = make_specs(tasks, pool, max(n_grpo, 1), **spec_kw)
    grpo = grpo_records(
        grpo_specs,
        pool,
        base_limits,
        max_question_chars=cfg.max_question_chars,
        evidence=evidence,
        question_cut=cfg.question_cut,
        rank=rank,
        hint=hint,
    )

    mlflow_utils.configure(cfg.mlflow_tracking_uri)
    with mlflow_utils.start_run(
        cfg.mlflow_experiment,
        run_name=f"train-{cfg.model}-{out.name}",
        params={**cfg.to_dict(), "dataset": dataset, "n_train_tasks": len(tasks)},
    ) as run:
        result.mlflow_run_id = run.info.run_id
        mlflow_utils.log_metrics({f"sft/{k}": float(v) for k, v in result.sft_records.items()})
        # 1. bootstrap
        t0, c0 = time.perf_counter(), _cpu_s()
        base = out / "base"
        sft_dir = out / "sft"
        if not (resume and (sft_dir / "config.json").exists()):
            if cfg.model == "tiny":
                from rl_conductor.lm.models import build_tiny

                with main_process_writes() as writer:
                    if writer and not (base / "config.json").exists():
                        build_tiny(
                            _corpus(tasks, sft),
                            base,
                            vocab_size=cfg.tiny_vocab_size,
                            seed=cfg.seed,
                            hidden_size=cfg.tiny_hidden_size,
                            num_hidden_layers=cfg.tiny_layers,
                            intermediate_size=cfg.tiny_intermediate_size,
                        )
                model_src: Path | str = base
            else:
                from rl_conductor.lm.models import resolve_model

                model_src = resolve_model(cfg.model, base)
            result.seconds["bootstrap"] = time.perf_counter() - t0
            result.cpu_seconds["bootstrap"] = _cpu_s() - c0
            # 2. SFT warm start
            t0, c0 = time.perf_counter(), _cpu_s()
            result.sft_fit = _sft(
                cfg, model_src, sft, sft_dir, progress=progress, kinds=kinds_of, groups=groups_of
            )
            if result.sft_fit:
                mlflow_utils.log_metrics(
                    {f"sft/fit_{k}": v for k, v in result.sft_fit["after"].items() if k != "n"}
                    | {"sft/fit_passes": result.sft_fit["passes"]}
                )
            # the SFT-only model is a Conductor too (the "before GRPO" baseline of evaluations)
            with main_process_writes() as writer:
                if writer:
                    meta = json.dumps(
                        conductor_meta(cfg, pool.names(), dataset, fallback, neighbour_choice), indent=2
                    )
                    (sft_dir / "conductor.json").write_text(meta)
                    if evidence_model is not None:
                        evidence_model.save(sft_dir)
                    if kinds is not None:
                        kinds.save(sft_dir)
                    if text_rule is not None:
                        text_rule.evidence.save(sft_dir)
                    if plan_hint is not None:
                        plan_hint.save(sft_dir)
            result.seconds["sft"] = time.perf_counter() - t0
            result.cpu_seconds["sft"] = _cpu_s() - c0
        # 3. GRPO
        t0, c0 = time.perf_counter(), _cpu_s()
        reward = ConductorReward(
            pool,
            {t.id: t for t in tasks},
            cfg.reward(),
            base_limits,
            review_rule=rule,
            review_text=text_rule,
        )
        trainer = _grpo_trainer(
            cfg, sft_dir, Dataset.from_list(grpo), reward, out / "grpo", progress=progress
        )
        ckpt = _last_checkpoint(out / "grpo") if resume else None
        with torch_threads(cfg.train_torch_threads or None):
            trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
        _save_policy(trainer, out / "grpo" / "last", merge_lora=cfg.use_lora)
        result.seconds["grpo"] = time.perf_counter() - t0
        result.cpu_seconds["grpo"] = _cpu_s() - c0
        result.global_step = int(trainer.state.global_step)
        result.time_limit_fired_at_step = _time_limit_fired(trainer)
        if result.time_limit_fired_at_step is not None:
            mlflow.log_metric("time_limit_fired_at_step", result.time_limit_fired_at_step)
        result.reward_curve = [
            {k: float(v) for k, v in h.items() if isinstance(v, (int, float))}
            for h in trainer.state.log_history
            if "reward" in h
        ]
        with main_process_writes() as writer:
            if writer:
                save_final(
                    out / "grpo" / "last",
                    result.final_dir,
                    cfg,
                    pool.names(),
                    dataset,
                    fallback,
                    neighbour_choice,
                )
                if evidence_model is not None:
                    evidence_model.save(result.final_dir)
                if kinds is not None:
                    kinds.save(result.final_dir)
                if text_rule is not None:
                    text_rule.evidence.save(result.final_dir)
                if plan_hint is not None:
                    plan_hint.save(result.final_dir)
        result.seconds["total"] = time.perf_counter() - t_all
        result.cpu_seconds["total"] = _cpu_s() - c_all
        mlflow.log_metrics({f"seconds_{k}": v for k, v in result.seconds.items()})
        mlflow.log_metrics({f"cpu_seconds_{k}": v for k, v in result.cpu_seconds.items()})
        with main_process_writes() as writer:
            if writer:
                metrics = json.dumps({**result.to_dict(), "config": cfg.to_dict()}, indent=2)
                (out / "metrics.json").write_text(metrics)
                mlflow.log_artifact(str(out / "metrics.json"))
    return result


#: how the first shared write of a multi-rank run saw the group ("1 of 2 MULTI_CPU"): each rank's
#: launch marker records it (training/launch.py), so a run whose ranks did not join shows it
FIRST_WRITE_GROUP: str | None = None


@contextlib.contextmanager
def main_process_writes() -> Iterator[bool]:
    """Yield whether this process writes shared files; with several ranks the others wait for it.

    Under ``accelerate launch`` (training/launch.py: one process per GPU) every rank runs
    :func:`train` on the same output folder: rank 0 bootstraps and saves, the other ranks wait at
    a barrier and then read what it wrote. A single process just writes.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        yield True
        return
    import torch
    from accelerate import PartialState

    # without CUDA the ranks join over gloo only when asked for the CPU: a plain PartialState()
    # found no GPU and took every rank for a lone process until the trainers' arguments joined
    # them, so the writes before (the base model) were each rank's own main's, at once, and the
    # barrier waited for nobody (test_launch's flake: a config.json read while rewritten)
    state = PartialState(cpu=not torch.cuda.is_available())
    global FIRST_WRITE_GROUP
    if FIRST_WRITE_GROUP is None:
        FIRST_WRITE_GROUP = f"{state.process_index} of {state.num_processes} {state.distributed_type.name}"
    yield state.is_main_process
    state.wait_for_everyone()


def _time_limit_fired(trainer: Any) -> int | None:
    """The step at which the TimeLimit callback stopped training, None if it did not fire."""
    from rl_conductor.training.callbacks import TimeLimit

    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, TimeLimit) and cb.fired_at_step is not None:
            return cb.fired_at_step
    return None


def warm_start_targets(cfg: TrainConfig, tasks: list[Any], pool: Any, *, progress: bool = False) -> Any:
    """The expected-best targets of the warm start (:func:`warm_start`'s first value)."""
    return warm_start(cfg, tasks, pool, progress=progress)[0]


def warm_start(
    cfg: TrainConfig, tasks: list[Any], pool: Any, *, progress: bool = False
) -> tuple[Any, Any, dict[str, dict[str, float]] | None]:
    """:func:`_warm_start` without the review rule."""
    return _warm_start(cfg, tasks, pool, progress=progress)[:3]


def fail_if_no_candidate_answered(table: Any, items: list[Any], pool: Any) -> None:
    """Raise when no candidate of the warm start's table got an answer on any training question.

    Why: a pool that answers none of the dataset's questions (a recordings file without its items,
    a dataset given by mistake, a dead endpoint) fails every call inside the traces; SFT and GRPO
    then train on all-zero outcomes to the end and exit 0. The error names the first call's."""
    import numpy as np

    executed = table.done[:, :, 0]
    if not executed.any() or bool(np.any(table.tokens[:, :, 0][executed] > 0)):
        return
    from rl_conductor.errors import UserError
    from rl_conductor.limits import RequestLimits
    from rl_conductor.training.candidates import execute_workflows, single

    view = pool.view()
    names = view.names()
    (trace,) = execute_workflows([(items[0], single(names[0]).workflow(names), RequestLimits())], view)
    first = next((a.error for a in trace.attempts if a.error), "no answer")
    raise UserError(
        f"no worker answered any of the {len(table.task_ids)} training questions of the warm start "
        f"(every candidate workflow failed); e.g. {first}"
    )


#: below this share of distinct cut questions, a ``head`` cut shows the Conductor a shared opening
SHARED_OPENING_SHARE = 0.5


def cut_for_shared_openings(cfg: TrainConfig, tasks: Sequence[Any]) -> TrainConfig:
    """``cfg`` with ``question_cut: ends`` when its ``head`` cut would show most training
    questions as the same text. Why: recordings of few-shot prompts often open every question
    with the same hundreds of characters; cut from the head, every prompt is then identical and
    the Conductor learns one plan for everything (an outside attack measured it: one worker on
    100 % of questions). Cutting from both ends keeps the question's own end. The choice is
    saved in ``conductor.json`` (``question_cut``), so serving cuts the same way."""
    if cfg.question_cut != "head" or not tasks:
        return cfg

    from rl_conductor.prompting import cut

    distinct = len({cut(t.question, cfg.max_question_chars, "head") for t in tasks})
    if distinct >= SHARED_OPENING_SHARE * len(tasks):
        return cfg
    log.warning(
        "only %d of %d training questions differ in their first %d characters (a shared opening, "
        "e.g. few-shot examples): the Conductor's prompt cuts questions from both ends instead "
        "(question_cut: ends)",
        distinct,
        len(tasks),
        cfg.max_question_chars,
    )
    return replace(cfg, question_cut="ends")


def sft_count(cfg: TrainConfig, tasks: Sequence[Any]) -> int:
    """First-round warm-start examples: ``sft_examples``, raised to ``sft_examples_per_domain``
    times the training split's number of domains (``sft_examples_per_domain_neighbours`` where
    per-question neighbourhoods make the targets: ``warm_neighbours`` a number above 0, as
    :func:`train` sets it once ``auto`` has decided)."""
    per_domain = cfg.sft_examples_per_domain
    if not isinstance(cfg.warm_neighbours, str) and cfg.warm_neighbours > 0:
        per_domain = max(per_domain, cfg.sft_examples_per_domain_neighbours)
    return max(cfg.sft_examples, per_domain * len({t.domain for t in tasks}))


def _first_plan_domains(specs: Sequence[Any], records: Sequence[Any]) -> dict[int, str]:
    """The domain of each first-plan SFT record (by ``id``), before review records join them: the
    fit's kinds and groups (training/sft_fit.py) tell first plans by domain from reviews."""
    return {id(r): s.task.domain for s, r in zip(specs, records, strict=True)}


def _warm_start(
    cfg: TrainConfig,
    tasks: list[Any],
    pool: Any,
    *,
    progress: bool = False,
    text_rule: list[Any] | None = None,
    plan_hint: list[Any] | None = None,
) -> tuple[Any, Any, dict[str, dict[str, float]] | None, dict[tuple[str, str, str], str] | None]:
    """The expected-best targets of the warm start: the candidate table (built or read from the
    cache) on ``warm_items_per_domain`` training questions per domain, averaged per
    neighbourhood under the training reward (see ``training/candidates.py`` and
    ``training/warmstart.py``). With ``evidence: probe`` also the evidence model fitted on the
    table's single-worker rows and every training question's estimates (out-of-fold for the
    table's questions, :func:`prompt_evidence`), which make the targets per question; else
    ``(targets, None, None)``. With ``max_rounds > 1`` the first plans are valued with their
    best review (``training/adaptive.py``: pairs of cheap workers added, the rounds table cached
    next to the candidate table) and the fitted review rule comes fourth (else None); with
    ``review_evidence: text`` the text rule (``training/review_text.py``) values the pairs instead
    and is appended to ``text_rule``; with ``plan_hint`` (a list) the plan hint made of the same
    lookup (:class:`rl_conductor.policies.plan_hint.PlanHint`) is appended to it."""

    from rl_conductor.tracking.mlflow_utils import conductor_home
    from rl_conductor.training.candidates import cached_table, group_of, select_items
    from rl_conductor.training.warmstart import ExpectedRewards

    default = conductor_home() / ".conductor" / "cache" / "candidates"
    items = select_items(tasks, cfg.warm_items_per_domain)
    table = cached_table(
        items,
        pool,
        Path(cfg.warm_cache_dir) if cfg.warm_cache_dir else default,
        budgets=cfg.budgets_usd,
        # deadline columns only when prompts carry deadlines (else the table is as before)
        deadlines=cfg.warm_deadlines_s if cfg.deadline_fraction > 0 else (),
        deadline_items_per_domain=cfg.warm_deadline_items_per_domain,
        top_k=cfg.warm_top_k,
        cheap_k=cfg.warm_cheap_k,
        max_steps=cfg.max_steps_per_workflow,
        progress=progress,
    )
    fail_if_no_candidate_answered(table, items, pool)
    if cfg.warm_group_by != "source":  # the cached table is grouped by source; regroup its rows
        by_id = {t.id: t for t in items}
        table = replace(table, groups=[group_of(by_id[i], cfg.warm_group_by) for i in table.task_ids])
    model, evidence = (
        prompt_evidence(
            table,
            items,
            tasks,
            seed=cfg.seed,
            shrink=cfg.evidence == "rank",
            select=cfg.reward() if cfg.evidence == "rank" and cfg.evidence_select != "none" else None,
            rule=cfg.evidence_select if cfg.evidence_select != "none" else "best",
        )
        if cfg.evidence != "none"
        else (None, None)
    )
    rule = None
    if cfg.max_rounds > 1:
        from rl_conductor.training.adaptive import adaptive_table, cached_rounds_table, fit_rule

        rounds = cached_rounds_table(
            items,
            pool,
            table,
            Path(cfg.warm_cache_dir) if cfg.warm_cache_dir else default,
            top_k=cfg.warm_top_k,
            pair_k=cfg.warm_pair_k,
            max_steps=cfg.max_steps_per_workflow,
            cascade_pairs=cfg.warm_cascade_pairs,
            config=cfg.reward(),
            shared_continuations=cfg.review_evidence == "text",
            progress=progress,
        )
        rule = fit_rule(rounds, cfg.reward(), cfg.warm_review_se_rule)
        choice = None
        if cfg.review_evidence == "text":  # the review reads the answers' texts (training/review_text.py)
            from rl_conductor.limits import RequestLimits
            from rl_conductor.training.review_text import fit_text_rule, review_rows

            limits = RequestLimits(max_steps=cfg.max_steps_per_workflow)
            rows = review_rows(items, pool, rounds, limits, progress=progress)
            text = fit_text_rule(rounds, rows, cfg.reward())
            log.info("review text rule per first plan: %s", text.summary)
            choice = text.choice
            if text_rule is not None:
                text_rule.append(text)
        table = adaptive_table(table, rounds, rule, choice)
    embeddings = None
    k, decided = cfg.warm_neighbours, None
    if k or plan_hint is not None:  # per-question neighbourhoods (policies/expected.py neighbour_means)
        from rl_conductor.policies.knn import cached_embeddings

        by_id = {t.id: t for t in items}
        embeddings = cached_embeddings([by_id[i].question for i in table.task_ids])
        if k == "auto":  # measured on the training split (training/neighbours.py)
            from rl_conductor.training.neighbours import choose_neighbours

            decided = choose_neighbours(
                table, [by_id[i] for i in table.task_ids], pool.names(), cfg.reward(), embeddings,
                shrink=cfg.warm_shrink, se_rule=cfg.warm_se_rule, group_by=cfg.warm_group_by,
                item_evidence=evidence, seed=cfg.seed,
            )  # fmt: skip
            k = decided["k"]
            log.info("warm_neighbours auto: %s", decided)
    targets = ExpectedRewards.fit(
        table,
        cfg.reward(),
        shrink=cfg.warm_shrink,
        se_rule=cfg.warm_se_rule,
        group_by=cfg.warm_group_by,
        item_evidence=evidence,
        neighbours=int(k),
        embeddings=embeddings,
    )
    targets.neighbour_choice = decided or {}
    if plan_hint is not None:
        from rl_conductor.policies.plan_hint import PlanHint

        plan_hint.append(
            PlanHint(
                targets, embeddings, int(k), cfg.warm_shrink, table.domains, table.groups, table.task_ids
            )
        )
    return targets, model, evidence, rule


def prompt_evidence(
    table: Any,
    items: list[Any],
    tasks: list[Any],
    *,
    seed: int = 0,
    shrink: bool = False,
    select: Any = None,
    rule: str = "best",
) -> tuple[Any, dict[str, dict[str, float]]]:
    """The evidence model (:mod:`rl_conductor.policies.evidence`) fitted on the candidate table's
    single-worker rows (no budget; with their costs, and with ``shrink`` blended with each
    domain's rate; with ``select``, the reward, the estimator chosen by out-of-fold training
    reward, ``fit_evidence(select=...)``), and task id -> worker -> estimate for every training
    question: out-of-fold for the table's questions, the fitted model's for the others (which it
    never saw either)."""
    import numpy as np

    from rl_conductor.policies.evidence import evidence_for, fit_evidence
    from rl_conductor.policies.knn import cached_embeddings

    singles = [(j, c.steps[0][0]) for j, c in enumerate(table.candidates) if len(c.steps) == 1]
    by_id = {t.id: t for t in items}
    rows = [by_id[i] for i in table.task_ids]
    correct = (
        table.correct[:, [j for j, _ in singles], 0].astype(bool) & table.done[:, [j for j, _ in singles], 0]
    )
    # embedded as the whole training list (the cache the routers and benchmarks share), then
    # indexed: the table's rows are a reordered subset of it
    known = {t.id: i for i, t in enumerate(tasks)}
    if all(t.id in known for t in rows):
        every = cached_embeddings([t.question for t in tasks])
        emb = every[[known[t.id] for t in rows]]
    else:
        every, emb = None, cached_embeddings([t.question for t in rows])
    cost = np.nan_to_num(table.cost[:, [j for j, _ in singles], 0])
    model, oof = fit_evidence(
        rows,
        emb,
        [n for _, n in singles],
        correct,
        seed=seed,
        cost=cost,
        shrink=shrink,
        select=select,
        rule=rule,
    )
    out = {t.id: model.as_mapping(r) for t, r in zip(rows, oof, strict=True)}
    rest = [t for t in tasks if t.id not in out]
    if rest:
        rest_emb = (
            every[[known[t.id] for t in rest]]
            if every is not None
            else cached_embeddings([t.question for t in rest])
        )
        found = evidence_for(model, rest, rest_emb)
        out.update({t.id: e for t, e in zip(rest, found, strict=True)})
    return model, out


def _save_policy(trainer: Any, path: Path, *, merge_lora: bool) -> None:
    """Save the trained policy as a complete model folder.

    With LoRA, ``save_model`` would write only the adapter, whose ``base_model_name_or_path`` is
    this machine's ``sft/`` folder: ``final/`` would not load anywhere else (S3, the registry,
    a serving pod). So the adapter is merged into the weights first, as after SFT.
    """
    if not merge_lora:
        trainer.save_model(str(path))
        return
    model = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
    if trainer.is_world_process_zero():
        model.save_pretrained(str(path))
        trainer.processing_class.save_pretrained(str(path))


def check_sft_lengths(records: list[dict[str, Any]], tokenizer: Any, max_tokens: int) -> int:
    """The longest SFT example in tokens (prompt and target, as the chat template renders them);
    a ``ConfigError`` when one is longer than ``max_tokens`` (``TrainConfig.sft_max_length``).
    Why: the trainer cuts an example to the window from its end, so the target plan — what the
    example teaches — is what goes: many workers with long descriptions in a pool file would
    train on nothing, silently."""

    texts = [tokenizer.apply_chat_template(r["prompt"] + r["completion"], tokenize=False) for r in records]
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]] if texts else []
    over = [n for n in lengths if n > max_tokens]
    if over:
        raise ConfigError(
            f"{len(over)} of {len(records)} warm-start examples are longer than the {max_tokens}-token "
            f"window (the longest: {max(over)} tokens), so their target plans would be cut off: "
            "shorten the workers' descriptions in the pool file, lower max_question_chars, use "
            "fewer workers, or raise sft_max_length (within the model's context; both are keys of a "
            "training preset: copy the preset's YAML, edit it and pass its path to --preset)"
        )
    return max(lengths, default=0)


def _sft(
    cfg: TrainConfig,
    model_src: Path | str,
    records: list[dict[str, Any]],
    sft_dir: Path,
    *,
    progress: bool,
    kinds: list[str] | None = None,
    groups: list[str | None] | None = None,
) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig

    from rl_conductor.lm.generate import torch_threads
    from rl_conductor.training.callbacks import MlflowMetrics, RichProgress, quiet
    from rl_conductor.training.sft_loss import CompletionLossSFTTrainer

    longest = check_sft_lengths(records, AutoTokenizer.from_pretrained(str(model_src)), cfg.sft_max_length)
    log.info("warm start: %d examples, the longest %d tokens", len(records), longest)
    args = SFTConfig(
        output_dir=str(sft_dir.parent / "sft_work"),
        num_train_epochs=cfg.sft_epochs,
        learning_rate=cfg.sft_learning_rate,
        per_device_train_batch_size=cfg.sft_batch_size,
        lr_scheduler_type="cosine",
        warmup_steps=10,
        logging_steps=cfg.logging_steps,
        save_strategy="no",
        report_to=[],
        bf16=cfg.bf16,
        use_cpu=not (cfg.bf16 or cfg.use_vllm or _has_gpu()),
        seed=cfg.seed,
        completion_only_loss=True,
        max_length=cfg.sft_max_length,
        disable_tqdm=True,
        activation_checkpointing=cfg.gradient_checkpointing,  # transformers 5: the new name
        dataloader_num_workers=0,
    )
    peft_config = _peft(cfg)
    trainer = quiet(
        CompletionLossSFTTrainer(
            model=str(model_src),
            args=args,
            train_dataset=Dataset.from_list(records),
            peft_config=peft_config,
            callbacks=[RichProgress("SFT warm start", enabled=progress), MlflowMetrics(prefix="sft/")],
            decision_weight=cfg.sft_decision_weight,
        ),
        progress,
    )
    with torch_threads(cfg.train_torch_threads or None):
        trainer.train()
        fit = _fit_decisions(cfg, trainer, args, records, kinds or ["first"] * len(records), groups, progress)
    model = trainer.model
    if peft_config is not None:
        model = model.merge_and_unload()
    # trainers switch the KV cache off for training; generation without it recomputes the
    # whole prompt for every new token (several times slower), so saved models always have it on
    model.config.use_cache = True
    model.generation_config.use_cache = True
    with main_process_writes() as writer:
        if writer:
            model.save_pretrained(str(sft_dir))
            trainer.processing_class.save_pretrained(str(sft_dir))
            shutil.rmtree(sft_dir.parent / "sft_work", ignore_errors=True)
    return fit


def _fit_decisions(
    cfg: TrainConfig,
    trainer: Any,
    args: Any,
    records: list[dict[str, Any]],
    kinds: list[str],
    groups: list[str | None] | None,
    progress: bool,
) -> dict[str, Any]:
    """The warm start's fit to its own decisions, and extra passes while it is below
    ``sft_fit_target`` (training/sft_fit.py). Each pass is a fresh trainer on the current weights
    (a new optimizer and schedule: the first one's learning rate has decayed to zero)."""
    from dataclasses import replace as dc_replace

    from datasets import Dataset

    from rl_conductor.training.callbacks import MlflowMetrics, RichProgress, quiet
    from rl_conductor.training.sft_fit import decision_fit, fit_passes
    from rl_conductor.training.sft_loss import CompletionLossSFTTrainer

    state = {"trainer": trainer}

    def measure() -> dict[str, Any]:
        t = state["trainer"]
        return decision_fit(t.model, t.processing_class, records, kinds, seed=cfg.seed, groups=groups)

    def more(n: int) -> None:
        t = state["trainer"]
        # the finished trainer's optimizer state is not needed again (a full fine-tune would hold
        # two optimizers' memory during the pass otherwise)
        t.optimizer = t.lr_scheduler = None
        t.accelerator.free_memory()
        state["trainer"] = quiet(
            CompletionLossSFTTrainer(
                model=t.model,
                args=dc_replace(args, num_train_epochs=cfg.sft_fit_epochs),
                train_dataset=Dataset.from_list(records),
                processing_class=t.processing_class,
                callbacks=[
                    RichProgress(f"SFT fit pass {n}", enabled=progress),
                    MlflowMetrics(prefix=f"sft_fit{n}/"),
                ],
                decision_weight=cfg.sft_decision_weight,
            ),
            progress,
        )
        state["trainer"].train()

    best: dict[str, Any] = {}

    def save() -> None:  # the trainable weights only (a LoRA model's adapters, not its base)
        m = state["trainer"].model
        best.update({k: v.detach().clone() for k, v in m.named_parameters() if v.requires_grad})

    def restore() -> None:
        import torch

        params = dict(state["trainer"].model.named_parameters())
        with torch.no_grad():
            for k, v in best.items():
                params[k].copy_(v)

    def warn(message: str) -> None:  # once, not once per rank (training/launch.py)
        if os.environ.get("RANK", "0") == "0":
            log.warning(message)

    out = fit_passes(
        measure, more, target=cfg.sft_fit_target, epochs=cfg.sft_fit_epochs,
        max_passes=cfg.sft_fit_max_passes, warn=warn, save=save, restore=restore,
    )  # fmt: skip
    log.info("warm start fit to its decisions: %s", out)
    trainer.model = state["trainer"].model
    return out


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _peft(cfg: TrainConfig) -> Any:
    if not cfg.use_lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules="all-linear", task_type="CAUSAL_LM"
    )


def grpo_config(cfg: TrainConfig, output_dir: str) -> Any:
    """The TRL GRPOConfig for a TrainConfig (also used to validate the gpu preset offline)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        max_steps=cfg.grpo_steps,
        learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.completions_per_step,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature,
        top_k=0,
        top_p=1.0,
        beta=cfg.beta,
        entropy_coef=cfg.entropy_coef,
        logging_steps=cfg.logging_steps,
        save_steps=cfg.save_steps,
        save_strategy="steps",
        save_total_limit=2,
        report_to=[],
        bf16=cfg.bf16,
        use_cpu=not (cfg.bf16 or cfg.use_vllm or _has_gpu()),
        seed=cfg.seed,
        use_vllm=cfg.use_vllm,
        vllm_mode=cfg.vllm_mode,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        activation_checkpointing=cfg.gradient_checkpointing,  # transformers 5: the new name
        disable_tqdm=True,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=5,
        dataloader_num_workers=0,
        log_completions=False,
        shuffle_dataset=False,
        generation_kwargs={"use_cache": True},
    )


def _grpo_trainer(
    cfg: TrainConfig, sft_dir: Path, dataset: Any, reward: Any, out: Path, *, progress: bool
) -> Any:
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from rl_conductor.training.callbacks import MlflowMetrics, RichProgress, TimeLimit, quiet

    tok = AutoTokenizer.from_pretrained(str(sft_dir))
    tok.padding_side = "left"
    # TRL reads transformers' deprecated model.is_gradient_checkpointing on every step: a
    # FutureWarning about library internals that no setting of ours changes
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )
    callbacks: list[Any] = [RichProgress("GRPO", enabled=progress), MlflowMetrics(prefix="grpo/")]
    if cfg.time_limit_s:
        callbacks.append(TimeLimit(cfg.time_limit_s))
    return quiet(
        GRPOTrainer(
            model=str(sft_dir),
            reward_funcs=[reward],
            args=grpo_config(cfg, str(out)),
            train_dataset=dataset,
            processing_class=tok,
            callbacks=callbacks,
            peft_config=_peft(cfg),
        ),
        progress,
    )
