"""Residual placements: each block equals its formula; DeepNorm constants; the registry's errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from normlab.errors import ConfigError
from normlab.norms import NormConfigError, norm_name, norm_partial
from normlab.norms.residual import (
    DeepNorm,
    available_placements,
    create_residual,
    deepnorm_constants,
    placement_class,
)

D = 16
LAYERNORM = norm_partial("layernorm", eps=1e-5, elementwise_affine=True, bias=True)
RMSNORM = norm_partial("rmsnorm", eps=1e-6, elementwise_affine=True)


def layer_norm(v: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    mean = v.mean(-1, keepdim=True)
    var = v.var(-1, unbiased=False, keepdim=True)
    return (v - mean) / torch.sqrt(var + eps)


def rms_norm(v: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps)


def sublayer() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, D), nn.Tanh())


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1)) * 3 + 1


@pytest.mark.parametrize(
    ("placement", "kw", "formula"),
    [
        ("post", {}, lambda x, f, n: n(x + f(x))),
        ("pre", {}, lambda x, f, n: x + f(n(x))),
        ("deepnorm", {"alpha": 2.5}, lambda x, f, n: n(2.5 * x + f(x))),
        ("sandwich", {}, lambda x, f, n: x + n(f(n(x)))),
        ("none", {}, lambda x, f, n: x + f(x)),
    ],
)
@pytest.mark.parametrize(("norm_cfg", "norm_fn"), [(LAYERNORM, layer_norm), (RMSNORM, rms_norm)])
def test_block_equals_formula(placement, kw, formula, norm_cfg, norm_fn, x):
    block = create_residual(placement, sublayer(), D, norm_cfg, **kw)
    f = sublayer()  # the same weights, applied by hand
    with torch.no_grad():
        expected = formula(x, f, norm_fn)
        got = block(x)
    assert got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_placements_differ(x):
    outs = [
        create_residual(p, sublayer(), D, LAYERNORM, **({"alpha": 2.0} if p == "deepnorm" else {}))(
            x
        )
        for p in available_placements()
    ]
    for i in range(len(outs)):
        for j in range(i + 1, len(outs)):
            assert not torch.allclose(outs[i], outs[j])


def test_final_norm_flags():
    assert {p for p in available_placements() if placement_class(p).needs_final_norm} == {
        "pre",
        "sandwich",
    }


def test_deepnorm_constants():
    N, M = 6, 18
    alpha, beta = deepnorm_constants("encoder", N=N)
    assert (alpha, beta) == pytest.approx(((2 * N) ** 0.25, (8 * N) ** -0.25))
    alpha, beta = deepnorm_constants("decoder", M=M)
    assert (alpha, beta) == pytest.approx(((2 * M) ** 0.25, (8 * M) ** -0.25))
    alpha, beta = deepnorm_constants("encoder_decoder", N=N, M=M)
    assert alpha == pytest.approx(0.81 * (N**4 * M) ** (1 / 16))
    assert beta == pytest.approx(0.87 * (N**4 * M) ** (-1 / 16))
    alpha, beta = deepnorm_constants("encoder_decoder", N=N, M=M, side="decoder")
    assert (alpha, beta) == pytest.approx(((3 * M) ** 0.25, (12 * M) ** -0.25))
    # DeepNet's 18-layer decoder-only numbers, written out: alpha = 36^(1/4), beta = 144^(-1/4).
    assert deepnorm_constants("decoder", M=18) == pytest.approx((math.sqrt(6), 1 / math.sqrt(12)))


def test_deepnorm_constants_errors():
    with pytest.raises(ValueError, match="encoder_decoder"):
        deepnorm_constants("transformer", N=6)
    with pytest.raises(ValueError, match="M must be a positive integer"):
        deepnorm_constants("decoder", N=6)
    with pytest.raises(ValueError, match="side"):
        deepnorm_constants("encoder_decoder", N=6, M=6, side="middle")


def test_deepnorm_alpha_scales_residual_not_sublayer(x):
    zero = nn.Linear(D, D)
    nn.init.zeros_(zero.weight)
    nn.init.zeros_(zero.bias)
    block = create_residual("deepnorm", zero, D, norm_partial("none"), alpha=3.0)
    torch.testing.assert_close(block(x), 3.0 * x)


@pytest.mark.parametrize("depth", [1, 6, 50])
def test_deepnorm_owns_alpha_and_beta_of_a_stack(depth):
    # DeepNet Table 1, written out: a decoder-only stack of M layers (the default arch) has
    # alpha = (2M)^(1/4), beta = (8M)^(-1/4); an encoder of N layers the same in N.
    for cfg in ({"name": "deepnorm"}, {"name": "deepnorm", "arch": "decoder"}, {"arch": "encoder"}):
        kw = DeepNorm.stack_kwargs(cfg, depth)
        assert kw == pytest.approx({"alpha": (2 * depth) ** 0.25, "beta": (8 * depth) ** -0.25})
        block = create_residual("deepnorm", sublayer(), D, LAYERNORM, **kw)
        assert (block.alpha, block.beta, block.init_gain) == (kw["alpha"], kw["beta"], kw["beta"])
    with pytest.raises(ConfigError, match="encoder_decoder"):
        DeepNorm.stack_kwargs({"arch": "encoder_decoder"}, depth)
    for name in ("post", "pre", "sandwich", "none"):  # no keywords, unscaled branch init
        assert placement_class(name).stack_kwargs({"arch": "encoder"}, depth) == {}
        assert placement_class(name).init_gain == 1.0


@pytest.mark.parametrize(
    ("placement", "kw"), [("pre", {}), ("deepnorm", {"alpha": 2.0, "beta": 0.3})]
)
def test_init_branch_draws_xavier_normal_with_the_placements_gain(placement, kw):
    # DeepNet Alg. 1: xavier_normal_(w, gain=beta), i.e. N(0, beta^2 * 2 / (fan_in + fan_out)),
    # drawn in the order given; other placements use gain 1.
    block = create_residual(placement, sublayer(), D, LAYERNORM, **kw)
    linears = (nn.Linear(D, 3 * D), nn.Linear(3 * D, D))
    torch.manual_seed(5)
    block.init_branch(linears)
    gain = kw.get("beta", 1.0)
    torch.manual_seed(5)
    for linear in linears:
        expected = torch.empty_like(linear.weight).normal_(0, gain * math.sqrt(2 / (4 * D)))
        torch.testing.assert_close(linear.weight, expected, rtol=0, atol=0)


def test_names_normalised_and_unknown_listed():
    assert placement_class("Pre").name == "pre"
    with pytest.raises(ValueError, match=r"\['deepnorm', 'none', 'post', 'pre', 'sandwich'\]"):
        create_residual("middle", sublayer(), D, LAYERNORM)
    with pytest.raises(ValueError, match="alpha"):
        create_residual("deepnorm", sublayer(), D, LAYERNORM)
    with pytest.raises(ValueError, match="beta must be a positive number"):
        create_residual("deepnorm", sublayer(), D, LAYERNORM, alpha=2.0, beta=0.0)


@pytest.mark.parametrize(
    "norm_cfg",
    [norm_partial("batchnorm"), norm_partial("groupnorm", num_groups=2), norm_partial("in")],
)
def test_position_mixing_norms_rejected(norm_cfg):
    name = norm_name(norm_cfg)
    with pytest.raises(NormConfigError, match=f"norm={name} cannot sit in placement=post"):
        create_residual("post", sublayer(), D, norm_cfg)
