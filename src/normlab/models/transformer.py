"""A GPT-style decoder-only Transformer whose residual placement and norm come from the config."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from normlab.norms.qknorm import check_qk_norm, create_qk_norm
from normlab.norms.registry import NormLayer
from normlab.norms.residual import create_residual, placement_class, tokenwise_norm

MLP_RATIO = 4  # hidden width of the MLP / d_model


# --------------------------------------------------------------------------------------------
# Sublayers
# --------------------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate q, k, v projections; `qk_norm` (a tokenwise
    norm layer, or None) normalizes each head's queries and keys over head_dim
    (normlab.norms.qknorm)."""

    def __init__(
        self, d_model: int, n_heads: int, dropout: float, qk_norm: NormLayer | None = None
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.q_norm = create_qk_norm(qk_norm, d_model // n_heads)  # nn.Identity for None
        self.k_norm = create_qk_norm(qk_norm, d_model // n_heads)
        self.attn_dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        B, T, D = t.shape
        return t.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2)  # (B, H, T, D/H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q = self.q_norm(self._heads(self.q_proj(x)))  # (B, H, T, D/H)
        k = self.k_norm(self._heads(self.k_proj(x)))  # (B, H, T, D/H)
        v = self._heads(self.v_proj(x))  # (B, H, T, D/H)
        p = self.attn_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, H, T, D/H)
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.resid_dropout(self.out_proj(y))  # (B, T, D)


class MLP(nn.Module):
    """Position-wise feed-forward network: Linear, GELU, Linear."""

    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, MLP_RATIO * d_model)
        self.fc2 = nn.Linear(MLP_RATIO * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))  # (B, T, 4D)
        return self.dropout(self.fc2(h))  # (B, T, D)


# --------------------------------------------------------------------------------------------
# Block
# --------------------------------------------------------------------------------------------


NORM_POSITIONS = ("attn", "mlp", "final")  # the attention input, the FFN input, the final norm


def position_norm(
    norm_layer: NormLayer, position: str, settings: Mapping[str, Any] | None
) -> NormLayer:
    """The norm layer of one position with that position's own keywords added (the DyT paper's
    LLaMA recipe gives the attention-input, FFN-input and final norms their own alpha0); the
    norm layer itself when the position has none."""
    own = (settings or {}).get(position)
    return functools.partial(norm_layer, **own) if own else norm_layer


def check_shape(
    depth: int, d_model: int, n_heads: int, ctx: int, dropout: float, norm_at: Mapping | None
) -> None:
    """A GPT's arguments, checked before anything is built (ValueError naming the argument)."""
    unknown = sorted(set(norm_at or {}) - set(NORM_POSITIONS))
    if unknown:
        raise ValueError(
            f"norm_at has no position {', '.join(unknown)}: choose among {list(NORM_POSITIONS)}"
        )
    shape = {"depth": depth, "d_model": d_model, "n_heads": n_heads, "ctx": ctx}
    for key, value in shape.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
        raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
    if d_model % n_heads:
        raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")


