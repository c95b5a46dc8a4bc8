"""A run killed with SIGKILL and resumed ends exactly like an uninterrupted run, wherever the kill
lands: mid-epoch, right after the step-interval checkpoint of an epoch's last batch, after
validation, during test; for every model (LeNet, the GPT, the LSTM, the DiT): the same weights and
the same metrics.csv, its epoch means and validation values included."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
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
    """Send its own process `sig` (SIGKILL unless named) at `hook` (a callback hook), in epoch
    `epoch` and, for an on_*_batch_start hook, at batch `batch` (None: any); never in the sanity
    check. A run gets it as +callbacks.kill._target_=test_resume.KillAt (this directory on
    PYTHONPATH)."""

    def __init__(
        self, hook: str, epoch: int | None = None, batch: int | None = None, sig: str = "SIGKILL"
    ):
        self.epoch, self.batch, self.sig = epoch, batch, signal.Signals[sig]
        setattr(self, hook, self.kill)

    def kill(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args) -> None:
        batch_idx = args[1] if len(args) > 1 else None
        if trainer.sanity_checking or self.epoch not in (None, trainer.current_epoch):
            return
        if self.batch in (None, batch_idx):
            if self.sig == signal.SIGINT:  # as in a terminal (a background job may ignore it)
                signal.signal(signal.SIGINT, signal.default_int_handler)
            os.kill(os.getpid(), self.sig)


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


# Every model, tiny: two epochs of 4 steps, a last.ckpt every 2 steps, a row at every step; the
# language models with dropout (the global RNG), the DiT with its EMA, label dropout, epoch mean
# of train/loss and sample grids.
SHORT = [
    "trainer.max_epochs=2", "trainer.limit_train_batches=4", "trainer.limit_val_batches=1",
    "trainer.log_every_n_steps=1", "callbacks.last_checkpoint.every_n_train_steps=2",
    "callbacks.norm_stats.every_n_steps=2", "trainer.deterministic=true", "test=false",
    "optim.schedule=cosine", "optim.warmup_steps=3",
]  # fmt: skip
LM = ["model.net.ctx=16", "model.net.dropout=0.1", "batch=8", "data.val_batches=1",
      "callbacks.text_sample.length=8"]  # fmt: skip
MODELS = {
    "lenet": ["batch=32"],
    "gpt": ["model=transformer", "model.net.depth=1", "model.net.d_model=16",
            "model.net.n_heads=2", *LM],
    "lstm": ["model=lstm", "model.net.hidden_size=16", "model.net.num_layers=1", *LM],
    "dit": ["experiment=dit", "batch=8", "model.net.hidden_size=16", "model.net.depth=1",
            "model.net.num_heads=2", "model.net.patch_size=7", "model.sample_steps=2",
            "callbacks.samples.per_class=1", "callbacks.fid=null"],
}  # fmt: skip
SHORT_STEPS = 8
KILL_POINTS = {
    # epoch 0, before its last batch: last.ckpt from step 2, mid-epoch
    "mid-epoch": {"hook": "on_train_batch_start", "epoch": 0, "batch": 3},
    # epoch 1's first batch: last.ckpt from after epoch 0's validation (step 4)
    "epoch-end": {"hook": "on_train_batch_start", "epoch": 1, "batch": 0},
}
# what the uninterrupted run of each model must log for the comparison to mean something
EPOCH_KEYS = {
    "lenet": {"train/loss_epoch", "train/acc", "val/loss", "val/acc"},
    "gpt": {"val/loss", "val/bpc"},
    "lstm": {"val/loss", "val/bpc"},
    "dit": {"train/loss_epoch", "val/loss"},
}


@pytest.fixture(scope="module")
def short_runs(tmp_path_factory):
    """short_runs(model) -> the dir of that model's uninterrupted run: each started once, when
    first asked for, and waited for when its result is needed (it runs beside the first victim)."""
    procs: dict[str, tuple[subprocess.Popen, Path]] = {}

    def start(model: str):
        if model not in procs:
            run_dir = tmp_path_factory.mktemp(f"whole-{model}")
            procs[model] = train(f"hydra.run.dir={run_dir}", args=[*SHORT, *MODELS[model]]), run_dir

        def done() -> Path:
            proc, run_dir = procs[model]
            finished(proc)
            return run_dir

        return done

    yield start
    for proc, _ in procs.values():
        proc.kill()  # a no-op once it has finished
        proc.wait()


def epoch_values(run_dir: Path) -> dict[tuple[str, str], str]:
    """{(key, step): value} of the epoch-level and validation values in metrics.csv."""
    with open(run_dir / "csv" / "metrics.csv") as f:
        return {
            (k, r["step"]): v
            for r in csv.DictReader(f)
            for k, v in r.items()
            if v and (k.startswith("val/") or k.endswith("_epoch") or k == "train/acc")
        }


@pytest.mark.parametrize(
    "model, kill_point",
    [
        pytest.param(model, point, marks=() if (model, point) == ("lenet", "mid-epoch")
                     else pytest.mark.slow, id=f"{model}-{point}")
        for model in MODELS
        for point in KILL_POINTS
    ],
)  # fmt: skip
def test_every_model_resumes_bit_for_bit(tmp_path, short_runs, model, kill_point):
    args = [*SHORT, *MODELS[model]]
    whole = short_runs(model)
    killed = tmp_path / "killed"
    kill = ["+callbacks.kill._target_=test_resume.KillAt"]
    kill += [f"+callbacks.kill.{key}={value}" for key, value in KILL_POINTS[kill_point].items()]
    victim = train(f"hydra.run.dir={killed}", *kill, args=args)
    assert victim.wait(timeout=300) == -signal.SIGKILL, victim.stderr.read().decode()
    assert 0 < ckpt_step(killed / "checkpoints" / "last.ckpt") < SHORT_STEPS
    finished(train(f"hydra.run.dir={killed}", "ckpt_path=last", args=args))
    expected = epoch_values(whole())
    assert EPOCH_KEYS[model] <= {key for key, _ in expected}
    assert epoch_values(killed) == expected  # named first: the values a user reads
    assert_same_run(whole(), killed, SHORT_STEPS)


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
