"""val/fid_lenet every k epochs: Fréchet distance of EMA samples to the Fashion-MNIST test set
in a trained LeNet's feature space (not Inception FID; see normlab.fid). The LeNet is the
committed file (`features` "committed", checked against its pinned sha256), a given file, or
("cached") normlab.fid_train's cached one, trained on first use. The run's trackers record the
file's sha256 (first 12 hex digits) as the hyperparameter `fid_lenet_sha256`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl

from normlab import fid, fid_train, identity

log = logging.getLogger(__name__)


class FIDLeNet(pl.Callback):
    """Log val/fid_lenet of `num_samples` class-balanced DDIM samples every `every_n_epochs`."""

    def __init__(
        self,
        data_root: str,
        features: str = fid_train.COMMITTED,
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
        self.features = features
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
        self.lenet: fid.LeNetFeatures | None = None
        self.reference = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # the LeNet and the test-set statistics before training (a missing or altered file
        # fails now; "cached" trains the LeNet here on first use), its sha256 to the trackers
        if self.lenet is None:
            path = self.lenet_file()
            self.lenet = fid.load_feature_extractor(path)
            sha = self.lenet.sha256[:12]
            log.info("val/fid_lenet measures in the LeNet %s (sha256 %s)", path, sha)
            for tracker in trainer.loggers if trainer is not None else ():
                tracker.log_hyperparams({"fid_lenet_sha256": sha})
            reference = self.lenet(fid.fashion_mnist_test_pixels(self.data_root))
            self.reference = fid.feature_stats(reference)

    def lenet_file(self) -> Path:
        """The fid_lenet file `features` names (normlab.fid_train.feature_file)."""
        return fid_train.feature_file(
            self.features,
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
        value = fid.fid_lenet(self.lenet, generated, self.reference)
        log.info("epoch %d: val/fid_lenet=%.3f", trainer.current_epoch, value)
        pl_module.log("val/fid_lenet", value)
