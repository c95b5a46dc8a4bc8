"""val/fid_lenet every k epochs: Fréchet distance of EMA samples to the Fashion-MNIST test set
in a trained LeNet's feature space (not Inception FID; see normlab.fid). The LeNet is a given
file (`ckpt`) or the cached one of normlab.fid_train, trained on first use."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl

from normlab import fid, fid_train
from normlab.sweep import identity

log = logging.getLogger(__name__)


class FIDLeNet(pl.Callback):
    """Log val/fid_lenet of `num_samples` class-balanced DDIM samples every `every_n_epochs`."""

    def __init__(
        self,
        data_root: str,
        ckpt: str | None = None,
        cache_dir: str = str(fid_train.CACHE_DIR),
        lenet_epochs: int = fid_train.EPOCHS,
        lenet_overrides: Sequence[str] = (),
        every_n_epochs: int = 1,
        num_samples: int = 1000,
        steps: int | None = None,
        guidance_scale: float | None = None,
        seed: int = 0,
        batch_size: int = 500,
    ) -> None:
        self.ckpt = ckpt
        self.data_root = data_root
        self.cache_dir = cache_dir
        self.lenet_epochs = lenet_epochs
        self.lenet_overrides = list(lenet_overrides)
        self.every_n_epochs = every_n_epochs
        self.num_samples = num_samples
        self.steps = steps
        self.guidance_scale = guidance_scale
        self.seed = seed
        self.batch_size = batch_size
        self.features: fid.LeNetFeatures | None = None
        self.reference = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # the LeNet and the test-set statistics before training: a file given as `ckpt` is used
        # as is (missing: fails now); otherwise the cached LeNet, trained here on first use
        if self.features is None:
            path = self.ckpt or self.lenet()
            log.info("val/fid_lenet measures in the LeNet %s", path)
            self.features = fid.load_feature_extractor(path)
            reference = self.features(fid.fashion_mnist_test_pixels(self.data_root))
            self.reference = fid.feature_stats(reference)

    def lenet(self) -> Path:
        """The cached LeNet of this recipe and data (normlab.fid_train), trained if missing."""
        return fid_train.ensure(
            self.cache_dir,
            self.lenet_epochs,
            self.lenet_overrides,
            self.data_root,
            identity.hydra_conf_dir(),
        )

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        generated = fid.generate_pixels(
            pl_module,
            self.num_samples,
            self.steps,
            self.guidance_scale,
            self.seed,
            self.batch_size,
        )
        value = fid.fid_lenet(self.features, generated, self.reference)
        log.info("epoch %d: val/fid_lenet=%.3f", trainer.current_epoch, value)
        pl_module.log("val/fid_lenet", value)
