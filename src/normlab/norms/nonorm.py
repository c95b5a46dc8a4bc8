"""The `none` choice: no normalization, a placeholder wherever a norm could sit."""

from __future__ import annotations

import torch

from normlab.norms.base import Norm
from normlab.norms.registry import register_norm


@register_norm("none", aliases=("identity",))
class NoNorm(Norm):
    """Returns its input unchanged."""

    family = "none"
    normalizes = False
    tokenwise = True  # returns each token as it is

    def __init__(
        self,
        num_features: int | None = None,
        impl: str = "fast",
        *,
        channel_dim: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """`device` and `dtype` are accepted (torch.nn's factory keywords): it holds no tensors."""
        super().__init__(impl, channel_dim)
        self._init_affine((), weight=False, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
