"""Train on every GPU of a node: the same ``train`` entry, one process per GPU via ``accelerate launch``.

The pipeline's training step asks Kubernetes for N GPUs; when the node gives it more than one,
:func:`train_on_all_gpus` writes the resolved :class:`TrainConfig` to a YAML file and starts
``accelerate launch --multi_gpu --num_processes N -m rl_conductor.training.launch`` over it, so
TRL's trainers run data-parallel (DDP) with one rank per GPU. Rank 0 writes the
:class:`TrainResult` as JSON next to the model, and the parent reads it back, so callers see the
same result as from an in-process :func:`rl_conductor.training.train.train`.

With one GPU (or none) nothing is launched: training runs in-process as before. ``cpu=True`` with
several processes (ranks joined over gloo) exercises the same path without GPUs, which is how
the tests run it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from rl_conductor.training.config import TrainConfig, load_preset

RESULT_FILE = "train_result.json"


def visible_gpus() -> int:
    """GPUs this process may use (0 without CUDA)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launch_command(config_path: Path, out_dir: Path, processes: int, *, cpu: bool = False) -> list[str]:
    """The ``accelerate launch`` command line that trains ``config_path`` on ``processes`` ranks."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1"]
    cmd += ["--num_processes", str(processes)]
    if processes > 1:
        # torchrun under the hood; without CUDA the ranks join over gloo (how the tests run it)
        cmd.append("--multi_gpu")
    if cpu:
        cmd += ["--num_cpu_threads_per_process", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["-m", "rl_conductor.training.launch", "--config", str(config_path), "--out", str(out_dir)]
    return cmd


def train_on_all_gpus(
    cfg: TrainConfig, out_dir: str | Path, *, processes: int | None = None, cpu: bool = False
):  # -> TrainResult (imported lazily: torch/TRL)
    """Train with one process per GPU when there are several, else in-process."""
    from rl_conductor.training.train import TrainResult, train

    out = Path(out_dir)
    n = visible_gpus() if processes is None else processes
    if n <= 1 and not cpu:
        return train(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "train_config.yaml"
    config_path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=True), encoding="utf-8")
    (out / RESULT_FILE).unlink(missing_ok=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["ACCELERATE_USE_CPU"] = "true"
    done = subprocess.run(launch_command(config_path, out, n, cpu=cpu), env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"distributed training failed (accelerate launch exit {done.returncode})")
    return TrainResult.from_dict(json.loads((out / RESULT_FILE).read_text(encoding="utf-8")))


def main(argv: list[str] | None = None) -> None:
    """Entry point of each rank under ``accelerate launch``."""
    parser = argparse.ArgumentParser(prog="python -m rl_conductor.training.launch")
    parser.add_argument("--config", required=True, help="TrainConfig YAML written by train_on_all_gpus")
    parser.add_argument("--out", required=True, help="training output folder")
    args = parser.parse_args(argv)
    from rl_conductor.training import train as training

    cfg = load_preset(args.config)
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    ranks = Path(args.out) / "ranks"
    if rank != "0":
        # Only rank 0 tracks the run; the others log to a store of their own (train() writes the
        # shared folder from rank 0 only and waits for it: see train.main_process_writes).
        own = ranks / f"rank-{rank}"
        own.mkdir(parents=True, exist_ok=True)
        cfg.mlflow_tracking_uri = f"sqlite:///{(own / 'mlflow.db').resolve()}"
    result = training.train(cfg, args.out, progress=False)
    ranks.mkdir(parents=True, exist_ok=True)
    # how this rank saw the group at its first shared write (a rank that did not join: 0 of 1)
    seen = training.FIRST_WRITE_GROUP or "not asked"
    (ranks / f"rank-{rank}-of-{world}").write_text(f"done {seen}\n", encoding="utf-8")
    if rank == "0":
        path = Path(args.out) / RESULT_FILE
        path.write_text(json.dumps(result.to_dict()), encoding="utf-8")


if __name__ == "__main__":
    main()
