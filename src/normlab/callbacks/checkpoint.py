"""Checkpoints: `best.ckpt` by the task's own metric (BestCheckpoint), and for resumable runs
`last.ckpt` every n steps (atomically) with the RNG states inside (LastCheckpoint)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint

from normlab.errors import RunDirError
from normlab.loggers import ResumableCSVLogger
from normlab.rundir import probe


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint whose `monitor: null` is the task's metric: the task's
    `monitor` and `monitor_mode` (normlab.tasks.base.Task), read when the trainer sets it up.
    `mode: null` is then the task's mode, else Lightning's default (min)."""

    def __init__(self, monitor: str | None = None, mode: str | None = None, **kwargs: Any):
        super().__init__(monitor=monitor, mode=mode or "min", **kwargs)
        self._mode_given = mode is not None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.monitor is None and getattr(pl_module, "monitor", None):
            self.monitor = pl_module.monitor
            if not self._mode_given:
                self.mode = pl_module.monitor_mode
                self.kth_value = torch.tensor(torch.inf if self.mode == "min" else -torch.inf)
        super().setup(trainer, pl_module, stage)


class LastCheckpoint(Checkpoint):
    """Write <dirpath>/last.ckpt every `every_n_train_steps` steps, after validation and at the end.

    The file is written to a temp name and renamed, so a run killed while saving leaves the
    previous last.ckpt intact. The checkpoint also carries the python/numpy/torch RNG states,
    so a resumed run draws the same random numbers as an uninterrupted one. Being a
    `Checkpoint`, it runs after the other callbacks of a step; it flushes the trackers' buffers
    before saving, so the logs on disk reach at least the checkpoint's step.

    A step-interval save that falls on an epoch's last batch waits for the end of the epoch: it
    is made after the epoch's validation (same step), or at the next step when no validation
    follows. Lightning resumes a checkpoint of an epoch's last batch as a finished epoch, so the
    epoch's validation, end-of-epoch hooks and epoch metrics would never happen.

    A checkpoint saved after validation or at the end of training also tells how many rows the
    CSV log had (`csv_rows`): a run resumed from it keeps those and logs everything after them
    again, such as the epoch's metrics, which Lightning logs after the validation at the step
    before. After a batch, Lightning logs that batch's metrics, which a resumed run does not
    log again: there the CSV log keeps the rows of the steps before the checkpoint's.
    """

    def __init__(self, dirpath: str, every_n_train_steps: int = 100):
        self.dirpath = Path(dirpath)
        self.every_n_train_steps = every_n_train_steps
        self._pending = False  # a step-interval save waits for the end of the epoch
        self._csv_rows: int | None = None  # what the save under way stores as csv_rows

    def save(self, trainer: pl.Trainer, after_batch: bool = False) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run:  # no checkpoint, as ModelCheckpoint
            return
        self._pending = False
        for logger in trainer.loggers:
            logger.save()
        csv_logs = [lg for lg in trainer.loggers if isinstance(lg, ResumableCSVLogger)]
        self._csv_rows = csv_logs[0].rows if csv_logs and not after_batch else None
        path = self.dirpath / "last.ckpt"
        tmp = self.dirpath / ".last.ckpt.tmp"
        try:
            if trainer.is_global_zero:
                tmp.unlink(missing_ok=True)
            trainer.save_checkpoint(tmp, weights_only=False)  # full state, said explicitly
            if trainer.is_global_zero and not tmp.is_file():  # Lightning drops a PermissionError
                probe([self.dirpath])  # raises, naming the cause
                raise OSError(f"{tmp} was not written")
        except (OSError, RunDirError) as err:  # disk full, dir read-only or removed: one line
            raise RunDirError(
                f"cannot save {path}: {err} (the previous {path.name}, if any, is intact)"
            ) from err
        finally:
            self._csv_rows = None
        if trainer.is_global_zero:
            os.replace(tmp, path)
        trainer.strategy.barrier("last_checkpoint")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n = self.every_n_train_steps
        due = self._pending or (n > 0 and trainer.global_step % n == 0)
        if not due or trainer.should_stop:
            return
        if batch_idx + 1 >= trainer.num_training_batches:  # the epoch's last batch
            self._pending = True
        else:
            self.save(trainer, after_batch=True)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self.save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.save(trainer)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._csv_rows is not None:  # not in other callbacks' checkpoints (best.ckpt)
            checkpoint["csv_rows"] = self._csv_rows

    def state_dict(self) -> dict[str, Any]:
        return {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
