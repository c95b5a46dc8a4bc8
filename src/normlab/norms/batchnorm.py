"""Batch normalization (Ioffe & Szegedy, 2015): hand-written backward, sync, ghost batches."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from normlab.norms.base import NormConfigError, channel_view, check_positive_int, stats_dtype
from normlab.norms.registry import register_norm
from normlab.norms.running import RunningStatsNorm


def _world_size() -> int:
    """Number of processes statistics are synchronised over (1 when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def _check_count(n: int | torch.Tensor, local: int, x: torch.Tensor) -> None:
    """Raise NormConfigError unless the values per channel, `n` over all processes, exceed 1.

    With more than one value here (`local`), the global count does too and is not read: the
    host waits for the device only in the degenerate case of at most 1 local value per channel,
    where the error needs the count of the other processes."""
    if local > 1:
        return
    total = int(n)  # a host sync, on this edge case only
    if total <= 1:
        raise NormConfigError(
            f"batchnorm in training needs more than 1 value per channel over all processes, "
            f"got {total} (local input of shape {tuple(x.shape)})"
        )


class BatchNormFunction(torch.autograd.Function):
    """Batch norm with batch statistics and the BN paper's backward, summed over all processes.

    Forward all-reduces one tensor (sum, sum of squares, count) per channel; backward
    all-reduces the two sums its equations need (sum dy, sum dy * xhat). With one process
    (or torch.distributed not initialised) nothing is reduced: this is the `manual` impl.
    Returns (y, mean, unbiased var); the statistics are for the running averages. For a
    float16/bfloat16 x, mean, invstd, xhat (saved for backward), the backward's sums and dx are
    float32 (`stats_dtype`), cast to x's dtype at the end; the statistics are returned in float32.
    No host sync: the count over all processes stays a tensor (read only to report a batch of
    at most one value per channel here, `_check_count`); the float64 sums stay on the device.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        dims = (0, *range(2, x.dim()))
        c = x.shape[1]
        # statistics over all but dim 1 (N and spatial), accumulated in float64 so that
        # var = E[x^2] - mean^2 does not cancel; one tensor so that one all-reduce suffices
        x64 = x.to(torch.float64)
        local = x.numel() // c
        count = torch.full((1,), local, dtype=torch.float64, device=x.device)
        stats = torch.cat([x64.sum(dims), (x64 * x64).sum(dims), count])
        n = local  # a number known on the host: no sync with the device
        if _world_size() > 1:
            dist.all_reduce(stats)
            n = stats[-1]  # the global count, a tensor: used as one, never read on the host
        _check_count(n, local, x)
        mean64 = stats[:c] / n
        var64 = (stats[c : 2 * c] / n - mean64 * mean64).clamp_min(0.0)  # biased
        acc = stats_dtype(x.dtype)
        mean = mean64.to(acc)
        invstd = torch.rsqrt(var64 + eps).to(acc)
        xhat = (x - channel_view(mean, x.dim())) * channel_view(invstd, x.dim())  # acc dtype
        y = xhat
        if weight is not None:
            y = xhat * channel_view(weight, x.dim())
        if bias is not None:
            y = y + channel_view(bias, x.dim())
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.n = n
        var_unbiased = (var64 * (n / (n - 1))).to(acc)
        ctx.mark_non_differentiable(mean, var_unbiased)
        return y.to(x.dtype), mean, var_unbiased

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, _dmean, _dvar):
        xhat, invstd, weight = ctx.saved_tensors
        n, ndim, c = ctx.n, dy.dim(), dy.shape[1]
        dims = (0, *range(2, ndim))
        acc = xhat.dtype  # float32 for a half input: sums and dx in float32
        sums = torch.cat([dy.sum(dims, dtype=acc), (dy * xhat).sum(dims)])
        dbeta, dgamma = sums[:c].clone(), sums[c:].clone()  # this process's share, as DDP expects
        if _world_size() > 1:
            dist.all_reduce(sums)
        sum_dy, sum_dy_xhat = sums[:c], sums[c:]
        gamma = weight if weight is not None else torch.ones_like(invstd)
        # The BN paper's equations with dxhat = dy * gamma and (x - mean) = xhat / invstd:
        #   dl/dvar  = sum(dxhat * (x - mean)) * -1/2 * (var + eps)^(-3/2)
        #   dl/dmean = sum(dxhat) * -1 / sqrt(var + eps)   (its dl/dvar term sums (x - mean) = 0)
        #   dl/dx    = dxhat / sqrt(var + eps) + dl/dvar * 2 (x - mean) / n + dl/dmean / n
        dvar = -0.5 * gamma * sum_dy_xhat * invstd * invstd
        dmean = -gamma * sum_dy * invstd
        dx = None
        if ctx.needs_input_grad[0]:
            dx = (
                dy * channel_view(gamma * invstd, ndim)
                + xhat * channel_view(dvar * 2.0 / (n * invstd), ndim)
                + channel_view(dmean / n, ndim)
            ).to(dy.dtype)
        has_affine = weight is not None
        return (
            dx,
            dgamma.to(weight.dtype) if has_affine and ctx.needs_input_grad[1] else None,
            dbeta.to(weight.dtype) if has_affine and ctx.needs_input_grad[2] else None,
            None,
        )


@register_norm("batchnorm", aliases=("bn", "batchnorm1d", "batchnorm2d"))  # + timm's names
class BatchNorm(RunningStatsNorm):
    """Batch normalization over (N, C), (N, C, L) or (N, C, H, W): statistics over all but C.

    `ghost_batch` (Ghost BN, Hoffer et al. 2017; the GN paper's per-GPU statistics on one
    machine): batch statistics per consecutive slice of that many samples, and running
    statistics updated with their average over slices, as data-parallel training would.
    """

    family = "batchnorm"
    impls = ("fast", "reference", "manual")
    affine_key = "affine"
    syncable = True

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        impl: str = "fast",
        sync: bool = False,
        ghost_batch: int | None = None,
        *,
        bias: bool = True,
        channel_dim: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_features,
            eps,
            momentum,
            affine,
            track_running_stats,
            impl,
            channel_dim,
            bias=bias,
            device=device,
            dtype=dtype,
        )
        self.sync = bool(sync)
        if ghost_batch is not None:
            check_positive_int(self.family, "ghost_batch", ghost_batch)
            if sync:
                raise NormConfigError(
                    f"{self.family}: ghost_batch cannot be combined with sync=True"
                )
        self.ghost_batch = ghost_batch

    def extra_repr(self) -> str:
        ghost = "" if self.ghost_batch is None else f", ghost_batch={self.ghost_batch}"
        return super().extra_repr() + ghost

    def _reduce_dims(self, x: torch.Tensor) -> tuple[int, ...]:
        return (0, *range(2, x.dim()))

    def _syncing(self) -> bool:
        # as torch's SyncBatchNorm: only in training, when ranks step together
        return self.sync and self.training and _world_size() > 1

    def _check_input(self, x: torch.Tensor) -> None:
        if self._syncing():  # the count that matters is the global one, checked after reducing
            self._check_channels(x, self.num_features)
        else:
            super()._check_input(x)
        if self._ghosting(x):
            n, g = x.shape[0], self.ghost_batch
            if n % g:
                raise NormConfigError(
                    f"{self.family}: batch size {n} is not a multiple of ghost_batch={g}, "
                    f"got input of shape {tuple(x.shape)}"
                )
            values = g * math.prod(x.shape[2:])
            if values <= 1:
                mode = "in training" if self.training else "without running statistics"
                raise NormConfigError(
                    f"{self.family} {mode} needs more than 1 value per channel in each ghost "
                    f"batch, got input of shape {tuple(x.shape)} with ghost_batch={g} "
                    f"({values} value)"
                )

    def _ghosting(self, x: torch.Tensor) -> bool:
        """Whether this call normalises each ghost batch by its own statistics."""
        if self.ghost_batch is None or not self._use_batch_stats() or x.numel() == 0:
            return False
        return x.shape[:1] != (self.ghost_batch,)  # N == ghost_batch is plain BN

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        if not self._ghosting(x):
            return super()._reference(x)
        factor = self._momentum_for_step()
        y, mean, var_unbiased = self._normalize_ghost_batches(x)
        if self._updates_running_stats():
            self._update_running_stats(mean, var_unbiased, factor)
        return y

    def _normalize_ghost_batches(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Ghost BN, every impl: return (y, mean, unbiased var), statistics one row per slice.

        x viewed as (G, b, C, *S) with b = ghost_batch; mean and biased var per slice and
        channel over dims (1, 3, ...) (the slice's samples and spatial positions), in at least
        float32; y = (x - mean) / sqrt(var + eps) * weight + bias, autograd for the backward.
        """
        xs = x.unflatten(0, (-1, self.ghost_batch))
        xs = xs.to(torch.promote_types(x.dtype, torch.float32))
        dims = (1, *range(3, xs.dim()))
        n = math.prod(xs.shape[d] for d in dims)
        # two-pass (E[x^2] - E[x]^2 cancels when a slice of few values has a variance far
        # below its mean^2); both (G, 1, C, 1, ...), (G, C) after reshape
        var, mean = torch.var_mean(xs, dims, correction=0, keepdim=True)
        y = (xs - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * channel_view(self.weight, x.dim())
        if self.bias is not None:
            y = y + channel_view(self.bias, x.dim())
        return y.flatten(0, 1).to(x.dtype), mean, var * (n / (n - 1))

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        """torch's F.batch_norm (`_fast_ghost` for ghost batches); sync and an empty input take
        `_reference`."""
        if self._syncing() or x.numel() == 0:
            return self._reference(x)
        if self._ghosting(x):
            return self._fast_ghost(x)
        factor = self._momentum_for_step()
        track = not self.training or self.track_running_stats
        running = (self.running_mean, self.running_var) if track else (None, None)
        mean, var, weight, bias = self._kernel_args(x, *running)
        y = F.batch_norm(x, mean, var, weight, bias, self._use_batch_stats(), factor, self.eps)
        self._keep_running_stats(mean, var)
        return y

    def _fast_ghost(self, x: torch.Tensor) -> torch.Tensor:
        """Ghost BN in one call of torch's kernel: x (G * b, C, *S), b = ghost_batch, is seen as
        (b, G * C, *S), a plain batch of G * C channels, one per (slice, channel), so each is
        normalised over its slice's b samples and positions. One copy in and one out (x's
        slices are not contiguous per channel), against the reference's chain of elementwise
        ops and their intermediates. The kernel's running statistics, zeros updated with
        momentum 1, are the slices' mean and unbiased var; float32 for a half x, whose weight
        and bias then go in float32 (`_kernel_args`).
        """
        factor = self._momentum_for_step()
        b, c, shape = self.ghost_batch, self.num_features, x.shape
        g = shape[0] // b
        xt = x.unflatten(0, (g, b)).transpose(0, 1).reshape(b, g * c, *shape[2:])
        _, _, weight, bias = self._kernel_args(x, None, None)
        weight, bias = (None if p is None else p.repeat(g) for p in (weight, bias))
        stats = x.new_zeros(2, g * c, dtype=stats_dtype(x.dtype))  # mean, unbiased var
        y = F.batch_norm(xt, stats[0], stats[1], weight, bias, True, 1.0, self.eps)
        if self._updates_running_stats():
            self._update_running_stats(stats[0], stats[1], factor)
        return y.unflatten(1, (g, c)).transpose(0, 1).reshape(shape)

    def _normalize_with_batch_stats(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.impl == "manual" or self._syncing():
            return BatchNormFunction.apply(x, self.weight, self.bias, self.eps)
        return super()._normalize_with_batch_stats(x)
