"""Training configuration as a dataclass (TRL style): each field documents itself once, and
``__post_init__`` says how to fix a bad combination. Presets live in ``configs/train/*.yaml``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rl_conductor import validation
from rl_conductor.errors import ConfigError, UnknownName, yaml_problem
from rl_conductor.limits import DEFAULT_MAX_STEPS, MAX_ROUNDS, MAX_STEPS
from rl_conductor.policies.expected import GROUP_BY
from rl_conductor.prompting import QUESTION_CUTS
from rl_conductor.reward import RewardConfig, reward_config

#: The micro Conductor: the smallest run that still learns the output format (a 64-unit, 2-layer
#: tiny model with a 1024-token vocabulary; plans of at most 2 steps in 48 completion tokens; 3
#: GRPO steps), trained in tens of seconds on two CPU cores. The test suite's shared run
#: (tests/_tiny.py) and benchmarks/serving_load.py's default Conductor are these settings.
MICRO_SETTINGS: dict[str, Any] = {
    "model": "tiny",
    "tiny_hidden_size": 64,
    "tiny_layers": 2,
    "tiny_intermediate_size": 128,
    "tiny_vocab_size": 1024,
    "train_limit": 48,
    "max_question_chars": 120,
    "max_steps_per_workflow": 2,
    "sft_examples": 256,
    "sft_epochs": 2.0,
    "sft_learning_rate": 0.01,
    "sft_batch_size": 16,
    "grpo_steps": 3,
    "prompts_per_step": 2,
    "num_generations": 4,
    "temperature": 0.5,
    "max_completion_length": 48,
    "save_steps": 2,
    "logging_steps": 1,
    "torch_threads": 1,
}

#: What per-question evidence the Conductor's prompt carries (``TrainConfig.evidence``).
EVIDENCE = ("none", "probe", "rank")
#: How ``evidence: rank`` picks its estimator (``TrainConfig.evidence_select``,
#: ``policies.evidence.fit_evidence(select=...)``): none keeps the shrunk probe.
EVIDENCE_SELECT = ("none", "best", "1se", "logloss")
#: What a review prompt shows of round 1's answers (``TrainConfig.review_evidence``).
REVIEW_EVIDENCE = ("none", "text")


def _f(default: Any, help: str) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """Everything ``conductor train`` needs; presets fill it for tiny (CPU), smol (CPU) and gpu."""

    # what to train on
    model: str = _f("tiny", "tiny | smol | a local folder | s3://… | a Hugging Face id (GPU clusters)")
    pool: str = _f("paper-sim", "worker pool (name or YAML path) that rollouts run against")
    dataset: str | None = _f(None, "training dataset (default: the pool's default_dataset)")
    train_limit: int | None = _f(None, "use at most N training tasks")
    seed: int = _f(0, "seed for data, pools and training")
    max_steps_per_workflow: int = _f(DEFAULT_MAX_STEPS, "most steps a workflow may have (paper: 5)")
    max_question_chars: int = _f(700, "questions are cut to this length in the Conductor prompt")
    question_cut: str = _f(
        "head",
        "how a long question is cut: head (its start) | ends (its start and its end, for few-shot "
        "prompts whose start every item shares)",
    )
    evidence: str = _f(
        "none",
        "per-question evidence in the prompt: none | probe (each worker's estimated chance of "
        "answering this question right, fitted on the training split; policies/evidence.py); "
        "with probe the warm-start targets are made per question from the same estimates | rank "
        "(the estimates shrunk towards each domain's rate, and a last prompt line ranking the "
        "usable workers by estimated reward; the target is its first id alone)",
    )
    plan_by_rank: bool = _f(
        True,
        "with evidence: rank, write the warm-start target as a rank address (model_id = [@1], the "
        "ranking line's first worker; workflow.parse resolves it) instead of that worker's id: "
        "following the evidence is then one constant a tiny model learns, ids still parse",
    )
    plan_hint: bool = _f(
        False,
        "end the prompt with 'Plan by estimate: 3, 5', the plan the question's nearest training "
        "questions scored best with (the warm start's own lookup, policies/plan_hint.py; its "
        "group's plan where warm_neighbours is 0), and write the target by place (model_id = [@1, "
        "@2]); saved with the model for evaluation and serving. Needs sft_targets: expected-best "
        "and evidence: none. Measured with recordings-text on two simulated files: a tie "
        "(docs/recordings.md, the plan line)",
    )
    evidence_select: str = _f(
        "none",
        "with evidence: rank, the estimator chosen on the training split by out-of-fold reward at "
        "the training reward among the domain rates, kNN means, the shrunk and plain probe and their "
        "stack (policies/evidence.py): best | 1se (the simplest within one standard error) | logloss "
        "(the lowest out-of-fold log-loss instead of reward) | none (the shrunk probe, as before)",
    )
    # tiny model shape
    tiny_vocab_size: int = _f(4096, "BPE vocabulary of the tiny model's tokenizer")
    tiny_hidden_size: int = _f(128, "hidden size of the tiny Qwen2 model")
    tiny_layers: int = _f(4, "decoder layers of the tiny model")
    tiny_intermediate_size: int = _f(384, "MLP width of the tiny model")
    # reward
    reward_preset: str = _f("cost-aware", "cost-aware (default) or paper (0 / 0.5 / 1, no cost term)")
    cost_weight: float | None = _f(None, "override the preset's cost weight")
    cost_scale: float | None = _f(None, "override the preset's cost scale (USD)")
    # prompt randomisation
    budget_prob: float = _f(0.25, "share of training prompts that carry a random budget")
    budgets_usd: list[float] = _f(
        [0.002, 0.005, 0.01, 0.02, 0.05], "budgets drawn for budget-conditioned prompts"
    )
    deadline_fraction: float = _f(
        0.0, "share of training prompts that carry a random deadline (0 = the recipe without deadlines)"
    )
    deadline_range_s: list[float] = _f(
        [5.0, 60.0], "[shortest, longest] deadline in seconds, drawn log-uniformly (training.deadlines)"
    )
    random_pool_prob: float = _f(
        0.3, "share of prompts that show a random subset of the workers (ids remapped)"
    )
    min_pool_size: int = _f(2, "smallest random subset")
    balance_domains: bool = _f(
        False, "every domain gets the same share of training prompts (rare domains' plans are learnt too)"
    )
    max_rounds: int = _f(
        1,
        "rounds the trained Conductor plans for (conductor.json records it; eval, plan and serve "
        "default to it); 1 = plan once, before any worker runs",
    )
    review_evidence: str = _f(
        "none",
        "what the review prompt shows after round 1 (max_rounds > 1): none (the extracted answers "
        "and their agreement) | text (also each answer's text signals and the estimate of a review "
        "estimator fitted on the training split, rl_conductor/review_evidence.py; the review "
        "targets then follow its rule: escalate where the estimated reward gain > tau)",
    )
    # SFT warm start
    sft_examples: int = _f(3000, "synthesised valid workflows for the warm start")
    sft_examples_per_domain: int = _f(
        0,
        "at least this many first-round warm-start examples per domain of the training split "
        "(sft_examples is raised to it times the number of domains; 0: off). Why: a per-domain "
        "target over many workers is a constant the tiny model must tie to the question's domain, "
        "and a fixed count spread over more domains teaches each one less",
    )
    sft_examples_per_domain_neighbours: int = _f(
        0,
        "with per-question warm-start targets in use (warm_neighbours, or auto deciding for them), "
        "at least this many first-round examples per domain instead (0: as sft_examples_per_domain). "
        "Why: a group's target is one plan to tie to a kind of question; per-question targets are a "
        "rule over the question's text, which a tiny model learns from more examples",
    )
    sft_epochs: float = _f(1.0, "epochs over the SFT examples")
    sft_learning_rate: float = _f(2e-3, "SFT learning rate")
    sft_batch_size: int = _f(32, "SFT batch size")
    sft_max_length: int = _f(
        1024,
        "tokens of one warm-start example (prompt and target plan); training refuses a longer one, "
        "which the trainer would cut from its end, the plan first",
    )
    sft_decision_weight: float = _f(
        1.0,
        "multiplies the SFT loss of the completion tokens that carry the decision: the model_id list "
        "of a plan (which workers) and of a review (empty = keep, else the added steps' workers); "
        "the divisor stays the token count (training/sft_loss.py). 1 = every completion token alike",
    )
    sft_fit_target: float = _f(
        0.0,
        "after the SFT epochs, the share of training decisions (the model_id lists of the SFT "
        "records, teacher-forced) the model must reproduce; below it, sft_fit_epochs more epochs, at "
        "most sft_fit_max_passes times, then a warning (training/sft_fit.py). 0: measure and report "
        "only. Why: a warm start can end its epochs with a whole domain's plan unlearnt",
    )
    sft_fit_epochs: float = _f(3.0, "epochs of one extra SFT pass (sft_fit_target)")
    sft_fit_max_passes: int = _f(0, "extra SFT passes at most (sft_fit_target)")
    sft_targets: str = _f(
        "expected-best",
        "expected-best: each prompt's workflow with the best mean reward over its neighbourhood of "
        "executed candidates (training/warmstart.py); random: uniformly random valid workflows "
        "(format only, the ablation baseline)",
    )
    warm_items_per_domain: int = _f(
        500,
        "training questions per domain on which every candidate workflow is executed (few items "
        "overfit the targets: benchmarks/README.md, measured design choices)",
    )
    warm_deadlines_s: list[float] = _f(
        [5.0, 15.0, 40.0],
        "deadlines (s) under which the candidates are also executed for deadline-aware warm-start "
        "targets (used only when deadline_fraction > 0; a prompt's target comes from the largest "
        "one not above its deadline)",
    )
    warm_deadline_items_per_domain: int = _f(
        200,
        "training questions per domain on which the deadline columns are executed (a subset; "
        "fewer pick worse deadline targets: benchmarks/README.md, measured design choices)",
    )
    warm_top_k: int = _f(2, "strongest workers per domain that composed candidates are built from")
    warm_cheap_k: int = _f(1, "cheap workers per domain that composed candidates are built from")
    warm_pair_k: int = _f(
        4,
        "with max_rounds > 1: the most accurate workers cheaper than the best whose pairs (two fresh "
        "solves in parallel) are first-plan candidates valued with their best review (training/adaptive.py)",
    )
    warm_cascade_pairs: int = _f(
        0,
        "with max_rounds > 1: per domain, also the first pairs of this many best fixed cascades fitted "
        "on the domain's training questions at the training reward, whatever their workers' accuracy "
        "alone (training/adaptive.py cascade_sets); 0: only the warm_pair_k most accurate",
    )
    warm_shrink: float = _f(
        20.0, "a (domain, source) group's mean leans on its domain's mean with this many items' weight"
    )
    warm_neighbours: int | str = _f(
        0,
        "per-question warm-start targets: each training question's plans valued by the mean over "
        "its this many nearest training questions of its domain (the kNN router's MiniLM "
        "embeddings, leave-one-out), shrunk towards its group's mean with warm_shrink items' "
        "weight (training/warmstart.py neighbour_means); 0: its group's mean; auto: 50 where they "
        "beat the group means out of sample on the training split by more than a paired standard "
        "error, else 0 (training/neighbours.py; the choice is recorded in conductor.json)",
    )
    warm_group_by: str = _f(
        "source",
        "neighbourhood of the warm-start targets: source = (domain, source); subject = also the "
        "task's subject where it has one (MMLU): on routellm-replay GPT-4's edge over Mixtral "
        "differs by MMLU subject from -30 to +27 points; domain = the domain alone, for sources "
        "the Conductor cannot tell apart from the question's first characters; task = the domain, "
        "split by task type where a source mixes several (metadata task_name: llmrouter's "
        "commonsense questions and logic-grid puzzles)",
    )
    warm_se_rule: float = _f(
        0.0,
        "one-standard-error rule of the targets: a plan within this many paired standard errors of "
        "the best counts as tied and the tie goes to fewer steps (0 = always the best mean)",
    )
    warm_review_se_rule: float = _f(
        0.0,
        "the same rule for the review targets (max_rounds > 1): a continuation replaces keep only "
        "where its mean reward gain over keep on the training questions of its group exceeds this "
        "many paired standard errors (0 = always the best mean)",
    )
    warm_cache_dir: str | None = _f(
        None, "where the candidate table is cached (default: .conductor/cache/candidates)"
    )
    observed_path: str = _f(
        "",
        "JSON lines of served requests with a score and no gold answer (training/observed.py): each "
        "executed workflow is an SFT target for its question when it earned at least the warm start's "
        "expected reward there (the closed loop's collect step writes it; empty = none)",
    )
    observed_copies: int = _f(1, "SFT examples per taught observed workflow")
    # GRPO
    grpo_steps: int = _f(400, "GRPO optimizer steps")
    prompts_per_step: int = _f(4, "questions per GRPO step")
    num_generations: int = _f(8, "completions per question (the GRPO group)")
    learning_rate: float = _f(5e-4, "GRPO learning rate")
    beta: float = _f(0.0, "KL weight (paper: 0)")
    temperature: float = _f(1.0, "sampling temperature of rollouts (paper: 1.0)")
    max_completion_length: int = _f(128, "max tokens of a Conductor completion (paper: 1024)")
    entropy_coef: float = _f(0.0, "entropy bonus against collapse (TRL entropy_coef)")
    gradient_accumulation_steps: int = _f(1, "gradient accumulation")
    time_limit_s: float | None = _f(
        None,
        "safety net: stop GRPO after this many seconds (a checkpoint is saved, a warning logged and "
        "time_limit_fired_at_step recorded); size runs with grpo_steps, not with this",
    )
    save_steps: int = _f(100, "checkpoint every N GRPO steps")
    logging_steps: int = _f(10, "log metrics every N steps")
    # hardware
    torch_threads: int = _f(
        1, "CPU threads for torch (1 is fastest for tiny models on a shared 2-core machine)"
    )
    train_torch_threads: int = _f(
        0,
        "CPU threads for torch while SFT and GRPO train (0: torch_threads, which evaluation and "
        "serving generate with); batched forward and backward passes use a second core well",
    )
    bf16: bool = _f(False, "bfloat16 (GPU)")
    use_lora: bool = _f(False, "train LoRA adapters instead of all weights (7B on GPU)")
    lora_r: int = _f(16, "LoRA rank")
    lora_alpha: int = _f(32, "LoRA alpha")
    use_vllm: bool = _f(False, "generate rollouts with vLLM (GPU only)")
    vllm_mode: str = _f("colocate", "vLLM mode: colocate (same GPUs) or server")
    vllm_gpu_memory_utilization: float = _f(0.3, "GPU memory share vLLM may take in colocate mode")
    gradient_checkpointing: bool = _f(False, "gradient checkpointing (GPU, big models)")
    # tracking
    mlflow_experiment: str = _f("conductor-training", "MLflow experiment for training runs")
    mlflow_tracking_uri: str | None = _f(None, "MLflow tracking URI (default: sqlite under .conductor/)")

    def reward(self) -> RewardConfig:
        """The reward this recipe trains with (its preset, cost weight and cost scale)."""
        return reward_config(self.reward_preset, cost_weight=self.cost_weight, cost_scale=self.cost_scale)

    def __post_init__(self) -> None:
        # the same rules as the CLI options and pipeline parameters (rl_conductor.validation)
        validation.integer_at_least("grpo_steps", self.grpo_steps, 1)
        validation.integer_at_least("sft_examples", self.sft_examples, 1)
        validation.integer_at_least("sft_examples_per_domain", self.sft_examples_per_domain, 0)
        validation.integer_at_least(
            "sft_examples_per_domain_neighbours", self.sft_examples_per_domain_neighbours, 0
        )
        validation.integer_at_least("sft_max_length", self.sft_max_length, 64)
        validation.integer_at_least("seed", self.seed, 0)
        if self.cost_weight is not None:
            validation.non_negative_finite("cost_weight", self.cost_weight)
        if self.time_limit_s is not None:
            validation.positive_finite("time_limit_s", self.time_limit_s)
        if self.train_limit is not None:
            validation.integer_at_least("train_limit", self.train_limit, 1)
        if self.num_generations < 2:
            raise ConfigError("num_generations must be >= 2: GRPO compares completions within a group")
        if self.reward_preset not in ("cost-aware", "paper"):
            raise ConfigError(f"reward_preset must be 'cost-aware' or 'paper', not {self.reward_preset!r}")
        if self.use_vllm and self.vllm_mode not in ("colocate", "server"):
            raise ConfigError("vllm_mode must be 'colocate' or 'server'")
        if self.use_lora and self.model in ("tiny",):
            raise ConfigError(
                "LoRA on the tiny model makes no sense: set use_lora=false or pick a bigger model"
            )
        if not 0 <= self.budget_prob <= 1 or not 0 <= self.random_pool_prob <= 1:
            raise ConfigError("budget_prob and random_pool_prob are probabilities in [0, 1]")
        if not 0 <= self.deadline_fraction <= 1:
            raise ConfigError("deadline_fraction is a probability in [0, 1]")
        from rl_conductor.training.deadlines import check_range

        check_range(self.deadline_range_s)
        if not 1 <= self.max_steps_per_workflow <= MAX_STEPS:  # a request's cap (limits.MAX_STEPS)
            raise ConfigError(f"max_steps_per_workflow must be >= 1 and <= {MAX_STEPS}")
        if self.sft_targets not in ("expected-best", "random"):
            raise ConfigError(f"sft_targets must be 'expected-best' or 'random', not {self.sft_targets!r}")
        if not 1 <= self.max_rounds <= MAX_ROUNDS or self.warm_pair_k < 0:  # limits.MAX_ROUNDS
            raise ConfigError(f"max_rounds must be >= 1 and <= {MAX_ROUNDS}, and warm_pair_k >= 0")
        if (
            isinstance(self.warm_cascade_pairs, bool)
            or not isinstance(self.warm_cascade_pairs, int)
            or (self.warm_cascade_pairs < 0)
        ):
            raise ConfigError(f"warm_cascade_pairs must be an integer >= 0, not {self.warm_cascade_pairs!r}")
        if self.warm_items_per_domain < 1 or self.warm_top_k < 1 or self.warm_cheap_k < 0:
            raise ConfigError("warm_items_per_domain and warm_top_k must be >= 1 and warm_cheap_k >= 0")
        validation.non_negative_finite("warm_se_rule", self.warm_se_rule)
        if self.warm_neighbours != "auto" and (
            isinstance(self.warm_neighbours, bool)
            or not isinstance(self.warm_neighbours, int)
            or self.warm_neighbours < 0
        ):
            raise validation.InvalidValue("warm_neighbours", self.warm_neighbours, "an integer >= 0, or auto")
        if self.warm_neighbours and self.sft_targets != "expected-best":
            raise ConfigError(
                "warm_neighbours values the warm start's candidate table: set sft_targets: expected-best "
                "(or warm_neighbours: 0)"
            )
        validation.non_negative_finite("warm_review_se_rule", self.warm_review_se_rule)
        validation.integer_at_least("observed_copies", self.observed_copies, 1)
        validation.integer_at_least("torch_threads", self.torch_threads, 1)
        validation.integer_at_least("train_torch_threads", self.train_torch_threads, 0)
        if self.observed_path and self.sft_targets != "expected-best":
            raise ConfigError(
                "observed_path needs sft_targets: expected-best (an observed workflow is taught "
                "only when it earned at least the warm start's expected reward)"
            )
        validation.positive_finite("sft_decision_weight", self.sft_decision_weight)
        validation.non_negative_finite("sft_fit_target", self.sft_fit_target)
        if self.sft_fit_target > 1:
            raise ConfigError(f"sft_fit_target is a share of decisions, 0 to 1; got {self.sft_fit_target!r}")
        validation.positive_finite("sft_fit_epochs", self.sft_fit_epochs)
        validation.integer_at_least("sft_fit_max_passes", self.sft_fit_max_passes, 0)
        if self.sft_decision_weight != 1.0 and (self.use_lora or self.bf16):
            raise ConfigError(
                "sft_decision_weight != 1 needs the completion-only SFT loss, which LoRA and bf16 "
                "training do not use (training/sft_loss.py): set sft_decision_weight: 1.0"
            )
        if self.question_cut not in QUESTION_CUTS:
            raise ConfigError(
                f"question_cut must be one of {', '.join(QUESTION_CUTS)}, not {self.question_cut!r}"
            )
        if self.review_evidence not in REVIEW_EVIDENCE:
            raise ConfigError(
                f"review_evidence must be one of {', '.join(REVIEW_EVIDENCE)}, not {self.review_evidence!r}"
            )
        if self.review_evidence != "none" and (self.max_rounds < 2 or self.sft_targets != "expected-best"):
            raise ConfigError(
                f"review_evidence: {self.review_evidence} is a review's: set max_rounds: 2 and "
                "sft_targets: expected-best (or review_evidence: none)"
            )
        if self.plan_hint and (self.sft_targets != "expected-best" or self.evidence != "none"):
            raise ConfigError(
                "plan_hint shows the warm start's own plan for each question: set sft_targets: "
                "expected-best and evidence: none (or plan_hint: false)"
            )
        if self.evidence not in EVIDENCE:
            raise ConfigError(f"evidence must be one of {', '.join(EVIDENCE)}, not {self.evidence!r}")
        if self.evidence_select not in EVIDENCE_SELECT:
            raise ConfigError(
                f"evidence_select must be one of {', '.join(EVIDENCE_SELECT)}, not {self.evidence_select!r}"
            )
        if self.evidence == "rank" and self.max_rounds > 1:
            raise ConfigError(
                "evidence: rank plans one round (its targets are single workers): set max_rounds: 1"
            )
        if self.evidence != "none" and self.sft_targets != "expected-best":
            raise ConfigError(
                f"evidence: {self.evidence} is fitted on the warm start's candidate table: "
                "set sft_targets: expected-best (or evidence: none)"
            )
        if self.warm_group_by not in GROUP_BY:
            options = ", ".join(GROUP_BY)
            raise ConfigError(f"warm_group_by must be one of {options}, not {self.warm_group_by!r}")
        if self.warm_deadline_items_per_domain < 1:
            raise ConfigError("warm_deadline_items_per_domain must be >= 1")
        if self.deadline_fraction > 0 and not self.warm_deadlines_s:
            raise ConfigError("deadline_fraction > 0 needs at least one warm_deadlines_s entry")
        for d in self.warm_deadlines_s:
            validation.positive_finite("warm_deadlines_s entry", d)

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown training config keys: {sorted(unknown)}")
        return cls(**d)

    @staticmethod
    def help() -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in fields(TrainConfig)}


def preset_dir() -> Path:
    return Path(str(resources.files("rl_conductor").joinpath("configs", "train")))


def available_presets() -> list[str]:
    return sorted(p.stem for p in preset_dir().glob("*.yaml"))


def load_preset(name_or_path: str, **overrides: Any) -> TrainConfig:
    """Load a preset by name (:func:`available_presets`) or a YAML path, then apply overrides.

    A preset's ``dataset`` belongs to its ``pool``: when ``pool`` is overridden (another pool than
    the preset's) and ``dataset`` is not, the dataset is the new pool's default, never the
    preset's (``--preset routellm --pool mine.yaml`` trains on ``mine.yaml``'s recordings)."""
    p = Path(name_or_path)
    if not (p.suffix in (".yaml", ".yml") and p.exists()):
        p = preset_dir() / f"{name_or_path}.yaml"
        if not p.exists():
            raise UnknownName(
                f"no training preset {name_or_path!r}; presets: {available_presets()}, a YAML path, "
                "or for train: auto (the recordings presets, chosen on validation) or a comma-separated list"
            )
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"training preset {str(p)!r} is not valid YAML: {yaml_problem(exc)}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"training preset {str(p)!r} must be a mapping of config keys")
    pool = overrides.get("pool")
    if pool is not None and pool != data.get("pool") and overrides.get("dataset") is None:
        data.pop("dataset", None)  # the preset's dataset is its pool's: the new pool's default instead
    data.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig.from_dict(data)
