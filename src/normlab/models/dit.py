"""Diffusion Transformer (DiT, Peebles & Xie 2023) with the paper's four ways to condition.

    x (B, C, H, W) -> patches (B, N, D) + fixed 2D sin-cos positions -> blocks -> final layer
    -> (B, N, p*p*C) -> eps prediction (B, C, H, W)

The condition is the timestep t and the class label y (an extra "null" class for classifier-free
guidance). `conditioning` picks how the blocks see it:

    adaln_zero  c = emb(t) + emb(y); every norm is AdaLN and each residual branch has a gate;
                the regressions start at zero, so each block starts as the identity
    adaln       the same without gates, regressions with the default init
    cross_attn  (emb(t), emb(y)) as a 2-token sequence that an extra cross-attention in each
                block attends to; plain norms
    in_context  emb(t), emb(y) prepended to the image tokens; plain norms; dropped before the
                final layer

The norms come from the registry (`norm`: the composed norm config); they must act on each
token over its last (feature) axis of (B, T, D): a family whose class declares `tokenwise`.
`norm_eps` (DiT's 1e-6, as its LayerNorms) replaces the norm config's eps in every norm the
model builds; None keeps the config's. `qk_norm`
(layernorm | rmsnorm | None, normlab.norms.qknorm) normalizes each head's queries and keys over
head_dim in every attention (self- and cross-), with norm_eps as their eps too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import Attention, Mlp, PatchEmbed
from torch import nn

from normlab.errors import ConfigError
from normlab.norms import NormConfigError, norm_from_config, norm_keywords, norm_traits, norms_with
from normlab.norms.adaptive import AdaLN, AdaLNZero, AdaptiveNorm, as_norm_config
from normlab.norms.qknorm import check_qk_norm, create_qk_norm

CONDITIONINGS = ("adaln_zero", "adaln", "cross_attn", "in_context")

# ---------------------------------------------------------------------------------------------
# Embeddings: 2D sin-cos positions, timesteps, class labels
# ---------------------------------------------------------------------------------------------


def sincos_1d(dim: int, positions: torch.Tensor, max_period: float = 10000.0) -> torch.Tensor:
    """(L,) positions -> (L, dim): [sin(pos * w_k), cos(pos * w_k)], w_k = max_period^(-k/half)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
    angles = positions.to(torch.float64)[:, None] * freqs[None]  # (L, half)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def sincos_2d(dim: int, grid_size: int) -> torch.Tensor:
    """Fixed 2D position embedding (grid_size^2, dim): half the channels per axis (row-major)."""
    if dim % 4:
        raise ConfigError(f"dit: 2D sin-cos positions need hidden_size % 4 == 0, got {dim}")
    coords = torch.arange(grid_size)
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")  # (G, G) each
    emb_rows = sincos_1d(dim // 2, rows.flatten())  # (G*G, D/2)
    emb_cols = sincos_1d(dim // 2, cols.flatten())  # (G*G, D/2)
    return torch.cat([emb_rows, emb_cols], dim=1).float()  # (G*G, D)


class TimestepEmbedder(nn.Module):
    """Timestep t -> sinusoidal features -> MLP(SiLU) -> (B, D)."""

    def __init__(self, hidden_size: int, frequency_dim: int = 256) -> None:
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(
            nn.Linear(frequency_dim, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        freqs = sincos_1d(self.frequency_dim, t).to(self.mlp[0].weight.dtype)  # (B, 256)
        return self.mlp(freqs)  # (B, D)


class LabelEmbedder(nn.Module):
    """Class label -> (B, D); class `num_classes` is the null label, used for dropped labels."""

    def __init__(self, num_classes: int, hidden_size: int, dropout: float) -> None:
        super().__init__()
        self.null_class = num_classes
        self.dropout = dropout
        self.table = nn.Embedding(num_classes + 1, hidden_size)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        if self.training and self.dropout > 0:
            drop = torch.rand(y.shape, device=y.device) < self.dropout  # (B,)
            y = torch.where(drop, torch.full_like(y, self.null_class), y)
        return self.table(y)  # (B, D)


# ---------------------------------------------------------------------------------------------
# Transformer block and final layer
# ---------------------------------------------------------------------------------------------


class CrossAttention(nn.Module):
    """Multi-head attention of the tokens x (B, N, D) to the condition tokens ctx (B, M, D);
    q_norm/k_norm normalize each head's queries/keys (nn.Identity: no QK-norm)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.q_norm = q_norm if q_norm is not None else nn.Identity()
        self.k_norm = k_norm if k_norm is not None else nn.Identity()

    def forward(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        H = self.num_heads
        q = self.q(x).view(B, N, H, D // H).transpose(1, 2)  # (B, H, N, D/H)
        k, v = self.kv(ctx).view(B, -1, 2, H, D // H).permute(2, 0, 3, 1, 4)  # (B, H, M, D/H)
        q, k = self.q_norm(q), self.k_norm(k)  # QK-norm over D/H (identities without it)
        out = F.scaled_dot_product_attention(q, k, v)  # (B, H, N, D/H)
        return self.proj(out.transpose(1, 2).reshape(B, N, D))  # (B, N, D)


def make_norm(conditioning: str, norm: Mapping[str, Any], dim: int, cond_dim: int) -> nn.Module:
    """The norm before a residual branch: adaptive for the adaLN variants, else the plain norm."""
    if conditioning == "adaln_zero":
        return AdaLNZero(dim, cond_dim, norm)
    if conditioning == "adaln":
        return AdaLN(dim, cond_dim, norm)
    return norm_from_config(norm, dim, channel_dim=-1)


def residual(x: torch.Tensor, norm: nn.Module, branch: Any, c: torch.Tensor | None) -> torch.Tensor:
    """x + gate * branch(norm(x)): the norm reads c when adaptive; only adaLN-Zero has a gate."""
    if isinstance(norm, AdaLNZero):
        h, gate = norm(x, c)
        return x + gate * branch(h)
    if isinstance(norm, AdaptiveNorm):
        return x + branch(norm(x, c))
    return x + branch(norm(x))


class DiTBlock(nn.Module):
    """Pre-norm block: self-attention, [cross-attention], MLP; norms set by the conditioning."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        mlp_ratio: float,
        conditioning: str,
        norm: Mapping[str, Any],
        qk_norm: str | None = None,
        qk_norm_kw: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        D = hidden_size

        def qk(dim: int, **_: Any) -> nn.Module:  # timm's norm_layer(head_dim, device=, dtype=)
            return create_qk_norm(qk_norm, dim, **(qk_norm_kw or {}))

        self.norm1 = make_norm(conditioning, norm, D, D)
        if qk_norm is None:  # timm's Attention as before: q_norm, k_norm are nn.Identity
            self.attn = Attention(D, num_heads=num_heads, qkv_bias=True)
        else:  # timm normalizes each head's q, k over head_dim with norm_layer's modules
            self.attn = Attention(
                D, num_heads=num_heads, qkv_bias=True, qk_norm=True, norm_layer=qk
            )
        self.cross_attn = None
        if conditioning == "cross_attn":
            self.norm_cross = norm_from_config(norm, D, channel_dim=-1)
            heads = (qk(D // num_heads), qk(D // num_heads)) if qk_norm else (None, None)
            self.cross_attn = CrossAttention(D, num_heads, *heads)
        self.norm2 = make_norm(conditioning, norm, D, D)
        self.mlp = Mlp(D, int(D * mlp_ratio), act_layer=partial(nn.GELU, approximate="tanh"))

    def forward(
        self, x: torch.Tensor, c: torch.Tensor | None, ctx: torch.Tensor | None
    ) -> torch.Tensor:
        x = residual(x, self.norm1, self.attn, c)  # (B, N, D)
        if self.cross_attn is not None:
            x = x + self.cross_attn(self.norm_cross(x), ctx)  # (B, N, D)
        return residual(x, self.norm2, self.mlp, c)  # (B, N, D)


class FinalLayer(nn.Module):
    """Norm (adaptive for the adaLN variants, no gate) then Linear to p*p*C values per token."""

    def __init__(
        self, hidden_size: int, out_dim: int, conditioning: str, norm: Mapping[str, Any]
    ) -> None:
        super().__init__()
        if conditioning in ("adaln", "adaln_zero"):
            zero = conditioning == "adaln_zero"
            self.norm = AdaLN(hidden_size, hidden_size, norm, zero_init=zero)
        else:
            self.norm = norm_from_config(norm, hidden_size, channel_dim=-1)
        self.linear = nn.Linear(hidden_size, out_dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        h = self.norm(x, c) if isinstance(self.norm, AdaptiveNorm) else self.norm(x)  # (B, N, D)
        return self.linear(h)  # (B, N, p*p*C)


# ---------------------------------------------------------------------------------------------
# DiT
# ---------------------------------------------------------------------------------------------


class DiT(nn.Module):
    """Class-conditional DiT predicting the noise eps of x_t: forward(x, t, y) -> (B, C, H, W).

    The shape (hidden_size D, depth, num_heads, patch_size p) is given explicitly; the defaults
    are the "tiny" DiT of conf/model/dit.yaml, which trains on a CPU on 28x28 (p=4 -> 49 tokens).
    The paper's DiT-S/2 ... XL/4 shapes are conf/size/dit/*.yaml (size=dit/S/2, ...).
    """

    def __init__(
        self,
        norm: Mapping[str, Any] | str | None = "layernorm",
        conditioning: str = "adaln_zero",
        input_size: int = 28,
        in_channels: int = 1,
        num_classes: int = 10,
        class_dropout: float = 0.1,
        mlp_ratio: float = 4.0,
        hidden_size: int = 96,
        depth: int = 4,
        num_heads: int = 4,
        patch_size: int = 4,
        norm_eps: float | None = 1e-6,
        qk_norm: str | None = None,
    ) -> None:
        super().__init__()
        qk_norm = check_qk_norm(qk_norm)  # layernorm | rmsnorm | None
        if conditioning not in CONDITIONINGS:
            raise ConfigError(
                f"dit: conditioning={conditioning!r} is not one of {list(CONDITIONINGS)}"
            )
        shape = {
            "hidden_size": hidden_size,
            "depth": depth,
            "num_heads": num_heads,
            "patch_size": patch_size,
        }
        for key, value in shape.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"dit: {key} must be a positive integer, got {value!r}")
        D, p = hidden_size, patch_size
        if input_size % p:
            raise ConfigError(f"dit: patch_size={p} does not divide input_size={input_size}")
        if D % num_heads:
            raise ConfigError(f"dit: num_heads={num_heads} does not divide hidden_size={D}")
        norm = as_norm_config(norm)
        if norm_eps is not None and "eps" in norm_keywords(norm["name"]):
            norm["eps"] = norm_eps  # DiT's LayerNorm eps, in every norm built below
        if not norm_traits(norm["name"]).tokenwise:
            raise NormConfigError(
                f"dit: norm={norm['name']!r} does not normalise the feature axis of (B, T, D) "
                f"tokens; choose one of {norms_with('tokenwise')}"
            )
        self.conditioning = conditioning
        self.in_channels = in_channels
        self.input_size = input_size
        self.num_classes = num_classes
        self.patch_size = p
        self.grid_size = input_size // p

        self.x_embedder = PatchEmbed(input_size, p, in_channels, D)
        self.register_buffer("pos_embed", sincos_2d(D, self.grid_size)[None], persistent=False)
        self.t_embedder = TimestepEmbedder(D)
        self.y_embedder = LabelEmbedder(num_classes, D, class_dropout)
        qk_kw = {} if norm_eps is None else {"eps": norm_eps}
        self.blocks = nn.ModuleList(
            DiTBlock(D, num_heads, mlp_ratio, conditioning, norm, qk_norm, qk_kw)
            for _ in range(depth)
        )
        self.final_layer = FinalLayer(D, p * p * in_channels, conditioning, norm)
        self.initialize_weights()

    @property
    def null_class(self) -> int:
        return self.y_embedder.null_class

    def initialize_weights(self) -> None:
        """Every init of the model, with its reason."""
        for module in self.modules():
            # transformer Linear layers: xavier-uniform keeps activations' variance across
            # layers (ViT/DiT practice); biases at zero
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        # the patch projection is a linear map of each flattened patch: init it like one
        w = self.x_embedder.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.x_embedder.proj.bias)
        # small embeddings of labels and timesteps (DiT: normal, std 0.02)
        nn.init.normal_(self.y_embedder.table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        # adaptive norms own their regression's init: adaLN-Zero zeroes it so each block starts
        # as the identity (gates 0) and the final norm starts as a plain norm
        for module in self.modules():
            if isinstance(module, AdaptiveNorm):
                module.reset_parameters()
        # zero the output layer: the model starts by predicting eps = 0 (DiT)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, p*p*C) -> (B, C, H, W)."""
        B, G, p, C = x.shape[0], self.grid_size, self.patch_size, self.in_channels
        x = x.view(B, G, G, p, p, C)  # (B, row, col, py, px, C)
        return x.permute(0, 5, 1, 3, 2, 4).reshape(B, C, G * p, G * p)  # (B, C, H, W)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        tokens = self.x_embedder(x) + self.pos_embed  # (B, N, D)
        t_emb = self.t_embedder(t)  # (B, D)
        y_emb = self.y_embedder(y)  # (B, D)
        c = ctx = None
        if self.conditioning in ("adaln", "adaln_zero"):
            c = t_emb + y_emb  # (B, D)
        elif self.conditioning == "cross_attn":
            ctx = torch.stack([t_emb, y_emb], dim=1)  # (B, 2, D)
        else:
            tokens = torch.cat([t_emb[:, None], y_emb[:, None], tokens], dim=1)  # (B, 2+N, D)
        for block in self.blocks:
            tokens = block(tokens, c, ctx)  # (B, N or 2+N, D)
        if self.conditioning == "in_context":
            tokens = tokens[:, 2:]  # (B, N, D)
        out = self.final_layer(tokens, c)  # (B, N, p*p*C)
        return self.unpatchify(out)  # (B, C, H, W)
