"""Adaptive norms: a base norm, then shift/scale regressed from a condition.

One idea, four names. Every layer here computes

    h = norm(x);  shift, scale[, gate] = Linear(act(c));  y = h * (1 + scale) + shift

and differs only in the base norm, the feature axis, the activation before the regression,
whether a residual gate is regressed too, and how the regression starts:

    AdaLN           (DiT, Peebles & Xie 2023)   layernorm on tokens (B, T, D), SiLU, default init
    AdaLNZero       (DiT)                       AdaLN + a gate per branch, regression zero-init
    FiLM            (Perez et al. 2018)         no norm: gamma(z) * x + beta(z), gamma = 1 + dgamma
    ScaleShiftNorm  (ADM, Dhariwal & Nichol 21) groupnorm on conv features (B, C, H, W), SiLU

`forward(x, c)` returns h, and (h, gate) for a gated layer: its block is `x + gate * F(h)`.
(normlab's DiT writes these out in its blocks, as DiT's code does: a regression Linear(SiLU(c))
per branch and `modulate`.)

The base norm is a norm layer (a callable width -> module, `build_norm`). In DiT's layers its
affine is switched off through the keyword its family names (`affine_key`, a trait of the
class): the regressed shift/scale replace it. ADM's ScaleShiftNorm keeps the GroupNorm's
own affine (guided-diffusion's `normalization()` is a plain affine GroupNorm), computes it in
fp32 and regresses its chunks in the order (scale, shift).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from normlab.norms.groupnorm import GroupNorm
from normlab.norms.layernorm import LayerNorm
from normlab.norms.nonorm import NoNorm
from normlab.norms.registry import NormLayer, build_norm, norm_traits


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


class AdaptiveNorm(nn.Module):
    """norm(x) * (1 + scale(c)) + shift(c) (and a residual gate(c)), regressed by Linear(act(c))."""

    def __init__(
        self,
        num_features: int,
        cond_dim: int,
        norm: NormLayer = LayerNorm,
        dim: int = -1,
        activation: bool = True,
        gated: bool = False,
        zero_init: bool = False,
        norm_affine: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """`device`, `dtype`: torch.nn's factory keywords, for the regression and the norm (built,
        then moved and cast: the norm may be any callable)."""
        super().__init__()
        traits = None if norm_affine else norm_traits(norm)  # ADM: the norm keeps its affine
        if traits is not None and traits.affine_key is not None:  # DiT: the regressed shift and
            norm = functools.partial(norm, **{traits.affine_key: False})  # scale replace it
        self.norm = build_norm(norm, num_features, dim)
        self.dim = dim
        self.gated = gated
        self.zero_init = zero_init
        self.num_chunks = 3 if gated else 2  # shift, scale[, gate]
        self.modulation = nn.Sequential(
            nn.SiLU() if activation else nn.Identity(),
            nn.Linear(cond_dim, self.num_chunks * num_features),
        )
        self.reset_parameters()
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        """Zero-init: shift = scale = gate = 0 for every c, so the layer starts as the plain norm
        and a gated branch starts switched off; otherwise torch's default Linear init."""
        linear = self.modulation[1]
        if self.zero_init:
            nn.init.zeros_(linear.weight)
            nn.init.zeros_(linear.bias)
        else:
            linear.reset_parameters()

    @property
    def normalizes(self) -> bool:
        """Whether its inner norm normalizes (FiLM's, and any over `none`, only modulates)."""
        return bool(getattr(self.norm, "normalizes", False))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, gated={self.gated}, zero_init={self.zero_init}"

    def forward(
        self, x: torch.Tensor, c: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The modulated norm of x; a gated layer also returns the gate, shaped like x's
        broadcast (multiply the branch output by it before adding it to the residual)."""
        chunks = self.modulation(c).chunk(self.num_chunks, dim=-1)  # each (B, F)
        h = modulate(self.norm(x), chunks[0], chunks[1], self.dim)
        return (h, broadcast_to(chunks[2], x, self.dim)) if self.gated else h


class AdaLN(AdaptiveNorm):
    """Adaptive LayerNorm (DiT "adaLN"): shift/scale from Linear(SiLU(c)), no gate."""

    def __init__(
        self,
        num_features: int,
        cond_dim: int,
        norm: NormLayer = LayerNorm,
        zero_init: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_features, cond_dim, norm, dim=-1, zero_init=zero_init, device=device, dtype=dtype
        )


class AdaLNZero(AdaptiveNorm):
    """adaLN-Zero: AdaLN plus a residual gate; zero-init regression: a block starts as identity."""

    def __init__(
        self,
        num_features: int,
        cond_dim: int,
        norm: NormLayer = LayerNorm,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_features, cond_dim, norm, dim=-1, gated=True, zero_init=True,
            device=device, dtype=dtype,
        )  # fmt: skip


class FiLM(AdaptiveNorm):
    """FiLM: gamma(z) * x + beta(z) with linear gamma, beta; gamma = 1 + dgamma as in the paper."""

    def __init__(
        self,
        num_features: int,
        cond_dim: int,
        dim: int = 1,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_features, cond_dim, NoNorm, dim=dim, activation=False, device=device, dtype=dtype
        )


class ScaleShiftNorm(AdaptiveNorm):
    """ADM's scale-shift norm on (B, C, H, W): GroupNorm (own affine, fp32) * (1 + scale) + shift.

    As guided-diffusion's ResBlock with `use_scale_shift_norm`: `GroupNorm32` (an affine
    nn.GroupNorm run on x.float() and cast back to x's dtype), then
    `scale, shift = chunk(Linear(SiLU(emb)), 2)` (scale first), cast to h's dtype.
    Keep the layer's parameters in fp32 (ADM's fp16 mode converts only convs and linears).
    """

    def __init__(
        self,
        num_channels: int,
        cond_dim: int,
        num_groups: int = 32,
        eps: float = 1e-5,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        norm = functools.partial(GroupNorm, num_groups=num_groups, eps=eps)
        super().__init__(
            num_channels, cond_dim, norm, dim=1, norm_affine=True, device=device, dtype=dtype
        )

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.modulation(emb).chunk(2, dim=-1)  # (B, C) each, ADM's order
        h = self.norm(x.float()).to(x.dtype)  # (B, C, H, W): statistics and affine in fp32
        return modulate(h, shift.to(h.dtype), scale.to(h.dtype), self.dim)
