"""DyT (Zhu et al. 2025): the formula, its gradients, half inputs, the registry, and the models."""

from __future__ import annotations

import inspect

import pytest
import torch
from hydra.utils import instantiate
from torch.func import functional_call

from normlab.models.dit import BLOCKS, build_dit
from normlab.models.transformer import GPT
from normlab.norms import DyT, DyTFunction, NormConfigError, create_norm, norm_partial
from normlab.norms.residual import available_placements

IMPLS = ("fast", "reference", "manual")


def dyt_formula(x, alpha, weight, bias):
    """gamma * tanh(alpha * x) + beta, written out here, independently of normlab."""
    return weight * torch.tanh(alpha * x) + bias


def random_dyt(d, impl, seed=0, dtype=torch.float64, **kw):
    """A DyT with alpha, weight and bias away from their init (ones/zeros would hide bugs)."""
    norm = create_norm("dyt", d, impl=impl, **kw).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.alpha.copy_(0.3 + torch.rand(1, generator=g, dtype=dtype))
        norm.weight.copy_(torch.randn(d, generator=g, dtype=dtype))
        norm.bias.copy_(torch.randn(d, generator=g, dtype=dtype))
    return norm


def params(norm, channel_shape):
    """(alpha, weight, bias) of `norm` as plain tensors, weight/bias viewed as `channel_shape`."""
    return norm.alpha.detach(), *(p.detach().view(channel_shape) for p in (norm.weight, norm.bias))


# ------------------------------------------------------------------------------ the formula

# (input shape, channel_dim, shape the per-feature parameters broadcast as)
LAYOUTS = [
    ((3, 5, 8), None, (8,)),  # tokens (B, T, D): the family's own layout
    ((3, 8, 4, 4), 1, (1, 8, 1, 1)),  # conv features (N, C, H, W): per-channel gamma, beta
    ((6, 8), 1, (1, 8)),  # fc features (N, C)
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("shape", "channel_dim", "view"), LAYOUTS)
def test_forward_is_the_formula(impl, shape, channel_dim, view):
    norm = random_dyt(8, impl, channel_dim=channel_dim)  # None: DyT's own (..., D)
    x = 3 * torch.randn(shape, dtype=torch.float64)
    expected = dyt_formula(x, *params(norm, view))
    torch.testing.assert_close(norm(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("shape", "channel_dim", "view"), LAYOUTS)
def test_backward_is_autograd_of_the_formula(impl, shape, channel_dim, view):
    norm = random_dyt(8, impl, channel_dim=channel_dim)  # None: DyT's own (..., D)
    x = (3 * torch.randn(shape, dtype=torch.float64)).requires_grad_()
    dy = torch.randn(shape, dtype=torch.float64)
    norm(x).backward(dy)
    ours = [x.grad, norm.alpha.grad, norm.weight.grad, norm.bias.grad]
    leaves = [x.detach().clone().requires_grad_()]
    leaves += [p.detach().clone().requires_grad_() for p in (norm.alpha, norm.weight, norm.bias)]
    xr, alpha, weight, bias = leaves
    dyt_formula(xr, alpha, weight.view(view), bias.view(view)).backward(dy)
    for name, got, want in zip(("x", "alpha", "weight", "bias"), ours, leaves, strict=True):
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want.grad, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "kw", [{}, {"bias": False}, {"elementwise_affine": False}], ids=["affine", "nobias", "none"]
)
@pytest.mark.parametrize("channel_dim", [-1, 1])
def test_gradcheck_input_alpha_weight_bias(impl, kw, channel_dim):
    norm = create_norm("dyt", 4, impl=impl, channel_dim=channel_dim, **kw).double()
    g = torch.Generator().manual_seed(1)
    shape = (2, 3, 4) if channel_dim == -1 else (2, 4, 3)
    x = 2 * torch.randn(shape, generator=g, dtype=torch.float64)
    names = [n for n, _ in norm.named_parameters()]
    assert names == ["alpha", "weight", "bias"][: len(names)]
    values = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in norm.parameters()]
    values[0] = values[0].abs() + 0.2  # alpha

    def f(x, *ps):
        return functional_call(norm, dict(zip(names, ps, strict=True)), (x,))

    inputs = tuple(t.requires_grad_() for t in (x, *values))
    assert torch.autograd.gradcheck(f, inputs)


