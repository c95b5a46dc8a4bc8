"""Next-character language modelling: cross-entropy, reported as loss and bits per character."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from normlab.tasks.base import Task


class LanguageModelTask(Task):
    """Train a causal LM `net` (ids (B, T) -> logits (B, T, V), or of the last T' positions) on
    (x, y) windows."""

    monitor = "val/loss"
    monitor_mode = "min"

    def example_input(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(batch_size, self.net.ctx, dtype=torch.long),)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.net(idx)  # (B, T, V)

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Mean next-character cross-entropy of a batch (nothing logged). A net that predicts
        only the last T' < T positions (an encoder-decoder reading the first part of the window)
        is scored on the last T' targets."""
        x, y = batch  # (B, T), (B, T)
        logits = self(x)  # (B, T', V), T' <= T
        return F.cross_entropy(logits.flatten(0, 1), y[:, -logits.shape[1] :].flatten())

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        loss = self.loss(batch)
        self.log_step("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss = self.loss(batch)
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log("val/bpc", loss / math.log(2), on_epoch=True, sync_dist=True)
