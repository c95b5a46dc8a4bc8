"""The reference paths of BatchNorm, BatchRenorm and InstanceNorm on a channel whose mean is large
against its spread (mean 12 and std 0.1; mean 1e3 and std 1e-2), in float32.

The one-pass variance E[x^2] - E[x]^2 cancels on such a channel (at mean 1e3 and std 1e-2 in
float32 nothing of it is left). Each layer's output and input gradient are compared with float64
on the same float32 values (the torch.nn layer; for Batch Renorm, the paper's formula):
the reference within 1e-6 of the largest value, and at least as accurate as the fast path.
"""

from __future__ import annotations

import pytest
import torch
from test_batchrenorm import paper_brn
from torch import nn

from normlab.norms import create_norm

C = 4
CHANNELS = [(12.0, 0.1), (1e3, 1e-2)]  # (mean, std) of channel 0; the others N(0, 1)
TOL = 1e-6  # of the largest |y| and |dx|
BRN = {"warmup_steps": 0, "relax_steps": 0, "r_max": 3.0, "d_max": 5.0}  # r and d clip


def far_channel_input(mean: float, std: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, dy) of shape (16, C, 4, 4), float32: channel 0 of x with this mean and std."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, C, 4, 4, generator=gen)
    x[:, 0] = x[:, 0] * std + mean
    return x, torch.randn(x.shape, generator=gen)


def relative_error(ours: torch.Tensor, truth: torch.Tensor) -> float:
    return float((ours.double() - truth).abs().max() / truth.abs().max())


def errors(layer: nn.Module, truth, x: torch.Tensor, dy: torch.Tensor) -> tuple[float, float]:
    """(output error, input-gradient error) of layer(x) in float32 against truth(x) in float64."""
    x32 = x.clone().requires_grad_()
    y = layer(x32)
    y.backward(dy)
    x64 = x.double().requires_grad_()
    y64 = truth(x64)
    y64.backward(dy.double())
    return relative_error(y.detach(), y64.detach()), relative_error(x32.grad, x64.grad)


def layer_and_truth(family: str, impl: str):
    """normlab's layer (random affine) and its float64 ground truth with the same parameters."""
    torch.manual_seed(1)
    kwargs = {"affine": True, "track_running_stats": True} if family == "instancenorm" else {}
    layer = create_norm(family, C, impl=impl, **(BRN if family == "batchrenorm" else kwargs))
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.normal_()
    if family == "batchrenorm":
        w, b = layer.weight.detach().double(), layer.bias.detach().double()
        mu, var = layer.running_mean.double(), layer.running_var.double()
        return layer, lambda x: paper_brn(x, w, b, mu, var, layer.eps, BRN["r_max"], BRN["d_max"])[
            0
        ]
    torch_layer = {"batchnorm": nn.BatchNorm2d, "instancenorm": nn.InstanceNorm2d}[family]
    truth = torch_layer(C, **kwargs).double()
    truth.load_state_dict(layer.state_dict())
    return layer, truth


@pytest.mark.parametrize("family", ["batchnorm", "batchrenorm", "instancenorm"])
@pytest.mark.parametrize("mean,std", CHANNELS)
def test_reference_is_float32_accurate_and_no_worse_than_fast(family, mean, std):
    x, dy = far_channel_input(mean, std)
    ref_y, ref_dx = errors(*layer_and_truth(family, "reference"), x, dy)
    fast_y, fast_dx = errors(*layer_and_truth(family, "fast"), x, dy)
    assert ref_y <= TOL and ref_dx <= TOL, (ref_y, ref_dx)
    assert ref_y <= fast_y and ref_dx <= fast_dx, (ref_y, ref_dx, fast_y, fast_dx)
