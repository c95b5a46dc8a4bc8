"""Image classification: cross-entropy, and the epoch's mean loss and accuracy (a torchmetrics
Metric, so that they are synced over processes and survive a mid-epoch checkpoint)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric

from normlab.tasks.base import Task


class EpochTotals(Metric):
    """An epoch's mean batch loss and its accuracy over samples, from four summed counts.

    What torchmetrics' MeanMetric (of each batch's loss) and micro MulticlassAccuracy give, in
    one update of four in-place adds: theirs validate, format and count every class statistic,
    about 70 us a step on this CPU against 30 us (about half a point of LeNet's paired step
    ratio in normlab.bench)."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("loss_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        for name in ("batches", "correct", "seen"):
            self.add_state(name, torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor) -> None:
        self.loss_sum += loss
        self.batches += 1
        self.correct += (logits.argmax(-1) == target).sum()
        self.seen += target.numel()

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean batch loss, accuracy), float32; NaN where no batch or sample was seen."""
        loss = self.loss_sum / self.batches
        return loss.float(), (self.correct / self.seen).float()


class ClassificationTask(Task):
    """Train/val/test loss and accuracy of a classifier network."""

    monitor = "val/acc"
    monitor_mode = "max"

    def __init__(self, net: nn.Module, optim: Mapping[str, Any]):
        super().__init__(net, optim)
        # no per-update input checks: labels come from the data module, logits from the net,
        # and a NaN loss is the divergence guard's to catch (its epoch mean is then NaN too)
        self.totals = nn.ModuleDict({s: EpochTotals() for s in ("fit", "val", "test")})
        for metric in self.totals.values():
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
        self.totals[split].update(loss.detach(), logits.detach(), y)
        if split == "fit":
            self.log_step("train/loss_step", loss)
        return loss

    def _log_epoch(self, split: str) -> None:
        """Log the epoch's mean loss and accuracy of `split` (synced over processes) and reset."""
        totals = self.totals[split]
        if not totals.batches:  # no batches this epoch (the state, unlike update_called,
            return  # survives a checkpoint taken at the epoch's end, after validation)
        name = "train" if split == "fit" else split
        # compute() has gathered the states of all processes already, so every rank holds the
        # same value; sync_dist=True averages equal values and tells Lightning it is synced
        key = "train/loss_epoch" if split == "fit" else f"{name}/loss"
        with warnings.catch_warnings():  # states loaded from a checkpoint, no update() since
            warnings.filterwarnings("ignore", "The ``compute`` method", UserWarning)
            loss, accuracy = totals.compute()
        self.log(key, loss, sync_dist=True)
        self.log(f"{name}/acc", accuracy, prog_bar=True, sync_dist=True)
        totals.reset()

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
