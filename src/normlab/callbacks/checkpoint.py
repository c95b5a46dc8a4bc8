"""Checkpoints: `best.ckpt` by the task's own metric (BestCheckpoint), and for resumable runs
`last.ckpt` every n steps (atomically) with the RNG states inside (LastCheckpoint); the running
epoch means of `self.log(..., on_epoch=True)` in every checkpoint (EpochMeansInCheckpoint)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.trainer.connectors.logger_connector.result import (
    _Metadata,
    _ResultCollection,
    _ResultMetric,
    _Sync,
)

from normlab.errors import RunDirError
from normlab.files import probe
from normlab.loggers import ResumableCSVLogger


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

    def _save_topk_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict) -> None:
        if (
            self.monitor is not None
            and self.monitor not in monitor_candidates
            and not trainer.fit_loop.epoch_loop.val_loop._has_run
        ):  # no validation yet (a run that stops before its first): nothing to rank by, where
            return  # Lightning saves nothing either, but warns that the key is missing
        super()._save_topk_checkpoint(trainer, monitor_candidates)


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
    log again: there the CSV log keeps the rows logged before the checkpoint
    (`csv_rows_at_batch`: a callback's value of the batch, logged at the step it ends) and
    those of the steps before the checkpoint's.
    """

    def __init__(self, dirpath: str, every_n_train_steps: int = 100):
        self.dirpath = Path(dirpath)
        self.every_n_train_steps = every_n_train_steps
        self._pending = False  # a step-interval save waits for the end of the epoch
        self._csv_rows: dict[str, int] = {}  # what the save under way stores: csv_rows or
        # csv_rows_at_batch

    def save(self, trainer: pl.Trainer, after_batch: bool = False) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run:  # no checkpoint, as ModelCheckpoint
            return
        self._pending = False
        for logger in trainer.loggers:
            logger.save()
        csv_logs = [lg for lg in trainer.loggers if isinstance(lg, ResumableCSVLogger)]
        key = "csv_rows_at_batch" if after_batch else "csv_rows"
        self._csv_rows = {key: csv_logs[0].rows} if csv_logs else {}
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
            self._csv_rows = {}
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
        checkpoint.update(self._csv_rows)  # not in other callbacks' checkpoints (best.ckpt)

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


EPOCH_MEANS_KEY = "train_epoch_means"  # a checkpoint's entry: the training epoch's aggregates
_META_FIELDS = ("fx", "name", "prog_bar", "logger", "on_step", "on_epoch", "enable_graph",
                "add_dataloader_idx", "dataloader_idx", "metric_attribute")  # fmt: skip


class EpochMeansInCheckpoint(pl.Callback):
    """Carry the training epoch's aggregates of `self.log(..., on_epoch=True)` tensors (the DiT's
    train/loss_epoch, say) through a checkpoint, so a run resumed mid-epoch logs the mean of the
    whole epoch, not of the steps after the resume.

    Lightning keeps them in the training loop's result collection, which no checkpoint holds.
    Every checkpoint stores each aggregate (its sum or extremum, batch count and how it was
    logged); a resumed run folds them in once the metric is logged again, after the first
    batch (Lightning resets a metric at the first batch of a loop), or sets them at the epoch's
    end when no batch of the epoch is left. At that first batch the value is the batch's own,
    so adding the stored sum gives the uninterrupted run's sum to the last bit."""

    def __init__(self) -> None:
        self._pending: dict[str, dict[str, Any]] = {}  # aggregates loaded, not yet folded in

    @staticmethod
    def _results(trainer: pl.Trainer) -> _ResultCollection:
        return trainer.fit_loop.epoch_loop._results

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        saved = {}
        for key, metric in self._results(trainer).items():
            meta = metric.meta
            if not metric.is_tensor or not meta.on_epoch or metric.has_reset:
                continue
            saved[key] = {
                "meta": {f: getattr(meta, f) for f in _META_FIELDS},
                "reduce_fx": meta.reduce_fx.__name__,
                "sync": meta.sync.should,
                "rank_zero_only": meta.sync.rank_zero_only,
                "value": metric.value.detach().cpu().clone(),
                "count": (metric.cumulated_batch_size.detach().cpu().clone()
                          if meta.is_mean_reduction else None),
            }  # fmt: skip
        saved.update(self._pending)  # loaded and not folded in yet: still part of the epoch
        checkpoint[EPOCH_MEANS_KEY] = saved

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        self._pending = dict(checkpoint.get(EPOCH_MEANS_KEY) or {})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._pending:
            self._fold(trainer, create=False)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._pending:
            self._fold(trainer, create=True)

    def _fold(self, trainer: pl.Trainer, create: bool) -> None:
        """Fold the pending aggregates into the metrics logged since the resume; with `create`,
        set the ones not logged since (the epoch ended without another batch)."""
        results = self._results(trainer)
        for key, saved in list(self._pending.items()):
            metric = results.get(key)
            if metric is None or metric.has_reset:
                if not create:
                    continue
                meta = _Metadata(**saved["meta"], reduce_fx=saved["reduce_fx"])
                meta.sync = _Sync(fn=trainer.strategy.reduce, _should=saved["sync"],
                                  rank_zero_only=saved["rank_zero_only"])  # fmt: skip
                metric = results[key] = _ResultMetric(meta, is_tensor=True)
                metric.value = saved["value"].to(metric.value)
                if saved["count"] is not None:
                    metric.cumulated_batch_size = saved["count"].to(metric.cumulated_batch_size)
                metric._update_count = 1  # as if updated: compute() does not warn
            elif metric.meta.is_mean_reduction or metric.meta.is_sum_reduction:
                metric.value = metric.value + saved["value"].to(metric.value)
                if saved["count"] is not None:
                    metric.cumulated_batch_size = metric.cumulated_batch_size + saved["count"]
            else:  # max or min
                metric.value = metric.meta.reduce_fx(metric.value, saved["value"].to(metric.value))
            metric._computed = None  # the epoch value is computed from the folded state
            del self._pending[key]
