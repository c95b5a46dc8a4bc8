"""Adaptive norms (normlab.norms.adaptive) against their formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from normlab.norms import NormConfigError
from normlab.norms.adaptive import (
    AdaLN,
    AdaLNZero,
    FiLM,
    ScaleShiftNorm,
    modulate,
    plain_norm,
)

B, T, D, C = 3, 5, 8, 6


def regress(layer, c):
    """The layer's regression Linear(act(c)) split into its chunks, computed by hand."""
    return layer.modulation(c).chunk(layer.num_chunks, dim=-1)


def randomize(layer):
    torch.manual_seed(1)
    for p in layer.modulation.parameters():
        p.data.normal_()


def test_modulate_tokens_and_channels():
    torch.manual_seed(0)
    shift, scale = torch.randn(B, D), torch.randn(B, D)
    x = torch.randn(B, T, D)
    expected = x * (1 + scale[:, None, :]) + shift[:, None, :]
    torch.testing.assert_close(modulate(x, shift, scale), expected)
    feats = torch.randn(B, D, 4, 4)  # channels at dim 1
    expected = feats * (1 + scale[:, :, None, None]) + shift[:, :, None, None]
    torch.testing.assert_close(modulate(feats, shift, scale, dim=1), expected)


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "groupnorm"])
def test_base_norm_has_no_affine(name):
    cfg = {"name": name, "num_groups": 2} if name == "groupnorm" else name
    norm = plain_norm(cfg, D)
    assert sum(p.numel() for p in norm.parameters()) == 0
    assert norm.weight is None and norm.bias is None


def test_adaln_is_layernorm_then_regressed_shift_scale():
    layer = AdaLN(D, 4)
    randomize(layer)
    x, c = torch.randn(B, T, D), torch.randn(B, 4)
    shift, scale = regress(layer, c)
    # the regression is Linear(SiLU(c))
    lin = layer.modulation[1]
    torch.testing.assert_close(torch.cat([shift, scale], -1), F.silu(c) @ lin.weight.T + lin.bias)
    expected = F.layer_norm(x, (D,)) * (1 + scale[:, None]) + shift[:, None]
    torch.testing.assert_close(layer(x, c), expected)


def test_adaln_with_rmsnorm_base():
    layer = AdaLN(D, 4, norm={"name": "rmsnorm", "eps": 1e-6})
    randomize(layer)
    x, c = torch.randn(B, T, D), torch.randn(B, 4)
    shift, scale = regress(layer, c)
    rms = x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(layer(x, c), (x / rms) * (1 + scale[:, None]) + shift[:, None])


def test_adaln_zero_starts_as_plain_norm_with_closed_gate():
    layer = AdaLNZero(D, 4)
    x, c = torch.randn(B, T, D), torch.randn(B, 4)
    h, gate = layer(x, c)
    torch.testing.assert_close(h, F.layer_norm(x, (D,)))
    assert gate.shape == (B, 1, D) and torch.equal(gate, torch.zeros_like(gate))
    assert all(torch.equal(p, torch.zeros_like(p)) for p in layer.modulation.parameters())


def test_adaln_zero_gate_is_the_third_chunk():
    layer = AdaLNZero(D, 4)
    randomize(layer)
    x, c = torch.randn(B, T, D), torch.randn(B, 4)
    shift, scale, g = regress(layer, c)
    h, gate = layer(x, c)
    torch.testing.assert_close(h, F.layer_norm(x, (D,)) * (1 + scale[:, None]) + shift[:, None])
    torch.testing.assert_close(gate, g[:, None])


def test_film_is_gamma_x_plus_beta():
    layer = FiLM(C, 4)
    randomize(layer)
    x, z = torch.randn(B, C, 5, 5), torch.randn(B, 4)
    lin = layer.modulation[1]
    beta, dgamma = (z @ lin.weight.T + lin.bias).chunk(2, -1)  # linear in z, no activation
    gamma = 1 + dgamma
    torch.testing.assert_close(layer(x, z), gamma[:, :, None, None] * x + beta[:, :, None, None])


def test_scale_shift_norm_is_groupnorm_then_modulation():
    layer = ScaleShiftNorm(C, 4, num_groups=3)
    randomize(layer)
    x, emb = torch.randn(B, C, 5, 5), torch.randn(B, 4)
    shift, scale = regress(layer, emb)
    h = F.group_norm(x, 3, eps=1e-5)
    expected = h * (1 + scale[:, :, None, None]) + shift[:, :, None, None]
    torch.testing.assert_close(layer(x, emb), expected)


def test_gradients_reach_the_regression():
    layer = AdaLN(D, 4)
    x, c = torch.randn(B, T, D), torch.randn(B, 4, requires_grad=True)
    layer(x, c).square().sum().backward()
    assert c.grad is not None and c.grad.abs().sum() > 0
    assert layer.modulation[1].weight.grad.abs().sum() > 0


def test_bad_norm_config_is_a_norm_config_error():
    with pytest.raises(NormConfigError):
        AdaLN(D, 4, norm={"eps": 1e-5})  # no name
    with pytest.raises(NormConfigError):
        ScaleShiftNorm(C, 4, num_groups=4)  # 4 does not divide 6
