# Over 400 lines: the DiT, its 4 conditioning blocks, their embedders and the official-key map
"""Diffusion Transformer (DiT, Peebles & Xie 2023) with the paper's four ways to condition.

    x (B, C, H, W) -> patches (B, N, D) + fixed 2D sin-cos positions -> blocks -> final layer
    -> (B, N, p*p*C) -> eps prediction (B, C, H, W)

The condition is the timestep t and the class label y (an extra "null" class for classifier-free
guidance). `conditioning` picks the block class, one per way the blocks see it; the class says
how the condition reaches its blocks (`condition`) and which tokens leave them (`image_tokens`):

    adaln_zero  DiTBlock: c = emb(t) + emb(y) regresses each branch's norm shift/scale and its
                gate; the regressions start at zero, so each block starts as the identity
    adaln       AdaLNBlock: the same without gates, regressions with torch's default init
    cross_attn  CrossAttnBlock: (emb(t), emb(y)) as a 2-token sequence that an extra
                cross-attention in each block attends to; plain norms
    in_context  InContextBlock: emb(t), emb(y) prepended to the image tokens; plain norms;
                dropped before the final layer

The DiT takes its norms as norm layers (callables width -> module, as a norm config's partial):
`norm_layer(D)` (a family whose class declares `tokenwise`: it acts on each token over its last
axis) and `qk_norm(head_dim)` (QK-norm of each head's queries and keys, self- and
cross-attention; None: plain attention), both with eps `norm_eps` (DiT's 1e-6, as its
LayerNorms, in conf/model/dit.yaml and `build_dit()`; None keeps the norm's own).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from functools import partial

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
from normlab.norms.adaptive import AdaLN, AdaLNZero, modulate
from normlab.norms.qknorm import check_qk_norm, create_qk_norm
from normlab.norms.registry import NormLayer

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
# Blocks and final layer: one block class per conditioning
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


def attention(dim: int, num_heads: int, qk_norm_layer: NormLayer | None) -> Attention:
    """timm's self-attention (DiT's); with qk_norm_layer, QK-norm of each head's q and k."""
    qk = qk_norm_layer is not None  # called as timm calls it: (head_dim, device=, dtype=)
    return Attention(dim, num_heads=num_heads, qkv_bias=True, qk_norm=qk, norm_layer=qk_norm_layer)


def mlp(dim: int, mlp_ratio: float) -> Mlp:
    """DiT's MLP: Linear, GELU (tanh approximation), Linear."""
    return Mlp(dim, int(dim * mlp_ratio), act_layer=partial(nn.GELU, approximate="tanh"))


class DiTBlock(nn.Module):
    """adaLN-Zero block: each branch's norm shifted and scaled by c, its output gated by c.

    DiT's block, its one regression of six chunks held as one per branch (adaLN_msa, adaLN_mlp,
    normlab.norms.adaptive's AdaLNZero: the same rows in the same order; from_official_state_dict
    splits DiT's). Two matmuls, not one: the gradient of c sums in the order the measured runs
    summed it."""

    modulation: type[AdaLN] = AdaLNZero  # each branch's regression: shift, scale, gate
    zero_init = True  # the regressions start at zero: the block starts as the identity
    adaptive = True  # c shifts and scales its norms (and the final layer's)

    @staticmethod
    def condition(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> tuple:
        """(tokens, c): c = emb(t) + emb(y) (B, D), what the norms' shift, scale (and gates)
        are regressed from."""
        return x, t + y

    @staticmethod
    def image_tokens(x: torch.Tensor) -> torch.Tensor:
        """The image tokens of the blocks' output (B, N, D): all of them."""
        return x

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        mlp_ratio: float,
        norm_layer: NormLayer,
        qk_norm_layer: NormLayer | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = norm_layer(hidden_size)
        self.adaLN_msa = self.modulation(hidden_size, self.zero_init)
        self.attn = attention(hidden_size, num_heads, qk_norm_layer)
        self.norm2 = norm_layer(hidden_size)
        self.adaLN_mlp = self.modulation(hidden_size, self.zero_init)
        self.mlp = mlp(hidden_size, mlp_ratio)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa = self.adaLN_msa(c)  # (B, D) each
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        shift_mlp, scale_mlp, gate_mlp = self.adaLN_mlp(c)
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


class AdaLNBlock(DiTBlock):
    """adaLN block: each branch's norm shifted and scaled by c, no gates."""

    modulation = AdaLN  # each branch's regression: shift, scale
    zero_init = False  # torch's default init of the regressions

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa = self.adaLN_msa(c)  # (B, D) each
        x = x + self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        shift_mlp, scale_mlp = self.adaLN_mlp(c)
        return x + self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


class CrossAttnBlock(nn.Module):
    """Pre-norm block with a cross-attention to the condition tokens ctx between its branches."""

    adaptive = False  # plain norms
    image_tokens = DiTBlock.image_tokens

    @staticmethod
    def condition(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> tuple:
        """(tokens, ctx): (emb(t), emb(y)) as a 2-token sequence (B, 2, D), attended to."""
        return x, torch.stack([t, y], dim=1)

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        mlp_ratio: float,
        norm_layer: NormLayer,
        qk_norm_layer: NormLayer | None = None,
    ) -> None:
        super().__init__()
        head_dim = hidden_size // num_heads
        qk = (qk_norm_layer(head_dim), qk_norm_layer(head_dim)) if qk_norm_layer else (None, None)
        self.norm1 = norm_layer(hidden_size)
        self.attn = attention(hidden_size, num_heads, qk_norm_layer)
        self.norm_cross = norm_layer(hidden_size)
        self.cross_attn = CrossAttention(hidden_size, num_heads, *qk)
        self.norm2 = norm_layer(hidden_size)
        self.mlp = mlp(hidden_size, mlp_ratio)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))  # (B, N, D)
        x = x + self.cross_attn(self.norm_cross(x), ctx)  # ctx: (B, 2, D)
        return x + self.mlp(self.norm2(x))


