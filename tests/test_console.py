"""What a run prints: each log line once, no third-party noise, one line per epoch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY

from normlab import console
from normlab.callbacks.progress import epoch_line
from normlab.console import QUIET_LOGGERS

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


def test_third_party_tips_inventories_and_deprecations_are_not_printed(tmp_path):
    out = train_cli(tmp_path)
    assert "litlogger" not in out
    assert "LeafSpec" not in out
    assert "GPU available" not in out and "TPU available" not in out
    assert "`Trainer.fit` stopped" in out  # Lightning's other lines are still printed


def test_trackers_warn_nothing_the_user_cannot_act_on(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SILENT"}  # wandb's warnings shown
    proc = subprocess.run(
        [sys.executable, "train.py", *RUN, "logger=[csv,wandb,mlflow]", "progress=none",
         f"hydra.run.dir={tmp_path / 'run'}", f"paths.output_root={tmp_path}"],
        cwd=REPO, env={**env, "WANDB_MODE": "offline"}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "anonymous setting has no effect" not in out  # wandb, for Lightning's anonymous=None
    assert "not found. Creating it." not in out  # MLflow's first run in a store
    assert list((tmp_path / "mlruns").iterdir())  # the MLflow run was written all the same


WARNING_LINE = re.compile(r"\.py:\d+: |Warning\b")  # `path.py:N: text` (Lightning) or `XWarning`
ADVISES = re.compile(r"\b(set|use|pass)\b", re.I)


@pytest.mark.parametrize("multirun", [False, True])
def test_every_warning_of_a_default_run_says_what_to_do(tmp_path, multirun):
    shrunk = ["trainer.max_epochs=1", "trainer.limit_train_batches=5",
              "trainer.limit_val_batches=2", "trainer.limit_test_batches=2"]  # fmt: skip
    where = ["-m", "seed=0,1", f"hydra.sweep.dir={tmp_path}"] if multirun else [
        f"hydra.run.dir={tmp_path}"
    ]
    proc = subprocess.run(
        [sys.executable, "train.py", *where, *shrunk], cwd=REPO, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if WARNING_LINE.search(line)]
    assert warned  # 5 batches under the logging interval: Lightning warns
    assert [line for line in warned if not ADVISES.search(line)] == []
    assert all("trainer.log_every_n_steps=N" in line for line in warned)


def _advised() -> tuple[list[str], object]:
    """A showwarning that records each message, wrapped by console.advised."""
    said: list[str] = []
    return said, console.advised(lambda message, *rest: said.append(message))


def test_advice_is_appended_once_to_the_warnings_it_names():
    said, show = _advised()
    text = (
        "The number of training batches (5) is smaller than the logging interval "
        "Trainer(log_every_n_steps=50)."
    )
    show(text, UserWarning, "fit_loop.py", 1)
    show(said[0], UserWarning, "fit_loop.py", 1)  # already advised: as it is
    show("something else", UserWarning, "x.py", 1)
    assert said[0] == said[1] == f"{text} (normlab: {console.ADVICE[0][1]})"
    assert said[2] == "something else"
    assert console.advised(show) is not show and show.advised


def test_a_run_started_anew_in_its_dir_says_what_to_do_about_its_old_logs():
    """Lightning's CSV logger on a dir an interrupted attempt left (a continue line printed
    before the first checkpoint: ckpt_path=last_or_new) says what happens and what to do."""
    said, show = _advised()
    text = (
        "Experiment logs directory /r/csv/ exists and is not empty. Previous log files in this "
        "directory will be deleted when the new ones are saved!"
    )
    show(text, UserWarning, "csv_logs.py", 268)
    assert said == [f"{text} (normlab: {console.ADVICE[1][1]})"]
    assert ADVISES.search(said[0]) and "hydra.run.dir" in said[0]


def test_train_py_quiets_alembic_before_an_optuna_search_starts():
    import logging
    import runpy

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    runpy.run_path(str(REPO / "train.py"), run_name="imported")  # its module code, no run
    assert not logging.getLogger("alembic.runtime.plugins").isEnabledFor(logging.INFO)
    assert logging.getLogger("alembic.runtime.plugins").isEnabledFor(logging.WARNING)


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
