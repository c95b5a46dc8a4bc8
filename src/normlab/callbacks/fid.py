"""val/fid_lenet every k epochs: Fréchet distance of EMA samples to the Fashion-MNIST test set
in a trained LeNet's feature space (not Inception FID; see normlab.fid)."""

from __future__ import annotations

import logging

import lightning.pytorch as pl

from normlab import fid

log = logging.getLogger(__name__)


class FIDLeNet(pl.Callback):
    """Log val/fid_lenet of `num_samples` class-balanced DDIM samples every `every_n_epochs`."""

    def __init__(
        self,
        ckpt: str,
        data_root: str,
        every_n_epochs: int = 1,
        num_samples: int = 1000,
        steps: int | None = None,
        guidance_scale: float | None = None,
        seed: int = 0,
        batch_size: int = 500,
    ) -> None:
        self.ckpt = ckpt
        self.data_root = data_root
        self.every_n_epochs = every_n_epochs
        self.num_samples = num_samples
        self.steps = steps
        self.guidance_scale = guidance_scale
        self.seed = seed
        self.batch_size = batch_size
        self.features: fid.LeNetFeatures | None = None
        self.reference = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # load the LeNet and the test-set statistics before training: a missing file fails now
        if self.features is None:
            self.features = fid.load_feature_extractor(self.ckpt)
            reference = self.features(fid.fashion_mnist_test_pixels(self.data_root))
            self.reference = fid.feature_stats(reference)

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
