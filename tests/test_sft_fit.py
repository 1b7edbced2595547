"""The warm start's fit to its own decisions (training/sft_fit.py).

What must hold: a model trained on its records reproduces their ``model_id`` lists (fit 1.0), the
same prompts with another decision are not fitted (0.0), and the fit is counted per record kind;
the pass rule trains more only below the target, stops at the cap and then warns with the
figures; target 0 measures without training more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from _lazy import lazy
from rl_conductor.errors import ConfigError
from rl_conductor.lm.models import build_tiny
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.training.config import TrainConfig
from rl_conductor.training.data import chat
from rl_conductor.training.sft_fit import decision_fit, fit_passes
from rl_conductor.validation import InvalidValue

datasets = lazy("datasets")
trl = lazy("trl")
sft_loss = lazy("rl_conductor.training.sft_loss")


REST = "subtasks = ['Solve.']\naccess_list = [[]]"


def _records(ids: list[int]) -> list[dict[str, Any]]:
    tasks = load_tasks("gsm8k")[: len(ids)]
    return [
        {
            "prompt": chat(f"Plan for: {t.question[:60]}"),
            "completion": [{"role": "assistant", "content": f"model_id = [{i}]\n{REST}"}],
        }
        for t, i in zip(tasks, ids, strict=True)
    ]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[dict[str, Any]]]:
    """A tiny model trained until it writes each record's own worker id (two ids, by question)."""
    records = _records([i % 2 for i in range(8)])
    model_dir = build_tiny(
        [r["prompt"][0]["content"] for r in records],
        tmp_path_factory.mktemp("fit") / "tiny",
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
    )
    args = trl.SFTConfig(
        output_dir=str(tmp_path_factory.mktemp("fit-work")),
        per_device_train_batch_size=8,
        num_train_epochs=60,
        learning_rate=0.01,
        completion_only_loss=True,
        use_cpu=True,
        bf16=False,
        report_to=[],
        disable_tqdm=True,
        save_strategy="no",
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = sft_loss.CompletionLossSFTTrainer(
        model=str(model_dir),
        args=args,
        train_dataset=datasets.Dataset.from_list(records),
        decision_weight=5.0,
    )
    trainer.train()
    return trainer, records


def test_a_model_reproduces_the_decisions_it_was_trained_on_and_not_others(fitted: Any) -> None:
    trainer, records = fitted
    model, tok = trainer.model, trainer.processing_class
    kinds = ["first", "review"] * 4
    got = decision_fit(model, tok, records, kinds)
    assert got == {"first": 1.0, "review": 1.0, "all": 1.0, "n": 8}
    swapped = _records([1 - i % 2 for i in range(8)])  # the same prompts, the other id
    assert decision_fit(model, tok, swapped, kinds)["all"] == 0.0
    # half right: the fit is a share, per kind
    mixed = records[:4] + swapped[4:]
    assert decision_fit(model, tok, mixed, ["first"] * 4 + ["review"] * 4) == {
        "first": 1.0,
        "review": 0.0,
        "all": 0.5,
        "n": 8,
    }
    # per domain of a kind: a domain never learnt shows though its kind's share is 0.5; a group
    # with fewer than min_group sampled records, or a kind's only group, gets no figure of its own
    assert decision_fit(model, tok, mixed, ["first"] * 8, groups=["a"] * 4 + ["b"] * 4, min_group=4) == {
        "first": 0.5,
        "first/a": 1.0,
        "first/b": 0.0,
        "all": 0.5,
        "n": 8,
    }
    assert "first/a" not in decision_fit(model, tok, mixed, ["first"] * 8, groups=["a"] * 4 + ["b"] * 4)
    one = decision_fit(
        model, tok, mixed, ["first"] * 4 + ["review"] * 4, groups=["a"] * 4 + [None] * 4, min_group=1
    )
    assert "first/a" not in one and one["review"] == 0.0
    # a group with too few sampled records but enough in all is topped up from its own records,
    # which count for its figure only: the kinds' shares stay those of the plain sample
    groups = ["a"] * 4 + ["b"] * 4  # the seed-0 sample of 4 holds two of each: below min_group 3
    small = decision_fit(model, tok, mixed, ["first"] * 8, groups=groups, sample=4, min_group=3)
    plain = decision_fit(model, tok, mixed, ["first"] * 8, sample=4)
    assert {k: small[k] for k in ("first", "all", "n")} == {k: plain[k] for k in ("first", "all", "n")}
    assert small["first/a"] == 1.0 and small["first/b"] == 0.0
    # a seeded sample of at most `sample` records, the same sample for the same seed
    assert decision_fit(model, tok, mixed, kinds, sample=3)["n"] == 3
    three = decision_fit(model, tok, mixed, kinds, sample=3)
    assert three == decision_fit(model, tok, mixed, kinds, sample=3)


def test_more_epochs_only_below_the_target_and_a_warning_at_the_cap() -> None:
    fits = iter([0.5, 0.7, 0.96, 0.99])
    trained: list[int] = []
    warned: list[str] = []

    def measure() -> dict[str, Any]:
        f = next(fits)
        return {"all": f, "first": f, "n": 10}

    out = fit_passes(measure, trained.append, target=0.95, epochs=3, max_passes=5, warn=warned.append)
    assert trained == [1, 2] and out["passes"] == 2 and out["after"]["all"] == 0.96 and not warned
    assert out["before"]["all"] == 0.5

    fits = iter([0.5, 0.6, 0.7])
    trained.clear()
    out = fit_passes(measure, trained.append, target=0.95, epochs=3, max_passes=2, warn=warned.append)
    assert trained == [1, 2] and out["after"]["all"] == 0.7
    assert len(warned) == 1 and "70.0 %" in warned[0] and "2 extra pass(es) of 3 epochs" in warned[0]

    fits = iter([0.1])  # target 0: measured and reported, never trained more nor warned
    trained.clear()
    warned.clear()
    out = fit_passes(measure, trained.append, target=0.0, epochs=3, max_passes=5, warn=warned.append)
    assert trained == [] and out["passes"] == 0 and out["after"]["all"] == 0.1 and not warned


@pytest.mark.parametrize(
    "bad",
    [{"sft_fit_target": 1.5}, {"sft_fit_target": -0.1}, {"sft_fit_epochs": 0}, {"sft_fit_max_passes": -1}],
)
def test_fit_settings_are_checked(bad: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises((ConfigError, InvalidValue), match=next(iter(bad))):
        TrainConfig(**bad)


def test_the_fit_line_names_each_kind_and_the_extra_passes() -> None:
    from rl_conductor.training.sft_fit import fit_line

    fit = {"all": 0.9612, "first": 0.95, "review": 0.97, "n": 600}
    assert fit_line({"after": fit, "passes": 2}) == (
        "warm start reproduces 96.1 % of its training decisions (first 95.0 %, review 97.0 %) "
        "after 2 extra pass(es)"
    )
    assert "extra" not in fit_line({"after": fit, "passes": 0})


def test_a_kind_below_the_target_trains_more_though_all_records_are_above_it() -> None:
    fits = iter([{"all": 0.95, "first": 0.89, "review": 1.0}, {"all": 0.99, "first": 0.98, "review": 1.0}])
    trained: list[int] = []
    out = fit_passes(lambda: next(fits), trained.append, target=0.95, epochs=3, max_passes=3, warn=print)
    assert trained == [1] and out["after"]["first"] == 0.98


def test_a_pass_that_fits_worse_is_undone_and_the_best_weights_kept() -> None:
    """Each pass restarts the learning rate; where one ends below the best fit so far, the weights
    saved at the best are restored and the best figures reported."""
    fits = iter([{"all": 0.5}, {"all": 0.8}, {"all": 0.6}])
    calls: list[str] = []

    def measure() -> dict[str, Any]:
        calls.append("measure")
        return next(fits)

    out = fit_passes(
        measure,
        lambda n: calls.append(f"train {n}"),
        target=0.95,
        epochs=3,
        max_passes=2,
        warn=lambda m: calls.append("warn"),
        save=lambda: calls.append("save"),
        restore=lambda: calls.append("restore"),
    )
    # saved before each pass that trains past the best weights so far, restored to pass 1's
    assert calls == ["measure", "save", "train 1", "measure", "save", "train 2", "measure", "restore", "warn"]
    assert out["kept"] == 1 and out["passes"] == 2 and out["after"] == {"all": 0.8}


def test_train_prints_each_candidates_fit_from_its_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``train --preset a,b`` / ``auto``: one fit line per candidate that measured one (its
    ``metrics.json``), none for a candidate without it."""
    import json

    from rl_conductor.cli.train import _fit_lines

    fit = {
        "target": 0.95,
        "passes": 1,
        "kept": 1,
        "before": {"all": 0.5},
        "after": {"all": 0.9, "first": 0.9},
    }
    (tmp_path / "candidates" / "a").mkdir(parents=True)
    (tmp_path / "candidates" / "a" / "metrics.json").write_text(json.dumps({"sft_fit": fit}))
    (tmp_path / "candidates" / "b").mkdir()
    _fit_lines(tmp_path, {"a": "recordings-text", "b": "recordings"})
    out = capsys.readouterr().out
    assert (
        "preset recordings-text: warm start reproduces 90.0 % of its training decisions (first 90.0 %)" in out
    )
    assert "after 1 extra pass(es)" in out and "preset recordings:" not in out


def test_training_output_is_the_progress_line_not_raw_metric_dicts(fitted: Any) -> None:
    """``disable_tqdm`` made transformers print every logging step's raw dict (``{'loss': ...}``)
    to stdout: most of a training's output. The project's trainers drop that printer (the
    progress line shows the loss, MLflow records every metric)."""
    from transformers.trainer_callback import PrinterCallback

    from rl_conductor.training.callbacks import quiet

    trainer, _ = fitted
    assert any(isinstance(c, PrinterCallback) for c in trainer.callback_handler.callbacks)  # the default
    # without a progress line (the pipeline's step, a launch's ranks) the dicts are the log's metrics
    assert quiet(trainer, progress=False) is trainer
    assert any(isinstance(c, PrinterCallback) for c in trainer.callback_handler.callbacks)
    assert quiet(trainer) is trainer
    assert not any(isinstance(c, PrinterCallback) for c in trainer.callback_handler.callbacks)