def test_function_gradcheck_with_any_subset_of_inputs_requiring_grad():
    g = torch.Generator().manual_seed(2)
    x, w, b = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((5, 6), (6,), (6,)))
    alpha = torch.tensor([0.7], dtype=torch.float64)
    for mask in ((True, False, False, False), (False, True, False, False),
                 (False, False, True, True), (True, True, True, True)):  # fmt: skip
        inputs = [t.clone().requires_grad_(m) for t, m in zip((x, alpha, w, b), mask, strict=True)]
        assert torch.autograd.gradcheck(DyTFunction.apply, tuple(inputs)), mask


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(impl, dtype):
    norm = random_dyt(64, impl, dtype=torch.float32)
    x32 = (4 * torch.randn(16, 32, 64)).to(dtype).float()  # values a half input can hold
    x = x32.to(dtype).requires_grad_()
    dy32 = torch.randn(16, 32, 64).to(dtype).float()
    y = norm(x)
    assert y.dtype == dtype
    y.backward(dy32.to(dtype))
    # the formula in float32 on the same values: the output rounded once to half
    ref_x = x32.clone().requires_grad_()
    ref_params = [p.detach().clone().requires_grad_() for p in (norm.alpha, norm.weight, norm.bias)]
    ref = dyt_formula(ref_x, *ref_params)
    ref.backward(dy32)
    one_ulp = {"rtol": torch.finfo(dtype).eps, "atol": 1e-6}  # float32 rounding, then half's
    torch.testing.assert_close(y, ref.to(dtype), **one_ulp)
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad, ref_x.grad.to(dtype), **one_ulp)
    # float32 parameters get float32 gradients summed in float32 over 512 rows (a sum in half
    # would be off by ~1e-3 relative)
    # alpha's gradient is one float32 sum over all 32,768 values: the summation order alone
    # moves it by ~sqrt(32768) float32 ulps (~1e-5 relative), so it gets 1e-4
    for p, r in zip((norm.alpha, norm.weight, norm.bias), ref_params, strict=True):
        assert p.grad.dtype == torch.float32
        rtol = 1e-4 if p is norm.alpha else 1e-5
        torch.testing.assert_close(p.grad, r.grad, rtol=rtol, atol=1e-5)


# ------------------------------------------------------------------------------ the module


def test_state_dict_and_init():
    norm = create_norm("dyt", 6)
    assert list(norm.state_dict()) == ["alpha", "weight", "bias"]
    assert norm.alpha.shape == (1,) and norm.alpha.item() == 0.5  # the paper's alpha0
    assert torch.equal(norm.weight, torch.ones(6)) and torch.equal(norm.bias, torch.zeros(6))
    assert list(create_norm("dyt", 6, bias=False).state_dict()) == ["alpha", "weight"]
    plain = create_norm("dyt", 6, elementwise_affine=False)
    assert list(plain.state_dict()) == ["alpha"] and plain.weight is None and plain.bias is None
    x = torch.randn(2, 6)
    torch.testing.assert_close(plain(x), torch.tanh(0.5 * x))


def test_create_norm_names_and_alpha0():
    norm = create_norm("dyt", 8, alpha0=0.8)
    assert type(norm) is DyT and norm.alpha.item() == pytest.approx(0.8)
    for name in ("DyT", "DynamicTanh", "dynamic_tanh"):
        assert type(create_norm(name, 8)) is DyT
    with torch.no_grad():
        norm.alpha.fill_(3.0)
    norm.reset_parameters()
    assert norm.alpha.item() == pytest.approx(0.8)  # back to alpha0
    assert list(inspect.signature(DyT).parameters) == [
        "num_features",
        "alpha0",
        "elementwise_affine",
        "bias",
        "impl",
        "channel_dim",
        "device",
        "dtype",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha0": 0.0}, r"dyt: alpha0 must be a finite number > 0, got 0.0"),
        ({"alpha0": float("nan")}, r"alpha0 must be a finite number > 0, got nan"),
        ({"alpha0": "0.5"}, r"alpha0 must be a finite number > 0, got '0.5'"),
        ({"eps": 1e-5}, r"dyt: unknown argument\(s\) eps; valid: alpha0, elementwise_affine"),
        ({"impl": "cuda"}, r"impl must be one of \['fast', 'reference', 'manual'\], got 'cuda'"),
        ({"sync": True}, "sync=True is only supported by batchnorm"),
    ],
)
def test_bad_arguments_fail_clearly(kwargs, message):
    with pytest.raises(NormConfigError, match=message):
        create_norm("dyt", 8, **kwargs)


