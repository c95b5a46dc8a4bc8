"""One line per epoch (`progress=epoch`, the default): the epoch's train and val metrics.

  epoch 2/2  step 80/80  train/acc 0.7901  train/loss 0.6216  val/acc 0.7955  val/loss 0.6015  6 s

Logged through the `normlab.callbacks.progress` logger, so a Hydra run prints it once and keeps
it in the run's log file. `progress=bar` shows Lightning's progress bar instead, `none` neither.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import lightning.pytorch as pl
import torch

log = logging.getLogger(__name__)
GROUPS = ("train", "val")  # metric prefixes an epoch line shows


def epoch_line(
    epoch: int,
    max_epochs: int | None,
    step: int,
    seconds: float,
    metrics: Mapping[str, torch.Tensor],
    max_steps: int | None = None,
) -> str:
    """`epoch E/N  step S/M  <train/* and val/* scalars, by name>  T s` (E counted from 1, N
    and M the run's budget in epochs and steps when known, T the seconds since training
    started)."""
    values: dict[str, float] = {}
    for key, value in metrics.items():
        if key.split("/")[0] not in GROUPS or key.endswith("_step") or value.numel() != 1:
            continue
        if key.endswith("_epoch"):  # logged on step and epoch: the epoch's mean wins
            values[key.removesuffix("_epoch")] = float(value)
        else:
            values.setdefault(key, float(value))
    total = f"/{max_epochs}" if max_epochs is not None and max_epochs > 0 else ""
    steps = f"/{max_steps}" if max_steps is not None and max_steps > 0 else ""
    parts = [f"epoch {epoch + 1}{total}", f"step {step}{steps}"]
    parts += [f"{name} {value:.4f}" for name, value in sorted(values.items())]
    parts.append(f"{seconds:.0f} s")
    return "  ".join(parts)


class EpochProgress(pl.Callback):
    """Log one line per training epoch, with its validation, on rank 0.

    The line is written when the epoch's metrics are complete: at the next epoch's start or at
    the end of training. At a callback's `on_train_epoch_end` they are not yet (the task's own
    `on_train_epoch_end` and Lightning's epoch means run after it).
    """

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._ended: tuple[int, int, float] | None = None  # (epoch, step, seconds) to report

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.monotonic()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        seconds = time.monotonic() - self._start
        self._ended = (trainer.current_epoch, trainer.global_step, seconds)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report(trainer)

    def _report(self, trainer: pl.Trainer) -> None:
        if self._ended is None:
            return
        epoch, step, seconds = self._ended
        self._ended = None
        if trainer.is_global_zero:
            epochs, steps = budget(trainer)
            log.info(epoch_line(epoch, epochs, step, seconds, trainer.callback_metrics, steps))


def budget(trainer: pl.Trainer) -> tuple[int | None, int | None]:
    """The run's length in epochs and in steps, as the trainer will run it: max_steps ends it
    before max_epochs when it comes first (None where unknown or unbounded)."""
    try:
        steps = int(trainer.estimated_stepping_batches)
    except (ValueError, OverflowError, RuntimeError):  # an infinite run or loader
        return trainer.max_epochs, None
    per_epoch = trainer.num_training_batches
    epochs = trainer.max_epochs
    if per_epoch and per_epoch != float("inf"):
        needed = -(-steps // int(per_epoch))  # ceil: the epoch max_steps ends in
        epochs = needed if epochs is None or epochs < 0 else min(epochs, needed)
    return epochs, steps
