"""Instance normalization (Ulyanov et al., 2016): per sample, per channel, over spatial dims."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from normlab.norms.running import RunningStatsNorm


class InstanceNorm(RunningStatsNorm):
    """Instance normalization over (N, C, L) or (N, C, H, W); (N, C) has no spatial extent.

    Defaults follow torch (affine=False, track_running_stats=False). Running statistics are the
    per-instance statistics averaged over the batch. Unlike torch, which leaves them unchanged
    when momentum is None and never counts num_batches_tracked, momentum=None gives the
    cumulative average and num_batches_tracked counts training steps, as in BatchNorm.
    """

    family = "instancenorm"
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
        sync: bool = False,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, impl, sync)

    def _reduce_dims(self, x: torch.Tensor) -> tuple[int, ...]:
        return tuple(range(2, x.dim()))

    def _fast(self, x: torch.Tensor, factor: float) -> torch.Tensor:
        return self._kernel(
            F.instance_norm,
            x,
            self.running_mean,
            self.running_var,
            self._use_batch_stats(),
            factor,
            self.eps,
        )
