"""A text sample from the language model at the end of every validation epoch."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from normlab.callbacks.media import log_text


class TextSample(pl.Callback):
    """Sample `length` characters after `prompt` (fixed seed; temperature 0 = greedy)."""

    def __init__(
        self, length: int = 200, temperature: float = 0.8, prompt: str = "\n", seed: int = 0
    ):
        if temperature < 0:
            raise ValueError(f"callbacks.text_sample.temperature must be >= 0, got {temperature}")
        self.length, self.temperature, self.prompt, self.seed = length, temperature, prompt, seed

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        diverged = getattr(pl_module, "run_status", "ok") != "ok"  # NaN weights cannot sample
        if trainer.sanity_checking or diverged or not trainer.is_global_zero:
            return
        data = trainer.datamodule
        idx = data.encode(self.prompt)[None].to(pl_module.device)  # (1, P)
        was_training = pl_module.training
        pl_module.eval()
        g = torch.Generator(device=pl_module.device).manual_seed(self.seed)
        out = pl_module.net.generate(idx, self.length, self.temperature, generator=g)  # (1, P + L)
        pl_module.train(was_training)
        log_text(trainer, "samples/text", data.decode(out[0]))
