"""Bad input, one table: each command fails before training, exit code != 0, a message naming
the cause, and no traceback."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from normlab.norms import available_norms, create_norm
from normlab.norms.base import NormConfigError

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# (case, overrides, words the message must contain)
CASES = [
    ("unknown norm", ["norm=nope"], ["norm/nope", "batchnorm", "groupnorm"]),
    ("unknown placement", ["model=transformer", "placement=nope"], ["placement/nope", "deepnorm"]),
    ("unknown model", ["model=resnet9000"], ["model/resnet9000", "lenet", "transformer"]),
    ("unknown experiment", ["experiment=nope"], ["experiment/nope", "dit"]),
    ("batch zero", ["batch=0"], ["batch must be a positive integer, got 0"]),
    ("batch negative", ["batch=-4"], ["batch must be a positive integer, got -4"]),
    ("batch not a number", ["batch=abc"], ["batch must be a positive integer, got 'abc'"]),
    ("batchnorm with batch 1", ["norm=batchnorm", "batch=1"],
     ["net.classifier.norm3", "batch=1", "more than 1 value per channel", "(1, 120)"]),
    ("groups not dividing channels", ["norm=groupnorm", "norm.num_groups=4"],
     ["features.norm1", "num_groups=4", "6"]),
    ("pRMSNorm p = 0", ["norm=prmsnorm", "norm.p=0"], ["p must be in (0, 1], got 0"]),
    ("pRMSNorm p > 1", ["norm=prmsnorm", "norm.p=1.5"], ["p must be in (0, 1], got 1.5"]),
    ("negative eps", ["norm=layernorm", "norm.eps=-1"],
     ["eps must be a finite number > 0, got -1"]),
    ("zero eps", ["norm=batchnorm", "norm.eps=0"], ["eps must be a finite number > 0, got 0"]),
    ("NaN eps", ["norm=layernorm", "norm.eps=nan"], ["norm.eps must be a finite number, got nan"]),
    ("eps of the wrong type", ["norm=layernorm", "norm.eps=small"], ["eps", "'small'"]),
    ("unknown norm argument", ["norm=batchnorm", "+norm.groups=2"], ["unknown argument", "groups"]),
    ("negative learning rate", ["optim.optimizer.lr=-0.1"], ["optim.optimizer.lr", "-0.1"]),
    ("infinite learning rate", ["optim.optimizer.lr=inf"],
     ["optim.optimizer.lr must be a finite number, got inf"]),
    ("NaN learning rate", ["optim.optimizer.lr=nan"],
     ["optim.optimizer.lr must be a finite number, got nan"]),
    ("NaN in a list", ["+extra=[1,nan]"], ["extra[1] must be a finite number, got nan"]),
    ("seed not an integer", ["seed=abc"], ["seed must be an integer or null, got 'abc'"]),
    ("negative thread count", ["num_threads=-2"],
     ["num_threads must be a positive integer, got -2"]),
    ("negative warmup", ["optim.warmup_steps=-5"], ["optim.warmup_steps", "-5"]),
    ("zero epochs", ["trainer.max_epochs=0"], ["trainer.max_epochs", "0"]),
    ("unknown activation", ["model.net.activation=tanh"], ["activation", "tanh", "sigmoid"]),
    ("unknown pooling", ["model.net.pool=min"], ["model.net.pool='min'", "avg", "max"]),
    ("instance norm without spatial extent", ["norm=instancenorm", "model.net.fc_norm=${norm}"],
     ["classifier.norm3", "instancenorm", "(256, 120)"]),
    ("instance norm in the MLP", ["model=mlp", "norm=instancenorm"],
     ["layers.norm1", "instancenorm", "no spatial extent"]),
    ("transformer depth 0", ["model=transformer", "model.net.depth=0"], ["depth", "0"]),
    ("deepnorm arch it has no constants for", ["model=transformer", "placement=deepnorm",
     "placement.arch=seq2seq"], ["seq2seq", "encoder", "decoder"]),
    ("batch larger than the training split", ["batch=100000"],
     ["batch=100000", "55000 training images per process", "data.val_size=5000"]),
    ("negative validation size", ["data.val_size=-1"],
     ["data.val_size must be in [0, 60000)", "got -1"]),
    ("no training batches per epoch", ["model=transformer", "data.train_batches_per_epoch=0"],
     ["data.train_batches_per_epoch must be a positive integer, got 0"]),
    ("no training text", ["model=transformer", "data.val_fraction=1.0"],
     ["data.val_fraction must be in (0, 1)", "got 1.0"]),
    ("missing data dir offline", ["data.root=/nonexistent/normlab", "data.download=false"],
     ["/nonexistent/normlab/FashionMNIST/raw", "NORMLAB_DATA"]),
    ("resume from a checkpoint that does not exist", ["ckpt_path=/nonexistent/last.ckpt"],
     ["ckpt_path", "/nonexistent/last.ckpt"]),
]  # fmt: skip


def fail(args: list[str], tmp_path: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained
    return proc.stderr


@pytest.mark.parametrize("case,args,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_before_training(case, args, words, tmp_path):
    message = fail(args, tmp_path)
    for word in words:
        assert word in message, f"{case}: {word!r} not in:\n{message}"


@pytest.mark.parametrize("eps", [0, 0.0, -1e-5, math.nan, math.inf])
@pytest.mark.parametrize("name", [n for n in available_norms() if n != "none"])
def test_every_norm_family_rejects_an_eps_that_is_not_finite_and_positive(name, eps):
    kwargs = {"num_groups": 2} if name == "groupnorm" else {}
    with pytest.raises(NormConfigError, match=f"eps must be a finite number > 0, got {eps!r}"):
        create_norm(name, 8, eps=eps, **kwargs)


def test_a_diverged_run_exits_1_with_one_line_and_keeps_no_best_checkpoint(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "train.py", "optim.optimizer.lr=1e30", "batch=16", "trainer.max_epochs=1",
         "trainer.limit_train_batches=3", "trainer.limit_val_batches=1", f"hydra.run.dir={run}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: run diverged: loss ") and last.endswith(f" ({run})"), last
    assert "at step 2 is > 10.0 x first" in last  # the first step's update blew the weights up
    assert not (run / "checkpoints" / "best.ckpt").exists()  # validation ran after the stop
    assert "no best checkpoint is saved" in (run / "train.log").read_text()


def test_a_batch_larger_than_each_process_share_of_the_training_split_is_named():
    from normlab.data.fashion_mnist import FashionMNISTDataModule
    from normlab.errors import DataError

    module = FashionMNISTDataModule(root=str(DATA), batch_size=30000)  # 55000 images: one batch
    with pytest.raises(DataError, match="27500 training images per process .* over 2 processes"):
        module.check_sizes(world_size=2)


def test_truncated_and_corrupted_data_files_are_named(tmp_path):
    root = tmp_path / "data"
    shutil.copytree(DATA / "FashionMNIST", root / "FashionMNIST")
    target = root / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte"
    target.write_bytes(target.read_bytes()[:-100])  # truncated
    message = fail([f"data.root={root}", "data.download=false"], tmp_path)
    assert str(target) in message and "corrupted or truncated" in message
    assert "Delete it" in message

    target.write_bytes(b"\x00" * 10008)  # right size, wrong bytes
    message = fail([f"data.root={root}", "data.download=false"], tmp_path)
    assert str(target) in message and "sha256" in message


def test_a_failed_download_leaves_nothing_half_written(tmp_path, monkeypatch):
    from normlab.data import fashion_mnist
    from normlab.errors import DataError

    def broken_download(root, train, download):  # writes part of a file, then the link drops
        raw = Path(root) / "FashionMNIST" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        (raw / "train-images-idx3-ubyte").write_bytes(b"\x00" * 1000)
        raise OSError("connection reset")

    monkeypatch.setattr(fashion_mnist, "FashionMNIST", broken_download)
    module = fashion_mnist.FashionMNISTDataModule(root=str(tmp_path))
    with pytest.raises(DataError, match="connection reset"):
        module.prepare_data()
    assert list(tmp_path.rglob("*ubyte*")) == []


def test_a_bad_value_fails_before_torch_is_imported(tmp_path):
    # plain config checks run before torch and Lightning load (seconds of imports)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "train.py", "batch=0",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "error: batch must be a positive integer, got 0" in proc.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]  # fmt: skip
    assert "hydra" in imported and "torch" not in imported and "lightning" not in imported
