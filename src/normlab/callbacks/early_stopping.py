"""Early stopping on the task's own validation metric (conf/callbacks/early_stopping.yaml)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping


class TaskEarlyStopping(EarlyStopping):
    """Lightning's EarlyStopping whose `monitor: null` is the task's metric and `mode: null`
    its mode (the task's `monitor` and `monitor_mode`, normlab.tasks.base.Task), read when the
    trainer sets it up, as BestCheckpoint does."""

    def __init__(
        self, monitor: str | None = None, mode: str | None = None, min_delta: float = 0.0, **kw: Any
    ) -> None:
        super().__init__(monitor=monitor or "", mode=mode or "min", min_delta=min_delta, **kw)
        self._given_min_delta = min_delta
        self._given_mode = mode

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not self.monitor:
            self.monitor = getattr(pl_module, "monitor", None) or ""
            if not self.monitor:
                raise ValueError(
                    f"early_stopping: monitor=null needs a task with its own metric; "
                    f"{type(pl_module).__name__} has none, set callbacks.early_stopping.monitor"
                )
            self._use_mode(self._given_mode or getattr(pl_module, "monitor_mode", "min"))
        super().setup(trainer, pl_module, stage)

    def _use_mode(self, mode: str) -> None:
        """Set `mode` and what Lightning derives from it in __init__: the sign of min_delta and
        the starting best score."""
        self.mode = mode
        improves_upwards = self.monitor_op == torch.gt
        self.min_delta = abs(self._given_min_delta) * (1 if improves_upwards else -1)
        self.best_score = torch.tensor(-torch.inf if improves_upwards else torch.inf)
