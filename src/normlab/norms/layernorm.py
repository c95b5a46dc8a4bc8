"""Layer normalization (Ba et al., 2016): per sample, over the trailing feature dims."""

from __future__ import annotations

import math
from collections.abc import Sequence

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
from normlab.norms.standardize import GroupStandardize, RowStandardize


def trailing_shape(family: str, num_features: int, normalized_shape: object) -> tuple[int, ...]:
    """The normalised trailing dims: `normalized_shape` (int or sequence) if given, else (D,)."""
    if normalized_shape is None:
        return (check_positive_int(family, "num_features", num_features),)
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if not isinstance(normalized_shape, Sequence) or len(normalized_shape) == 0:
        raise NormConfigError(
            f"{family}: normalized_shape must be an int or a non-empty sequence of ints, "
            f"got {normalized_shape!r}"
        )
    return tuple(check_positive_int(family, "normalized_shape", d) for d in normalized_shape)


def check_one_feature_dim(norm: Norm) -> None:
    """Raise unless a norm over trailing dims given channel_dim=1 has one feature dim (C)."""
    if norm.channel_dim == 1 and len(norm.normalized_shape) != 1:
        raise NormConfigError(
            f"{norm.family}: channel_dim=1 needs one feature dim, "
            f"got normalized_shape={norm.normalized_shape}"
        )


@register_norm("layernorm", aliases=("ln",))
class LayerNorm(Norm):
    """Layer normalization over the trailing dims `normalized_shape` of (..., *normalized_shape)."""

    family = "layernorm"
    impls = ("fast", "reference", "manual")
    natural_channel_dim = -1
    tokenwise = True
    affine_key = "elementwise_affine"

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        normalized_shape: int | Sequence[int] | None = None,
        impl: str = "fast",
        *,
        channel_dim: int = -1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(impl, channel_dim)
        self.normalized_shape = trailing_shape(self.family, num_features, normalized_shape)
        check_one_feature_dim(self)
        self.eps = check_eps(self.family, eps)
        self.elementwise_affine = elementwise_affine
        self._init_affine(
            self.normalized_shape, elementwise_affine, elementwise_affine and bias, device, dtype
        )

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, impl={self.impl!r}"
        )

    def _check_input(self, x: torch.Tensor) -> None:
        if self._whole_sample:
            self._check_channels(x, self.normalized_shape[0])
        else:
            self._check_trailing(x, self.normalized_shape)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = kernel_affine(x, self.weight, self.bias, self.normalized_shape)
        if self._whole_sample:  # over (C, *spatial): GroupNorm with one group
            return F.group_norm(x, 1, weight, bias, self.eps)
        return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        # y = (x - E[x]) / sqrt(Var[x] + eps) * weight + bias, per sample over the normalized
        # dims (the LN paper's equations); autograd for the backward
        y = standardize(x.to(stats_dtype(x.dtype)), self._normalized_dims(x), self.eps)
        weight, bias = self.weight, self.bias
        if self._whole_sample:  # per-channel affine over (C, *spatial)
            weight = None if weight is None else channel_view(weight, x.dim())
            bias = None if bias is None else channel_view(bias, x.dim())
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        return y.to(x.dtype)

    def _normalized_dims(self, x: torch.Tensor) -> tuple[int, ...]:
        """The dims one statistic is taken over: (C, *spatial), or the trailing dims."""
        if self._whole_sample:
            return tuple(range(1, x.dim()))
        return tuple(range(x.dim() - len(self.normalized_shape), x.dim()))

    def _manual(self, x: torch.Tensor) -> torch.Tensor:
        # the same formula with its gradient written out (normlab.norms.standardize)
        if self._whole_sample:  # per sample over (C, *spatial), per-channel affine
            groups = x.reshape(x.shape[0], 1, x.shape[1], -1)  # (N, 1, C, spatial)
            y = GroupStandardize.apply(groups, self.weight, self.bias, self.eps)
            return y.view(x.shape)
        d = math.prod(self.normalized_shape)  # per row of the trailing dims, affine per column
        weight = None if self.weight is None else self.weight.reshape(d)
        bias = None if self.bias is None else self.bias.reshape(d)
        return RowStandardize.apply(x.reshape(-1, d), weight, bias, self.eps).view(x.shape)


@register_norm("layernorm2d")
class LayerNorm2d(LayerNorm):
    """timm's LayerNorm2d (ConvNeXt's): each position of (N, C, *spatial) normalized over its C
    channels, affine per channel; channel_dim=-1: LayerNorm over the last dim of (..., D).

    Not LayerNorm with channel_dim=1, which normalizes each sample over (C, *spatial) (the GN
    paper's; timm's GroupNorm1). eps defaults to timm's 1e-6.
    """

    family = "layernorm2d"
    natural_channel_dim = 1
    per_position = True
    tokenwise = False  # for channels-first conv features; (B, T, D) tokens take the 1d family

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-6,
        elementwise_affine: bool = True,
        bias: bool = True,
        impl: str = "fast",
        *,
        channel_dim: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_features, eps, elementwise_affine, bias, None, impl,
            channel_dim=channel_dim, device=device, dtype=dtype,
        )  # fmt: skip
