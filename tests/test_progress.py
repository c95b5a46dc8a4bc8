"""What a run prints while it trains: an estimate of its time before the first epoch ends, a
line every progress_every seconds (step, losses, speed, ETA), both also in train.log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, TINY

from normlab.callbacks.progress import (
    Estimate,
    RunEstimate,
    StepProgress,
    duration,
    nice_floor,
    step_line,
)


def fake_trainer(**kw):
    """The trainer attributes the progress callbacks read: 2 epochs of 500 steps, at step 100."""
    values = dict(
        global_step=100, current_epoch=0, max_epochs=2, estimated_stepping_batches=1000,
        num_training_batches=500, num_val_batches=[10], check_val_every_n_epoch=1,
        val_check_batch=500, callback_metrics={}, is_global_zero=True,
    )  # fmt: skip
    return SimpleNamespace(**{**values, **kw})


def test_duration_reads_as_seconds_minutes_or_hours():
    assert [duration(s) for s in (0.4, 89, 90, 3000, 5400, 4 * 3600)] == [
        "0 s", "89 s", "2 min", "50 min", "1.5 h", "4.0 h",
    ]  # fmt: skip


def test_nice_floor_picks_1_2_5_steps():
    assert [nice_floor(n) for n in (0.3, 1, 3, 7, 19, 499, 12345)] == [1, 1, 2, 5, 10, 200, 10000]


def test_step_line_names_the_step_epoch_losses_speed_and_both_etas():
    line = step_line(120, 1000, (0, 2, 120, 500), {"train/loss": 0.51234}, (12.0, 24.0), (30, 80))
    assert line == (
        "step 120/1000  epoch 1/2 (120/500)  train/loss 0.5123  12.0 steps/s (24 samples/s)  "
        "ETA epoch 30 s, run 80 s"
    )
    assert step_line(5, None, (3, None, 5, None), {}, (1.0, None), (None, None)) == (
        "step 5  epoch 4 (5)  1.0 steps/s"
    )


def test_step_progress_measures_speed_since_its_last_line_and_the_run_eta_since_the_start():
    cb = StepProgress(every=30)
    cb._start = cb._last = 0.0
    cb._first_step = cb._last_step = 0
    cb._samples = 200
    trainer = fake_trainer(callback_metrics={"train/loss_step": torch.tensor(0.7)})
    line = cb.line(trainer, {"loss": torch.tensor(0.25)}, batch_idx=99, now=10.0, sized=True)
    # 100 steps in 10 s; 400 steps left in the epoch, 900 in the run at the run's mean speed
    assert line == (
        "step 100/1000  epoch 1/2 (100/500)  train/loss 0.2500  10.0 steps/s (20 samples/s)  "
        "ETA epoch 40 s, run 2 min"
    )


def test_step_progress_refuses_a_non_positive_interval():
    with pytest.raises(ValueError, match="progress_every must be a positive number"):
        StepProgress(every=0)


def test_the_estimate_counts_steps_and_validations_and_says_how_to_shorten():
    long = Estimate(steps=275000, step_s=0.01, epochs=10, epoch_steps=27500, val_s=10.0)
    assert long.seconds == pytest.approx(2760.0)
    assert long.line() == (
        "estimate: about 46 min: 275000 training steps (10 epochs of 27500) at 10.0 ms, "
        "validation about 10 s (this machine, timed over the first steps); shorter: "
        "trainer.max_epochs=1 (about 5 min) or trainer.limit_train_batches=2000 (about 4 min)"
    )  # 1 epoch: 275 s + 1 s; 2000 batches x 10 epochs x 10 ms + 10 s = 210 s, 3.5 min
    short = Estimate(steps=10, step_s=0.02, epochs=2, epoch_steps=5, val_s=None)
    assert short.line() == (
        "estimate: about 0 s: 10 training steps (2 epochs of 5) at 20.0 ms, validation not "
        "timed (this machine, timed over the first steps)"
    )  # under a minute: no advice


def test_a_long_estimate_with_torchs_own_threads_suggests_one_thread():
    long = dict(steps=275000, step_s=0.01, epochs=10, epoch_steps=27500, val_s=10.0)
    hint = "; torch runs 2 threads: on a machine shared with other jobs num_threads=1 is often"
    assert hint in Estimate(**long, threads=2).line()
    assert "num_threads" not in Estimate(**long, threads=1).line()
    assert "num_threads" not in Estimate(**long).line()  # set by the config: threads None
    short = dict(steps=10, step_s=0.02, epochs=2, epoch_steps=5, val_s=None)
    assert "num_threads" not in Estimate(**short, threads=2).line()  # under a minute


@pytest.mark.parametrize(("threads", "own"), [([], True), (["num_threads=1"], False)])
def test_the_estimate_knows_whether_the_config_set_the_threads(threads, own, compose, tmp_path):
    from normlab.run import build_callbacks

    cfg = compose(["progress=epoch", *threads], tmp_path)
    (estimate,) = [c for c in build_callbacks(cfg) if isinstance(c, RunEstimate)]
    assert estimate.own_threads is own


def test_a_job_of_an_outer_command_estimates_without_train_py_hints(compose, tmp_path, monkeypatch):
    """A job of scripts/reproduce.py or a card (NORMLAB_OUTER_COMMAND set): its estimate has no
    `shorter: trainer....` and no num_threads=1, which the outer command does not take."""
    from normlab.run import build_callbacks
    from normlab.run.training import OUTER_ENV

    cfg = compose(["progress=epoch"], tmp_path)
    (alone,) = [c for c in build_callbacks(cfg) if isinstance(c, RunEstimate)]
    monkeypatch.setenv(OUTER_ENV, "1")
    (job,) = [c for c in build_callbacks(cfg) if isinstance(c, RunEstimate)]
    long = Estimate(steps=2140, step_s=0.5, epochs=10, epoch_steps=214, val_s=1.0, threads=2)
    assert "shorter: trainer.max_epochs=1" in long.line(alone.hint_over_s)
    assert "num_threads=1" in long.line(alone.hint_over_s)
    assert long.line(job.hint_over_s) == (
        "estimate: about 18 min: 2140 training steps (10 epochs of 214) at 500.0 ms, validation "
        "about 1 s (this machine, timed over the first steps)"
    )


def test_run_estimate_reads_the_budget_and_the_sanity_checks_validation_time():
    cb = RunEstimate()
    cb._val = [0.05, 0.01]  # the sanity check's batches: the fastest stands for one
    estimate = cb.estimate(fake_trainer(), step_s=0.002)
    assert estimate == Estimate(1000, 0.002, 2, 500, pytest.approx(0.01 * 10 * 2))
    cb._val = []
    assert cb.estimate(fake_trainer(), step_s=0.002).val_s is None


def run_cli(run_dir: Path, *args: str) -> str:
    env = {**os.environ, "NORMLAB_PROGRESS": "epoch"}
    argv = ["batch=16", *TINY, "trainer.max_epochs=2", "test=false", *args]
    proc = subprocess.run(
        [sys.executable, "train.py", *argv, f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_a_run_prints_its_estimate_and_step_lines_and_keeps_them_in_train_log(tmp_path):
    out = run_cli(tmp_path, "progress_every=0.000001")  # a line after every step
    log = (tmp_path / "train.log").read_text()
    for text in (out, log):
        estimates = [line for line in text.splitlines() if "estimate: about " in line]
        assert len(estimates) == 1 and "4 training steps (2 epochs of 2)" in estimates[0]
        steps = [line for line in text.splitlines() if "progress][INFO] - step " in line]
        assert [line.split(" - ")[1].split("  ")[0] for line in steps] == [
            "step 1/4", "step 2/4", "step 3/4", "step 4/4",
        ]  # fmt: skip
        assert all("train/loss " in line and "steps/s" in line and "ETA" in line for line in steps)
    first_epoch = next(i for i, line in enumerate(log.splitlines()) if " - epoch 1/2" in line)
    estimate = next(i for i, line in enumerate(log.splitlines()) if "estimate: " in line)
    assert estimate < first_epoch


def test_the_default_interval_prints_no_step_line_in_a_run_of_seconds(tmp_path):
    out = run_cli(tmp_path)  # progress_every=30
    assert "estimate: about " in out and "progress][INFO] - step " not in out


@pytest.mark.parametrize(
    ("progress", "expected"),
    [("epoch", {RunEstimate, StepProgress}), ("bar", {RunEstimate}), ("none", set())],
)
def test_progress_picks_the_estimate_and_the_step_lines(progress, expected, compose, tmp_path):
    from normlab.run import build_callbacks

    cfg = compose([f"progress={progress}", "progress_every=5"], tmp_path)
    found = {type(c) for c in build_callbacks(cfg)} & {RunEstimate, StepProgress}
    assert found == expected
    steps = [c for c in build_callbacks(cfg) if isinstance(c, StepProgress)]
    assert all(c.every == 5 for c in steps)


@pytest.mark.parametrize("value", ["0", "-1", "soon", "true"])
def test_a_bad_progress_every_fails_with_its_value(value, compose, tmp_path):
    from normlab.config import validate
    from normlab.errors import ConfigError

    with pytest.raises(ConfigError, match="progress_every must be a positive number of seconds"):
        validate(compose([f"progress_every={value}"], tmp_path))
