"""One training run from a composed config: build (data, task, callbacks, trackers, trainer),
then fit (fit, test); main is the Hydra task function of train.py."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import re
import shlex
import signal
import sys
import threading
import time
import traceback
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_helpers import is_overridden
from omegaconf import DictConfig, OmegaConf, open_dict

from normlab import config, console, identity, loggers, rundir, summary
from normlab.callbacks.checkpoint import EpochMeansInCheckpoint
from normlab.callbacks.last_step import ValidateLastStep
from normlab.callbacks.progress import EpochProgress
from normlab.compute import keep_heap
from normlab.errors import ConfigError, RunDirError, UserError
from normlab.hydra_callbacks import record_outcome
from normlab.preflight import preflight

log = logging.getLogger(__name__)
SUMMARY_GROUPS = ("train", "val", "test", "diverged")  # metric prefixes a run's result keeps
CONFIG_KEY = "normlab_config"  # a checkpoint's entry holding the resolved config that saved it
MODEL_KEYS = ("model", "norm", "placement", "optim")  # what builds the task a checkpoint holds
RESUME_KEYS = ("state_dict", "global_step", "epoch", "optimizer_states")  # what a resume reads
SHOWN_DIFFERENCES = 4  # differing keys an error names
_ABSENT = object()
RESUMED_DIR_WARNING = r"Checkpoint directory .* exists and is not empty"  # ModelCheckpoint's
_ALIAS = re.compile(r"\$\{[\w.]+\}")  # a node that is another node (model.net.norm_layer: ${norm})


def _hydra() -> Any | None:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def _run_dir(cfg: DictConfig) -> Path:
    return Path(cfg.paths.output_dir)


LAST, LAST_OR_NEW = "last", "last_or_new"  # ckpt_path values naming this run dir's last.ckpt


def resolve_ckpt(cfg: DictConfig) -> str | None:
    """ckpt_path: null | last (this run dir's last.ckpt, which must exist) | last_or_new (it,
    or a new run when there is none) | a run dir | a .ckpt file."""
    value = cfg.get("ckpt_path")
    if value in (None, ""):
        return None
    here = value in (LAST, LAST_OR_NEW)
    path = _run_dir(cfg) / "checkpoints" / "last.ckpt" if here else Path(value)
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt"
    if not path.is_file():
        if value == LAST_OR_NEW:
            log.info("ckpt_path=last_or_new: no %s yet, starting a new run", path)
            return None
        if value == LAST:
            raise ConfigError(
                f"ckpt_path=last: nothing to resume in {_run_dir(cfg)} (no {path}); name the "
                "run dir to resume (hydra.run.dir=<dir>), or ckpt_path=last_or_new to start a "
                "new run when there is none"
            )
        raise ConfigError(f"ckpt_path={value!r}: no checkpoint at {path}")
    return str(path)


def read_checkpoint(path: str | Path, what: str) -> dict[str, Any]:
    """The checkpoint at path, or ConfigError naming it (`what`, e.g. ckpt_path=last) when it
    cannot be read (not a torch file, truncated) or is not a full Lightning checkpoint."""
    try:
        if not zipfile.is_zipfile(path):  # torch.save's format; a cut file lost its directory
            raise ValueError("no zip directory at its end")
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        cause = str(err).split(". ")[0].strip().rstrip(".") or type(err).__name__
        raise ConfigError(
            f"{what}: {path} is not a readable checkpoint (truncated or not a .ckpt file: {cause})"
        ) from err
    missing = [k for k in RESUME_KEYS if not isinstance(checkpoint, dict) or k not in checkpoint]
    if missing:
        raise ConfigError(
            f"{what}: {path} is not a checkpoint a run can resume from: it has no "
            f"{', '.join(missing)} (a weights-only or foreign file?)"
        )
    return checkpoint


class ConfigInCheckpoint(pl.Callback):
    """Stores the run's resolved config in every checkpoint (CONFIG_KEY): a resume checks it."""

    def __init__(self, resolved: dict[str, Any]):
        self.resolved = resolved

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        checkpoint[CONFIG_KEY] = self.resolved


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a config container's leaves (lists and empty dicts are leaves)."""
    leaves = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            leaves.update(_leaves(value, f"{prefix}{key}."))
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


