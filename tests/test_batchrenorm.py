"""Batch Renormalization (Ioffe 2017): BN when r_max=1 and d_max=0, the paper's formula with r and
d as constants otherwise, its schedule, eval, state_dict, float16. Both impls (fast, reference).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import REPO
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from normlab.norms import BatchNorm, BatchRenorm, NormConfigError, create_norm

IMPLS = ["fast", "reference"]
TOL = {"rtol": 1e-5, "atol": 1e-5}
C = 4


def paper_brn(x, gamma, beta, mu, var, eps, r_max, d_max, detach=True):
    """Ioffe 2017, Algorithm 1, on x of shape (N, C, *): returns (y, r, d)."""
    dims = (0, *range(2, x.dim()))
    view = (1, -1) + (1,) * (x.dim() - 2)
    mu_b = x.mean(dims)
    sigma_b = torch.sqrt(x.var(dims, correction=0) + eps)
    sigma = torch.sqrt(var + eps)
    r = torch.clamp(sigma_b / sigma, 1 / r_max, r_max)
    d = torch.clamp((mu_b - mu) / sigma, -d_max, d_max)
    if detach:  # stop_gradient(r), stop_gradient(d)
        r, d = r.detach(), d.detach()
    x_hat = (x - mu_b.view(view)) / sigma_b.view(view) * r.view(view) + d.view(view)
    return gamma.view(view) * x_hat + beta.view(view), r, d


def unclipped_r_d(x, mu, var, eps):
    """r and d before clipping: sigma_B / sigma and (mu_B - mu) / sigma."""
    dims = (0, *range(2, x.dim()))
    sigma = torch.sqrt(var + eps)
    return torch.sqrt(x.var(dims, correction=0) + eps) / sigma, (x.mean(dims) - mu) / sigma


def _brn(impl, dtype=torch.float32, **kwargs):
    kwargs = {"warmup_steps": 0, "relax_steps": 0, **kwargs}
    norm = create_norm("batchrenorm", C, impl=impl, **kwargs).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_()
    return norm


def _set_running(norm, mean, var):
    with torch.no_grad():
        norm.running_mean.copy_(torch.as_tensor(mean))
        norm.running_var.copy_(torch.as_tensor(var))


# ---------------------------------------------------------------- BN as a special case


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [(8, C), (4, C, 3, 3)], ids=["NC", "NCHW"])
@pytest.mark.parametrize(
    "limits",
    [{"r_max": 1.0, "d_max": 0.0}, {"r_max": 3.0, "d_max": 5.0, "warmup_steps": 10}],
    ids=["r_max=1,d_max=0", "in-warmup"],
)
def test_is_batchnorm_without_renormalization(impl, shape, limits):
    torch.manual_seed(0)
    brn = _brn(impl, **limits)
    _set_running(brn, torch.randn(C) * 3, torch.rand(C) * 4 + 0.1)  # far from any batch
    ours = BatchNorm(C, impl=impl)
    ours.load_state_dict(brn.state_dict(), strict=False)
    ref = (nn.BatchNorm1d if len(shape) == 2 else nn.BatchNorm2d)(C)
    ref.load_state_dict(brn.state_dict(), strict=False)
    for step in range(3):
        x = torch.randn(shape) * 2 + step
        xs = [x.clone().requires_grad_() for _ in range(3)]
        ys = [m(xi) for m, xi in zip((brn, ours, ref), xs, strict=True)]
        g = torch.randn(shape)
        for y in ys:
            y.backward(g)
        for other, x_other, y_other in zip((ours, ref), xs[1:], ys[1:], strict=True):
            torch.testing.assert_close(ys[0], y_other, **TOL)
            torch.testing.assert_close(xs[0].grad, x_other.grad, **TOL)
            torch.testing.assert_close(brn.weight.grad, other.weight.grad, **TOL)
            torch.testing.assert_close(brn.bias.grad, other.bias.grad, **TOL)
            for key in ("running_mean", "running_var", "num_batches_tracked"):
                torch.testing.assert_close(getattr(brn, key), getattr(other, key), **TOL)
        for m in (brn, ours, ref):
            m.zero_grad()


# ---------------------------------------------------------------- the paper's formula


def _clipping_case(impl):
    """A float64 layer (r_max 1.5, d_max 0.5) and an input for which r is clipped above in
    channel 0, below in channel 1, d clipped in channels 0 and 2, and channel 3 not clipped."""
    torch.manual_seed(1)
    std = torch.tensor([4.0, 0.2, 1.0, 1.1], dtype=torch.float64).view(1, C, 1, 1)
    mean = torch.tensor([2.0, 0.0, -3.0, 0.1], dtype=torch.float64).view(1, C, 1, 1)
    x = torch.randn(6, C, 3, 3, dtype=torch.float64) * std + mean
    brn = _brn(impl, torch.float64, r_max=1.5, d_max=0.5)
    _set_running(brn, [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    r, d = unclipped_r_d(x, brn.running_mean, brn.running_var, brn.eps)
    assert r[0] > 1.5 and r[1] < 1 / 1.5 and 1 / 1.5 < r[2] < 1.5 and 1 / 1.5 < r[3] < 1.5
    assert d[0] > 0.5 and d[2] < -0.5 and abs(d[1]) < 0.5 and abs(d[3]) < 0.5
    return brn, x


@pytest.mark.parametrize("impl", IMPLS)
def test_matches_the_paper_formula_with_active_clipping(impl):
    brn, x = _clipping_case(impl)
    mu, var = brn.running_mean.clone(), brn.running_var.clone()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    gamma, beta = (p.detach().clone().requires_grad_() for p in (brn.weight, brn.bias))
    y = brn(x1)
    y_ref, _, _ = paper_brn(x2, gamma, beta, mu, var, brn.eps, 1.5, 0.5)
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(brn.weight.grad, gamma.grad)
    torch.testing.assert_close(brn.bias.grad, beta.grad)
    # running statistics: BN's momentum update with the Bessel-corrected batch variance
    n = x.numel() // C
    dims = (0, 2, 3)
    torch.testing.assert_close(brn.running_mean, 0.9 * mu + 0.1 * x.mean(dims))
    unbiased = x.var(dims, correction=0) * n / (n - 1)
    torch.testing.assert_close(brn.running_var, 0.9 * var + 0.1 * unbiased)


@pytest.mark.parametrize("impl", IMPLS)
def test_r_and_d_get_no_gradient(impl):
    """Without clipping (r, d inside their limits) x_hat = (x - mu) / sigma if r and d carried
    gradient; the layer's gradient is the one with r and d detached, not that."""
    torch.manual_seed(2)
    x = torch.randn(8, C, 2, 2, dtype=torch.float64) * 1.3 + 0.4
    brn = _brn(impl, torch.float64, r_max=10.0, d_max=10.0)
    _set_running(brn, torch.randn(C, dtype=torch.float64) * 0.5, torch.rand(C) + 0.5)
    mu, var, eps = brn.running_mean.clone(), brn.running_var.clone(), brn.eps
    r, d = unclipped_r_d(x, mu, var, eps)
    assert ((r > 0.1) & (r < 10) & (d.abs() < 10)).all()  # no channel clipped
    g = torch.randn(x.shape, dtype=torch.float64)
    grads = {}
    for name, detach in (("detached", True), ("attached", False)):
        xi = x.clone().requires_grad_()
        y, _, _ = paper_brn(
            xi, brn.weight.detach(), brn.bias.detach(), mu, var, eps, 10, 10, detach
        )
        (grads[name],) = torch.autograd.grad(y, xi, g)
    xl = x.clone().requires_grad_()
    (dx,) = torch.autograd.grad(brn(xl), xl, g)
    torch.testing.assert_close(dx, grads["detached"])
    # with r, d attached the gradient is gamma / sigma * g: far from the layer's
    view = (1, C, 1, 1)
    torch.testing.assert_close(
        grads["attached"], g * (brn.weight / torch.sqrt(var + eps)).view(view)
    )
    assert (dx - grads["attached"]).abs().max() > 0.1


