"""A run killed with SIGKILL mid-epoch and resumed ends exactly like an uninterrupted run."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import REPO

ARGS = [
    "batch=64", "trainer.max_epochs=3", "trainer.limit_train_batches=20",
    "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", "trainer.log_every_n_steps=4",
    "callbacks.last_checkpoint.every_n_train_steps=5", "callbacks.norm_stats.every_n_steps=4",
    "trainer.deterministic=true", "optim.schedule=cosine", "optim.warmup_steps=3",
]  # fmt: skip


def train(*extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "train.py", *ARGS, *extra]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def ckpt_step(path: Path) -> int:
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])
    except (OSError, RuntimeError, EOFError, KeyError):
        return -1


def rows(run_dir: Path) -> list[tuple]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return sorted(tuple(sorted((k, v) for k, v in r.items() if v)) for r in csv.DictReader(f))


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
    resumed = train(f"hydra.run.dir={killed}", "ckpt_path=last")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()
    assert reference.wait(timeout=300) == 0, reference.stderr.read().decode()

    a = torch.load(whole / "checkpoints" / "last.ckpt", weights_only=False)
    b = torch.load(last, weights_only=False)
    assert a["global_step"] == b["global_step"] == 60
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(),
                      b["optimizer_states"][0]["state"].values(), strict=True):  # fmt: skip
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert rows(whole) == rows(killed)  # the CSV log continues, with nothing twice
