"""Norm statistics hook every layer that normalizes, each once, and nothing else."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import TINY
from hydra.utils import instantiate
from test_train import metrics_rows

from normlab.callbacks.norm_stats import NormStats, default_layers
from normlab.norms import DyT, Norm
from normlab.run import train


class Recorder:
    """A stand-in tracker that keeps what it is given."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.metrics.update(metrics)


def logged(task: torch.nn.Module, callback: NormStats | None = None) -> dict[str, float]:
    """The metrics NormStats (default: of its default layers) logs after one forward pass."""
    callback = callback or NormStats(every_n_steps=1)
    recorder = Recorder()
    callback.on_fit_start(SimpleNamespace(), task)
    callback.on_train_batch_start(SimpleNamespace(global_step=0), task, None, 0)
    with torch.no_grad():
        task(*task.example_input(2))
    trainer = SimpleNamespace(global_step=1, loggers=[recorder])
    callback.on_train_batch_end(trainer, task, None, None, 0)
    assert len(callback._modules) == len({k.split("/")[1] for k in recorder.metrics})
    return recorder.metrics


def hooked_layers(task: torch.nn.Module, callback: NormStats | None = None) -> set[str]:
    """The layers NormStats (default: its default layers) reports after one forward pass."""
    return {key.split("/")[1] for key in logged(task, callback)}


def test_dit_hooks_each_norm_once_and_no_placeholder(compose, tmp_path):
    task = instantiate(compose(["experiment=dit"], tmp_path).model)
    layers = hooked_layers(task)
    norms = {f"net.{n}" for n, m in task.net.named_modules() if isinstance(m, Norm)}
    assert layers == norms  # not timm's Identity attn.norm/mlp.norm
    assert len(layers) == 9  # 4 blocks x (norm1, norm2) + the final layer's norm_final
    assert not any(name.startswith("ema.") for name in layers)  # the trained net, not its EMA


def test_a_dit_over_dyt_is_hooked_at_each_dyt_with_its_alpha(compose, tmp_path):
    # adaLN over DyT: the DyT is the norm (its affine off), c's regression is the block's
    task = instantiate(compose(["experiment=dit", "norm=dyt", "norm.alpha0=0.75"], tmp_path).model)
    metrics = logged(task)
    layers = {key.split("/")[1] for key in metrics}
    assert len(layers) == 9 and all(isinstance(task.get_submodule(n), DyT) for n in layers)
    assert all(metrics[f"norm/{n}/alpha"] == 0.75 for n in layers)


def test_gpt_hooks_every_block_norm_and_the_final_norm(compose, tmp_path):
    task = instantiate(compose(["model=transformer"], tmp_path).model)
    layers = hooked_layers(task)
    assert layers == {f"net.{n}" for n, m in task.net.named_modules() if isinstance(m, Norm)}
    assert len(layers) == 9 and "net.final_norm" in layers  # 4 blocks x (attn, mlp) + final


def test_lenet_hooks_its_four_norms(compose, tmp_path):
    task = instantiate(compose([], tmp_path).model)
    assert hooked_layers(task) == {
        "net.features.norm1", "net.features.norm2", "net.classifier.norm3", "net.classifier.norm4"
    }  # fmt: skip


@pytest.mark.parametrize(
    "model", [["model=lenet"], ["model=transformer"], ["model=lstm"], ["experiment=dit"]]
)
def test_norm_none_hooks_nothing(model, compose, tmp_path):
    task = instantiate(compose([*model, "norm=none"], tmp_path).model)
    assert hooked_layers(task) == set()


def test_named_layers_are_hooked_even_without_a_norm(compose, tmp_path):
    # bn_lenet's no-BN arm: the sigmoid's input is the output of the `none` placeholder
    cfg = compose(["experiment=bn_lenet", "norm=none"], tmp_path)
    callback = instantiate(cfg.callbacks.norm_stats)
    assert hooked_layers(instantiate(cfg.model), callback) == {"net.classifier.norm4"}


def test_a_norm_none_run_logs_no_norm_stats(compose, tmp_path):
    train(compose(["norm=none", "batch=16", *TINY], tmp_path))
    columns = set(metrics_rows(tmp_path)[0])
    assert "train/loss_step" in columns
    assert not any(c.startswith(("norm/", "preact/")) for c in columns)


@pytest.mark.parametrize("model", [["model=transformer"], ["experiment=dit"]])
def test_each_dyt_layer_logs_its_own_alpha(model, compose, tmp_path):
    task = instantiate(compose([*model, "norm=dyt"], tmp_path).model)
    layers = default_layers(task)
    assert len(layers) == 9  # 4 blocks x 2 + the final norm
    expected = {}
    for i, layer in enumerate(layers):
        dyt = task.get_submodule(layer)
        assert isinstance(dyt, DyT)
        with torch.no_grad():
            dyt.alpha.fill_(0.25 + i / 8)  # a different alpha in each layer
        expected[f"norm/{layer}/alpha"] = 0.25 + i / 8
    metrics = logged(task)
    assert {k: v for k, v in metrics.items() if k.endswith("/alpha")} == expected
    assert {f"norm/{layer}/out_std" for layer in layers} <= set(metrics)  # and the usual stats


def test_layers_without_dyt_log_no_alpha(compose, tmp_path):
    task = instantiate(compose(["model=transformer"], tmp_path).model)  # layernorm
    metrics = logged(task)
    assert len(metrics) == 9 * 7 and not any(k.endswith("/alpha") for k in metrics)


def test_a_dyt_run_logs_alpha_at_each_step(compose, tmp_path):
    overrides = ["model=transformer", "norm=dyt", "batch=8", *TINY]
    train(compose(overrides, tmp_path))
    rows = [r for r in metrics_rows(tmp_path) if r.get("norm/net.final_norm/alpha")]
    assert [r["step"] for r in rows] == ["0", "1"]  # every step of the two
    layers = {c.split("/")[1] for c in rows[0] if c.startswith("norm/") and c.endswith("/alpha")}
    assert len(layers) == 9
    assert float(rows[0]["norm/net.final_norm/alpha"]) == 0.5  # the forward of step 0: alpha0
