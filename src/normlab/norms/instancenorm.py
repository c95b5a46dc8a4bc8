"""Instance normalization (Ulyanov et al., 2016): per sample, per channel, over spatial dims."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from normlab.norms.base import NormConfigError, check_positive_int, stats_dtype
from normlab.norms.registry import register_norm
from normlab.norms.running import RunningStatsNorm
from normlab.norms.standardize import GroupStandardize


@register_norm("instancenorm", aliases=("in",))
class InstanceNorm(RunningStatsNorm):
    """Instance normalization over (N, C, L) or (N, C, H, W); (N, C) has no spatial extent.

    Defaults follow torch (affine=False, track_running_stats=False). Running statistics are the
    per-instance statistics averaged over the batch. Unlike torch, which leaves them unchanged
    when momentum is None and never counts num_batches_tracked, momentum=None gives the
    cumulative average and num_batches_tracked counts training steps, as in BatchNorm.

    `spatial_dims` (torch's InstanceNorm1d/2d/3d: 1/2/3) fixes the input's rank: (N, C, *spatial)
    or, as torch accepts, one unbatched sample (C, *spatial) with that many spatial dims. None
    takes a batched input with any number of spatial dims (an unbatched one would be ambiguous).
    """

    family = "instancenorm"
    impls = ("fast", "reference", "manual")
    spatial = True  # statistics over each sample's positions: (N, C) has none
    affine_key = "affine"
    _min_dim = 3  # (N, C) would be read by torch's InstanceNorm1d as one unbatched (C, L)
    _stat_unit = "channel of each sample"

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        impl: str = "fast",
        *,
        bias: bool = True,
        spatial_dims: int | None = None,
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
        if spatial_dims is not None:
            check_positive_int(self.family, "spatial_dims", spatial_dims)
        self.spatial_dims = spatial_dims

    def extra_repr(self) -> str:
        dims = "" if self.spatial_dims is None else f", spatial_dims={self.spatial_dims}"
        return super().extra_repr() + dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.spatial_dims
        if k is not None and x.dim() == k + 1:  # one unbatched sample: a batch of one
            return super().forward(x.unsqueeze(0)).squeeze(0)
        if k is not None and x.dim() != k + 2:
            raise NormConfigError(
                f"{self.family} with spatial_dims={k} needs an input (N, C, *spatial) or "
                f"(C, *spatial) with {k} spatial dims, got input of shape {tuple(x.shape)}"
            )
        return super().forward(x)

    def _reduce_dims(self, x: torch.Tensor) -> tuple[int, ...]:
        return tuple(range(2, x.dim()))

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        """torch's F.instance_norm; an empty input takes `_reference`."""
        if x.numel() == 0:
            return self._reference(x)
        factor = self._momentum_for_step()
        mean, var, weight, bias = self._kernel_args(x, self.running_mean, self.running_var)
        y = F.instance_norm(x, mean, var, weight, bias, self._use_batch_stats(), factor, self.eps)
        self._keep_running_stats(mean, var)
        return y

    def _normalize_with_batch_stats(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """reference: the formula with autograd (RunningStatsNorm). manual: GroupStandardize,
        the standardization's gradient written out, with one group per channel of each sample;
        the statistics for the running averages (mean and unbiased var per sample and channel)
        computed apart, without gradient, only when they are updated."""
        if self.impl != "manual":
            return super()._normalize_with_batch_stats(x)
        n, c = x.shape[:2]
        groups = x.reshape(n, c, 1, math.prod(x.shape[2:]))  # (N, C, 1, spatial)
        y = GroupStandardize.apply(groups, self.weight, self.bias, self.eps).view(x.shape)
        if not self._updates_running_stats():
            return y, None, None
        with torch.no_grad():
            var, mean = torch.var_mean(
                x.to(stats_dtype(x.dtype)), self._reduce_dims(x), correction=1, keepdim=True
            )
        return y, mean, var
