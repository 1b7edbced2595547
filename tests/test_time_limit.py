"""Runs that reproduce: the tiny preset is sized by step counts, and the time limit is a safety
net that says when it fired (instead of silently deciding how many steps a run gets)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from _lazy import lazy
from rl_conductor.training.config import load_preset

# imported by the first test that uses it (tests/_lazy.py): it imports transformers
callbacks = lazy("rl_conductor.training.callbacks")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_time_limit_stops_logs_and_records_the_step(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = _Clock()
    monkeypatch.setattr(callbacks.time, "perf_counter", clock)
    cb = callbacks.TimeLimit(60.0)
    state = SimpleNamespace(global_step=0, max_steps=100)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    cb.on_train_begin(None, state, control)
    for step in range(1, 4):  # 3 steps of 10 s: within the limit
        clock.now += 10
        state.global_step = step
        cb.on_step_end(None, state, control)
    assert not control.should_training_stop and cb.fired_at_step is None
    clock.now += 45  # step 4 ends 75 s after the start
    state.global_step = 4
    with caplog.at_level(logging.WARNING, logger=callbacks.__name__):
        cb.on_step_end(None, state, control)
    assert control.should_training_stop and control.should_save and cb.fired_at_step == 4
    assert "time limit fired" in caplog.text and "step 4 of 100" in caplog.text
    cb.on_train_begin(None, state, control)  # a new run starts clean
    assert cb.fired_at_step is None


def test_tiny_preset_is_sized_by_steps_not_by_the_clock() -> None:
    cfg = load_preset("tiny")
    sft_steps = cfg.sft_examples * cfg.sft_epochs / cfg.sft_batch_size
    assert sft_steps == int(sft_steps) and 50 <= sft_steps <= 400
    assert 1 <= cfg.grpo_steps <= 400
    # the limit is a safety net far above what the step counts need (~3.3 s per GRPO step)
    assert cfg.time_limit_s is not None and cfg.time_limit_s >= 2 * 3.3 * cfg.grpo_steps
