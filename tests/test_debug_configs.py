"""The debug/ presets (debug=fdr, overfit, limit, profiler): composed over an experiment, built
into Lightning's Trainer, and debug=fdr end to end through train.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO
from hydra.utils import instantiate
from lightning.pytorch.profilers import SimpleProfiler
from omegaconf import OmegaConf

# trainer keys each preset sets (experiment=bn_lenet sets max_epochs: 3 before them)
PRESETS = {
    "fdr": {"fast_dev_run": True},
    "overfit": {"max_epochs": 20, "overfit_batches": 3},
    "limit": {
        "max_epochs": 2,
        "limit_train_batches": 5,
        "limit_val_batches": 2,
        "limit_test_batches": 2,
    },
    "profiler": {"max_epochs": 1},
}


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_overrides_the_experiment_and_builds_a_trainer(preset, compose, tmp_path):
    cfg = compose(["experiment=bn_lenet", f"debug={preset}"], tmp_path)
    for key, value in PRESETS[preset].items():
        assert cfg.trainer[key] == value, key
    assert cfg.paths.output_root == "outputs/debug"  # debug runs stay out of outputs/runs
    assert cfg.optim.optimizer._target_ == "torch.optim.SGD"  # the rest is the experiment's
    trainer = instantiate(cfg.trainer, logger=False, enable_progress_bar=False)
    if preset == "fdr":
        assert trainer.fast_dev_run and trainer.max_steps == 1
        assert trainer.limit_train_batches == trainer.limit_test_batches == 1
    elif preset == "overfit":
        assert trainer.overfit_batches == 3 and trainer.limit_train_batches == 3
    elif preset == "limit":
        assert (trainer.max_epochs, trainer.limit_train_batches) == (2, 5)
    else:
        assert isinstance(trainer.profiler, SimpleProfiler)
        assert trainer.profiler.dirpath == str(tmp_path)


def test_without_debug_the_trainer_has_none_of_the_debug_keys(compose, tmp_path):
    cfg = compose([], tmp_path)
    assert not {"fast_dev_run", "overfit_batches", "profiler"} & set(cfg.trainer)
    assert cfg.paths.output_root == "outputs"


def test_fast_dev_run_end_to_end_through_train_py(tmp_path):
    # one batch of train, val and test; Lightning logs no metrics and saves no checkpoint under
    # fast_dev_run, and normlab's own last.ckpt and trackers follow it
    proc = subprocess.run(
        [sys.executable, "train.py", "debug=fdr", "progress=epoch", f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (tmp_path / "train.log").read_text()
    assert "Running in `fast_dev_run` mode" in log
    assert "epoch 1/1  step 1/1  train/acc" in log  # normlab's epoch line
    assert "test/acc" in proc.stdout
    assert OmegaConf.load(tmp_path / ".hydra" / "config.yaml").trainer.fast_dev_run is True
    assert not list(tmp_path.rglob("*.ckpt"))
    assert not list(tmp_path.rglob("metrics.csv")) and not list(tmp_path.rglob("hparams.yaml"))
