"""Per-channel statistics with running averages: the part BatchNorm and InstanceNorm share."""

from __future__ import annotations

import math

import torch

from normlab.norms.base import (
    Norm,
    NormConfigError,
    channel_view,
    check_eps,
    check_positive_int,
    mean_var,
    scale_shift,
    stats_dtype,
)


class RunningStatsNorm(Norm):
    """Normalise each channel by statistics over `_reduce_dims`, kept as running averages.

    Training (or `track_running_stats=False`) normalises with the batch's biased variance;
    the running variance is updated with the unbiased (Bessel, n / (n - 1)) one, weighted by
    `momentum`, or by 1 / num_batches_tracked (a cumulative average) when momentum is None.
    Eval with tracked statistics normalises with running_mean and running_var.
    `bias=False` (with affine=True) learns the weight only, as torch's `bias` keyword.
    """

    _min_dim = 2  # input dims needed
    _stat_unit = "channel"  # what one statistic is computed for, in error messages

    def __init__(
        self,
        num_features: int,
        eps: float,
        momentum: float | None,
        affine: bool,
        track_running_stats: bool,
        impl: str,
        channel_dim: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(impl, channel_dim)
        self.num_features = check_positive_int(self.family, "num_features", num_features)
        self.eps = check_eps(self.family, eps)
        numeric = isinstance(momentum, (int, float)) and not isinstance(momentum, bool)
        if momentum is not None and not (numeric and 0.0 <= momentum <= 1.0):
            raise NormConfigError(
                f"{self.family}: momentum must be in [0, 1] or None, got {momentum}"
            )
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        self._init_affine((num_features,), affine, affine and bias, device, dtype)
        if track_running_stats:  # as torch's _NormBase: the counter on `device`, a long
            self.register_buffer(
                "running_mean", torch.zeros(num_features, device=device, dtype=dtype)
            )
            self.register_buffer(
                "running_var", torch.ones(num_features, device=device, dtype=dtype)
            )
            self.register_buffer(
                "num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device)
            )
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats}, impl={self.impl!r}"
        )

    def reset_running_stats(self) -> None:
        """Forget the running statistics (mean 0, variance 1, no batches seen)."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1.0)
            self.num_batches_tracked.zero_()

    # ---------------------------------------------------------------- which statistics

    def _reduce_dims(self, x: torch.Tensor) -> tuple[int, ...]:
        """The dims the statistics are taken over."""
        raise NotImplementedError

    def _use_batch_stats(self) -> bool:
        return self.training or not self.track_running_stats

    def _updates_running_stats(self) -> bool:
        return self.training and self.track_running_stats

    def _momentum_for_step(self) -> float:
        """Count a training step and return the weight of its statistics in the running average."""
        if not self._updates_running_stats():
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def _check_input(self, x: torch.Tensor) -> None:
        self._check_channels(x, self.num_features, self._min_dim)
        if self._use_batch_stats():
            values = math.prod(x.shape[d] for d in self._reduce_dims(x))
            if values == 1:  # 0: an empty input, which gives an empty output
                mode = "in training" if self.training else "without running statistics"
                raise NormConfigError(
                    f"{self.family} {mode} needs more than 1 value per {self._stat_unit}, "
                    f"got input of shape {tuple(x.shape)} ({values} value)"
                )

    # ---------------------------------------------------------------- forward

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        """The formula (the families' `_normalize_with_batch_stats`), and every case a fast
        kernel leaves to it: an empty input, statistics synchronised across processes."""
        factor = self._momentum_for_step()
        if x.numel() == 0 and not self._syncing():
            # as torch's BatchNorm: an empty output (zero parameter gradients), the step counted
            # in num_batches_tracked, the running statistics unchanged (no values to update with)
            return self._normalize(x, x.new_zeros(()), x.new_ones(()))
        if not self._use_batch_stats():
            mean = channel_view(self.running_mean, x.dim())
            var = channel_view(self.running_var, x.dim())
            return self._normalize(x, mean, var)
        y, mean, var_unbiased = self._normalize_with_batch_stats(x)
        if self._updates_running_stats():
            self._update_running_stats(mean, var_unbiased, factor)
        return y

    def _manual(self, x: torch.Tensor) -> torch.Tensor:
        return self._reference(x)  # the family's `_normalize_with_batch_stats` reads impl

    def _syncing(self) -> bool:
        """Whether statistics are synchronised across processes in this call."""
        return False

    def _kernel_args(
        self, x: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        """(running_mean, running_var, weight, bias) to hand torch's F.batch_norm or
        F.instance_norm for input x; `_keep_running_stats` after the call.

        A float16/bfloat16 x gets the kernels' mixed-type form, float32 weight, bias and
        running statistics (ones and zeros when there is no affine; float32 copies of half
        running statistics): that form keeps the batch mean and invstd in float32, while with
        half or no parameters torch rounds them to half (at mean / std = 20, ~6 float16 ulps of
        every output).
        """
        acc = stats_dtype(x.dtype)
        if acc == x.dtype:
            return running_mean, running_var, self.weight, self.bias
        shape = (self.num_features,)
        weight = x.new_ones(shape, dtype=acc) if self.weight is None else self.weight.to(acc)
        bias = x.new_zeros(shape, dtype=acc) if self.bias is None else self.bias.to(acc)
        mean = None if running_mean is None else running_mean.to(acc)
        var = None if running_var is None else running_var.to(acc)
        return mean, var, weight, bias

    @torch.no_grad()
    def _keep_running_stats(self, mean: torch.Tensor | None, var: torch.Tensor | None) -> None:
        """Store the kernel's update of float32 copies (`_kernel_args`) in half running stats."""
        if mean is not None and mean is not self.running_mean and self._updates_running_stats():
            self.running_mean.copy_(mean)
            self.running_var.copy_(var)

    def _normalize(self, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        """y = (x - mean) / sqrt(var + eps) * weight + bias, weight and bias per channel.

        Written as y = x * scale + shift with scale = weight / sqrt(var + eps) and
        shift = bias - mean * scale, both computed on the per-channel statistics in
        `stats_dtype(x)` (float32 for a half input, whatever the running statistics' dtype);
        the result is in x's dtype.
        """
        acc = stats_dtype(x.dtype)
        scale = torch.rsqrt(var.to(acc) + self.eps)
        if self.weight is not None:
            scale = scale * channel_view(self.weight, x.dim())
        shift = -mean.to(acc) * scale
        if self.bias is not None:
            shift = shift + channel_view(self.bias, x.dim())
        return scale_shift(x, scale, shift).to(x.dtype)

    def _batch_stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The reference paths' statistics: (xs, mean, var, n), xs = x in float64, mean and
        biased var of xs per `_reduce_dims` (two-pass, `mean_var`), n values per statistic.

        float64 whatever x's dtype: x - mean then uses a mean not rounded to x's precision (in
        float32, at mean 1e3 and std 1e-2, that rounding alone is up to 3e-3 of the std), so the
        reference is at least as accurate as torch's CPU kernel, which sums in double too.
        """
        dims = self._reduce_dims(x)
        xs = x.to(torch.float64)
        mean, var = mean_var(xs, dims)  # (1, C, 1, ...); biased var: the one that normalises
        return xs, mean, var, math.prod(x.shape[d] for d in dims)

    def _normalize_with_batch_stats(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Reference path: return (y, mean, unbiased var), statistics over `_reduce_dims`:
        y = (x - mean) / sqrt(var + eps) * weight + bias, computed in float64 (`_batch_stats`),
        y in x's dtype."""
        xs, mean, var, n = self._batch_stats(x)
        y = self._affine((xs - mean) / torch.sqrt(var + self.eps))
        return y.to(x.dtype), mean, var * (n / (n - 1))

    def _affine(self, x_hat: torch.Tensor) -> torch.Tensor:
        """weight * x_hat + bias, per channel (each when the layer has it)."""
        y = x_hat
        if self.weight is not None:
            y = channel_view(self.weight, x_hat.dim()) * y
        if self.bias is not None:
            y = y + channel_view(self.bias, x_hat.dim())
        return y

    @torch.no_grad()
    def _update_running_stats(
        self, mean: torch.Tensor, var_unbiased: torch.Tensor, factor: float
    ) -> None:
        """running = (1 - factor) * running + factor * batch, batch stats averaged over samples."""
        batch_mean = mean.detach().reshape(-1, self.num_features).mean(0)
        batch_var = var_unbiased.detach().reshape(-1, self.num_features).mean(0)
        self.running_mean.mul_(1.0 - factor).add_(batch_mean, alpha=factor)
        self.running_var.mul_(1.0 - factor).add_(batch_var, alpha=factor)
