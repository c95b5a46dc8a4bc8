"""scripts/reproduce.py: listing, config composition of its experiments, quick renders, reuse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from normlab.analysis.reproductions import REPRODUCTIONS

REPO = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, str(REPO / "scripts" / "reproduce.py")]
# Rendered with --quick in CI's slow run; the others need models being written elsewhere.
CI_NAMES = ["bn_lenet", "gn_batch_size"]


def reproduce(*args: str, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SCRIPT, *args, "--root", str(root)],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_list_names_every_reproduction_with_both_budgets():
    out = subprocess.run([*SCRIPT, "--list"], capture_output=True, text=True, check=True).stdout
    for name in REPRODUCTIONS:
        assert f"{name}: " in out
    assert out.count("    full: ") == out.count("    quick: ") == len(REPRODUCTIONS)


def test_unknown_name_fails_with_the_valid_ones(tmp_path: Path):
    done = reproduce("bn_lenett", root=tmp_path)
    assert done.returncode != 0 and "bn_lenet" in done.stderr and "gn_batch_size" in done.stderr


@pytest.mark.parametrize("name", ["bn_lenet", "gn_batch_size", "rmsnorm_speed"])
def test_experiment_config_composes_with_its_sweep_grid(compose, tmp_path: Path, name: str):
    cfg = compose([f"experiment={name}"], tmp_path)
    from hydra.core.hydra_config import HydraConfig

    params = HydraConfig.get().sweeper.params
    assert params, f"experiment={name} has no hydra.sweeper.params"
    assert HydraConfig.get().mode.name == "MULTIRUN"  # `python train.py experiment=NAME` sweeps
    assert cfg.trainer.max_epochs >= 1


@pytest.mark.parametrize(("batch", "lr"), [(32, 0.1), (8, 0.025), (2, 0.00625)])
def test_gn_batch_size_scales_the_learning_rate_linearly(compose, tmp_path, batch, lr):
    cfg = compose(["experiment=gn_batch_size", f"batch={batch}"], tmp_path)
    assert cfg.optim.optimizer.lr == pytest.approx(lr)


def _rendered(root: Path, name: str) -> list[Path]:
    figures = root / "outputs" / "figures" / "quick"
    return [figures / f"{name}.{ext}" for ext in ("png", "svg", "csv", "md")]


@pytest.mark.slow
@pytest.mark.parametrize("name", CI_NAMES)
def test_quick_render_from_a_fresh_outputs_dir_and_a_second_one_reuses_its_runs(
    tmp_path: Path, name: str
):
    done = reproduce(name, "--quick", "--jobs", "2", root=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for path in _rendered(tmp_path, name):
        assert path.is_file() and path.stat().st_size > 0, path
    md = (tmp_path / "outputs" / "figures" / "quick" / f"{name}.md").read_text()
    assert "| paper claim | paper's number | our number | holds? |" in md
    assert "| ok |" in md  # every drawn job finished

    # a second invocation re-draws from the same runs: no job re-executed, no new run dir
    sweep = tmp_path / "outputs" / "reproduce" / f"{name}-quick"
    logs = sorted(sweep.glob("*/csv/metrics.csv"))
    assert len(logs) == 4
    before = {p: p.stat().st_mtime_ns for p in logs}
    second = reproduce(name, "--quick", root=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (second.stderr + second.stdout).count("skipping finished job") == 4
    assert {p: p.stat().st_mtime_ns for p in logs} == before
    assert sorted(sweep.glob("*/csv/metrics.csv")) == logs


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(REPRODUCTIONS) - set(CI_NAMES)))
def test_quick_render_of_the_other_models(tmp_path: Path, name: str):
    missing = REPRODUCTIONS[name].missing()
    if missing:
        pytest.skip(f"{name} needs {missing}")
    done = reproduce(name, "--quick", "--jobs", "2", root=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(p.is_file() for p in _rendered(tmp_path, name))