class Block(nn.Module):
    """One Transformer block: attention then MLP, each wrapped in the configured placement."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float,
        placement: str,
        norm_layer: NormLayer,
        qk_norm: NormLayer | None = None,
        mlp_norm: NormLayer | None = None,
        **residual_kw: Any,
    ) -> None:
        super().__init__()
        attn = CausalSelfAttention(d_model, n_heads, dropout, qk_norm)
        mlp = MLP(d_model, dropout)
        self.attn = create_residual(placement, attn, d_model, norm_layer, **residual_kw)
        mlp_norm = norm_layer if mlp_norm is None else mlp_norm  # the FFN input's own settings
        self.mlp = create_residual(placement, mlp, d_model, mlp_norm, **residual_kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn(x)  # (B, T, D)
        return self.mlp(x)  # (B, T, D)


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class GPT(nn.Module):
    """Decoder-only Transformer language model: embeddings, blocks, (final norm), LM head.

    The shape is given explicitly; the defaults are conf/model/transformer.yaml's tiny GPT
    (the named sizes are conf/size/transformer/*.yaml).
    """

    def __init__(
        self,
        vocab_size: int,
        placement: Mapping[str, Any],
        norm_layer: NormLayer,
        depth: int = 4,
        d_model: int = 64,
        n_heads: int = 4,
        ctx: int = 64,
        dropout: float = 0.0,
        tie_weights: bool = True,
        qk_norm: NormLayer | None = None,
        embed_scale: float | None = None,
        norm_at: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        check_shape(depth, d_model, n_heads, ctx, dropout, norm_at)
        self.vocab_size, self.depth, self.d_model = vocab_size, depth, d_model
        self.n_heads, self.ctx, self.dropout = n_heads, ctx, dropout
        placement_cls = placement_class(placement["name"])
        self.placement = placement_cls.name
        self.qk_norm = check_qk_norm(qk_norm)  # a tokenwise norm layer or None
        # what the placement reads from its config for this stack (DeepNorm: alpha and beta)
        residual_kw = placement_cls.stack_kwargs(placement, self.depth)

        D = self.d_model
        self.tok_emb = nn.Embedding(vocab_size, D)
        self.pos_emb = nn.Embedding(self.ctx, D)
        self.emb_dropout = nn.Dropout(self.dropout)
        # The DyT paper's LLaMA recipe: the embeddings times a learnable scalar, so that a norm
        # that does not rescale (DyT) sees inputs of order 1 (1 / 0.02 = 50 does that for the
        # N(0, 0.02) init below); None: no scalar
        self.embed_scale = None
        if embed_scale is not None:
            self.embed_scale = nn.Parameter(torch.tensor([float(embed_scale)]))
        attn_norm, mlp_norm = (position_norm(norm_layer, p, norm_at) for p in ("attn", "mlp"))
        self.blocks = nn.ModuleList(
            Block(
                D,
                self.n_heads,
                self.dropout,
                self.placement,
                attn_norm,
                self.qk_norm,
                mlp_norm,
                **residual_kw,
            )  # fmt: skip
            for _ in range(self.depth)
        )
        needs_final = placement_cls.needs_final_norm
        final = position_norm(norm_layer, "final", norm_at)
        self.final_norm = tokenwise_norm(final, D, self.placement) if needs_final else nn.Identity()
        self.lm_head = nn.Linear(D, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self._init_weights()

    # ----------------------------------------------------------------------------------------
    # Initialization (all of it)
    # ----------------------------------------------------------------------------------------

    def _init_weights(self) -> None:
        # Embeddings (and an untied head): N(0, 0.02) as GPT-2, small next to the unit-scale
        # normalized stream.
        for emb in (self.tok_emb, self.pos_emb, self.lm_head):
            nn.init.normal_(emb.weight, mean=0.0, std=0.02)
        # Every linear of every block: xavier_normal (gain 1), zero bias - the Post-LN setup
        # DeepNet starts from, so placements differ only in where the norm sits. q and k keep
        # gain 1 in every placement: they only shape the attention weights, not the magnitude
        # of the residual branch. Each placement draws its branch's value path (value and output
        # projections, both MLP weights) with its own gain: 1, or DeepNorm's beta (Wang et al.
        # 2022, Alg. 1) to bound the model update (normlab.norms.residual.Residual.init_branch).
        for block in self.blocks:
            attn, mlp = block.attn.sublayer, block.mlp.sublayer
            for linear in (attn.q_proj, attn.k_proj):
                nn.init.xavier_normal_(linear.weight, gain=1.0)
            block.attn.init_branch((attn.v_proj, attn.out_proj))
            block.mlp.init_branch((mlp.fc1, mlp.fc2))
            for linear in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj, mlp.fc1, mlp.fc2):
                nn.init.zeros_(linear.bias)
        # Norms keep their own identity init (weight 1, bias 0) from the norms package.

    # ----------------------------------------------------------------------------------------
    # Forward and sampling
    # ----------------------------------------------------------------------------------------

    def forward_bytes(self, batch: int) -> tuple[int, str]:
        """An estimate of the largest float32 tensors of a forward pass over batch windows of
        ctx tokens, and how it was computed: one layer's attention matrix and the activations
        of the stream, the MLP and the logits."""
        B, T, H, D, V = batch, self.ctx, self.n_heads, self.d_model, self.vocab_size
        attention = B * H * T * T * 4
        activations = B * T * (4 * D + 2 * MLP_RATIO * D + V) * 4
        how = (
            f"attention batch*heads*ctx^2*4 = {B}*{H}*{T}^2*4 = {attention / 2**30:.1f} GiB, "
            f"activations batch*ctx*(4*d_model + 2*{MLP_RATIO}*d_model + vocab)*4 = "
            f"{activations / 2**30:.1f} GiB"
        )
        return attention + activations, how

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if T > self.ctx:
            raise ValueError(f"sequence length {T} exceeds the context length ctx={self.ctx}")
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, D)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        x = self.emb_dropout(x)
        for block in self.blocks:
            x = block(x)  # (B, T, D)
        x = self.final_norm(x)  # (B, T, D)
        return self.lm_head(x)  # (B, T, V)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens tokens; temperature 0 = greedy."""
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.ctx :])[:, -1]  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                probs = F.softmax(logits / temperature, dim=-1)  # (B, V)
                nxt = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)  # (B, T + 1)
        return idx
