"""Wall time of training steps, for speed comparisons: the run's own steps (StepTime), and the
run's model against the same model with another norm, paired step by step (PairedStepTime)."""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf


class StepTime(pl.Callback):
    """Log `time/step_ms` for every training step, from batch start to batch end."""

    def __init__(self, every_n_steps: int = 1) -> None:
        if every_n_steps <= 0:
            raise ValueError(f"callbacks.step_time.every_n_steps must be > 0, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._start: float | None = None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self._start is None:
            return
        elapsed_ms = 1000.0 * (time.perf_counter() - self._start)
        self._start = None
        step = trainer.global_step - 1  # the optimizer step just taken
        if step % self.every_n_steps == 0:
            # straight to the trackers: through self.log, values wait for Lightning's flush
            for logger in trainer.loggers:
                logger.log_metrics({"time/step_ms": elapsed_ms}, step=step)


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work, so a timer around it measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Twin:
    """A model trained beside the run, by a plain loop: its task, optimizer and lr schedule."""

    task: pl.LightningModule
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    def step(self, batch: Any) -> float:
        """One whole training step on `batch` (forward and loss, backward, optimizer step, lr
        schedule step), as Lightning's automatic optimization does it; its seconds."""
        device = self.task.device
        _sync(device)
        start = time.perf_counter()
        loss = self.task.loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        _sync(device)
        return time.perf_counter() - start


class PairedStepTime(pl.Callback):
    """Step time of the run's model against the same model with a baseline norm, step by step.

    When training starts, two twins are built from the run's model config with the run's seed, as
    normlab.run.train builds its model: `model`, the config as it is (it starts as the run's own
    model, and without dropout stays equal to it), and `baseline`, the same config with the norm
    at `norm_key` replaced by `baseline_norm`. Each gets its own optimizer and lr schedule from the
    config (Task.optimizer_and_scheduler, over the run's length). After each training step of the
    run, both twins take one step on the run's batch, in a random order (each follows the other
    about equally often), timed alike by Twin.step; the run's own step, with Lightning's loop
    around it, is not part of either time. After `warmup` pairs, each pair is logged at the run's
    step: `time/model_step_ms`, `time/baseline_step_ms`, and `time/baseline_first` (1 when the
    baseline stepped first). The twins draw random numbers from a forked RNG, so the run trains
    as it would without this callback. The task must have `loss(batch)` (its training loss).
    """

    def __init__(
        self,
        model: DictConfig,
        baseline_norm: DictConfig,
        norm_key: str = "net.norm_layer",
        seed: int = 0,
        warmup: int = 10,
    ) -> None:
        if warmup < 0:
            raise ValueError(f"callbacks.paired_step_time.warmup must be >= 0, got {warmup}")
        if OmegaConf.select(model, norm_key) is None:
            raise ValueError(f"callbacks.paired_step_time.norm_key={norm_key!r}: not in the model")
        self.model, self.baseline_norm, self.norm_key = model, baseline_norm, norm_key
        self.seed, self.warmup = seed, warmup
        self.twins: dict[str, Twin] = {}
        self.pairs = 0
        self._order = random.Random(seed)

    def config(self, side: str) -> DictConfig:
        """The model config of one twin: 'model' (the run's) or 'baseline' (its norm replaced)."""
        cfg = copy.deepcopy(self.model)
        if side == "baseline":
            OmegaConf.update(cfg, self.norm_key, copy.deepcopy(self.baseline_norm), merge=False)
        return cfg

    def build(self, side: str, device: torch.device, total_steps: int) -> Twin:
        """A twin at its init: the run's seed, then its task, as normlab.run.train builds one."""
        torch.manual_seed(self.seed)
        task = instantiate(self.config(side)).to(device).train()
        if not callable(getattr(task, "loss", None)):
            raise TypeError(f"PairedStepTime needs a task with loss(batch); {type(task).__name__}")
        optimizer, scheduler = task.optimizer_and_scheduler(lambda: total_steps)
        return Twin(task, optimizer, scheduler)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        total = int(trainer.estimated_stepping_batches)
        with torch.random.fork_rng():
            self.twins = {s: self.build(s, pl_module.device, total) for s in ("model", "baseline")}
        self.pairs = 0

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        baseline_first = self._order.random() < 0.5
        order = ("baseline", "model") if baseline_first else ("model", "baseline")
        with torch.random.fork_rng():
            seconds = {side: self.twins[side].step(batch) for side in order}
        self.pairs += 1
        if self.pairs <= self.warmup:
            return
        metrics = {
            "time/model_step_ms": 1000.0 * seconds["model"],
            "time/baseline_step_ms": 1000.0 * seconds["baseline"],
            "time/baseline_first": float(baseline_first),
        }
        for logger in trainer.loggers:  # at the run's step just taken, straight to the trackers
            logger.log_metrics(metrics, step=trainer.global_step - 1)
