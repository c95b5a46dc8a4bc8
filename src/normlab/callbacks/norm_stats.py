"""Statistics of norm layers during training (the BN paper's Figure 1 comes from these logs).

Every `every_n_steps` training steps, for each selected norm layer (default: every layer that
normalizes, once; see `default_layers`), logs
  norm/<layer>/in_mean, in_std    mean and std of the norm's input
  norm/<layer>/out_mean, out_std  the same for its output (the pre-activation)
  preact/<layer>/p15, p50, p85    percentiles of the pre-activation of one unit (channel `unit`)
  norm/<layer>/alpha              for a DyT layer (also the one under a DiT's adaLN): its alpha,
                                  the value the forward pass used
and with `all_units=True` also, for every unit k (index along dim 1: a channel or feature),
  preact/<layer>/u<k:03d>/p15, p50, p85   its percentiles over all other dims of the batch
(one torch.quantile call per layer; 3 metrics per unit, so 300 columns for a 100-unit layer).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from normlab.norms.dyt import DyT

QUANTILES = torch.tensor([0.15, 0.50, 0.85])


# torch's own norm layers (a model may hold one that is not a normlab norm)
TORCH_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)


def is_norm(module: nn.Module) -> bool:
    """A layer that normalizes: a normlab norm (its `normalizes` trait: not `none`) or a torch
    norm layer; never a placeholder like nn.Identity."""
    flag = getattr(module, "normalizes", None)
    return bool(flag) if flag is not None else isinstance(module, TORCH_NORMS)


def default_layers(model: nn.Module) -> list[str]:
    """Every normalization layer once: the outermost module that normalizes (a norm wrapping
    another, not also the one inside it), in the trained network only (a task's `net`, not its
    EMA)."""
    net = getattr(model, "net", None)
    root, prefix = (net, "net.") if isinstance(net, nn.Module) else (model, "")
    found: list[str] = []
    for name, module in root.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer in found)
        if name and not inside and is_norm(module):
            found.append(name)
    return [prefix + name for name in found]


def dyt_of(module: nn.Module) -> DyT | None:
    """The DyT a norm layer is, else None."""
    return module if isinstance(module, DyT) else None


def unit_percentiles(y: torch.Tensor) -> torch.Tensor:
    """(units, 3): the 15/50/85th percentiles of each unit (dim 1) of y over all its other dims."""
    per_unit = y.transpose(0, 1).reshape(y.shape[1], -1)  # (C, N * ...)
    return torch.quantile(per_unit, QUANTILES.to(y.device), dim=1).T  # (3, C) -> (C, 3)


class NormStats(pl.Callback):
    """Log input/output moments of norm layers and pre-activation percentiles of one/all units."""

    def __init__(
        self,
        every_n_steps: int = 50,
        layers: list[str] | None = None,
        unit: int = 0,
        all_units: bool = False,
    ):
        self.every_n_steps = every_n_steps
        self.layers = layers
        self.unit = unit
        self.all_units = all_units
        self._handles: list[Any] = []
        self._stats: dict[str, torch.Tensor] = {}
        self._unit_stats: dict[str, torch.Tensor] = {}  # layer -> (units, 3) percentiles
        self._alphas: dict[str, float] = {}  # layer -> alpha of its DyT

    def _record(self, name: str):
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            out = out[0] if isinstance(out, tuple) else out  # adaLN-Zero returns (h, gate)
            x, y = args[0].detach().float(), out.detach().float()
            unit = y.select(1, self.unit) if y.ndim > 1 else y  # channel/feature `unit`
            q = torch.quantile(unit.flatten(), QUANTILES.to(unit.device))
            self._stats[name] = torch.stack([x.mean(), x.std(), y.mean(), y.std(), *q])
            dyt = dyt_of(module)
            if dyt is not None:
                self._alphas[name] = float(dyt.alpha.detach())
            if self.all_units and y.ndim > 1:
                self._unit_stats[name] = unit_percentiles(y)

        return hook

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        names = self.layers or default_layers(pl_module)
        missing = sorted(set(names) - {n for n, _ in pl_module.named_modules()})
        if missing:
            raise ValueError(f"callbacks.norm_stats.layers: no such modules {missing}")
        self._modules = {n: pl_module.get_submodule(n) for n in names}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._handles = [
                m.register_forward_hook(self._record(n)) for n, m in self._modules.items()
            ]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        keys = ("in_mean", "in_std", "out_mean", "out_std", "p15", "p50", "p85")
        metrics = {}
        for name, values in self._stats.items():
            for key, value in zip(keys, values.tolist(), strict=True):
                group = "preact" if key.startswith("p") else "norm"
                metrics[f"{group}/{name}/{key}"] = value
        for name, units in self._unit_stats.items():
            for k, values in enumerate(units.tolist()):
                for key, value in zip(("p15", "p50", "p85"), values, strict=True):
                    metrics[f"preact/{name}/u{k:03d}/{key}"] = value
        for name, alpha in self._alphas.items():
            metrics[f"norm/{name}/alpha"] = alpha
        # straight to the trackers, at the step they were measured: through self.log they
        # would wait for Lightning's next flush (every log_every_n_steps)
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step - 1)
        self._stats = {}
        self._unit_stats = {}
        self._alphas = {}
