"""Norms of your own (examples/my_norm.py): registered in a user's module, listed in `plugins`,
built by every model like a built-in; the failures a user meets name the layer or the module."""

from __future__ import annotations

import functools
import importlib
import sys

import pytest
import torch
from conftest import REPO, TINY
from hydra.utils import instantiate
from test_train import metrics_rows, run_cli
from timm.layers import RmsNorm
from torch import nn

from normlab import config
from normlab.errors import ConfigError, user_error
from normlab.models.dit import DiT, DiTBlock, build_dit
from normlab.models.lenet import LeNet
from normlab.models.lstm import LSTMLM
from normlab.models.mlp import MLP
from normlab.models.transformer import GPT
from normlab.norms import NormConfigError, norm_partial, norm_traits, register_norm, registry
from normlab.run import train

SPATIAL_PLUGIN = '''
from torch import nn

from normlab.norms import register_norm


@register_norm("spatialonly")
class SpatialOnly(nn.Module):
    """Normalizes over each channel's positions: needs (N, C, *spatial)."""

    spatial = True

    def __init__(self, num_features: int, channel_dim: int = 1) -> None:
        super().__init__()

    def forward(self, x):
        return x - x.mean(tuple(range(2, x.dim())), keepdim=True)
'''


@pytest.fixture
def my_norm(scratch_registry, monkeypatch):
    """examples/my_norm.py imported afresh (so it registers in this test's registry)."""
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.delitem(sys.modules, "examples.my_norm", raising=False)
    module = importlib.import_module("examples.my_norm")
    yield module
    sys.modules.pop("examples.my_norm", None)


