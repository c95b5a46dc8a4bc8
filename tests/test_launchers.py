"""Multirun launchers and the Optuna sweeper, run for real on tiny budgets (2 jobs each)."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import REPO, TINY

# Imported by every job (PYTHONPATH): logs the job's torch thread count, so it lands in summary.csv.
THREADS_CALLBACK = """
import lightning.pytorch as pl
import torch


class LogThreads(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.log("train/threads", float(torch.get_num_threads()), on_step=False, on_epoch=True)
"""
SWEEP = [*TINY, "test=false", "batch=16"]


def run_sweep(tmp_path: Path, *args: str) -> list[dict[str, str]]:
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    (helpers / "log_threads.py").write_text(textwrap.dedent(THREADS_CALLBACK))
    env = {**os.environ, "PYTHONPATH": f"{helpers}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "train.py", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "sweep" / "summary.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(180)
def test_joblib_sweep_runs_two_jobs_with_a_share_of_the_cores_each(tmp_path):
    rows = run_sweep(
        tmp_path,
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "norm=batchnorm,groupnorm",
        "+callbacks.threads._target_=log_threads.LogThreads",
        *SWEEP,
    )
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert sorted(r["overrides"].split()[0] for r in rows) == ["norm=batchnorm", "norm=groupnorm"]
    share = max(1, (os.cpu_count() or 1) // 2)  # n_jobs=2: joblib's OMP_NUM_THREADS per worker
    assert [float(r["train/threads"]) for r in rows] == [share, share]
    assert len({r["run_dir"] for r in rows}) == 2


@pytest.mark.timeout(180)
def test_submitit_local_sweep_runs_two_jobs(tmp_path):
    rows = run_sweep(
        tmp_path,
        "-m",
        "hydra/launcher=submitit_local",
        "num_threads=1",
        "norm=batchnorm,layernorm",
        *SWEEP,
    )
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert all(math.isfinite(float(r["val/acc"])) for r in rows)
    jobs = [p for p in (tmp_path / "sweep" / ".submitit").iterdir() if p.name.isdigit()]
    assert len(jobs) == 2  # one folder of logs per submitit job


@pytest.mark.timeout(180)
def test_optuna_search_two_trials_returns_val_acc(tmp_path):
    rows = run_sweep(tmp_path, "hparams_search=lenet_optuna", "hydra.sweeper.n_trials=2", *SWEEP)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert all("optim.optimizer.lr=" in r["overrides"] for r in rows)
    sweep = tmp_path / "sweep"
    assert (sweep / "optuna.db").is_file()  # sqlite storage in the sweep dir
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    best = max(float(r["val/acc"]) for r in rows)
    assert result["best_value"] == pytest.approx(best)  # the jobs returned cfg.objective = val/acc


LAUNCHERS = ["basic", "joblib", "submitit_local", "submitit_slurm", "slurm", "local"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_option_composes_without_hydras_schema_matching_warning(launcher):
    """A file named as a plugin's schema (hydra/launcher/joblib.yaml) is matched against it with
    a deprecation warning on every sweep; conf/ names none so, and slurm extends its schema by
    name: the plugin's fields, this suite's values over them, a typo rejected."""
    import warnings

    from hydra import compose, initialize_config_dir

    with (
        warnings.catch_warnings(record=True) as caught,
        initialize_config_dir(str(REPO / "conf"), version_base="1.3"),
    ):
        warnings.simplefilter("always")
        cfg = compose("train", [f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert not [w for w in caught if "ConfigStore schema" in str(w.message)]
    if launcher == "local":
        local = cfg.hydra.launcher
        assert local._target_.endswith("LocalLauncher") and local.timeout_min == 4320
    if launcher == "slurm":
        slurm = cfg.hydra.launcher
        assert slurm._target_.endswith("SlurmLauncher")  # from the plugin's schema
        assert (slurm.timeout_min, slurm.cpus_per_task, slurm.mem_gb) == (240, 4, 16)  # ours
        assert slurm.max_num_timeout > 0  # a job at its time limit is requeued (resumes)
        with (
            pytest.raises(Exception, match="timeout_mins"),
            initialize_config_dir(str(REPO / "conf"), version_base="1.3"),
        ):
            compose("train", ["hydra/launcher=slurm", "hydra.launcher.timeout_mins=1"],
                    return_hydra_config=True)  # fmt: skip