class InContextBlock(nn.Module):
    """Plain pre-norm block (ViT's): the condition is in the tokens it reads."""

    adaptive = False  # plain norms

    @staticmethod
    def condition(x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> tuple:
        """(tokens, None): emb(t), emb(y) prepended to the image tokens (B, 2+N, D)."""
        return torch.cat([t[:, None], y[:, None], x], dim=1), None

    @staticmethod
    def image_tokens(x: torch.Tensor) -> torch.Tensor:
        """The image tokens (B, N, D): the two condition tokens dropped."""
        return x[:, 2:]

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        mlp_ratio: float,
        norm_layer: NormLayer,
        qk_norm_layer: NormLayer | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = norm_layer(hidden_size)
        self.attn = attention(hidden_size, num_heads, qk_norm_layer)
        self.norm2 = norm_layer(hidden_size)
        self.mlp = mlp(hidden_size, mlp_ratio)

    def forward(self, x: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))  # (B, 2+N, D)
        return x + self.mlp(self.norm2(x))


BLOCKS: dict[str, type[nn.Module]] = {  # conditioning -> the block that reads it
    "adaln_zero": DiTBlock,
    "adaln": AdaLNBlock,
    "cross_attn": CrossAttnBlock,
    "in_context": InContextBlock,
}


class FinalLayer(nn.Module):
    """Norm (shifted and scaled by c under adaLN, no gate) then Linear to p*p*C values a token;
    `zero_init`: as the blocks' regressions (None: a plain norm, no regression)."""

    def __init__(
        self, hidden_size: int, out_dim: int, norm_layer: NormLayer, zero_init: bool | None
    ) -> None:
        super().__init__()
        self.norm_final = norm_layer(hidden_size)
        self.adaLN_modulation = None
        if zero_init is not None:
            self.adaLN_modulation = AdaLN(hidden_size, zero_init)
        self.linear = nn.Linear(hidden_size, out_dim)

    def forward(self, x: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
        x = self.norm_final(x)  # (B, N, D)
        if self.adaLN_modulation is not None:
            shift, scale = self.adaLN_modulation(c)
            x = modulate(x, shift, scale)
        return self.linear(x)  # (B, N, p*p*C)


# ---------------------------------------------------------------------------------------------
# DiT
# ---------------------------------------------------------------------------------------------


def check_shape(
    conditioning: str, input_size: int, hidden_size: int, depth: int, num_heads: int, patch: int
) -> None:
    """A DiT's arguments, checked before anything is built (ValueError naming the argument)."""
    if conditioning not in BLOCKS:
        raise ValueError(f"conditioning={conditioning!r} is not one of {list(BLOCKS)}")
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

    `norm_layer(D)` builds every norm: a family whose class declares `tokenwise` (it acts on each
    token over its last axis), its eps replaced by `norm_eps` (DiT's LayerNorm: 1e-6; None keeps
    the norm's own) and, under adaLN, its affine switched off (the regression replaces it, as
    DiT's LayerNorm(elementwise_affine=False)). `qk_norm(head_dim)`, a tokenwise norm layer too
    (eps `norm_eps`), normalizes each head's queries and keys, self- and cross-attention; None:
    plain attention. The defaults are the "tiny" DiT of conf/model/dit.yaml, which trains on a
    CPU on 28x28 (p=4 -> 49 tokens); the paper's DiT-S/2 ... XL/4 shapes are conf/size/dit/*.yaml.
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
        qk_norm: NormLayer | None = None,
        zero_init: bool = True,
        norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        check_shape(conditioning, input_size, hidden_size, depth, num_heads, patch_size)
        block = BLOCKS[conditioning]
        norm_layer, qk_layer = dit_norms(norm_layer, check_qk_norm(qk_norm), norm_eps, block)
        D, p = hidden_size, patch_size
        self.conditioning = conditioning
        self.block_class = block  # how the blocks read the condition (`condition`)
        self.zero_init = zero_init
        self.in_channels = in_channels
        self.input_size = input_size
        self.num_classes = num_classes
        self.patch_size = p
        self.grid_size = input_size // p

        self.x_embedder = PatchEmbed(input_size, p, in_channels, D)
        self.register_buffer("pos_embed", sincos_2d(D, self.grid_size)[None], persistent=False)
        self.t_embedder = TimestepEmbedder(D)
        self.y_embedder = LabelEmbedder(num_classes, D, class_dropout)
        self.blocks = nn.ModuleList(
            block(D, num_heads, mlp_ratio, norm_layer, qk_layer) for _ in range(depth)
        )
        zero = block.zero_init if block.adaptive else None
        self.final_layer = FinalLayer(D, p * p * in_channels, norm_layer, zero)
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
        # the adaLN regressions own their init: adaLN-Zero zeroes them so each block starts as
        # the identity (gates 0) and the final norm as a plain norm; adaLN's are torch's default
        for module in self.modules():
            if isinstance(module, AdaLN):
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
        x = self.x_embedder(x) + self.pos_embed  # (B, N, D)
        t, y = self.t_embedder(t), self.y_embedder(y)  # (B, D) each
        x, c = self.block_class.condition(x, t, y)  # (B, N or 2+N, D), what the blocks read
        for block in self.blocks:
            x = block(x, c)  # (B, N or 2+N, D)
        x = self.block_class.image_tokens(x)  # (B, N, D)
        return self.unpatchify(self.final_layer(x, c))  # (B, C, H, W)


def dit_norms(
    norm_layer: NormLayer, qk_norm: NormLayer | None, norm_eps: float | None, block: type
) -> tuple[NormLayer, NormLayer | None]:
    """The DiT's norm layers (D -> norm, head_dim -> QK-norm) from its arguments: every norm a
    tokenwise one, with eps `norm_eps` where its class takes eps (None: its own), and no affine
    of its own under adaLN (`block.adaptive`: c regresses shift and scale); the QK-norm keeps its
    affine. NormConfigError for a norm that does not act on each token."""
    traits = norm_traits(norm_layer)
    if traits is not None and not traits.tokenwise:
        raise NormConfigError(
            f"dit: norm {norm_name(norm_layer)!r} does not normalise the feature axis of (B, T, "
            f"D) tokens; choose one of {norms_with('tokenwise')}"
        )
    eps = {} if norm_eps is None else {"eps": norm_eps}
    if eps and traits is not None and "eps" in inspect.signature(norm_class(norm_layer)).parameters:
        norm_layer = partial(norm_layer, **eps)  # DiT's LayerNorm eps, in every norm it builds
    if block.adaptive and traits is not None and traits.affine_key is not None:
        norm_layer = partial(norm_layer, **{traits.affine_key: False})  # c's shift and scale
    if qk_norm is not None and eps and norm_traits(qk_norm) is not None:
        if "eps" in inspect.signature(norm_class(qk_norm)).parameters:
            qk_norm = partial(qk_norm, **eps)
    qk_layer = None if qk_norm is None else partial(create_qk_norm, qk_norm)
    return partial(build_norm, norm_layer, channel_dim=-1), qk_layer


def build_dit(norm_layer: NormLayer = LayerNorm, **kwargs: object) -> DiT:
    """The DiT of conf/model/dit.yaml from Python: DiT's eps 1e-6 in every norm unless
    `norm_eps` says otherwise; every other keyword is the DiT's own."""
    return DiT(norm_layer, **{"norm_eps": 1e-6, **kwargs})


# ---------------------------------------------------------------------------------------------
# Weights in the official layout
# ---------------------------------------------------------------------------------------------

OFFICIAL_KEYS = {  # official DiT (facebookresearch/DiT models.py) name -> this DiT's name
    "y_embedder.embedding_table.": "y_embedder.table.",
}


def from_official_state_dict(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An official DiT state dict (facebookresearch/DiT models.py) in this DiT's keys, for
    `build_dit(conditioning="adaln_zero", norm=layernorm)` of the same shape (the official model).

    - `y_embedder.embedding_table` -> `y_embedder.table`;
    - `blocks.N.adaLN_modulation.1` regresses 6 chunks of D rows, (shift_msa, scale_msa,
      gate_msa, shift_mlp, scale_mlp, gate_mlp): the first three -> `blocks.N.adaLN_msa.1`,
      the last three -> `blocks.N.adaLN_mlp.1` (each branch's shift, scale, gate);
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
            out[f"{block}.adaLN_msa.1.{rest}"] = msa
            out[f"{block}.adaLN_mlp.1.{rest}"] = mlp
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
