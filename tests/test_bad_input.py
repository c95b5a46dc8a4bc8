"""Bad input, one table: each command fails before training, exit code != 0, a message naming
the cause, and no traceback (a case that needs torch to be found: its message, in this
process, see IN_PROCESS)."""

from __future__ import annotations

import csv
import inspect
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TINY
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from normlab.config import name_config_keys
from normlab.errors import ConfigError
from normlab.norms import available_norms, create_norm, norm_class
from normlab.norms.base import NormConfigError

# (case, overrides, words the message must contain)
CASES = [
    ("unknown norm", ["norm=nope"], ["norm/nope", "batchnorm", "groupnorm"]),
    ("unknown placement", ["model=transformer", "placement=nope"], ["placement/nope", "deepnorm"]),
    ("unknown model", ["model=resnet9000"], ["model/resnet9000", "lenet", "transformer", "lstm"]),
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
    ("NaN in a list", ["+extra=[1,nan]"], ["extra[1] must be a finite number, got nan"]),
    ("negative warmup", ["optim.warmup_steps=-5"], ["optim.warmup_steps", "-5"]),
    ("zero epochs", ["trainer.max_epochs=0"], ["trainer.max_epochs", "0"]),
    ("unknown activation", ["model.net.activation=tanh"], ["activation", "tanh", "sigmoid"]),
    ("unknown pooling", ["model.net.pool=min"], ["model.net.pool='min'", "avg", "max"]),
    ("instance norm without spatial extent", ["norm=instancenorm", "model.net.fc_norm=${norm}"],
     ["classifier.norm3", "instancenorm", "(N, 120)", "no spatial extent"]),
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


def one_line(args: list[str], tmp_path: Path, code: int = 1) -> str:
    """Run train.py; assert the exit code, no traceback, nothing trained, and return the last
    stderr line, which must be the one `error: ...` line."""
    proc = subprocess.run(
        [sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), proc.stderr[-3000:]
    return last


# Cases whose check needs torch (it builds the data, the model or its norms): their message is
# found in this process (error_in_process), since a command of its own pays ~8 s of imports for
# it. Every other case, and one of each table that needs torch ("groups not dividing channels",
# "DiT depth zero"), runs as the command itself.
IN_PROCESS = {
    "batchnorm with batch 1", "pRMSNorm p = 0", "pRMSNorm p > 1", "negative eps", "zero eps",
    "eps of the wrong type", "unknown norm argument", "unknown activation", "unknown pooling",
    "instance norm without spatial extent", "instance norm in the MLP", "transformer depth 0",
    "deepnorm arch it has no constants for", "batch larger than the training split",
    "negative validation size", "no training batches per epoch", "no training text",
    "missing data dir offline", "resume from a checkpoint that does not exist",
    "batchnorm in the lstm", "context too long for the memory", "transformer depth null",
    "transformer heads not dividing its width", "GPT QK-norm that is not one",
    "DiT patches not tiling the image", "DiT QK-norm that is not one",
    "diffusion EMA decay of 1 or more", "diffusion betas out of order",
}  # fmt: skip


def error_in_process(args: list[str], tmp_path: Path, compose) -> str:
    """The error train.py exits with for `args`, found in this process: the config the command
    composes, its checks before torch, then the run (normlab.run.main), as train.py runs
    them; asserts that nothing trained."""
    import normlab.run
    from normlab import config

    run = tmp_path / "run"
    cfg = compose([*args, "hydra.mode=RUN"], run)  # as `python train.py ARGS` runs (not -m)
    with pytest.raises(SystemExit) as stopped:
        normlab.run.main(cfg, validated=config.check_or_exit(cfg))
    assert not (run / "checkpoints").exists()  # nothing trained
    return str(stopped.value.code)


# (case, overrides, a regular expression the whole last stderr line must match)
ONE_LINE = [
    ("NaN learning rate", ["optim.optimizer.lr=nan"],
     r"error: optim\.optimizer\.lr must be a finite number, got nan"),
    ("seed not an integer", ["seed=abc"], r"error: seed must be an integer or null, got 'abc'"),
    ("negative thread count", ["num_threads=-2"],
     r"error: num_threads must be a positive integer, got -2"),
    ("transformer on images", ["model=transformer", "data=fashion_mnist"],
     r"error: model=transformer does not train on data=fashion_mnist: it takes data=shakespeare"),
    ("lenet on text", ["model=lenet", "data=shakespeare"],
     r"error: model=lenet does not train on data=shakespeare: it takes data=fashion_mnist"),
    ("lstm on images", ["model=lstm", "data=fashion_mnist"],
     r"error: model=lstm does not train on data=fashion_mnist: it takes data=shakespeare"),
    ("batchnorm in the lstm", ["model=lstm", "norm=batchnorm"],
     r"error: norm=batchnorm cannot be used in model=lstm \(layer layers\.0\.norm_x, 1024 "
     r"features\): an LSTM normalizes each sample's own features at every time step .* use one "
     r"of (\w+, )*layernorm, none, prmsnorm, rmsnorm"),
    ("placement on a model without residual blocks", ["placement=post"],
     r"error: placement=post has no effect on model=lenet: placement applies only to the "
     r"Transformer models whose residual blocks read it \(model=transformer\)"),
    ("context too long for the memory", ["model=transformer", "model.net.ctx=100000"],
     r"error: a forward pass with batch=64 needs about \d+\.\d GiB \(attention "
     r"batch\*heads\*ctx\^2\*4 = 64\*4\*100000\^2\*4 = 9536\.7 GiB, activations .* GiB\) "
     r"but \d+\.\d GiB of memory is available \(MemAvailable\): lower the batch or the "
     r"model's size \(model\.net\.ctx, \.\.\.\)"),
    ("transformer with a DiT size", ["model=transformer", "size=dit/S/2"],
     r"error: size=dit/S/2 is a shape of model=dit, not of model=transformer: the sizes of "
     r"model=transformer are conf/size/transformer/<name>\.yaml \(size=transformer/<name>\)"),
    ("data ctx longer than the transformer's", ["model=transformer", "data.ctx=65"],
     r"error: data\.ctx=65 is longer than the model's context length model\.net\.ctx=64"),
    ("transformer depth null", ["model=transformer", "model.net.depth=null"],
     r"error: .*model\.net\.depth must be a positive integer, got None"),
    ("transformer heads not dividing its width", ["model=transformer", "model.net.n_heads=3"],
     r"error: model\.net\.n_heads=3 does not divide model\.net\.d_model=64"),
    ("GPT QK-norm that is not one", ["model=transformer", "+norm@model.net.qk_norm=batchnorm"],
     r"error: model\.net\.qk_norm='batchnorm' is not a QK-norm \(a norm layer normalizing each "
     r"head vector over its own features\); valid: dyt, layernorm, none, prmsnorm, rmsnorm or "
     r"None \(none\)"),
    ("QK-norm given a norm's name", ["model=transformer", "model.net.qk_norm=rmsnorm"],
     r"error: model\.net\.qk_norm='rmsnorm' is a name: a norm slot takes a norm config, "
     r"\+norm@model\.net\.qk_norm=rmsnorm \(or model\.net\.qk_norm=\$\{norm\}\)"),
    ("diffusion EMA decay of 1 or more", ["experiment=dit", "model.ema_decay=1.5"],
     r"error: model\.ema_decay must be in \[0, 1\), got 1\.5"),
    ("diffusion betas out of order", ["experiment=dit", "model.beta_start=0.1",
     "model.beta_end=0.01"], r"error: model\.beta_start=0\.1, model\.beta_end=0\.01: need "
     r"0 < start < end < 1"),
    ("DiT depth zero", ["experiment=dit", "model.net.depth=0"],
     r"error: model\.net\.depth must be a positive integer, got 0"),
    ("DiT patches not tiling the image", ["experiment=dit", "model.net.patch_size=5"],
     r"error: model\.net\.patch_size=5 does not divide model\.net\.input_size=28"),
    ("DiT QK-norm that is not one", ["experiment=dit", "+norm@model.net.qk_norm=layernorm2d"],
     r"error: model\.net\.qk_norm='layernorm2d' is not a QK-norm \(a norm layer normalizing "
     r"each head vector over its own features\); valid: dyt, layernorm, none, prmsnorm, rmsnorm "
     r"or None \(none\)"),
]  # fmt: skip


@pytest.mark.parametrize("case,args,line", ONE_LINE, ids=[c[0] for c in ONE_LINE])
def test_bad_input_is_one_error_line(case, args, line, tmp_path, compose):
    if case in IN_PROCESS:
        last = error_in_process(args, tmp_path, compose)
    else:
        last = one_line(args, tmp_path)
    assert re.fullmatch(line, last), f"{case}:\n{last}"


def test_each_case_found_in_process_is_a_case_of_the_tables():
    assert IN_PROCESS <= {c[0] for c in CASES + ONE_LINE}


def test_an_unreachable_tracking_server_fails_at_once_naming_it(tmp_path):
    """As fast as another error of the same stage (after torch loads: `ckpt_path=last` with
    nothing to resume), timed in the same run: MLflow's client alone retried for minutes."""
    uri = "http://127.0.0.1:9"  # loopback, the discard port: nothing listens
    start = time.monotonic()
    last = one_line(["logger=[csv,mlflow]", f"logger.mlflow.tracking_uri={uri}"], tmp_path)
    took = time.monotonic() - start
    start = time.monotonic()
    one_line(["ckpt_path=last"], tmp_path / "baseline")
    assert took < 3 * (time.monotonic() - start)
    assert last == (
        f"error: logger.mlflow.tracking_uri={uri}: cannot reach the tracking server: Connection "
        "refused (connect timeout 10 s); start it, or use another tracking_uri"
    )


def test_a_checkpoint_that_cannot_be_resumed_is_named(tmp_path):
    import torch

    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    full = tmp_path / "full.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "global_step": 3}, full)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    no_step = tmp_path / "no_step.ckpt"
    torch.save({"state_dict": {}, "epoch": 0, "optimizer_states": []}, no_step)
    unreadable = ("is not a readable checkpoint (truncated or not a .ckpt file: no zip directory "
                  "at its end)")  # fmt: skip
    for path, tail in ((text, unreadable), (truncated, unreadable),
                       (no_step, "is not a checkpoint a run can resume from: it has no "
                                 "global_step (a weights-only or foreign file?)")):  # fmt: skip
        last = one_line([f"ckpt_path={path}"], tmp_path)
        assert last == f"error: ckpt_path={path}: {path} {tail}"


def run_sweep(sweep_dir: Path, code: int = 0) -> str:
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", "batch=16", *TINY, "test=false",
         f"hydra.sweep.dir={sweep_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr  # a multirun logs to stdout


def rows(sweep_dir: Path) -> dict[str, dict[str, str]]:
    with open(sweep_dir / "summary.csv", newline="") as f:  # by the first override: batch=16
        return {r["overrides"].split()[0]: r for r in csv.DictReader(f)}


def test_a_damaged_sweep_summary_is_backed_up_and_rebuilt_from_the_job_dirs(tmp_path):
    damaged = "job,overrides,status,run_dir\n0,batch=16,ok,0_batch=16\n1,batch=8,runn"  # cut
    (tmp_path / "summary.csv").write_text(damaged)
    other = tmp_path / "1_batch=8" / ".hydra"  # a job of an earlier invocation
    other.mkdir(parents=True)
    (other / "overrides.yaml").write_text("- batch=8\n")
    output = run_sweep(tmp_path)
    (backup,) = tmp_path.glob("summary.csv.damaged-*")
    assert backup.read_text() == damaged
    assert (
        f"{tmp_path / 'summary.csv'} is damaged: line 3 has the wrong number of fields; "
        f"moved it to {backup} and rebuilt 2 rows from the job dirs" in output
    )
    status = {o: r["status"] for o, r in rows(tmp_path).items()}
    assert status == {"batch=16": "ok", "batch=8": "failed"}  # batch=8 runs again next time


def test_a_truncated_last_checkpoint_of_a_sweep_job_is_moved_aside_and_the_job_restarts(
    tmp_path,
):
    run_sweep(tmp_path)
    (job,) = tmp_path.glob("0_*")
    last = job / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])  # cut while it was copied
    table = rows(tmp_path)
    table["batch=16"]["status"] = "running"  # the job was killed
    with open(tmp_path / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table["batch=16"]))
        writer.writeheader()
        writer.writerows(table.values())
    output = run_sweep(tmp_path)
    (aside,) = job.glob("checkpoints/last.damaged-*.ckpt")
    assert f"last.ckpt: {last} is not a readable checkpoint" in output
    assert f"moved it to {aside}, running the job from scratch" in output
    assert rows(tmp_path)["batch=16"]["status"] == "ok"
    assert last.is_file() and aside.stat().st_size == 1000


