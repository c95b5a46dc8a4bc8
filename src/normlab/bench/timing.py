"""Timing and memory helpers of the bench: interleaved repeats, ratios to a baseline.

Every figure the bench reports is a ratio to a baseline measured in the same process: the
candidates and their baseline run in turn (baseline, a, b, baseline, a, b, ...) so that load from
other processes on a shared machine hits all of them alike, and a ratio is the median over rounds
of (candidate time / baseline time) in the same round.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work, so a timer around it measures it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def interleaved(
    fns: Mapping[str, Callable[[], Any]],
    rounds: int,
    warmup: int = 1,
    device: torch.device | str = "cpu",
    setup: Callable[[], Any] | None = None,
    min_sample_s: float = 0.0,
    min_total_s: float = 0.0,
) -> dict[str, list[float]]:
    """Seconds per call of each fn, one sample per fn per round, after `warmup` rounds.

    The fns are called in turn, in a new random order every round, so each fn follows each
    other fn equally often (a call after one that allocates much runs slower). A sample repeats
    its call `number` times, chosen in the warmup so that the slowest fn takes about
    `min_sample_s` per sample (calls of microseconds are otherwise all timer noise); `setup`
    (untimed) runs before every sample, e.g. to drop the gradients of the last one. At least
    `rounds` rounds, more if needed for the slowest fn to run `min_total_s` in all: many short
    samples side by side beat a few long ones, whose ratios drift with the state the process is
    in (where the heap hands out fresh pages) by several percent.
    """
    names = list(fns)
    order = random.Random(0)
    number = 1

    def sample(name: str) -> float:
        if setup is not None:
            setup()
        sync(device)
        start = time.perf_counter()
        for _ in range(number):
            fns[name]()
        sync(device)
        return (time.perf_counter() - start) / number

    last: dict[str, float] = {}
    for _ in range(warmup):
        for name in order.sample(names, len(names)):
            last[name] = sample(name)
            if min_sample_s > 0:
                number = max(number, math.ceil(min_sample_s / max(last[name], 1e-9)))
    if last and min_total_s > 0:  # the last warmup round: calls at full speed
        rounds = max(rounds, math.ceil(min_total_s / max(max(last.values()) * number, 1e-9)))
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in order.sample(names, len(names)):
            times[name].append(sample(name))
    return times


def ratio(times: Mapping[str, list[float]], name: str, baseline: str) -> float:
    """Median over rounds of times[name][i] / times[baseline][i]."""
    pairs = zip(times[name], times[baseline], strict=True)
    return statistics.median(t / b for t, b in pairs)


def median_ms(values: list[float]) -> float:
    return 1e3 * statistics.median(values)


def activation_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes a forward pass keeps alive for backward: its output plus the saved tensors.

    Counted per storage (shared storages once), leaving out the input and the module's
    parameters, which exist whether or not the layer runs. This is the layer's own memory cost in
    training (what stays allocated between forward and backward), not the allocator's peak.
    """
    given = {p.untyped_storage().data_ptr() for p in module.parameters()}
    given.add(x.untyped_storage().data_ptr())
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in given:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = module(x)
    out = y.untyped_storage()
    seen[out.data_ptr()] = out.nbytes()
    return sum(seen.values())


class StepTimer(pl.Callback):
    """Times of the training steps of a run: each from the end of the last step to its own end
    (normlab.run.build(cfg, callbacks=[timer]) adds it to a run)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []  # epoch start, then the end of every training step
        self.losses: list[float] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.stamps:
            self.stamps.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.stamps.append(time.perf_counter())
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss))

    @property
    def steps(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]


class PairedSteps(pl.Callback):
    """Step times of a run and of a hand-written twin, interleaved step by step.

    When training starts, `make_twin()` (with the global RNG state restored after) returns the
    twin's step, a callable. After each training step of the run, one step of the twin runs
    and is timed apart; the run's step is the time from the end of the twin's last step to the
    end of its own, so everything the run does between steps is counted on its side. Load from
    other processes that lasts longer than a step hits both sides of a pair alike.
    """

    def __init__(self, make_twin: Callable[[], Callable[[], Any]]) -> None:
        self.make_twin = make_twin
        self.normlab: list[float] = []
        self.hand: list[float] = []
        self.mark: float | None = None
        self.twin: Callable[[], Any] | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        with torch.random.fork_rng():
            self.twin = self.make_twin()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.mark is None:
            self.mark = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        end = time.perf_counter()
        self.normlab.append(end - self.mark)
        self.twin()
        self.mark = time.perf_counter()
        self.hand.append(self.mark - end)
