"""Trackers: every logger writes its files; several at once; wandb offline and grouped; a run
that finishes, fails, diverges or is killed ends so in MLflow and wandb."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock
from urllib import request

import lightning.pytorch as pl
import pytest
import yaml
from conftest import REPO, TINY
from test_train import run_cli

from normlab import loggers
from normlab.config import _slug
from normlab.data.integrity import cache_dir

TRACKERS = ["logger=[wandb,mlflow]", "batch=16", *TINY]


class Interrupt(pl.Callback):
    """At `hook` (a callback hook, never in the sanity check) raise RuntimeError, or with
    `signame` (SIGTERM, SIGINT) send that signal to this process. A run gets it as
    +callbacks.interrupt._target_=test_trackers.Interrupt (this directory on PYTHONPATH)."""

    def __init__(self, hook: str, signame: str | None = None):
        self.signame = signame
        setattr(self, hook, self.interrupt)

    def interrupt(self, trainer: pl.Trainer, *args, **kwargs) -> None:
        if trainer.sanity_checking:
            return
        if self.signame is None:
            raise RuntimeError("injected failure")
        if self.signame == "SIGINT":  # as in a terminal (a background job may ignore SIGINT)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), getattr(signal, self.signame))


def interrupt(hook: str, signame: str | None = None) -> list[str]:
    """The overrides that add Interrupt(hook, signame) to a run's callbacks."""
    keys = {"_target_": "test_trackers.Interrupt", "hook": hook, "signame": signame}
    return [f"+callbacks.interrupt.{k}={v}" for k, v in keys.items() if v is not None]


def mlflow_runs(root: Path) -> list:
    """The MLflow runs in the project store under the output root (<root>/mlruns)."""
    from mlflow import MlflowClient

    with mock.patch.dict(os.environ, {"MLFLOW_ALLOW_FILE_STORE": "true"}):  # as mlflow_logger
        client = MlflowClient(tracking_uri=f"file:{root / 'mlruns'}")
        return client.search_runs([client.get_experiment_by_name("normlab").experiment_id])


def mlflow_status(root: Path) -> str:
    """The status of the one MLflow run in the store under root (FINISHED, FAILED, ...)."""
    (run,) = mlflow_runs(root)
    return run.info.status


def wandb_records(path: Path):
    """The records of a wandb run file (run-<id>.wandb): a W&B header, then LevelDB's log format
    (32 KiB blocks of chunks, each with a 7-byte header: checksum, length, type)."""
    from wandb.proto.wandb_internal_pb2 import Record

    block, data = 32768, path.read_bytes()
    assert data[:4] == b":W&B"
    pos, payload = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room left for a chunk header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = Record()
            record.ParseFromString(payload)
            payload = b""
            yield record


