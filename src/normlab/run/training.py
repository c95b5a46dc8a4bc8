"""One training run, lightning-hydra-template's train(): instantiate the data, task, callbacks,
trackers and trainer of a composed config, fit, test with the best checkpoint, return the
result and the objects. Its run dir (rundir) and what an earlier run there means (resume) are
this package's too; normlab.run.task runs it as train.py's task function."""

from __future__ import annotations

import math
import os
import random
import warnings
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

from normlab import config, console, loggers
from normlab.callbacks.checkpoint import EpochMeansInCheckpoint
from normlab.callbacks.last_step import ValidateLastStep
from normlab.callbacks.progress import EpochProgress, RunEstimate, StepProgress
from normlab.compute import keep_heap
from normlab.errors import ConfigError
from normlab.preflight import preflight
from normlab.run import resume, rundir

SUMMARY_GROUPS = ("train", "val", "test", "diverged")  # metric prefixes a run's result keeps
# set by a command that runs train.py as its jobs (scripts/reproduce.py, a card): its jobs'
# train.py overrides are not the user's to type, so their estimate says no "shorter:" and no
# num_threads=1 (the outer command has its own estimate, --quick and --threads); normlab.run.task
# leaves the continue line to it
OUTER_ENV = "NORMLAB_OUTER_COMMAND"
RESUMED_DIR_WARNING = r"Checkpoint directory .* exists and is not empty"  # ModelCheckpoint's


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


def train(
    cfg: DictConfig,
    checkpoint: dict[str, Any] | None = None,
    callbacks: Sequence[pl.Callback] = (),
    validated: bool = False,
) -> tuple[dict[str, Any], Objects]:
    """One config built (build), fitted and tested (fit): ({'status', 'note' (why not ok),
    'metrics', 'seed'}, the objects it built)."""
    objects = build(cfg, checkpoint, callbacks, validated)
    return fit(objects), objects


def build(
    cfg: DictConfig,
    checkpoint: dict[str, Any] | None = None,
    callbacks: Sequence[pl.Callback] = (),
    validated: bool = False,
) -> Objects:
    """Data, task, callbacks (cfg's, then `callbacks`), trackers and trainer of one config.

    Nothing is written to the run dir before the checks pass: the config (unless `validated`
    by the caller), the trackers' servers, a checkpoint to resume against the model, an earlier
    run of another config in the dir, whether the run dir and checkpoint dirs can be written
    (normlab.run.resume). `checkpoint`: the one at cfg.ckpt_path, when the caller read it."""
    console.configure()
    if not validated:
        config.validate(cfg)
    loggers.check_servers(cfg.get("logger"))
    ckpt = resume.resolve_ckpt(cfg)  # ckpt_path=last with nothing to resume fails before data
    other = resume.other_run(cfg)  # before a random seed is written into cfg
    seed, datamodule, task = build_task(cfg)
    preflight(task, int(cfg.batch))
    checkpoint, move_aside = resume.check(cfg, task, ckpt, checkpoint, other)
    hparams: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    built = [*build_callbacks(cfg, hparams), *callbacks]
    dirs = [Path(c.dirpath) for c in built if getattr(c, "dirpath", None)]
    rundir.claim(resume.run_dir(cfg), dirs, move_aside)
    if cfg.get("channels_last"):
        task = task.to(memory_format=torch.channels_last)
    if cfg.get("compile"):
        task.net = torch.compile(task.net)
    trackers = build_loggers(cfg, resume.resume_point(checkpoint))
    trainer = build_trainer(cfg, built, trackers)
    if cfg.trainer.get("accelerator") == "cpu":
        # Lightning's import sets PYTORCH_NVML_BASED_CUDA_CHECK=1 (not to start CUDA before a
        # fork), and then torch.cuda.is_available(), asked by every optimizer step, loads NVML
        # anew each time (~40 us a step); a CPU run never uses CUDA: torch's cached check it is
        os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    return Objects(cfg, datamodule, task, built, trackers, trainer, ckpt, seed, hparams)


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


