"""LeNet: the pooling choice (model.net.pool) and its config."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.models.lenet import LeNet
from normlab.norms import norm_partial

BN = norm_partial("batchnorm")


def pools(net):
    return [net.features.pool1, net.features.pool2]


def test_default_pooling_is_average():
    net = LeNet(BN)
    assert all(type(p) is nn.AvgPool2d for p in pools(net))
    assert all(p.kernel_size == 2 and p.stride == 2 for p in pools(net))


def test_max_pooling():
    net = LeNet(BN, pool="max").eval()
    assert all(type(p) is nn.MaxPool2d for p in pools(net))
    assert all(p.kernel_size == 2 and p.stride == 2 for p in pools(net))
    x = torch.randn(3, 1, 28, 28)
    assert net(x).shape == (3, 10) and net.penultimate(x).shape == (3, 84)
    h = net.features.act1(net.features.norm1(net.features.conv1(x)))  # (3, 6, 24, 24)
    torch.testing.assert_close(
        net.features.pool1(h), h.unflatten(2, (12, 2)).unflatten(4, (12, 2)).amax((3, 5))
    )


def test_bad_pooling_names_the_argument_and_the_choices():
    with pytest.raises(ValueError, match=r"^pool='min': choose one of \['avg', 'max'\]$"):
        LeNet(BN, pool="min")


@pytest.mark.parametrize("pool,layer", [(None, nn.AvgPool2d), ("max", nn.MaxPool2d)])
def test_config_default_avg_and_max_override(compose, tmp_path, pool, layer):
    from hydra.utils import instantiate

    overrides = [] if pool is None else [f"model.net.pool={pool}"]
    cfg = compose(overrides, tmp_path)
    assert cfg.model.net.pool == (pool or "avg")
    assert all(type(p) is layer for p in pools(instantiate(cfg.model.net)))
