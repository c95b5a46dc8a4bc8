"""Log text and pictures to every tracker of a run (and to files in the run dir)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from PIL import Image


def run_dir(trainer: pl.Trainer) -> Path:
    """The run's output dir (trainer.default_root_dir is set to it by conf/trainer)."""
    return Path(trainer.default_root_dir)


def log_text(trainer: pl.Trainer, key: str, text: str) -> Path:
    """Append text to <run dir>/<key>.txt and send it to wandb / TensorBoard / MLflow."""
    step = trainer.global_step
    path = run_dir(trainer) / f"{key.replace('/', '_')}.txt"
    if trainer.is_global_zero:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(f"--- step {step}\n{text}\n")
    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger):
            lg.log_text(key, columns=["step", "text"], data=[[step, text]], step=None)
        elif isinstance(lg, TensorBoardLogger):
            lg.experiment.add_text(key, f"```\n{text}\n```", step)
        elif isinstance(lg, MLFlowLogger):
            lg.experiment.log_text(lg.run_id, text, f"{key}/step_{step:07d}.txt")
    return path


def log_image(trainer: pl.Trainer, key: str, image: np.ndarray, name: str) -> Path:
    """Save an (H, W) or (H, W, 3) uint8 image as <run dir>/<name>.png and send it to trackers."""
    step = trainer.global_step
    path = run_dir(trainer) / f"{name}.png"
    if trainer.is_global_zero:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(path)
    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger):
            lg.log_image(key, images=[str(path)], step=None)
        elif isinstance(lg, TensorBoardLogger):
            fmt = "HW" if image.ndim == 2 else "HWC"
            lg.experiment.add_image(key, image, step, dataformats=fmt)
        elif isinstance(lg, MLFlowLogger):
            lg.experiment.log_artifact(lg.run_id, str(path), key)
    return path
