"""The BN paper's MLP, LeNet's conv widths, and NormStats' per-unit percentiles (all_units)."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY
from torch import nn

from normlab.callbacks.norm_stats import NormStats
from normlab.errors import ConfigError
from normlab.models.lenet import LeNet
from normlab.models.mlp import MLP
from normlab.norms import BatchNorm, NoNorm, norm_partial
from normlab.run import train

BN = norm_partial("batchnorm")
MLP_NAMES = [
    *(f"{kind}{i}" for i in (1, 2, 3) for kind in ("fc", "norm", "act")),
    "out",
]


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    (path,) = run_dir.rglob("metrics.csv")
    with open(path) as f:
        return list(csv.DictReader(f))


# ----- MLP ----------------------------------------------------------------------------------


def test_mlp_forward_shape_and_module_names():
    net = MLP(BN)
    x = torch.randn(5, *MLP.input_shape)
    assert net(x).shape == (5, 10)
    assert net.penultimate(x).shape == (5, 100)
    assert [name for name, _ in net.layers.named_children()] == MLP_NAMES
    # sigmoid by default: the penultimate features are the last act's output
    assert isinstance(net.layers.act3, nn.Sigmoid)
    assert torch.equal(net.penultimate(x), net.layers[:-1](x.flatten(1)))
    assert isinstance(MLP(BN, activation="relu").layers.act1, nn.ReLU)


def test_mlp_norms_come_from_the_registry():
    net = MLP(BN)
    for i in (1, 2, 3):
        norm = net.layers.get_submodule(f"norm{i}")
        assert isinstance(norm, BatchNorm)
        assert norm.num_features == 100
        assert isinstance(net.layers.get_submodule(f"fc{i}"), nn.Linear)
    assert net.layers.out.out_features == 10
    net = MLP(norm_partial("none"))
    assert all(isinstance(net.layers.get_submodule(f"norm{i}"), NoNorm) for i in (1, 2, 3))
    x = torch.randn(4, 784)
    assert torch.equal(net.layers.norm1(x), x)


def test_mlp_hidden_widths():
    net = MLP(BN, hidden=[32, 16], num_classes=3)
    assert [name for name, _ in net.layers.named_children()][-1] == "out"
    assert net.layers.fc2.in_features == 32 and net.layers.norm2.num_features == 16
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 3)
    with pytest.raises(ValueError, match=r"^hidden=\[\]: need a non-empty list"):
        MLP(BN, hidden=[])


def test_mlp_instancenorm_fails_naming_the_layer():
    with pytest.raises(ConfigError, match=r"layers\.norm1 .*no spatial extent"):
        MLP(norm_partial("instancenorm"))
    with pytest.raises(ConfigError, match=r"layers\.norm1"):
        MLP(norm_partial("in"))  # an alias too


def test_mlp_unknown_activation():
    with pytest.raises(ValueError, match=r"^activation='tanh': choose one of"):
        MLP(BN, activation="tanh")


# ----- LeNet conv widths --------------------------------------------------------------------


def test_lenet_channels_set_the_conv_widths():
    net = LeNet(BN, channels=(16, 32))
    assert net.features.conv1.weight.shape == (16, 1, 5, 5)
    assert net.features.conv2.weight.shape == (32, 16, 5, 5)
    assert net.classifier.fc1.in_features == 32 * 4 * 4
    assert net.features.norm1.num_features == 16 and net.features.norm2.num_features == 32
    x = torch.randn(3, 1, 28, 28)
    assert net.features(x).shape == (3, 32, 4, 4)
    assert net(x).shape == (3, 10)


def test_lenet_default_channels_unchanged():
    net = LeNet(BN)
    assert net.features.conv1.out_channels == 6 and net.features.conv2.out_channels == 16
    assert net.classifier.fc1.in_features == 256
    # the same parameters as before the option existed: LeNet-5 on 28x28, 4 affine norms
    layers = (1 * 6 * 25 + 6) + (6 * 16 * 25 + 16) + (256 * 120 + 120) + (120 * 84 + 84) + 850
    assert sum(p.numel() for p in net.parameters()) == layers + 2 * (6 + 16 + 120 + 84)


def test_lenet_groupnorm_4_groups_needs_wider_convs():
    gn = norm_partial("groupnorm", num_groups=4)
    net = LeNet(gn, channels=[16, 32])
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ConfigError, match=r"features\.norm1"):
        LeNet(gn)  # 6 channels: 4 groups do not divide them


@pytest.mark.parametrize("channels", [(16,), (6, 16, 32), (6, 0), (6, -1), (6.0, 16), "6,16"])
def test_lenet_bad_channels(channels):
    with pytest.raises(ValueError, match=r"^channels=.*: need exactly 2 positive integers"):
        LeNet(BN, channels=channels)


# ----- training through the real config ------------------------------------------------------


def test_mlp_trains_through_the_config(compose, tmp_path):
    cfg = compose(["model=mlp", "batch=16", *TINY], tmp_path)
    result, _ = train(cfg)
    assert result["status"] == "ok"
    assert torch.isfinite(torch.tensor(result["metrics"]["test/acc"]))
    rows = metrics_rows(tmp_path)
    assert sum(1 for r in rows if r.get("train/loss_step")) == 2
    assert any(r.get("train/loss_epoch") for r in rows)
    # the default norm_stats layers: the MLP's three norms
    assert any(r.get("norm/net.layers.norm3/out_std") for r in rows)


def test_mlp_config_composes_the_papers_network(compose, tmp_path):
    from hydra.utils import instantiate

    cfg = compose(["model=mlp"], tmp_path)
    assert cfg.model.net._target_ == "normlab.models.mlp.MLP"
    net = instantiate(cfg.model.net)
    assert isinstance(net, MLP) and isinstance(net.layers.norm2, BatchNorm)
    assert [m.out_features for m in net.layers if isinstance(m, nn.Linear)] == [100, 100, 100, 10]
    assert isinstance(net.layers.act1, nn.Sigmoid)


# ----- NormStats all_units -------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))


def run_hooks(callback: NormStats, model: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """One training step's worth of the callback's hooks around model(x); the logged metrics."""
    recorder = Recorder()
    trainer = SimpleNamespace(global_step=0, loggers=[recorder])
    callback.on_fit_start(trainer, model)
    callback.on_train_batch_start(trainer, model, None, 0)
    model(x)
    trainer.global_step = 1  # the optimizer step is taken inside the batch
    callback.on_train_batch_end(trainer, model, None, None, 0)
    ((step, metrics),) = recorder.logged
    assert step == 0
    return metrics


def test_all_units_percentiles_of_a_known_tensor():
    model = nn.Sequential()
    model.add_module("norm", nn.Identity())
    # unit k of (101, 3, 2): the values k*1000 + 0..201 in a scrambled order over (N, L)
    base = torch.arange(202.0)[torch.randperm(202, generator=torch.Generator().manual_seed(0))]
    x = torch.stack([base + 1000 * k for k in range(3)]).reshape(3, 101, 2).transpose(0, 1)
    metrics = run_hooks(NormStats(every_n_steps=1, layers=["norm"], all_units=True), model, x)
    for k in range(3):
        for q, key in ((0.15, "p15"), (0.50, "p50"), (0.85, "p85")):
            value = metrics[f"preact/norm/u{k:03d}/{key}"]
            assert value == pytest.approx(1000 * k + q * 201)  # linear interpolation, by hand
            expected = torch.quantile(x[:, k].flatten(), q).item()  # torch, independently
            assert value == pytest.approx(expected, rel=1e-6)
    assert "preact/norm/u003/p50" not in metrics
    assert metrics["preact/norm/p50"] == metrics["preact/norm/u000/p50"]


def test_all_units_on_a_conv_layer_and_off_by_default():
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("norm", nn.Identity())
    x = torch.randn(4, 5, 3, 3) * torch.arange(1.0, 6.0).view(1, 5, 1, 1)
    metrics = run_hooks(NormStats(every_n_steps=1, layers=["norm"], all_units=True), model, x)
    per_unit = x.transpose(0, 1).reshape(5, -1)
    for k in range(5):
        want = torch.quantile(per_unit[k], torch.tensor([0.15, 0.5, 0.85]))
        got = [metrics[f"preact/norm/u{k:03d}/p{p}"] for p in (15, 50, 85)]
        assert got == pytest.approx(want.tolist(), rel=1e-6)
    metrics = run_hooks(NormStats(every_n_steps=1, layers=["norm"]), model, x)
    assert not any("/u0" in key for key in metrics)
    assert "preact/norm/p50" in metrics


def test_all_units_in_a_training_run(compose, tmp_path):
    layer = "net.layers.norm3"
    cfg = compose(
        [
            "model=mlp",
            "batch=16",
            *TINY,
            "callbacks.norm_stats.all_units=true",
            f"callbacks.norm_stats.layers=[{layer}]",
        ],
        tmp_path,
    )
    train(cfg)
    rows = [r for r in metrics_rows(tmp_path) if r.get(f"preact/{layer}/u000/p50")]
    assert len(rows) == 2  # every step of the two
    columns = {c for c in rows[0] if c.startswith(f"preact/{layer}/u")}
    assert columns == {f"preact/{layer}/u{k:03d}/p{q}" for k in range(100) for q in (15, 50, 85)}
    for r in rows:
        assert all(r[c] != "" for c in columns)
        for q in (15, 50, 85):  # unit 0 is also the callback's `unit`: the same numbers
            assert float(r[f"preact/{layer}/u000/p{q}"]) == float(r[f"preact/{layer}/p{q}"])
        for k in range(100):
            p15, p50, p85 = (float(r[f"preact/{layer}/u{k:03d}/p{q}"]) for q in (15, 50, 85))
            assert p15 <= p50 <= p85
