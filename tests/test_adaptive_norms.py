"""Adaptive norms (normlab.norms.adaptive) against their formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from normlab.norms import NormConfigError, norm_partial
from normlab.norms.adaptive import (
    AdaLN,
    AdaLNZero,
    FiLM,
    ScaleShiftNorm,
    modulate,
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
    kwargs = {"num_groups": 2} if name == "groupnorm" else {}
    norm = AdaLN(D, 4, norm_partial(name, **kwargs)).norm  # the regressed shift/scale replace it
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
    layer = AdaLN(D, 4, norm=norm_partial("rmsnorm", eps=1e-6))
    randomize(layer)
    x, c = torch.randn(B, T, D), torch.randn(B, 4)
    shift, scale = regress(layer, c)
    rms = x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(layer(x, c), (x / rms) * (1 + scale[:, None]) + shift[:, None])


def test_adaln_zero_starts_as_its_base_norm_with_closed_gate():
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


def adm_scale_shift_norm(layer, x, emb, num_groups):
    """guided-diffusion's ResBlock with use_scale_shift_norm, computed independently: an affine
    torch.nn.GroupNorm run in fp32 and cast back, then (scale, shift) = Linear(SiLU(emb))."""
    gn = torch.nn.GroupNorm(num_groups, x.shape[1], eps=1e-5, affine=True)
    gn.load_state_dict({"weight": layer.norm.weight, "bias": layer.norm.bias})
    lin = layer.modulation[1]
    emb_out = (F.silu(emb) @ lin.weight.T + lin.bias).to(x.dtype)[:, :, None, None]
    scale, shift = emb_out.chunk(2, dim=1)  # ADM's order: scale first
    return gn(x.float()).to(x.dtype) * (1 + scale) + shift


def randomize_affine(layer):
    torch.manual_seed(2)
    layer.norm.weight.data.normal_()
    layer.norm.bias.data.normal_()


def test_scale_shift_norm_is_adm_groupnorm_with_affine_then_scale_shift():
    layer = ScaleShiftNorm(C, 4, num_groups=3)
    randomize(layer)
    randomize_affine(layer)
    x, emb = torch.randn(B, C, 5, 5), torch.randn(B, 4)
    torch.testing.assert_close(layer(x, emb), adm_scale_shift_norm(layer, x, emb, 3))


def test_scale_shift_norm_chunks_scale_then_shift():
    layer = ScaleShiftNorm(C, 4, num_groups=3)
    lin = layer.modulation[1]
    torch.nn.init.zeros_(lin.weight)
    scale, shift = torch.full((C,), 2.0), torch.full((C,), 0.5)
    lin.bias.data.copy_(torch.cat([scale, shift]))  # first chunk: scale, second: shift
    x, emb = torch.randn(B, C, 5, 5), torch.randn(B, 4)
    h = F.group_norm(x, 3, layer.norm.weight, layer.norm.bias, eps=1e-5)
    torch.testing.assert_close(layer(x, emb), h * 3.0 + 0.5)


def test_scale_shift_norm_state_dict_has_the_groupnorm_affine():
    layer = ScaleShiftNorm(C, 4, num_groups=3)
    assert set(layer.state_dict()) == {
        "norm.weight",
        "norm.bias",
        "modulation.1.weight",
        "modulation.1.bias",
    }
    assert layer.norm.weight.shape == layer.norm.bias.shape == (C,)
    assert torch.equal(layer.norm.weight, torch.ones(C))  # GroupNorm's own init
    assert torch.equal(layer.norm.bias, torch.zeros(C))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scale_shift_norm_low_precision_input_keeps_statistics_in_fp32(dtype):
    layer = ScaleShiftNorm(C, 4, num_groups=3)
    randomize(layer)
    randomize_affine(layer)
    seen = []
    layer.norm.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    # a large common offset: fp16/bf16 statistics would lose most of the variation
    x = (300 + torch.randn(B, C, 5, 5)).to(dtype)
    emb = torch.randn(B, 4)
    y = layer(x, emb)
    assert seen == [torch.float32]  # the GroupNorm ran on x.float()
    assert y.dtype == dtype
    torch.testing.assert_close(y, adm_scale_shift_norm(layer, x, emb, 3), rtol=0, atol=0)


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