def _show(values: dict[str, Any], key: str) -> str:
    if key not in values:
        return "absent"
    value = values[key]
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def differences(
    old: dict[str, Any], new: dict[str, Any], cfg: DictConfig, old_name: str, new_name: str
) -> str:
    """'key: <old> (old_name) vs <new> (new_name)' for each leaf whose value differs, "; "-joined
    (the first SHOWN_DIFFERENCES, changed values before keys one side lacks); empty when none.
    A key that is another node in cfg (model.net.norm_layer: ${norm}) is left to that node."""
    unresolved = _leaves(OmegaConf.to_container(cfg, resolve=False))  # type: ignore[arg-type]
    aliases = tuple(f"{k}." for k, v in unresolved.items() if _ALIAS.fullmatch(str(v)))
    a, b = _leaves(old), _leaves(new)
    differ = [k for k in sorted(a.keys() | b.keys()) if a.get(k, _ABSENT) != b.get(k, _ABSENT)]
    keys = [k for k in differ if not f"{k}.".startswith(aliases)]
    keys.sort(key=lambda k: k not in a or k not in b)  # changed values first, then added/removed
    shown = [f"{k}: {_show(a, k)} ({old_name}) vs {_show(b, k)} ({new_name})" for k in keys]
    more = len(shown) - SHOWN_DIFFERENCES
    return "; ".join(shown[:SHOWN_DIFFERENCES]) + (f"; and {more} more" if more > 0 else "")


def check_checkpoint(cfg: DictConfig, task: pl.LightningModule, checkpoint: dict, path: str):
    """A checkpoint to resume must hold the task cfg builds: the same MODEL_KEYS (when it stores
    its config) and the same state_dict keys and shapes. Raise ConfigError naming the keys that
    differ; read only."""
    where = f"ckpt_path={cfg.ckpt_path}: {path}"
    stored = checkpoint.get(CONFIG_KEY)
    if stored is not None:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        old, new = ({k: t[k] for k in MODEL_KEYS if k in t} for t in (stored, resolved))
        diff = differences(old, new, cfg, "checkpoint", "config")
        if diff:
            raise ConfigError(f"{where} does not match the config: {diff}")

    def shapes(state: dict[str, Any]) -> dict[str, list[int]]:  # torch.compile's keys unwrapped
        return {k.replace("_orig_mod.", ""): [*getattr(v, "shape", ())] for k, v in state.items()}

    theirs, ours = shapes(checkpoint.get("state_dict", {})), shapes(task.state_dict())
    diff = differences(theirs, ours, cfg, "checkpoint", "model")
    if diff:
        raise ConfigError(f"{where} does not fit the model the config builds: {diff}")


def _other_run(cfg: DictConfig) -> str | None:
    """None when the run dir holds no earlier run, or one of this config (identity.config_hash,
    what a sweep calls the same job); else what differs."""
    guard = rundir.current()
    if guard is None or not guard.holds_run():
        return None
    config_hash = identity.config_hash(cfg)
    try:
        before = OmegaConf.create(guard.previous_config())
        if identity.config_hash(before) == config_hash:
            return None
        old = OmegaConf.to_container(before, resolve=True)
    except Exception as err:  # a config this code cannot read or resolve: another config
        return f"its .hydra/config.yaml cannot be resolved: {err}"
    new = OmegaConf.to_container(cfg, resolve=True)
    old, new = ({k: v for k, v in t.items() if k not in identity.NOT_IDENTITY} for t in (old, new))
    return differences(old, new, cfg, "run dir", "config") or "another config_hash"


def build_callbacks(
    cfg: DictConfig, task: pl.LightningModule, resolved: dict[str, Any] | None = None
) -> list[pl.Callback]:
    """cfg.callbacks (a null entry dropped), the config and the training epoch's running means
    in every checkpoint, a validation at a last step inside an epoch, the epoch lines.
    `resolved`: cfg resolved, when the caller has it already."""
    if resolved is None:
        resolved = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    callbacks: list[pl.Callback] = [
        ConfigInCheckpoint(resolved),  # type: ignore[arg-type]
        EpochMeansInCheckpoint(),
        ValidateLastStep(),
    ]
    for name, cb_cfg in (cfg.get("callbacks") or {}).items():
        if cb_cfg is None:
            continue
        try:
            callbacks.append(instantiate(cb_cfg))
        except Exception as err:  # instantiate wraps the cause; name the config key
            raise ConfigError(f"callbacks.{name}: {err}") from err
    if cfg.get("progress") == "epoch":
        callbacks.append(EpochProgress())
    return callbacks


