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

The norms come from `norm_layer` (the composed norm config's partial); they must act on each
token over its last (feature) axis of (B, T, D): a family whose class declares `tokenwise`.
`norm_eps` (DiT's 1e-6, as its LayerNorms) replaces the norm config's eps in every norm the
model builds; None keeps the config's. `qk_norm`
(a tokenwise norm or None, normlab.norms.qknorm) normalizes each head's queries and keys over
head_dim in every attention (self- and cross-), with norm_eps as their eps too.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from timm.layers import Attention, Mlp, PatchEmbed
from torch import nn

from normlab.errors import ConfigError
from normlab.norms import (
    LayerNorm,
    NormConfigError,
    build_norm,
    norm_class,
    norm_name,
    norm_traits,
    norms_with,
)
from normlab.norms.adaptive import AdaLN, AdaLNZero, AdaptiveNorm, NormLayer
from normlab.norms.qknorm import check_qk_norm, create_qk_norm

# ---------------------------------------------------------------------------------------------
# Embeddings: 2D sin-cos positions, timesteps, class labels
# ---------------------------------------------------------------------------------------------


def frequency_angles(
    dim: int, positions: torch.Tensor, max_period: float = 10000.0
) -> torch.Tensor:
    """(L,) positions -> (L, dim // 2) angles pos * w_k, w_k = max_period^(-k / (dim // 2))."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
    return positions.to(torch.float64)[:, None] * freqs[None]  # (L, half)


def sincos_1d(dim: int, positions: torch.Tensor) -> torch.Tensor:
    """(L,) positions -> (L, dim): [sin(pos * w_k) | cos(pos * w_k)] (MAE's, DiT's order)."""
    angles = frequency_angles(dim, positions)  # (L, dim/2)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def sincos_2d(dim: int, grid_size: int) -> torch.Tensor:
    """Fixed 2D position embedding (grid_size^2, dim) of the row-major patch grid, DiT's table:
    the first half of the channels encodes the column, the second half the row (DiT and MAE
    build it from np.meshgrid(grid_w, grid_h), w first)."""
    if dim % 4:
        raise ConfigError(f"dit: 2D sin-cos positions need hidden_size % 4 == 0, got {dim}")
    coords = torch.arange(grid_size)
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")  # (G, G) each
    emb_cols = sincos_1d(dim // 2, cols.flatten())  # (G*G, D/2)
    emb_rows = sincos_1d(dim // 2, rows.flatten())  # (G*G, D/2)
    return torch.cat([emb_cols, emb_rows], dim=1).float()  # (G*G, D)


class TimestepEmbedder(nn.Module):
    """Timestep t -> features [cos | sin] (GLIDE's, DiT's order) -> MLP(SiLU) -> (B, D)."""

    def __init__(self, hidden_size: int, frequency_dim: int = 256) -> None:
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(
            nn.Linear(frequency_dim, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )

    def features(self, t: torch.Tensor) -> torch.Tensor:
        """(B,) timesteps -> (B, frequency_dim): [cos(t * w_k) | sin(t * w_k)]."""
        angles = frequency_angles(self.frequency_dim, t)  # (B, 128)
        return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        freqs = self.features(t).to(self.mlp[0].weight.dtype)  # (B, 256)
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


# ---------------------------------------------------------------------------------------------
# Conditionings: how the blocks see the condition
# ---------------------------------------------------------------------------------------------

TokenNorm = nn.Module  # a norm of (B, T, D) tokens over D: a registry norm or an AdaptiveNorm


class Conditioning:
    """How the blocks see the condition (t, y); one object per model, shared by its parts.

    A conditioning builds the norms before the residual branches and before the final linear,
    calls each of them in one way, `(h, gate) = normalize(norm, x, c)` (gate 1 for an ungated
    branch), says whether a block has a cross-attention sub-layer, and turns the image tokens
    and the embeddings of t and y into the blocks' input (tokens, c, ctx) and back. The base
    class is the plain case: registry norms that do not read c, and neither c nor ctx.
    """

    name: ClassVar[str]
    cross_attention: ClassVar[bool] = False  # a cross-attention sub-layer in each block reads ctx

    def branch_norm(self, norm: NormLayer, dim: int) -> TokenNorm:
        """The norm before a block's residual branch (attention, MLP)."""
        return build_norm(norm, dim, channel_dim=-1)

    def final_norm(self, norm: NormLayer, dim: int) -> TokenNorm:
        """The norm before the final linear."""
        return build_norm(norm, dim, channel_dim=-1)

    def normalize(
        self, norm: TokenNorm, x: torch.Tensor, c: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """(h, gate): x normed (and modulated by c) and the gate of the branch that reads h."""
        return norm(x), 1.0

    def inputs(
        self, tokens: torch.Tensor, t_emb: torch.Tensor, y_emb: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(tokens, c, ctx) the blocks read from the image tokens (B, N, D) and t_emb, y_emb
        (B, D): c for adaptive norms, ctx for cross-attention."""
        return tokens, None, None

    def image_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The blocks' output tokens that the final layer maps to patches: (B, N, D)."""
        return tokens


class AdaLNZeroConditioning(Conditioning):
    """c = emb(t) + emb(y) regresses every norm's shift/scale and each branch's gate; the
    regressions start at zero (blocks start as the identity, the final norm as a plain norm)."""

    name = "adaln_zero"

    def branch_norm(self, norm: NormLayer, dim: int) -> TokenNorm:
        return AdaLNZero(dim, dim, norm)

    def final_norm(self, norm: NormLayer, dim: int) -> TokenNorm:
        return AdaLN(dim, dim, norm, zero_init=True)

    def normalize(
        self, norm: TokenNorm, x: torch.Tensor, c: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        out = norm(x, c)  # called as a module, so its hooks (the norm statistics) see it
        return out if norm.gated else (out, 1.0)  # AdaLNZero: (h, regressed gate); AdaLN: h

    def inputs(
        self, tokens: torch.Tensor, t_emb: torch.Tensor, y_emb: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return tokens, t_emb + y_emb, None  # c: (B, D)


class AdaLNConditioning(AdaLNZeroConditioning):
    """As adaLN-Zero without gates, the regressions with the default init."""

    name = "adaln"

    def branch_norm(self, norm: NormLayer, dim: int) -> TokenNorm:
        return AdaLN(dim, dim, norm)

    def final_norm(self, norm: NormLayer, dim: int) -> TokenNorm:
        return AdaLN(dim, dim, norm, zero_init=False)


class CrossAttnConditioning(Conditioning):
    """(emb(t), emb(y)) as a 2-token sequence ctx that a cross-attention in each block reads."""

    name = "cross_attn"
    cross_attention = True

    def inputs(
        self, tokens: torch.Tensor, t_emb: torch.Tensor, y_emb: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return tokens, None, torch.stack([t_emb, y_emb], dim=1)  # ctx: (B, 2, D)


class InContextConditioning(Conditioning):
    """emb(t), emb(y) prepended to the image tokens, dropped before the final layer."""

    name = "in_context"

    def inputs(
        self, tokens: torch.Tensor, t_emb: torch.Tensor, y_emb: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        return torch.cat([t_emb[:, None], y_emb[:, None], tokens], dim=1), None, None  # (B, 2+N, D)

    def image_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens[:, 2:]  # (B, N, D)


CONDITIONINGS: dict[str, type[Conditioning]] = {
    cls.name: cls
    for cls in (
        AdaLNZeroConditioning,
        AdaLNConditioning,
        CrossAttnConditioning,
        InContextConditioning,
    )
}


class DiTBlock(nn.Module):
    """Pre-norm block: self-attention, [cross-attention], MLP; norms set by the conditioning."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        mlp_ratio: float,
        conditioning: Conditioning,
        norm: NormLayer,
        qk_norm: str | None = None,
        qk_norm_kw: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        D = hidden_size

        def qk(dim: int, **_: Any) -> nn.Module:  # timm's norm_layer(head_dim, device=, dtype=)
            return create_qk_norm(qk_norm, dim, **(qk_norm_kw or {}))

        self.cond = conditioning
        self.norm1 = conditioning.branch_norm(norm, D)
        if qk_norm is None:  # timm's Attention as before: q_norm, k_norm are nn.Identity
            self.attn = Attention(D, num_heads=num_heads, qkv_bias=True)
        else:  # timm normalizes each head's q, k over head_dim with norm_layer's modules
            self.attn = Attention(
                D, num_heads=num_heads, qkv_bias=True, qk_norm=True, norm_layer=qk
            )
        self.cross_attn = None
        if conditioning.cross_attention:
            self.norm_cross = build_norm(norm, D, channel_dim=-1)
            heads = (qk(D // num_heads), qk(D // num_heads)) if qk_norm else (None, None)
            self.cross_attn = CrossAttention(D, num_heads, *heads)
        self.norm2 = conditioning.branch_norm(norm, D)
        self.mlp = Mlp(D, int(D * mlp_ratio), act_layer=partial(nn.GELU, approximate="tanh"))

    def forward(
        self, x: torch.Tensor, c: torch.Tensor | None, ctx: torch.Tensor | None
    ) -> torch.Tensor:
        h, gate = self.cond.normalize(self.norm1, x, c)  # norm, modulated by c when adaptive
        x = x + gate * self.attn(h)  # (B, N, D)
        if self.cross_attn is not None:
            x = x + self.cross_attn(self.norm_cross(x), ctx)  # (B, N, D)
        h, gate = self.cond.normalize(self.norm2, x, c)
        return x + gate * self.mlp(h)  # (B, N, D)


class FinalLayer(nn.Module):
    """Norm (adaptive for the adaLN variants, no gate) then Linear to p*p*C values per token."""

    def __init__(
        self, hidden_size: int, out_dim: int, conditioning: Conditioning, norm: NormLayer
    ) -> None:
        super().__init__()
        self.cond = conditioning
        self.norm = conditioning.final_norm(norm, hidden_size)
        self.linear = nn.Linear(hidden_size, out_dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        h, _ = self.cond.normalize(self.norm, x, c)  # (B, N, D); the final norm has no gate
        return self.linear(h)  # (B, N, p*p*C)


# ---------------------------------------------------------------------------------------------
# DiT
# ---------------------------------------------------------------------------------------------


def check_shape(
    conditioning: str, input_size: int, hidden_size: int, depth: int, num_heads: int, patch: int
) -> None:
    """A DiT's arguments, checked before anything is built (ValueError naming the argument)."""
    if conditioning not in CONDITIONINGS:
        raise ValueError(f"conditioning={conditioning!r} is not one of {list(CONDITIONINGS)}")
    shape = {"hidden_size": hidden_size, "depth": depth, "num_heads": num_heads,
             "patch_size": patch}  # fmt: skip
    for key, value in shape.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    if input_size % patch:
        raise ValueError(f"patch_size={patch} does not divide input_size={input_size}")
    if hidden_size % num_heads:
        raise ValueError(f"num_heads={num_heads} does not divide hidden_size={hidden_size}")


class DiT(nn.Module):
    """Class-conditional DiT predicting the noise eps of x_t: forward(x, t, y) -> (B, C, H, W).

    The shape (hidden_size D, depth, num_heads, patch_size p) is given explicitly; the defaults
    are the "tiny" DiT of conf/model/dit.yaml, which trains on a CPU on 28x28 (p=4 -> 49 tokens).
    The paper's DiT-S/2 ... XL/4 shapes are conf/size/dit/*.yaml (size=dit/S/2, ...).
    `zero_init=False` keeps xavier on the adaLN regressions and the final layer, as the DyT
    authors' DiT patch does for DyT.
    """

    def __init__(
        self,
        norm_layer: NormLayer = LayerNorm,
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
        zero_init: bool = True,
    ) -> None:
        super().__init__()
        qk_norm = check_qk_norm(qk_norm)  # a tokenwise family or None
        check_shape(conditioning, input_size, hidden_size, depth, num_heads, patch_size)
        D, p = hidden_size, patch_size
        self.zero_init = zero_init
        norm, traits = norm_layer, norm_traits(norm_layer)
        takes_eps = traits is not None and "eps" in inspect.signature(norm_class(norm)).parameters
        if norm_eps is not None and takes_eps:  # a normlab-known class: eps replaced (a plain
            norm = partial(norm, eps=norm_eps)  # callable sets its own)
        if traits is not None and not traits.tokenwise:
            raise NormConfigError(
                f"dit: norm={norm_name(norm)!r} does not normalise the feature axis of (B, T, D) "
                f"tokens; choose one of {norms_with('tokenwise')}"
            )
        self.conditioning = conditioning
        self.cond = CONDITIONINGS[conditioning]()
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
            DiTBlock(D, num_heads, mlp_ratio, self.cond, norm, qk_norm, qk_kw) for _ in range(depth)
        )
        self.final_layer = FinalLayer(D, p * p * in_channels, self.cond, norm)
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
        if not self.zero_init:  # the DyT authors' DiT patch: no zeroing, xavier as above
            return
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
        tokens, c, ctx = self.cond.inputs(tokens, t_emb, y_emb)  # c (B, D), ctx (B, 2, D)
        for block in self.blocks:
            tokens = block(tokens, c, ctx)  # (B, N or 2+N, D)
        out = self.final_layer(self.cond.image_tokens(tokens), c)  # (B, N, p*p*C)
        return self.unpatchify(out)  # (B, C, H, W)


# ---------------------------------------------------------------------------------------------
# Weights in the official layout
# ---------------------------------------------------------------------------------------------

OFFICIAL_KEYS = {  # official DiT (facebookresearch/DiT models.py) name -> this DiT's name
    "y_embedder.embedding_table.": "y_embedder.table.",
    "final_layer.adaLN_modulation.1.": "final_layer.norm.modulation.1.",
}


def from_official_state_dict(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An official DiT state dict (facebookresearch/DiT models.py) in this DiT's keys, for
    `DiT(conditioning="adaln_zero", norm=layernorm)` of the same shape (the official model).

    - `y_embedder.embedding_table` -> `y_embedder.table`;
    - `blocks.N.adaLN_modulation.1` regresses 6 chunks of D rows, (shift_msa, scale_msa,
      gate_msa, shift_mlp, scale_mlp, gate_mlp): the first three -> `blocks.N.norm1.modulation.1`,
      the last three -> `blocks.N.norm2.modulation.1` (an AdaLNZero's order: shift, scale, gate);
    - `final_layer.adaLN_modulation.1` (shift, scale) -> `final_layer.norm.modulation.1`;
    - `pos_embed`: not stored here (sincos_2d computes the same table); checked, then dropped;
    - a `final_layer.linear` of learn_sigma (p*p*2C outputs: eps, then the variance, per pixel
      of a patch) keeps its eps rows: this DiT predicts eps alone;
    - everything else (x_embedder, t_embedder: features [cos | sin] in both, attn, mlp) as is.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key == "pos_embed":
            _, N, D = value.shape  # (1, G*G, D)
            table = sincos_2d(D, math.isqrt(N))[None]
            if value.shape != table.shape or not torch.allclose(value.float(), table, atol=1e-6):
                raise ValueError("pos_embed is not DiT's 2D sin-cos table of its shape")
            continue
        block, _, rest = key.partition(".adaLN_modulation.1.")
        if rest and block.startswith("blocks."):
            msa, mlp = value.chunk(2, dim=0)  # (3D, ...) each: (shift, scale, gate)
            out[f"{block}.norm1.modulation.1.{rest}"] = msa
            out[f"{block}.norm2.modulation.1.{rest}"] = mlp
            continue
        for official, ours in OFFICIAL_KEYS.items():
            if key.startswith(official):
                key = ours + key.removeprefix(official)
        out[key] = value
    _, C, p, _ = sd["x_embedder.proj.weight"].shape  # (D, C, p, p)
    for name in ("final_layer.linear.weight", "final_layer.linear.bias"):
        value = out[name]
        if value.shape[0] == p * p * 2 * C:  # learn_sigma: (p, p, 2C) outputs per token
            out[name] = value.view(p * p, 2 * C, *value.shape[1:])[:, :C].reshape(
                p * p * C, *value.shape[1:]
            )
    return out
