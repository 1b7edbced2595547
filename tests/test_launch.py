"""Training on every GPU of a node goes through `accelerate launch`; tested with CPU ranks (gloo)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rl_conductor.training import launch


def test_launch_command_uses_one_process_per_gpu(tmp_path: Path) -> None:
    cmd = launch.launch_command(tmp_path / "c.yaml", tmp_path / "out", 4)
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert cmd[cmd.index("--num_processes") + 1] == "4" and "--multi_gpu" in cmd
    assert cmd[-6:] == [
        "-m",
        "rl_conductor.training.launch",
        "--config",
        str(tmp_path / "c.yaml"),
        "--out",
        str(tmp_path / "out"),
    ]
    one = launch.launch_command(tmp_path / "c.yaml", tmp_path / "out", 1)
    assert "--multi_gpu" not in one
    with pytest.raises(ValueError):
        launch.launch_command(tmp_path / "c.yaml", tmp_path / "out", 0)


def test_one_gpu_or_none_trains_in_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import rl_conductor.training.train as train_module

    calls = []
    monkeypatch.setattr(launch, "visible_gpus", lambda: 1)
    monkeypatch.setattr(train_module, "train", lambda cfg, out: calls.append((cfg, out)) or "in-process")
    monkeypatch.setattr(launch.subprocess, "run", lambda *a, **k: pytest.fail("launched a subprocess"))
    assert launch.train_on_all_gpus("cfg", tmp_path) == "in-process"  # type: ignore[arg-type]
    assert calls == [("cfg", tmp_path)]


@pytest.mark.slow
def test_two_ranks_train_the_same_entry_and_rank0_reports(tmp_path: Path) -> None:
    from _tiny import micro_config

    cfg = micro_config(f"sqlite:///{tmp_path / 'mlflow.db'}", sft_examples=64, grpo_steps=2, train_limit=24)
    result = launch.train_on_all_gpus(cfg, tmp_path / "out", processes=2, cpu=True)
    markers = sorted(p.name for p in (tmp_path / "out" / "ranks").glob("rank-*-of-*"))
    assert markers == ["rank-0-of-2", "rank-1-of-2"]  # two processes ran the same entry
    # and they joined one group (over gloo without CUDA): before, each took itself for a lone
    # main process, both wrote the same folders and the barrier waited for nobody
    said = [(tmp_path / "out" / "ranks" / m).read_text().split() for m in markers]
    assert [s[1:] for s in said] == [["0", "of", "2", "MULTI_CPU"], ["1", "of", "2", "MULTI_CPU"]]
    assert result.global_step == 2
    assert (result.final_dir / "conductor.json").exists()
    assert launch.load_preset(str(tmp_path / "out" / "train_config.yaml")) == cfg