def build_loggers(cfg: DictConfig, resume: dict[str, int | None]) -> list[pl.loggers.Logger]:
    """The trackers; `resume` (resume_point) tells the CSV log where a resumed run continues."""
    built = []
    for name, lg_cfg in (cfg.get("logger") or {}).items():
        if lg_cfg is None:
            continue
        extra = resume if name == "csv" else {}
        built.append(instantiate(lg_cfg, **extra))
    if not any(isinstance(lg, pl.loggers.CSVLogger) for lg in built):
        built.insert(0, loggers.ResumableCSVLogger(_run_dir(cfg), "csv", "", **resume))
    return built


def build_trainer(
    cfg: DictConfig, callbacks: list[pl.Callback], trackers: list[pl.loggers.Logger]
) -> pl.Trainer:
    """cfg.trainer's Trainer; a progress bar when progress=bar (or trainer.enable_progress_bar)."""
    bar = cfg.trainer.get("enable_progress_bar")
    return instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=trackers,
        enable_progress_bar=cfg.get("progress") == "bar" if bar is None else bar,
    )


def resume_point(checkpoint: dict[str, Any] | None) -> dict[str, int | None]:
    """{} without a checkpoint; else the global step it was saved at and the rows of the CSV
    log before it (None in a checkpoint that did not count them): all of them (resume_rows,
    a checkpoint after validation or at the end) or those logged before a checkpoint taken
    after a batch (resume_batch_rows)."""
    if checkpoint is None:
        return {}
    return {
        "resume_step": int(checkpoint["global_step"]),
        "resume_rows": checkpoint.get("csv_rows"),
        "resume_batch_rows": checkpoint.get("csv_rows_at_batch"),
    }


def build_task(cfg: DictConfig) -> tuple[int, pl.LightningDataModule, pl.LightningModule]:
    """The seed, the data module (its files checked) and the task, as a run makes them: seeded
    (cfg.seed, or one picked at random and written into cfg), on cfg's threads and heap."""
    seed = cfg.seed if cfg.seed is not None else random.randrange(2**31)
    with open_dict(cfg):
        cfg.seed = seed  # a seed picked at random reaches what interpolates it (data.seed)
    pl.seed_everything(seed, workers=True, verbose=False)
    if cfg.get("num_threads"):
        torch.set_num_threads(int(cfg.num_threads))
    if cfg.get("keep_heap"):
        keep_heap()
    datamodule: pl.LightningDataModule = instantiate(cfg.data)
    datamodule.prepare_data()  # missing or corrupted files fail here, before anything runs
    try:
        task = instantiate(cfg.model)
    except Exception as err:  # a model's ValueError about its arguments: named by config key
        named = config.name_config_keys(err)
        if named is None:
            raise
        raise named from err
    return seed, datamodule, task


@dataclass
class Objects:
    """What build() makes of a config and fit() runs (lightning-hydra-template's object_dict)."""

    cfg: DictConfig
    datamodule: pl.LightningDataModule
    task: pl.LightningModule
    callbacks: list[pl.Callback]
    loggers: list[pl.loggers.Logger]
    trainer: pl.Trainer
    ckpt_path: str | None  # the checkpoint fit resumes from
    seed: int
    hparams: dict[str, Any]  # cfg resolved: what the trackers record


