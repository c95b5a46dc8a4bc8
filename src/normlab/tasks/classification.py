"""Image classification: cross-entropy, accuracy with torchmetrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from normlab.tasks.base import Task


class ClassificationTask(Task):
    """Train/val/test loss and accuracy of a classifier network."""

    monitor = "val/acc"
    monitor_mode = "max"

    def __init__(self, net: nn.Module, optim: Mapping[str, Any], num_classes: int = 10):
        super().__init__(net, optim)
        self.accuracy = nn.ModuleDict(
            {
                split: MulticlassAccuracy(num_classes, average="micro")
                for split in ("fit", "val", "test")
            }
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def example_input(self, batch_size: int) -> tuple[torch.Tensor]:
        return (torch.randn(batch_size, *self.net.input_shape),)

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], split: str) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = self.accuracy[split]
        acc(logits.detach(), y)
        name = "train" if split == "fit" else split
        on_step = split == "fit"
        self.log(f"{name}/loss", loss, on_step=on_step, on_epoch=True, prog_bar=on_step)
        self.log(f"{name}/acc", acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "fit")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")
