"""Numerics of every norm family and impl in float16 and bfloat16, and the one eps rule.

Each case runs a layer on a half-precision input and the same layer in float32 on the float32
copy of that input (the same values; the output gradient is the same half values too), and
compares outputs, input gradients and parameter gradients. Inputs are large: std 5 with a mean
offset of 100 for the mean-subtracting norms (E[x^2] - E[x]^2 cancels in half, and scale/shift
coefficients rounded to half cost ~1e-2 of the output), std 5 at D = 4096 for the RMS norms (the
sum of squares, ~1e5, overflows float16's 65504), and BN/GN/IN statistics over 4096-16384 values.
Two parameter dtypes: "float32" (the layer's parameters and running statistics stay float32 under
a half input) and "half" (the layer converted with .to(dtype), which sends RMSNorm to the fused
C++ kernel when it is available).

Tolerances, with u = torch.finfo(dtype).eps (float16 2**-10, bfloat16 2**-7):
- outputs: |y - y32| <= 2u (1 + |y32|): a couple of roundings to the half dtype (each at most
  u/2 relative). Statistics computed in half, or coefficients rounded to half before
  normalising, miss this by 10x (or give inf/NaN/zeros).
- gradients: |g - g32| <= 2u (|g32| + max|g32|): the backward's terms partly cancel, so the
  error is relative to the largest gradient of the tensor.
- float32 running statistics (from the same values; torch's half kernels sum in another
  order): rtol 3e-5, atol 1e-5. A mean rounded to half (u/2 ~ 5e-4 relative) misses it. Half
  running statistics (rounded at each of 2 updates): rtol 2u.
"""

from __future__ import annotations

import copy
import math
import shutil

import pytest
import torch

from normlab.norms import _fused_rms, create_norm, fold_batchnorm
from normlab.norms.adaptive import AdaLN, modulate

HALF = [torch.float16, torch.bfloat16]
HALF_IDS = ["fp16", "bf16"]
CAN_BUILD = shutil.which("ninja") is not None and shutil.which("c++") is not None
D = 4096

# id: (family, kwargs, input shape, channel_dim, mean offset of the input)
CASES = {
    "bn": ("batchnorm", {}, (32, 8, 16, 16), None, 100.0),  # 8192 values per channel
    "bn-ghost": ("batchnorm", {"ghost_batch": 16}, (64, 8, 16, 16), None, 100.0),  # 4096 per slice
    "in": (
        "instancenorm",
        {"affine": True, "track_running_stats": True},
        (4, 8, 32, 128),
        None,
        100.0,
    ),
    "gn": ("groupnorm", {"num_groups": 4}, (4, 64, 16, 16), None, 100.0),  # 4096 per group
    "ln": ("layernorm", {}, (8, D), None, 100.0),
    "ln-channels": ("layernorm", {}, (4, 64, 8, 8), 1, 100.0),  # over (C, H, W) = 4096
    "rms": ("rmsnorm", {}, (8, D), None, 0.0),
    "rms-channels": ("rmsnorm", {}, (4, 64, 8, 8), 1, 0.0),
    "prms": ("prmsnorm", {"p": 0.75}, (8, D), None, 0.0),  # k = 3072 < D: the partial backward
}
# ghost BN: fast and reference (its manual is the reference); the rest: every family impl
IMPLS = {"bn-ghost": ["fast", "reference"]}
FUSED = {"rmsnorm", "prmsnorm"}


def _family_impls(family: str) -> tuple[str, ...]:
    """The family's impls: fast, reference, and manual where it has one."""
    kwargs = {"num_groups": 1} if family == "groupnorm" else {}
    return type(create_norm(family, 8, **kwargs)).impls


