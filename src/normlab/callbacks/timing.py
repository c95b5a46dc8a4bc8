"""Wall time of each training step (forward, backward, optimizer step), for speed comparisons."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl


class StepTime(pl.Callback):
    """Log `time/step_ms` for every training step, from batch start to batch end."""

    def __init__(self, every_n_steps: int = 1) -> None:
        if every_n_steps <= 0:
            raise ValueError(f"callbacks.step_time.every_n_steps must be > 0, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._start: float | None = None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self._start is None:
            return
        elapsed_ms = 1000.0 * (time.perf_counter() - self._start)
        self._start = None
        step = trainer.global_step - 1  # the optimizer step just taken
        if step % self.every_n_steps == 0:
            # straight to the trackers: through self.log, values wait for Lightning's flush
            for logger in trainer.loggers:
                logger.log_metrics({"time/step_ms": elapsed_ms}, step=step)
