"""Resumable runs: `last.ckpt` every n steps (atomically) with the RNG states inside."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint


class LastCheckpoint(Checkpoint):
    """Write <dirpath>/last.ckpt every `every_n_train_steps` steps, after validation and at the end.

    The file is written to a temp name and renamed, so a run killed while saving leaves the
    previous last.ckpt intact. The checkpoint also carries the python/numpy/torch RNG states,
    so a resumed run draws the same random numbers as an uninterrupted one. Being a
    `Checkpoint`, it runs after the other callbacks of a step; it flushes the trackers' buffers
    before saving, so the logs on disk reach at least the checkpoint's step.
    """

    def __init__(self, dirpath: str, every_n_train_steps: int = 100):
        self.dirpath = Path(dirpath)
        self.every_n_train_steps = every_n_train_steps

    def save(self, trainer: pl.Trainer) -> None:
        if trainer.sanity_checking:
            return
        for logger in trainer.loggers:
            logger.save()
        path = self.dirpath / "last.ckpt"
        tmp = self.dirpath / ".last.ckpt.tmp"
        trainer.save_checkpoint(tmp, weights_only=False)  # full state, said explicitly
        if trainer.is_global_zero:
            os.replace(tmp, path)
        trainer.strategy.barrier("last_checkpoint")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n = self.every_n_train_steps
        if n > 0 and trainer.global_step % n == 0 and not trainer.should_stop:
            self.save(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self.save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.save(trainer)

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