def _paths() -> list:
    """(case id, impl, fused) for every family x impl, fused on/off for RMSNorm's fast path."""
    out = []
    for cid, (family, *_) in CASES.items():
        for impl in IMPLS.get(cid, _family_impls(family)):
            for fused in [True, False] if family in FUSED and impl == "fast" else [None]:
                tag = "" if fused is None else ("-fused" if fused else "-unfused")
                out.append(pytest.param(cid, impl, fused, id=f"{cid}-{impl}{tag}"))
    return out


def _set_fused(monkeypatch, fused: bool | None) -> None:
    """Fused RMSNorm kernel on (skip if it cannot be built here) or off (as NORMLAB_FUSED_RMS=0)."""
    if fused:
        if not CAN_BUILD:
            pytest.skip("no C++ compiler or ninja: the fused kernel cannot be built here")
        assert _fused_rms.available()
    elif fused is False:
        monkeypatch.setattr(_fused_rms, "available", lambda: False)


def _features(cid: str) -> int:
    """num_features of the case: the channels (dim 1) or the trailing features."""
    family, _, shape, channel_dim, _ = CASES[cid]
    channels = channel_dim == 1 or family in ("batchnorm", "groupnorm", "instancenorm")
    return shape[1] if channels else shape[-1]


def _layer(cid: str, impl: str) -> tuple[torch.nn.Module, tuple[int, ...], float]:
    """The case's layer (float32, random affine) with its input shape and mean offset."""
    family, kwargs, shape, channel_dim, offset = CASES[cid]
    norm = create_norm(family, _features(cid), channel_dim=channel_dim, impl=impl, **kwargs)
    with torch.no_grad():
        if getattr(norm, "weight", None) is not None:
            norm.weight.uniform_(0.5, 1.5)
        if getattr(norm, "bias", None) is not None:
            norm.bias.uniform_(-1.0, 1.0)
    return norm, shape, offset


def _tol(dtype: torch.dtype) -> float:
    return 2 * torch.finfo(dtype).eps


def _assert_output_close(y: torch.Tensor, y32: torch.Tensor, dtype: torch.dtype) -> None:
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), y32, rtol=_tol(dtype), atol=_tol(dtype))


def _assert_grad_close(g: torch.Tensor, g32: torch.Tensor, dtype: torch.dtype) -> None:
    scale = g32.abs().max().item()
    torch.testing.assert_close(g.float(), g32, rtol=_tol(dtype), atol=_tol(dtype) * scale)


