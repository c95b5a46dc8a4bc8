"""The registry (names, aliases, registration, traits, keyword checks, layouts, configs) and every
NormConfigError case."""

from __future__ import annotations

import functools
import inspect

import pytest
import torch
from conftest import REPO
from hydra.utils import instantiate
from omegaconf import OmegaConf
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
    build_norm,
    create_norm,
    norm_class,
    norm_name,
    norm_partial,
    norm_traits,
    norms_with,
    register_norm,
)


def test_available_norms_sorted():
    expected = [
        "batchnorm",
        "batchrenorm",
        "dyt",
        "groupnorm",
        "instancenorm",
        "layernorm",
        "layernorm2d",
        "none",
        "prmsnorm",
        "rmsnorm",
        "rmsnorm2d",
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


BUILT_IN = ["batchnorm", "batchrenorm", "dyt", "groupnorm", "instancenorm", "layernorm", "none",
            "prmsnorm", "rmsnorm"]  # fmt: skip


def test_traits_are_read_from_the_family_classes():
    # the built-in families only: a test run may have registered norms of its own (plugins)
    def built_in(names: list[str]) -> list[str]:
        return [n for n in names if n in BUILT_IN]

    assert set(BUILT_IN) <= set(available_norms())
    assert built_in(norms_with("spatial")) == ["instancenorm"]
    assert norm_traits("Instance_Norm").spatial and norm_traits(InstanceNorm).spatial
    assert built_in(norms_with("tokenwise")) == ["dyt", "layernorm", "none", "prmsnorm", "rmsnorm"]
    assert built_in(norms_with("syncable")) == ["batchnorm"]
    affine = {n: norm_traits(n).affine_key for n in BUILT_IN}
    assert affine == {
        "batchnorm": "affine",
        "batchrenorm": "affine",
        "dyt": "elementwise_affine",
        "groupnorm": "affine",
        "instancenorm": "affine",
        "layernorm": "elementwise_affine",
        "none": None,
        "prmsnorm": "elementwise_affine",
        "rmsnorm": "elementwise_affine",
    }
    for name, key in affine.items():  # the key is a keyword of the family and switches it off
        if key is not None:
            kwargs = {"num_groups": 2} if name == "groupnorm" else {}
            assert key in inspect.signature(norm_class(name)).parameters
            norm = create_norm(name, 4, **kwargs, **{key: False})
            assert norm.weight is None and norm.bias is None
    assert all(norm_traits(n).channel_dims == (1, -1) for n in BUILT_IN)
    with pytest.raises(NormConfigError, match="unknown norm"):
        norm_traits("foo")


def test_a_plain_module_is_unknown_until_registered_then_gets_conservative_traits(
    scratch_registry,
):
    assert norm_traits(nn.RMSNorm) is None  # nothing declared: the models' checks pass it
    register_norm("torch_rms")(nn.RMSNorm)
    traits = norm_traits(functools.partial(nn.RMSNorm, eps=1e-3))  # read from the partial's class
    assert not (traits.tokenwise or traits.spatial or traits.syncable)
    assert traits.affine_key is None and traits.channel_dims == (-1,)

    class Declared(nn.Module):
        tokenwise, spatial, affine_key, natural_channel_dim = True, True, "affine", 1

    traits = norm_traits(Declared)
    assert traits.tokenwise and traits.spatial and traits.affine_key == "affine"
    assert traits.channel_dims == (1,)


def test_a_registered_plain_module_is_built_like_a_builtin(scratch_registry):
    assert register_norm("torch_rms", aliases=("trms",))(nn.RMSNorm) is nn.RMSNorm
    assert "torchrms" in available_norms()
    assert norm_class("TRMS") is nn.RMSNorm and norm_name(nn.RMSNorm) == "torchrms"
    norm = build_norm(norm_partial("torch-rms", eps=1e-3), 6)
    assert type(norm) is nn.RMSNorm and norm.normalized_shape == (6,) and norm.eps == 1e-3
    # an fc layer's (N, C): dims 1 and -1 are the same, so a features-last module fits
    assert type(create_norm("torch_rms", 6, channel_dim=(1, -1))) is nn.RMSNorm
    with pytest.raises(NormConfigError, match=r"torchrms takes its features at dim -1 .* dim 1"):
        create_norm("torch_rms", 6, channel_dim=1)
    with pytest.raises(NormConfigError, match=r"torchrms: unknown argument\(s\) momentum"):
        create_norm("torch_rms", 6, momentum=0.1)
    with pytest.raises(NormConfigError, match="torchrms: sync=False is only supported by bat"):
        create_norm("torch_rms", 6, sync=False)


def test_duplicate_names_raise_unless_replaced(scratch_registry):
    class Mine(nn.Module):
        def __init__(self, num_features: int) -> None:
            super().__init__()

    register_norm("mine")(Mine)
    other = type("Other", (nn.Module,), {})
    for name in ("layer_norm", "LN", "MINE"):  # a built-in's name, an alias, a user's name
        with pytest.raises(NormConfigError, match=r"is already registered to .*replace=True"):
            register_norm(name)(other)
    with pytest.raises(NormConfigError, match=r"'gn' is already registered to .*GroupNorm"):
        register_norm("fresh", aliases=("gn",))(other)
    assert "fresh" not in available_norms()
    assert register_norm("mine")(Mine) is Mine  # the same class again: a no-op
    register_norm("ln", replace=True)(Mine)
    assert type(create_norm("ln", 4)) is Mine
    assert type(create_norm("layernorm", 4)) is LayerNorm  # the name itself is untouched
    with pytest.raises(NormConfigError, match="needs an nn.Module class"):
        register_norm("thing")(object)


def test_every_norm_takes_impl_and_only_batchnorm_takes_sync():
    for name in available_norms():
        kwargs = {"num_groups": 1} if name == "groupnorm" else {}
        for impl in ("fast", "reference"):
            assert isinstance(create_norm(name, 4, impl=impl, **kwargs), nn.Module)
        assert ("sync" in inspect.signature(norm_class(name)).parameters) == (name == "batchnorm")
    assert create_norm("batchnorm", 4, sync=False).sync is False


# the families with a hand-written backward take impl="manual"; the others refuse it in one line
WITH_MANUAL = [
    "batchnorm", "dyt", "groupnorm", "instancenorm", "layernorm", "layernorm2d", "prmsnorm",
    "rmsnorm", "rmsnorm2d",
]  # fmt: skip


def test_manual_impl_where_a_hand_written_backward_exists():
    for name in available_norms():
        kwargs = {"num_groups": 1} if name == "groupnorm" else {}
        if name in WITH_MANUAL:
            assert create_norm(name, 4, impl="manual", **kwargs).impl == "manual"
            continue
        with pytest.raises(NormConfigError) as err:
            create_norm(name, 4, impl="manual", **kwargs)
        assert str(err.value) == (
            f"{name}: impl must be one of ['fast', 'reference'], got 'manual' "
            "(it has no hand-written backward)"
        )


@pytest.mark.parametrize("name", ["batchnorm", "groupnorm", "layernorm", "rmsnorm", "dyt", "none"])
def test_channel_dim_is_a_constructor_argument(name):
    kwargs = {"num_groups": 2} if name == "groupnorm" else {}
    natural = create_norm(name, 4, **kwargs)
    assert natural.channel_dim == natural.natural_channel_dim
    for channel_dim in (1, -1, (1, -1), (-1, 1)):
        first = channel_dim if isinstance(channel_dim, int) else channel_dim[0]
        assert create_norm(name, 4, channel_dim=channel_dim, **kwargs).channel_dim == first
    with pytest.raises(NormConfigError, match=r"channel_dim must be 1 or -1, got 2"):
        create_norm(name, 4, channel_dim=2, **kwargs)
    cls = type(natural)  # the constructor checks it too
    with pytest.raises(NormConfigError, match=r"channel_dim must be 1 or -1, got 0"):
        cls(4, channel_dim=0, **kwargs)
    with pytest.raises(NormConfigError, match="channel_dim=1 needs one feature dim"):
        create_norm("layernorm", 4, channel_dim=1, normalized_shape=(2, 2))


# ---------------------------------------------------------------- construction errors


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("batchnorm", {"momentun": 0.1}, r"unknown argument\(s\) momentun; valid: eps, momentum"),
        ("layernorm", {"num_groups": 2}, r"unknown argument\(s\) num_groups; valid: .*bias"),
        ("none", {"eps": 1e-5}, r"unknown argument\(s\) eps"),
        (
            "batchrenorm",
            {"impl": "manual"},
            r"impl must be one of \['fast', 'reference'\], got 'manual' \(it has no hand-written",
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


@pytest.mark.parametrize("impl", ["fast", "reference", "manual"])
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
    for impl in ("fast", "reference", "manual"):
        with pytest.raises(NormConfigError, match=message):
            create_norm(name, 6, impl=impl, **kwargs)(torch.randn(shape))


# ----- a norm config is a partial of its class ----------------------------------------------


@pytest.mark.parametrize("name", [p.stem for p in (REPO / "conf" / "norm").glob("*.yaml")])
def test_every_norm_config_is_a_partial_of_the_class_registered_under_its_name(name):
    if name == "custom":
        return  # a name or a class path of the user's: test_plugins
    layer = instantiate(OmegaConf.load(REPO / "conf" / "norm" / f"{name}.yaml"))
    assert isinstance(layer, functools.partial) and norm_class(layer) is norm_class(name)
    assert norm_name(layer) == name and norm_traits(layer) == norm_traits(name)
    kwargs = {"num_groups": 1} if name == "groupnorm" else {}  # 2 does not divide 3
    assert type(build_norm(functools.partial(layer, **kwargs), 4)) is norm_class(name)


def test_a_bad_keyword_of_a_partial_is_one_line_naming_the_valid_ones():
    layer = functools.partial(functools.partial(BatchNorm, eps=1e-3), groups=2)  # nested
    with pytest.raises(NormConfigError, match=r"^batchnorm: unknown argument\(s\) groups; val"):
        build_norm(layer, 4)
    with pytest.raises(NormConfigError, match=r"^layernorm: unknown argument\(s\) momentum; "):
        norm_partial("layernorm", momentum=0.1)
    with pytest.raises(NormConfigError, match=r"^a norm layer is a callable width -> nn.Module"):
        build_norm({"name": "batchnorm"}, 4)


def test_norm_partial_takes_a_registered_name_or_a_class_path():
    assert norm_partial("LN", eps=1e-3).func is LayerNorm
    layer = norm_partial("torch.nn.RMSNorm", eps=1e-3)  # registered nowhere: no traits
    assert norm_traits(layer) is None and build_norm(layer, 4).normalized_shape == (4,)
    with pytest.raises(NormConfigError, match=r"^norm 'no_such.Norm': cannot import it: No mod"):
        norm_partial("no_such.Norm")
    with pytest.raises(NormConfigError, match="unknown norm 'nope'"):
        norm_partial("nope")
