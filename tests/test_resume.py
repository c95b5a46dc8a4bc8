"""A run killed with SIGKILL and resumed ends exactly like an uninterrupted run, wherever the kill
lands: mid-epoch, right after the step-interval checkpoint of an epoch's last batch, after
validation, during test."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from conftest import REPO

ARGS = [
    "batch=64", "trainer.max_epochs=3", "trainer.limit_train_batches=20",
    "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", "trainer.log_every_n_steps=4",
    "callbacks.last_checkpoint.every_n_train_steps=5", "callbacks.norm_stats.every_n_steps=4",
    "trainer.deterministic=true", "optim.schedule=cosine", "optim.warmup_steps=3",
]  # fmt: skip
# The boundary runs: 4 steps per epoch and a step-interval checkpoint every 4 steps, so one falls
# on the last batch of every epoch (the setup, shrunk); a row of metrics at every step.
EPOCH_ARGS = [
    "optim=sgd", "batch=64", "trainer.max_epochs=3", "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "trainer.log_every_n_steps=1",
    "callbacks.last_checkpoint.every_n_train_steps=4", "callbacks.norm_stats.every_n_steps=2",
    "trainer.deterministic=true", "optim.schedule=cosine", "optim.warmup_steps=3",
]  # fmt: skip
EPOCH_STEPS = 12


class KillAt(pl.Callback):
    """SIGKILL its own process at `hook` (a callback hook), in epoch `epoch` and, for an
    on_*_batch_start hook, at batch `batch` (None: any); never in the sanity check. A run gets it
    as +callbacks.kill._target_=test_resume.KillAt (this directory on PYTHONPATH)."""

    def __init__(self, hook: str, epoch: int | None = None, batch: int | None = None):
        self.epoch, self.batch = epoch, batch
        setattr(self, hook, self.kill)

    def kill(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args) -> None:
        batch_idx = args[1] if len(args) > 1 else None
        if trainer.sanity_checking or self.epoch not in (None, trainer.current_epoch):
            return
        if self.batch in (None, batch_idx):
            os.kill(os.getpid(), signal.SIGKILL)


def train(*extra: str, args: list[str] = ARGS) -> subprocess.Popen:
    cmd = [sys.executable, "train.py", *args, *extra]
    path = [str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}  # for KillAt
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def ckpt_step(path: Path) -> int:
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])
    except (OSError, RuntimeError, EOFError, KeyError):
        return -1


def rows(run_dir: Path) -> list[tuple]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return sorted(tuple(sorted((k, v) for k, v in r.items() if v)) for r in csv.DictReader(f))


def finished(proc: subprocess.Popen) -> None:
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()


def assert_same_run(whole: Path, resumed: Path, steps: int) -> None:
    """Bit-identical final weights and optimizer state; the same rows of metrics, none twice."""
    a = torch.load(whole / "checkpoints" / "last.ckpt", weights_only=False)
    b = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=False)
    assert a["global_step"] == b["global_step"] == steps
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(),
                      b["optimizer_states"][0]["state"].values(), strict=True):  # fmt: skip
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert rows(whole) == rows(resumed)  # the CSV log continues, with nothing twice


def test_killed_run_resumes_bit_for_bit(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    reference = train(f"hydra.run.dir={whole}")
    victim = train(f"hydra.run.dir={killed}")
    last = killed / "checkpoints" / "last.ckpt"
    deadline = time.time() + 300
    while ckpt_step(last) < 25:  # mid-epoch 2 (20 steps per epoch)
        assert victim.poll() is None and time.time() < deadline, victim.stderr.read().decode()
        time.sleep(0.1)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert ckpt_step(last) < 60  # really interrupted before the end
    finished(train(f"hydra.run.dir={killed}", "ckpt_path=last"))
    finished(reference)
    assert_same_run(whole, killed, 60)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The boundary tests' uninterrupted run: started once, waited for when first needed."""
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    proc = train(f"hydra.run.dir={run_dir}", args=EPOCH_ARGS)

    def done() -> Path:
        finished(proc)
        return run_dir

    yield done
    proc.kill()  # a no-op once it has finished
    proc.wait()


@pytest.mark.parametrize(
    "kill_at",
    [
        # right after the step-interval checkpoint of epoch 1's last batch, before its validation
        {"hook": "on_validation_start", "epoch": 1},
        # after epoch 1's validation, its checkpoint and its epoch-end metrics (on disk), at the
        # next epoch's second batch: no checkpoint since the validation's
        {"hook": "on_train_batch_start", "epoch": 2, "batch": 1},
        # during test, after the end of fit
        {"hook": "on_test_batch_start", "batch": 0},
    ],
    ids=["last-batch-of-epoch", "after-validation", "during-test"],
)
def test_killed_at_a_boundary_resumes_bit_for_bit(tmp_path, uninterrupted, kill_at):
    killed = tmp_path / "killed"
    kill = ["+callbacks.kill._target_=test_resume.KillAt"]
    kill += [f"+callbacks.kill.{key}={value}" for key, value in kill_at.items()]
    victim = train(f"hydra.run.dir={killed}", *kill, args=EPOCH_ARGS)
    assert victim.wait(timeout=300) == -signal.SIGKILL, victim.stderr.read().decode()
    assert 0 < ckpt_step(killed / "checkpoints" / "last.ckpt") <= EPOCH_STEPS
    finished(train(f"hydra.run.dir={killed}", "ckpt_path=last", args=EPOCH_ARGS))
    assert_same_run(uninterrupted(), killed, EPOCH_STEPS)
