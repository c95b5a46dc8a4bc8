"""Experiment trackers: Lightning loggers built from conf/logger/*.yaml."""

from __future__ import annotations

import contextlib
import csv
import itertools
import netrc
import os
import secrets
import signal
import socket
import threading
import warnings
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.loggers import (
    CSVLogger,
    Logger,
    MLFlowLogger,
    TensorBoardLogger,
    WandbLogger,
)
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from normlab.config import _slug
from normlab.errors import ConfigError
from normlab.identity import NOT_IDENTITY

PROBE_TIMEOUT_S = 10.0  # a tracking server that does not answer a connect in this long fails


def sweep_group() -> str | None:
    """The sweep dir's name when running inside a Hydra multirun, else None."""
    try:
        hc = HydraConfig.get()
    except ValueError:
        return None
    return Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None


NOT_IN_NAME = ("logger", "hydra")  # with identity.NOT_IDENTITY: overrides a run name leaves out


def run_name() -> str | None:
    """A run's name for the trackers: its overrides as typed, comma-joined
    (`norm=groupnorm,batch=2`; "default" for none), without those that say where it writes,
    how it resumes or which trackers log it; None outside a Hydra job."""
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:
        return None
    left_out = (*NOT_IDENTITY, *NOT_IN_NAME)
    kept = [
        o
        for o in overrides
        if o.split("=", 1)[0].lstrip("+~").split(".")[0].split("/")[0] not in left_out
    ]
    return ",".join(kept) or "default"


def wandb_has_credentials() -> bool:
    """True when an API key is in the environment or ~/.netrc (no network involved)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        auth = netrc.netrc().authenticators("api.wandb.ai")
    except (FileNotFoundError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def _keep_rows(
    path: Path, keep_until_step: int, keep_rows: int | None, logged_rows: int | None = None
) -> tuple[list[str], int]:
    """Cut the metrics.csv at path to its first `keep_rows` rows; without that count, to the
    rows of steps before `keep_until_step` and the first `logged_rows` rows (the rows logged
    before a checkpoint taken after a batch, such as a callback's value of that batch logged at
    the step it ends). Its header and the rows kept."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        if keep_rows is not None:
            rows = list(itertools.islice(reader, keep_rows))
        else:
            rows = [
                r
                for i, r in enumerate(reader)
                if int(float(r["step"])) < keep_until_step or i < (logged_rows or 0)
            ]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return header, len(rows)