def backward(out: torch.Tensor, model: nn.Module) -> None:
    """One backward pass; every parameter that took part gets a finite gradient."""
    out.square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_the_example_is_the_formula_and_declares_its_traits(my_norm):
    cls = my_norm.MeanOnlyLayerNorm
    traits = norm_traits("mean_only_layernorm")  # the alias
    assert traits.tokenwise and not traits.spatial and not traits.syncable
    assert traits.affine_key == "elementwise_affine" and traits.channel_dims == (1, -1)
    torch.manual_seed(0)
    norm = registry.create_norm("meanonly", 6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    norm = norm.double()
    expected = (x - x.mean(-1, keepdim=True)) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    conv = registry.create_norm("meanonly", 4, channel_dim=1, elementwise_affine=False)
    assert type(conv) is cls and conv.weight is None
    y = conv(torch.randn(2, 4, 5, 5) + 3.0)
    torch.testing.assert_close(y.mean((1, 2, 3)), torch.zeros(2), atol=1e-6, rtol=0)


def test_lenet_and_mlp_build_it_in_every_layer(my_norm):
    torch.manual_seed(0)
    net = LeNet(my_norm.MeanOnlyLayerNorm)
    layers = [net.features.norm1, net.features.norm2, net.classifier.norm3, net.classifier.norm4]
    assert all(type(m) is my_norm.MeanOnlyLayerNorm for m in layers)
    assert [m.channel_dim for m in layers] == [1, 1, 1, 1]  # the built-ins' layout in LeNet
    backward(net(torch.randn(4, 1, 28, 28)), net)
    mlp = MLP(my_norm.MeanOnlyLayerNorm, hidden=[8, 8])
    assert type(mlp.layers.norm2) is my_norm.MeanOnlyLayerNorm
    backward(mlp(torch.randn(4, 1, 28, 28)), mlp)


@pytest.mark.parametrize("placement", ["pre", "post", "deepnorm"])
def test_the_gpt_builds_it_in_every_placement(my_norm, placement):
    torch.manual_seed(0)
    gpt = GPT(
        65, {"name": placement}, my_norm.MeanOnlyLayerNorm, depth=2, d_model=16, n_heads=2, ctx=8
    )
    norms = [m for m in gpt.modules() if type(m) is my_norm.MeanOnlyLayerNorm]
    assert len(norms) == 4 + (placement == "pre")  # two per block, and pre's final norm
    assert all(m.channel_dim == -1 for m in norms)
    backward(gpt(torch.randint(0, 65, (2, 8))), gpt)


@pytest.mark.parametrize("conditioning", ["adaln_zero", "cross_attn"])
def test_the_dit_builds_it_and_adaln_switches_its_gain_off(my_norm, conditioning):
    torch.manual_seed(0)
    dit = build_dit(
        my_norm.MeanOnlyLayerNorm, conditioning=conditioning, hidden_size=16, depth=2, num_heads=2
    )
    norms = [m for m in dit.modules() if type(m) is my_norm.MeanOnlyLayerNorm]
    if conditioning == "adaln_zero":  # through its affine_key: the regression replaces it
        assert isinstance(dit.blocks[0], DiTBlock)
        assert norms and all(m.weight is None for m in norms)
    else:
        assert norms and all(m.weight is not None for m in norms)
    x, t, y = torch.randn(2, 1, 28, 28), torch.tensor([3, 500]), torch.tensor([1, 7])
    backward(dit(x, t, y), dit)


def test_the_lstm_builds_it(my_norm):
    torch.manual_seed(0)
    lstm = LSTMLM(65, my_norm.MeanOnlyLayerNorm, hidden_size=8, ctx=6)
    assert type(lstm.layers[0].norm_c) is my_norm.MeanOnlyLayerNorm
    backward(lstm(torch.randint(0, 65, (2, 6))), lstm)


def test_a_plain_module_fits_lenets_fc_layers_but_not_its_conv_layers(scratch_registry):
    register_norm("torch_rms")(nn.RMSNorm)  # features last, no channel_dim: (N, C) fits
    net = LeNet(norm_partial("batchnorm"), fc_norm=norm_partial("torch_rms"))
    norm3 = net.classifier.norm3
    assert type(norm3) is nn.RMSNorm and norm3.normalized_shape == (120,)
    backward(net(torch.randn(4, 1, 28, 28)), net)
    with pytest.raises(ConfigError, match=r"^features\.norm1 \(6 features\): torchrms takes its"):
        LeNet(norm_partial("torch_rms"))
    with pytest.raises(NormConfigError, match="norm=torchrms cannot sit in placement=pre"):
        GPT(65, {"name": "pre"}, norm_partial("torch_rms"), depth=1, d_model=8, n_heads=2, ctx=4)


def test_a_spatial_only_norm_fails_in_an_fc_layer_before_training(
    scratch_registry, compose, monkeypatch, tmp_path
):
    (tmp_path / "spatial_plugin.py").write_text(SPATIAL_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "spatial_plugin", importlib.import_module("spatial_plugin"))
    overrides = ["plugins=[spatial_plugin]", "norm=custom",
                 "norm._target_=${normlab.norm:spatialonly}", *TINY]  # fmt: skip
    # LeNet: the conv layers get it, the fc layers none (as instancenorm); explicit: refused
    net = LeNet(norm_partial("spatialonly"))
    assert type(net.classifier.norm3).__name__ == "NoNorm"
    with pytest.raises(ConfigError, match=r"^classifier\.norm3 \(120 features\): norm=spat"):
        LeNet(norm_partial("batchnorm"), fc_norm=norm_partial("spatialonly"))
    # the MLP through the real config: nothing trained, the layer named
    cfg = compose([*overrides, "model=mlp"], tmp_path / "run")
    with pytest.raises(Exception) as info:
        train(cfg)
    message = str(user_error(info.value))
    assert message.startswith("layers.norm1 (100 features): norm=spatialonly needs spatial")
    assert not list(tmp_path.rglob("metrics.csv"))


def test_a_missing_class_or_plugin_fails_with_one_line(compose, tmp_path):
    with pytest.raises(ConfigError, match=r"^norm\._target_ is missing: norm=custom takes norm\."):
        config.validate(compose(["norm=custom"], tmp_path))
    proc = run_cli("plugins=[no_such_plugin]", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "error: plugins: cannot import 'no_such_plugin': ModuleNotFoundError: No module named "
        "'no_such_plugin' (module names are looked up on sys.path: train.py's dir and PYTHONPATH)"
    ]


def test_train_py_runs_the_example_through_plugins(tmp_path):
    run_cli(
        "plugins=[examples.my_norm]",
        "norm=custom",
        "norm._target_=${normlab.norm:meanonly}",  # the registered name's class
        "+norm.elementwise_affine=false",
        "batch=8",
        *TINY,
        f"hydra.run.dir={tmp_path}",
    )
    rows = metrics_rows(tmp_path)
    assert any(r.get("train/loss_step") for r in rows)
    # the norm_stats callback hooked it (its `normalizes` trait) in every layer
    logged = [r for r in rows if r.get("norm/net.features.norm1/out_std")]
    assert logged and all(float(r["norm/net.classifier.norm4/out_std"]) > 0 for r in logged)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_a_class_path_is_a_norm_without_registering_it(compose, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.delitem(sys.modules, "examples.my_norm", raising=False)
    path = "examples.my_norm.MeanOnlyLayerNorm"
    overrides = ["norm=custom", f"norm._target_={path}", "+norm.elementwise_affine=false"]
    cfg = compose([*overrides, "arm=${normlab.norm_name:norm}"], tmp_path)
    config.validate(cfg)
    assert cfg.arm == "meanonly"  # imported, it registered itself: the name it goes by
    net = instantiate(cfg.model.net)
    assert type(net.classifier.norm4).__qualname__ == "MeanOnlyLayerNorm"
    assert net.classifier.norm4.weight is None and net.classifier.norm4.channel_dim == 1
    with pytest.raises(Exception) as info:  # Hydra's InstantiationException: the one line
        instantiate(compose([*overrides, "+norm.eps=1e-5"], tmp_path).model.net)
    assert (  # checked where a model builds it, as every norm config's keywords
        str(user_error(info.value))
        == "features.norm1 (6 features): meanonly: unknown argument(s) eps; valid: "
        "elementwise_affine"
    )


# ----- a callable width -> nn.Module as the norm spec, registered nowhere -----------------------


def test_a_callable_is_a_norm_spec_of_every_model():
    torch.manual_seed(0)
    group_norm = functools.partial(nn.GroupNorm, 2)  # channels at dim 1: LeNet's layout
    net = LeNet(group_norm)
    layers = [net.features.norm1, net.features.norm2, net.classifier.norm3, net.classifier.norm4]
    assert [(type(m), m.num_channels) for m in layers] == [
        (nn.GroupNorm, w) for w in (6, 16, 120, 84)
    ]
    backward(net(torch.randn(4, 1, 28, 28)), net)
    gpt = GPT(65, {"name": "pre"}, RmsNorm, depth=2, d_model=16, n_heads=2, ctx=8)
    assert sum(type(m) is RmsNorm for m in gpt.modules()) == 5  # two a block, the final norm
    backward(gpt(torch.randint(0, 65, (2, 8))), gpt)
    lstm = LSTMLM(65, lambda d: RmsNorm(d, eps=1e-5), hidden_size=8, ctx=6)
    assert type(lstm.layers[0].norm_c) is RmsNorm and lstm.layers[0].norm_c.eps == 1e-5
    backward(lstm(torch.randint(0, 65, (2, 6))), lstm)
    dit = DiT(RmsNorm, conditioning="adaln_zero", hidden_size=16, depth=2, num_heads=2)
    assert isinstance(dit.blocks[0], DiTBlock)
    assert type(dit.blocks[0].norm1) is RmsNorm  # the DiT calls its norm_layer with the width
    x, t, y = torch.randn(2, 1, 28, 28), torch.tensor([3, 500]), torch.tensor([1, 7])
    backward(dit(x, t, y), dit)


def test_a_callable_spec_is_checked_by_the_traits_it_declares_and_must_give_a_module():
    class PerBatch(nn.BatchNorm1d):  # declares that it does not act on each token alone
        tokenwise = False

    with pytest.raises(NormConfigError, match="norm=.*PerBatch cannot sit in placement=pre"):
        GPT(65, {"name": "pre"}, PerBatch, depth=1, d_model=8, n_heads=2, ctx=4)
    with pytest.raises(
        ConfigError, match=r"^features\.norm1 \(6 features\): norm .*<lambda>\(6\) gave 3$"
    ):
        LeNet(lambda width: 3)
