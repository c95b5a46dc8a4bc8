"""Run dirs are safe: one run at a time in a dir, one config's run in a dir (unless overwrite=true
moves it aside), a resume checked against its checkpoint before anything is written, and an
unwritable checkpoint dir found before training or said in one line when a save fails."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from conftest import REPO, TINY

from normlab.errors import ConfigError
from normlab.sweep.callbacks import EXIT_JOBS_FAILED

RUN = ["batch=32", *TINY, "test=false"]


def train(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    path = [str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}  # for BreakCheckpointDir
    return subprocess.run(
        [sys.executable, "train.py", *RUN, *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a failed run prints: exit 1, no traceback, one `error:` line, the last."""
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and proc.stderr.strip().splitlines()[-1] == lines[0], proc.stderr
    return lines[0]


def files(run_dir: Path) -> dict[str, bytes]:
    """Every file under run_dir and its bytes (the lock file says who holds the dir now)."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".run.lock"
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished batchnorm run; tests work on copies."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    proc = train(run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def _writable(folder: Path) -> bool:
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def set_read_only(folder: Path, read_only: bool = True) -> bool:
    """chmod, and as root (modes do not stop root) chattr +i; False when the dir stays writable."""
    if not read_only and shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(0o555 if read_only else 0o755)
    if read_only and _writable(folder) and shutil.which("chattr"):
        subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
    return _writable(folder) != read_only


class BreakCheckpointDir(pl.Callback):
    """Makes the checkpoint dir read-only when epoch `epoch` starts (+callbacks.x._target_=...)."""

    def __init__(self, dirpath: str, epoch: int = 1):
        self.dirpath, self.epoch = Path(dirpath), epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            assert set_read_only(self.dirpath)


@contextmanager
def holding(run_dir: Path) -> Iterator[str]:
    """Another process holds run_dir's lock; yields how a run names it. Killed at the end."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, pathlib; from normlab.run import rundir; "
         "rundir.lock(pathlib.Path(sys.argv[1])); print('locked', flush=True); sys.stdin.read()",
         str(run_dir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "locked\n", holder.stderr.read()
        yield f"run dir {run_dir} is in use by pid {holder.pid} on {socket.gethostname()} since "
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_a_second_run_in_a_locked_dir_fails_at_once_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    with holding(run_dir) as in_use:
        line = error_line(train(run_dir))
        assert line.startswith(f"error: {in_use}"), line
        assert [p.name for p in run_dir.iterdir()] == [".run.lock"]  # nothing written
    # the holder was killed: it left no stale lock
    line = error_line(train(run_dir, "batch=0"))  # fails on its config, before any training
    assert line == "error: batch must be a positive integer, got 0"


@pytest.mark.parametrize(
    "args",
    [["batch=0"], ["norm=batchnorm", "batch=1"]],  # before torch loads; in the preflight
    ids=["config", "preflight"],
)
def test_a_run_that_fails_before_training_leaves_no_run_dir(args, tmp_path):
    run_dir = tmp_path / "runs" / "day" / "run"
    error_line(train(run_dir, *args))
    assert not (tmp_path / "runs").exists()  # the run dir and the parents it made


def test_missing_data_is_three_short_lines_and_leaves_no_run_dir(tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    proc = train(tmp_path / "run", f"data.root={empty}", "data.download=false")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()[-3:]
    assert lines[0] == f"error: Fashion-MNIST files missing from {empty}/FashionMNIST/raw"
    assert lines[1].startswith("put there, each .gz or unpacked: train-images-idx3-ubyte ")
    assert lines[2].startswith("or point NORMLAB_DATA (or data.root) at a folder")
    assert not (tmp_path / "run").exists()


def test_a_resume_that_does_not_match_the_checkpoint_fails_and_changes_nothing(finished, tmp_path):
    run_dir = Path(shutil.copytree(finished, tmp_path / "run"))
    before = files(run_dir)
    line = error_line(train(run_dir, "norm=groupnorm", "ckpt_path=last"))
    assert line.startswith(
        f"error: ckpt_path=last: {run_dir}/checkpoints/last.ckpt does not match the config: "
        "norm._target_: normlab.norms.BatchNorm (checkpoint) vs normlab.norms.GroupNorm (config); "
    ), line
    assert files(run_dir) == before  # metrics.csv, .hydra/*.yaml, hparams.yaml, train.log


def test_another_config_in_a_run_dir_fails_unless_overwrite_moves_the_run_aside(finished, tmp_path):
    run_dir = Path(shutil.copytree(finished, tmp_path / "run"))
    before = files(run_dir)
    line = error_line(train(run_dir, "norm=groupnorm"))
    assert line.startswith(
        f"error: run dir {run_dir} holds a run of another config (norm._target_: "
        "normlab.norms.BatchNorm (run dir) vs normlab.norms.GroupNorm (config); "
    ), line
    assert line.endswith(f"to move that run to {run_dir}/.old-<time>/ and start anew"), line
    assert files(run_dir) == before

    proc = train(run_dir, "norm=groupnorm", "overwrite=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (old,) = run_dir.glob(".old-*")
    assert files(old) == before  # the earlier run, whole
    assert "_target_: normlab.norms.GroupNorm" in (run_dir / ".hydra" / "config.yaml").read_text()
    log = (run_dir / "train.log").read_text()
    assert "normlab.run.rundir][INFO] - overwrite=true: moved" in log
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["normlab_config"]["norm"]["_target_"] == "normlab.norms.GroupNorm"


def test_a_sweep_job_whose_dir_is_in_use_is_not_run(tmp_path):
    sweep = tmp_path / "sweep"
    with holding(sweep / "job") as in_use:
        proc = subprocess.run(
            [sys.executable, "train.py", "-m", *RUN, f"hydra.sweep.dir={sweep}",
             "hydra.sweep.subdir=job"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert proc.returncode == EXIT_JOBS_FAILED, proc.stderr[-3000:]
    assert (
        proc.stderr.strip().splitlines()[-1] == f"error: 1 failed of 1 jobs ({sweep}/summary.csv)"
    )
    assert f"] not run: {in_use}" in proc.stdout
    assert not (sweep / "job" / "csv").exists()  # nothing trained


def test_a_checkpoint_without_its_config_is_checked_by_its_state_dict(compose, tmp_path):
    from hydra.utils import instantiate

    from normlab.run.resume import check_checkpoint

    bn = instantiate(compose(["norm=batchnorm"], tmp_path).model)
    cfg = compose(["norm=groupnorm", "ckpt_path=old.ckpt"], tmp_path)
    with pytest.raises(ConfigError) as err:
        check_checkpoint(cfg, instantiate(cfg.model), {"state_dict": bn.state_dict()}, "old.ckpt")
    message = str(err.value)
    assert message.startswith("ckpt_path=old.ckpt: old.ckpt does not fit the model the config")
    assert "; net.classifier.norm3.running_mean: [120] (checkpoint) vs absent (model); " in message
    assert message.endswith("; and 8 more")  # 3 buffers of each of 4 BatchNorms; 4 are named
    cfg = compose(["norm=batchnorm", "ckpt_path=old.ckpt"], tmp_path)
    check_checkpoint(cfg, instantiate(cfg.model), {"state_dict": bn.state_dict()}, "old.ckpt")


@pytest.fixture
def can_make_read_only(tmp_path):
    folder = tmp_path / "probe"
    folder.mkdir()
    if not set_read_only(folder):
        pytest.skip("cannot make a dir read-only here")
    set_read_only(folder, False)


def test_a_read_only_checkpoint_dir_fails_before_training(tmp_path, can_make_read_only):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    set_read_only(run_dir / "checkpoints")
    try:
        line = error_line(train(run_dir))
    finally:
        set_read_only(run_dir / "checkpoints", False)
    assert line.startswith(f"error: cannot write to {run_dir}/checkpoints: "), line
    assert not (run_dir / "csv").exists()  # nothing trained


def test_a_failing_save_fails_with_one_line_and_keeps_the_last_checkpoint(
    tmp_path, can_make_read_only
):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    try:
        proc = train(run_dir, "trainer.max_epochs=2", f"+callbacks.ro.dirpath={checkpoints}",
                     "+callbacks.ro._target_=test_run_dirs.BreakCheckpointDir")  # fmt: skip
    finally:
        set_read_only(checkpoints, False)
    line = error_line(proc)
    assert line.startswith(f"error: cannot save {checkpoints}/last.ckpt: cannot write to "), line
    last = torch.load(checkpoints / "last.ckpt", weights_only=False)
    assert last["global_step"] == 2  # the first epoch's checkpoint is intact


def test_ckpt_path_last_with_nothing_to_resume_fails_unless_last_or_new(tmp_path):
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    assert error_line(train(run_dir, "ckpt_path=last")) == (
        f"error: ckpt_path=last: nothing to resume in {run_dir} (no {last}); name the run dir "
        "to resume (hydra.run.dir=<dir>), or ckpt_path=last_or_new to start a new run when "
        "there is none"
    )
    assert not last.parent.exists()  # nothing trained
    new = train(run_dir, "ckpt_path=last_or_new")
    assert new.returncode == 0 and last.is_file(), new.stderr[-3000:]
    again = train(run_dir, "ckpt_path=last_or_new")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"Restoring states from the checkpoint path at {last}" in again.stdout + again.stderr


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupted_run_says_where_it_is_and_how_to_continue(tmp_path, sig):
    run_dir = tmp_path / "run"
    kill = ["+callbacks.kill._target_=test_resume.KillAt",
            "+callbacks.kill.hook=on_train_batch_start", "+callbacks.kill.batch=3",
            f"+callbacks.kill.sig={sig}"]  # fmt: skip
    args = ["trainer.limit_train_batches=4", "callbacks.last_checkpoint.every_n_train_steps=2"]
    proc = train(run_dir, *args, *kill)
    assert proc.returncode == 128 + signal.Signals[sig], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    where, command = proc.stderr.strip().splitlines()[-2:]
    assert proc.stderr.count("continue with:") == 1  # one hint per interruption
    assert where == f"interrupted ({sig}): run dir {run_dir}, resumable from checkpoints/last.ckpt"
    argv = shlex.split(command.removeprefix("continue with: "))
    assert argv[:2] == ["python", "train.py"] and command.startswith("continue with: ")
    assert argv[2:] == [*RUN, *args, *kill, f"hydra.run.dir={run_dir}", "ckpt_path=last"]
    resumed = subprocess.run(
        [sys.executable, *argv[1:2], *(a for a in argv[2:] if a not in kill)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "exists and is not empty" not in resumed.stderr  # its own checkpoints: no warning
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 4
