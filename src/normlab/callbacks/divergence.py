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
    stops ModelCheckpoint from saving a "best" checkpoint from then on, and stops training."""

    def __init__(self, factor: float = 10.0, warmup_steps: int = 0, key: str = "loss"):
        self.factor = factor
        self.warmup_steps = warmup_steps
        self.key = key
        self.first: float | None = None

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
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        if self.first is None and math.isfinite(value):
            self.first = value
        too_high = (
            self.first is not None
            and trainer.global_step > self.warmup_steps
            and value > self.factor * max(self.first, 1e-8)
        )
        if math.isfinite(value) and not too_high:
            return
        reason = (
            "non-finite"
            if not math.isfinite(value)
            else f"> {self.factor} x first {self.first:.4g}"
        )
        why = f"loss {value:.4g} at step {trainer.global_step} is {reason}"
        log.warning("%s: run diverged; no best checkpoint is saved from here on", why)
        pl_module.run_status, pl_module.run_note = "diverged", why
        pl_module.log("diverged", 1.0, on_step=True, on_epoch=False)
        for callback in trainer.checkpoint_callbacks:  # the validation that follows the stop
            if isinstance(callback, ModelCheckpoint):  # would rank the diverged weights
                callback.save_top_k = 0
        trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return {"first": self.first}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.first = state_dict["first"]
