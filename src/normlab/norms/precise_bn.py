"""Precise BN: population statistics recomputed with the trained weights (Wu & Johnson 2021,
"Rethinking 'Batch' in BatchNorm", Sec. 3; fvcore's `update_bn_stats`).

A BN layer's running statistics are an exponential moving average over the last ~1/momentum
training steps, each taken with weights that have changed since. `recompute_bn_stats` replaces
them with what the paper calls precise statistics: the model, weights fixed, runs forward in
training mode over `num_batches` training batches, and each BN-like layer's running_mean and
running_var become the plain (equal-weight) average of its per-batch means and of its per-batch
Bessel-corrected variances, over the values a layer normalizes per channel (N and spatial dims,
or all but the last for channel_dim=-1), as fvcore averages them.

- BN-like layers: normlab's BatchNorm and BatchRenorm and torch's _BatchNorm subclasses
  (BatchNorm1d/2d/3d, SyncBatchNorm), those with running statistics.
- Every batch runs with the layers' state as trained: their buffers (running statistics, the
  batch counters, BatchRenorm's schedule step) are restored before each batch. BN normalizes
  with the batch's statistics in training mode, so the features each layer sees are those of
  training; BatchRenorm's r and d see the trained running statistics and its schedule does not
  advance. The counters keep their trained values afterwards.
- Ghost BN (BatchNorm's ghost_batch): the statistics are of whole batches, not of ghost slices:
  they estimate the population, and a ghost slice's variance misses the spread of the slice
  means (the paper's point about small batches); the layer still normalizes by slices in the
  forward passes, as in training.
- Parameters are not changed, nor the train/eval mode of any module (restored afterwards), and
  no gradient is computed. With torch.distributed initialized, each process runs its own
  `num_batches` and the average is over the batches of all processes (equal weight per batch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from normlab.norms.base import NormConfigError, check_positive_int
from normlab.norms.batchnorm import BatchNorm
from normlab.norms.batchrenorm import BatchRenorm

log = logging.getLogger(__name__)

BN_LIKE = (BatchNorm, BatchRenorm, nn.modules.batchnorm._BatchNorm)


class Recomputed(NamedTuple):
    """What `recompute_bn_stats` did: the batches it ran and the layers it updated."""

    batches: int
    layers: list[str]


def bn_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The BN-like modules of `model` with running statistics, by name."""
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, BN_LIKE) and getattr(m, "running_mean", None) is not None
    }


def _channel_axis(module: nn.Module, x: torch.Tensor) -> int:
    """The input dim holding the channels: the last for a normlab norm with channel_dim=-1."""
    return x.dim() - 1 if getattr(module, "channel_dim", 1) == -1 else 1


def _first_input(batch: Any) -> Any:
    return batch[0] if isinstance(batch, (tuple, list)) else batch


class _Sums:
    """Per-channel sums of per-batch means and Bessel-corrected variances of one layer's inputs."""

    def __init__(self, num_features: int, device: torch.device) -> None:
        self.mean = torch.zeros(num_features, dtype=torch.float64, device=device)
        self.var = torch.zeros(num_features, dtype=torch.float64, device=device)
        self.count = 0

    def hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0].detach().to(torch.float64)
        axis = _channel_axis(module, x)
        dims = tuple(d for d in range(x.dim()) if d != axis)
        var, mean = torch.var_mean(x, dims, correction=1)
        self.mean += mean
        self.var += var
        self.count += 1


@torch.no_grad()
def recompute_bn_stats(
    model: nn.Module,
    batches: Iterable[Any],
    num_batches: int = 200,
    forward: Callable[[Any], object] | None = None,
) -> Recomputed:
    """Set the running statistics of every BN-like layer of `model` to the average over the first
    `num_batches` of `batches` of its per-batch statistics, computed with the current weights in
    training mode (see the module docstring). `forward(batch)` runs the model on one batch
    (default: model(batch[0]) for a tuple/list batch, else model(batch)); batches must be on the
    model's device. Layers no batch reached are left as they were. Fewer batches than asked for
    are used (with a warning) when `batches` runs out first."""
    check_positive_int("precise_bn", "num_batches", num_batches)
    layers = bn_layers(model)
    if not layers:
        return Recomputed(0, [])
    if forward is None:

        def forward(batch: Any) -> object:
            return model(_first_input(batch))

    sums = {n: _Sums(m.num_features, m.running_mean.device) for n, m in layers.items()}
    trained = {
        n: {k: b.clone() for k, b in m.named_buffers(recurse=False)} for n, m in layers.items()
    }
    modes = {m: m.training for m in model.modules()}
    handles = [m.register_forward_pre_hook(sums[n].hook) for n, m in layers.items()]
    done = 0
    try:
        model.train()
        for batch in batches:
            if done == num_batches:
                break
            _restore(layers, trained)
            forward(batch)
            done += 1
    finally:
        for handle in handles:
            handle.remove()
        _restore(layers, trained)
        for module, training in modes.items():
            module.training = training
    if done == 0:
        raise NormConfigError("precise BN: no batches to recompute BN statistics from")
    if done < num_batches:
        log.warning("precise BN: asked for %d batches, the data had %d", num_batches, done)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        _all_reduce(sums)
    updated = []
    for name, module in layers.items():
        s = sums[name]
        if s.count == 0:
            continue
        module.running_mean.copy_(s.mean / s.count)
        module.running_var.copy_(s.var / s.count)
        updated.append(name)
    return Recomputed(done, updated)


def _restore(layers: dict[str, nn.Module], trained: dict[str, dict[str, torch.Tensor]]) -> None:
    for name, module in layers.items():
        for key, buffer in module.named_buffers(recurse=False):
            buffer.copy_(trained[name][key])


def _all_reduce(sums: dict[str, _Sums]) -> None:
    """Sum every layer's sums and batch counts over all processes (one all-reduce)."""
    flat = torch.cat(
        [torch.cat([s.mean, s.var, s.mean.new_tensor([s.count])]) for s in sums.values()]
    )
    dist.all_reduce(flat)
    offset = 0
    for s in sums.values():
        c = s.mean.numel()
        s.mean.copy_(flat[offset : offset + c])
        s.var.copy_(flat[offset + c : offset + 2 * c])
        s.count = int(flat[offset + 2 * c].item())
        offset += 2 * c + 1
