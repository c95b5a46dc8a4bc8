"""scripts/reproduce.py: listing, config composition of its experiments, quick renders, reuse."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from normlab import identity
from normlab.analysis import report, sweep
from normlab.analysis.reproductions import REPRODUCTIONS
from normlab.analysis.sweep import Budget, Grid, Reproduction

REPO = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, str(REPO / "scripts" / "reproduce.py")]
script = importlib.import_module("normlab.analysis.reproduce")  # scripts/reproduce.py's main
# Rendered with --quick in CI's slow run: every reproduction.
CI_NAMES = ["bn_lenet", "gn_batch_size", "ln_placement", "ln_rnn", "deepnorm_depth",
            "rmsnorm_speed", "dit_conditioning", "dyt_vs_ln"]  # fmt: skip
# The same, heaviest --quick run first (.ci/run's slowest durations; `heavy` puts them first).
HEAVIEST_FIRST = ["dyt_vs_ln", "gn_batch_size", "rmsnorm_speed", "ln_placement",
                  "dit_conditioning", "deepnorm_depth", "bn_lenet", "ln_rnn"]  # fmt: skip


# a reproduction's analysis where a test needs none: extract, render
ANALYSIS = (pd.DataFrame, lambda data: None)


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


def test_the_script_and_every_analysis_load_without_torch():
    """--list, --redraw and the option checks need no torch (it loads in seconds): only the
    jobs and the measurements after them (dyt_vs_ln's LN maps) import it."""
    code = "import sys; sys.path.insert(0, 'scripts'); import reproduce; "
    code += "print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_unknown_name_fails_with_the_valid_ones(tmp_path: Path):
    done = reproduce("bn_lenett", root=tmp_path)
    assert done.returncode != 0 and "bn_lenet" in done.stderr and "gn_batch_size" in done.stderr


def test_the_test_workers_share_the_cores_out():
    # conftest sets OMP_NUM_THREADS in each xdist worker before torch loads: its torch, and
    # every train.py or reproduce.py it starts, get cores // workers threads, never more
    import torch
    from conftest import USER_THREADS

    if USER_THREADS is not None:
        pytest.skip(f"OMP_NUM_THREADS={USER_THREADS} was set before the tests")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = max(1, (os.cpu_count() or 1) // workers)
    assert os.environ.get("OMP_NUM_THREADS", str(share)) == str(share)  # unset without xdist
    assert torch.get_num_threads() == share


def test_threads_per_job_share_the_cores_unless_given(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # every core (a test worker sets it)
    cores = os.cpu_count() or 1
    assert sweep.job_threads(1) == cores and sweep.job_threads(2) == max(1, cores // 2)
    assert sweep.job_threads(cores * 4) == 1  # never 0
    assert sweep.job_threads(2, threads=1) == 1 and sweep.job_threads(1, threads=3) == 3
    # the cores this process was given (OMP_NUM_THREADS, OpenMP's nested form too)
    for given, one_job, two_jobs in (("6", 6, 3), ("1", 1, 1), ("4,2", 4, 2)):
        monkeypatch.setenv("OMP_NUM_THREADS", given)
        assert (sweep.job_threads(1), sweep.job_threads(2)) == (one_job, two_jobs)
        assert sweep.job_threads(2, threads=5) == 5
    for unusable in ("", "0", "many"):
        monkeypatch.setenv("OMP_NUM_THREADS", unusable)
        assert sweep.job_threads(1) == cores
    env = sweep.threads_env(3)  # a child job's share: both of torch's thread pools
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("3", "3")
    assert os.environ["OMP_NUM_THREADS"] == "many"  # this process's own is left alone
    done = reproduce("bn_lenet", "--threads", "0", root=tmp_path)
    assert done.returncode == 2 and "--threads must be >= 1, got 0" in done.stderr
    assert not (tmp_path / "outputs").exists()  # refused before any work


@pytest.mark.parametrize(
    "name",
    [
        "bn_lenet",
        "bn_mlp",
        "gn_batch_size",
        "gn_batch_size_allconv",
        "rmsnorm_speed",
        "rmsnorm_speed_lstm",
        "rmsnorm_quality",
        "ln_placement",
        "ln_placement_init",
        "ln_rnn",
        "dyt_vs_ln_gpt",
        "dyt_vs_ln_dit",
    ],
)
def test_experiment_config_composes_without_a_grid_of_its_own(compose, tmp_path: Path, name: str):
    """An experiment is its jobs' settings; the grids are declared once, in conf/reproduce/NAME
    (the experiment yamls no longer repeat them as hydra.sweeper.params)."""
    cfg = compose([f"experiment={name}"], tmp_path)
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    assert not HydraConfig.get().sweeper.params, f"experiment={name} sweeps on its own"
    assert HydraConfig.get().mode != RunMode.MULTIRUN  # `python train.py experiment=NAME`: 1 job
    assert cfg.trainer.max_epochs >= 1


def test_no_experiment_yaml_declares_a_sweep():
    """Every grid lives in conf/reproduce/NAME.yaml; an experiment's hydra.sweeper.params would
    repeat one (and be swept again by every `-m` of it)."""
    import yaml

    from normlab import layout

    def params(path: Path) -> object:
        hydra = (yaml.safe_load(path.read_text()) or {}).get("hydra") or {}
        return (hydra.get("sweeper") or {}).get("params")

    swept = [p.name for p in sorted((layout.conf_dir() / "experiment").glob("*.yaml")) if params(p)]
    assert swept == []


@pytest.mark.parametrize(
    ("overrides", "batch", "lr", "ghost"),
    [
        (["per_device=32"], 256, 0.2, 32),
        (["per_device=8"], 64, 0.05, 8),
        (["per_device=2"], 16, 0.0125, 2),
        (["per_device=2", "batch=256"], 256, 0.2, 2),  # the fixed-SGD-batch arm
    ],
)
def test_gn_batch_size_has_8_virtual_devices_and_scales_the_lr_linearly(
    compose, tmp_path, overrides, batch, lr, ghost
):
    cfg = compose(["experiment=gn_batch_size", "norm.ghost_batch=${per_device}", *overrides],
                  tmp_path)  # fmt: skip
    assert cfg.batch == batch and cfg.data.batch_size == batch
    assert cfg.optim.optimizer.lr == pytest.approx(lr)
    assert cfg.norm.ghost_batch == ghost
    assert cfg.optim.warmup_steps == 12800 // batch  # the same warmup images at every b
    assert list(cfg.model.net.channels) == [16, 32]
    assert cfg.model.net.fc_norm._target_ == "normlab.norms.NoNorm"  # no norm in the fc layers


@pytest.mark.parametrize(("per_device", "lr"), [(32, 0.2), (8, 0.05), (2, 0.0125)])
def test_gn_batch_size_allconv_is_the_same_recipe_on_the_all_conv_net(
    compose, tmp_path, per_device, lr
):
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import instantiate

    cfg = compose(["experiment=gn_batch_size_allconv", "norm.ghost_batch=${per_device}",
                   f"per_device={per_device}"], tmp_path)  # fmt: skip
    assert not HydraConfig.get().sweeper.params  # the grid: conf/reproduce/gn_batch_size.yaml's
    repro = REPRODUCTIONS["gn_batch_size"]
    for name in ("allconv/bn", "allconv/gn"):
        (grid,) = repro.only([name]).grids
        assert sweep.grid_values(grid, repro.full, False)["per_device"] == ["32", "8", "2"]
    assert cfg.batch == 8 * per_device and cfg.norm.ghost_batch == per_device
    assert cfg.optim.optimizer.lr == pytest.approx(lr)
    assert cfg.optim.warmup_steps == 12800 // cfg.batch and cfg.optim.schedule == "cosine"
    assert cfg.model.net._target_ == "normlab.models.allconv.AllConvNet"
    assert set(cfg.model.net) == {"_target_", "norm_layer", "channels", "num_classes"}
    assert instantiate(cfg.model.net).features.norm6.ghost_batch == per_device


@pytest.mark.parametrize("net", ["lenet", "allconv"])
def test_gn_batch_size_trains_each_net_for_its_committed_pilots_budget(compose, tmp_path, net):
    """Each net's experiment trains every b for the budget its pilot picks in the committed
    runs.csv (the fewest epochs at which BN and GN, and LN on LeNet, pass the converged gate)."""
    from normlab.analysis import gn_batch_size

    data = pd.read_csv(REPO / "outputs" / "figures" / "gn_batch_size" / "runs.csv")
    picked = gn_batch_size.pilot_epochs(gn_batch_size.pilot(data, net))
    experiment = {"lenet": "gn_batch_size", "allconv": "gn_batch_size_allconv"}[net]
    cfg = compose([f"experiment={experiment}"], tmp_path)
    assert cfg.trainer.max_epochs == picked


def test_ln_placement_warmup_grid_ties_the_data_order_to_the_seed(compose, tmp_path):
    from hydra.core.hydra_config import HydraConfig

    cfg = compose(["experiment=ln_placement", "seed=5"], tmp_path)
    assert not HydraConfig.get().sweeper.params  # the grid: conf/reproduce/ln_placement.yaml's
    repro = REPRODUCTIONS["ln_placement"]
    (warmup,) = repro.only(["warmup"]).grids
    assert sweep.grid_values(warmup, repro.full, False) == {
        "placement": ["post", "pre"], "optim.optimizer.lr": ["5e-4", "1e-3", "2e-3", "3e-3"],
        "optim.warmup_steps": ["0", "100"]}  # fmt: skip
    assert cfg.data.seed == 5 and cfg.batch == 32 and cfg.data.batch_size == 32 and not cfg.test
    assert cfg.trainer.max_epochs * cfg.data.train_batches_per_epoch == 600
    assert cfg.model.net.depth == 6 and cfg.trainer.val_check_interval == 50
    assert cfg.callbacks.divergence is not None and cfg.callbacks.update_norm is None


@pytest.mark.parametrize(("placement", "final"), [("post", "Identity"), ("pre", "LayerNorm")])
def test_ln_placement_init_measures_w2_at_init_with_the_placements_final_norm(
    compose, tmp_path, placement, final
):
    from hydra.utils import instantiate

    cfg = compose(["experiment=ln_placement_init", f"placement={placement}", "seed=4"], tmp_path)
    assert cfg.trainer.max_steps == 0 and cfg.trainer.limit_val_batches == 0 and not cfg.test
    assert cfg.data.seed == 4 and cfg.batch == 32
    grad = cfg.callbacks.grad_at_init
    assert grad._target_ == "normlab.callbacks.grad_norms.GradAtInit" and grad.batches == 32
    assert cfg.callbacks.model_checkpoint is None and cfg.callbacks.grad_norms is None
    net = instantiate(cfg.model).net
    assert type(net.final_norm).__name__ == final  # Post-LN: none; Pre-LN: its final norm
    for block in net.blocks:  # the weight the callback reads is MLP.fc2, the FFN's W2
        assert block.get_parameter(grad.weight) is block.mlp.sublayer.fc2.weight


def test_bn_mlp_is_bn_lenet_with_the_papers_mlp(compose, tmp_path):
    cfg = compose(["experiment=bn_mlp"], tmp_path)
    assert cfg.model.net._target_ == "normlab.models.mlp.MLP"
    assert list(cfg.model.net.hidden) == [100, 100, 100] and cfg.batch == 60
    assert cfg.model.net.activation == "sigmoid" and cfg.trainer.val_check_interval == 20
    assert cfg.callbacks.norm_stats.layers == ["net.layers.norm3"]


def test_redraw_takes_the_seeds_option_from_the_arms_that_follow_it():
    grids = (Grid("init", "ln_placement_init", seeds=10), Grid("warmup", "ln_placement"))
    repro = Reproduction("demo", "t", grids, Budget((), ""), Budget((), ""), *ANALYSIS)

    def jobs(init: int, warmup: int) -> pd.DataFrame:
        rows = [("init/a", s) for s in range(init)] + [("w/b", s) for s in range(warmup)]
        return pd.DataFrame(rows, columns=["arm", "seed"])

    assert script.seeds_given(repro, jobs(10, 3)) == 3
    assert script.seeds_given(repro, jobs(10, 10)) == 10  # --seeds 10
    assert script.seeds_given(repro, jobs(2, 2)) == 2  # --quick: every grid on --seeds
    pilot = Reproduction("demo", "t", (Grid("pilot", "x", seeds=1), grids[1]), Budget((), ""),
                         Budget((), ""), *ANALYSIS)  # fmt: skip
    assert script.seeds_given(pilot, jobs(1, 2)) == 2  # ... a pilot of fewer on its own
    assert script.command_text("ln_rnn", False, 3) == "python scripts/reproduce.py ln_rnn"
    three = "python scripts/reproduce.py bn_lenet --seeds 3"  # bn_lenet declares 10 first
    assert script.command_text("bn_lenet", False, 3) == three
    # arms at unequal counts came from seeds to a decision: --seeds 20 would run all to 20
    assert not script.seeds_decided(repro, jobs(10, 3))
    unequal = pd.concat([jobs(10, 3), pd.DataFrame({"arm": "w/c", "seed": range(5)})])
    assert script.seeds_given(repro, unequal) == 5
    assert script.seeds_decided(repro, unequal)
    decided = "python scripts/reproduce.py bn_lenet --decide"
    assert script.command_text("bn_lenet", False, 20, decided=True) == decided


COMMITTED = [n for n in REPRODUCTIONS if (REPO / "outputs" / "figures" / n / "runs.csv").is_file()]


def test_every_reproduction_has_committed_evidence_and_runs_in_ci():
    assert COMMITTED == list(REPRODUCTIONS) == CI_NAMES
    assert sorted(HEAVIEST_FIRST) == sorted(CI_NAMES)


NUMBER = re.compile(r"-?\d+\.\d+")


def assert_same_drawing(ours: str, committed: str) -> None:
    """Two SVGs alike but for their coordinates' last digit: a text's extent (freetype) or a
    layout's float sums can differ there from one machine's libraries to another's (seen:
    36.962812 against 36.962813); the numbers are the figure's, each within 1e-4."""
    assert NUMBER.split(ours) == NUMBER.split(committed), "the SVGs differ beyond their numbers"
    a, b = NUMBER.findall(ours), NUMBER.findall(committed)
    far = [(x, y) for x, y in zip(a, b, strict=True) if abs(float(x) - float(y)) > 1e-4]
    assert not far, f"{len(far)} numbers differ, e.g. {far[:3]}"


@pytest.mark.parametrize("name", COMMITTED)
def test_redraw_rebuilds_the_committed_md_and_claims_from_runs_csv_alone(tmp_path, name):
    figures = REPO / "outputs" / "figures"
    shutil.copytree(figures / name, tmp_path / "outputs" / "figures" / name)
    done = reproduce(name, "--redraw", root=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for suffix in (".md", ".claims.csv"):
        ours = (tmp_path / "outputs" / "figures" / f"{name}{suffix}").read_bytes()
        assert ours == (figures / f"{name}{suffix}").read_bytes(), suffix
    ours = (tmp_path / "outputs" / "figures" / f"{name}.svg").read_text()
    assert_same_drawing(ours, (figures / f"{name}.svg").read_text())
    assert (tmp_path / "outputs" / "figures" / f"{name}.png").stat().st_size > 0
    assert not (tmp_path / "outputs" / "reproduce").exists()  # no training


def test_readme_results_table_is_the_one_generated_from_the_claims_files():
    from normlab.analysis.readme import current_section, section

    assert current_section((REPO / "README.md").read_text()) == section(REPO)


def test_redraw_without_runs_csv_fails_with_a_clear_message(tmp_path):
    done = reproduce("bn_lenet", "--redraw", root=tmp_path)
    assert done.returncode != 0 and "no " in done.stderr and "runs.csv" in done.stderr


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("name", HEAVIEST_FIRST)
def test_quick_run_writes_evidence_reuses_its_jobs_and_redraws_the_same_md(
    tmp_path: Path, name: str
):
    # one job at a time: the test workers already share the cores out, and a joblib pool per
    # grid imports torch once more per worker (ln_rnn --quick: 106 s against 178 s with --jobs 2
    # beside two trainings); reproduce.py's joblib path runs in the user's-norm test below
    done = reproduce(name, "--quick", root=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "quick jobs, about a minute each" in done.stdout.splitlines()[0]  # said first
    figures = tmp_path / "outputs" / "figures" / "quick"
    files = [figures / f"{name}.{ext}" for ext in ("png", "svg", "md", "claims.csv")]
    files += [figures / name / "runs.csv", figures / name / "jobs.csv"]
    for path in files:
        assert path.is_file() and path.stat().st_size > 0, path
    md = (figures / f"{name}.md").read_text()
    header = "| claim (as tested here) | source | paper | ours: mean [95% CI] | seeds (planned) |"
    assert header in md and "## Gates" in md and "Holm" in md
    assert f"**{report.SMOKE}**" in md  # a smoke run: its claims read no verdict
    jobs = pd.read_csv(figures / name / "jobs.csv")
    assert (jobs["status"] == "ok").all() and sorted(jobs["seed"].unique()) == [0, 1]
    claims = pd.read_csv(figures / f"{name}.claims.csv")
    # a claim over the seeds that trained in both arms (and an any-of claim over such) reads
    # fewer when a quick run's seeds did not train
    assert (claims["verdict"] == report.SMOKE).all()
    subset = claims["claim"].str.contains("seeds that trained in both|at some lr")
    assert (claims[~subset]["n_seeds"] == 2).all() and (claims[subset]["n_seeds"] <= 2).all()

    # a second invocation, the md's Command: line as printed, reuses every job (same config,
    # same code) and draws the same md; its redraw line, as printed, redraws it from runs.csv
    text = (figures / f"{name}.md").read_text()
    command = re.search(r"^Command: `python scripts/reproduce.py (.+?)`", text, re.M)[1].split()
    again = re.search(r"`python scripts/reproduce.py ([^`]+)` redraws all from it", text)[1]
    assert command == [name, "--quick"] and again.split() == [name, "--redraw", "--quick"]
    logs = sorted((tmp_path / "outputs" / "reproduce").rglob("csv/metrics.csv"))
    assert len(logs) == len(jobs)
    before = {p: p.stat().st_mtime_ns for p in logs}
    second = reproduce(*command, root=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (second.stderr + second.stdout).count("skipping finished job") == len(jobs)
    assert {p: p.stat().st_mtime_ns for p in logs} == before
    reused = pd.read_csv(figures / name / "jobs.csv")
    assert (reused["reused"] == 1).all()
    md = (figures / f"{name}.md").read_bytes()
    assert b"| yes |" in md and b"| no |" not in md
    (figures / f"{name}.md").unlink()
    redraw = reproduce(*again.split(), root=tmp_path)  # from runs.csv, no logs
    assert redraw.returncode == 0, redraw.stderr[-3000:]
    assert (figures / f"{name}.md").read_bytes() == md


def test_deepnorm_grids_measure_the_first_50_steps_and_train_300(compose, tmp_path):
    from hydra.core.hydra_config import HydraConfig

    repro = REPRODUCTIONS["deepnorm_depth"]  # its grids: conf/reproduce/deepnorm_depth.yaml
    grids = {g.name: sweep.grid_values(g, repro.full, False) for g in repro.grids}
    cfg = compose(["experiment=deepnorm_update", "seed=3"], tmp_path)
    assert not HydraConfig.get().sweeper.params
    assert grids["update"] == {
        "placement": ["post", "deepnorm"], "model.net.depth": ["6", "18", "50"],
        "optim.warmup_steps": ["0", "100"]
    }  # fmt: skip
    assert cfg.trainer.max_steps == 50 and cfg.callbacks.update_norm.steps == 50
    assert cfg.optim.schedule == "constant" and cfg.trainer.limit_val_batches == 0
    assert cfg.batch == 16 and cfg.data.seed == 3 and not cfg.test
    cfg = compose(["experiment=deepnorm_depth", "seed=3"], tmp_path)
    assert not HydraConfig.get().sweeper.params
    assert grids["loss"] == {"placement": ["post", "deepnorm"], "model.net.depth": ["6", "50"]}
    assert cfg.trainer.max_epochs * cfg.data.train_batches_per_epoch == 300
    assert cfg.optim.warmup_steps == 100 and cfg.callbacks.update_norm is None


@pytest.mark.parametrize("quick", [False, True])
def test_rmsnorm_speed_grids_time_three_twins_per_model_and_train_600_steps_of_one_model(
    compose, tmp_path, quick
):
    from hydra.core.hydra_config import HydraConfig

    repro = REPRODUCTIONS["rmsnorm_speed"]
    speed, lstm, manual, quality, long = repro.grids  # one arm each
    budget = repro.budget(quick)

    def one_job(grid: Grid) -> list[str]:  # the grid's overrides but its sweeps
        return [o for o in grid.all_overrides(budget, quick) if "," not in o]

    cfg = compose([f"experiment={speed.experiment}", *one_job(speed), "norm=prmsnorm", "seed=2"],
                  tmp_path)  # fmt: skip
    assert not HydraConfig.get().sweeper.params  # the grids: conf/reproduce/rmsnorm_speed.yaml's
    assert sweep.grid_values(speed, budget, quick) == {
        "norm": ["layernorm", "rmsnorm", "prmsnorm"], "model.net.d_model": ["128", "256"]}
    assert "num_threads=1" in speed.all_overrides(budget, quick)
    assert speed.arm == "speed/gpt${model.net.d_model}/${normlab.norm_name:norm}/t${num_threads}"
    timer = cfg.callbacks.paired_step_time
    assert timer._target_ == "normlab.callbacks.timing.PairedStepTime" and timer.seed == 2
    assert (
        timer.model == cfg.model and timer.model.net.norm_layer._target_ == "normlab.norms.PRMSNorm"
    )
    assert dict(timer.baseline_norm) == {
        "_target_": "normlab.norms.LayerNorm",
        "_partial_": True,
        "eps": 1e-5,
        "elementwise_affine": True,
        "bias": True,
        "impl": "fast",
    }
    assert timer.identity_norm._target_ == "normlab.norms.NoNorm" and timer.ops
    pairs = cfg.trainer.max_steps - timer.warmup
    assert pairs == (10 if quick else 100) and timer.op_rounds == (1 if quick else 3)
    assert cfg.trainer.max_epochs * cfg.data.train_batches_per_epoch >= cfg.trainer.max_steps
    assert cfg.trainer.limit_val_batches == 0 and cfg.callbacks.update_norm is None
    assert cfg.num_threads == 1  # the experiment's, and each grid's override
    assert (cfg.model.net.depth, cfg.batch) == ((1, 16) if quick else (4, 32))
    assert repro.max_jobs == 1  # timings: one job at a time
    cfg = compose([f"experiment={lstm.experiment}", *one_job(lstm), "norm=rmsnorm", "seed=2"],
                  tmp_path)  # fmt: skip
    assert sweep.grid_values(lstm, budget, quick)["norm"] == ["layernorm", "rmsnorm", "prmsnorm"]
    assert cfg.model.net._target_ == "normlab.models.lstm.LSTMLM" and cfg.num_threads == 1
    assert cfg.model.net.hidden_size == (32 if quick else 256)
    timer = cfg.callbacks.paired_step_time
    assert timer.model.net.norm_layer._target_ == "normlab.norms.RMSNorm"
    assert timer.identity_norm._target_ == "normlab.norms.NoNorm" and timer.ops
    assert cfg.trainer.max_steps - timer.warmup == (10 if quick else 100)
    assert cfg.model.net.ctx == (16 if quick else 64)
    # like for like: the run's norm and LayerNorm's twin both written out (impl=manual)
    cfg = compose([f"experiment={manual.experiment}", *one_job(manual), "norm=rmsnorm", "seed=2"],
                  tmp_path)  # fmt: skip
    timer = cfg.callbacks.paired_step_time
    assert (cfg.norm.impl, timer.baseline_norm.impl) == ("manual", "manual")
    assert timer.model.net.norm_layer.impl == "manual" and manual.arm.startswith("speed/lstm_")
    assert sweep.grid_values(long, budget, quick, 3)["norm"] == ["layernorm", "prmsnorm"]
    assert sweep.grid_values(quality, budget, quick)["norm"] == ["layernorm", "rmsnorm", "prmsnorm"]
    for grid, want in ((quality, 600), (long, 3000)):
        cfg = compose([f"experiment={grid.experiment}", *one_job(grid), "seed=2"], tmp_path)
        assert not HydraConfig.get().sweeper.params
        shape = (cfg.model.net.d_model, cfg.model.net.depth, cfg.batch, cfg.placement.name)
        assert shape == ((32, 4, 16, "pre") if quick else (128, 4, 32, "pre"))
        steps = cfg.trainer.max_epochs * cfg.data.train_batches_per_epoch
        assert steps == (20 if quick else want) and cfg.data.seed == 2 and not cfg.test
        assert cfg.callbacks.get("paired_step_time") is None


def test_dyt_vs_ln_grids_compose_the_papers_arms(compose, tmp_path):
    from hydra.core.hydra_config import HydraConfig

    repro = REPRODUCTIONS["dyt_vs_ln"]
    grids = {g.arm: g for g in repro.grids}
    gpt = grids["gpt/layernorm"]
    cfg = compose([f"experiment={gpt.experiment}", *gpt.overrides, "seed=1"], tmp_path)
    assert not HydraConfig.get().sweeper.params  # the gpt grid's arms name the norms
    assert sorted(g.arm for g in repro.grids if g.name == "gpt") == [
        "gpt/dyt", "gpt/layernorm", "gpt/rmsnorm"]  # fmt: skip
    net = cfg.model.net
    assert (net.depth, net.d_model, net.n_heads, cfg.placement.name) == (4, 128, 4, "pre")
    assert net.embed_scale is None and cfg.data.seed == 1 and not cfg.test
    assert cfg.trainer.max_epochs * cfg.data.train_batches_per_epoch == 600
    assert cfg.norm._target_ == "normlab.norms.LayerNorm" and cfg.arm == "gpt/layernorm"
    # the pilot: the authors' LLaMA recipe, one job per (attention, FFN/final) alpha0
    pilot = next(g for g in repro.grids if g.name == "pilot")
    assert pilot.seed_count(3, False) == 1
    chosen = [o.split(",")[0] if "norm_at.attn" in o or "norm_at.mlp" in o else o
              for o in pilot.overrides]  # fmt: skip
    cfg = compose([f"experiment={pilot.experiment}", *chosen], tmp_path)
    assert (
        cfg.norm._target_ == "normlab.norms.DyT"
        and cfg.norm.bias is False
        and not cfg.model.net.tie_weights
    )
    assert cfg.model.net.embed_scale == 50 and cfg.arm == "pilot/a1.0_f0.25"
    at = cfg.model.net.norm_at
    assert (at.attn.alpha0, at.mlp.alpha0, at.final.alpha0) == (1.0, 0.25, 0.25)
    dit = grids["dit/dyt"]
    cfg = compose([f"experiment={dit.experiment}", *dit.overrides], tmp_path)
    assert cfg.trainer.max_epochs * cfg.trainer.limit_train_batches == 800
    assert cfg.callbacks.fid.num_samples == 2000 and cfg.callbacks.fid.guidance_scale == 1.0
    assert cfg.callbacks.fid.every_n_epochs == cfg.trainer.max_epochs  # once, at the end
    # the DiT 9x longer, and its lr pilot (3x) over LayerNorm and the patched DyT: fid once, at
    # the end
    cfgs = {}
    for arm, steps in (("dit_long/dyt_patch", 7200),
                       ("dit_long_lr/layernorm/lr${optim.optimizer.lr}", 2400)):  # fmt: skip
        g = grids[arm]
        cfgs[arm] = cfg = compose([f"experiment={g.experiment}",
                                   *(o.split(",")[0] for o in g.overrides)], tmp_path)  # fmt: skip
        assert cfg.trainer.max_epochs * cfg.trainer.limit_train_batches == steps
        assert cfg.callbacks.fid.every_n_epochs == cfg.callbacks.samples.every_n_epochs
        assert cfg.callbacks.fid.every_n_epochs == cfg.trainer.max_epochs
    assert cfg.arm == "dit_long_lr/layernorm/lr0.002" and cfg.norm._target_.endswith("LayerNorm")
    patched = cfgs["dit_long/dyt_patch"]  # the authors' DiT patch: no adaLN-Zero zeros
    assert patched.norm._target_.endswith("DyT") and patched.model.net.zero_init is False


def test_with_norm_adds_a_users_norm_to_the_grids_that_compare_norms():
    repro = REPRODUCTIONS["dyt_vs_ln"].with_norm("meanonly", "examples.my_norm")
    added = {g.name: g for g in repro.grids if g.name.endswith("-meanonly")}
    assert sorted(added) == ["dit-meanonly", "gpt-meanonly"]
    assert added["gpt-meanonly"].overrides[-4:] == (
        "norm=custom", "norm._target_=${normlab.norm:meanonly}", "plugins=[examples.my_norm]",
        "arm=gpt/meanonly",
    )  # fmt: skip
    # a grid whose arms are a template: one arm per job, under <grid>/<norm>/ (or the template
    # itself where it names its norm); a card's cut applies last under --quick too
    cut = {"model_update": ("placement=post", "model.net.depth=50")}
    deep = REPRODUCTIONS["deepnorm_depth"].with_norm("meanonly", None, cut)
    (mine,) = [g for g in deep.grids if g.name == "model_update-meanonly"]
    template = "${placement.name}/d${model.net.depth}/lr${optim.optimizer.lr}"
    assert mine.arm == f"model_update/meanonly/{template}"
    assert mine.quick[-2:] == cut["model_update"] and mine.overrides[-3:-1] == cut["model_update"]
    speed = REPRODUCTIONS["rmsnorm_speed"].with_norm("meanonly", None)
    assert [g.arm for g in speed.grids if g.name == "speed_lstm-meanonly"] == [
        "speed/lstm/${normlab.norm_name:norm}/t${num_threads}"
    ]
    with pytest.raises(ValueError, match="registered norm"):
        REPRODUCTIONS["dyt_vs_ln"].with_norm("x y", None)
    assert [g.name for g in repro.only(["gpt-meanonly"]).grids] == ["gpt-meanonly"]
    with pytest.raises(ValueError, match="no grid or arm nope"):
        repro.only(["nope"])
    one_arm = repro.only(["dit/layernorm", "gpt-meanonly"]).grids
    assert [(g.name, g.arm) for g in one_arm] == [("dit", "dit/layernorm"),
                                                  ("gpt-meanonly", "gpt/meanonly")]  # fmt: skip


def test_grids_option_replaces_only_its_arms_in_the_evidence(tmp_path):
    path = tmp_path / "runs.csv"
    old = pd.DataFrame({"arm": ["a", "a", "b"], "seed": [0, 1, 0], "x": [None] * 3,
                        "metric": ["m"] * 3, "value": [1.0, 2.0, 3.0]})  # fmt: skip
    old.to_csv(path, index=False)
    new = pd.DataFrame({"arm": ["b", "c"], "seed": [0, 0], "x": [None] * 2,
                        "metric": ["m"] * 2, "value": [30.0, 40.0]})  # fmt: skip
    merged = script._merge(new, path)
    assert list(zip(merged["arm"], merged["value"], strict=True)) == [
        ("a", 1.0), ("a", 2.0), ("b", 30.0), ("c", 40.0)
    ]  # fmt: skip
    assert script._merge(new, tmp_path / "absent.csv") is new


def test_two_processes_merging_one_evidence_keep_each_others_rows(tmp_path, monkeypatch):
    """Two reproduce processes on different --grids of one NAME finish together: each merges its
    arm under the NAME's evidence lock, so neither writes over the other's rows (without the
    lock both read the old file, and the later write loses the earlier's arm)."""
    import threading

    from normlab.sweep.summary import file_lock

    paths = {"runs": tmp_path / "runs.csv", "jobs": tmp_path / "jobs.csv"}
    frame = {"seed": [0], "x": [None], "metric": ["m"], "value": [1.0]}
    pd.DataFrame({"arm": ["old"], **frame}).to_csv(paths["runs"], index=False)
    pd.DataFrame({"arm": ["old"], "seed": [0]}).to_csv(paths["jobs"], index=False)
    merge = script._merge

    def slow_merge(*args, **kwargs):  # both read before either writes, unless serialized
        merged = merge(*args, **kwargs)
        time.sleep(0.3)
        return merged

    monkeypatch.setattr(script, "_merge", slow_merge)
    lock = tmp_path / script.EVIDENCE_LOCK

    def land(arm: str) -> None:
        with file_lock(lock):
            jobs = pd.DataFrame({"arm": [arm], "seed": [0]})
            script.land_evidence(pd.DataFrame({"arm": [arm], **frame}), jobs, paths, True)

    threads = [threading.Thread(target=land, args=(arm,)) for arm in ("bn", "gn")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(pd.read_csv(paths["runs"])["arm"]) == ["bn", "gn", "old"]
    assert sorted(pd.read_csv(paths["jobs"])["arm"]) == ["bn", "gn", "old"]


def test_evidence_lands_with_its_md_or_not_at_all(tmp_path):
    """A draw that fails after the evidence landed (an analysis error, an interrupt) puts
    runs.csv and jobs.csv back as they were, byte for byte; a first landing leaves none."""
    paths = {"runs": tmp_path / "runs.csv", "jobs": tmp_path / "jobs.csv"}
    frame = {"seed": [0], "x": [None], "metric": ["m"], "value": [1.0]}
    pd.DataFrame({"arm": ["old"], **frame}).to_csv(paths["runs"], index=False)
    pd.DataFrame({"arm": ["old"], "seed": [0]}).to_csv(paths["jobs"], index=False)
    before = {k: p.read_bytes() for k, p in paths.items()}
    new, jobs = pd.DataFrame({"arm": ["new"], **frame}), pd.DataFrame({"arm": ["new"], "seed": [0]})

    def fails(where: dict) -> Callable[[], dict]:
        def draw() -> dict:
            assert "new" in where["runs"].read_text()  # landed before the draw
            raise ValueError("the analysis failed")

        return draw

    for error, draw in ((ValueError, fails(paths)), (KeyboardInterrupt, _interrupt)):
        with pytest.raises(error):
            script.land_and_draw(new, jobs, paths, True, None, None, draw)
        assert {k: p.read_bytes() for k, p in paths.items()} == before
    first = {k: tmp_path / "first" / p.name for k, p in paths.items()}
    with pytest.raises(ValueError):
        script.land_and_draw(new, jobs, first, False, None, None, fails(first))
    assert not any(p.exists() for p in first.values())
    drawn = script.land_and_draw(new, jobs, paths, True, None, None, lambda: {"md": "drawn"})
    assert drawn == {"md": "drawn"} and sorted(pd.read_csv(paths["runs"])["arm"]) == ["new", "old"]


def _interrupt():
    raise KeyboardInterrupt


def test_subset_runs_part_of_a_grid_as_the_grids_own_jobs():
    """--subset per_device=2: the grid's command with that value in place of its sweep, so its
    jobs carry the full grid's overrides in the full grid's order (their identity); values not
    in the grid, keys it does not sweep and reproductions without job_rows are refused."""
    repro, full = REPRODUCTIONS["gn_batch_size"], REPRODUCTIONS["gn_batch_size"].full
    (grid,) = repro.only(["allconv/bn"]).narrow("per_device", ["2"], quick=False).grids
    assert sweep.grid_values(grid, full, False, 3) == {"seed": ["0", "1", "2"]}
    assert sweep.task_overrides(grid, full, False)["per_device"] == "2"  # its jobs: b=2 only
    (pilot,) = repro.only(["pilot/allconv/bn"]).narrow("trainer.max_epochs", ["32"], False).grids
    declared = repro.only(["pilot/allconv/bn"]).grids[0].all_overrides(full, False)
    narrowed = pilot.all_overrides(full, False)
    assert [o.partition("=")[0] for o in narrowed] == [o.partition("=")[0] for o in declared]
    assert "trainer.max_epochs=32" in narrowed
    with pytest.raises(ValueError, match="per_device=3 is not among grid allconv/bn's values"):
        repro.only(["allconv/bn"]).narrow("per_device", ["3"], False)
    with pytest.raises(ValueError, match="grid pilot/bn .* does not sweep per_device"):
        repro.narrow("per_device", ["2"], False)
    with pytest.raises(ValueError, match="job_rows"):
        REPRODUCTIONS["ln_rnn"].narrow("norm", ["layernorm"], False)
    # seed: any reproduction, among the seeds each grid runs (a grid's own count first)
    seeds = repro.only(["allconv/bn", "pilot/allconv/bn"]).narrow("seed", ["0"], False, 3).grids
    assert [sweep.seed_override(g.seed_count(3, False), g.only_seeds) for g in seeds] == [
        ("seed=0",), ("seed=0",)
    ]  # fmt: skip
    (two,) = repro.only(["allconv/bn"]).narrow("seed", ["1", "2"], False, 3).grids
    assert sweep.grid_values(two, full, False, 3)["seed"] == ["1", "2"]
    with pytest.raises(ValueError, match="grid pilot/allconv/bn runs seeds 0..0"):
        repro.only(["pilot/allconv/bn"]).narrow("seed", ["1"], False, 3)


def test_subset_reads_a_jobs_rows_from_its_arm_name_without_job_rows():
    """A reproduction whose grids' arms name the swept key (dit_conditioning's
    `${model.net.conditioning}`, `deep/${model.net.conditioning}`) needs no job_rows: --subset
    replaces the rows whose arm reads one of the values back, at every depth, and no other."""
    repro = REPRODUCTIONS["dit_conditioning"]
    key, values = "model.net.conditioning", ["adaln_zero", "adaln"]
    narrowed = repro.narrow(key, values, quick=False)
    assert all(f"{key}=adaln_zero,adaln" in g.overrides for g in narrowed.grids)
    arms = ["adaln_zero", "adaln", "cross_attn", "deep/adaln", "deep/in_context", "in_context"]
    data = pd.DataFrame({"arm": arms * 2, "seed": [0] * 6 + [3] * 6})
    rows = narrowed.rows_at(data, [(key, values), ("seed", ["3"])])
    assert data[rows].to_dict("list") == {"arm": ["adaln_zero", "adaln", "deep/adaln"],
                                          "seed": [3, 3, 3]}  # fmt: skip
    with pytest.raises(ValueError, match="in_contxt is not among"):
        repro.narrow(key, ["in_contxt"], quick=False)
    assert sweep._arm_pattern("${a}/lr${b}/w${c}", "b") == ".+?/lr(?P<v>.+?)/w.+?"
    assert sweep._arm_pattern("${a}/d${b}", "c") is None


def test_hydra_keeps_a_sweep_keys_place_when_the_command_line_narrows_it():
    """What --subset's job identity rests on: the basic sweeper puts a key given again on the
    command line where the experiment's sweeper params put it, so the jobs' overrides (their
    key in summary.csv) read as the full grid's."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parse = OverridesParser.create().parse_overrides
    full = ["per_device=32,8,2", "norm=batchnorm", "arm=a", "seed=0"]
    (jobs,) = BasicSweeper.split_arguments(parse(full), None)
    (narrowed,) = BasicSweeper.split_arguments(parse([*full, "per_device=2"]), None)
    assert narrowed == [job for job in jobs if job[0] == "per_device=2"]


def test_subset_replaces_only_the_rows_of_the_jobs_it_ran(tmp_path):
    """gn_batch_size's job_rows: per_device=2's rows are its x=2 rows and its /b2 gate arm's; a
    subset's merge keeps the other b's rows of the same arm, in runs.csv and in jobs.csv."""
    path = tmp_path / "runs.csv"
    old = pd.DataFrame({
        "arm": ["bn", "bn", "bn/b32", "bn/b2", "gn"], "seed": [0] * 5,
        "x": [32.0, 2.0, 10.0, 10.0, 2.0],
        "metric": ["test/error", "test/error", "gate/train_loss", "gate/train_loss", "test/error"],
        "value": [1.0, 2.0, 3.0, 4.0, 5.0],
    })  # fmt: skip
    old.to_csv(path, index=False)
    new = pd.DataFrame({"arm": ["bn", "bn/b2"], "seed": [0, 0], "x": [2.0, 10.0],
                        "metric": ["test/error", "gate/train_loss"],
                        "value": [20.0, 40.0]})  # fmt: skip
    repro = REPRODUCTIONS["gn_batch_size"]
    job_rows = repro.job_rows
    rows = script.partial(repro.rows_at, subset=[("per_device", ["2"])])
    merged = script._merge(new, path, rows)
    assert sorted(zip(merged["arm"], merged["value"], strict=True)) == [
        ("bn", 1.0), ("bn", 20.0), ("bn/b2", 40.0), ("bn/b32", 3.0), ("gn", 5.0)
    ]  # fmt: skip
    with pytest.raises(ValueError, match="per_device or trainer.max_epochs"):
        job_rows(old, "seed", ["0"])
    jobs_path = tmp_path / "jobs.csv"
    jobs = pd.DataFrame({"arm": ["bn", "bn"], "seed": [0, 0],
                         "overrides": ["per_device=32 seed=0", "per_device=2 seed=0"]})  # fmt: skip
    jobs.to_csv(jobs_path, index=False)
    rerun = pd.DataFrame({"arm": ["bn"], "seed": [0], "overrides": ["per_device=2 seed=0"]})
    ran = script.partial(script._jobs_at, subset=[("per_device", ["2"])])
    assert list(script._merge(rerun, jobs_path, ran)["overrides"]) == [
        "per_device=32 seed=0", "per_device=2 seed=0"
    ]  # fmt: skip
    # seed: a row's seed, with the other keys' rows (a subset of b=2's seeds keeps seed 1's)
    old["seed"] = [0, 1, 0, 1, 0]
    old.to_csv(path, index=False)
    both = script.partial(repro.rows_at, subset=[("per_device", ["2"]), ("seed", ["0"])])
    merged = script._merge(new, path, both)
    assert sorted(zip(merged["arm"], merged["seed"], merged["value"], strict=True)) == [
        ("bn", 0, 1.0), ("bn", 0, 20.0), ("bn", 1, 2.0), ("bn/b2", 0, 40.0), ("bn/b2", 1, 4.0),
        ("bn/b32", 0, 3.0), ("gn", 0, 5.0)
    ]  # fmt: skip
    # the sweep dir's other finished jobs (seed 1's, b=32's) come back with the ones run: only
    # the subset's rows are taken from them, each row once
    extracted = pd.concat([new, old[old["seed"] == 1], old.iloc[[0]]], ignore_index=True)
    assert merged.equals(script._merge(extracted, path, both))
    ran = script.partial(script._jobs_at, subset=[("per_device", ["2"]), ("seed", ["1"])])
    assert list(ran(jobs)) == [False, False]
    # the "N of M jobs not ok" line counts the subset's jobs, not the sweep dir's others
    jobs["status"] = ["failed", "ok"]
    assert script.not_ok(jobs, [("per_device", ["2"])]) == (0, 1)
    assert script.not_ok(jobs, [("per_device", ["32"])]) == (1, 1)
    assert script.not_ok(jobs, None) == (1, 2)


def test_norm_and_grids_options_are_checked_before_any_work(tmp_path):
    from dataclasses import replace

    # every reproduction has a report-card slot now: one without a norm grid refuses --norm
    fixed = replace(REPRODUCTIONS["deepnorm_depth"], norm_grids=())
    with pytest.raises(ValueError, match="fixed arms: --norm works with a reproduction that"):
        fixed.with_norm("meanonly", None)
    assert all(r.norm_grids for r in REPRODUCTIONS.values())
    done = reproduce("dyt_vs_ln", "--grids", "nope", root=tmp_path)
    assert done.returncode != 0 and "no grid or arm nope" in done.stderr
    done = reproduce("dyt_vs_ln", "--plugin", "examples.my_norm", root=tmp_path)
    assert done.returncode != 0 and "--plugin goes with --norm" in done.stderr
    done = reproduce("gn_batch_size", "--subset", "per_device=2", root=tmp_path)
    assert done.returncode != 0 and "--subset goes with --grids" in done.stderr
    done = reproduce("gn_batch_size", "--grids", "allconv/bn", "--subset", "per_device",
                     root=tmp_path)  # fmt: skip
    assert done.returncode != 0 and "--subset takes KEY=VALUE" in done.stderr
    done = reproduce("gn_batch_size", "--grids", "gn", "--subset", "per_device=3", root=tmp_path)
    assert done.returncode != 0 and "per_device=3 is not among grid gn's values" in done.stderr
    done = reproduce("gn_batch_size", "--grids", "gn", "--subset", "seed=3", root=tmp_path)
    assert done.returncode != 0 and "seed=3: grid gn runs seeds 0..2" in done.stderr
    done = reproduce("gn_batch_size", "--grids", "gn", "--subset", "seed=0", "--subset", "seed=1",
                     root=tmp_path)  # fmt: skip
    assert done.returncode != 0 and "one option per key" in done.stderr
    assert not (tmp_path / "outputs" / "reproduce").exists()


@pytest.mark.slow
@pytest.mark.heavy
def test_a_users_norm_runs_through_a_reproduction_as_one_more_arm(tmp_path):
    """examples/my_norm.py's mean-only LayerNorm against LayerNorm in dyt_vs_ln's GPT grid,
    with --quick: its own arm, its claim, evidence beside the reproduction's own."""
    args = ["--quick", "--jobs", "2", "--grids", "gpt,gpt-meanonly", "--norm", "meanonly"]
    done = reproduce("dyt_vs_ln", *args, "--plugin", "examples.my_norm", root=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = tmp_path / "outputs" / "figures" / "quick"
    jobs = pd.read_csv(figures / "dyt_vs_ln+meanonly" / "jobs.csv")
    assert (jobs["status"] == "ok").all()
    assert sorted(jobs["arm"].unique()) == ["gpt/dyt", "gpt/layernorm", "gpt/meanonly",
                                            "gpt/rmsnorm"]  # fmt: skip
    claims = pd.read_csv(figures / "dyt_vs_ln+meanonly.claims.csv").set_index("claim")
    mine = claims.loc["GPT: meanonly's final val loss is within +-0.05 nats of LayerNorm's"]
    # --quick is a smoke run: no verdict, whatever the seeds and gates say
    assert mine["n_seeds"] == 2 and mine["verdict"] == mine["verdict_holm"] == report.SMOKE
    assert isinstance(mine["gates"], str) and mine["gates"]  # the gates are still reported
    md = (figures / "dyt_vs_ln+meanonly.md").read_text()
    assert "--norm meanonly --plugin examples.my_norm --quick" in md
    # the md's redraw hint works as printed
    hint = "python scripts/reproduce.py dyt_vs_ln --norm meanonly --plugin examples.my_norm "
    assert f"`{hint}--redraw --quick` redraws all from it" in md
    (figures / "dyt_vs_ln+meanonly.md").unlink()
    again = subprocess.run([sys.executable, *hint.split()[1:], "--redraw", "--quick", "--root",
                            str(tmp_path)], cwd=REPO, capture_output=True, text=True)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert (figures / "dyt_vs_ln+meanonly.md").read_text() == md
    assert not (figures / "dyt_vs_ln.md").exists()  # the reproduction's own evidence untouched


def test_estimate_is_the_committed_wall_time_over_the_parallel_jobs():
    walls = pd.read_csv(REPO / "outputs" / "figures" / "bn_lenet" / "jobs.csv")["wall_time_s"]
    assert REPRODUCTIONS["bn_lenet"].max_jobs is None  # --jobs 2 runs two at once
    total = walls.sum()
    assert script.estimate("bn_lenet") == (
        f"about {script._hours(total)} ({len(walls)} jobs, from the committed run's wall times)"
    )
    half = script._hours(total / 2)
    assert script.estimate("bn_lenet", 2).startswith(f"about {half} at --jobs 2 (")
    assert script._hours(60 * 80) == "80 min" and script._hours(3600 * 1.6) == "1.6 h"
    listed = subprocess.run([*SCRIPT, "--list"], capture_output=True, text=True, check=True)
    assert f"    time (full): {script.estimate('bn_lenet')}\n" in listed.stdout


def test_quick_norm_and_grids_runs_say_how_long_first():
    repro = REPRODUCTIONS["ln_rnn"]
    seeds = script.default_seeds(True, "ln_rnn")
    assert script.job_total(repro, True, seeds) == 6  # pilot 2 (seed 0), main 4
    assert script.estimate_before(repro, True, 1, seeds, False) == (
        "about 6 min (6 quick jobs, about a minute each, 1 at once)"
    )
    one = repro.only([repro.grids[0].name])
    committed = pd.read_csv(REPO / "outputs" / "figures" / "ln_rnn" / "jobs.csv")
    arms = committed[committed["arm"].str.startswith(f"{repro.grids[0].name}/")]
    median = arms["wall_time_s"].median()
    got = script.estimate_before(one, False, 1, script.default_seeds(False, "ln_rnn"), True)
    assert got.startswith("about ") and f"the committed median {median:.0f} s a job" in got
    assert script.estimate_before(repro, False, 1, None, False) == script.estimate("ln_rnn")


def test_an_estimate_leaves_out_the_jobs_finished_before(monkeypatch, tmp_path):
    """A rerun after a cut says what is left: its finished jobs are reused, not run (a job
    still 'running' in its summary was killed, and one finished under other training code is
    changed: both run again)."""
    repro = REPRODUCTIONS["ln_rnn"]
    seeds = script.default_seeds(True, "ln_rnn")
    today = identity.code_version()
    found = [SimpleNamespace(status=s, code_version=v) for s, v in [
        ("ok", today), ("diverged", today), ("running", today), ("failed", today),
        ("ok", "0123456789abcdef")]]  # fmt: skip
    monkeypatch.setattr(sweep, "runs", lambda *a: found)
    assert script.estimate_before(repro, True, 1, seeds, False, tmp_path) == (
        "about 4 min (4 quick jobs, about a minute each, 1 at once, 2 of 6 finished before)"
    )
    full = script.estimate_before(repro, False, 1, None, False, tmp_path)
    assert full.startswith("about ") and full.endswith("finished before)")
    monkeypatch.setattr(sweep, "runs", lambda *a: [])
    assert script.estimate_before(repro, False, 1, None, False, tmp_path) == script.estimate(
        "ln_rnn"
    )


def test_a_subset_runs_estimate_counts_only_its_own_finished_jobs(monkeypatch, tmp_path):
    """--subset seed=5 of a sweep dir holding seeds 0-4: those are other jobs, not this run's
    (it said '2 of 2 finished before', about 0 min, then trained both)."""
    repro = REPRODUCTIONS["ln_rnn"]
    today = identity.code_version()
    found = [SimpleNamespace(status="ok", code_version=today, overrides={"seed": str(seed)})
             for seed in range(5)]  # fmt: skip
    monkeypatch.setattr(sweep, "runs", lambda *a: found)
    seeds = script.default_seeds(True, "ln_rnn")
    assert script.finished_jobs(repro, True, tmp_path, seeds) == 5
    assert script.finished_jobs(repro, True, tmp_path, seeds, [("seed", ["5"])]) == 0
    assert script.finished_jobs(repro, True, tmp_path, seeds, [("seed", ["3", "5"])]) == 1
    said = script.estimate_before(repro, True, 1, seeds, True, tmp_path, [("seed", ["5"])])
    assert "finished before" not in said


def test_progress_lines_say_jobs_done_and_an_eta_as_jobs_finish(monkeypatch, capsys):
    assert script.progress_line("x", 3, 10, 2, 120.0) == "x: jobs 3/10 done, ETA 7 min"
    assert script.progress_line("x", 3, 10, 0, 5.0) == "x: jobs 3/10 done, ETA unknown"
    # 1 reused, then 3 finish; a job's row reads 'running' from its start to its end
    finished = iter([(1, 0), (1, 1), (2, 1), (4, 0)])

    def run(*args, **kw) -> float:
        time.sleep(0.5)
        return 1.0

    monkeypatch.setattr(script, "job_total", lambda *a: 4)
    def runs(*args) -> list[SimpleNamespace]:
        done, running = next(finished, (4, 0))
        return [SimpleNamespace(status="ok")] * done + [SimpleNamespace(status="running")] * running

    monkeypatch.setattr(sweep, "runs", runs)
    monkeypatch.setattr(sweep, "run", run)
    repro = REPRODUCTIONS["ln_rnn"]
    assert script.run_showing_progress(repro, True, Path("."), 1, 1, None, every=0.02) == 1.0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(", ETA")[0] for line in lines] == [
        "ln_rnn: jobs 2/4 done", "ln_rnn: jobs 4/4 done"
    ]
    assert lines[-1] == "ln_rnn: jobs 4/4 done, ETA 0 min"


@pytest.mark.slow
@pytest.mark.parametrize("to", ["group", "process"])
def test_ctrl_c_stops_cleanly_and_the_next_invocation_continues(tmp_path: Path, to: str):
    """Ctrl+C in a terminal (SIGINT to the whole group), or `kill -INT <pid>` of reproduce alone
    (its sweep's child gets it from reproduce): the same clean stop, then the same command
    continues."""
    cmd = [*SCRIPT, "ln_rnn", "--quick", "--root", str(tmp_path)]

    # as from a terminal: SIGINT not ignored (a test run in the background inherits SIG_IGN)
    def terminal() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=terminal)  # fmt: skip
    summaries = tmp_path / "outputs" / "reproduce"
    deadline = time.time() + 600
    while "ok" not in "".join(p.read_text() for p in summaries.rglob("summary.csv")):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.5)
    if to == "group":
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C: the terminal signals the whole group
    else:
        os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err
    assert err.count("continue with:") == 1, err  # the job's own line is left to this one
    assert err.strip().splitlines()[-1] == (
        f"continue with: python {SCRIPT[1]} ln_rnn --quick --root {tmp_path}"
    )  # the program as it was started (layout.program): here by its absolute path
    again = reproduce("ln_rnn", "--quick", root=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "skipping finished job" in again.stderr + again.stdout
    jobs = pd.read_csv(tmp_path / "outputs" / "figures" / "quick" / "ln_rnn" / "jobs.csv")
    assert (jobs["status"] == "ok").all() and len(jobs) == 6  # pilot 2 (seed 0), main 4


@pytest.mark.parametrize("code", [128 + signal.SIGINT, -signal.SIGINT])
def test_an_interrupt_of_the_sweeps_child_alone_stops_as_ctrl_c_does(tmp_path, monkeypatch,
                                                                     capsys, code):  # fmt: skip
    """SIGINT to the sweep's child alone (`kill -INT <pid>`: it exits 130, or dies of it): the
    continue line and exit 130, as after Ctrl+C, not a traceback of a failed sweep."""
    monkeypatch.setattr(sweep, "run_child", lambda *a, **k: code)
    argv = ["ln_rnn", "--quick", "--root", str(tmp_path)]
    with pytest.raises(SystemExit) as stopped:
        script.main(argv)
    assert stopped.value.code == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"continue with: {shlex.join([*script.PROGRAM(), *argv])}"


# a child that counts the SIGINTs it gets and exits 10 + that count, once it got one
COUNTING_CHILD = """
import os, signal, sys, time
got = []
signal.signal(signal.SIGINT, lambda *a: got.append(1))
open(sys.argv[1], "w").write(str(os.getpgrp()))
end = time.time() + 30
while not got and time.time() < end:
    time.sleep(0.05)
time.sleep(0.3)  # a second one would be counted
sys.exit(10 + len(got))
"""


def test_a_sigint_to_this_process_alone_reaches_the_sweeps_child_once(tmp_path, monkeypatch):
    """`kill -INT <pid>` of reproduce alone: its sweep's child (in a process group of its own,
    so a terminal's Ctrl+C reaches it only this way too) gets the SIGINT once, and the handler
    that was in place (reproduce's Interrupt) still runs."""
    ready, seen = tmp_path / "ready", []
    monkeypatch.setattr(sweep, "REPO", tmp_path)
    before = signal.signal(signal.SIGINT, lambda *a: seen.append(1))

    def interrupt() -> None:
        while not ready.is_file() or not ready.read_text():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # to this process alone

    try:
        sender = threading.Thread(target=interrupt, daemon=True)
        sender.start()
        code = sweep.run_child([sys.executable, "-c", COUNTING_CHILD, str(ready)], dict(os.environ))
        sender.join(timeout=5)
    finally:
        assert signal.signal(signal.SIGINT, before) is not None  # run_child put back the test's
    assert code == 11 and seen == [1]
    assert int(ready.read_text()) not in (os.getpgrp(), 0)  # a group of its own


def test_the_sweeps_child_is_interrupted_when_its_parent_dies(tmp_path):
    """SIGKILL to reproduce (the sweep's parent): the child's group gets a SIGINT (Ctrl+C: the
    jobs save their state and stop) instead of training on as an orphan."""
    marker = tmp_path / "interrupted"
    child = ("import sys, time\n"
             "from normlab.sweep.multiruns import follow_parent\n"
             "follow_parent()\n"
             "try:\n    print('ready', flush=True)\n    time.sleep(60)\n"
             "except KeyboardInterrupt:\n"
             f"    open({str(marker)!r}, 'w').write('yes')\n")  # fmt: skip
    parent = ("import signal, subprocess, sys\n"  # as from a terminal: SIGINT not ignored
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              f"c = subprocess.Popen([sys.executable, '-c', {child!r}], process_group=0, "
              "stdout=subprocess.PIPE, text=True)\n"
              "print(c.pid, c.stdout.readline().strip(), flush=True)\n"
              "import time; time.sleep(60)\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    pid, state = proc.stdout.readline().split()
    assert state == "ready"
    proc.kill()
    proc.wait()
    deadline = time.time() + 20
    while not (marker.is_file() and marker.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "yes"
    with pytest.raises(ProcessLookupError):  # and it ended
        for _ in range(100):
            os.kill(int(pid), 0)
            time.sleep(0.05)


def test_a_quick_md_says_its_notes_describe_the_full_budget(tmp_path: Path):
    name = "gn_batch_size"  # an analysis with notes
    figures = tmp_path / "outputs" / "figures"
    for out in (figures / "quick" / name, figures / name):  # the committed evidence, redrawn
        out.mkdir(parents=True)  # as if quick, and as it is
        for file in ("runs.csv", "jobs.csv"):
            shutil.copy(REPO / "outputs" / "figures" / name / file, out / file)
    md = script.redraw(name, True, tmp_path)["md"].read_text()
    notes = md.split("## Notes\n\n", 1)[1]
    assert notes.startswith(f"- {script.quick_note(REPRODUCTIONS[name])}\n")
    assert REPRODUCTIONS[name].full.text in notes.splitlines()[0]
    full = script.redraw(name, False, tmp_path)  # no such note in a full run's md
    assert "This is a --quick run" not in full["md"].read_text()


def test_launcher_options_are_checked_before_any_work(tmp_path):
    done = reproduce("bn_lenet", "--quick", "--launcher", "pbs", root=tmp_path)
    assert done.returncode == 2 and "invalid choice: 'pbs'" in done.stderr
    assert "'local', 'slurm'" in done.stderr  # the valid ones named
    done = reproduce("bn_lenet", "--quick", "--launcher", "local", "--jobs", "2", root=tmp_path)
    assert done.returncode == 2 and "with --launcher the launcher decides" in done.stderr
    done = reproduce("bn_lenet", "--quick", "--launcher", "local", "--collect", root=tmp_path)
    assert done.returncode == 2 and "--launcher runs jobs: not with --collect" in done.stderr
    done = reproduce("bn_lenet", "--quick", "--launcher-arg", "partition=gpu", root=tmp_path)
    assert done.returncode == 2 and "--launcher-arg goes with --launcher" in done.stderr
    done = reproduce("bn_lenet", "--quick", "--launcher", "slurm", "--launcher-arg", "partition",
                     root=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "--launcher-arg takes KEY=VALUE" in done.stderr
    # no SLURM here (sbatch on no PATH entry): one line, before any work
    bare = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    assert shutil.which("sbatch", path=bare["PATH"]) is None
    cmd = [*SCRIPT, "bn_lenet", "--quick", "--launcher", "slurm", "--root", str(tmp_path)]
    done = subprocess.run(cmd, cwd=REPO, env=bare, capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip() == (
        "error: --launcher slurm: no sbatch on this machine (not a SLURM login node): run it "
        "where sbatch is, or use --launcher local"
    )
    assert not (tmp_path / "outputs").exists()


def test_launcher_sends_every_grids_multirun_through_hydras_launcher(tmp_path, monkeypatch):
    """Each grid's `train.py -m` gets hydra/launcher=<normlab's preset> and the --launcher-arg
    values as hydra.launcher.KEY=VALUE (Hydra's overrides: not the jobs' identity); no joblib.
    SLURM jobs take their cores from SLURM, local ones share this machine's."""
    repro = REPRODUCTIONS["bn_lenet"].only(["lenet", "mlp"])
    seen = []

    def fake_run(cmd, env):
        seen.append((json.loads(cmd[-1]), env))
        return 0

    monkeypatch.setattr(sweep, "run_child", fake_run)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    sweep.run(repro, True, tmp_path, 1, 2, launcher="slurm",
              launcher_args=("partition=gpu", "timeout_min=600"))  # fmt: skip
    sweep.run(repro, True, tmp_path, 1, 2, launcher="local")
    sweep.run(repro, True, tmp_path, 2, 2)  # no launcher: joblib, as before
    (slurm, slurm_env), (local, local_env), (here, _) = seen
    assert len(slurm) == len(local) == len(here) == len(repro.grids)
    for args in slurm:
        assert args[-3:] == ["hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                             "hydra.launcher.timeout_min=600"]  # fmt: skip
    assert all(args[-1] == "hydra/launcher=local" for args in local)
    assert not any("joblib" in a for args in slurm + local for a in args)
    assert all("hydra/launcher=joblib" in args for args in here)
    assert "OMP_NUM_THREADS" not in slurm_env  # SLURM pins cpus_per_task cores per job
    at_once = max(sweep.grid_size(g, repro.budget(True), True, 2) for g in repro.grids)
    assert at_once > 1 and local_env["OMP_NUM_THREADS"] == str(sweep.job_threads(at_once))
    # the jobs are the same jobs (the same task overrides) whichever launcher runs them
    strip = lambda args: [a for a in args if not a.startswith(("hydra/", "hydra.launcher"))]  # noqa: E731
    assert [strip(a) for a in slurm] == [strip(a) for a in local] == [strip(a) for a in here]


@pytest.mark.slow
def test_launcher_local_runs_a_quick_reproduction_and_collect_reads_it_back(tmp_path):
    """bn_lenet --quick, shrunk to its cheapest grid at one seed (2 jobs), through submitit's
    local executor; then --collect rebuilds the same evidence from the sweep dir, no training."""
    shrunk = ["bn_lenet", "--quick", "--grids", "mlp", "--subset", "seed=0", "--threads", "1"]
    done = reproduce(*shrunk, "--launcher", "local", root=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert "hydra/launcher=local" in out and "Submitit 'local' sweep output dir" in out
    sweep_dir = tmp_path / "outputs" / "reproduce" / "bn_lenet-quick" / "mlp"
    submitted = [p for p in (sweep_dir / ".submitit").iterdir() if p.name.isdigit()]
    figures = tmp_path / "outputs" / "figures" / "quick"
    jobs = pd.read_csv(figures / "bn_lenet" / "jobs.csv")
    assert len(submitted) == len(jobs) == 2  # each job a submitit job
    assert (jobs["status"] == "ok").all() and sorted(jobs["arm"]) == ["mlp/batchnorm", "mlp/none"]
    runs = pd.read_csv(figures / "bn_lenet" / "runs.csv")
    logs = sorted(sweep_dir.rglob("csv/metrics.csv"))
    before = {p: p.stat().st_mtime_ns for p in logs}
    for path in (figures / "bn_lenet" / "jobs.csv", figures / "bn_lenet" / "runs.csv"):
        path.unlink()
    collected = reproduce(*shrunk[:-2], "--collect", root=tmp_path)
    assert collected.returncode == 0, collected.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in logs} == before  # nothing trained again
    again = pd.read_csv(figures / "bn_lenet" / "jobs.csv")
    pd.testing.assert_frame_equal(again, jobs)
    pd.testing.assert_frame_equal(pd.read_csv(figures / "bn_lenet" / "runs.csv"), runs)
