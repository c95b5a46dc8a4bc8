"""Adaptive norms (DiT, Peebles & Xie 2023): a plain norm, then a shift and scale regressed from
a condition c, and under adaLN-Zero a gate on the residual branch.

    h = norm(x);  shift, scale[, gate] = Linear(SiLU(c));  y = modulate(h, shift, scale)

The norm is the block's own (any tokenwise norm layer, its affine off: the regression replaces
it). What is adaptive is the regression, and it is what the DiT builds (normlab.models.dit): one
per residual branch, as DiT's block `x = x + gate * F(modulate(norm(x), shift, scale))`:

    AdaLN       shift, scale; torch's default Linear init (DiT's "adaLN")
    AdaLNZero   shift, scale, gate; the Linear starts at zero, so the gate is closed and the
                block starts as the identity (DiT's "adaLN-Zero")

FiLM (Perez et al. 2018) is `modulate` with gamma = 1 + scale, beta = shift, without the norm.
"""

from __future__ import annotations

import torch
from torch import nn


def broadcast_to(t: torch.Tensor, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """View a per-sample feature tensor (B, F) so it broadcasts against x along x's axis `dim`."""
    shape = [1] * x.dim()
    shape[0], shape[dim] = t.shape[0], t.shape[1]
    return t.view(shape)


def modulate(
    x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, dim: int = -1
) -> torch.Tensor:
    """x * (1 + scale) + shift, with shift/scale (B, F) broadcast over every axis but 0 and `dim`.

    dim=-1 for tokens (B, T, D) or vectors (B, D); dim=1 for conv features (B, C, H, W).
    """
    return x * (1 + broadcast_to(scale, x, dim)) + broadcast_to(shift, x, dim)


class AdaLN(nn.Sequential):
    """adaLN's regression Linear(SiLU(c)): c (B, D) -> (shift, scale), (B, D) each.

    `zero_init`: the Linear starts at zero (shift = scale = 0 for every c: the norm starts plain,
    as DiT's final layer under adaLN-Zero); else torch's default Linear init."""

    chunks = 2  # shift, scale

    def __init__(self, dim: int, zero_init: bool = False) -> None:
        super().__init__(nn.SiLU(), nn.Linear(dim, self.chunks * dim))
        self.zero_init = zero_init
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """adaLN-Zero: zeros, so shift = scale = gate = 0 for every c (a gated branch starts
        switched off, a norm starts plain); adaLN: torch's default Linear init."""
        if self.zero_init:
            nn.init.zeros_(self[1].weight)
            nn.init.zeros_(self[1].bias)
        else:
            self[1].reset_parameters()

    def forward(self, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return super().forward(c).chunk(self.chunks, dim=1)  # (B, D) each


class AdaLNZero(AdaLN):
    """adaLN-Zero's regression: c (B, D) -> (shift, scale, gate), (B, D) each, from zeros."""

    chunks = 3  # shift, scale, gate

    def __init__(self, dim: int, zero_init: bool = True) -> None:
        super().__init__(dim, zero_init)
