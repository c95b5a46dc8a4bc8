"""Hydra callbacks (conf: hydra.callbacks), hooks around a run or a sweep, outside any job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class CreateSweepDir(Callback):
    """Create the sweep dir before the sweeper starts (Optuna's sqlite storage lives in it)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        Path(config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)
