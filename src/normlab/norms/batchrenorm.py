"""Batch renormalization (Ioffe, 2017): BN whose training output is corrected towards the
running statistics, so that training and inference normalize alike.

In training, with the batch's mean mu_B and biased variance var_B per channel and the running
statistics mu, var (the values before this step's update):

    sigma_B = sqrt(var_B + eps),  sigma = sqrt(var + eps)
    r = clip(sigma_B / sigma, 1 / r_max, r_max)        (no gradient: stop_gradient in the paper)
    d = clip((mu_B - mu) / sigma, -d_max, d_max)       (no gradient)
    x_hat = (x - mu_B) / sigma_B * r + d
    y = gamma * x_hat + beta

then mu and var are updated with momentum as BatchNorm updates them (the Bessel-corrected batch
variance). Without clipping, x_hat = (x - mu) / sigma: the inference normalization. In eval the
running statistics normalize, as in BatchNorm.

The paper's schedule: r_max = 1 and d_max = 0 (plain BatchNorm) for the first `warmup_steps`
training steps, then both relaxed linearly to their final values over `relax_steps`; the step
count is the buffer `renorm_steps` (in the state_dict, so a resumed run continues the schedule),
advanced by every training forward.

One difference from the paper's Algorithm 1: it keeps a moving average of sigma_B, this keeps
BatchNorm's moving average of the variance (sigma = sqrt(running_var + eps)); the state_dict
holds BatchNorm's keys plus `renorm_steps`, and an eval-mode BatchRenorm is a BatchNorm.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from normlab.norms.base import NormConfigError, channel_view, stats_dtype
from normlab.norms.registry import register_norm
from normlab.norms.running import RunningStatsNorm


def _check_number(name: str, value: object, low: float) -> float:
    """`value` as a float if it is a finite number >= low, else NormConfigError naming it."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < low:
        raise NormConfigError(
            f"batchrenorm: {name} must be a finite number >= {low}, got {value!r}"
        )
    return float(value)


def _check_steps(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NormConfigError(f"batchrenorm: {name} must be an integer >= 0, got {value!r}")
    return value


@register_norm("batchrenorm", aliases=("brn",))
class BatchRenorm(RunningStatsNorm):
    """Batch renormalization over (N, C), (N, C, L) or (N, C, H, W): statistics over all but C.

    `r_max`, `d_max`: the clipping limits the schedule ends at (the paper: 3 and 5);
    `warmup_steps`: training steps of plain BN (r_max 1, d_max 0) before relaxing;
    `relax_steps`: steps over which the limits grow linearly to r_max, d_max (0: at once).
    The running statistics are always tracked: r and d are defined by them.

    impl `fast`: torch's batch_norm kernel with the per-channel affine (gamma * r, gamma * d +
    beta), which is y's formula with r and d constants; `reference`: the formula, autograd.
    """

    family = "batchrenorm"
    affine_key = "affine"

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        r_max: float = 3.0,
        d_max: float = 5.0,
        warmup_steps: int = 5000,
        relax_steps: int = 35000,
        impl: str = "fast",
        *,
        channel_dim: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_features,
            eps,
            momentum,
            affine,
            True,
            impl,
            channel_dim,
            device=device,
            dtype=dtype,
        )
        self.r_max = _check_number("r_max", r_max, 1.0)
        self.d_max = _check_number("d_max", d_max, 0.0)
        self.warmup_steps = _check_steps("warmup_steps", warmup_steps)
        self.relax_steps = _check_steps("relax_steps", relax_steps)
        self.register_buffer("renorm_steps", torch.tensor(0, dtype=torch.long, device=device))

    def extra_repr(self) -> str:
        return super().extra_repr() + (
            f", r_max={self.r_max}, d_max={self.d_max}, warmup_steps={self.warmup_steps}, "
            f"relax_steps={self.relax_steps}"
        )

    def _reduce_dims(self, x: torch.Tensor) -> tuple[int, ...]:
        return (0, *range(2, x.dim()))

    def limits(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(r_max, d_max) for the training step of index t = `renorm_steps` (0-based): 1 and 0
        for t < warmup_steps, then growing linearly to r_max, d_max, reached at
        t = warmup_steps + relax_steps - 1. 0-dim tensors: no host sync on an accelerator."""
        t = self.renorm_steps.float()
        if self.relax_steps > 0:
            progress = ((t - self.warmup_steps + 1) / self.relax_steps).clamp(0.0, 1.0)
        else:
            progress = (t >= self.warmup_steps).float()
        return 1.0 + (self.r_max - 1.0) * progress, self.d_max * progress

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        y = super()._reference(x)  # reads the schedule at renorm_steps
        if self.training:
            self.renorm_steps.add_(1)
        return y

    @torch.no_grad()
    def _r_d(self, mean: torch.Tensor, var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """r and d per channel, (C,), from the batch's mean and biased var; no gradient."""
        r_max, d_max = (t.to(mean.dtype) for t in self.limits())
        sigma_b = torch.sqrt(var + self.eps)
        sigma = torch.sqrt(self.running_var.to(mean.dtype) + self.eps)
        r = torch.clamp(sigma_b / sigma, 1.0 / r_max, r_max)
        d = torch.clamp((mean - self.running_mean.to(mean.dtype)) / sigma, -d_max, d_max)
        return r, d

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        """torch's kernel. Training: batch statistics with weight gamma * r and bias
        gamma * d + beta (r, d constants to it), the running statistics updated by the kernel as
        BatchNorm's are; a half x in the kernel's mixed-type form, float32 weight, bias and
        statistics. Eval: the running statistics, as BatchNorm. An empty input: `_reference`."""
        if x.numel() == 0:
            return self._reference(x)
        factor = self._momentum_for_step()
        if not self.training:
            mean, var, weight, bias = self._kernel_args(x, self.running_mean, self.running_var)
            return F.batch_norm(x, mean, var, weight, bias, False, 0.0, self.eps)
        acc = stats_dtype(x.dtype)
        with torch.no_grad():
            var, mean = torch.var_mean(x.to(acc), self._reduce_dims(x), correction=0)
        r, d = self._r_d(mean, var)
        scale, shift = r, d
        if self.weight is not None:
            scale, shift = self.weight.to(acc) * r, self.weight.to(acc) * d
        if self.bias is not None:
            shift = shift + self.bias.to(acc)
        running_mean, running_var = self.running_mean.to(acc), self.running_var.to(acc)
        y = F.batch_norm(x, running_mean, running_var, scale, shift, True, factor, self.eps)
        self._keep_running_stats(running_mean, running_var)  # half buffers: the update
        self.renorm_steps.add_(1)
        return y

    def _normalize_with_batch_stats(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Reference path: the paper's formula, in float64 (`_batch_stats`); returns (y, mean,
        unbiased var) for the update."""
        xs, mean, var, n = self._batch_stats(x)  # (1, C, 1, ...), biased var
        r, d = self._r_d(mean.flatten(), var.flatten())
        x_hat = (xs - mean) / torch.sqrt(var + self.eps) * channel_view(r, x.dim())
        x_hat = x_hat + channel_view(d, x.dim())
        return self._affine(x_hat).to(x.dtype), mean, var * (n / (n - 1))
