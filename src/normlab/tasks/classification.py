"""Image classification: cross-entropy, accuracy with torchmetrics."""

from __future__ import annotations

import warnings
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
        # no per-update input checks: labels come from the data module, logits from the net,
        # and a NaN loss is the divergence guard's to catch (its epoch mean is then NaN too)
        self.accuracy = nn.ModuleDict(
            {
                s: MulticlassAccuracy(num_classes, average="micro", validate_args=False)
                for s in splits
            }
        )
        self.mean_loss = nn.ModuleDict({s: MeanMetric(nan_strategy="disable") for s in splits})
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
        # update only: the epoch values are computed once per epoch, in _log_epoch (a metric's
        # forward also computes a per-batch value, and self.log of a Metric object moves its
        # whole state on every call: together most of the per-step overhead of a small model)
        self.accuracy[split].update(logits.detach(), y)
        self.mean_loss[split].update(loss.detach())
        if split == "fit":
            self.log_step("train/loss_step", loss)
        return loss

    def _log_epoch(self, split: str) -> None:
        """Log the epoch's mean loss and accuracy of `split` (synced over processes) and reset."""
        acc, mean_loss = self.accuracy[split], self.mean_loss[split]
        if not mean_loss.weight:  # no batches this epoch (the state, unlike update_called,
            return  # survives a checkpoint taken at the epoch's end, after validation)
        name = "train" if split == "fit" else split
        # compute() has gathered the states of all processes already, so every rank holds the
        # same value; sync_dist=True averages equal values and tells Lightning it is synced
        key = "train/loss_epoch" if split == "fit" else f"{name}/loss"
        with warnings.catch_warnings():  # states loaded from a checkpoint, no update() since
            warnings.filterwarnings("ignore", "The ``compute`` method", UserWarning)
            loss, accuracy = mean_loss.compute(), acc.compute()
        self.log(key, loss, sync_dist=True)
        self.log(f"{name}/acc", accuracy, prog_bar=True, sync_dist=True)
        acc.reset()
        mean_loss.reset()

    def training_step(self, batch, batch_idx):
        return self._step(batch, "fit")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def on_train_epoch_end(self) -> None:
        self._log_epoch("fit")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")
