"""Class-conditional DDPM training (epsilon prediction), EMA weights, DDIM sampling with CFG."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from normlab.errors import ConfigError
from normlab.tasks.base import Task


@contextmanager
def eval_mode(net: nn.Module) -> Iterator[nn.Module]:
    """Run `net` in eval mode (no label dropout) and restore its mode afterwards."""
    was_training = net.training
    net.eval()
    try:
        yield net
    finally:
        net.train(was_training)


class DiffusionTask(Task):
    """DDPM on class-labelled images: net(x_t, t, y) predicts eps; MSE to the true eps.

    Forward process: x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps, abar_t = prod_s<=t (1 - beta_s),
    beta linear from `beta_start` to `beta_end` over `num_timesteps` steps (Ho et al. 2020).
    The model works on images in [-1, 1]: with `rescale`, batches standardized by the data
    module (x - mean) / std are mapped back with the data module's `mean` and `std`.
    An exponential moving average of the weights (`ema`, saved in checkpoints) is used for
    validation, test and sampling. Sampling is DDIM (eta = 0) with classifier-free guidance.
    """

    monitor = "val/loss"
    monitor_mode = "min"

    def __init__(
        self,
        net: nn.Module,
        optim: Mapping[str, Any],
        num_timesteps: int = 1000,
        beta_start: float = 1e-4,
        beta_end: float = 2e-2,
        ema_decay: float = 0.9999,
        ema_warmup: bool = True,
        sample_steps: int = 50,
        guidance_scale: float = 1.0,
        clip_denoised: bool = True,
        rescale: bool = True,
    ) -> None:
        super().__init__(net, optim)
        # ValueErrors about its own arguments: the config layer names their keys (config.py)
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay!r}")
        if not 0.0 < beta_start < beta_end < 1.0:
            raise ValueError(
                f"beta_start={beta_start}, beta_end={beta_end}: need 0 < start < end < 1"
            )
        self.num_timesteps = num_timesteps
        self.ema_decay = ema_decay
        self.ema_warmup = ema_warmup
        self.sample_steps = sample_steps
        self.guidance_scale = guidance_scale
        self.clip_denoised = clip_denoised
        self.rescale = rescale
        self.ema = copy.deepcopy(net).requires_grad_(False)
        betas = torch.linspace(beta_start, beta_end, num_timesteps, dtype=torch.float64)
        self.register_buffer("alphas_bar", torch.cumprod(1 - betas, 0).float(), persistent=False)
        # the data module's standardization, kept in checkpoints to turn samples into pixels
        self.register_buffer("data_mean", torch.tensor(0.0))
        self.register_buffer("data_std", torch.tensor(1.0))

    # ----- data space <-> model space ---------------------------------------------------------

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self._trainer else None
        if self.rescale and dm is not None:
            if not hasattr(dm, "mean") or not hasattr(dm, "std"):
                raise ConfigError(
                    f"rescale=True needs the data module ({type(dm).__name__}) to expose the "
                    "`mean` and `std` of its standardization; train with rescale off"
                )
            self.data_mean.fill_(float(dm.mean))
            self.data_std.fill_(float(dm.std))

    def to_model_space(self, x: torch.Tensor) -> torch.Tensor:
        """Standardized batch -> the space the diffusion runs in ([-1, 1] with rescale)."""
        if not self.rescale:
            return x
        return (x * self.data_std + self.data_mean) * 2 - 1

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Model-space images -> pixel intensities in [0, 1]."""
        unit = (x + 1) / 2 if self.rescale else x * self.data_std + self.data_mean
        return unit.clamp(0, 1)

    # ----- training -----------------------------------------------------------------------------

    @property
    def num_classes(self) -> int:
        return self.net.num_classes

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.net.in_channels, self.net.input_size, self.net.input_size)

    def example_input(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        x = torch.randn(batch_size, *self.image_shape)
        t = torch.randint(0, self.num_timesteps, (batch_size,))
        y = torch.randint(0, self.num_classes, (batch_size,))
        return x, t, y

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(x, t, y)

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps."""
        abar = self.alphas_bar[t].view(-1, 1, 1, 1)
        return abar.sqrt() * x0 + (1 - abar).sqrt() * noise

    def diffusion_loss(
        self,
        net: nn.Module,
        batch: tuple[torch.Tensor, torch.Tensor],
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """MSE between eps and net(x_t, t, y) for a uniform t and a fresh eps per image."""
        x, y = batch
        x0 = self.to_model_space(x)  # (B, C, H, W)
        B, device = x0.shape[0], x0.device
        t = torch.randint(0, self.num_timesteps, (B,), device=device, generator=generator)
        noise = torch.randn(x0.shape, device=device, generator=generator)
        return F.mse_loss(net(self.q_sample(x0, t, noise), t, y), noise)

    def training_step(self, batch, batch_idx):
        loss = self.diffusion_loss(self.net, batch)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def _eval_step(self, batch, batch_idx: int, split: str) -> None:
        # the same t and eps for a batch every epoch, so epochs compare on the same draws
        gen = torch.Generator(device=self.device).manual_seed(batch_idx)
        with eval_mode(self.ema) as ema:
            loss = self.diffusion_loss(ema, batch, gen)
        self.log(f"{split}/loss", loss, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, batch_idx, "test")

    # ----- EMA ----------------------------------------------------------------------------------

    def current_ema_decay(self, step: int | None = None) -> float:
        """ema_decay, warmed up as min(decay, (1 + n) / (10 + n)) so short runs move the EMA;
        n = `step`, by default the optimizer steps taken (global_step)."""
        n = self.global_step if step is None else step
        return min(self.ema_decay, (1 + n) / (10 + n)) if self.ema_warmup else self.ema_decay

    @torch.no_grad()
    def update_ema(self, step: int | None = None) -> None:
        """ema <- decay * ema + (1 - decay) * weights; buffers are copied. `step`: as in
        current_ema_decay."""
        decay = self.current_ema_decay(step)
        for ema_p, p in zip(self.ema.parameters(), self.net.parameters(), strict=True):
            ema_p.lerp_(p, 1 - decay)
        for ema_b, b in zip(self.ema.buffers(), self.net.buffers(), strict=True):
            ema_b.copy_(b)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        # Right after the weights change, before the callbacks' on_train_batch_end (a checkpoint
        # saved there holds this update); global_step counts this step once this returns.
        self.update_ema(step=self.global_step + 1)

    # ----- sampling -----------------------------------------------------------------------------

    def guided_eps(
        self, net: nn.Module, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Classifier-free guidance: eps_uncond + scale * (eps_cond - eps_uncond).

        At scale 1 that is eps_cond: one forward pass instead of two."""
        if scale == 1.0:
            return net(x, t, y)  # (B, C, H, W)
        null = torch.full_like(y, net.null_class)
        both = net(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]))  # (2B, C, H, W)
        eps_cond, eps_uncond = both.chunk(2)
        return eps_uncond + scale * (eps_cond - eps_uncond)

    def ddim_timesteps(self, steps: int) -> torch.Tensor:
        """`steps` timesteps evenly spaced over [0, T - 1], descending."""
        if not 1 <= steps <= self.num_timesteps:
            raise ConfigError(f"sample steps must be in [1, {self.num_timesteps}], got {steps}")
        ts = torch.linspace(0, self.num_timesteps - 1, steps, device=self.device)
        return ts.round().long().flip(0)

    @torch.no_grad()
    def sample(
        self,
        y: torch.Tensor,
        steps: int | None = None,
        guidance_scale: float | None = None,
        seed: int = 0,
        use_ema: bool = True,
    ) -> torch.Tensor:
        """DDIM (eta = 0) samples in model space for labels y (B,); deterministic given `seed`."""
        steps = steps or self.sample_steps
        scale = self.guidance_scale if guidance_scale is None else guidance_scale
        y = y.to(self.device)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        x = torch.randn((y.shape[0], *self.image_shape), generator=gen, device=self.device)
        ts = self.ddim_timesteps(steps)
        with eval_mode(self.ema if use_ema else self.net) as net:
            for i, t in enumerate(ts):
                abar = self.alphas_bar[t]
                abar_prev = self.alphas_bar[ts[i + 1]] if i + 1 < len(ts) else abar.new_tensor(1.0)
                eps = self.guided_eps(net, x, t.expand(y.shape[0]), y, scale)  # (B, C, H, W)
                x0 = (x - (1 - abar).sqrt() * eps) / abar.sqrt()  # predicted clean image
                if self.clip_denoised and self.rescale:
                    x0 = x0.clamp(-1, 1)
                    eps = (x - abar.sqrt() * x0) / (1 - abar).sqrt()  # eps consistent with x0
                x = abar_prev.sqrt() * x0 + (1 - abar_prev).sqrt() * eps
        return x

    def sample_pixels(self, y: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """`sample` mapped to pixel intensities in [0, 1], (B, C, H, W)."""
        return self.to_pixels(self.sample(y, **kwargs))