def build(
    cfg: DictConfig,
    checkpoint: dict[str, Any] | None = None,
    callbacks: Sequence[pl.Callback] = (),
    validated: bool = False,
) -> Objects:
    """Data, task, callbacks (cfg's, then `callbacks`), trackers and trainer of one config.

    Nothing is written to the run dir before the checks pass: the config (unless `validated`
    by the caller), the trackers' servers, a checkpoint to resume against the model, an earlier
    run of another config in the dir (a single run that does not resume it), whether the run
    dir and checkpoint dirs can be written. `checkpoint`: the checkpoint at cfg.ckpt_path when
    the caller has read it already."""
    console.configure()
    if not validated:
        config.validate(cfg)
    loggers.check_servers(cfg.get("logger"))
    ckpt = resolve_ckpt(cfg)  # ckpt_path=last with nothing to resume fails before the data loads
    other_run = _other_run(cfg)  # before a random seed is written into cfg
    seed, datamodule, task = build_task(cfg)
    preflight(task, int(cfg.batch))

    run_dir = _run_dir(cfg)
    if ckpt and checkpoint is None:  # a sweep job hands over the last.ckpt it has read
        checkpoint = read_checkpoint(ckpt, f"ckpt_path={cfg.ckpt_path}")
    if checkpoint is not None:
        check_checkpoint(cfg, task, checkpoint, ckpt)
    if ckpt and Path(ckpt).resolve().is_relative_to(run_dir.resolve()):
        other_run = None  # it resumes the run in its dir: the checkpoint's check above decides
    if other_run is not None and not cfg.get("overwrite"):
        raise RunDirError(
            f"run dir {run_dir} holds a run of another config ({other_run}): pick another "
            f"hydra.run.dir, or overwrite=true to move that run to {run_dir}/"
            f"{rundir.OLD_PREFIX}<time>/ and start anew"
        )
    hparams: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    built = [*build_callbacks(cfg, task, hparams), *callbacks]
    dirs = [Path(c.dirpath) for c in built if getattr(c, "dirpath", None)]
    rundir.probe([run_dir, *dirs])  # an unwritable checkpoint dir fails now, not after an epoch
    if other_run is not None:
        log.info("overwrite=true: moved the earlier run to %s", rundir.current().move_aside())
    if rundir.current() is not None:
        rundir.current().start()
    if cfg.get("channels_last"):
        task = task.to(memory_format=torch.channels_last)
    if cfg.get("compile"):
        task.net = torch.compile(task.net)
    trackers = build_loggers(cfg, resume_point(checkpoint))
    trainer = build_trainer(cfg, built, trackers)
    if cfg.trainer.get("accelerator") == "cpu":
        # Lightning's import sets PYTORCH_NVML_BASED_CUDA_CHECK=1 (not to start CUDA before a
        # fork), and then torch.cuda.is_available(), asked by every optimizer step, loads NVML
        # anew each time (~40 us a step); a CPU run never uses CUDA: torch's cached check it is
        os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    return Objects(cfg, datamodule, task, built, trackers, trainer, ckpt, seed, hparams)


def fit(objects: Objects) -> dict[str, Any]:
    """Fit (and test) what build() made; {'status', 'note' (why not ok), 'metrics', 'seed'}."""
    o = objects
    status, error = "failed", None
    trackers = o.trainer.loggers  # o.loggers, or a DummyLogger under fast_dev_run (no logs)
    try:
        with _sigterm_ends_run():
            for tracker in trackers:
                tracker.log_hyperparams(o.hparams)
            with warnings.catch_warnings():
                if o.ckpt_path is not None:  # a resume: the checkpoint dir holds its own files
                    warnings.filterwarnings("ignore", RESUMED_DIR_WARNING)
                o.trainer.fit(
                    o.task, datamodule=o.datamodule, ckpt_path=o.ckpt_path, weights_only=False
                )
            if o.trainer.received_sigterm:  # in fit's last batch: Lightning let it finish
                raise SIGTERMException()
            status = getattr(o.task, "run_status", "ok")
            metrics = _scalars(o.trainer.callback_metrics)
            if o.cfg.get("test") and status == "ok" and is_overridden("test_step", o.task):
                metrics.update(_test(o.trainer, o.task, o.datamodule))
    except BaseException as err:
        error = err
        signum = loggers.killed_by(err)
        if signum and not isinstance(err, KeyboardInterrupt):  # not 0 (SIGTERMException) or 1
            raise SystemExit(128 + signum) from err  # (Lightning's exit after a KeyboardInterrupt)
        raise
    finally:
        loggers.finish(trackers, error, failed=status != "ok")
    note = getattr(o.task, "run_note", "")
    return {"status": status, "note": note, "metrics": metrics, "seed": o.seed}


def train(
    cfg: DictConfig, checkpoint: dict[str, Any] | None = None, validated: bool = False
) -> dict[str, Any]:
    """fit(build(cfg)): one config fitted (and tested); see build and fit."""
    return fit(build(cfg, checkpoint, validated=validated))


