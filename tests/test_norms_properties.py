"""Properties of normlab's norms: random shapes and eps, fast == reference == manual, gradcheck
(reference and manual), identities.

The random-shape tests run in float64: they check that two formulas are the same function, and
with 3 values per statistic a norm's input gradient is a difference of terms ~ 1 / std, so fp32
rounding alone can exceed an fp32 tolerance. fp32 agreement with torch.nn at realistic shapes
is tests/test_norms_vs_torch.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from normlab.norms import BatchNormFunction, RMSNormFunction, create_norm

TOL = {"rtol": 1e-5, "atol": 1e-5}
seeds = st.integers(0, 2**16)
FEW = settings(max_examples=25, deadline=None)

sizes = st.integers(min_value=3, max_value=5)  # 2 values per statistic: xhat = +-1, grads all noise
spatial = st.lists(sizes, min_size=0, max_size=2)
eps_values = st.sampled_from([1e-6, 1e-5, 1e-3, 0.1])


def _both(name: str, num_features: int, **kwargs):
    """The fast and reference norm (float64) with the same random affine parameters."""
    fast = create_norm(name, num_features, impl="fast", **kwargs).double()
    with torch.no_grad():
        for p in fast.parameters():
            p.normal_()
    ref = create_norm(name, num_features, impl="reference", **kwargs).double()
    ref.load_state_dict(fast.state_dict())
    return fast, ref


def _manual_agrees(name: str, fast, x: torch.Tensor, **kwargs) -> None:
    """The family's manual impl (where it has one) equals `fast` on x, parameters copied."""
    if "manual" not in fast.impls:
        return
    manual = create_norm(name, _features(fast), impl="manual", **kwargs).double()
    manual.load_state_dict(fast.state_dict())
    fast.zero_grad()  # its gradients from the comparison with reference
    _assert_same_function(fast, manual, x)


def _features(norm) -> int:
    """num_features of a built norm."""
    shape = getattr(norm, "normalized_shape", None)
    return shape[-1] if shape is not None else norm.num_features


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float | None = None) -> None:
    """Close to `tol` relative to the largest magnitude (at least 1); float64: 1e-9, else 1e-5."""
    tol = tol or (1e-9 if expected.dtype == torch.float64 else 1e-5)
    scale = max(1.0, expected.abs().max().item())
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol * scale)


