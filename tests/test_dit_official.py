"""Parity with the official DiT (facebookresearch/DiT models.py): the 2D sin-cos position table
and the timestep features in its channel order, and its weights loaded through
from_official_state_dict give its outputs."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch
from timm.layers import Attention, Mlp, PatchEmbed
from torch import nn

from normlab.models.dit import DiT, TimestepEmbedder, build_dit, from_official_state_dict, sincos_2d

TINY = {"input_size": 28, "in_channels": 1, "hidden_size": 96, "depth": 2, "num_heads": 4,
        "patch_size": 4, "num_classes": 10}  # fmt: skip


def position_table(dim: int, grid_size: int) -> np.ndarray:
    """DiT's (MAE's) 2D sin-cos table, from its definition: the token of patch (row i, column j)
    is number i * G + j; with d = dim / 4 and w_k = 10000^(-k / d), k < d, its channels are
    [sin(j w_k) | cos(j w_k) | sin(i w_k) | cos(i w_k)]: the column first."""
    d = dim // 4
    table = np.zeros((grid_size * grid_size, dim))
    for i in range(grid_size):
        for j in range(grid_size):
            for k in range(d):
                w = 10000.0 ** (-k / d)
                n = i * grid_size + j
                table[n, k], table[n, d + k] = math.sin(j * w), math.cos(j * w)
                table[n, 2 * d + k], table[n, 3 * d + k] = math.sin(i * w), math.cos(i * w)
    return table


@pytest.mark.parametrize("dim,grid_size", [(96, 7), (32, 4), (384, 16)])
def test_position_table_is_dits_with_the_column_first(dim, grid_size):
    ours = sincos_2d(dim, grid_size).numpy()
    np.testing.assert_allclose(ours, position_table(dim, grid_size), rtol=0, atol=1e-6)


def test_timestep_features_are_cos_then_sin():
    t = torch.tensor([0.0, 1.0, 17.0, 500.0, 999.0])
    ours = TimestepEmbedder(8).features(t).numpy()  # frequency_dim 256
    k = np.arange(128)
    angles = t.numpy()[:, None].astype(np.float64) * 10000.0 ** (-k / 128)[None]
    expected = np.concatenate([np.cos(angles), np.sin(angles)], axis=1)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# The official model, transcribed (facebookresearch/DiT models.py, eval-mode forward)
# ---------------------------------------------------------------------------------------------


def official_modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def official_pos_embed(embed_dim: int, grid_size: int) -> np.ndarray:
    """get_2d_sincos_pos_embed (DiT, from MAE's util/pos_embed.py)."""

    def one_axis(embed_dim, pos):
        omega = np.arange(embed_dim // 2, dtype=np.float64)
        omega /= embed_dim / 2.0
        omega = 1.0 / 10000**omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0)  # here w goes first
    grid = grid.reshape([2, 1, grid_size, grid_size])
    emb_h = one_axis(embed_dim // 2, grid[0])
    emb_w = one_axis(embed_dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)


class OfficialTimestepEmbedder(nn.Module):
    def __init__(self, hidden_size, frequency_embedding_size=256):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size, bias=True),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size, bias=True),
        )
        self.frequency_embedding_size = frequency_embedding_size

    @staticmethod
    def timestep_embedding(t, dim, max_period=10000):
        half = dim // 2
        freqs = torch.exp(
            -math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half
        )
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, t):
        return self.mlp(self.timestep_embedding(t, self.frequency_embedding_size))


class OfficialLabelEmbedder(nn.Module):
    def __init__(self, num_classes, hidden_size, dropout_prob):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + (dropout_prob > 0), hidden_size)

    def forward(self, labels):  # eval: no label dropout
        return self.embedding_table(labels)


class OfficialDiTBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads=num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        mlp_hidden_dim = int(hidden_size * mlp_ratio)
        self.mlp = Mlp(hidden_size, mlp_hidden_dim, act_layer=lambda: nn.GELU(approximate="tanh"))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(
            c
        ).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(
            official_modulate(self.norm1(x), shift_msa, scale_msa)
        )
        x = x + gate_mlp.unsqueeze(1) * self.mlp(
            official_modulate(self.norm2(x), shift_mlp, scale_mlp)
        )
        return x


class OfficialFinalLayer(nn.Module):
    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(official_modulate(self.norm_final(x), shift, scale))