def wandb_exit_code(run_dir: Path, wait_s: float = 10.0) -> int:
    """The exit code the run dir's one offline wandb run ended with (its exit record). wandb's
    service process writes the file: on a loaded machine the record can land a moment after
    wandb.finish returns, so it is read again for up to wait_s seconds."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + wait_s
    while True:
        codes = [r.exit.exit_code for r in wandb_records(path) if r.HasField("exit")]
        if codes or time.monotonic() > deadline:
            (code,) = codes
            return code
        time.sleep(0.2)


def test_all_trackers_at_once_in_a_multirun(tmp_path):
    run_cli(
        "-m", "logger=[csv,tensorboard,wandb,mlflow]", "norm=batchnorm,none", "batch=16", *TINY,
        f"hydra.sweep.dir={tmp_path}", f"paths.output_root={tmp_path}",
    )  # fmt: skip
    tiny = ",".join(TINY)
    runs = {r.info.run_name: r for r in mlflow_runs(tmp_path)}  # one store for the project
    assert sorted(runs) == [f"norm={n},batch=16,{tiny}" for n in ("batchnorm", "none")]
    assert {r.data.tags["group"] for r in runs.values()} == {tmp_path.name}  # the sweep
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "ok"]
    for row in rows:
        run = tmp_path / row["run_dir"].split("/")[-1]
        assert (run / "csv" / "metrics.csv").stat().st_size > 0
        hparams = yaml.safe_load((run / "csv" / "hparams.yaml").read_text())
        norms = ("normlab.norms.BatchNorm", "normlab.norms.NoNorm")
        assert hparams["norm"]["_target_"] in norms and hparams["seed"] == 42
        (mlflow_run,) = [r for r in runs.values() if r.data.tags["run_dir"] == str(run)]
        name = mlflow_run.info.run_name  # the job's overrides
        assert list((run / "tensorboard" / _slug(name)).glob("events.out.tfevents.*"))
        (wandb_run,) = (run / "wandb").glob("offline-run-*")  # one run per job, offline
        assert list(wandb_run.glob("run-*.wandb"))
        assert mlflow_run.data.metrics["train/loss_step"] > 0
        assert wandb_exit_code(run) == 0
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
    name = _slug(",".join(["batch=16", *TINY]))
    assert list((tmp_path / "tensorboard" / name).glob("events.out.tfevents.*"))


def test_tensorboard_event_file_carries_the_config_for_the_hparams_tab(compose, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    from normlab.run import train

    cfg = compose(["logger=tensorboard", "norm=groupnorm", "batch=16", *TINY], tmp_path)
    train(cfg)
    (log_dir,) = (tmp_path / "tensorboard").iterdir()  # named by the overrides
    assert log_dir.name == _slug(",".join(["norm=groupnorm", "batch=16", *TINY]))
    events = EventAccumulator(str(log_dir))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    experiment = HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics == list(cfg.logger.tensorboard.hp_metrics)
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["norm/_target_"].string_value == "normlab.norms.GroupNorm"
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


@pytest.mark.parametrize(
    "overrides, status, mlflow, exit_code",
    [
        ([], "ok", "FINISHED", 0),
        (["optim.optimizer.lr=1e30"], "diverged", "FAILED", 1),
        (interrupt("on_train_batch_start"), "raised", "FAILED", 1),
    ],
    ids=["finished", "diverged", "raised"],
)
def test_trackers_record_a_run_that_finishes_diverges_or_raises(
    overrides, status, mlflow, exit_code, compose, tmp_path, monkeypatch
):
    from normlab.run import train

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what mlflow_logger sets, not left set
    cfg = compose([*TRACKERS, f"paths.output_root={tmp_path}", *overrides], tmp_path)
    if status == "raised":
        with pytest.raises(RuntimeError, match="injected failure"):
            train(cfg)
    else:
        assert train(cfg)[0]["status"] == status
    assert mlflow_status(tmp_path) == mlflow
    assert wandb_exit_code(tmp_path) == exit_code


@pytest.mark.parametrize(
    "hook, signum",
    [
        ("on_train_batch_start", signal.SIGTERM),  # Lightning's handler: its loop stops
        ("setup", signal.SIGTERM),  # before Lightning's handler is in place
        ("on_train_batch_start", signal.SIGINT),  # Lightning's KeyboardInterrupt path
    ],
    ids=["SIGTERM-in-fit", "SIGTERM-in-setup", "SIGINT-in-fit"],
)
def test_a_run_ended_by_a_signal_is_killed_in_mlflow_and_fails_in_wandb(hook, signum, tmp_path):
    path = [str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}  # for Interrupt
    cmd = [sys.executable, "train.py", *TRACKERS, *interrupt(hook, signum.name),
           f"hydra.run.dir={tmp_path}", f"paths.output_root={tmp_path}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 128 + signum, proc.stderr
    assert mlflow_status(tmp_path) == "KILLED"
    assert wandb_exit_code(tmp_path) == 128 + signum
    (run,) = mlflow_runs(tmp_path)
    assert not [k for k in run.data.metrics if k.startswith("test/")]  # stopped before test


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


UI_DOCS = REPO / "docs" / "runs.md"


def mlflow_ui_command() -> str:
    """docs/runs.md's one command that runs `mlflow ui`: its code block's only line."""
    blocks = re.findall(r"```bash\n(.*?)```", UI_DOCS.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "mlflow ui" in b]
    (line,) = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    return line


def mlflow_ui(store: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The docs' `mlflow ui` command as typed, on `store` at 127.0.0.1:port, its environment
    made first (pipx's, kept in $NORMLAB_CACHE/pipx: made once, then reused); or
    $NORMLAB_MLFLOW_UI's command in place of the words before `ui`."""
    words = shlex.split(mlflow_ui_command())
    env = dict(os.environ, PIPX_HOME=str(cache_dir() / "pipx"))
    while "=" in words[0]:  # the command's environment settings (MLFLOW_ALLOW_FILE_STORE=true)
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    given = os.environ.get("NORMLAB_MLFLOW_UI")
    if given:
        words = [*shlex.split(given), *words[words.index("ui") :]]
    # the command's mlflow, installed on first use (minutes), before the server's 120 s start
    version = [*words[: words.index("ui")], "--version"]
    made = subprocess.run(version, env=env, timeout=1800, capture_output=True, text=True)
    assert made.returncode == 0, f"{shlex.join(version)}\n{made.stdout[-2000:]}\n{made.stderr}"
    pin = re.search(r"mlflow==(\S+)", " ".join(words))
    assert given or (pin and f"version {pin[1]}" in made.stdout), made.stdout  # the docs' pin
    words[words.index("--backend-store-uri") + 1] = f"file:{store}"
    return [*words, "--host", "127.0.0.1", "--port", str(port)], env


@pytest.mark.slow
def test_mlflow_ui_reads_a_run_back_from_the_project_store(tmp_path):
    """The MLflow UI as docs/runs.md starts it, on a store a tiny run wrote, on 127.0.0.1: the
    run read back through its REST API, then the server stopped."""
    run_cli("logger=[csv,mlflow]", "norm=groupnorm", "batch=16", *TINY,
            f"hydra.run.dir={tmp_path / 'run'}", f"paths.output_root={tmp_path}")  # fmt: skip
    cmd, env = mlflow_ui(tmp_path / "mlruns", free_port())
    assert env.get("MLFLOW_ALLOW_FILE_STORE") == "true"
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{cmd[-1]}/api/2.0/mlflow"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                url = f"{api}/experiments/get-by-name?experiment_name=normlab"
                with request.urlopen(url, timeout=5) as answer:
                    experiment = json.load(answer)["experiment"]
                break
            except OSError:
                if server.poll() is not None:
                    out = server.stdout.read().decode(errors="replace").strip()
                    raise AssertionError(f"{shlex.join(cmd)}\n{out[-3000:]}") from None
                assert time.monotonic() < deadline, "mlflow ui did not answer in 120 s"
                time.sleep(1)
        with request.urlopen(f"http://127.0.0.1:{cmd[-1]}/", timeout=10) as answer:
            page = answer.read().decode(errors="replace")
        assert "<html" in page.lower()  # the UI itself, not only its REST API
        body = json.dumps({"experiment_ids": [experiment["experiment_id"]]}).encode()
        search = request.Request(f"{api}/runs/search", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
        with request.urlopen(search, timeout=10) as answer:
            (run,) = json.load(answer)["runs"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert run["info"]["run_name"] == ",".join(["norm=groupnorm", "batch=16", *TINY])
    assert run["info"]["status"] == "FINISHED"
    assert {m["key"] for m in run["data"]["metrics"]} >= {"train/loss_step", "val/acc"}
