"""Group normalization (Wu & He, 2018): per sample, over groups of channels and spatial dims."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from normlab.norms.base import (
    Norm,
    NormConfigError,
    channel_view,
    check_eps,
    check_positive_int,
    kernel_affine,
    standardize,
    stats_dtype,
)
from normlab.norms.registry import register_norm
from normlab.norms.standardize import GroupStandardize


@register_norm("groupnorm", aliases=("gn",))
class GroupNorm(Norm):
    """Group normalization over (N, C, *): C split into `num_groups` groups of C / G channels.

    `bias=False` (with affine=True) learns the weight only, as torch's `bias` keyword.
    """

    family = "groupnorm"
    impls = ("fast", "reference", "manual")
    affine_key = "affine"

    def __init__(
        self,
        num_features: int,
        num_groups: int = 32,
        eps: float = 1e-5,
        affine: bool = True,
        impl: str = "fast",
        *,
        bias: bool = True,
        channel_dim: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(impl, channel_dim)
        self.num_features = check_positive_int(self.family, "num_features", num_features)
        self.num_groups = check_positive_int(self.family, "num_groups", num_groups)
        if num_features % num_groups:
            raise NormConfigError(
                f"groupnorm: num_groups={num_groups} does not divide num_channels={num_features}"
            )
        self.eps = check_eps(self.family, eps)
        self.affine = affine
        self._init_affine((num_features,), affine, affine and bias, device, dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, num_groups={self.num_groups}, eps={self.eps}, "
            f"affine={self.affine}, impl={self.impl!r}"
        )

    def _check_input(self, x: torch.Tensor) -> None:
        self._check_channels(x, self.num_features)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = kernel_affine(x, self.weight, self.bias, (self.num_features,))
        return F.group_norm(x, self.num_groups, weight, bias, self.eps)

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        # y = (x - E[x]) / sqrt(Var[x] + eps) * weight + bias with E and Var over each group's
        # channels and positions (the GN paper's equations); autograd for the backward
        per_group = math.prod(x.shape[1:]) // self.num_groups
        groups = x.to(stats_dtype(x.dtype)).reshape(x.shape[0], self.num_groups, per_group)
        y = standardize(groups, (2,), self.eps).view(x.shape)
        if self.weight is not None:
            y = y * channel_view(self.weight, x.dim())
        if self.bias is not None:
            y = y + channel_view(self.bias, x.dim())
        return y.to(x.dtype)

    def _manual(self, x: torch.Tensor) -> torch.Tensor:
        # the same formula with its gradient written out (normlab.norms.standardize)
        n, g = x.shape[0], self.num_groups
        groups = x.reshape(n, g, self.num_features // g, -1)  # (N, G, C/G, spatial)
        return GroupStandardize.apply(groups, self.weight, self.bias, self.eps).view(x.shape)
