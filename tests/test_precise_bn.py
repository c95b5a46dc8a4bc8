"""Precise BN statistics (Wu & Johnson 2021, Sec. 3): recompute_bn_stats, the PreciseBN callback.

The expected statistics are computed here from the layers' inputs, written out: each batch's
per-channel mean and Bessel-corrected variance, averaged over batches with equal weight.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY
from hydra.utils import instantiate
from test_train import metrics_rows, run_cli
from torch import nn

from normlab.norms import BatchNorm, BatchRenorm, NormConfigError, create_norm
from normlab.norms.precise_bn import bn_layers, recompute_bn_stats

C1, C2 = 4, 3


def batch_stats(h: torch.Tensor, channel: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and unbiased variance of h over every other dim, in float64."""
    h = h.double().movedim(channel, -1).reshape(-1, h.shape[channel])
    return h.mean(0), h.var(0, correction=1)


class Net(nn.Module):
    """conv -> ghost BN (slices of 2) -> relu -> conv -> torch BN -> pool -> linear -> BRN."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, C1, 3)
        self.bn1 = BatchNorm(C1, ghost_batch=2)
        self.conv2 = nn.Conv2d(C1, C2, 3)
        self.bn2 = nn.BatchNorm2d(C2)
        self.fc = nn.Linear(C2, 5)
        self.brn = BatchRenorm(5, warmup_steps=0, relax_steps=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return self.brn(self.fc(F.relu(h).mean((2, 3))))


def _net() -> Net:
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():  # trained-looking affine parameters and stale running statistics
        for m in bn_layers(net).values():
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_()
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
            m.num_batches_tracked.fill_(7)
        net.brn.renorm_steps.fill_(7)
    return net


def _batches(n: int, size: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(size, 2, 7, 7, generator=g) * 2 + 1, torch.zeros(size)) for _ in range(n)]


def _expected(net: Net, batches) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each BN layer's input per batch, computed here with training-mode normalization (ghost
    slices of 2 for bn1), and the average of its per-batch statistics."""
    per_layer: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {
        "bn1": [],
        "bn2": [],
        "brn": [],
    }
    with torch.no_grad():
        for x, _ in batches:
            h1 = net.conv1(x)
            slices = h1.unflatten(0, (-1, 2))  # ghost batches of 2 samples
            mean = slices.mean((1, 3, 4), keepdim=True)
            var = slices.var((1, 3, 4), correction=0, keepdim=True)
            view = (1, 1, C1, 1, 1)
            a1 = (slices - mean) / torch.sqrt(var + net.bn1.eps)
            a1 = (a1 * net.bn1.weight.view(view) + net.bn1.bias.view(view)).flatten(0, 1)
            h2 = net.conv2(F.relu(a1))
            a2 = F.batch_norm(h2, None, None, net.bn2.weight, net.bn2.bias, training=True)
            h3 = net.fc(F.relu(a2).mean((2, 3)))
            for name, h in (("bn1", h1), ("bn2", h2), ("brn", h3)):
                per_layer[name].append(batch_stats(h))
    return {
        name: (torch.stack([m for m, _ in s]).mean(0), torch.stack([v for _, v in s]).mean(0))
        for name, s in per_layer.items()
    }


def test_recompute_sets_the_average_of_per_batch_statistics():
    net = _net()
    batches = _batches(5)
    expected = _expected(net, batches[:4])
    result = recompute_bn_stats(net, batches, num_batches=4)
    assert result.batches == 4 and result.layers == ["bn1", "bn2", "brn"]
    for name, (mean, var) in expected.items():
        layer = getattr(net, name)
        torch.testing.assert_close(layer.running_mean, mean.float(), msg=name)
        torch.testing.assert_close(layer.running_var, var.float(), msg=name)