@pytest.mark.parametrize("impl", IMPLS)
def test_gradcheck_float64(impl):
    """gradcheck's finite differences move r and d with x, so the analytic gradient (r, d
    constants) is the function's gradient only where they are clipped: r_max=1, d_max=0 (BN), and
    an input with every r and d clipped. momentum 0 keeps the running statistics (so r, d) fixed."""
    torch.manual_seed(3)
    x_bn = torch.randn(5, C, 3, dtype=torch.float64)
    x_clipped = torch.randn(5, C, 3, dtype=torch.float64) * 3 + 2
    for limits, x in (((1.0, 0.0), x_bn), ((1.2, 0.3), x_clipped)):
        brn = _brn(impl, torch.float64, r_max=limits[0], d_max=limits[1], momentum=0.0)
        if limits != (1.0, 0.0):
            r, d = unclipped_r_d(x, brn.running_mean, brn.running_var, brn.eps)
            assert ((r > limits[0]) & (d > limits[1])).all()  # every r and d above its limit

        def f(x, weight, bias, brn=brn):
            return torch.func.functional_call(brn, {"weight": weight, "bias": bias}, (x,))

        inputs = (x.requires_grad_(), brn.weight.detach(), brn.bias.detach())
        assert torch.autograd.gradcheck(f, tuple(t.requires_grad_() for t in inputs))