def _run(norm: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """y, dL/dx and the parameter gradients of `norm` at x for the output gradient dy."""
    x = x.clone().requires_grad_()
    norm.zero_grad()
    y = norm(x)
    y.backward(dy.to(y.dtype))
    return y, x.grad, [p.grad for p in norm.parameters()]


@pytest.mark.parametrize("params", ["float32", "half"])
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize(("cid", "impl", "fused"), _paths())
def test_half_input_matches_float32(cid, impl, fused, dtype, params, monkeypatch):
    _set_fused(monkeypatch, fused)
    torch.manual_seed(0)
    norm, shape, offset = _layer(cid, impl)
    if params == "half":
        norm = norm.to(dtype)
    norm32 = copy.deepcopy(norm).float()  # the same (rounded) parameters, in float32
    x = (torch.randn(shape) * 5 + offset).to(dtype)
    dy = torch.randn(shape).to(dtype)

    y, dx, dparams = _run(norm, x, dy)
    y32, dx32, dparams32 = _run(norm32, x.float(), dy.float())

    if fused is not None:  # the path under test is the one taken
        kernel = fused and params == "half"  # the kernel takes a weight of the input's dtype
        node = type(y.grad_fn.next_functions[0][0]).__name__
        assert ("normlab_fused_rms_norm" in node) if kernel else node == "RMSNormFunctionBackward"
    _assert_output_close(y, y32, dtype)
    assert dx.dtype == dtype
    _assert_grad_close(dx, dx32, dtype)
    for p, g, g32 in zip(norm.parameters(), dparams, dparams32, strict=True):
        assert g.dtype == p.dtype
        _assert_grad_close(g, g32, dtype)


def test_rmsnorm_fp16_std5_d4096_is_not_zero(monkeypatch):
    # the reported bug: the pure-torch fast path squared in float16, overflowed, gave all zeros
    monkeypatch.setattr(_fused_rms, "available", lambda: False)
    torch.manual_seed(0)
    x = torch.randn(8, D) * 5
    y = create_norm("rmsnorm", D).half()(x.half())
    expected = torch.nn.functional.rms_norm(x.half().float(), (D,))
    assert y.dtype == torch.float16
    assert 3.0 < y.float().abs().max().item() < 5.0
    torch.testing.assert_close(y.float(), expected, rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------- running statistics


@pytest.mark.parametrize("params", ["float32", "half"])
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize(
    ("cid", "impl"),
    [
        ("bn", "fast"),
        ("bn", "reference"),
        ("bn", "manual"),
        ("bn-ghost", "fast"),
        ("bn-ghost", "reference"),
    ]
    + [("in", "fast"), ("in", "reference"), ("in", "manual")],
)
def test_running_stats_keep_their_dtype_and_eval_matches(cid, impl, dtype, params):
    # float32 running statistics stay float32 (and exact) under half inputs; half ones (a layer
    # converted with .to) are updated, within a rounding or two of the float32 layer's
    torch.manual_seed(0)
    norm, shape, offset = _layer(cid, impl)
    norm32 = copy.deepcopy(norm)
    if params == "half":
        norm = norm.to(dtype)
    for _ in range(2):  # training steps
        x = (torch.randn(shape) * 5 + offset).to(dtype)
        norm(x)
        norm32(x.float())
    u = torch.finfo(dtype).eps
    tol = {"rtol": 3e-5, "atol": 1e-5} if params == "float32" else {"rtol": 2 * u, "atol": 0.0}
    for name in ("running_mean", "running_var"):
        stat, stat32 = getattr(norm, name), getattr(norm32, name)
        assert stat.dtype == (torch.float32 if params == "float32" else dtype), name
        torch.testing.assert_close(stat.float(), stat32, **tol, msg=name)
    norm.eval()
    norm32 = copy.deepcopy(norm).float()  # eval on the same (rounded) statistics in float32
    x = (torch.randn(shape) * 5 + offset).to(dtype)
    with torch.no_grad():
        _assert_output_close(norm(x), norm32(x.float()), dtype)


# ---------------------------------------------------------------- the eps rule


def _alternating(shape: tuple[int, ...], mean: float, dev: float) -> torch.Tensor:
    """mean +- dev alternating along the last dim: every statistics group has var = dev^2."""
    signs = torch.ones(shape[-1])
    signs[1::2] = -1
    return (mean + dev * signs).expand(shape).contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, *HALF], ids=["fp32", *HALF_IDS])
