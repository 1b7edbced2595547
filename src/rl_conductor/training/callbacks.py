"""Trainer callbacks: rich progress, MLflow metrics, and a wall-clock limit that saves and stops."""

from __future__ import annotations

import logging
import time
from typing import Any

from transformers import TrainerCallback


class RichProgress(TrainerCallback):
    """A rich progress bar with the latest reward/loss in its description (plain lines when
    output is not a terminal, :mod:`rl_conductor.progress`)."""

    def __init__(self, label: str, *, enabled: bool = True) -> None:
        self.label = label
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._last: dict[str, float] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not self.enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from rl_conductor.progress import PlainProgress, guard_forks, is_terminal

        if is_terminal():
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
            )
            guard_forks(self._progress)
        else:  # redirected output: periodic plain lines instead of a bar nobody sees
            self._progress = PlainProgress()
        self._progress.start()
        self._task = self._progress.add_task(self.label, total=state.max_steps, completed=state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._progress is not None:
            desc = self.label + "".join(f" {k}={v:.3f}" for k, v in self._last.items())
            self._progress.update(self._task, completed=state.global_step, description=desc)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        logs = logs or {}
        for key, short in (
            ("reward", "reward"),
            ("loss", "loss"),
            ("conductor/correct", "acc"),
            ("conductor/cost", "cost"),
            ("entropy", "entropy"),
        ):
            if isinstance(logs.get(key), (int, float)):
                self._last[short] = float(logs[key])

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._progress is not None:
            from rl_conductor.progress import guard_forks

            guard_forks(self._progress, on=False)
            self._progress.stop()
            self._progress = None


class MlflowMetrics(TrainerCallback):
    """Log every numeric value of the trainer's logs to the active MLflow run."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        import mlflow

        if mlflow.active_run() is None or not logs:
            return
        from rl_conductor.tracking.mlflow_utils import log_metrics

        log_metrics(
            {f"{self.prefix}{k}": v for k, v in logs.items() if isinstance(v, (int, float))},
            step=state.global_step,
        )


class TimeLimit(TrainerCallback):
    """Stop training (with a checkpoint) once ``seconds`` of wall time have passed.

    A safety net, not a way to size a run: where it stops depends on the machine's load, so a
    run it cut short does not reproduce. When it fires it logs a warning and records the step
    in ``fired_at_step`` (training reports it as ``time_limit_fired_at_step``).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._t0 = 0.0
        self.fired_at_step: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._t0 = time.perf_counter()
        self.fired_at_step = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        elapsed = time.perf_counter() - self._t0
        if elapsed > self.seconds and self.fired_at_step is None:
            self.fired_at_step = int(state.global_step)
            logging.getLogger(__name__).warning(
                "time limit fired: training stopped after %.0f s at step %d of %d "
                "(time_limit_s=%g); the result depends on the machine's load, raise the limit or "
                "lower the step count to reproduce",
                elapsed,
                state.global_step,
                state.max_steps,
                self.seconds,
            )
            control.should_save = True
            control.should_training_stop = True


def quiet(trainer: Any, progress: bool = True) -> Any:
    """``trainer`` without transformers' ``PrinterCallback`` where a progress line shows
    (``progress``), which prints every logging step's raw metrics dict (``{'loss': '0.15', ...}``)
    to stdout when ``disable_tqdm`` is set: the progress line (:class:`RichProgress`) already
    shows the loss or reward, MLflow (:class:`MlflowMetrics`) records every metric, and a
    training's output was mostly these dicts (an outside tester's "noisy start"). Without a
    progress line (the pipeline's step, each rank of a launch) the dicts stay: its log's only
    sign of the metrics."""
    if progress:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    return trainer
