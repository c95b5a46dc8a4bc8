"""channel_dim: every norm on conv features (N, C, H, W) and on token features (B, T, D)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.norms import NormConfigError, available_norms, create_norm

IMPLS = ("fast", "reference", "manual")


def _randomize(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(0.5, 1.5)


@pytest.mark.parametrize("impl", IMPLS)
def test_layernorm_on_conv_features_is_groupnorm_with_one_group(impl):
    x = torch.randn(4, 6, 5, 5, requires_grad=True)
    ours = create_norm("layernorm", 6, channel_dim=1, impl=impl)
    _randomize(ours)
    torch_gn = nn.GroupNorm(1, 6)
    torch_gn.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x), torch_gn(x), rtol=1e-5, atol=1e-5)
    g = torch.randn_like(x)
    (dx,) = torch.autograd.grad(ours(x), x, g)
    (dx_ref,) = torch.autograd.grad(torch_gn(x), x, g)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", ["rmsnorm", "prmsnorm"])
def test_rms_on_conv_features_uses_first_k_channels_over_all_positions(name, impl):
    x = torch.randn(3, 8, 4, 4, dtype=torch.float64, requires_grad=True)
    norm = create_norm(name, 8, channel_dim=1, impl=impl, eps=1e-6).double()
    _randomize(norm)
    k = norm.num_stat_features
    rms = x[:, :k].pow(2).mean((1, 2, 3), keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(norm(x), x / rms * norm.weight.view(1, -1, 1, 1))
    assert torch.autograd.gradcheck(norm, (x,))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", ["batchnorm", "instancenorm", "groupnorm"])
def test_channel_families_on_token_features_normalize_the_last_dim(name, impl):
    x = torch.randn(3, 7, 8, dtype=torch.float64, requires_grad=True)
    kw = {"num_groups": 2} if name == "groupnorm" else {}
    norm = create_norm(name, 8, channel_dim=-1, impl=impl, **kw).double()
    ref = create_norm(name, 8, impl=impl, **kw).double()
    torch.testing.assert_close(norm(x), ref(x.transpose(1, 2)).transpose(1, 2))
    if name == "batchnorm":  # per-feature statistics over batch and positions
        torch.testing.assert_close(norm.running_mean, ref.running_mean)
    assert torch.autograd.gradcheck(norm, (x,))


@pytest.mark.parametrize("name", available_norms())
def test_every_norm_accepts_both_layouts(name):
    kw = {"num_groups": 2} if name == "groupnorm" else {}
    conv = create_norm(name, 4, channel_dim=1, **kw)
    tokens = create_norm(name, 4, channel_dim=-1, **kw)
    assert conv(torch.randn(2, 4, 3, 3)).shape == (2, 4, 3, 3)
    assert tokens(torch.randn(2, 5, 4)).shape == (2, 5, 4)


def test_bad_channel_dim_and_multi_dim_layernorm_fail_clearly():
    with pytest.raises(NormConfigError, match="channel_dim must be 1 or -1, got 2"):
        create_norm("batchnorm", 4, channel_dim=2)
    with pytest.raises(NormConfigError, match=r"normalized_shape=\(4, 4\)"):
        create_norm("layernorm", 4, normalized_shape=(4, 4), channel_dim=1)
