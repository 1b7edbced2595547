"""``train --resume`` continues only a folder of the same recipe (rl_conductor/training/resume.py):
another recipe is refused naming the fields, run control may change, a pool file counts by its
resolved path, and ``train --preset a,b --resume`` checks every candidate before training."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from rl_conductor.errors import ConfigError
from rl_conductor.pipeline import choose
from rl_conductor.training import train as train_module
from rl_conductor.training.config import TrainConfig
from rl_conductor.training.resume import RECIPE_FILE, check_resume, recipe_matches, write_recipe


def test_a_folder_of_another_recipe_is_refused_naming_what_differs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = TrainConfig(pool="paper-sim", cost_weight=0.1)
    write_recipe(cfg, out, "paper-sim")
    check_resume(cfg, out, "paper-sim")  # the same recipe resumes
    assert recipe_matches(cfg, out, "paper-sim")
    # run control may change between a run and its resume
    check_resume(
        TrainConfig(pool="paper-sim", cost_weight=0.1, grpo_steps=900, time_limit_s=5.0), out, "paper-sim"
    )
    with pytest.raises(ConfigError, match=r"another recipe \(cost_weight: 0\.1 then, 0\.3 now\)"):
        check_resume(TrainConfig(pool="paper-sim", cost_weight=0.3), out, "paper-sim")
    with pytest.raises(ConfigError, match=r"dataset: 'paper-sim' then, 'other' now"):
        check_resume(cfg, out, "other")
    many = TrainConfig(pool="gsm8k-six", cost_weight=0.3, seed=4, max_rounds=2, tiny_layers=2, sft_examples=9)
    with pytest.raises(ConfigError, match=r"and 2 more\); drop --resume"):
        check_resume(many, out, "paper-sim")
    assert not recipe_matches(many, out, "paper-sim")


def test_a_pool_file_is_one_pool_however_it_is_spelled(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "pool.yaml").write_text("name: p\n")
    monkeypatch.chdir(tmp_path)
    write_recipe(TrainConfig(pool="pool.yaml"), tmp_path / "run", "d")
    check_resume(TrainConfig(pool=str(tmp_path / "." / "pool.yaml")), tmp_path / "run", "d")
    assert json.loads((tmp_path / "run" / RECIPE_FILE).read_text())["pool"] == str(tmp_path / "pool.yaml")


def test_an_old_folder_resumes_with_a_warning_and_a_broken_record_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "old"
    (out / "sft").mkdir(parents=True)
    (out / "sft" / "config.json").write_text("{}")
    with caplog.at_level(logging.WARNING):
        check_resume(TrainConfig(), out, "paper-sim")
    assert "resuming unchecked" in caplog.text
    (out / RECIPE_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        check_resume(TrainConfig(), out, "paper-sim")
    (out / RECIPE_FILE).write_text("[1]")
    with pytest.raises(ConfigError, match="is not a recipe"):
        check_resume(TrainConfig(), out, "paper-sim")
    assert not recipe_matches(TrainConfig(), out, "paper-sim")


def test_every_candidate_is_checked_before_the_first_trains(tmp_path: Path, monkeypatch: Any) -> None:
    from test_preset_choice import _pool  # a recordings file with validation items

    pool = str(_pool(tmp_path))
    cfgs = {
        "a": TrainConfig(pool=pool, cost_weight=0.1),
        "b": TrainConfig(pool=pool, cost_weight=0.1, seed=1),
    }
    dataset = choose.check_candidates(cfgs)[1]
    # the second candidate's folder holds a model of another recipe
    write_recipe(
        TrainConfig(pool=pool, cost_weight=0.1, seed=2), tmp_path / "out" / "candidates" / "b", dataset
    )

    def no_training(*a: Any, **k: Any) -> Any:
        raise AssertionError("trained before every candidate was checked")

    monkeypatch.setattr(train_module, "train", no_training)
    with pytest.raises(
        ConfigError, match=r"candidates[/\\]b was trained with another recipe \(seed: 2 then, 1 now\)"
    ):
        choose.train_and_choose(cfgs, tmp_path / "out", resume=True, progress=False)


def test_a_fresh_run_rebuilds_a_base_model_another_recipe_built(tmp_path: Path) -> None:
    from rl_conductor.training.resume import prepare_out

    out, cfg = tmp_path / "run", TrainConfig(tiny_layers=4)

    def base() -> Path:
        (out / "base").mkdir(parents=True, exist_ok=True)
        (out / "base" / "config.json").write_text("{}")
        return out / "base"

    prepare_out(cfg, out, "d", resume=False)
    base()
    prepare_out(cfg, out, "d", resume=False)  # the same recipe: the base is reused
    assert (out / "base").exists()
    prepare_out(TrainConfig(tiny_layers=2), out, "d", resume=False)  # another: rebuilt
    assert not (out / "base").exists()
    assert json.loads((out / RECIPE_FILE).read_text())["tiny_layers"] == 2
    base()
    with pytest.raises(ConfigError, match="tiny_layers: 2 then, 4 now"):
        prepare_out(cfg, out, "d", resume=True)
    assert (out / "base").exists()  # a refused resume touches nothing
    prepare_out(cfg, out, "d", resume=False, writer=False)  # a rank that does not write
    assert json.loads((out / RECIPE_FILE).read_text())["tiny_layers"] == 2


def test_a_fresh_run_starts_over_so_a_later_resume_cannot_continue_another_run(tmp_path: Path) -> None:
    """H23: a fresh run of recipe c into a's folder kept a's checkpoints, and ``--resume`` with c
    then continued a's highest checkpoint under c's name. A fresh run clears what it writes anew."""
    from rl_conductor.training.resume import prepare_out

    out = tmp_path / "run"
    a, c = TrainConfig(cost_weight=0.1), TrainConfig(cost_weight=0.3)
    prepare_out(a, out, "d", resume=False)
    for name in ("base", "sft", "grpo/checkpoint-2", "final"):
        (out / name).mkdir(parents=True)
        (out / name / "config.json").write_text("{}")
    prepare_out(c, out, "d", resume=False)
    assert not any((out / n).exists() for n in ("base", "sft", "grpo", "final"))
    (out / "base").mkdir()
    (out / "grpo" / "checkpoint-9").mkdir(parents=True)
    prepare_out(c, out, "d", resume=False)  # the same recipe afresh: only its base is kept
    assert (out / "base").exists() and not (out / "grpo").exists()
    prepare_out(c, out, "d", resume=True)  # a resume touches nothing
    assert (out / "base").exists()
    # a base that is a link is unlinked, never followed
    shared = tmp_path / "shared-base"
    shared.mkdir()
    (shared / "keep").write_text("x")
    (out / "base").rmdir()
    (out / "base").symlink_to(shared)
    prepare_out(a, out, "d", resume=False)
    assert not (out / "base").exists() and (shared / "keep").read_text() == "x"
    # a model inside what a fresh run clears is refused before anything is removed
    (out / "sft").mkdir()
    (out / "sft" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="which a fresh run clears"):
        prepare_out(TrainConfig(model=str(out / "sft")), out, "d", resume=False)
    assert (out / "sft" / "config.json").exists()
    # a recipe.json that is a folder: one line, not a traceback
    (out / RECIPE_FILE).unlink()
    (out / RECIPE_FILE).mkdir()
    with pytest.raises(ConfigError, match="cannot read"):
        prepare_out(a, out, "d", resume=True)
    with pytest.raises(ConfigError, match="is not a file"):
        prepare_out(a, out, "d", resume=False)


def test_paths_count_where_they_resolve_and_files_by_their_contents(tmp_path: Path, monkeypatch: Any) -> None:
    """H23: a relative ``recordings:`` dataset from another directory named another file, and a
    pool file edited in place kept its path; both resumed unchecked."""
    import yaml

    from rl_conductor.workers.pool import load_pool

    for d in ("w", "w2"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "rec.jsonl").write_text(f"{d}\n")
    monkeypatch.chdir(tmp_path / "w")
    cfg = TrainConfig()
    write_recipe(cfg, tmp_path / "out", "recordings:rec.jsonl")
    check_resume(cfg, tmp_path / "out", f"recordings:{tmp_path / 'w' / '.' / 'rec.jsonl'}")  # the same file
    monkeypatch.chdir(tmp_path / "w2")
    with pytest.raises(ConfigError, match="dataset"):  # the same words, another file
        check_resume(cfg, tmp_path / "out", "recordings:rec.jsonl")
    monkeypatch.chdir(tmp_path / "w")
    (tmp_path / "w" / "rec.jsonl").write_text("edited\n")
    with pytest.raises(ConfigError, match="the dataset file's contents changed"):
        check_resume(cfg, tmp_path / "out", "recordings:rec.jsonl")
    # a pool edited in place: its workers' prices changed
    pool_file = tmp_path / "pool.yaml"
    spec = {"name": "p", "workers": [{"name": "a", "kind": "fake", "price_in": 1.0, "price_out": 1.0}]}
    pool_file.write_text(yaml.safe_dump(spec))
    on_pool = TrainConfig(pool=str(pool_file))
    write_recipe(on_pool, tmp_path / "out2", "paper-sim", load_pool(str(pool_file)))
    check_resume(on_pool, tmp_path / "out2", "paper-sim", load_pool(str(pool_file)))
    spec["workers"][0]["price_in"] = 50.0
    pool_file.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match="the pool's workers or recordings changed"):
        check_resume(on_pool, tmp_path / "out2", "paper-sim", load_pool(str(pool_file)))


def test_a_fresh_run_removes_nothing_before_its_model_is_known_nor_a_users_folders(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """H24: a typo in --model cost the previous model; --model OUT/base was deleted by the run
    about to use it; a fresh run into a project folder deleted its kustomize ``base/``."""
    from rl_conductor.training.resume import prepare_out

    out = tmp_path / "run"
    prepare_out(TrainConfig(), out, "d", resume=False)
    for name in ("sft", "final", "base"):
        (out / name).mkdir()
        (out / name / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="unknown model spec"):
        prepare_out(TrainConfig(model="./no such model"), out, "d", resume=False)
    with pytest.raises(ConfigError, match="which a fresh run clears"):
        prepare_out(TrainConfig(model=str(out / "base")), out, "d", resume=False)
    assert all((out / n / "config.json").exists() for n in ("sft", "final", "base"))
    # a folder that holds no training: its folders are the user's
    project = tmp_path / "project"
    for name in ("base", "sft", "grpo", "final"):
        (project / name).mkdir(parents=True)
        (project / name / "notes.txt").write_text("mine")
    prepare_out(TrainConfig(), project, "d", resume=False)
    assert all((project / n / "notes.txt").read_text() == "mine" for n in ("base", "sft", "grpo", "final"))
    # the recipe records no working directory: a resume from elsewhere matches
    monkeypatch.chdir(tmp_path)
    check_resume(TrainConfig(), out, "d")
    assert json.loads((out / RECIPE_FILE).read_text())["observed_path"] in ("", None)
    # a recipe written by older code (fewer keys) is compared on what it has
    old = json.loads((out / RECIPE_FILE).read_text())
    del old["sft_examples_per_domain_neighbours"]
    (out / RECIPE_FILE).write_text(json.dumps(old))
    check_resume(TrainConfig(), out, "d")
