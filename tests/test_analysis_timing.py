"""The step_time callback rmsnorm_speed reads: one time/step_ms per step, at that step."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from normlab.callbacks.timing import StepTime


class Recorder:
    """A tracker that keeps what it was sent."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict]] = []

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.rows.append((step, metrics))


def test_step_time_logs_each_step_at_its_index():
    recorder = Recorder()
    trainer = SimpleNamespace(global_step=0, loggers=[recorder])
    timer = StepTime(every_n_steps=1)
    for step in range(3):
        timer.on_train_batch_start(trainer, None, None, step)
        time.sleep(0.01)
        trainer.global_step = step + 1  # the optimizer step is taken inside the batch
        timer.on_train_batch_end(trainer, None, None, None, step)
    assert [s for s, _ in recorder.rows] == [0, 1, 2]
    assert all(m["time/step_ms"] >= 10 for _, m in recorder.rows)


def test_step_time_every_n_and_bad_values():
    recorder = Recorder()
    trainer = SimpleNamespace(global_step=0, loggers=[recorder])
    timer = StepTime(every_n_steps=2)
    for step in range(4):
        timer.on_train_batch_start(trainer, None, None, step)
        trainer.global_step = step + 1
        timer.on_train_batch_end(trainer, None, None, None, step)
    assert [s for s, _ in recorder.rows] == [0, 2]
    with pytest.raises(ValueError, match="every_n_steps"):
        StepTime(every_n_steps=0)
