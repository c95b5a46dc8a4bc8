"""The all-conv net: six norms at 28, 28, 14, 14, 7, 7 pixels, and what Ghost BN averages there."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.config import check_combination
from normlab.errors import ConfigError
from normlab.models.allconv import AllConvNet
from normlab.norms import BatchNorm, GroupNorm, NoNorm, norm_partial

BN = norm_partial("batchnorm")
NORMS = [f"norm{k}" for k in range(1, 7)]


def norm_inputs(net: AllConvNet, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each norm's input in one forward pass (forward pre-hooks)."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        net.features.get_submodule(name).register_forward_pre_hook(
            lambda _m, args, name=name: seen.__setitem__(name, args[0].detach())
        )
        for name in NORMS
    ]
    out = net(x)
    for hook in hooks:
        hook.remove()
    assert out.shape == (x.shape[0], 10)
    return seen


def test_forward_shape_and_penultimate():
    net = AllConvNet(BN)
    x = torch.randn(4, *AllConvNet.input_shape)
    assert net(x).shape == (4, 10)
    assert net.penultimate(x).shape == (4, 64)
    torch.testing.assert_close(net.fc(net.penultimate(x)), net(x))
    assert AllConvNet(BN, channels=[8, 12, 20], num_classes=3)(x).shape == (4, 3)


def test_six_norms_one_after_each_conv_at_28_14_7_pixels():
    net = AllConvNet(BN)
    children = dict(net.features.named_children())
    assert sum(isinstance(m, BatchNorm) for m in net.modules()) == 6
    assert sum(isinstance(m, nn.Conv2d) for m in net.modules()) == 6
    names = list(children)
    for k in range(1, 7):  # conv -> norm -> relu, in that order
        i = names.index(f"conv{k}")
        assert names[i : i + 3] == [f"conv{k}", f"norm{k}", f"act{k}"]
        conv = children[f"conv{k}"]
        assert conv.kernel_size == (3, 3) and conv.padding == (1, 1) and conv.bias is None
        assert isinstance(children[f"act{k}"], nn.ReLU)
    assert [type(children[p]) for p in ("pool1", "pool2")] == [nn.MaxPool2d] * 2
    seen = norm_inputs(net, torch.randn(2, 1, 28, 28))
    assert [tuple(seen[n].shape[1:]) for n in NORMS] == [
        (16, 28, 28), (16, 28, 28), (32, 14, 14), (32, 14, 14), (64, 7, 7), (64, 7, 7),
    ]  # fmt: skip
    assert [net.features.get_submodule(n).num_features for n in NORMS] == [16, 16, 32, 32, 64, 64]


def test_ghost_bn_at_2_images_per_device_averages_98_values_in_the_last_stage():
    torch.manual_seed(0)
    net = AllConvNet(norm_partial("batchnorm", ghost_batch=2, momentum=0.5)).train()
    x = torch.randn(16, 1, 28, 28)  # 8 virtual devices x 2 images
    for name in ("norm5", "norm6"):
        norm = net.features.get_submodule(name)
        with torch.no_grad():  # a non-trivial affine, so the check sees it applied
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    seen = norm_inputs(net, x)
    outputs = {}
    hooks = [
        net.features.get_submodule(n).register_forward_hook(
            lambda _m, _a, out, n=n: outputs.__setitem__(n, out.detach())
        )
        for n in ("norm5", "norm6")
    ]
    for name in ("norm5", "norm6"):
        net.features.get_submodule(name).reset_running_stats()
    net(x)
    for hook in hooks:
        hook.remove()
    for name in ("norm5", "norm6"):
        norm, h = net.features.get_submodule(name), seen[name].double()
        # independently: each device's 2 images, per channel, all 2 x 7 x 7 positions
        values = h.reshape(8, 2, 64, 49).permute(0, 2, 1, 3).reshape(8, 64, 98)
        mean, var = values.mean(-1), values.var(-1, unbiased=False)
        assert values.shape[-1] == 2 * 7 * 7 == 98
        w, b = norm.weight.double()[:, None, None], norm.bias.double()[:, None, None]
        z = (values - mean[..., None]) / (var[..., None] + 1e-5).sqrt()  # (8, 64, 98)
        z = z.reshape(8, 64, 2, 49).permute(0, 2, 1, 3).reshape(16, 64, 7, 7)
        torch.testing.assert_close(outputs[name].double(), z * w + b, atol=1e-4, rtol=1e-4)
        # the running statistics from a fresh start: momentum 0.5 towards the devices' mean
        # statistics, the variance Bessel-corrected over 98 values
        torch.testing.assert_close(norm.running_mean.double(), 0.5 * mean.mean(0), atol=1e-5,
                                   rtol=1e-5)  # fmt: skip
        torch.testing.assert_close(
            norm.running_var.double(), 0.5 + 0.5 * (var * 98 / 97).mean(0), atol=1e-5, rtol=1e-5
        )
        # not the whole batch's statistics (8 x 2 x 7 x 7 values a channel)
        all_mean, all_var = h.mean((0, 2, 3), keepdim=True), h.var((0, 2, 3), False, True)
        whole = (h - all_mean) / (all_var + 1e-5).sqrt()
        assert not torch.allclose(outputs[name].double(), whole * w + b, atol=1e-3)


def test_state_dict_keys_are_stable():
    keys = list(AllConvNet(BN).state_dict())
    stats = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    expect = [
        *(k for i in range(1, 7) for k in
          [f"features.conv{i}.weight", *(f"features.norm{i}.{s}" for s in stats)]),
        "fc.weight",
        "fc.bias",
    ]  # fmt: skip
    assert keys == expect
    plain = list(AllConvNet(norm_partial("none")).state_dict())
    assert plain == [
        *(k for i in range(1, 7) for k in (f"features.conv{i}.weight", f"features.conv{i}.bias")),
        "fc.weight",
        "fc.bias",
    ]


def test_convs_have_kaiming_fan_out_init():
    torch.manual_seed(0)
    conv = AllConvNet(BN, channels=[64, 64, 64]).features.conv2  # 64 x 64 x 3 x 3
    expect = (2.0 / (64 * 9)) ** 0.5  # Kaiming normal, fan_out = out channels x 3 x 3, relu
    assert conv.weight.std().item() == pytest.approx(expect, rel=0.05)


@pytest.mark.parametrize(
    "norm,kind",
    [
        (norm_partial("batchnorm", ghost_batch=2), BatchNorm),
        (norm_partial("groupnorm", num_groups=4), GroupNorm),
        (norm_partial("layernorm"), None),
        (norm_partial("none"), NoNorm),
    ],
)
def test_a_train_step_runs(norm, kind):
    torch.manual_seed(0)
    net = AllConvNet(norm, channels=[8, 8, 16]).train()
    if kind is not None:
        assert all(isinstance(net.features.get_submodule(n), kind) for n in NORMS)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    before = [p.detach().clone() for p in net.parameters()]
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))


@pytest.mark.parametrize("channels", [(16, 32), (16, 32, 64, 128), (16, 0, 64), (16, 32.0, 64),
                                      "16,32,64", None])  # fmt: skip
def test_bad_channels(channels):
    with pytest.raises(ValueError, match=r"^channels=.*: need exactly 3 positive integers"):
        AllConvNet(BN, channels=channels)


def test_bad_num_classes_and_groups():
    with pytest.raises(ValueError, match=r"^num_classes=0: need a positive integer$"):
        AllConvNet(BN, num_classes=0)
    with pytest.raises(ConfigError, match=r"^features\.norm3 \(12 features\): "):
        AllConvNet(norm_partial("groupnorm", num_groups=8), channels=[16, 12, 64])


def test_config_builds_it_and_checks_the_data(compose, tmp_path):
    from hydra.utils import instantiate

    cfg = compose(["model=allconv", "norm=groupnorm", "norm.num_groups=4"], tmp_path)
    net = instantiate(cfg.model.net)
    assert isinstance(net, AllConvNet) and isinstance(net.features.norm6, GroupNorm)
    assert list(cfg.model.net.channels) == [16, 32, 64]
    bad = compose(["model=allconv", "data=shakespeare"], tmp_path / "bad")
    with pytest.raises(ConfigError, match=r"^model=allconv does not train on data=shakespeare"):
        check_combination(bad)