# ---------------------------------------------------------------- schedule


def test_schedule_bn_for_warmup_steps_then_linear_to_the_final_limits():
    brn = create_norm("batchrenorm", C, r_max=3.0, d_max=5.0, warmup_steps=2, relax_steps=4)
    # (r_max, d_max) of training steps 0..6: 2 steps of BN, then 1/4, 2/4, 3/4, 4/4 of the way
    expected = [(1, 0), (1, 0), (1.5, 1.25), (2, 2.5), (2.5, 3.75), (3, 5), (3, 5)]
    seen = []
    for _ in expected:
        seen.append(tuple(float(t) for t in brn.limits()))
        brn(torch.randn(8, C))
    assert seen == expected
    assert int(brn.renorm_steps) == len(expected)
    brn.eval()
    brn(torch.randn(8, C))  # eval forwards are not training steps
    assert int(brn.renorm_steps) == len(expected)

    at_once = create_norm("batchrenorm", C, r_max=2.0, d_max=1.0, warmup_steps=1, relax_steps=0)
    seen = []
    for _ in range(3):
        seen.append(tuple(float(t) for t in at_once.limits()))
        at_once(torch.randn(8, C))
    assert seen == [(1, 0), (2, 1), (2, 1)]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_forward_uses_the_schedule(impl):
    """Step 0 (warmup) is BN whatever the running statistics; step 1 renormalizes by them."""
    torch.manual_seed(4)
    brn = _brn(impl, r_max=2.0, d_max=1.0, warmup_steps=1, momentum=0.0)
    _set_running(brn, torch.full((C,), 6.0), torch.full((C,), 9.0))
    bn = BatchNorm(C, impl=impl)
    bn.load_state_dict(brn.state_dict(), strict=False)
    x = torch.randn(16, C)
    torch.testing.assert_close(brn(x), bn(x))
    y, r, d = paper_brn(x, brn.weight, brn.bias, brn.running_mean, brn.running_var, brn.eps, 2, 1)
    # batch mean ~0, std ~1 vs running mean 6, sigma 3: d clipped at -d_max, r at 1 / r_max
    assert (d == -1).all() and (r == 0.5).all()
    torch.testing.assert_close(brn(x), y)
    assert (brn(x) - bn(x)).abs().max() > 0.5


def test_the_schedule_step_is_saved_and_resumes():
    brn = create_norm("batchrenorm", C, warmup_steps=2, relax_steps=4)
    for _ in range(3):
        brn(torch.randn(8, C))
    resumed = create_norm("batchrenorm", C, warmup_steps=2, relax_steps=4)
    resumed.load_state_dict(brn.state_dict())
    assert int(resumed.renorm_steps) == 3
    assert [float(t) for t in resumed.limits()] == [float(t) for t in brn.limits()] == [2.0, 2.5]


# ---------------------------------------------------------------- eval, state_dict, layouts


@pytest.mark.parametrize("impl", IMPLS)
def test_eval_normalizes_with_the_running_statistics(impl):
    torch.manual_seed(5)
    brn = _brn(impl)
    _set_running(brn, torch.randn(C), torch.rand(C) + 0.5)
    brn.eval()
    before = copy.deepcopy(brn.state_dict())
    x = torch.randn(3, C, 5)
    view = (1, C, 1)
    expected = (x - brn.running_mean.view(view)) / torch.sqrt(brn.running_var.view(view) + 1e-5)
    expected = expected * brn.weight.view(view) + brn.bias.view(view)
    torch.testing.assert_close(brn(x), expected, **TOL)
    torch.testing.assert_close(brn(x[:1, :, :1]), expected[:1, :, :1], **TOL)  # one value: fine
    for key, value in brn.state_dict().items():
        torch.testing.assert_close(value, before[key], msg=key)


def test_state_dict_is_batchnorms_plus_the_schedule_step():
    brn = create_norm("batchrenorm", C)
    assert list(brn.state_dict()) == [*nn.BatchNorm2d(C).state_dict(), "renorm_steps"]
    assert brn.renorm_steps.dtype == torch.long
    result = brn.load_state_dict(nn.BatchNorm2d(C).state_dict(), strict=False)
    assert result.missing_keys == ["renorm_steps"] and not result.unexpected_keys
    assert create_norm("brn", C, affine=False).state_dict().keys() == {
        "running_mean",
        "running_var",
        "num_batches_tracked",
        "renorm_steps",
    }


