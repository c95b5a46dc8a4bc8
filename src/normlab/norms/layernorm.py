"""Layer normalization (Ba et al., 2016): per sample, over the trailing feature dims."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from normlab.norms.base import (
    Norm,
    NormConfigError,
    channel_view,
    check_eps,
    check_positive_int,
    mean_var,
    scale_shift,
)


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


class LayerNorm(Norm):
    """Layer normalization over the trailing dims `normalized_shape` of (..., *normalized_shape)."""

    family = "layernorm"
    natural_channel_dim = -1

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        normalized_shape: int | Sequence[int] | None = None,
        impl: str = "fast",
        sync: bool = False,
    ) -> None:
        super().__init__(impl, sync)
        self.normalized_shape = trailing_shape(self.family, num_features, normalized_shape)
        self.eps = check_eps(self.family, eps)
        self.elementwise_affine = elementwise_affine
        self._init_affine(self.normalized_shape, elementwise_affine, elementwise_affine and bias)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, impl={self.impl!r}"
        )

    def set_channel_dim(self, channel_dim: int) -> Norm:
        if channel_dim == 1 and len(self.normalized_shape) != 1:
            raise NormConfigError(
                f"{self.family}: channel_dim=1 needs one feature dim, "
                f"got normalized_shape={self.normalized_shape}"
            )
        return super().set_channel_dim(channel_dim)

    def _check_input(self, x: torch.Tensor) -> None:
        if self.channel_dim == 1:
            self._check_channels(x, self.normalized_shape[0])
        else:
            self._check_trailing(x, self.normalized_shape)

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        if self.channel_dim == 1:  # over (C, *spatial): GroupNorm with one group
            return F.group_norm(x, 1, self.weight, self.bias, self.eps)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        if self.channel_dim == 1:  # per sample over (C, *spatial), per-channel affine
            mean, var = mean_var(x, tuple(range(1, x.dim())))  # (N, 1, ..., 1)
            # y = (x - mean) / sqrt(var + eps) * weight + bias as x * scale + shift, (N, C, 1..)
            scale = torch.rsqrt(var + self.eps)
            if self.weight is not None:
                scale = scale * channel_view(self.weight, x.dim())
            shift = -mean * scale
            if self.bias is not None:
                shift = shift + channel_view(self.bias, x.dim())
            return scale_shift(x, scale, shift)
        mean, var = mean_var(x, tuple(range(-len(self.normalized_shape), 0)))  # trailing dims
        rstd = torch.rsqrt(var + self.eps)
        xhat = scale_shift(x, rstd, -mean * rstd)  # (x - mean) / sqrt(var + eps)
        if self.weight is None:
            return xhat if self.bias is None else xhat.add_(self.bias)
        y = xhat * self.weight
        return y if self.bias is None else y.add_(self.bias)  # in place: backward keeps xhat
