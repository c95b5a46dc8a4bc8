"""Wall time of training steps, for speed comparisons: the run's own steps (StepTime), and the
run's model against the same model with another norm, paired step by step (PairedStepTime), with
the norms' own calls of a step replayed alone (NormOps)."""

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
from torch import nn

from normlab.norms import norm_class


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


@dataclass
class NormOps:
    """The norm calls of one forward pass of a model, replayed alone: each norm module (a copy)
    on a random input of the shape and dtype it saw, forward and backward, as in a step."""

    modules: list[nn.Module]  # a copy of each norm module called
    calls: list[tuple[int, tuple[int, ...]]]  # per call, in order: (module index, input shape)
    inputs: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]]  # shape -> (input, grad)

    @classmethod
    def record(cls, task: nn.Module, norm: type, batch: Any) -> NormOps:
        """The calls of the `norm` modules of `task` in one forward pass of its loss on `batch`
        (without gradients: the task's training state is not touched)."""
        seen: list[tuple[nn.Module, torch.Tensor]] = []
        hooks = [
            m.register_forward_hook(lambda mod, args, out: seen.append((mod, args[0])))
            for m in task.modules()
            if type(m) is norm
        ]
        try:
            with torch.no_grad():
                task.loss(batch)
        finally:
            for hook in hooks:
                hook.remove()
        index: dict[int, int] = {}
        modules, calls, inputs = [], [], {}
        gen = torch.Generator().manual_seed(0)
        for module, x in seen:
            if id(module) not in index:
                index[id(module)] = len(modules)
                modules.append(copy.deepcopy(module))
            shape = tuple(x.shape)
            calls.append((index[id(module)], shape))
            if shape not in inputs:
                pair = [torch.randn(shape, generator=gen).to(x.device, x.dtype) for _ in "xg"]
                inputs[shape] = (pair[0].requires_grad_(), pair[1])
        return cls(modules, calls, inputs)

    def time(self) -> float:
        """Seconds of every call's forward and backward, in the recorded order (gradients set
        to None first, as a training step does)."""
        for module in self.modules:
            module.zero_grad(set_to_none=True)
        for x, _ in self.inputs.values():
            x.grad = None
        device = next(iter(self.inputs.values()))[0].device
        _sync(device)
        start = time.perf_counter()
        for i, shape in self.calls:
            x, grad = self.inputs[shape]
            self.modules[i](x).backward(grad)
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
    baseline stepped first). With `identity_norm` (the identity: conf/norm/none.yaml), a third
    twin, `identity`, has its norm replaced by it and steps in the same random order on the same
    batch, logged as `time/identity_step_ms`: 1 - identity / baseline is the baseline norm's
    share of the step. With `ops`, the norm modules' calls of the model and baseline twins are
    recorded in one forward pass at the first pair (NormOps) and, after each pair, replayed
    alone `op_rounds` times in a random order (the least time of each side kept):
    `time/model_op_ms`, `time/baseline_op_ms`, the norms' own time in a step at the model's
    shapes. The twins draw random numbers from a forked RNG, so the run
    trains as it would without this callback. The task must have `loss(batch)`.
    """

    def __init__(
        self,
        model: DictConfig,
        baseline_norm: DictConfig,
        norm_key: str = "net.norm_layer",
        seed: int = 0,
        warmup: int = 10,
        identity_norm: DictConfig | None = None,
        ops: bool = False,
        op_rounds: int = 3,
    ) -> None:
        if warmup < 0:
            raise ValueError(f"callbacks.paired_step_time.warmup must be >= 0, got {warmup}")
        if OmegaConf.select(model, norm_key) is None:
            raise ValueError(f"callbacks.paired_step_time.norm_key={norm_key!r}: not in the model")
        self.model, self.baseline_norm, self.norm_key = model, baseline_norm, norm_key
        self.seed, self.warmup = seed, warmup
        self.norms = {"baseline": baseline_norm}  # side -> the norm replacing the run's
        if identity_norm is not None:
            self.norms["identity"] = identity_norm
        if op_rounds < 1:
            raise ValueError(f"callbacks.paired_step_time.op_rounds must be >= 1, got {op_rounds}")
        self.time_ops, self.op_rounds = ops, op_rounds
        self.twins: dict[str, Twin] = {}
        self.ops: dict[str, NormOps] = {}
        self.pairs = 0
        self._order = random.Random(seed)

    @property
    def sides(self) -> tuple[str, ...]:
        """The twins: 'model', 'baseline' and, with an identity norm, 'identity'."""
        return ("model", *self.norms)

    def config(self, side: str) -> DictConfig:
        """The model config of one twin: 'model' (the run's), or 'baseline' or 'identity' (its
        norm replaced by that side's)."""
        cfg = copy.deepcopy(self.model)
        if side != "model":
            OmegaConf.update(cfg, self.norm_key, copy.deepcopy(self.norms[side]), merge=False)
        return cfg

    def norm_class(self, side: str) -> type | None:
        """The class of the norm modules of one twin (None: not a class, e.g. a function)."""
        return norm_class(instantiate(OmegaConf.select(self.config(side), self.norm_key)))

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
            self.twins = {s: self.build(s, pl_module.device, total) for s in self.sides}
        self.pairs, self.ops = 0, {}

    def replay_ops(self) -> dict[str, float]:
        """Each side's norm calls replayed `op_rounds` times, the sides in a random order each
        round: the least seconds of each (a short block's time is its uninterrupted cost; a
        preemption by another process lands on one round, not on all)."""
        sides = [side for side in self.ops if self.ops[side].calls]
        best = dict.fromkeys(sides, float("inf"))
        for _ in range(self.op_rounds):
            for side in self._order.sample(sides, len(sides)):
                best[side] = min(best[side], self.ops[side].time())
        return best

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        order = self._order.sample(self.sides, len(self.sides))
        with torch.random.fork_rng():
            if self.time_ops and not self.ops:
                for side in ("model", "baseline"):
                    task = self.twins[side].task
                    self.ops[side] = NormOps.record(task, self.norm_class(side), batch)
            seconds = {side: self.twins[side].step(batch) for side in order}
            op_seconds = self.replay_ops()
        self.pairs += 1
        if self.pairs <= self.warmup:
            return
        metrics = {f"time/{side}_step_ms": 1000.0 * seconds[side] for side in self.sides}
        metrics["time/baseline_first"] = float(order.index("baseline") < order.index("model"))
        if len(op_seconds) == 2:
            metrics |= {f"time/{side}_op_ms": 1000.0 * op_seconds[side] for side in self.ops}
        for logger in trainer.loggers:  # at the run's step just taken, straight to the trackers
            logger.log_metrics(metrics, step=trainer.global_step - 1)