def _test(
    trainer: pl.Trainer, task: pl.LightningModule, datamodule: pl.LightningDataModule
) -> dict[str, float]:
    """Test ModelCheckpoint's best checkpoint (the final weights without one): its metrics."""
    checkpoints = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
    best = checkpoints[0].best_model_path if checkpoints else ""
    trainer.test(task, datamodule=datamodule, ckpt_path=best or None, weights_only=False)
    return _scalars(trainer.callback_metrics)


@contextlib.contextmanager
def _sigterm_ends_run():
    """SIGTERM raises Lightning's SIGTERMException wherever it lands (a run's trackers end KILLED,
    loggers.finish) instead of ending the process with its tracker runs still RUNNING. Inside
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


def _scalars(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """Final train/val/test metrics (per-step duplicates `*_step` and diagnostics left out)."""
    return {
        k.removesuffix("_epoch"): float(v)
        for k, v in metrics.items()
        if v.numel() == 1 and not k.endswith("_step") and k.split("/")[0] in SUMMARY_GROUPS
    }


def main(cfg: DictConfig, validated: bool = False) -> float | None:
    """Hydra task function: one job. A single run that fails on bad input or diverges exits
    non-zero with one line; in a multirun, record a summary row and the job's outcome (the
    multirun's exit code: normlab.hydra_callbacks.SweepExitCode) and never raise.
    `validated`: cfg passed config.validate already (train.py checks a single run's config
    before torch loads)."""
    hc = _hydra()
    multirun = hc is not None and hc.mode.name == "MULTIRUN"
    if not rundir.other_rank():
        log.info("run dir: %s", _run_dir(cfg).absolute())
    if not multirun:
        try:
            result = train(cfg, validated=validated)
        except BaseException as err:
            signum = loggers.killed_by(err)
            if signum:  # Ctrl+C, SIGTERM: where the run is and how to go on
                if not rundir.other_rank():
                    print(interrupted(cfg, hc, signum), file=sys.stderr)
                raise SystemExit(128 + signum) from None
            if not isinstance(err, Exception):
                raise
            cause = user_error(err) or rundir.write_error(err, _run_dir(cfg))
            if cause is None:
                raise
            raise SystemExit(f"error: {cause}") from None
        if result["status"] != "ok":
            raise SystemExit(f"error: run {result['status']}: {result['note']} ({_run_dir(cfg)})")
        return objective(cfg, result)

    overrides = " ".join(hc.overrides.task)
    sweep_dir = Path(hc.sweep.dir)
    ident = {
        "config_hash": identity.config_hash(cfg),
        "code_version": identity.code_version(identity.hydra_conf_dir()),
    }
    before = summary.previous_row(sweep_dir, overrides)
    same = before is not None and all(before.get(k) == v for k, v in ident.items())
    if same and before["status"] in summary.FINISHED:
        log.info("skipping finished job [%s] (%s)", overrides, before["run_dir"])
        summary.update_row(sweep_dir, {**before, "reused": 1})
        record_outcome(hc.job.num, before["status"])
        value = before.get(cfg.get("objective") or "")
        return float(value) if value not in (None, "") else None
    try:
        held = rundir.lock(_run_dir(cfg))  # another process runs this job now: leave it
    except RunDirError as err:
        log.error("job [%s] not run: %s", overrides, err)
        record_outcome(hc.job.num, "failed")
        return objective(cfg, {"status": "failed", "metrics": {}})
    try:
        return _sweep_job(cfg, hc, overrides, ident, before, same)
    except BaseException as err:
        signum = loggers.killed_by(err)
        if not signum:
            raise
        print(interrupted(cfg, hc, signum), file=sys.stderr)
        raise SystemExit(128 + signum) from None
    finally:
        os.close(held)


def interrupted(cfg: DictConfig, hc: Any, signum: int) -> str:
    """Two lines for a run or sweep ended by a signal: where it is, and the command that
    continues it (the same overrides, its dir, and for a single run ckpt_path=last, or
    last_or_new before its first checkpoint; a multirun skips finished jobs and resumes the
    others)."""
    name = signal.Signals(signum).name
    if hc is not None and hc.mode.name == "MULTIRUN":
        argv = [a for a in sys.argv[1:] if not a.startswith("hydra.sweep.dir=")]
        argv = argv if {"-m", "--multirun"} & set(argv) else ["-m", *argv]
        sweep_dir = Path(hc.sweep.dir).absolute()
        command = ["python", "train.py", *argv, f"hydra.sweep.dir={sweep_dir}"]
        return (
            f"interrupted ({name}): sweep dir {sweep_dir}, job {hc.job.num} in "
            f"{Path(cfg.paths.output_dir).absolute()}\ncontinue with: {shlex.join(command)}"
        )
    run_dir = _run_dir(cfg).absolute()
    last = run_dir / "checkpoints" / "last.ckpt"
    kept = [o for o in (hc.overrides.task if hc is not None else [])
            if not o.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir="))]  # fmt: skip
    resume = LAST if last.is_file() else LAST_OR_NEW
    command = ["python", "train.py", *kept, f"hydra.run.dir={run_dir}", f"ckpt_path={resume}"]
    where = "resumable from checkpoints/last.ckpt" if last.is_file() else "no checkpoint yet"
    return f"interrupted ({name}): run dir {run_dir}, {where}\ncontinue with: {shlex.join(command)}"


def _sweep_job(cfg: DictConfig, hc: Any, overrides: str, ident: dict[str, str],
               before: dict[str, str] | None, same: bool) -> float | None:  # fmt: skip
    """A multirun job that is not reused, in its locked run dir: resume, rerun or run it."""
    sweep_dir = Path(hc.sweep.dir)
    last = _run_dir(cfg) / "checkpoints" / "last.ckpt"
    checkpoint = None  # the last.ckpt this job resumes from, read once
    if before is not None and not same:
        changed = [k for k, v in ident.items() if before.get(k) != v]
        log.info("job [%s] changed (%s): running it again", overrides, ", ".join(changed))
        if last.is_file():  # a checkpoint of the old job must never be resumed by the new one
            last.replace(last.with_name("last.stale.ckpt"))
    elif before is not None and cfg.get("ckpt_path") is None and last.is_file():
        try:
            checkpoint = read_checkpoint(last, "last.ckpt")
        except ConfigError as err:  # a run killed while the file was copied in, a full disk
            aside = last.with_name(f"last.damaged-{time.strftime('%Y%m%d-%H%M%S')}.ckpt")
            last.replace(aside)
            log.warning("job [%s]: %s; moved it to %s, running the job from scratch",
                        overrides, err, aside)  # fmt: skip
        else:
            log.info("job [%s] was %s: resuming from %s", overrides, before["status"], last)
            with open_dict(cfg):
                cfg.ckpt_path = LAST
    row: dict[str, Any] = {
        "job": hc.job.num,
        "overrides": overrides,
        "status": "running",
        "run_dir": cfg.paths.output_dir,
        "reused": 0,
        **ident,
    }
    summary.update_row(sweep_dir, row)
    start = time.time()
    result: dict[str, Any] = {"status": "failed", "metrics": {}}
    try:
        result = train(cfg, checkpoint)
    except Exception as err:  # a failing job is recorded; the sweep goes on
        log.error("job [%s] failed:\n%s", overrides, traceback.format_exc())
        cause = user_error(err) or rundir.write_error(err, _run_dir(cfg)) or err
        result["error"] = f"{type(cause).__name__}: {cause}"
    row.update(
        status=result["status"],
        error=result.get("error") or result.get("note", ""),
        wall_time_s=round(time.time() - start, 2),
        seed=result.get("seed", cfg.seed),
        **result["metrics"],
    )
    summary.update_row(sweep_dir, row)
    record_outcome(hc.job.num, result["status"])
    return objective(cfg, result)


def user_error(err: BaseException) -> UserError | None:
    """The UserError behind err (Hydra's instantiate wraps what a constructor raises)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, UserError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def objective(cfg: DictConfig, result: dict[str, Any]) -> float | None:
    """The metric a sweeper optimizes (cfg.objective, e.g. val/acc); NaN when the run failed."""
    name = cfg.get("objective")
    if not name:
        return None
    value = result["metrics"].get(name, math.nan)
    return value if result["status"] == "ok" else math.nan
