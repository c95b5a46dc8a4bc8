"""A finished sweep job is reused only when its resolved config and training code are unchanged."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

from normlab import identity
from normlab.config import PROGRESS

TINY_SWEEP = [
    "norm=none",
    "seed=0",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.val_check_interval=1",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
]


def _summary(sweep: Path) -> dict[str, str]:
    with open(sweep / "summary.csv") as f:
        (row,) = list(csv.DictReader(f))
    return row


def test_a_changed_experiment_yaml_reruns_the_finished_job(tmp_path: Path):
    repo = tmp_path / "repo"  # a copy of the repo's entry point and configs
    shutil.copytree(REPO / "conf", repo / "conf")
    shutil.copy(REPO / "train.py", repo / "train.py")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "train.py", "-m", "experiment=bn_lenet", *TINY_SWEEP,
           f"hydra.sweep.dir={sweep}"]  # fmt: skip

    def run() -> str:
        done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    run()
    first = _summary(sweep)
    assert first["status"] == "ok" and first["reused"] == "0"
    metrics = next(sweep.rglob("metrics.csv"))
    mtime = metrics.stat().st_mtime_ns

    out = run()  # nothing changed: reused, not run
    assert "skipping finished job" in out
    assert metrics.stat().st_mtime_ns == mtime
    assert _summary(sweep)["reused"] == "1"

    cmd[3:-1] = cmd[3:-1][::-1]  # the same overrides in another order: the same job, one row
    out = run()
    assert "skipping finished job" in out and metrics.stat().st_mtime_ns == mtime

    yaml = repo / "conf" / "experiment" / "bn_lenet.yaml"
    text = yaml.read_text()
    assert "    lr: 0.1 " in text
    yaml.write_text(text.replace("    lr: 0.1 ", "    lr: 0.05 "))
    out = run()  # one value changed: the same overrides, another job
    assert "skipping finished job" not in out
    assert "changed (config_hash): running it again" in out
    assert metrics.stat().st_mtime_ns != mtime
    third = _summary(sweep)
    assert third["reused"] == "0" and third["status"] == "ok"
    assert third["config_hash"] != first["config_hash"]
    assert third["code_version"] == first["code_version"]  # the same code: only its config moved

    other = repo / "conf" / "experiment" / "gn_batch_size.yaml"  # a file this job never composes
    other.write_text(other.read_text() + "\n# a note\n")
    out = run()
    assert "skipping finished job" in out and _summary(sweep)["reused"] == "1"


def test_config_hash_ignores_the_run_dir_and_sees_every_value(compose, tmp_path: Path):
    a = identity.config_hash(compose(["norm=groupnorm"], tmp_path / "a"))
    b = identity.config_hash(compose(["norm=groupnorm"], tmp_path / "b"))
    c = identity.config_hash(compose(["norm=groupnorm", "norm.eps=1e-6"], tmp_path / "a"))
    assert a == b != c


def test_config_hash_ignores_what_a_run_shows_while_it_trains(compose, tmp_path, monkeypatch):
    hashes = {identity.config_hash(compose([f"progress={p}"], tmp_path)) for p in PROGRESS}
    monkeypatch.setenv("NORMLAB_PROGRESS", "bar")  # the default comes from the environment
    hashes.add(identity.config_hash(compose([], tmp_path)))
    assert len(hashes) == 1
    assert identity.config_hash(compose(["trainer.max_epochs=2"], tmp_path)) not in hashes


def test_code_version_covers_training_code_but_not_analysis_or_sweep(monkeypatch, tmp_path):
    src = Path(shutil.copytree(identity.SRC, tmp_path / "normlab"))
    monkeypatch.setattr(identity, "SRC", src)
    before = identity.code_version()
    for part in ("analysis/report.py", "sweep/summary.py"):
        with open(src / part, "a") as f:
            f.write("\n# a figure's wording, a sweep's bookkeeping\n")
    assert identity.code_version() == before  # neither runs what a job computes
    with open(src / "norms" / "batchnorm.py", "a") as f:
        f.write("\n# a change\n")
    assert identity.code_version() != before