@pytest.mark.parametrize("impl", IMPLS)
def test_fast_equals_reference_over_steps_with_token_features(impl):
    """channel_dim=-1: (B, T, D) renormalized per feature over (B, T), as the transposed input."""
    torch.manual_seed(6)
    tokens = _brn(impl, torch.float64, r_max=1.5, d_max=0.5, channel_dim=-1)
    plain = _brn("reference" if impl == "fast" else "fast", torch.float64, r_max=1.5, d_max=0.5)
    plain.load_state_dict(tokens.state_dict())
    for step in range(3):
        x = torch.randn(3, 5, C, dtype=torch.float64) * (1 + step) + step
        torch.testing.assert_close(tokens(x), plain(x.transpose(1, 2)).transpose(1, 2))
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(tokens.state_dict()[key], value, msg=key)


# ---------------------------------------------------------------- float16


@pytest.mark.parametrize("impl", IMPLS)
def test_float16_input_has_float32_statistics(impl):
    """A float16 input (std 5 around 100: E[x^2] - E[x]^2 cancels in half) against the same layer
    in float32 on the same values: output within 2 float16 ulps, float32 running statistics."""
    torch.manual_seed(7)
    half_layer = _brn(impl)  # final limits at once: with running stats (0, 1), r and d clip
    full_layer = copy.deepcopy(half_layer)
    x = (torch.randn(16, C, 16, 16) * 5 + 100).half()
    u = torch.finfo(torch.float16).eps
    for _ in range(2):
        xh, xf = x.clone().requires_grad_(), x.float().requires_grad_()
        y, y32 = half_layer(xh), full_layer(xf)
        assert y.dtype == torch.float16
        assert ((y.float() - y32).abs() <= 2 * u * (1 + y32.abs())).all()
        g = torch.randn_like(y32).half()
        y.backward(g)
        y32.backward(g.float())
        assert xh.grad.dtype == torch.float16
        err = (xh.grad.float() - xf.grad).abs()
        assert (err <= 2 * u * (xf.grad.abs() + xf.grad.abs().max())).all()
    assert half_layer.running_mean.dtype == torch.float32
    torch.testing.assert_close(
        half_layer.running_mean, full_layer.running_mean, rtol=3e-5, atol=1e-5
    )
    torch.testing.assert_close(half_layer.running_var, full_layer.running_var, rtol=3e-5, atol=1e-5)
    half_layer.eval()
    full_layer.eval()
    y, y32 = half_layer(x), full_layer(x.float())
    assert y.dtype == torch.float16 and ((y.float() - y32).abs() <= 2 * u * (1 + y32.abs())).all()


# ---------------------------------------------------------------- config and arguments


def test_the_config_file_builds_the_layer_and_aliases_resolve():
    cfg = OmegaConf.load(REPO / "conf" / "norm" / "batchrenorm.yaml")
    brn = instantiate(cfg)(C)  # a partial of the class, called with the width
    assert isinstance(brn, BatchRenorm)
    assert (brn.r_max, brn.d_max, brn.warmup_steps, brn.relax_steps) == (3.0, 5.0, 5000, 35000)
    assert type(create_norm("BRN", C)) is type(create_norm("batch_renorm", C)) is BatchRenorm


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"r_max": 0.5}, r"r_max must be a finite number >= 1.0, got 0.5"),
        ({"d_max": -1.0}, r"d_max must be a finite number >= 0.0, got -1.0"),
        ({"warmup_steps": -1}, r"warmup_steps must be an integer >= 0, got -1"),
        ({"relax_steps": 2.5}, r"relax_steps must be an integer >= 0, got 2.5"),
        ({"sync": True}, r"sync=True is only supported by batchnorm"),
        ({"track_running_stats": False}, r"unknown argument\(s\) track_running_stats"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(NormConfigError, match=message):
        create_norm("batchrenorm", C, **kwargs)


def test_its_affine_key_switches_its_affine_off():
    # what adaLN does to a norm under it (normlab.models.dit.dit_norms): the regression replaces it
    from normlab.norms import norm_traits

    base = create_norm("batchrenorm", C, **{norm_traits("batchrenorm").affine_key: False})
    assert isinstance(base, BatchRenorm) and base.weight is None and base.bias is None
