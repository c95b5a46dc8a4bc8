"""Shared test setup: data root, config composition, tiny overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("NORMLAB_DATA", str((REPO.parent / "shared" / "data").resolve()))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# Every run in tests: one epoch of a few batches, CSV only, no test split unless asked.
TINY = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "trainer.log_every_n_steps=1",
    "callbacks.norm_stats.every_n_steps=1",
]


@pytest.fixture
def compose():
    """compose(overrides, run_dir) -> a DictConfig from conf/train.yaml with hydra runtime set."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    import normlab.config  # noqa: F401

    def _compose(overrides: list[str], run_dir: Path):
        with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
            cfg = hydra_compose("train", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            cfg.paths.output_dir = str(run_dir)
            del cfg.hydra
        return cfg

    yield _compose
    HydraConfig.instance().cfg = None
