"""Sweeps survive: failing, diverging and killed jobs are recorded; a rerun skips finished jobs,
redoes failed ones and resumes killed ones. Same seed, same metrics."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, TINY
from test_train import metrics_rows, run_cli

from normlab.config import _slug
from normlab.run import train
from normlab.sweep.callbacks import EXIT_JOBS_FAILED


def summary(sweep_dir) -> dict[str, dict[str, str]]:
    with open(sweep_dir / "summary.csv") as f:
        return {r["overrides"]: r for r in csv.DictReader(f)}


def test_failed_and_diverged_jobs_are_recorded_and_a_rerun_skips_finished_ones(tmp_path):
    args = ["-m", "norm=groupnorm", "norm.num_groups=2,4", "optim.optimizer.lr=0.001,100000.0",
            "batch=64", *TINY, "trainer.limit_train_batches=8",
            f"hydra.sweep.dir={tmp_path}"]  # fmt: skip
    proc = run_cli(*args, check=False)
    assert proc.returncode == EXIT_JOBS_FAILED, proc.stderr[-3000:]
    assert f"error: 1 diverged, 2 failed of 4 jobs ({tmp_path}/summary.csv)" in proc.stderr
    rows = summary(tmp_path)
    status = {(o.split()[1], o.split()[2]): r["status"] for o, r in rows.items()}
    assert status == {
        ("norm.num_groups=2", "optim.optimizer.lr=0.001"): "ok",
        ("norm.num_groups=2", "optim.optimizer.lr=100000.0"): "diverged",
        ("norm.num_groups=4", "optim.optimizer.lr=0.001"): "failed",
        ("norm.num_groups=4", "optim.optimizer.lr=100000.0"): "failed",
    }
    failed = [r for r in rows.values() if r["status"] == "failed"]
    assert all("num_groups=4" in r["error"] and "6" in r["error"] for r in failed)
    diverged = next(r for r in rows.values() if r["status"] == "diverged")
    assert "test/acc" not in diverged or diverged["test/acc"] == ""  # stopped, not tested

    ok_dir = next(r["run_dir"] for r in rows.values() if r["status"] == "ok")
    ok_metrics = next((tmp_path / ok_dir.split("/")[-1]).rglob("metrics.csv"))
    mtime = ok_metrics.stat().st_mtime_ns
    proc = run_cli(*args, check=False)
    assert proc.returncode == EXIT_JOBS_FAILED  # the reused diverged job still counts
    assert ok_metrics.stat().st_mtime_ns == mtime  # the finished job was not run again
    assert (proc.stdout + proc.stderr).count("skipping finished job") == 2  # ok and diverged
    assert {o: r["status"] for o, r in summary(tmp_path).items()} == {
        o: r["status"] for o, r in rows.items()
    }


@pytest.mark.timeout(300)
def test_a_joblib_sweep_with_a_failed_job_runs_every_job_then_exits_non_zero(tmp_path):
    # jobs in worker processes report their outcome through a folder named in the environment
    proc = run_cli("-m", "hydra/launcher=joblib", "batch=16,0,8", *TINY, "test=false",
                   f"hydra.sweep.dir={tmp_path}", check=False)  # fmt: skip
    assert proc.returncode == EXIT_JOBS_FAILED, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: 1 failed of 3 jobs ({tmp_path}/summary.csv)"
    )
    status = {o.split()[0]: r["status"] for o, r in summary(tmp_path).items()}
    assert status == {"batch=16": "ok", "batch=0": "failed", "batch=8": "ok"}
    assert len(list(tmp_path.glob("*/csv/metrics.csv"))) == 2  # both other jobs trained
    assert not list(tmp_path.glob(".outcomes-*"))


@pytest.mark.timeout(300)
def test_multiruns_in_one_process_keep_their_own_outcomes_and_stop_at_a_bad_config(tmp_path):
    # a reproduction's grids run in one process: the second joblib multirun's workers must
    # report to its own outcome folder, not to the first's (loky keeps a pool for reuse)
    joblib = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TINY, "test=false"]
    runs = [["-m", "batch=16,8", *joblib, f"hydra.sweep.dir={tmp_path / 'a'}"],
            ["-m", "batch=16,0", *joblib, f"hydra.sweep.dir={tmp_path / 'b'}"],
            ["-m", "norm=no_such_norm", *TINY, f"hydra.sweep.dir={tmp_path / 'c'}"],
            ["-m", "batch=16", *TINY, f"hydra.sweep.dir={tmp_path / 'd'}"]]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "normlab.sweep.multiruns", json.dumps(runs)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]  # the bad config's exit, and nothing after
    assert proc.stdout.count("+ ") == 3 and not (tmp_path / "d").exists()
    assert [r["status"] for r in summary(tmp_path / "a").values()] == ["ok", "ok"]
    assert [r["status"] for r in summary(tmp_path / "b").values()] == ["ok", "failed"]
    assert f"error: 1 failed of 2 jobs ({tmp_path / 'b'}/summary.csv)" in proc.stderr
    assert "Could not find 'norm/no_such_norm'" in proc.stderr


def test_multiruns_exit_with_the_first_stopping_code_else_jobs_failed_if_any(monkeypatch):
    from normlab.sweep import multiruns

    for codes, expected, ran in (([0, 0], 0, 2), ([0, EXIT_JOBS_FAILED, 0], EXIT_JOBS_FAILED, 3),
                                 ([EXIT_JOBS_FAILED, 130, 0], 130, 2), ([2, 0], 2, 1)):  # fmt: skip
        calls = []
        monkeypatch.setattr(multiruns, "run", lambda args, codes=codes, calls=calls:
                            calls.append(args) or codes[len(calls) - 1])  # fmt: skip
        assert multiruns.main([[str(i)] for i in range(len(codes))]) == expected
        assert len(calls) == ran


def test_a_sweep_of_ok_jobs_exits_0_and_its_rerun_skips_them_without_loading_torch(tmp_path):
    args = ["-m", "batch=16", *TINY, "test=false", f"hydra.sweep.dir={tmp_path}"]
    proc = run_cli(*args)
    assert proc.returncode == 0 and "error:" not in proc.stderr
    assert [r["status"] for r in summary(tmp_path).values()] == ["ok"]
    # the rerun: every job finished, so nothing to train and no torch (a reproduction's second
    # invocation launches one such multirun per arm)
    again = subprocess.run([sys.executable, "-X", "importtime", "train.py", *args], cwd=REPO,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    said = again.stdout + again.stderr
    assert again.returncode == 0 and "skipping finished job" in said, again.stderr[-3000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines()
                if line.startswith("import time:")]  # fmt: skip
    assert "hydra" in imported and "torch" not in imported


def test_a_reproduction_goes_on_when_some_jobs_of_its_sweep_failed(tmp_path, monkeypatch):
    from normlab.analysis import sweep

    unused = lambda *_: None  # noqa: E731  (the analysis is not reached)
    repro = sweep.Reproduction("r", "r", (sweep.Grid("", "bn_lenet"),), sweep.Budget((), ""),
                               sweep.Budget((), ""), unused, unused)  # fmt: skip
    for code, fine in ((0, True), (EXIT_JOBS_FAILED, True), (1, False)):
        monkeypatch.setattr(sweep, "run_child", lambda *a, code=code: code)
        if fine:
            sweep.run(repro, quick=True, root=tmp_path, jobs=1, log=lambda _: None)
        else:
            with pytest.raises(RuntimeError, match="code 1"):
                sweep.run(repro, quick=True, root=tmp_path, jobs=1, log=lambda _: None)


@pytest.mark.slow
def test_a_killed_sweep_resumes_its_interrupted_job(tmp_path):
    args = [sys.executable, "train.py", "-m", "norm=batchnorm,none", "batch=64",
            "trainer.max_epochs=2", "trainer.limit_train_batches=30", "trainer.limit_val_batches=2",
            "trainer.limit_test_batches=2", "callbacks.last_checkpoint.every_n_train_steps=5",
            f"hydra.sweep.dir={tmp_path}"]  # fmt: skip
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list(tmp_path.glob("0_*/checkpoints/last.ckpt")):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert [r["status"] for r in summary(tmp_path).values()] == ["running"]
    subprocess.run(args, cwd=REPO, check=True, capture_output=True, timeout=600)
    rows = summary(tmp_path)
    assert [r["status"] for r in rows.values()] == ["ok", "ok"]
    log = next(tmp_path.glob("0_*/train.log")).read_text()
    assert "was running: resuming from" in log


def test_same_seed_same_metrics_and_a_null_seed_is_picked_and_logged(compose, tmp_path):
    def run(name: str, seed: str) -> tuple[dict, list]:
        cfg = compose(["batch=32", *TINY, f"seed={seed}"], tmp_path / name)
        result, _ = train(cfg)
        return result, [{k: v for k, v in r.items() if k != "epoch"} for r in
                        metrics_rows(tmp_path / name)]  # fmt: skip

    a, rows_a = run("a", "7")
    b, rows_b = run("b", "7")
    assert a["metrics"] == b["metrics"] and rows_a == rows_b
    c, _ = run("c", "null")
    assert isinstance(c["seed"], int)
    hparams = (tmp_path / "c" / "csv" / "hparams.yaml").read_text()
    assert f"seed: {c['seed']}" in hparams


def test_job_dirs_of_overrides_that_differ_past_the_cut_are_distinct():
    # a sweep's job dir is <num>_<overrides>, cut at 80 characters: a grid grown by one key
    # must not put a new job into the dir of an earlier job with the same number and prefix
    prefix = "batch=32,experiment=ln_placement,optim.optimizer.lr=0.001,optim.warmup_steps=0,"
    a, b = _slug(prefix + "placement=post"), _slug(prefix + "placement=post,seed=43")
    assert a != b and len(a) == len(b) == 80
    assert a == _slug(prefix + "placement=post")  # the same job finds its dir again
    assert _slug("norm=batchnorm,batch=2") == "norm=batchnorm,batch=2"  # short: unchanged
    assert _slug("a b") != _slug("a_b")  # changed characters: hashed too


def test_a_summary_row_is_replaced_by_the_same_job_in_another_order_or_run_dir(tmp_path):
    """One row per job: the same overrides in another order, or a new job written into the
    same run dir, replace the old row instead of adding one the analysis would count twice."""
    from normlab.sweep import summary

    summary.update_row(tmp_path, {"job": 0, "overrides": "a=1 b=2", "status": "ok",
                                  "run_dir": "d0"})  # fmt: skip
    summary.update_row(tmp_path, {"job": 1, "overrides": "a=2 b=2", "status": "ok",
                                  "run_dir": "d1"})  # fmt: skip
    summary.update_row(tmp_path, {"job": 0, "overrides": "b=2 a=1", "status": "failed",
                                  "run_dir": "d0"})  # fmt: skip
    summary.update_row(tmp_path, {"job": 1, "overrides": "a=3 b=2", "status": "ok",
                                  "run_dir": "d1"})  # fmt: skip
    rows = summary.read_summary(tmp_path)
    assert [(r["overrides"], r["status"]) for r in rows] == [("b=2 a=1", "failed"),
                                                             ("a=3 b=2", "ok")]  # fmt: skip
    assert summary.previous_row(tmp_path, "a=1 b=2")["status"] == "failed"
    assert summary.previous_row(tmp_path, "a=2 b=2") is None


def test_a_max_steps_sweep_ends_every_job_with_numbers(tmp_path):
    """max_steps inside an epoch: each job validates at its last step, its summary row has the
    last train loss and val numbers, the epoch line shows the step budget, and no warning says
    the monitored key is missing."""
    args = ["-m", "norm=batchnorm,groupnorm", "batch=32", *TINY, "trainer.limit_train_batches=6",
            "trainer.max_steps=3", "trainer.log_every_n_steps=50", "progress=epoch",
            f"hydra.sweep.dir={tmp_path}"]  # fmt: skip
    proc = run_cli(*args)
    out = proc.stdout + proc.stderr
    assert out.count("epoch 1/1  step 3/3  train/acc ") == 2, out[-3000:]
    assert "could not find the monitored key" not in out
    rows = summary(tmp_path).values()
    assert len(rows) == 2
    for row in rows:
        assert all(row[k] not in ("", "nan") for k in ("train/loss", "val/loss", "val/acc"))
    md = (tmp_path / "summary.md").read_text()
    assert "| train/acc | train/loss | val/acc | val/loss |" in md


def test_a_run_says_its_dir_first_and_a_multirun_its_summary_last(tmp_path):
    proc = run_cli("-m", "norm=batchnorm,none", "batch=32", *TINY, "test=false",
                   f"hydra.sweep.dir={tmp_path}")  # fmt: skip
    run_dirs = [r["run_dir"] for r in summary(tmp_path).values()]
    for run_dir in run_dirs:
        assert f"run dir: {run_dir}\n" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == (
        f"summary: {tmp_path / 'summary.md'} (and summary.csv)"
    )
    single = run_cli("batch=32", *TINY, "test=false", f"hydra.run.dir={tmp_path / 'one'}")
    lines = [line for line in single.stdout.splitlines() if "normlab." in line]
    assert lines[0].endswith(f"run dir: {tmp_path / 'one'}"), single.stdout[-2000:]


class Loader:
    """A config loader (a sweeper test's): a job's config is its overrides; bad=... fails."""

    def __init__(self):
        self.calls = []

    def load_sweep_config(self, master_config, sweep_overrides):
        from omegaconf import OmegaConf

        self.calls.append(tuple(sweep_overrides))
        if any(o.startswith("bad=") for o in sweep_overrides):
            raise ValueError(f"cannot compose {sweep_overrides}")
        return OmegaConf.create({"job": list(sweep_overrides)})


def test_the_sweeper_composes_each_job_once_and_a_bad_job_still_fails_before_any_runs(
    tmp_path, monkeypatch
):
    import pickle

    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext
    from omegaconf import OmegaConf

    plugins = Plugins.instance()  # Hydra's scan loads the sweeper (and reloads its base) first
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    from hydra_plugins.normlab_sweeper.normlab_sweeper import ComposeOnceSweeper

    class Launcher(BasicLauncher):  # as Hydra's: composes each job through the context's loader
        def __init__(self, hydra_context, task_function, config):
            self.context, self.master, self.ran = hydra_context, config, []

        def launch(self, job_overrides, initial_job_idx):
            for overrides in job_overrides:
                cfg = self.context.config_loader.load_sweep_config(self.master, list(overrides))
                self.ran.append(list(cfg.job))
            return []

    class Elsewhere:  # a launcher whose jobs compose in their own processes (joblib, submitit)
        def __init__(self, hydra_context, task_function, config):
            pass

        def launch(self, job_overrides, initial_job_idx):
            return []

    monkeypatch.setattr(plugins, "instantiate_launcher", Launcher)

    def sweeper_of(max_batch_size=None):
        loader = Loader()
        master = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
        sweeper = ComposeOnceSweeper(max_batch_size=max_batch_size)
        sweeper.setup(hydra_context=HydraContext(config_loader=loader, callbacks=None),
                      task_function=lambda cfg: None, config=master)  # fmt: skip
        return sweeper, loader

    for size in (None, 1):  # one batch of every job, or a batch per job
        sweeper, loader = sweeper_of(size)
        sweeper.sweep(["a=1,2", "b=x"])
        assert loader.calls == [("a=1", "b=x"), ("a=2", "b=x")]  # once each, by the check
        assert sweeper.launcher.ran == [["a=1", "b=x"], ["a=2", "b=x"]]
    sweeper.launcher.launch([["a=3"]], 2)  # a job the check never saw is composed as before
    assert loader.calls[-1] == ("a=3",) and sweeper.launcher.ran[-1] == ["a=3"]
    # a launcher's worker processes get the plain loader, not the configs kept here
    assert type(pickle.loads(pickle.dumps(sweeper.hydra_context.config_loader))) is Loader

    sweeper, loader = sweeper_of()
    with pytest.raises(ValueError, match="cannot compose"):
        sweeper.sweep(["a=1,2", "bad=1"])
    assert sweeper.launcher.ran == []  # the check failed on the first job: nothing ran

    # a launcher that composes in its workers: the check composes and keeps nothing
    monkeypatch.setattr(plugins, "instantiate_launcher", lambda **kw: Elsewhere(**kw))
    sweeper, loader = sweeper_of()
    sweeper.sweep(["a=1,2"])
    assert loader.calls == [("a=1",), ("a=2",)]
    assert sweeper.hydra_context.config_loader._kept == {}


@pytest.mark.parametrize(
    "extra, sweeper",
    [([], "ComposeOnceSweeper"), (["hparams_search=lenet_optuna"], "OptunaSweeper")],
)
def test_train_sweeps_with_the_compose_once_sweeper_unless_another_is_chosen(
    compose, tmp_path, extra, sweeper
):
    from hydra.core.hydra_config import HydraConfig

    compose(extra, tmp_path)
    assert HydraConfig.get().sweeper._target_.endswith("." + sweeper)