class ResumableCSVLogger(CSVLogger):
    """CSVLogger that, for a resumed run, appends to the run's metrics.csv.

    Rows logged after the checkpoint being resumed are dropped first: the resumed run logs
    them again. They are the rows after the first `resume_rows` (`rows`, the rows logged so
    far, as LastCheckpoint stored it in the checkpoint), or without that count the rows of
    steps >= `resume_step` that are not among the first `resume_batch_rows` (the rows logged
    before a checkpoint taken after a batch).
    """

    def __init__(
        self,
        *args: Any,
        resume_step: int | None = None,
        resume_rows: int | None = None,
        resume_batch_rows: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.resume_step = resume_step
        self.resume_rows = resume_rows
        self.resume_batch_rows = resume_batch_rows
        self.rows = 0
        self._opened = False  # the writer exists (made by the first use of `experiment`)

    @property
    def experiment(self) -> ExperimentWriter:
        if self._opened or self.resume_step is None or rank_zero_only.rank != 0:
            self._opened = True
            return super().experiment
        self._opened = True
        path = Path(self.log_dir) / ExperimentWriter.NAME_METRICS_FILE
        if not path.is_file():
            return super().experiment
        header, self.rows = _keep_rows(
            path, self.resume_step, self.resume_rows, self.resume_batch_rows
        )
        # Lightning's writer deletes a metrics.csv it finds: it is put back once the writer exists
        aside = path.with_name(f".{path.name}.resumed")
        os.replace(path, aside)
        try:
            with warnings.catch_warnings():  # "... exists and is not empty": it is kept
                warnings.filterwarnings("ignore", "Experiment logs directory")
                writer = super().experiment
        finally:
            os.replace(aside, path)
        writer.metrics_keys = header  # new keys rewrite the header, the kept rows with it
        return writer

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        super().log_metrics(metrics, step)  # one row
        self.rows += 1


def _flat(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(`a/b/c`, value) for each leaf of nested dicts, as TensorBoard's HPARAMS tab names them."""
    leaves = []
    for key, value in tree.items():
        if isinstance(value, dict):  # an empty one has no leaf
            leaves += _flat(value, f"{prefix}{key}/")
        else:
            leaves.append((f"{prefix}{key}", value))
    return leaves


# every task's metrics: classification val/test loss and acc, the LM's val/bpc, the DiT's FID-like
HP_METRICS = ("val/loss", "val/acc", "val/bpc", "val/fid_lenet", "test/loss", "test/acc")


class HparamsTensorBoardLogger(TensorBoardLogger):
    """A TensorBoardLogger whose event file carries the run's config (TensorBoard's HPARAMS tab).

    Lightning's logger writes the hparams plugin's data only together with a metric value: with
    `default_hp_metric` a placeholder `hp_metric` of -1 that stays in the charts, without it
    nothing. Here the flattened config (`norm/name`, `optim/optimizer/lr`, ...) is written with
    the metrics the tab lists (`hp_metrics`) and no value of any: TensorBoard reads their values
    from the run's own scalars of those names (a metric the task never logs stays empty).
    """

    def __init__(
        self,
        *args: Any,
        hp_metrics: Sequence[str] = HP_METRICS,
        **kwargs: Any,
    ):
        kwargs["default_hp_metric"] = False  # no placeholder metric
        if kwargs.get("version") is None:  # TensorBoard's run name: <save_dir>/<name>/<version>
            name = run_name()
            kwargs["version"] = _slug(name) if name else None
        super().__init__(*args, **kwargs)
        self.hp_metrics = list(hp_metrics)

    @rank_zero_only
    def log_hyperparams(
        self,
        params: dict[str, Any] | Namespace,
        metrics: dict[str, Any] | None = None,
        step: int | None = None,
    ) -> None:
        super().log_hyperparams(params, metrics, step)  # hparams.yaml (and, given metrics, all)
        if metrics is not None or not self.hp_metrics:
            return
        from torch.utils.tensorboard.summary import hparams  # lazy: tensorboard: hp_metrics only

        flat = {
            k: v if isinstance(v, bool | int | float | str) else str(v)
            for k, v in _flat(vars(params) if isinstance(params, Namespace) else params)
        }
        writer = self.experiment.file_writer  # made by the SummaryWriter's constructor
        for summary in hparams(flat, dict.fromkeys(self.hp_metrics)):
            writer.add_summary(summary, step)


def wandb_logger(
    project: str = "normlab",
    save_dir: str = ".",
    group: str | None = None,
    mode: str | None = None,
    tags: list[str] | None = None,
    **kwargs: Any,
) -> WandbLogger:
    """A WandbLogger that never blocks: offline when no credentials are configured."""
    mode = (
        mode or os.environ.get("WANDB_MODE") or ("online" if wandb_has_credentials() else "offline")
    )
    import wandb  # lazy: wandb loads only for a wandb logger

    settings = wandb.Settings(init_timeout=60, silent=True, x_disable_stats=True)
    # the run id lives in the run dir, so a resumed run continues the same wandb run
    id_file = Path(save_dir) / "wandb" / "run_id"
    run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
    id_file.parent.mkdir(parents=True, exist_ok=True)
    id_file.write_text(run_id)
    logger = WandbLogger(
        project=project,
        save_dir=save_dir,
        name=kwargs.pop("name", None) or run_name(),
        group=group or sweep_group(),
        mode=mode,
        tags=list(tags or []),
        settings=settings,
        id=run_id,
        resume="allow",
        **kwargs,
    )
    # Lightning passes anonymous=None to wandb.init, and wandb warns on every run that "The
    # anonymous setting has no effect": a warning nobody can act on (normlab.console)
    logger._wandb_init.pop("anonymous", None)
    return logger


def mlflow_logger(
    experiment_name: str = "normlab",
    tracking_uri: str | None = None,
    run_dir: str | None = None,
    **kwargs: Any,
) -> MLFlowLogger:
    """An MLFlowLogger named by its overrides (run_name), tagged with its sweep (`group`, the
    sweep dir's name) and `run_dir`. A `file:` store is made absolute (every run of the project
    in one store, wherever it is started from) and allowed explicitly (MLflow 3 asks for an
    opt-in: MLFLOW_ALLOW_FILE_STORE)."""
    if tracking_uri and tracking_uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        tracking_uri = Path(os.path.abspath(tracking_uri.removeprefix("file:"))).as_uri()
    tags = {"group": sweep_group() or "", "run_dir": os.path.abspath(run_dir) if run_dir else ""}
    return MLFlowLogger(
        experiment_name=experiment_name,
        tracking_uri=tracking_uri,
        run_name=kwargs.pop("run_name", None) or run_name(),
        tags={**tags, **(kwargs.pop("tags", None) or {})},
        **kwargs,
    )


def check_servers(logger_cfg: DictConfig | None) -> None:
    """Connect to every tracker's http(s) tracking_uri before training (MLflow's client would
    retry an unreachable server for minutes without a message); ConfigError naming the URI."""
    for name, lg_cfg in (logger_cfg or {}).items():
        uri = str((lg_cfg or {}).get("tracking_uri") or "")
        url = urlsplit(uri)
        if url.scheme not in ("http", "https"):
            continue
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname, port), timeout=PROBE_TIMEOUT_S).close()
        except OSError as err:
            reason = err.strerror or str(err) or type(err).__name__
            raise ConfigError(
                f"logger.{name}.tracking_uri={uri}: cannot reach the tracking server: {reason} "
                f"(connect timeout {PROBE_TIMEOUT_S:g} s); start it, or use another tracking_uri"
            ) from err