def test_wrong_feature_size_fails_clearly():
    with pytest.raises(NormConfigError, match=r"dyt was built for trailing dims \(8,\)"):
        create_norm("dyt", 8)(torch.randn(2, 7))
    with pytest.raises(NormConfigError, match="dyt was built for 8 channels"):
        create_norm("dyt", 8, channel_dim=1)(torch.randn(2, 7, 3))


# ------------------------------------------------------------------------------ the models

DYT = norm_partial("dyt", alpha0=0.5, elementwise_affine=True, bias=True, impl="fast")
# DyT layers of a GPT per block (and the final norm), by placement
DYT_PER_BLOCK = {"post": (2, 0), "pre": (2, 1), "deepnorm": (2, 0), "sandwich": (4, 1)}


@pytest.mark.parametrize("placement", sorted(set(available_placements()) - {"none"}))
def test_gpt_with_dyt_in_each_placement_trains_every_alpha(placement):
    torch.manual_seed(0)
    model = GPT(65, {"name": placement}, DYT, depth=2, d_model=32, n_heads=2, ctx=16)
    dyts = [m for m in model.modules() if isinstance(m, DyT)]
    per_block, final = DYT_PER_BLOCK[placement]
    assert len(dyts) == 2 * per_block + final
    assert isinstance(model.final_norm, DyT) == bool(final)
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = model(idx)
    assert logits.shape == (2, 16, 65) and torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.roll(-1, 1).flatten()).backward()
    for m in dyts:  # the loss reaches every alpha, weight and bias
        for p in (m.alpha, m.weight, m.bias):
            assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


@pytest.mark.parametrize("conditioning", ["adaln_zero", "adaln"])
def test_dit_adaln_over_dyt_keeps_alpha_and_drops_the_affine(conditioning):
    torch.manual_seed(0)
    net = build_dit(DYT, conditioning=conditioning, class_dropout=0.0,
              hidden_size=32, depth=2, num_heads=4, patch_size=4)  # fmt: skip
    assert all(type(b) is BLOCKS[conditioning] for b in net.blocks)
    dyts = [n for b in net.blocks for n in (b.norm1, b.norm2)] + [net.final_layer.norm_final]
    assert all(isinstance(d, DyT) for d in dyts)  # norm1, norm2 of each block + the final norm
    assert sum(isinstance(m, DyT) for m in net.modules()) == 2 * 2 + 1
    assert all(d.weight is None and d.bias is None for d in dyts)  # the condition's shift/scale
    assert {n for d in dyts for n, _ in d.named_parameters()} == {"alpha"}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1, 28, 28, generator=g)
    t, y = torch.tensor([1, 10, 100, 999]), torch.arange(4)
    target = torch.randn(x.shape, generator=g)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(4):  # zero-init output layer (and gates): alphas see gradients from step 3
        loss = (net(x, t, y) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for d in dyts:  # every alpha was trained
        assert torch.isfinite(d.alpha.grad).all() and d.alpha.grad.abs().item() > 0
        assert d.alpha.item() != 0.5


def test_compose_norm_dyt_with_the_transformer(compose, tmp_path):
    cfg = compose(["model=transformer", "norm=dyt", "placement=post", "norm.alpha0=0.8"], tmp_path)
    assert (
        cfg.norm._target_ == "normlab.norms.DyT"
        and cfg.norm.alpha0 == 0.8
        and cfg.norm.impl == "fast"
    )
    net = instantiate(cfg.model).net
    norms = [m for m in net.modules() if isinstance(m, DyT)]
    assert len(norms) == 2 * len(net.blocks)
    assert all(m.alpha.item() == pytest.approx(0.8) for m in norms)


def test_compose_norm_dyt_with_the_dit(compose, tmp_path):
    cfg = compose(["experiment=dit", "norm=dyt"], tmp_path)
    net = instantiate(cfg.model.net)  # norm_eps skips a norm without eps
    norms = [b.norm1 for b in net.blocks] + [b.norm2 for b in net.blocks]
    assert all(isinstance(m, DyT) and m.weight is None for m in norms)  # the regression's
