"""`python train.py experiment=dit` end to end on a tiny budget; the conditioning sweep config."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

from normlab import fid

REPO = Path(__file__).resolve().parents[1]
LENET = {"_target_": "normlab.models.lenet.LeNet", "activation": "relu",
         "norm_layer": {"_target_": "normlab.norms.BatchNorm", "_partial_": True}}  # fmt: skip
TINY_DIT = [
    "batch=16",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "trainer.log_every_n_steps=1",
    "model.net.hidden_size=32",
    "model.net.depth=1",
    "model.sample_steps=2",
    "callbacks.samples.per_class=2",
    "callbacks.fid.every_n_epochs=1",
    "callbacks.fid.num_samples=100",
    "callbacks.fid.steps=2",
]


def random_lenet(path: Path) -> Path:
    """A randomly initialised LeNet in the fid_lenet file format (fast; not a trained one)."""
    from hydra.utils import instantiate

    torch.manual_seed(0)
    return fid.save_feature_extractor(path, LENET, instantiate(LENET).state_dict(), 0.286, 0.353)


def test_train_experiment_dit_writes_samples_and_fid(tmp_path):
    lenet = random_lenet(tmp_path / "lenet.pt")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "train.py", "experiment=dit", *TINY_DIT,
           f"callbacks.fid.features={lenet}", f"hydra.run.dir={run_dir}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]
    grid = run_dir / "samples" / "epoch_000.png"
    assert grid.is_file()
    from PIL import Image

    # 10 classes x 2 samples of 28x28 with 2-pixel padding, after a margin of class names
    image = np.asarray(Image.open(grid))
    width = image.shape[1] - (2 + 2 * 30)
    assert image.shape == (2 + 10 * 30, width + 2 + 2 * 30) and width > 20
    for row in range(10):  # each row's name: dark text in the margin, beside its images
        cell = image[2 + 30 * row : 30 * (row + 1), :width]
        assert (cell < 128).any(), row
    assert (image[:2, :width] == 255).all()  # the margin is white where there is no name
    rows = list(csv.DictReader(open(run_dir / "csv" / "metrics.csv")))
    keys = {k for row in rows for k, v in row.items() if v}
    assert {"train/loss_step", "val/loss", "val/fid_lenet", "test/loss"} <= keys
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    # the run records which LeNet it measured in: its sha256, in the log and the hparams
    sha = fid.file_sha256(lenet)[:12]
    line = f"val/fid_lenet measures in the LeNet {lenet} (sha256 {sha})"
    assert line in proc.stderr + proc.stdout
    hparams = yaml.safe_load((run_dir / "csv" / "hparams.yaml").read_text())
    assert hparams["fid_lenet_sha256"] == sha

    # scripts/fid.py scores the checkpoint: one JSON line with its settings and sampling time
    cmd = [sys.executable, "scripts/fid.py", str(run_dir / "checkpoints" / "last.ckpt"),
           "--lenet", str(lenet), "--num-samples", "20", "--steps", "2", "--seed", "1",
           "--guidance-scale", "1.0", "--batch-size", "10"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["num_samples"] == 20 and result["seed"] == 1 and result["steps"] == 2
    assert result["guidance_scale"] == 1.0 and result["num_threads"] == 1
    assert result["fid_lenet"] > 0 and result["sample_seconds"] >= 0
    assert result["lenet_sha256"] == sha


def test_conditioning_sweep_lists_the_four_conditionings():
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    import normlab.config  # noqa: F401
    from normlab.analysis.reproductions import REPRODUCTIONS
    from normlab.analysis.sweep import grid_values

    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", ["experiment=dit_conditioning"], return_hydra_config=True)
    repro = REPRODUCTIONS["dit_conditioning"]  # its grids: conf/reproduce/dit_conditioning.yaml
    grids = {g.name: grid_values(g, repro.full, False) for g in repro.grids}
    swept = grids["conditioning"]["model.net.conditioning"]
    assert swept == ["adaln_zero", "adaln", "cross_attn", "in_context"]
    # scored as DiT's Table 4: once after the last step, no guidance, >= 5000 samples
    fid = cfg.callbacks.fid
    assert fid.every_n_epochs == cfg.trainer.max_epochs and fid.guidance_scale == 1.0
    assert fid.num_samples >= 5000
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        deep = compose("train", ["experiment=dit_conditioning_deep"], return_hydra_config=True)
    assert grids["deep"]["model.net.conditioning"] == ["adaln_zero", "adaln"]
    assert not cfg.hydra.sweeper.params and not deep.hydra.sweeper.params
    assert [g.experiment for g in repro.grids] == ["dit_conditioning", "dit_conditioning_deep"]
    assert deep.model.net.depth == 8 and deep.callbacks.fid == fid  # the same scoring
    assert deep.trainer.max_epochs * deep.trainer.limit_train_batches == 2400
    for conditioning in swept:
        net_cfg = {
            **cfg.model.net,
            "conditioning": conditioning,
            "depth": 1,
            "norm_layer": cfg.norm,
        }
        net = instantiate(net_cfg)
        out = net(torch.randn(2, 1, 28, 28), torch.tensor([0, 999]), torch.tensor([0, 9]))
        assert out.shape == (2, 1, 28, 28)
