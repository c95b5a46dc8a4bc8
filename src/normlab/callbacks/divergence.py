"""Stop a run whose loss became NaN/inf or far above its start, and mark it `diverged`."""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

log = logging.getLogger(__name__)


class DivergenceGuard(pl.Callback):
    """Marks the task `diverged` with why in its `run_note` (logged as metric `diverged`=1),
    stops ModelCheckpoint from saving a "best" checkpoint from then on, and stops training.

    Each step's test runs on the loss's device, as tensors (no host sync): the first finite
    loss, whether a loss was non-finite or above `factor` x that first one (after
    `warmup_steps`), and the first such loss and its step. The host reads the verdict every
    `every_n_steps` steps and at the end of each epoch (1: every step; on a GPU a larger N
    lets the CPU run ahead), so a run stops at most N - 1 steps after it diverged, naming the
    step where it did.
    """

    def __init__(
        self, factor: float = 10.0, warmup_steps: int = 0, key: str = "loss", every_n_steps: int = 1
    ):
        if (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(f"every_n_steps must be an integer >= 1, got {every_n_steps!r}")
        self.factor = factor
        self.warmup_steps = warmup_steps
        self.key = key
        self.every_n_steps = every_n_steps
        self.first: torch.Tensor | None = None  # the first finite loss (NaN until there is one)
        self._bad: torch.Tensor | None = None  # (diverged, its loss, its step): float64, device
        self._resumed_first: float | None = None  # a checkpoint's first loss, until a step

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs[self.key] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        self._record(torch.as_tensor(loss).detach().to(torch.float64), trainer.global_step)
        if trainer.global_step % self.every_n_steps == 0:
            self._stop_if_diverged(trainer, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_if_diverged(trainer, pl_module)

    def _record(self, value: torch.Tensor, step: int) -> None:
        """Update the first finite loss and the first divergence with this step's loss (tensor
        ops on its device: nothing is read on the host)."""
        if self.first is None:  # created on the loss's device
            resumed = self._resumed_first
            self.first = torch.full_like(value, math.nan if resumed is None else resumed)
            self._bad = value.new_zeros(3)
        self.first = torch.where(torch.isfinite(self.first), self.first, value)
        bad = ~torch.isfinite(value)
        if step > self.warmup_steps:
            bad = bad | (value > self.factor * self.first.clamp_min(1e-8))
        new = bad & (self._bad[0] == 0)  # the first divergence is the one reported
        now = torch.stack([torch.ones_like(value), value, torch.full_like(value, step)])
        self._bad = torch.where(new, now, self._bad)

    def _stop_if_diverged(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Read the verdict (the one host sync) and stop the run if it diverged."""
        if self._bad is None or getattr(pl_module, "run_status", None) == "diverged":
            return
        flag, value, step = self._bad.tolist()
        if not flag:
            return
        reason = (
            "non-finite"
            if not math.isfinite(value)
            else f"> {self.factor} x first {float(self.first):.4g}"
        )
        why = f"loss {value:.4g} at step {int(step)} is {reason}"
        log.warning("%s: run diverged; no best checkpoint is saved from here on", why)
        pl_module.run_status, pl_module.run_note = "diverged", why
        pl_module.log("diverged", 1.0, on_step=True, on_epoch=False)
        for callback in trainer.checkpoint_callbacks:  # the validation that follows the stop
            if isinstance(callback, ModelCheckpoint):  # would rank the diverged weights
                callback.save_top_k = 0
        trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        first = self._resumed_first if self.first is None else float(self.first)
        return {"first": None if first is None or math.isnan(first) else first}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resumed_first = state_dict["first"]
        self.first = self._bad = None
