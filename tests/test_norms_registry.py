"""The registry (names, aliases, keyword checks, configs) and every NormConfigError case."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.norms import (
    BatchNorm,
    GroupNorm,
    InstanceNorm,
    LayerNorm,
    NoNorm,
    NormConfigError,
    PRMSNorm,
    RMSNorm,
    available_norms,
    create_norm,
    needs_spatial,
    norm_from_config,
)


def test_available_norms_sorted():
    expected = [
        "batchnorm",
        "batchrenorm",
        "dyt",
        "groupnorm",
        "instancenorm",
        "layernorm",
        "none",
        "prmsnorm",
        "rmsnorm",
    ]
    assert available_norms() == expected


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("batchnorm", BatchNorm),
        ("BatchNorm", BatchNorm),
        ("batch_norm", BatchNorm),
        ("bn", BatchNorm),
        ("group-norm", GroupNorm),
        ("GN", GroupNorm),
        ("instance_norm", InstanceNorm),
        ("in", InstanceNorm),
        ("LayerNorm", LayerNorm),
        ("ln", LayerNorm),
        ("RMS_Norm", RMSNorm),
        ("rms", RMSNorm),
        ("pRMSNorm", PRMSNorm),
        ("identity", NoNorm),
        ("None", NoNorm),
    ],
)
def test_names_are_normalised(name, cls):
    kwargs = {"num_groups": 2} if cls is GroupNorm else {}
    assert type(create_norm(name, 4, **kwargs)) is cls


def test_unknown_name_lists_valid_names():
    with pytest.raises(NormConfigError, match="unknown norm 'weightnorm'.*batchnorm, .*dyt, gr"):
        create_norm("weightnorm", 4)


def test_none_is_identity():
    x = torch.randn(2, 3)
    norm = create_norm("none", 3)
    assert norm(x) is x
    assert list(norm.state_dict()) == []


def test_needs_spatial():
    assert needs_spatial("instancenorm") and needs_spatial("Instance_Norm")
    assert not any(needs_spatial(n) for n in available_norms() if n != "instancenorm")
    with pytest.raises(NormConfigError, match="unknown norm"):
        needs_spatial("foo")


def test_norm_from_config_passes_every_key_including_none():
    cfg = {"name": "batchnorm", "momentum": None, "eps": 1e-3, "affine": False}
    bn = norm_from_config(cfg, 5)
    assert isinstance(bn, BatchNorm) and bn.momentum is None and bn.eps == 1e-3
    assert bn.weight is None
    rms = norm_from_config({"name": "rmsnorm", "eps": None}, 8)
    assert rms.eps is None
    with pytest.raises(NormConfigError, match="'name'"):
        norm_from_config({"eps": 1e-5}, 8)


def test_norm_from_config_reads_omegaconf():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"name": "layernorm", "normalized_shape": [3, 4], "eps": 1e-5})
    ln = norm_from_config(cfg, 4)
    assert ln.normalized_shape == (3, 4)


def test_every_norm_takes_impl_and_sync_false():
    for name in available_norms():
        kwargs = {"num_groups": 1} if name == "groupnorm" else {}
        for impl in ("fast", "reference"):
            assert isinstance(create_norm(name, 4, impl=impl, sync=False, **kwargs), nn.Module)


# ---------------------------------------------------------------- construction errors


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("batchnorm", {"momentun": 0.1}, r"unknown argument\(s\) momentun; valid: eps, momentum"),
        ("layernorm", {"num_groups": 2}, r"unknown argument\(s\) num_groups; valid: .*bias"),
        ("none", {"eps": 1e-5}, r"unknown argument\(s\) eps"),
        (
            "layernorm",
            {"impl": "manual"},
            r"impl must be one of \['fast', 'reference'\], got 'manual'",
        ),
        ("rmsnorm", {"impl": "cuda"}, r"got 'cuda'"),
        ("groupnorm", {"num_groups": 2, "sync": True}, "sync=True is only supported by batchnorm"),
        ("instancenorm", {"sync": True}, "sync=True is only supported by batchnorm"),
        ("groupnorm", {"num_groups": 4}, "num_groups=4 does not divide num_channels=6"),
        ("groupnorm", {"num_groups": 0}, "num_groups must be a positive integer, got 0"),
        ("prmsnorm", {"p": 0.0}, r"p must be in \(0, 1\], got 0.0"),
        ("prmsnorm", {"p": 1.5}, r"p must be in \(0, 1\], got 1.5"),
        ("batchnorm", {"momentum": 1.5}, r"momentum must be in \[0, 1\] or None, got 1.5"),
        ("instancenorm", {"momentum": "0.1"}, r"momentum must be in \[0, 1\] or None, got 0.1"),
        ("batchnorm", {"eps": -1.0}, "eps must be a finite number > 0, got -1.0"),
        ("layernorm", {"eps": "1e-5"}, "eps must be a finite number > 0, got '1e-5'"),
        ("layernorm", {"normalized_shape": ()}, "normalized_shape must be"),
        (
            "rmsnorm",
            {"normalized_shape": (3, 0)},
            "normalized_shape must be a positive integer, got 0",
        ),
    ],
)
def test_bad_arguments_raise(name, kwargs, message):
    with pytest.raises(NormConfigError, match=message):
        create_norm(name, 6, **kwargs)


@pytest.mark.parametrize("num_features", [0, -3, 2.5])
def test_bad_num_features_raise(num_features):
    with pytest.raises(
        NormConfigError, match=f"num_features must be a positive integer, got {num_features}"
    ):
        create_norm("batchnorm", num_features)


def test_norm_config_error_is_value_error():
    assert issubclass(NormConfigError, ValueError)


# ---------------------------------------------------------------- impossible inputs


@pytest.mark.parametrize("impl", ["fast", "reference", "manual"])
def test_batchnorm_one_value_per_channel(impl):
    bn = create_norm("batchnorm", 6, impl=impl)
    with pytest.raises(
        NormConfigError,
        match=r"batchnorm in training needs more than 1 value per channel, "
        r"got input of shape \(1, 6\)",
    ):
        bn(torch.randn(1, 6))
    with pytest.raises(NormConfigError, match=r"shape \(1, 6, 1, 1\)"):
        bn(torch.randn(1, 6, 1, 1))
    bn(torch.randn(1, 6, 2))  # two positions of one sample are two values
    bn.eval()
    assert bn(torch.randn(1, 6)).shape == (1, 6)  # eval uses running statistics
    no_stats = create_norm("batchnorm", 6, impl=impl, track_running_stats=False).eval()
    with pytest.raises(NormConfigError, match="without running statistics"):
        no_stats(torch.randn(1, 6))


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_instancenorm_needs_spatial_extent(impl):
    inorm = create_norm("instancenorm", 6, impl=impl)
    with pytest.raises(
        NormConfigError, match=r"at least 3 dims \(N, C, \.\.\.\), got input of shape \(4, 6\)"
    ):
        inorm(torch.randn(4, 6))
    with pytest.raises(
        NormConfigError, match=r"more than 1 value per channel of each sample.*\(4, 6, 1\)"
    ):
        inorm(torch.randn(4, 6, 1))


@pytest.mark.parametrize(
    ("name", "kwargs", "shape", "message"),
    [
        ("batchnorm", {}, (4, 5), r"built for 6 channels \(dim 1\), got input of shape \(4, 5\)"),
        ("batchnorm", {}, (6,), r"at least 2 dims"),
        ("groupnorm", {"num_groups": 2}, (4, 4, 3), r"built for 6 channels"),
        ("instancenorm", {}, (4, 5, 3), r"built for 6 channels"),
        ("layernorm", {}, (4, 5), r"built for trailing dims \(6,\), got input of shape \(4, 5\)"),
        ("rmsnorm", {"normalized_shape": (2, 3)}, (4, 3, 2), r"trailing dims \(2, 3\)"),
        ("prmsnorm", {}, (4, 7), r"trailing dims \(6,\)"),
    ],
)
def test_wrong_input_shape_raises(name, kwargs, shape, message):
    for impl in ("fast", "reference"):
        with pytest.raises(NormConfigError, match=message):
            create_norm(name, 6, impl=impl, **kwargs)(torch.randn(shape))
