"""An encoder-decoder Transformer in the setup of Xiong et al. 2020 (fairseq's Transformer).

The character task: the encoder reads the first `src_len` characters of a window, the decoder
predicts the rest, each from the characters before it (teacher forcing) and the encoder's
output. Post-LN (Vaswani et al. 2017) or Pre-LN (with a final LayerNorm on each stack), built
from torch's own `nn.TransformerEncoderLayer` / `nn.TransformerDecoderLayer` (`norm_first`);
fairseq's init: Xavier-uniform linears with zero biases, N(0, 1/d) embeddings times sqrt(d)
(unit scale) plus sinusoidal positions, the output projection tied to the decoder's embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from normlab.norms import LayerNorm, build_norm

PLACEMENTS = ("post", "pre")


def sinusoids(length: int, dim: int) -> torch.Tensor:
    """The (length, dim) sinusoidal position table: [sin | cos] halves, as fairseq's."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / (half - 1))
    angle = torch.arange(length, dtype=torch.float64)[:, None] * freq[None, :]  # (length, half)
    return torch.cat([angle.sin(), angle.cos()], dim=1).float()  # (length, dim)


def _check(vocab_size: int, ctx: int, src_len: int, d_model: int, n_heads: int, **shape) -> None:
    sizes = {"vocab_size": vocab_size, "ctx": ctx, "src_len": src_len, "d_model": d_model,
             "n_heads": n_heads, **shape}  # fmt: skip
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    if src_len >= ctx:
        raise ValueError(f"src_len={src_len} must be below ctx={ctx}: the decoder needs the rest")
    if d_model % n_heads or d_model % 2:
        raise ValueError(f"d_model={d_model} must be even and divisible by n_heads={n_heads}")


class EncoderDecoder(nn.Module):
    """ids (B, ctx) -> logits (B, ctx - src_len, V): the next characters of the target side.

    The encoder reads positions 0 .. src_len - 1, the decoder positions src_len .. ctx - 1 (each
    sees the ones before it), and its output at each predicts the character after it: the last
    ctx - src_len next-character targets of the window (normlab.tasks.language_model reads the
    targets' tail when the logits are shorter than the window).
    """

    def __init__(
        self,
        vocab_size: int,
        placement: Mapping[str, Any] | str,
        ctx: int = 128,
        src_len: int = 64,
        encoder_layers: int = 6,
        decoder_layers: int = 6,
        d_model: int = 128,
        n_heads: int = 4,
        ffn: int = 256,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        name = placement["name"] if isinstance(placement, Mapping) else placement
        if name not in PLACEMENTS:
            raise ValueError(f"placement must be one of {list(PLACEMENTS)}, got {name!r}")
        _check(vocab_size, ctx, src_len, d_model, n_heads, encoder_layers=encoder_layers,
               decoder_layers=decoder_layers, ffn=ffn)  # fmt: skip
        self.vocab_size, self.ctx, self.src_len, self.d_model = vocab_size, ctx, src_len, d_model
        self.placement, pre = name, name == "pre"
        layer = {"d_model": d_model, "nhead": n_heads, "dim_feedforward": ffn,
                 "dropout": dropout, "batch_first": True, "norm_first": pre}  # fmt: skip
        self.src_emb = nn.Embedding(vocab_size, d_model)
        self.tgt_emb = nn.Embedding(vocab_size, d_model)
        self.register_buffer("pos", sinusoids(ctx, d_model), persistent=False)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer), encoder_layers,
            norm=self._final_norm(d_model) if pre else None, enable_nested_tensor=False,
        )  # fmt: skip
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(**layer), decoder_layers,
            norm=self._final_norm(d_model) if pre else None,
        )  # fmt: skip
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tgt_emb.weight  # tied, as fairseq's shared decoder embeddings
        self._init_weights()

    @staticmethod
    def _final_norm(d_model: int) -> nn.Module:
        """Pre-LN's final norm of a stack: normlab's LayerNorm, built by the norms registry."""
        return build_norm(LayerNorm, d_model, channel_dim=-1)

    def _init_weights(self) -> None:
        """fairseq's: embeddings N(0, 1/d); every linear (attention in/out, FFN) Xavier-uniform
        with a zero bias (one Xavier draw over the packed q,k,v matrix has each part's bound of
        fairseq's separate draws with gain 1/sqrt(2)); the LayerNorms at weight 1, bias 0."""
        for emb in (self.src_emb, self.tgt_emb):
            nn.init.normal_(emb.weight, mean=0.0, std=self.d_model**-0.5)
        for layer in (*self.encoder.layers, *self.decoder.layers):
            for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attn is None:  # an encoder layer: no cross-attention
                    continue
                nn.init.xavier_uniform_(attn.in_proj_weight)
                nn.init.zeros_(attn.in_proj_bias)
                nn.init.xavier_uniform_(attn.out_proj.weight)
                nn.init.zeros_(attn.out_proj.bias)
            for linear in (layer.linear1, layer.linear2):
                nn.init.xavier_uniform_(linear.weight)
                nn.init.zeros_(linear.bias)

    def _embed(self, emb: nn.Embedding, idx: torch.Tensor, start: int) -> torch.Tensor:
        x = emb(idx) * math.sqrt(self.d_model) + self.pos[start : start + idx.shape[1]]
        return self.dropout(x)  # (B, T, D)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if T != self.ctx:
            raise ValueError(f"an encoder-decoder window has ctx={self.ctx} characters, got {T}")
        S = self.src_len
        memory = self.encoder(self._embed(self.src_emb, idx[:, :S], 0))  # (B, S, D)
        tgt = idx[:, S:]  # (B, T - S): the target side
        mask = nn.Transformer.generate_square_subsequent_mask(T - S, device=idx.device)
        h = self._embed(self.tgt_emb, tgt, 0)  # (B, T - S, D)
        h = self.decoder(h, memory, tgt_mask=mask, tgt_is_causal=True)  # (B, T - S, D)
        return self.head(h)  # (B, T - S, V)
