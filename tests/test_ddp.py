"""Data-parallel training through train.py: 2 CPU processes (gloo), synchronized BatchNorm."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import REPO, TINY

# Imported by both ranks (PYTHONPATH): each rank saves its BN running statistics after each
# training step, before DDP's next forward would copy rank 0's buffers to the other ranks.
DUMP_CALLBACK = """
from pathlib import Path

import lightning.pytorch as pl
import torch


class DumpRunningStats(pl.Callback):
    def __init__(self, out: str):
        self.out = Path(out)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        stats = {k: v.clone() for k, v in pl_module.state_dict().items() if "running_" in k}
        torch.save(stats, self.out / f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(180)
def test_two_process_ddp_run_writes_one_run_dir_and_syncs_batchnorm(tmp_path):
    run_dir, dumps = tmp_path / "run", tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "ddp_dump.py").write_text(textwrap.dedent(DUMP_CALLBACK))
    env = {**os.environ, "PYTHONPATH": f"{dumps}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [
        "trainer=ddp_cpu",
        "trainer.devices=2",
        "norm.sync=true",
        "batch=16",
        "num_threads=1",  # two processes on a shared 2-core machine
        *TINY,
        "trainer.limit_train_batches=3",
        "+callbacks.dump._target_=ddp_dump.DumpRunningStats",
        f"+callbacks.dump.out={dumps}",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Starting with 2 processes" in proc.stdout + proc.stderr

    # one run dir (rank 1 ran with hydra.run.dir=<rank 0's dir>), everything written once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dumps", "run"]
    (metrics,) = run_dir.rglob("metrics.csv")
    assert len(list(run_dir.rglob("config.yaml"))) == 1
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    with open(metrics) as f:
        rows = list(csv.DictReader(f))
    assert len([r for r in rows if r.get("train/loss_step")]) == 3  # rank 0's 3 steps, once each
    assert len([r for r in rows if r.get("test/acc")]) == 1

    # synchronized BN: both ranks hold the same running statistics, equal to the checkpoint's,
    # although each rank saw only its own half of every batch
    ranks = [torch.load(dumps / f"rank{r}.pt") for r in range(2)]
    assert ranks[0] and ranks[0].keys() == ranks[1].keys()
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    for key, value in ranks[0].items():
        torch.testing.assert_close(ranks[1][key], value, msg=key)
        torch.testing.assert_close(ckpt[key], value, msg=key)
    assert not torch.allclose(ranks[0]["net.features.norm1.running_mean"], torch.zeros(6))