def test_a_models_own_value_error_is_named_by_its_config_keys(compose, tmp_path):
    cfg = compose(["model=transformer", "model.net.n_heads=3"], tmp_path)
    with pytest.raises(InstantiationException) as info:
        instantiate(cfg.model)
    cause = info.value.__cause__
    assert type(cause) is ValueError  # the model speaks of its own arguments
    assert str(cause) == "n_heads=3 does not divide d_model=64"
    named = name_config_keys(info.value)
    assert isinstance(named, ConfigError)
    assert str(named) == "model.net.n_heads=3 does not divide model.net.d_model=64"


def test_only_a_value_error_naming_the_class_arguments_is_renamed():
    def failed(cause: Exception) -> InstantiationException:
        message = f"Error in call to target 'normlab.models.transformer.GPT':\n{cause!r}"
        err = InstantiationException(f"{message}\nfull_key: model.net")
        err.__cause__ = cause
        return err

    assert (
        str(name_config_keys(failed(ValueError("ctx must be >= 1"))))
        == "model.net.ctx must be >= 1"
    )
    assert name_config_keys(failed(ValueError("the context of depth"))) is None  # no argument
    assert name_config_keys(failed(ConfigError("depth must be"))) is None  # names itself
    assert name_config_keys(failed(TypeError("depth=None"))) is None
    assert name_config_keys(ValueError("depth must be")) is None  # not from instantiate


@pytest.mark.parametrize("case,args,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_before_training(case, args, words, tmp_path, compose):
    if case in IN_PROCESS:
        message = error_in_process(args, tmp_path, compose)
    else:
        message = fail(args, tmp_path)
    for word in words:
        assert word in message, f"{case}: {word!r} not in:\n{message}"


@pytest.mark.parametrize("eps", [0, 0.0, -1e-5, math.nan, math.inf])
@pytest.mark.parametrize(
    "name", [n for n in available_norms() if "eps" in inspect.signature(norm_class(n)).parameters]
)
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


def test_a_batch_larger_than_each_process_share_of_the_training_split_is_named(data_root):
    from normlab.data.fashion_mnist import FashionMNISTDataModule
    from normlab.errors import DataError

    module = FashionMNISTDataModule(
        root=str(data_root), batch_size=30000
    )  # 55000 images: one batch
    with pytest.raises(DataError, match="27500 training images per process .* over 2 processes"):
        module.check_sizes(world_size=2)


def test_truncated_and_corrupted_data_files_are_named(data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_root / "FashionMNIST", root / "FashionMNIST")
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
