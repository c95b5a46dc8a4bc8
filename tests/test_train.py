"""LeNet on Fashion-MNIST through the real config: every norm, errors, run dirs, norm stats."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY

from normlab.errors import user_error
from normlab.norms import available_norms
from normlab.run import train


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    (path,) = run_dir.rglob("metrics.csv")
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("norm", sorted(set(available_norms())))
def test_every_norm_trains_lenet(norm, compose, tmp_path):
    cfg = compose([f"norm={norm}", "batch=8", *TINY], tmp_path)
    result, _ = train(cfg)
    assert result["status"] == "ok"
    assert torch.isfinite(torch.tensor(result["metrics"]["test/acc"]))
    rows = metrics_rows(tmp_path)
    assert any(r.get("train/loss_step") for r in rows)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_norm_stats_logs_preactivation_percentiles(compose, tmp_path):
    cfg = compose(["norm=batchnorm", "batch=16", *TINY], tmp_path)
    train(cfg)
    rows = [r for r in metrics_rows(tmp_path) if r.get("preact/net.classifier.norm4/p15")]
    assert len(rows) == 2  # every step of the two
    for r in rows:
        p15, p50, p85 = (float(r[f"preact/net.classifier.norm4/p{q}"]) for q in (15, 50, 85))
        assert p15 <= p50 <= p85
        # BN's output at init: unit variance per channel, so the input std of BN is not 1
        assert abs(float(r["norm/net.classifier.norm4/out_std"]) - 1.0) < 0.2


def test_instancenorm_leaves_fc_layers_without_norm_but_explicit_fc_norm_fails(compose, tmp_path):
    from hydra.utils import instantiate

    cfg = compose(["norm=instancenorm"], tmp_path)
    net = instantiate(cfg.model.net)
    assert type(net.classifier.norm3).__name__ == "NoNorm"
    assert type(net.features.norm1).__name__ == "InstanceNorm"
    cfg = compose(["norm=instancenorm", "model.net.fc_norm=${norm}"], tmp_path)
    with pytest.raises(Exception) as info:  # Hydra's instantiate wraps the model's ConfigError
        train(cfg)
    assert str(user_error(info.value)).startswith(
        "classifier.norm3 (120 features): norm=instancenorm needs spatial extent"
    )


def test_groupnorm_with_batch_2_trains_from_the_command_line(tmp_path):
    run_cli("norm=groupnorm", "batch=2", *TINY, f"hydra.run.dir={tmp_path}")
    assert metrics_rows(tmp_path)
    assert (tmp_path / ".hydra" / "config.yaml").is_file()


def test_batchnorm_with_batch_1_fails_before_training(tmp_path):
    proc = run_cli("norm=batchnorm", "batch=1", *TINY, f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode != 0
    assert (
        "net.classifier.norm3" in proc.stderr
        and "batch=1" in proc.stderr
        and "(1, 120)" in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("metrics.csv"))


def test_unknown_choice_lists_the_valid_ones(tmp_path):
    proc = run_cli("norm=nope", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode != 0
    assert "groupnorm" in proc.stderr and "rmsnorm" in proc.stderr


def test_cfg_job_prints_the_composed_config():
    proc = run_cli("--cfg", "job", "norm=groupnorm")
    assert (
        "_target_: normlab.norms.GroupNorm" in proc.stdout
        and "_target_: normlab.models.lenet.LeNet" in proc.stdout
    )


GPT_SHAPE = {"depth": 4, "d_model": 64, "n_heads": 4, "ctx": 64, "dropout": 0.0}
DIT_SHAPE = {"hidden_size": 96, "depth": 4, "num_heads": 4, "patch_size": 4}


@pytest.mark.parametrize(
    "args,shape",
    [
        (["model=transformer"], GPT_SHAPE),
        (["experiment=dit"], DIT_SHAPE),
        (["model=transformer", "size=transformer/small", "model.net.depth=2"],
         {"depth": 2, "d_model": 256, "n_heads": 8, "ctx": 256, "dropout": 0.1}),
        (["experiment=dit_conditioning_deep", "size=dit/S/2"],
         {"hidden_size": 384, "depth": 8, "num_heads": 6, "patch_size": 2}),
    ],
)  # fmt: skip
def test_cfg_job_shows_the_model_shape_as_numbers(args, shape):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(run_cli("--cfg", "job", *args).stdout)
    net = cfg.model.net
    assert "size" not in net and {k: net[k] for k in shape} == shape  # no null left to fill in
    if "ctx" in shape:
        assert OmegaConf.to_container(cfg.data)["ctx"] == "${model.net.ctx}"
        assert cfg.data.ctx == shape["ctx"]


def test_compose_gives_the_data_the_models_ctx(compose, tmp_path):
    from hydra.utils import instantiate

    from normlab.config import validate

    for args, ctx in ((["model=transformer", "model.net.ctx=16"], 16), (["model=lstm"], 64)):
        cfg = compose(args, tmp_path)
        validate(cfg)
        assert cfg.data.ctx == ctx and instantiate(cfg.data).ctx == ctx
    cfg = compose([], tmp_path)  # LeNet on Fashion-MNIST: no ctx anywhere
    validate(cfg)
    assert "ctx" not in cfg.data and "ctx" not in cfg.model.net


def test_compose_builds_the_scheduler_like_the_optimizer(compose, tmp_path):
    from functools import partial

    from hydra.utils import instantiate

    cfg = compose(["model=transformer", "optim.schedule=cosine"], tmp_path)  # adamw: warmup 100
    scheduler = instantiate(cfg.optim.scheduler)
    assert isinstance(scheduler, partial) and isinstance(instantiate(cfg.optim.optimizer), partial)
    assert scheduler.keywords == {"schedule": "cosine", "warmup_steps": 100, "min_lr_ratio": 0.1}
    task = instantiate(cfg.model)
    optimizer, lr = task.optimizer_and_scheduler(lambda: 300)
    seen = []
    for _ in range(301):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        lr.step()
    assert seen[0] == pytest.approx(1e-5) and seen[99] == seen[100] == pytest.approx(1e-3)
    assert seen[200] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5)) and seen[300] == pytest.approx(1e-4)


def test_multirun_over_norms_writes_a_summary(tmp_path):
    norms = "batchnorm,groupnorm,layernorm,instancenorm,rmsnorm,none"
    run_cli("-m", f"norm={norms}", "batch=32", *TINY, f"hydra.sweep.dir={tmp_path}")
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["overrides"].split()[0] for r in rows) == sorted(
        f"norm={n}" for n in norms.split(",")
    )
    assert all(r["status"] == "ok" and float(r["test/acc"]) >= 0 for r in rows)
    assert len({r["run_dir"] for r in rows}) == len(rows)
    assert "| norm=groupnorm" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize(
    "max_steps, max_epochs, epoch, ready, step, last",
    [
        (30, 10, 0, 30, 29, True),  # the step that reaches max_steps, inside an epoch
        (30, 10, 0, 29, 28, False),
        (-1, 2, 1, 5, 9, True),  # the last batch (5 per epoch) of the last epoch
        (-1, 2, 0, 5, 4, False),  # the last batch of an earlier epoch
        (-1, -1, 7, 5, 39, False),  # no end in sight
    ],
)
def test_last_step_is_the_step_that_ends_the_run(max_steps, max_epochs, epoch, ready, step, last):
    from types import SimpleNamespace

    from normlab.tasks.base import last_step

    progress = SimpleNamespace(current=SimpleNamespace(ready=ready))
    trainer = SimpleNamespace(
        max_steps=max_steps, max_epochs=max_epochs, current_epoch=epoch, global_step=step,
        num_training_batches=5 if max_steps < 0 else 100,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
    )  # fmt: skip
    assert last_step(trainer) is last


def test_the_exponential_schedule_decays_to_its_floor_by_the_end(compose, tmp_path):
    """optim.schedule=exponential (the BN paper's kind of decay): lr x min_lr_ratio^(progress),
    the floor reached at the run's end, so the converged gate reads it as a floored schedule;
    a floor outside (0, 1) is refused before training."""
    from normlab.analysis import gates
    from normlab.config import ConfigError, validate
    from normlab.tasks.base import lr_lambda

    factor = lr_lambda("exponential", 0, lambda: 100, 0.01)
    assert [factor(s) for s in (0, 50, 100)] == pytest.approx([1.0, 0.1, 0.01])
    warm = lr_lambda("exponential", 10, lambda: 110, 0.01)
    assert warm(4) == pytest.approx(0.5) and warm(60) == pytest.approx(0.1)
    rows = gates.schedule_rows("a", 0, {"schedule": "exponential", "min_lr_ratio": 0.01}, 2700)
    assert rows[0][4] == pytest.approx(0.01 ** (2699 / 2700)) and rows[1][4] == 1.0
    with pytest.raises(ValueError, match="lie in \\(0, 1\\)"):
        lr_lambda("exponential", 0, lambda: 100, 0.0)
    cfg = compose(["optim=sgd", "optim.schedule=exponential", "optim.min_lr_ratio=0"], tmp_path)
    with pytest.raises(ConfigError, match="optim.min_lr_ratio, which must lie in"):
        validate(cfg)