@contextlib.contextmanager
def sigterm_ends_run():
    """SIGTERM raises Lightning's SIGTERMException wherever it lands (a run's trackers end KILLED,
    finish) instead of ending the process with its tracker runs still RUNNING. Inside
    fit's and test's loops Lightning's own handler comes first and calls this one: there its loop
    raises SIGTERMException at the end of the batch."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return

    def raise_sigterm(signum: int, frame: Any) -> None:
        if signal.getsignal(signal.SIGTERM) is raise_sigterm:  # outside Lightning's loops
            raise SIGTERMException()

    before = signal.signal(signal.SIGTERM, raise_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def killed_by(err: BaseException | None) -> int | None:
    """The signal that ended a run with `err`: SIGINT for a KeyboardInterrupt, SIGTERM for
    Lightning's SIGTERMException, also behind another exception (Lightning turns a
    KeyboardInterrupt in fit into sys.exit(1)); None for any other error."""
    seen = err
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return signal.SIGINT
        if isinstance(seen, SIGTERMException):
            return signal.SIGTERM
        seen = seen.__cause__ or seen.__context__
    return None


def finish(loggers: list[Logger], err: BaseException | None = None, failed: bool = False) -> None:
    """Close every tracker run (the next run of a multirun starts a fresh one) with how the run
    ended: finished; failed (`err` an exception, or `failed`: the run diverged): MLflow FAILED,
    wandb exit code 1; killed (`err` from SIGINT or SIGTERM, killed_by): MLflow KILLED, wandb
    exit code 128 + the signal. Lightning itself finalizes the trackers "failed" on an exception
    in fit or test, and "success" after both: this has the last word."""
    signum = killed_by(err)
    status = "failed" if failed or err is not None else "success"
    exit_code = 0 if status == "success" else 128 + signum if signum else 1
    for logger in loggers:  # MLFlowLogger passes a status it does not map on to MLflow
        logger.finalize("KILLED" if signum and isinstance(logger, MLFlowLogger) else status)
        if isinstance(logger, WandbLogger):
            import wandb  # lazy: as in wandb_logger

            if wandb.run is not None:
                wandb.finish(exit_code=exit_code)
