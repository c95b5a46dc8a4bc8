"""Presets named as the ecosystem names them: trainer=cpu|gpu|ddp|ddp_cpu (lightning-hydra-
template's ddp is GPU with synchronized BN, its CPU twin ddp_sim), precision=bf16-mixed, and
debug=default (one epoch, anomaly detection, no trackers)."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from conftest import TINY
from omegaconf import OmegaConf

from normlab.norms import Norm
from normlab.run import train


def _trainer(cfg) -> dict:
    return OmegaConf.to_container(cfg.trainer, resolve=True)


@pytest.mark.parametrize(
    ("preset", "accelerator", "backend", "sync"),
    [
        ("cpu", "cpu", None, False),
        ("gpu", "gpu", None, False),
        ("ddp", "gpu", "nccl", True),
        ("ddp_cpu", "cpu", "gloo", False),
    ],
)
def test_trainer_presets(preset, accelerator, backend, sync, compose, tmp_path):
    cfg = compose([f"trainer={preset}"], tmp_path)
    trainer = _trainer(cfg)
    assert trainer["accelerator"] == accelerator
    assert (trainer.get("strategy") or {}).get("process_group_backend") == backend
    assert trainer["sync_batchnorm"] is sync and cfg.norm.sync is sync  # norm=batchnorm's sync


def test_norm_sync_set_by_hand_wins_over_the_preset(compose, tmp_path):
    assert compose(["trainer=ddp_cpu", "norm.sync=true"], tmp_path).norm.sync is True
    assert compose(["trainer=ddp", "norm.sync=false"], tmp_path).norm.sync is False


def test_ddp_with_a_norm_that_cannot_sync_composes_without_sync(compose, tmp_path):
    cfg = compose(["trainer=ddp", "norm=layernorm"], tmp_path)
    assert "sync" not in cfg.norm and _trainer(cfg)["sync_batchnorm"] is True


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_precision_choice_sets_the_trainer_s_precision(precision, compose, tmp_path):
    default = compose([], tmp_path).trainer.precision
    assert default == "32-true"
    assert compose([f"precision={precision}"], tmp_path).trainer.precision == precision


def test_debug_default_is_one_epoch_with_anomaly_detection_and_no_trackers(compose, tmp_path):
    cfg = compose(["experiment=bn_lenet", "debug=default"], tmp_path)
    assert cfg.trainer.max_epochs == 1 and cfg.trainer.detect_anomaly is True
    assert list(cfg.logger) == ["csv"]
    asked = compose(["logger=many", "debug=default"], tmp_path)  # the command line still wins
    assert list(asked.logger) == ["csv", "tensorboard", "wandb", "mlflow"]
    assert cfg.paths.output_root == "outputs/debug"
    assert "detect_anomaly" not in compose([], tmp_path).trainer


class NormDtypes(pl.Callback):
    """Input dtypes each normlab norm saw in training, and its tensors' dtypes at the end."""

    def __init__(self):
        self.inputs: set[torch.dtype] = set()
        self.tensors: dict[str, torch.dtype] = {}

    def on_fit_start(self, trainer, pl_module):
        for module in pl_module.modules():
            if isinstance(module, Norm):
                module.register_forward_hook(lambda m, args, out: self.inputs.add(args[0].dtype))

    def on_fit_end(self, trainer, pl_module):
        for name, module in pl_module.named_modules():
            if isinstance(module, Norm):
                for key, t in module.state_dict().items():
                    self.tensors[f"{name}.{key}"] = t.dtype


@pytest.mark.parametrize("model", ["lenet", "transformer"])
def test_bf16_mixed_trains_on_cpu_with_finite_losses_and_float32_norms(model, compose, tmp_path):
    """A few steps in bf16 autocast on CPU: finite losses, normlab's norms fed bfloat16 (LeNet's
    BatchNorm after a conv) keep float32 parameters and running statistics."""
    shrink = ["batch=8", "data.train_batches_per_epoch=3"] if model == "transformer" else []
    probe = NormDtypes()
    cfg = compose([f"model={model}", "precision=bf16-mixed", *TINY, *shrink], tmp_path)
    result, objects = train(cfg, callbacks=[probe])
    assert result["status"] == "ok", result
    losses = [v for k, v in result["metrics"].items() if "loss" in k]
    assert losses and all(math.isfinite(v) for v in losses), result["metrics"]
    assert probe.tensors and set(probe.tensors.values()) <= {torch.float32, torch.int64}
    if model == "lenet":
        assert torch.bfloat16 in probe.inputs  # the norms did run under autocast
