"""Precise BN statistics before every validation and before test (Wu & Johnson 2021, Sec. 3).

Before each validation run of fit (not the sanity check, which sees the initial weights) and
before test, the BN-like layers' running statistics are recomputed with the current weights
over `num_batches` training batches (`normlab.norms.precise_bn.recompute_bn_stats`): the plain
average of per-batch means and variances instead of the moving average of training. The paper
(and fvcore) use 200 batches: its Fig. 4 shows the estimate has converged by then at batch 32+.

The batches come from a fresh loader of the data module's training split (the order of the
current epoch, from its start), not the loader training is iterating, whose position a resume
restores. The forward runs inside `torch.random.fork_rng`: dropout and the like in the forward
passes leave the training's random stream as it was. A task whose forward does not take the
first element of a batch defines `precise_bn_forward(batch)`. The recomputed statistics stay in
the model: the checkpoint saved after validation holds them, and training continues from them.

Logs `precise_bn/batches` (the batches averaged) with the validation/test metrics and a line
"precise BN: recomputed ...".
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch

from normlab.errors import ConfigError
from normlab.norms.base import check_positive_int
from normlab.norms.precise_bn import bn_layers, recompute_bn_stats

log = logging.getLogger(__name__)


class PreciseBN(pl.Callback):
    """Recompute BN population statistics before each validation and before test.

    `enabled`: False makes the callback do nothing (how conf/callbacks/default.yaml keeps it
    off: callbacks.precise_bn.enabled=true switches it on); `num_batches`: training batches to
    average over (the paper's 200).
    """

    def __init__(self, enabled: bool = True, num_batches: int = 200) -> None:
        self.enabled = bool(enabled)
        self.num_batches = check_positive_int("precise_bn", "num_batches", num_batches)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._recompute(trainer, pl_module, "validation")

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._recompute(trainer, pl_module, "test")

    def _recompute(self, trainer: pl.Trainer, pl_module: pl.LightningModule, before: str) -> None:
        if not self.enabled or not bn_layers(pl_module):
            return
        datamodule = trainer.datamodule
        if datamodule is None:
            raise ConfigError(
                "callbacks.precise_bn needs a data module to draw training batches from"
            )
        batches = self._on_device(trainer, datamodule.train_dataloader())
        forward = getattr(pl_module, "precise_bn_forward", None)
        device = pl_module.device
        rng_devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=rng_devices):
            result = recompute_bn_stats(pl_module, batches, self.num_batches, forward)
        log.info(
            "precise BN: recomputed the statistics of %d BN layers over %d training batches "
            "(before %s, step %d)",
            len(result.layers),
            result.batches,
            before,
            trainer.global_step,
        )
        pl_module.log("precise_bn/batches", float(result.batches))

    @staticmethod
    def _on_device(trainer: pl.Trainer, loader: Any) -> Iterator[Any]:
        for batch in loader:
            yield trainer.strategy.batch_to_device(batch)