def _assert_same_function(a, b, x):
    """Equal outputs and input/parameter gradients of two modules on `x`."""
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = a(xa), b(xb)
    _close(ya, yb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    _close(xa.grad, xb.grad)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        _close(pa.grad, pb.grad)


# ---------------------------------------------------------------- random shapes and eps


@FEW
@given(seed=seeds, n=sizes, c=sizes, rest=spatial, eps=eps_values, manual=st.booleans())
def test_batchnorm_random_shapes(seed, n, c, rest, eps, manual):
    torch.manual_seed(seed)
    x = torch.randn(n, c, *rest, dtype=torch.float64) * 3
    fast, ref = _both("batchnorm", c, eps=eps)
    other = create_norm("batchnorm", c, eps=eps, impl="manual" if manual else "reference")
    other = other.double()
    other.load_state_dict(fast.state_dict())
    _assert_same_function(fast, other, x)
    expected = F.batch_norm(x, None, None, fast.weight, fast.bias, True, 0.0, eps)
    _close(ref(x), expected)


@FEW
@given(seed=seeds, n=sizes, c=sizes, rest=st.lists(sizes, min_size=1, max_size=2), eps=eps_values)
def test_instancenorm_random_shapes(seed, n, c, rest, eps):
    torch.manual_seed(seed)
    x = torch.randn(n, c, *rest, dtype=torch.float64) * 3
    fast, ref = _both("instancenorm", c, eps=eps, affine=True)
    _assert_same_function(fast, ref, x)
    _manual_agrees("instancenorm", fast, x, eps=eps, affine=True)
    expected = F.instance_norm(x, weight=fast.weight, bias=fast.bias, eps=eps)
    _close(ref(x), expected)


@FEW
@given(
    seed=seeds,
    n=sizes,
    groups=st.integers(1, 3),
    per_group=st.integers(1, 3),
    rest=spatial,
    eps=eps_values,
)
def test_groupnorm_random_shapes(seed, n, groups, per_group, rest, eps):
    torch.manual_seed(seed)
    c = groups * per_group
    # at least 3 values per group: keeps var away from 0
    x = torch.randn(n, c, *rest, 3, dtype=torch.float64) * 3
    fast, ref = _both("groupnorm", c, num_groups=groups, eps=eps)
    _assert_same_function(fast, ref, x)
    _manual_agrees("groupnorm", fast, x, num_groups=groups, eps=eps)
    expected = F.group_norm(x, groups, fast.weight, fast.bias, eps)
    _close(ref(x), expected)


@FEW
@given(
    seed=seeds,
    lead=st.lists(sizes, min_size=1, max_size=2),
    trail=st.lists(sizes, min_size=1, max_size=2),
    eps=eps_values,
)
def test_layernorm_random_shapes(seed, lead, trail, eps):
    torch.manual_seed(seed)
    x = torch.randn(*lead, *trail, dtype=torch.float64) * 3
    fast, ref = _both("layernorm", trail[-1], normalized_shape=tuple(trail), eps=eps)
    _assert_same_function(fast, ref, x)
    _manual_agrees("layernorm", fast, x, normalized_shape=tuple(trail), eps=eps)
    expected = F.layer_norm(x, tuple(trail), fast.weight, fast.bias, eps)
    _close(ref(x), expected)


@FEW
@given(
    seed=seeds,
    lead=st.lists(sizes, min_size=1, max_size=2),
    trail=st.lists(sizes, min_size=1, max_size=2),
    eps=st.one_of(st.none(), eps_values),
)
def test_rmsnorm_random_shapes(seed, lead, trail, eps):
    torch.manual_seed(seed)
    x = torch.randn(*lead, *trail, dtype=torch.float64) * 3
    fast, ref = _both("rmsnorm", trail[-1], normalized_shape=tuple(trail), eps=eps)
    _assert_same_function(fast, ref, x)
    _manual_agrees("rmsnorm", fast, x, normalized_shape=tuple(trail), eps=eps)
    expected = F.rms_norm(x, tuple(trail), fast.weight, eps)
    _close(ref(x), expected)


@FEW
@given(
    seed=seeds,
    lead=st.lists(sizes, min_size=1, max_size=2),
    d=st.integers(1, 40),
    p=st.floats(0.01, 1.0),
    eps=eps_values,
)
def test_prmsnorm_random_shapes(seed, lead, d, p, eps):
    torch.manual_seed(seed)
    x = torch.randn(*lead, d, dtype=torch.float64) * 3
    fast, ref = _both("prmsnorm", d, p=p, eps=eps)
    _assert_same_function(fast, ref, x)
    _manual_agrees("prmsnorm", fast, x, p=p, eps=eps)
    k = math.ceil(round(p * d, 9))
    rms = x[..., :k].pow(2).mean(-1, keepdim=True).add(eps).sqrt()
    _close(ref(x), x / rms * fast.weight)


# ---------------------------------------------------------------- gradcheck in float64


GRADCHECK_NORMS = [
    ("batchnorm", {}, (4, 3, 2)),
    ("batchnorm", {"affine": False}, (5, 3)),
    ("instancenorm", {"affine": True}, (2, 3, 4)),
    ("groupnorm", {"num_groups": 2}, (2, 4, 3)),
    ("groupnorm", {"num_groups": 2, "affine": False}, (2, 4, 2, 2)),
    ("groupnorm", {"num_groups": 3}, (4, 6)),
    ("layernorm", {"normalized_shape": (2, 3)}, (3, 2, 3)),
    ("layernorm", {"bias": False}, (2, 3, 4)),
    ("layernorm", {"elementwise_affine": False}, (3, 5)),
    ("layernorm", {"channel_dim": 1}, (2, 3, 2, 2)),
    ("layernorm", {"channel_dim": 1, "elementwise_affine": False}, (2, 3, 4)),
    ("rmsnorm", {"eps": 1e-5}, (3, 5)),
    ("prmsnorm", {"p": 0.5, "eps": 1e-5}, (3, 5)),
]


@pytest.mark.parametrize(("name", "kwargs", "shape"), GRADCHECK_NORMS, ids=lambda v: str(v))
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("impl", ["reference", "manual"])
def test_reference_and_manual_gradcheck(name, kwargs, shape, training, impl):
    torch.manual_seed(0)
    channels_first = name in ("batchnorm", "instancenorm", "groupnorm") or "channel_dim" in kwargs
    norm = create_norm(
        name,
        shape[1] if channels_first else shape[-1],
        impl=impl,
        **kwargs,
    ).double()
    norm.train(training)
    names = [n for n, _ in norm.named_parameters()]
    params = [p.detach().normal_().requires_grad_() for p in norm.parameters()]
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)

    def f(x, *ps):
        return torch.func.functional_call(norm, dict(zip(names, ps, strict=True)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


@pytest.mark.parametrize("k", [7, 3, 1])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rmsnorm_function_gradcheck(k, with_weight):
    torch.manual_seed(0)
    x = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True) if with_weight else None
    inputs = (x, w) if with_weight else (x,)
    assert torch.autograd.gradcheck(lambda x, w=None: RMSNormFunction.apply(x, w, 1e-5, k), inputs)


@pytest.mark.parametrize("shape", [(5, 3), (3, 2, 4), (2, 2, 3, 2)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_batchnorm_function_gradcheck(shape, with_weight):
    # the hand-written backward: impl="manual", and sync=True in a single process
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    c = shape[1]
    w = torch.randn(c, dtype=torch.float64, requires_grad=True) if with_weight else None
    b = torch.randn(c, dtype=torch.float64, requires_grad=True) if with_weight else None

    def f(*inputs):
        return BatchNormFunction.apply(*inputs, 1e-5)[0]

    assert torch.autograd.gradcheck(f, (x, w, b) if with_weight else (x, None, None))


@pytest.mark.parametrize("impl", ["fast", "reference", "manual"])
def test_sync_batchnorm_single_process_is_plain_batchnorm(impl):
    torch.manual_seed(0)
    plain = create_norm("batchnorm", 3, impl=impl)
    synced = create_norm("batchnorm", 3, impl=impl, sync=True)
    for _ in range(2):
        _assert_same_function(plain, synced, torch.randn(4, 3, 2, 2))
    torch.testing.assert_close(plain.running_var, synced.running_var)


# ---------------------------------------------------------------- identities between families


@pytest.mark.parametrize("impl", ["fast", "reference", "manual"])
def test_groupnorm_one_group_per_channel_is_instancenorm(impl):
    x = torch.randn(3, 6, 4, 5)
    gn = create_norm("groupnorm", 6, num_groups=6, affine=False, impl=impl)
    inorm = create_norm("instancenorm", 6, impl=impl)
    torch.testing.assert_close(gn(x), inorm(x), **TOL)


@pytest.mark.parametrize("impl", ["fast", "reference", "manual"])
def test_groupnorm_one_group_is_layernorm_over_chw(impl):
    x = torch.randn(3, 6, 4, 5)
    gn = create_norm("groupnorm", 6, num_groups=1, affine=False, impl=impl)
    ln = create_norm(
        "layernorm", 5, normalized_shape=(6, 4, 5), elementwise_affine=False, impl=impl
    )
    torch.testing.assert_close(gn(x), ln(x), **TOL)


@pytest.mark.parametrize("impl", ["fast", "reference", "manual"])
def test_prmsnorm_p1_is_rmsnorm(impl):
    x = torch.randn(4, 5, 16)
    prms, rms = create_norm("prmsnorm", 16, p=1.0, impl=impl), create_norm("rmsnorm", 16, impl=impl)
    with torch.no_grad():
        prms.weight.normal_()
    rms.load_state_dict(prms.state_dict())
    _assert_same_function(prms, rms, x)


@pytest.mark.parametrize("impl", ["fast", "reference", "manual"])
def test_prmsnorm_statistic_uses_only_first_k_features(impl):
    d, p = 20, 0.25  # k = ceil(0.25 * 20) = 5
    norm = create_norm("prmsnorm", d, p=p, eps=1e-12, elementwise_affine=False, impl=impl)
    x = torch.randn(3, d)
    changed = x.clone()
    changed[:, 5:] = torch.randn(3, d - 5) * 10
    # x / rms: the ratio y / x is 1 / rms, equal wherever the first 5 features are equal
    torch.testing.assert_close(norm(changed) / changed, (norm(x) / x)[:, :1].expand(3, d), **TOL)
    bigger_head = x.clone()
    bigger_head[:, :5] *= 2
    torch.testing.assert_close(norm(bigger_head)[:, 5:], norm(x)[:, 5:] / 2, **TOL)
    assert norm.num_stat_features == 5


@pytest.mark.parametrize("impl", ["fast", "reference", "manual"])
@pytest.mark.parametrize("d", [64, 100, 127, 128, 129])
def test_prmsnorm_k_is_the_papers_ceil_n_p(d, impl):
    # Zhang & Sennrich 2019, Sec. 4: k = ceil(n * p); p = 1/16 exactly, so in integers
    # k = ceil(d / 16) = (d + 15) // 16 (the authors' code's int(d * p) = d // 16 is one less
    # wherever 16 does not divide d)
    k = (d + 15) // 16
    norm = create_norm("prmsnorm", d, p=0.0625, eps=1e-6, elementwise_affine=False, impl=impl)
    assert norm.num_stat_features == k
    x = torch.randn(4, d, dtype=torch.float64)
    rms = torch.sqrt(x[:, :k].pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm.double()(x), x / rms)


def test_prmsnorm_rounds_k_up():
    assert (
        create_norm("prmsnorm", 30, p=0.1).num_stat_features == 3
    )  # 0.1 * 30 = 3.0000000000000004
    assert create_norm("prmsnorm", 30, p=0.11).num_stat_features == 4  # ceil(3.3)
    assert create_norm("prmsnorm", 512).num_stat_features == 32  # default p = 0.0625
    assert create_norm("prmsnorm", 3, p=0.01).num_stat_features == 1