class OfficialDiT(nn.Module):
    def __init__(self, input_size, patch_size, in_channels, hidden_size, depth, num_heads,
                 num_classes, mlp_ratio=4.0, class_dropout_prob=0.1, learn_sigma=True):  # fmt: skip
        super().__init__()
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size, bias=True)
        self.t_embedder = OfficialTimestepEmbedder(hidden_size)
        self.y_embedder = OfficialLabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        num_patches = self.x_embedder.num_patches
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, hidden_size), requires_grad=False)
        self.blocks = nn.ModuleList(
            [OfficialDiTBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio) for _ in range(depth)]
        )
        self.final_layer = OfficialFinalLayer(hidden_size, patch_size, self.out_channels)
        pos_embed = official_pos_embed(hidden_size, int(num_patches**0.5))
        self.pos_embed.data.copy_(torch.from_numpy(pos_embed).float().unsqueeze(0))

    def unpatchify(self, x):
        c = self.out_channels
        p = self.x_embedder.patch_size[0]
        h = w = int(x.shape[1] ** 0.5)
        x = x.reshape(shape=(x.shape[0], h, w, p, p, c))
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(shape=(x.shape[0], c, h * p, h * p))

    def forward(self, x, t, y):
        x = self.x_embedder(x) + self.pos_embed  # (N, T, D)
        c = self.t_embedder(t) + self.y_embedder(y)  # (N, D)
        for block in self.blocks:
            x = block(x, c)  # (N, T, D)
        return self.unpatchify(self.final_layer(x, c))  # (N, out_channels, H, W)


# ---------------------------------------------------------------------------------------------


def official_with_random_weights(learn_sigma: bool) -> OfficialDiT:
    """The official model with every trainable weight drawn at random, std 0.05 (its own init
    zeroes the modulations and the output layer, which would hide their mapping)."""
    torch.manual_seed(0)
    official = OfficialDiT(**TINY, learn_sigma=learn_sigma).eval()
    with torch.no_grad():
        for p in official.parameters():
            if p.requires_grad:
                p.normal_(0.0, 0.05)
    return official


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


DITS_LAYERNORM = partial(nn.LayerNorm, elementwise_affine=False, eps=1e-6)  # as DiT builds it
OURS = {  # the official model here: DiT with torch's LayerNorm, or build_dit() from config keys
    "torch_layernorm": lambda: DiT(DITS_LAYERNORM, **TINY),
    "config": lambda: build_dit(**TINY),  # conf/model/dit.yaml's defaults: layernorm, eps 1e-6
}


@pytest.mark.parametrize("ours", OURS)
@pytest.mark.parametrize("learn_sigma", [False, True])
def test_official_weights_give_the_official_output(learn_sigma, ours):
    official = official_with_random_weights(learn_sigma)
    ours = OURS[ours]().eval()
    ours.load_state_dict(from_official_state_dict(official.state_dict()))  # strict: every key
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 1, 28, 28, generator=g)
    t = torch.randint(0, 1000, (8,), generator=g)
    y = torch.randint(0, 11, (8,), generator=g)  # 10: the null label
    with torch.no_grad():
        expected = official(x, t, y)[:, :1]  # eps (learn_sigma: the variance channel follows)
        out = ours(x, t, y)
    assert expected.std() > 0.1  # the random weights reach the output
    # fp32 rounding only: 5e-7 measured, all of it from the official timestep angles t * w_k
    # in float32 (ours float64; with float64 angles the two outputs are equal bit for bit)
    assert relative_difference(out, expected) < 1e-5


def test_mapping_splits_the_six_modulation_chunks_in_order():
    D = TINY["hidden_size"]
    sd = official_with_random_weights(learn_sigma=False).state_dict()
    mapped = from_official_state_dict(sd)
    # official rows: (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp), D each
    six = sd["blocks.1.adaLN_modulation.1.weight"].view(6, D, D)
    msa = mapped["blocks.1.adaLN_msa.1.weight"].view(3, D, D)  # (shift, scale, gate)
    mlp = mapped["blocks.1.adaLN_mlp.1.weight"].view(3, D, D)
    assert torch.equal(msa, six[:3]) and torch.equal(mlp, six[3:])
    assert "pos_embed" not in mapped


def test_a_position_table_in_another_order_is_refused():
    sd = official_with_random_weights(learn_sigma=False).state_dict()
    D = TINY["hidden_size"]
    sd["pos_embed"] = torch.cat(
        [sd["pos_embed"][..., D // 2 :], sd["pos_embed"][..., : D // 2]], -1
    )
    with pytest.raises(ValueError, match="pos_embed"):
        from_official_state_dict(sd)
