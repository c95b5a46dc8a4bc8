"""A job at its time limit is requeued and resumes from its last.ckpt: conf/hydra/launcher's
wiring (slurm.yaml says who does what), run for real through submitit's local executor.

submitit's local executor delivers the timeout signal as on SLURM: its controller sends the job
submitit's signal (SIGUSR2) timeout_min minus 30 s after the job starts, and submitit's handler in
the job (the same code as on SLURM) calls the launcher's checkpoint() and requeues it, the local
executor by restarting the process. Not covered here: sbatch's --signal, `scontrol requeue` and
SLURM starting the array task again."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import REPO

# Imported by the job (PYTHONPATH): paces the training steps, so that the signal, sent at a fixed
# time after the job starts, lands in the middle of training on a fast machine or a slow one.
PACE = """
import time

import lightning.pytorch as pl


class Pace(pl.Callback):
    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(self.seconds)
"""
STEPS, PACE_S = 300, 0.1  # at least 30 s of training: past the signal, 30 s after the start
RESUMED = re.compile(r"resuming from (\S+last\.ckpt) \(step (\d+)\)")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_job_signalled_at_its_timeout_is_requeued_and_resumes_from_last_ckpt(tmp_path):
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "pace.py").write_text(textwrap.dedent(PACE))
    path = [str(helpers), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable, "train.py", "-m", "hydra/launcher=local", "hydra.launcher.timeout_min=1",
        "num_threads=1", "batch=16", f"trainer.max_steps={STEPS}", "trainer.max_epochs=-1",
        "trainer.val_check_interval=100", "trainer.limit_val_batches=1", "test=false",
        "trainer.log_every_n_steps=10", "callbacks.last_checkpoint.every_n_train_steps=10",
        "+callbacks.pace._target_=pace.Pace", f"+callbacks.pace.seconds={PACE_S}",
        f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=380)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    # submitit's own log of the job: the timeout signal caught, the job requeued, then finished
    (out,) = (sweep / ".submitit").glob("*/*_0_log.out")
    log = out.read_text()  # submitit's lines (twice: its own format, then Hydra's logging's)
    signalled = len(re.findall(r"^submitit WARNING .* Caught signal SIGUSR2 ", log, re.M))
    requeued = len(re.findall(r"^submitit INFO .* Requeued job ", log, re.M))
    assert signalled >= 1 and requeued == signalled, log[-3000:]
    assert log.rstrip().endswith("Exiting after successful completion"), log[-3000:]

    # each requeued run resumed the job's last.ckpt, after some steps; the last one finished
    (job,) = [p for p in sweep.iterdir() if p.name.startswith("0_")]
    resumed = [(Path(p), int(s)) for p, s in RESUMED.findall((job / "train.log").read_text())]
    assert len(resumed) == signalled, resumed
    assert all(p == job / "checkpoints" / "last.ckpt" and 0 < s < STEPS for p, s in resumed)
    assert [s for _, s in resumed] == sorted({s for _, s in resumed})  # on from the one before
    last = torch.load(job / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == STEPS
    with open(sweep / "summary.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert row["status"] == "ok", row

    # the CSV log goes on where the run before left it: every training step logged once
    with open(job / "csv" / "metrics.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss_step")]
    assert steps == sorted(set(steps)) and len(steps) == STEPS // 10, steps


def test_lightning_takes_no_signal_submitit_handles_already(monkeypatch):
    """Why slurm.yaml leaves Lightning's SLURM auto-requeue out: configured to submitit's signal
    (SLURMEnvironment(requeue_signal=SIGUSR2)), Lightning installs nothing over the handler
    submitit installed before the task ran; on its own SIGUSR1, which nobody sends, it does."""
    import signal

    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments import SLURMEnvironment

    for name, value in {
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "train",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_JOB_ID": "1",
    }.items():
        monkeypatch.setenv(name, value)  # fmt: skip

    def submitits(signum, frame):  # stands for submitit's SignalHandler.checkpoint_and_try_requeue
        raise AssertionError("not called here")

    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGUSR2, submitits)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        for requeue_signal, taken in ((signal.SIGUSR2, False), (signal.SIGUSR1, True)):
            slurm = SLURMEnvironment(auto_requeue=True, requeue_signal=requeue_signal)
            trainer = pl.Trainer(plugins=[slurm], accelerator="cpu", devices=1, logger=False)
            assert trainer._accelerator_connector.cluster_environment is slurm
            trainer._signal_connector.register_signal_handlers()
            try:
                handler = signal.getsignal(requeue_signal)
                assert (handler is not submitits and handler != signal.SIG_DFL) is taken
            finally:
                trainer._signal_connector.teardown()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
