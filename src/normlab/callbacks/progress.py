"""What a run prints while it trains (`progress=epoch`, the default): early in the first epoch
an estimate of the whole run's time and how to make it shorter (RunEstimate), a line every
`progress_every` seconds (StepProgress), and one line per epoch with its train and val metrics
(EpochProgress):

  estimate: about 1.2 h: 275000 training steps (10 epochs of 27500) at 15.2 ms, validation
    about 40 s (...); shorter: trainer.max_epochs=1 (about 7 min) or ...
  step 2000/275000  epoch 1/10 (2000/27500)  train/loss 0.6104  66.0 steps/s (132 samples/s)
    ETA epoch 6 min, run 1.2 h
  epoch 2/2  step 80/80  train/acc 0.7901  train/loss 0.6216  val/acc 0.7955  val/loss 0.6015  6 s

Logged through the `normlab.callbacks.progress` logger, so a Hydra run prints them once and
keeps them in the run's log file (train.log). `progress=bar` shows Lightning's progress bar
and the estimate instead, `none` none of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


# ---------------------------------------------------------------- while training: step lines


def duration(seconds: float) -> str:
    """A time span as a person reads it: `40 s`, `12 min`, `3.4 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def step_line(
    step: int,
    total: int | None,
    epoch: tuple[int, int | None, int, int | None],
    losses: Mapping[str, float],
    rate: tuple[float, float | None],
    eta: tuple[float | None, float | None],
) -> str:
    """`step S/T  epoch E/N (B/M)  train/loss L  R steps/s (I samples/s)  ETA epoch X, run Y`:
    `epoch` is (epoch from 0, epochs, batch done in it, its batches), `rate` (steps/s,
    samples/s), `eta` (seconds left in the epoch, in the run); an unknown part is left out."""
    index, epochs, batch, batches = epoch
    parts = [f"step {step}" + (f"/{total}" if total else "")]
    parts.append(
        f"epoch {index + 1}" + (f"/{epochs}" if epochs and epochs > 0 else "")
        + f" ({batch}" + (f"/{batches})" if batches else ")")
    )  # fmt: skip
    parts += [f"{name} {value:.4f}" for name, value in sorted(losses.items())]
    speed = f"{rate[0]:.1f} steps/s"
    parts.append(speed + (f" ({rate[1]:.0f} samples/s)" if rate[1] else ""))
    left = [f"{what} {duration(s)}" for what, s in zip(("epoch", "run"), eta, strict=True)
            if s is not None]  # fmt: skip
    if left:
        parts.append("ETA " + ", ".join(left))
    return "  ".join(parts)


def batch_size(batch: Any) -> int | None:
    """The number of samples in a batch: a tensor's first dimension, or its first tensor's."""
    first = batch[0] if isinstance(batch, list | tuple) and batch else batch
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.ndim else None


def step_losses(trainer: pl.Trainer, outputs: Any) -> dict[str, float]:
    """The training losses of the step just taken: the task's `train/*loss*` step values it
    last logged (logged every log_every_n_steps), with `train/loss` this step's own loss."""
    found: dict[str, float] = {}
    for key, value in trainer.callback_metrics.items():
        if key.startswith("train/") and "loss" in key and not key.endswith("_epoch"):
            if value.numel() == 1:
                found[key.removesuffix("_step")] = float(value)
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        found["train/loss"] = float(loss.detach())
    return found


class StepProgress(pl.Callback):
    """A line every `every` seconds of training, on rank 0 (step_line): where the run is, its
    current losses, its speed since the last line, and the time left in the epoch (at that
    speed) and in the run (at the run's mean speed so far, validation included)."""

    def __init__(self, every: float = 30.0) -> None:
        if not every > 0:
            raise ValueError(f"progress_every must be a positive number of seconds, got {every}")
        self.every = every
        self._start = self._last = time.monotonic()
        self._first_step = self._last_step = 0
        self._samples = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = self._last = time.monotonic()
        self._first_step = self._last_step = trainer.global_step
        self._samples = 0

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        now = time.monotonic()
        size = batch_size(batch)
        self._samples += size or 0
        if now - self._last < self.every or not trainer.is_global_zero:
            return
        log.info(self.line(trainer, outputs, batch_idx, now, size is not None))
        self._last, self._last_step, self._samples = now, trainer.global_step, 0

    def line(
        self, trainer: pl.Trainer, outputs: Any, batch_idx: int, now: float, sized: bool
    ) -> str:
        """The step line after batch `batch_idx` of the epoch, at time `now`."""
        step, (epochs, total) = trainer.global_step, budget(trainer)
        seconds = max(now - self._last, 1e-9)
        steps_per_s = (step - self._last_step) / seconds
        batches = trainer.num_training_batches
        batches = int(batches) if batches and batches != float("inf") else None
        epoch_left = run_left = None
        if batches is not None and steps_per_s > 0:
            epoch_left = (batches - batch_idx - 1) / steps_per_s
        done = step - self._first_step
        if total and done > 0:
            run_left = (total - step) * (now - self._start) / done
        return step_line(
            step, total, (trainer.current_epoch, epochs, batch_idx + 1, batches),
            step_losses(trainer, outputs),
            (steps_per_s, self._samples / seconds if sized else None), (epoch_left, run_left),
        )  # fmt: skip


# ---------------------------------------------------------------- before the work: an estimate

SHORT_RUN_S = 300.0  # what the "shorter:" hint aims a run at (a first look, not a result)


def nice_floor(n: float) -> int:
    """The largest of 1, 2, 5, 10, 20, 50, ... not above n (at least 1)."""
    best = 1
    for scale in (10**k for k in range(12)):
        for mantissa in (1, 2, 5):
            if mantissa * scale <= n:
                best = mantissa * scale
    return best


@dataclass
class Estimate:
    """What is left of a run and how fast this machine runs it: the training steps left (and
    the epochs and steps an epoch, when known), the seconds of a step, measured over its first
    steps, and of the validations left (None: not timed)."""

    steps: int
    step_s: float
    epochs: int | None
    epoch_steps: int | None
    val_s: float | None
    threads: int | None = None  # torch's threads, when the config left them to torch

    @property
    def seconds(self) -> float:
        return self.steps * self.step_s + (self.val_s or 0.0)

    def epoch_seconds(self) -> float | None:
        if not self.epochs or not self.epoch_steps:
            return None
        return self.epoch_steps * self.step_s + (self.val_s or 0.0) / self.epochs

    def shorter(self) -> list[str]:
        """Overrides that make the run about SHORT_RUN_S or less, each with its time."""
        hints, epoch_s = [], self.epoch_seconds()
        if self.epochs and self.epochs > 1 and epoch_s is not None:
            hints.append(f"trainer.max_epochs=1 (about {duration(epoch_s)})")
        if self.epochs and self.epoch_steps:
            val_s = self.val_s or 0.0
            batches = nice_floor(max(SHORT_RUN_S - val_s, 0.0) / (self.epochs * self.step_s))
            if batches < self.epoch_steps:
                seconds = batches * self.epochs * self.step_s + val_s
                hints.append(f"trainer.limit_train_batches={batches} (about {duration(seconds)})")
        return hints

    def line(self, hint_over_s: float = 60.0) -> str:
        """`estimate: about T: S training steps at M ms ...`; past hint_over_s, how to shorten."""
        text = f"estimate: about {duration(self.seconds)}: {self.steps} training steps"
        if self.epochs and self.epoch_steps and self.epochs * self.epoch_steps == self.steps:
            text += f" ({self.epochs} epoch{'s' if self.epochs > 1 else ''} of {self.epoch_steps})"
        text += f" at {1000 * self.step_s:.1f} ms"
        if self.val_s is None:
            text += ", validation not timed"
        elif self.val_s > 0:
            text += f", validation about {duration(self.val_s)}"
        text += " (this machine, timed over the first steps)"
        hints = self.shorter() if self.seconds > hint_over_s else []
        text += "; shorter: " + " or ".join(hints) if hints else ""
        if self.threads and self.threads > 1 and self.seconds > hint_over_s:
            text += (
                f"; torch runs {self.threads} threads: on a machine shared with other jobs "
                "num_threads=1 is often several times faster (README, Set-up)"
            )
        return text


class RunEstimate(pl.Callback):
    """Once, early in the first epoch, on rank 0: how long the run will take (Estimate.line),
    from the time of its training steps after the first (at least `steps` of them over
    `min_s` seconds, or all those of `max_s` seconds, or the first epoch's when it is shorter)
    and of the sanity check's validation batches; past `hint_over_s`, how to make it shorter
    (and, with `own_threads`, the config's num_threads unset, that num_threads=1 may be faster)."""

    def __init__(
        self,
        steps: int = 20,
        min_s: float = 1.0,
        max_s: float = 10.0,
        hint_over_s: float = 60.0,
        own_threads: bool = False,
    ) -> None:
        self.steps, self.min_s, self.max_s, self.hint_over_s = steps, min_s, max_s, hint_over_s
        self.own_threads = own_threads
        self._val: list[float] = []  # seconds of each sanity-check validation batch
        self._clock: float | None = None  # when the batch (or training) being timed began
        self._from: float | None = None  # the end of the first training step
        self._first_s = 0.0  # the first step's seconds (loader start included)
        self._last = 0.0  # the end of the last timed step
        self._timed, self._done = 0, False
        self._start_step = self._start_epoch = 0

    def on_validation_batch_start(self, trainer: pl.Trainer, *args: Any, **kw: Any) -> None:
        self._clock = time.monotonic()

    def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any, **kw: Any) -> None:
        if trainer.sanity_checking and self._clock is not None:
            self._val.append(time.monotonic() - self._clock)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clock, self._timed, self._from = time.monotonic(), 0, None
        self._start_step, self._start_epoch = trainer.global_step, trainer.current_epoch

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        if self._done:
            return
        now = time.monotonic()
        if self._from is None:  # the first step (loader start, first calls): not timed
            self._from, self._first_s = now, now - (self._clock or now)
            return
        self._timed, self._last = self._timed + 1, now
        timed_s = now - self._from
        if (self._timed >= self.steps and timed_s >= self.min_s) or timed_s >= self.max_s:
            self.report(trainer, timed_s / self._timed)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._done and self._from is not None:  # an epoch shorter than the timing
            step_s = (self._last - self._from) / self._timed if self._timed else self._first_s
            self.report(trainer, step_s)

    def report(self, trainer: pl.Trainer, step_s: float) -> None:
        """Log the run's estimate at `step_s` seconds a training step (once)."""
        self._done = True
        estimate = self.estimate(trainer, step_s)
        if estimate is not None and trainer.is_global_zero:
            log.info(estimate.line(self.hint_over_s))

    def estimate(self, trainer: pl.Trainer, step_s: float) -> Estimate | None:
        """What is left of the run, from the trainer's budget (None when it has no end)."""
        epochs, total = budget(trainer)
        if total is None:
            return None
        per_epoch = trainer.num_training_batches
        per_epoch = int(per_epoch) if per_epoch and per_epoch != float("inf") else None
        epochs_left = epochs - self._start_epoch if epochs and epochs > 0 else None
        val_s = None
        if self._val and epochs_left is not None:
            batches = sum(int(n) for n in trainer.num_val_batches if n != float("inf"))
            val_s = min(self._val) * batches * validations(trainer, epochs_left, per_epoch)
        threads = torch.get_num_threads() if self.own_threads else None
        steps = max(total - self._start_step, 0)
        return Estimate(steps, step_s, epochs_left, per_epoch, val_s, threads)


def validations(trainer: pl.Trainer, epochs: int, per_epoch: int | None) -> int:
    """How many validations `epochs` epochs of the run hold (one an epoch, by default)."""
    every = trainer.check_val_every_n_epoch or 1
    each = 1
    check = trainer.val_check_batch
    if per_epoch and isinstance(check, int) and 0 < check < per_epoch:
        each = per_epoch // check
    return -(-epochs // every) * each
