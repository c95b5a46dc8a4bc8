"""normlab's norms against the torch.nn layers, for every impl.

Forward, input/weight/bias gradients over several training steps, running statistics,
eval outputs, identical state_dict keys and checkpoints loading both ways.
fp32 tolerances: rtol 1e-5, atol 1e-5 (outputs and gradients are O(1)).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.norms import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm, create_norm

TOL = {"rtol": 1e-5, "atol": 1e-5}
C = 6

# (normlab name, kwargs, input shape, the torch.nn layer it must equal)
CASES = [
    ("batchnorm", {}, (8, C), lambda: nn.BatchNorm1d(C)),
    ("batchnorm", {}, (4, C, 5), lambda: nn.BatchNorm1d(C)),
    ("batchnorm", {}, (4, C, 3, 3), lambda: nn.BatchNorm2d(C)),
    ("batchnorm", {"momentum": None}, (4, C, 3, 3), lambda: nn.BatchNorm2d(C, momentum=None)),
    ("batchnorm", {"momentum": 0.3, "eps": 1e-3}, (8, C), lambda: nn.BatchNorm1d(C, 1e-3, 0.3)),
    ("batchnorm", {"affine": False}, (4, C, 5), lambda: nn.BatchNorm1d(C, affine=False)),
    (
        "batchnorm",
        {"track_running_stats": False},
        (4, C, 3, 3),
        lambda: nn.BatchNorm2d(C, track_running_stats=False),
    ),
    ("instancenorm", {}, (4, C, 5), lambda: nn.InstanceNorm1d(C)),
    ("instancenorm", {}, (2, C, 3, 4), lambda: nn.InstanceNorm2d(C)),
    (
        "instancenorm",
        {"affine": True, "track_running_stats": True, "momentum": 0.3},
        (2, C, 3, 4),
        lambda: nn.InstanceNorm2d(C, momentum=0.3, affine=True, track_running_stats=True),
    ),
    (
        "instancenorm",
        {"affine": True, "track_running_stats": True},
        (4, C, 5),
        lambda: nn.InstanceNorm1d(C, affine=True, track_running_stats=True),
    ),
    ("groupnorm", {"num_groups": 1}, (4, C), lambda: nn.GroupNorm(1, C)),
    ("groupnorm", {"num_groups": 2}, (4, C, 5), lambda: nn.GroupNorm(2, C)),
    ("groupnorm", {"num_groups": 3, "eps": 1e-3}, (2, C, 3, 3), lambda: nn.GroupNorm(3, C, 1e-3)),
    (
        "groupnorm",
        {"num_groups": 6, "affine": False},
        (2, C, 3),
        lambda: nn.GroupNorm(6, C, affine=False),
    ),
    ("layernorm", {}, (4, 5, C), lambda: nn.LayerNorm(C)),
    ("layernorm", {"normalized_shape": (3, 4)}, (2, 5, 3, 4), lambda: nn.LayerNorm((3, 4))),
    ("layernorm", {"bias": False}, (4, C), lambda: nn.LayerNorm(C, bias=False)),
    (
        "layernorm",
        {"elementwise_affine": False, "eps": 1e-3},
        (4, 5, C),
        lambda: nn.LayerNorm(C, eps=1e-3, elementwise_affine=False),
    ),
    ("rmsnorm", {}, (4, 5, C), lambda: nn.RMSNorm(C)),
    ("rmsnorm", {"eps": 1e-5}, (4, C), lambda: nn.RMSNorm(C, eps=1e-5)),
    ("rmsnorm", {"normalized_shape": (3, 4)}, (2, 5, 3, 4), lambda: nn.RMSNorm((3, 4))),
    (
        "rmsnorm",
        {"elementwise_affine": False},
        (4, 5, C),
        lambda: nn.RMSNorm(C, elementwise_affine=False),
    ),
]


FAMILIES = {cls.family: cls for cls in (BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm)}


def _impls(name: str) -> tuple[str, ...]:
    """Every impl of the family (fast, reference, and manual where it has a hand-written one)."""
    return FAMILIES[name].impls


PARAMS = [
    pytest.param(case, impl, id=f"{case[0]}-{i}-{impl}")
    for i, case in enumerate(CASES)
    for impl in _impls(case[0])
]


def _randomize(module: nn.Module) -> None:
    """Random affine parameters and running statistics, so that none of them is trivial."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
        if getattr(module, "running_var", None) is not None:
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)


def _grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize(("case", "impl"), PARAMS)
def test_matches_torch_layer(case, impl):
    name, kwargs, shape, make_torch = case
    torch.manual_seed(0)
    ref = make_torch()
    _randomize(ref)
    ours = create_norm(
        name, shape[-1] if name in ("layernorm", "rmsnorm") else C, impl=impl, **kwargs
    )
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())  # a torch checkpoint loads into normlab's layer

    for step in range(3):  # training steps: outputs, gradients, running statistics
        x = (torch.randn(shape) * 2 + step).requires_grad_()
        x_ref = x.detach().clone().requires_grad_()
        y, y_ref = ours(x), ref(x_ref)
        torch.testing.assert_close(y, y_ref, **TOL)
        g = torch.randn(shape)
        y.backward(g)
        y_ref.backward(g)
        torch.testing.assert_close(x.grad, x_ref.grad, **TOL)
        for p, p_ref in zip(_grads(ours), _grads(ref), strict=True):
            torch.testing.assert_close(p, p_ref, **TOL)
        ours.zero_grad()
        ref.zero_grad()
    for key, value in ref.state_dict().items():
        if key == "num_batches_tracked" and name == "instancenorm":
            assert int(ours.num_batches_tracked) == 3  # torch's InstanceNorm never counts
        else:
            torch.testing.assert_close(ours.state_dict()[key], value, **TOL, msg=key)

    ours.eval()
    ref.eval()
    x = torch.randn(shape)
    torch.testing.assert_close(ours(x), ref(x), **TOL)

    back = make_torch()  # and normlab's state loads into torch's layer
    back.load_state_dict(ours.state_dict())
    torch.testing.assert_close(back.eval()(x), ref(x), **TOL)


@pytest.mark.parametrize("impl", ["fast", "reference", "manual"])
def test_instancenorm_cumulative_average_with_momentum_none(impl):
    # torch leaves running stats untouched when momentum is None; normlab averages, as in BN
    torch.manual_seed(0)
    norm = create_norm("instancenorm", C, momentum=None, track_running_stats=True, impl=impl)
    means, variances = [], []
    for _ in range(3):
        x = torch.randn(4, C, 5) * 3 + 1
        norm(x)
        means.append(x.mean(2).mean(0))
        variances.append(x.var(2, correction=1).mean(0))
    torch.testing.assert_close(norm.running_mean, torch.stack(means).mean(0), **TOL)
    torch.testing.assert_close(norm.running_var, torch.stack(variances).mean(0), **TOL)
    assert int(norm.num_batches_tracked) == 3
