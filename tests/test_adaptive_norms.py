"""Adaptive norms (normlab.norms.adaptive): `modulate` and the DiT's regressions, AdaLN and
AdaLNZero, against their formulas and in the DiT blocks that build them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from normlab.models.dit import AdaLNBlock, DiTBlock, FinalLayer
from normlab.norms import norm_partial
from normlab.norms.adaptive import AdaLN, AdaLNZero, modulate

B, T, D = 3, 5, 8


def test_modulate_tokens_and_channels():
    torch.manual_seed(0)
    shift, scale = torch.randn(B, D), torch.randn(B, D)
    x = torch.randn(B, T, D)
    expected = x * (1 + scale[:, None, :]) + shift[:, None, :]
    torch.testing.assert_close(modulate(x, shift, scale), expected)
    feats = torch.randn(B, D, 4, 4)  # channels at dim 1
    expected = feats * (1 + scale[:, :, None, None]) + shift[:, :, None, None]
    torch.testing.assert_close(modulate(feats, shift, scale, dim=1), expected)


def test_film_is_modulate_without_a_norm():
    # FiLM (Perez et al. 2018): gamma(z) * x + beta(z), gamma = 1 + dgamma
    torch.manual_seed(0)
    x, dgamma, beta = torch.randn(B, D, 4, 4), torch.randn(B, D), torch.randn(B, D)
    gamma = 1 + dgamma
    expected = gamma[:, :, None, None] * x + beta[:, :, None, None]
    torch.testing.assert_close(modulate(x, beta, dgamma, dim=1), expected)


@pytest.mark.parametrize(("cls", "chunks"), [(AdaLN, 2), (AdaLNZero, 3)])
def test_the_regression_is_linear_of_silu_c_split_in_order(cls, chunks):
    torch.manual_seed(0)
    layer = cls(D, zero_init=False)
    c = torch.randn(B, D)
    out = F.linear(F.silu(c), layer[1].weight, layer[1].bias)  # (B, chunks * D)
    got = layer(c)
    assert len(got) == chunks and all(t.shape == (B, D) for t in got)
    for k, t in enumerate(got):  # shift, scale[, gate]: consecutive rows of the Linear
        torch.testing.assert_close(t, out[:, k * D : (k + 1) * D], rtol=0, atol=0)


def test_adaln_starts_from_torchs_init_and_adaln_zero_from_zeros():
    torch.manual_seed(0)
    assert AdaLN(D)[1].weight.abs().sum() > 0 and not AdaLN(D).zero_init
    zero = AdaLNZero(D)
    assert zero.zero_init and zero[1].weight.abs().sum() == 0 and zero[1].bias.abs().sum() == 0
    shift, scale, gate = zero(torch.randn(B, D))
    assert all(torch.equal(t, torch.zeros(B, D)) for t in (shift, scale, gate))  # gate closed
    final = AdaLN(D, zero_init=True)  # the final layer's under adaLN-Zero: a plain norm at first
    assert final[1].weight.abs().sum() == 0


def test_gradients_reach_the_regression():
    layer = AdaLNZero(D, zero_init=False)
    h, c = torch.randn(B, T, D), torch.randn(B, D, requires_grad=True)
    shift, scale, gate = layer(c)
    (gate[:, None] * modulate(h, shift, scale)).square().sum().backward()
    assert c.grad is not None and c.grad.abs().sum() > 0
    assert layer[1].weight.grad.abs().sum() > 0


def test_the_dit_builds_them_one_per_branch():
    ln = norm_partial("layernorm", elementwise_affine=False)
    zero, plain = DiTBlock(D, 2, 4.0, ln), AdaLNBlock(D, 2, 4.0, ln)
    assert type(zero.adaLN_msa) is AdaLNZero and type(zero.adaLN_mlp) is AdaLNZero
    assert type(plain.adaLN_msa) is AdaLN and type(plain.adaLN_mlp) is AdaLN
    assert type(FinalLayer(D, 4, ln, True).adaLN_modulation) is AdaLN
    assert FinalLayer(D, 4, ln, None).adaLN_modulation is None  # plain conditionings: no c
    x, c = torch.randn(B, T, D), torch.randn(B, D)
    assert torch.equal(zero(x, c), x)  # adaLN-Zero: the block starts as the identity
