"""Shared LightningModule plumbing: optimizer and learning-rate schedule from config."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

SCHEDULES = ("constant", "cosine", "inverse_sqrt", "exponential")


def lr_lambda(
    schedule: str, warmup_steps: int, total_steps: Callable[[], int], min_ratio: float = 0.0
) -> Callable[[int], float]:
    """Multiplier of the base learning rate at step s: linear warmup, then the named decay.

    `total_steps` is asked for only once the cosine decay needs it (after the first step), so
    the trainer's estimate is not requested while a checkpoint is still being restored.
    `warmup_steps` >= 0 is checked with the rest of the config (normlab.config.validate).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"optim.schedule={schedule!r} is not one of {list(SCHEDULES)}")
    if schedule == "exponential" and not 0 < min_ratio < 1:
        raise ValueError(f"optim.schedule=exponential decays to optim.min_lr_ratio, which must "
                         f"lie in (0, 1), got {min_ratio}")  # fmt: skip

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        if schedule == "inverse_sqrt":
            return math.sqrt(max(warmup_steps, 1) / (step + 1))
        if step == warmup_steps:
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps() - warmup_steps))
        if schedule == "exponential":  # the BN paper's (Sec. 4.2.1): x min_ratio by the end
            return min_ratio**progress
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def warmup_schedule(
    optimizer: torch.optim.Optimizer,
    total_steps: Callable[[], int],
    schedule: str = "constant",
    warmup_steps: int = 0,
    min_lr_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The per-step schedule of conf/optim/*.yaml's `scheduler` (a partial, like `optimizer`):
    lr_lambda's linear warmup, then `schedule`, over the run's `total_steps`."""
    factor = lr_lambda(schedule, int(warmup_steps), total_steps, float(min_lr_ratio))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def last_step(trainer: pl.Trainer) -> bool:
    """Whether the training step being taken is the run's last: max_steps reached by it, or the
    last batch of the last epoch."""
    if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step + 1:
        return True
    epochs = trainer.max_epochs
    last_epoch = epochs is not None and 0 < epochs <= trainer.current_epoch + 1
    done = trainer.fit_loop.epoch_loop.batch_progress.current.ready  # this epoch's, this one in
    return last_epoch and done >= trainer.num_training_batches


class Task(pl.LightningModule):
    """Base task: owns the network, builds optimizer + schedule from the `optim` config
    (its `optimizer` and `scheduler`: partials instantiated from conf/optim/*.yaml).

    Subclasses set `monitor` / `monitor_mode` (the checkpoint metric) and implement
    `example_input(batch_size)`: the args of `forward` for a batch of that size, used by the
    pre-flight check that runs one forward pass before training starts.
    """

    monitor: str = "val/loss"
    monitor_mode: str = "min"

    def __init__(self, net: nn.Module, optim: Mapping[str, Any]):
        super().__init__()
        self.net = net
        self.optim_cfg = dict(optim)
        self.run_status = "ok"  # set to "diverged" by the divergence guard
        self.run_note = ""  # why the status is not ok (the guard's reason)

    def example_input(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def log_step(self, name: str, value: torch.Tensor) -> None:
        """self.log of a per-step training value, on the steps the loggers write (every
        trainer.log_every_n_steps) and on the run's last step (the final train loss of a run
        of any length): a value logged on other steps is never written, and each self.log
        call costs about as much as a small model's optimizer step."""
        trainer = self.trainer
        every = trainer.log_every_n_steps
        # the step being taken, counted from 1, as Lightning's logger connector counts it
        due = every > 0 and (trainer.global_step + 1) % every == 0
        if due or trainer.should_stop or trainer.fast_dev_run or last_step(trainer):
            self.log(name, value, on_step=True, on_epoch=False, prog_bar=True)

    def param_groups(self) -> list[dict[str, Any]]:
        """Weight decay on matrices only: norms' gains/biases and biases are not decayed."""
        wd = float(self.optim_cfg.get("weight_decay", 0.0) or 0.0)
        decay = [p for p in self.parameters() if p.requires_grad and p.ndim >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.ndim < 2]
        return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]

    def optimizer_and_scheduler(
        self, total_steps: Callable[[], int]
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        """The `optim` config's optimizer over param_groups() and its per-step lr schedule:
        `optimizer(param_groups)`, then `scheduler(optimizer, total_steps=total_steps)` (the
        run's length, asked for once the decay needs it). An `optim` without a `scheduler`
        keeps the lr constant (warmup_schedule's defaults)."""
        cfg = self.optim_cfg
        make: Callable[..., torch.optim.Optimizer] = cfg["optimizer"]
        optimizer = make(self.param_groups())
        schedule: Callable[..., torch.optim.lr_scheduler.LambdaLR]
        schedule = cfg.get("scheduler") or warmup_schedule
        return optimizer, schedule(optimizer, total_steps=total_steps)

    def configure_optimizers(self):
        optimizer, scheduler = self.optimizer_and_scheduler(
            lambda: int(self.trainer.estimated_stepping_batches)
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
