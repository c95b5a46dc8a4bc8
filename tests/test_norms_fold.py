"""fold_batchnorm: folded eval models compute what the unfolded eval models compute."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.norms import BatchNorm, create_norm, fold_batchnorm

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _train_a_little(model: nn.Module, shape: tuple[int, ...]) -> None:
    """A few training-mode forwards (non-trivial running stats) and random affine parameters."""
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, (BatchNorm, nn.modules.batchnorm._BatchNorm)) and m.weight is not None:
            with torch.no_grad():
                m.weight.uniform_(0.5, 2.0)
                if m.bias is not None:
                    m.bias.normal_()
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(shape) * 2 + 1)


def _count(model: nn.Module, types: tuple[type, ...]) -> int:
    return sum(isinstance(m, types) for m in model.modules())


BN_TYPES = (BatchNorm, nn.modules.batchnorm._BatchNorm)


class SmallConvNet(nn.Module):
    """Not a Sequential: conv -> bn pairs only visible in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = create_norm("batchnorm", 8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False, groups=2)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv1d = nn.Conv1d(8, 4, 3)
        self.bn3 = create_norm("batchnorm", 4, impl="reference", affine=False)
        self.fc = nn.Linear(4 * 14, 10)
        self.bn4 = create_norm("batchnorm", 10, momentum=None)
        self.skip_bn = create_norm("batchnorm", 8)  # after a ReLU: must stay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))  # (N, 8, 4, 4)
        h = self.skip_bn(torch.relu(self.bn2(self.conv2(h))))
        h = self.bn3(self.conv1d(h.flatten(2)))  # (N, 4, 14)
        return self.bn4(self.fc(h.flatten(1)))  # (N, 10)


def lenet() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2),
        create_norm("batchnorm", 6),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120),
        create_norm("batchnorm", 120, impl="manual"),
        nn.ReLU(),
        nn.Linear(120, 10),
    )


def test_fold_small_conv_net():
    model = SmallConvNet()
    _train_a_little(model, (4, 3, 4, 4))
    folded = fold_batchnorm(model)
    assert _count(folded, BN_TYPES) == 1 and isinstance(folded.skip_bn, BatchNorm)
    assert folded.conv2.bias is not None and not folded.training
    assert model.training  # the original is left alone
    x = torch.randn(5, 3, 4, 4)
    torch.testing.assert_close(folded(x), model.eval()(x), **TOL)


def test_fold_lenet_sequential():
    model = lenet()
    _train_a_little(model, (4, 1, 28, 28))
    folded = fold_batchnorm(model)
    assert _count(folded, BN_TYPES) == 0 and _count(folded, (nn.Identity,)) == 3
    x = torch.randn(5, 1, 28, 28)
    torch.testing.assert_close(folded(x), model.eval()(x), **TOL)


class Untraceable(nn.Module):
    """Data-dependent control flow: fx cannot trace it, so only Sequential pairs fold."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(2, 4, 3), create_norm("batchnorm", 4))
        self.conv = nn.Conv2d(4, 4, 1)
        self.bn = create_norm("batchnorm", 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(x)
        if h.sum() > 0:
            h = -h
        return self.bn(self.conv(h))


def test_fold_falls_back_to_sequential_neighbours():
    model = Untraceable()
    _train_a_little(model, (4, 2, 5, 5))
    folded = fold_batchnorm(model)
    assert isinstance(folded.block[1], nn.Identity)
    assert isinstance(folded.bn, BatchNorm)  # outside any Sequential: not detected, kept
    x = torch.randn(3, 2, 5, 5)
    torch.testing.assert_close(folded(x), model.eval()(x), **TOL)


def test_fold_skips_conv_output_used_twice():
    class TwoUsers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 4, 1)
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.conv(x)
            return self.bn(h) + h

    model = TwoUsers()
    _train_a_little(model, (4, 2, 3, 3))
    folded = fold_batchnorm(model)
    assert isinstance(folded.bn, nn.BatchNorm2d)
    x = torch.randn(2, 2, 3, 3)
    torch.testing.assert_close(folded(x), model.eval()(x), **TOL)


@pytest.mark.parametrize("make", [lambda: nn.BatchNorm2d(4, bias=False),
                                  lambda: create_norm("batchnorm", 4, bias=False)])  # fmt: skip
def test_fold_a_batchnorm_without_bias(make):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), make())
    _train_a_little(model, (4, 3, 6, 6))
    assert model[1].bias is None and model[1].weight is not None
    folded = fold_batchnorm(model)
    assert _count(folded, BN_TYPES) == 0
    x = torch.randn(5, 3, 6, 6)
    torch.testing.assert_close(folded(x), model.eval()(x), **TOL)
