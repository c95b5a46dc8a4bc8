"""A grid of generated samples (one row per class) at the end of every k-th validation epoch."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torchvision.utils import make_grid

from normlab.callbacks.media import log_image


def image_grid(pixels: torch.Tensor, per_row: int) -> np.ndarray:
    """(N, C, H, W) in [0, 1] -> (rows * H', per_row * W') uint8 (or (.., .., 3) for colour)."""
    grid = make_grid(pixels.float().cpu(), nrow=per_row, padding=2, pad_value=1.0)  # (3, H', W')
    if pixels.shape[1] == 1:
        grid = grid[0]  # make_grid repeats a single channel three times
    else:
        grid = grid.permute(1, 2, 0)
    return (grid.clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def label_rows(grid: np.ndarray, labels: list[str], padding: int = 2) -> np.ndarray:
    """The grid with a white margin on its left holding each row's label, centred on the row
    (rows of equal height, `padding` pixels above each and below the last)."""
    font = ImageFont.load_default()
    width = max(int(font.getlength(text)) for text in labels) + 2 * padding + 2
    mode = "L" if grid.ndim == 2 else "RGB"
    canvas = Image.new(mode, (width + grid.shape[1], grid.shape[0]), "white")
    canvas.paste(Image.fromarray(grid), (width, 0))
    draw = ImageDraw.Draw(canvas)
    row = (grid.shape[0] - padding) / len(labels)  # a row: padding, then its images
    for i, text in enumerate(labels):
        middle = i * row + padding + (row - padding) / 2
        draw.text((padding, middle), text, fill="black", font=font, anchor="lm")
    return np.asarray(canvas)


class SampleGrid(pl.Callback):
    """Sample `per_class` images of every class with the EMA weights; save and log the grid,
    each row labelled with its class's name when the data module has them (`classes`)."""

    def __init__(
        self,
        per_class: int = 8,
        every_n_epochs: int = 1,
        steps: int | None = None,
        guidance_scale: float | None = None,
        seed: int = 0,
    ) -> None:
        self.per_class = per_class
        self.every_n_epochs = every_n_epochs
        self.steps = steps
        self.guidance_scale = guidance_scale
        self.seed = seed

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        labels = torch.arange(pl_module.num_classes).repeat_interleave(self.per_class)
        pixels = pl_module.sample_pixels(
            labels, steps=self.steps, guidance_scale=self.guidance_scale, seed=self.seed
        )  # (classes * per_class, C, H, W), row i = class i
        grid = image_grid(pixels, self.per_class)
        names = getattr(trainer.datamodule, "classes", None) if trainer.datamodule else None
        if names is not None and len(names) == pl_module.num_classes:
            grid = label_rows(grid, [str(n) for n in names])  # a row per class, named
        log_image(trainer, "samples", grid, f"samples/epoch_{trainer.current_epoch:03d}")