@pytest.mark.parametrize(("cid", "impl", "fused"), _paths())
def test_eps_is_added_to_the_variance_inside_the_sqrt(cid, impl, fused, dtype, monkeypatch):
    # y = (x - mean) / sqrt(var + eps): with var = eps = 1 every output is +-1/sqrt(2), where eps
    # outside the square root would give +-1/2 and eps added to the std +-1/2 as well. float32
    # to 1e-3: at mean / std = 100, E[x^2] - E[x]^2 (torch's kernels and the references) cancels
    # ~1e-4 of the variance away in float32 too
    _set_fused(monkeypatch, fused)
    family, kwargs, shape, channel_dim, offset = CASES[cid]
    affine = (
        "affine" if family in ("batchnorm", "groupnorm", "instancenorm") else "elementwise_affine"
    )
    kwargs = {**kwargs, "eps": 1.0, affine: False}
    norm = create_norm(family, _features(cid), channel_dim=channel_dim, impl=impl, **kwargs)
    x = _alternating(shape, offset, 1.0).to(dtype)
    y = norm(x)
    expected = (x.float() - offset) / math.sqrt(2.0)
    tol = max(_tol(dtype), 1e-3)
    torch.testing.assert_close(y.float(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize(
    ("impl", "fused"),
    [("fast", True), ("fast", False), ("reference", None), ("manual", None)],
    ids=["fused", "unfused", "reference", "manual"],
)
def test_rmsnorm_default_eps_is_float32s_for_half_input_as_torch(impl, fused, dtype, monkeypatch):
    # eps=None: torch.nn.RMSNorm's kernel uses float32's eps (1.19e-7) for half inputs, not
    # finfo(float16).eps = 9.8e-4; at mean square 1e-6 these give 0.945 and 0.032
    _set_fused(monkeypatch, fused)
    x = torch.full((4, 64), 1e-3).to(dtype)
    norm = create_norm("rmsnorm", 64, impl=impl).to(dtype)
    assert norm._eps(x) == torch.finfo(torch.float32).eps
    expected = torch.nn.RMSNorm(64, dtype=dtype)(x)
    torch.testing.assert_close(norm(x).float(), expected.float(), rtol=_tol(dtype), atol=0.0)


BAD_EPS = [0, 0.0, -1e-5, float("nan"), float("inf")]


@pytest.mark.parametrize("eps", BAD_EPS, ids=["0", "0.0", "negative", "nan", "inf"])
@pytest.mark.parametrize(
    "family", ["batchnorm", "groupnorm", "instancenorm", "layernorm", "rmsnorm", "prmsnorm"]
)
def test_bad_eps_fails_at_construction_with_one_line(family, eps):
    with pytest.raises(ValueError) as err:
        create_norm(family, 8, eps=eps, **({"num_groups": 2} if family == "groupnorm" else {}))
    message = str(err.value)
    assert "\n" not in message
    assert message == f"{family}: eps must be a finite number > 0, got {eps!r}"


# ---------------------------------------------------------------- adaptive norms and folding


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("inner", ["layernorm", "rmsnorm"])
def test_adaln_in_half_matches_float32(inner, dtype, monkeypatch):
    # the statistics come from the norm; RMSNorm on its pure-torch path (GPU, compile)
    monkeypatch.setattr(_fused_rms, "available", lambda: False)
    torch.manual_seed(0)
    norm = create_norm(inner, D, elementwise_affine=False).to(dtype)
    regression = AdaLN(D).to(dtype)  # c (B, D) -> shift, scale
    regression32 = copy.deepcopy(regression).float()
    offset = 100.0 if inner == "layernorm" else 0.0
    x = (torch.randn(2, 4, D) * 5 + offset).to(dtype)
    c = torch.randn(2, D).to(dtype)
    y = modulate(norm(x), *regression(c))
    y32 = modulate(norm.float()(x.float()), *regression32(c.float()))
    # the modulation (1 + scale) * h + shift adds a rounding or two of its own in half
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), y32, rtol=2 * _tol(dtype), atol=2 * _tol(dtype))


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_fold_batchnorm_of_a_half_model_computes_in_float32(dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), create_norm("batchnorm", 8))
    with torch.no_grad():
        bn = model[1]
        bn.running_mean.uniform_(90, 110)
        bn.running_var.uniform_(20, 30)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    model = model.to(dtype)
    folded, folded32 = fold_batchnorm(model), fold_batchnorm(copy.deepcopy(model).float())
    conv, conv32 = folded[0], folded32[0]
    assert conv.weight.dtype == conv.bias.dtype == dtype
    # one rounding of the float32 result: within half an ulp, u/2 relative
    u = torch.finfo(dtype).eps
    torch.testing.assert_close(conv.weight.float(), conv32.weight, rtol=u / 2, atol=0.0)
    torch.testing.assert_close(conv.bias.float(), conv32.bias, rtol=u / 2, atol=0.0)