def test_weights_counters_and_modes_are_left_as_they_were():
    net = _net()
    net.eval()
    net.bn2.train()  # a mixed state, restored module by module
    modes = {name: m.training for name, m in net.named_modules()}
    before = copy.deepcopy(net.state_dict())
    recompute_bn_stats(net, _batches(3), num_batches=3)
    assert {name: m.training for name, m in net.named_modules()} == modes
    changed = {k for k, v in net.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {
        f"{n}.{s}" for n in ("bn1", "bn2", "brn") for s in ("running_mean", "running_var")
    }
    assert int(net.bn1.num_batches_tracked) == 7 and int(net.brn.renorm_steps) == 7


def test_a_failing_forward_leaves_the_model_as_it_was():
    net = _net().eval()
    before = copy.deepcopy(net.state_dict())
    calls = []

    def forward(batch):
        calls.append(1)
        net(batch[0])
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        recompute_bn_stats(net, _batches(2), num_batches=2, forward=forward)
    assert calls == [1] and not net.training and not net.bn1.training
    for key, value in net.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not net.bn1._forward_pre_hooks  # the hooks are gone


def test_batch_renorm_forwards_see_the_trained_statistics():
    """BatchRenorm's training output depends on its running statistics (r, d): every batch's
    forward sees the trained ones (a layer after it gets the BRN output of the trained state, for
    every batch), and its schedule does not advance."""
    model = nn.Sequential(_net(), nn.Linear(5, 2), nn.BatchNorm1d(2))
    batches = _batches(3)
    expected = []
    for x, _ in batches:
        trained = copy.deepcopy(model).train()  # the trained state, for each batch
        with torch.no_grad():
            expected.append(trained[1](trained[0](x)))
    seen = []
    model[2].register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    recompute_bn_stats(model, batches, num_batches=3)
    assert len(seen) == 3
    for out, exp in zip(seen, expected, strict=True):
        torch.testing.assert_close(out, exp)
    mean, var = zip(*(batch_stats(e) for e in expected), strict=True)
    torch.testing.assert_close(model[2].running_mean, torch.stack(mean).mean(0).float())
    torch.testing.assert_close(model[2].running_var, torch.stack(var).mean(0).float())
    assert int(model[0].brn.renorm_steps) == 7


def test_a_token_layer_averages_over_all_but_the_feature_dim():
    """A normlab BN with channel_dim=-1 on (B, T, D): statistics per feature over (B, T)."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(3, 4), create_norm("batchnorm", 4, channel_dim=-1))
    batches = [torch.randn(2, 5, 3) + i for i in range(3)]  # plain tensors: model(batch)
    with torch.no_grad():
        stats = [batch_stats(model[0](x), channel=-1) for x in batches]
    recompute_bn_stats(model, batches, num_batches=10)  # asks for more than there are
    torch.testing.assert_close(
        model[1].running_mean, torch.stack([m for m, _ in stats]).mean(0).float()
    )
    torch.testing.assert_close(
        model[1].running_var, torch.stack([v for _, v in stats]).mean(0).float()
    )


def test_momentum_polluted_statistics_get_closer_to_the_population():
    """A layer before BN drifts during 'training'; BN's momentum average lags behind it. After
    the recompute the statistics are those of the final weights: close to the population's
    (all 4096 samples through the final weights), the momentum ones far from it."""
    torch.manual_seed(3)
    data = torch.randn(4096, 8) * torch.linspace(0.5, 2.0, 8) + torch.linspace(-1, 1, 8)
    model = nn.Sequential(nn.Linear(8, 6), BatchNorm(6, momentum=0.1))
    loader = list(data.split(64))
    model.train()
    with torch.no_grad():
        for x in loader[:40]:  # the weights drift while the average runs
            model[0].weight.mul_(1.03)
            model[0].bias.add_(0.05)
            model(x)
    features = model[0](data).detach().double()
    pop_mean, pop_var = features.mean(0), features.var(0)

    def error(layer):
        return max(
            ((layer.running_mean.double() - pop_mean).abs() / pop_var.sqrt()).max().item(),
            ((layer.running_var.double() / pop_var).log().abs()).max().item(),
        )

    before = error(model[1])
    recompute_bn_stats(model, loader, num_batches=32)
    after = error(model[1])
    assert before > 0.3 and after < 0.05, (before, after)


def test_edge_cases():
    no_bn = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))

    def never():
        raise AssertionError("a model without BN layers reads no batch")
        yield

    assert recompute_bn_stats(no_bn, never(), 10) == (0, [])
    net = _net()
    with pytest.raises(NormConfigError, match="num_batches must be a positive integer, got 0"):
        recompute_bn_stats(net, _batches(1), 0)
    with pytest.raises(NormConfigError, match="no batches"):
        recompute_bn_stats(net, [], 5)
    no_stats = nn.Sequential(create_norm("batchnorm", 3, track_running_stats=False))
    assert bn_layers(no_stats) == {}


def _rank_batches(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    return [torch.randn(4, 3, generator=g) * (1 + rank) + rank for _ in range(2)]


def _ddp_worker(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        model = nn.Sequential(BatchNorm(3))
        recompute_bn_stats(model, _rank_batches(rank), num_batches=2)
        torch.save(model.state_dict(), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_statistics_are_averaged_over_processes(tmp_path):
    """2 gloo processes, 2 batches each: both end with the average over all 4 batches."""
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    stats = [batch_stats(x) for rank in (0, 1) for x in _rank_batches(rank)]
    mean, var = (torch.stack(s).mean(0).float() for s in zip(*stats, strict=True))
    for rank in (0, 1):
        state = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(state["0.running_mean"], mean)
        torch.testing.assert_close(state["0.running_var"], var)


# ---------------------------------------------------------------- the callback in a training run

PRECISE = ["callbacks.precise_bn.enabled=true", "callbacks.precise_bn.num_batches=3"]


def test_callback_recomputes_before_validation_and_test_in_a_train_py_run(compose, tmp_path):
    """LeNet + BN through train.py with the callback on: it prints and logs each recompute, the
    best checkpoint holds the precise statistics of its weights (3 training batches of epoch 0,
    seed 42), and training is as without the callback (same weights, other statistics)."""
    overrides = ["norm=batchnorm", "batch=16", *TINY]
    proc = run_cli(*overrides, *PRECISE, f"hydra.run.dir={tmp_path / 'on'}")
    printed = re.findall(r"precise BN: recomputed .*", proc.stdout + proc.stderr)
    assert [line.split("(before ")[1] for line in printed] == [
        "validation, step 2)",
        "test, step 2)",
    ]
    assert all("of 4 BN layers over 3 training batches" in line for line in printed)
    rows = [r for r in metrics_rows(tmp_path / "on") if r["precise_bn/batches"]]
    assert [(r["precise_bn/batches"], bool(r["val/acc"]), bool(r["test/acc"])) for r in rows] == [
        ("3.0", True, False),
        ("3.0", False, True),
    ]

    cfg = compose(overrides, tmp_path / "cfg")  # the default: the callback does nothing
    assert cfg.callbacks.precise_bn.enabled is False
    # the same way as the run with it (a train.py process, the same threads): a conv bias before
    # BN has a gradient of rounding noise only, which AdamW scales up, so an in-process run with
    # other threads would train that bias elsewhere
    run_cli(*overrides, f"hydra.run.dir={tmp_path / 'off'}")
    on = torch.load(tmp_path / "on" / "checkpoints" / "best.ckpt", weights_only=False)
    off = torch.load(tmp_path / "off" / "checkpoints" / "best.ckpt", weights_only=False)
    stats = [k for k in on["state_dict"] if k.endswith(("running_mean", "running_var"))]
    assert len(stats) == 8
    for key, value in on["state_dict"].items():
        if key not in stats:
            torch.testing.assert_close(value, off["state_dict"][key], msg=key)
        else:
            assert not torch.allclose(value, off["state_dict"][key]), key

    task = instantiate(cfg.model)
    task.load_state_dict(off["state_dict"])  # the same weights as the run with the callback
    data = instantiate(cfg.data)
    data.setup("fit")
    torch.manual_seed(42)  # the loader's shuffle seed is torch.initial_seed(): the run's seed
    recompute_bn_stats(task, data.train_dataloader(), num_batches=3)
    for key in stats:
        torch.testing.assert_close(task.state_dict()[key], on["state_dict"][key], msg=key)
