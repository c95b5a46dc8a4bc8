"""Timing callbacks: StepTime (one time/step_ms per step, at that step) and PairedStepTime (the
run's model against a twin with the baseline norm, the pairs rmsnorm_speed reads)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, open_dict

from normlab.callbacks.timing import PairedStepTime, StepTime


class Recorder(Logger):
    """A tracker that keeps what it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass


def test_step_time_logs_each_step_at_its_index():
    recorder = Recorder()
    trainer = SimpleNamespace(global_step=0, loggers=[recorder])
    timer = StepTime(every_n_steps=1)
    for step in range(3):
        timer.on_train_batch_start(trainer, None, None, step)
        time.sleep(0.01)
        trainer.global_step = step + 1  # the optimizer step is taken inside the batch
        timer.on_train_batch_end(trainer, None, None, None, step)
    assert [s for s, _ in recorder.rows] == [0, 1, 2]
    assert all(m["time/step_ms"] >= 10 for _, m in recorder.rows)


def test_step_time_every_n_and_bad_values():
    recorder = Recorder()
    trainer = SimpleNamespace(global_step=0, loggers=[recorder])
    timer = StepTime(every_n_steps=2)
    for step in range(4):
        timer.on_train_batch_start(trainer, None, None, step)
        trainer.global_step = step + 1
        timer.on_train_batch_end(trainer, None, None, None, step)
    assert [s for s, _ in recorder.rows] == [0, 2]
    with pytest.raises(ValueError, match="every_n_steps"):
        StepTime(every_n_steps=0)


# ----- PairedStepTime: the run's model against a LayerNorm twin, step by step --------------------

TINY_LM = [
    "model=transformer",
    "seed=3",
    "batch=4",
    "model.net.d_model=16",
    "model.net.n_heads=2",
    "model.net.depth=1",
    "model.net.ctx=16",
]
LAYERNORM = {"_target_": "normlab.norms.LayerNorm", "_partial_": True, "eps": 1e-5}


def _with_timer(compose, run_dir: Path, norm: str = "rmsnorm") -> DictConfig:
    """A tiny LM config with callbacks.paired_step_time as an experiment sets it up: the run's
    model config by interpolation, LayerNorm as the baseline's norm."""
    cfg = compose([*TINY_LM, f"norm={norm}"], run_dir)
    with open_dict(cfg):
        cfg.callbacks.paired_step_time = {
            "_target_": "normlab.callbacks.timing.PairedStepTime",
            "_recursive_": False,
            "model": "${model}",
            "baseline_norm": LAYERNORM,
            "norm_key": "net.norm_layer",
            "seed": "${seed}",
            "warmup": 3,
        }
    return cfg


def _fresh_model(compose, run_dir: Path, overrides: list[str]) -> pl.LightningModule:
    """The model normlab.run.train builds for a config: seeded, after the data module."""
    cfg = compose(overrides, run_dir)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    instantiate(cfg.data)
    return instantiate(cfg.model)


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_paired_twins_start_as_fresh_models_of_their_configs(compose, tmp_path):
    timer = instantiate(_with_timer(compose, tmp_path).callbacks.paired_step_time)
    assert timer.config("baseline").net.norm_layer._target_ == "normlab.norms.LayerNorm"
    assert timer.config("model").net.norm_layer._target_ == "normlab.norms.RMSNorm"
    rng = torch.get_rng_state()
    run_model = SimpleNamespace(device=torch.device("cpu"))
    timer.on_train_start(SimpleNamespace(estimated_stepping_batches=8), run_model)
    assert torch.equal(torch.get_rng_state(), rng)  # the run's RNG is left as it was
    for side, norm, layer in (
        ("model", "rmsnorm", "RMSNorm"),
        ("baseline", "layernorm", "LayerNorm"),
    ):
        fresh = _fresh_model(compose, tmp_path, [*TINY_LM, f"norm={norm}"])
        twin = timer.twins[side].task
        assert type(twin.net.final_norm).__name__ == layer
        ours, theirs = _weights(twin), _weights(fresh)
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_paired_step_time_logs_each_pair_and_both_twins_train(compose, tmp_path):
    cfg = _with_timer(compose, tmp_path)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    data, task = instantiate(cfg.data), instantiate(cfg.model)
    timer = instantiate(cfg.callbacks.paired_step_time)
    recorder = Recorder()
    trainer = pl.Trainer(max_steps=8, limit_val_batches=0, logger=[recorder], callbacks=[timer],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)  # fmt: skip
    before = {side: None for side in ("model", "baseline")}

    class Snapshot(pl.Callback):  # the twins' weights once built, before any step
        def on_train_start(self, trainer, pl_module) -> None:
            for side in before:
                before[side] = _weights(timer.twins[side].task)

    trainer.callbacks.append(Snapshot())
    trainer.fit(task, datamodule=data)
    pairs = [(s, m) for s, m in recorder.rows if "time/model_step_ms" in m]
    assert [s for s, _ in pairs] == [3, 4, 5, 6, 7]  # 3 warmup pairs left out
    assert all(m["time/model_step_ms"] > 0 and m["time/baseline_step_ms"] > 0 for _, m in pairs)
    assert {m["time/baseline_first"] for _, m in pairs} == {0.0, 1.0}  # a random order per pair
    # the model twin took the run's steps on the run's batches: it ends where the run's model does
    ours, run = _weights(timer.twins["model"].task), _weights(task)
    assert all(torch.allclose(ours[k], run[k], atol=1e-6) for k in run)
    for side in ("model", "baseline"):  # and both really trained
        after = _weights(timer.twins[side].task)
        assert any(not torch.equal(after[k], before[side][k]) for k in after)
    assert timer.twins["baseline"].scheduler.last_epoch == 8  # one lr step per training step


