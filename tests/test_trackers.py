"""Trackers: every logger writes its files; several at once; wandb offline and grouped."""

from __future__ import annotations

import csv

import yaml
from conftest import REPO, TINY
from test_train import run_cli

from normlab import loggers


def test_all_trackers_at_once_in_a_multirun(tmp_path):
    run_cli(
        "-m", "logger=[csv,tensorboard,wandb,mlflow]", "norm=batchnorm,none", "batch=16", *TINY,
        f"hydra.sweep.dir={tmp_path}",
    )  # fmt: skip
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "ok"]
    for row in rows:
        run = tmp_path / row["run_dir"].split("/")[-1]
        assert (run / "csv" / "metrics.csv").stat().st_size > 0
        hparams = yaml.safe_load((run / "csv" / "hparams.yaml").read_text())
        assert hparams["norm"]["name"] in ("batchnorm", "none") and hparams["seed"] == 42
        assert list((run / "tensorboard").glob("events.out.tfevents.*"))
        (wandb_run,) = (run / "wandb").glob("offline-run-*")  # one run per job, offline
        assert list(wandb_run.glob("run-*.wandb"))
        mlflow_metrics = list((run / "mlruns").glob("*/*/metrics/train/loss_step"))
        assert mlflow_metrics and mlflow_metrics[0].read_text().strip()
    # every wandb run of the sweep was finished before the next started
    logs = [p.read_text() for p in tmp_path.glob("*/wandb/debug.log")]
    assert len(logs) == 2 and all("finishing run" in text for text in logs)


def test_wandb_runs_offline_without_credentials_and_joins_the_sweep_group(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(loggers, "sweep_group", lambda: "sweep-123")
    assert not loggers.wandb_has_credentials()
    logger = loggers.wandb_logger(save_dir=str(tmp_path))
    try:
        assert logger.experiment.settings.mode == "offline"
        assert logger.experiment.group == "sweep-123"
    finally:
        loggers.finish([logger])
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_csv_is_always_on(tmp_path):
    run_cli("logger=tensorboard", "batch=16", *TINY, f"hydra.run.dir={tmp_path}")
    assert (tmp_path / "csv" / "metrics.csv").is_file()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_tensorboard_event_file_carries_the_config_for_the_hparams_tab(compose, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    from normlab.run import train

    cfg = compose(["logger=tensorboard", "norm=groupnorm", "batch=16", *TINY], tmp_path)
    train(cfg)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    experiment = HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics == list(cfg.logger.tensorboard.hp_metrics)
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["norm/name"].string_value == "groupnorm"
    assert hparams["batch"].number_value == 16
    assert hparams["optim/optimizer/lr"].number_value == cfg.optim.optimizer.lr
    # the tab's values are the run's own scalars; no placeholder metric is written
    scalars = events.Tags()["scalars"]
    assert "val/acc" in scalars and "test/acc" in scalars and "hp_metric" not in scalars


def test_runs_started_in_the_same_second_get_distinct_dirs(tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, "train.py", "batch=16", "trainer.max_steps=1", "test=false",
           "trainer.limit_val_batches=0", f"paths.output_root={tmp_path}"]  # fmt: skip
    procs = [subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.DEVNULL) for _ in range(3)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    run_dirs = [p.parent for p in tmp_path.glob("runs/*/*/.hydra")]
    assert len(run_dirs) == 3
    assert all(len(list(d.rglob("metrics.csv"))) == 1 for d in run_dirs)
