"""What a run prints: each log line once, no third-party noise, one line per epoch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY

from normlab.callbacks.progress import epoch_line

RUN = ["batch=16", *TINY, "trainer.max_epochs=2", "test=false"]


def train_cli(run_dir: Path, *args: str, progress: str = "none") -> str:
    env = {**os.environ, "NORMLAB_PROGRESS": progress}
    proc = subprocess.run(
        [sys.executable, "train.py", *RUN, *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_each_lightning_line_is_printed_once_and_kept_in_the_log_file(tmp_path):
    out = train_cli(tmp_path)
    assert out.count("`Trainer.fit` stopped") == 1
    assert "INFO: " not in out  # Lightning's own console handler is gone
    assert "`Trainer.fit` stopped" in (tmp_path / "train.log").read_text()  # Hydra's file


def test_third_party_tips_and_deprecations_are_not_printed(tmp_path):
    out = train_cli(tmp_path)
    assert "litlogger" not in out
    assert "LeafSpec" not in out
    assert "GPU available" in out  # Lightning's other lines are still printed


def test_progress_epoch_prints_one_line_per_epoch_with_train_and_val_metrics(tmp_path):
    out = train_cli(tmp_path, progress="epoch")
    lines = [
        line for line in out.splitlines() if "[normlab.callbacks.progress][INFO] - epoch " in line
    ]
    assert len(lines) == 2
    assert "epoch 1/2  step 2/4  train/acc " in lines[0] and "epoch 2/2  step 4/4" in lines[1]
    assert all("train/loss " in line and "val/acc " in line for line in lines)
    assert "epoch 2/2" in (tmp_path / "train.log").read_text()


def test_progress_none_prints_no_epoch_lines_and_no_bar(tmp_path):
    out = train_cli(tmp_path, progress="none")
    assert "[normlab.callbacks.progress]" not in out and "it/s" not in out


@pytest.mark.parametrize(
    ("overrides", "bar", "lines"),
    [
        (["progress=bar"], True, False),
        (["progress=epoch"], False, True),
        (["progress=none"], False, False),
        (["progress=none", "trainer.enable_progress_bar=true"], True, False),  # explicit wins
    ],
)
def test_progress_selects_the_bar_or_the_epoch_lines(overrides, bar, lines, compose, tmp_path):
    from normlab.callbacks.progress import EpochProgress
    from normlab.run import build_callbacks, build_trainer

    cfg = compose(overrides, tmp_path)
    callbacks = build_callbacks(cfg)
    assert any(isinstance(c, EpochProgress) for c in callbacks) == lines
    trainer = build_trainer(cfg, callbacks, [])
    assert (trainer.progress_bar_callback is not None) == bar


def test_an_unknown_progress_value_fails_with_the_valid_ones(compose, tmp_path):
    from normlab.config import validate
    from normlab.errors import ConfigError

    with pytest.raises(ConfigError, match="progress must be one of bar, epoch, none, got 'tqdm'"):
        validate(compose(["progress=tqdm"], tmp_path))


def test_epoch_line_prefers_the_epoch_mean_and_skips_step_values():
    metrics = {
        "train/loss": torch.tensor(9.0),  # the last step's value
        "train/loss_epoch": torch.tensor(0.5),
        "train/loss_step": torch.tensor(9.0),
        "val/acc": torch.tensor(0.75),
        "norm/net.norm1/in_std": torch.tensor(2.0),
        "lr-AdamW": torch.tensor(0.01),
    }
    line = epoch_line(0, 10, 235, 12.4, metrics)
    assert line == "epoch 1/10  step 235  train/loss 0.5000  val/acc 0.7500  12 s"
    assert epoch_line(4, -1, 50, 1.0, {}).startswith("epoch 5  step 50  ")
    assert epoch_line(0, 1, 30, 1.0, {}, max_steps=30) == "epoch 1/1  step 30/30  1 s"