def build_callbacks(cfg: DictConfig, resolved: dict[str, Any] | None = None) -> list[pl.Callback]:
    """The config (`resolved`, cfg resolved when the caller has it) and the training epoch's
    running means in every checkpoint, a validation at a last step inside an epoch,
    cfg.callbacks (a null entry dropped), the estimate, step and epoch lines (progress)."""
    if resolved is None:
        resolved = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    callbacks: list[pl.Callback] = [
        resume.ConfigInCheckpoint(resolved),  # type: ignore[arg-type]
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
    if cfg.get("progress") in ("epoch", "bar"):
        hint_over_s = math.inf if os.environ.get(OUTER_ENV) else 60.0  # a job: no train.py hint
        own = not cfg.get("num_threads")
        callbacks.append(RunEstimate(hint_over_s=hint_over_s, own_threads=own))
    if cfg.get("progress") == "epoch":
        callbacks += [StepProgress(float(cfg.get("progress_every") or 30)), EpochProgress()]
    return callbacks


def build_loggers(cfg: DictConfig, resume_at: dict[str, int | None]) -> list[pl.loggers.Logger]:
    """The trackers; `resume_at` (resume.resume_point) tells the CSV log where a resumed run
    continues."""
    built = []
    for name, lg_cfg in (cfg.get("logger") or {}).items():
        if lg_cfg is not None:
            built.append(instantiate(lg_cfg, **(resume_at if name == "csv" else {})))
    if not any(isinstance(lg, pl.loggers.CSVLogger) for lg in built):
        built.insert(0, loggers.ResumableCSVLogger(resume.run_dir(cfg), "csv", "", **resume_at))
    return built


def build_trainer(
    cfg: DictConfig, callbacks: list[pl.Callback], trackers: list[pl.loggers.Logger]
) -> pl.Trainer:
    """cfg.trainer's Trainer; a progress bar when progress=bar (or trainer.enable_progress_bar)."""
    bar = cfg.trainer.get("enable_progress_bar")
    shown = cfg.get("progress") == "bar" if bar is None else bar
    return instantiate(cfg.trainer, callbacks=callbacks, logger=trackers, enable_progress_bar=shown)


def fit(objects: Objects) -> dict[str, Any]:
    """Fit what build() made, then test ModelCheckpoint's best checkpoint (the final weights
    without one): {'status', 'note' (why not ok), 'metrics', 'seed'}."""
    o, status, error = objects, "failed", None
    trackers = o.trainer.loggers  # o.loggers, or a DummyLogger under fast_dev_run (no logs)
    try:
        with loggers.sigterm_ends_run():
            for tracker in trackers:
                tracker.log_hyperparams(o.hparams)
            with warnings.catch_warnings():
                if o.ckpt_path is not None:  # a resume: the checkpoint dir holds its own files
                    warnings.filterwarnings("ignore", RESUMED_DIR_WARNING)
                o.trainer.fit(o.task, datamodule=o.datamodule, ckpt_path=o.ckpt_path,
                              weights_only=False)  # fmt: skip
            if o.trainer.received_sigterm:  # in fit's last batch: Lightning let it finish
                raise SIGTERMException()
            status = getattr(o.task, "run_status", "ok")
            metrics = _scalars(o.trainer.callback_metrics)
            if o.cfg.get("test") and status == "ok" and is_overridden("test_step", o.task):
                found = [c for c in o.trainer.callbacks if isinstance(c, ModelCheckpoint)]
                best = found[0].best_model_path if found else ""
                o.trainer.test(o.task, datamodule=o.datamodule, ckpt_path=best or None,
                               weights_only=False)  # fmt: skip
                metrics.update(_scalars(o.trainer.callback_metrics))
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


def _scalars(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """Final train/val/test metrics (per-step duplicates `*_step` and diagnostics left out)."""
    return {
        k.removesuffix("_epoch"): float(v)
        for k, v in metrics.items()
        if v.numel() == 1 and not k.endswith("_step") and k.split("/")[0] in SUMMARY_GROUPS
    }