def test_paired_step_time_checks_its_arguments(compose, tmp_path):
    model = compose(TINY_LM, tmp_path).model
    with pytest.raises(ValueError, match="warmup must be >= 0, got -1"):
        PairedStepTime(model, LAYERNORM, warmup=-1)
    with pytest.raises(ValueError, match="norm_key='net.nope': not in the model"):
        PairedStepTime(model, LAYERNORM, norm_key="net.nope")


NONE = {"_target_": "normlab.norms.NoNorm", "_partial_": True}


def test_identity_twin_and_the_norms_calls_replayed_alone(compose, tmp_path):
    cfg = _with_timer(compose, tmp_path)
    with open_dict(cfg):
        cfg.callbacks.paired_step_time.identity_norm = NONE
        cfg.callbacks.paired_step_time.ops = True
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    data, task = instantiate(cfg.data), instantiate(cfg.model)
    timer = instantiate(cfg.callbacks.paired_step_time)
    assert timer.sides == ("model", "baseline", "identity")
    recorder = Recorder()
    trainer = pl.Trainer(max_steps=6, limit_val_batches=0, logger=[recorder], callbacks=[timer],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)  # fmt: skip
    start = {}

    class Snapshot(pl.Callback):  # the twins' weights once built, before any step
        def on_train_start(self, trainer, pl_module) -> None:
            start.update({side: _weights(timer.twins[side].task) for side in timer.sides})

    trainer.callbacks.append(Snapshot())
    trainer.fit(task, datamodule=data)
    # the three twins start from the same weights but the norm's own (none has no parameters)
    model, baseline, identity = start["model"], start["baseline"], start["identity"]
    assert type(timer.twins["identity"].task.net.final_norm).__name__ == "NoNorm"
    assert set(identity) < set(model) and set(model) - set(identity) == {
        k for k in model if "norm" in k
    }
    assert all(torch.equal(identity[k], model[k]) and torch.equal(model[k], baseline[k])
               for k in identity)  # fmt: skip
    # the norm calls recorded: each norm module of the GPT once per forward, at (B, T, d_model)
    ops = timer.ops["model"]
    n_norms = sum(type(m).__name__ == "RMSNorm" for m in timer.twins["model"].task.modules())
    assert len(ops.calls) == len(ops.modules) == n_norms == 3  # 2 per block, 1 final
    assert set(ops.inputs) == {(4, 16, 16)}
    assert all(type(m).__name__ == "LayerNorm" for m in timer.ops["baseline"].modules)
    pairs = [m for _, m in recorder.rows if "time/model_step_ms" in m]
    assert len(pairs) == 3  # 6 steps, 3 warmup
    keys = ("model_step", "baseline_step", "identity_step", "model_op", "baseline_op")
    assert all(m[f"time/{k}_ms"] > 0 for m in pairs for k in keys)
    with pytest.raises(ValueError, match="op_rounds must be >= 1, got 0"):
        PairedStepTime(compose(TINY_LM, tmp_path).model, LAYERNORM, op_rounds=0)
