"""Image classification: cross-entropy, accuracy with torchmetrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from normlab.tasks.base import Task


class ClassificationTask(Task):
    """Train/val/test loss and accuracy of a classifier network."""

    monitor = "val/acc"
    monitor_mode = "max"

    def __init__(self, net: nn.Module, optim: Mapping[str, Any], num_classes: int = 10):
        super().__init__(net, optim)
        splits = ("fit", "val", "test")
        self.accuracy = nn.ModuleDict(
            {s: MulticlassAccuracy(num_classes, average="micro") for s in splits}
        )
        self.mean_loss = nn.ModuleDict({s: MeanMetric() for s in splits})
        for metric in [*self.accuracy.values(), *self.mean_loss.values()]:
            metric.persistent(True)  # epoch aggregates survive a mid-epoch checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def example_input(self, batch_size: int) -> tuple[torch.Tensor]:
        return (torch.randn(batch_size, *self.net.input_shape),)

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], split: str) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc, mean_loss = self.accuracy[split], self.mean_loss[split]
        acc(logits.detach(), y)
        mean_loss(loss.detach())
        name = "train" if split == "fit" else split
        if split == "fit":
            self.log("train/loss_step", loss, on_step=True, on_epoch=False, prog_bar=True)
            self.log("train/loss_epoch", mean_loss, on_step=False, on_epoch=True)
        else:
            self.log(f"{name}/loss", mean_loss, on_step=False, on_epoch=True)
        self.log(f"{name}/acc", acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "fit")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")
