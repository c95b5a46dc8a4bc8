"""Reading run logs into the reproduction tables: fixture sweeps with known CSV values."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from normlab.analysis import bn_lenet, gn_batch_size, report
from normlab.analysis.logs import load_sweep, parse_overrides, pick, same_value
from normlab.analysis.sweep import (
    Budget,
    Reproduction,
    command,
    grid,
    in_grid,
    sweep_dir,
    task_overrides,
)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def gn_sweep(tmp_path: Path) -> Path:
    """A copy of the gn fixture sweep (run dirs relative to the sweep dir)."""
    return Path(shutil.copytree(FIXTURES / "gn_sweep", tmp_path / "gn_sweep"))


def test_parse_overrides_keeps_dotted_keys_and_values_as_text():
    parsed = parse_overrides("model.net.activation=relu batch=32 +tags=[a,b]")
    assert parsed == {"model.net.activation": "relu", "batch": "32", "tags": "[a,b]"}


def test_same_value_accepts_hydras_spelling_of_a_value():
    assert same_value("False", "false") and same_value("0.003", "3e-3")
    assert not same_value("32", "2") and not same_value(None, "x")


def test_load_sweep_reads_summary_and_each_runs_metrics(gn_sweep: Path):
    runs = load_sweep(gn_sweep)
    assert len(runs) == 5
    bn2 = pick(runs, norm="batchnorm", batch="2")[0]
    assert bn2.status == "ok"
    assert bn2.run_dir == gn_sweep / "1_norm=batchnorm,batch=2"
    assert list(bn2.series("val/acc")["val/acc"]) == pytest.approx([0.65, 0.69])
    # metrics.csv wins over the summary row (0.5 there)
    assert bn2.last("test/acc") == pytest.approx(0.70)
    failed = pick(runs, norm="layernorm")[0]
    assert failed.status == "failed" and failed.error == "RuntimeError: boom"
    assert failed.metrics.empty and math.isnan(failed.last("test/acc"))


def test_load_sweep_filters_by_overrides(gn_sweep: Path):
    assert len(load_sweep(gn_sweep, {"experiment": "gn_batch_size", "batch": "32"})) == 2
    assert load_sweep(gn_sweep, {"experiment": "bn_lenet"}) == []


def test_gn_fixture_gives_the_expected_table(gn_sweep: Path):
    result = gn_batch_size.analyze(load_sweep(gn_sweep))
    errors = result.data.set_index(["run", "x"])["y"]
    assert errors[("batchnorm", 32)] == pytest.approx(10.0)
    assert errors[("batchnorm", 2)] == pytest.approx(30.0)
    assert errors[("groupnorm", 2)] == pytest.approx(12.5)
    verdicts = [c.holds for c in result.claims]
    # BN +20 points: holds; GN within 0.5: holds; GN < BN at 2: holds; LN failed: undecided
    assert verdicts == [True, True, True, None]
    assert "10.0% -> 30.0% (+20.0)" in result.claims[0].ours


def test_bn_fixture_speedup_accuracy_and_drift():
    result = bn_lenet.analyze(load_sweep(FIXTURES / "bn_sweep"))
    sigmoid = result.claims[:3]
    assert "4x sooner (step 100 vs 400)" in sigmoid[0].ours
    assert [c.holds for c in sigmoid] == [True, True, True]
    assert sigmoid[1].ours == "test acc 0.870 (BN) vs 0.790 (none)"
    # drift = p50 range / mean band width: BN 0.2 / 2.1, none 2.0 / 1.0
    assert "0.0952 (BN) vs 2 (none)" in sigmoid[2].ours
    assert all(c.holds is None for c in result.claims[3:])  # relu jobs are missing
    bands = result.data[result.data["panel"] == "sigmoid/preact_none"]
    assert list(bands[bands["y_name"] == "p50"]["y"]) == [0.0, -1.0, -2.0, 0.0]


def test_write_produces_png_svg_csv_and_md(tmp_path: Path, gn_sweep: Path):
    runs = load_sweep(gn_sweep)
    paths = report.write(
        gn_batch_size.analyze(runs), tmp_path, "gn_batch_size", "title", "cmd", "budget", runs, 1.0
    )
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths.values())
    text = paths["md"].read_text()
    assert "| paper claim | paper's number | our number | holds? |" in text
    assert "holds if BN's test error at the smallest batch is >= 2 points" in text
    assert "RuntimeError: boom" in text
    table = pd.read_csv(paths["csv"])
    assert {"panel", "run", "x", "y"} <= set(table.columns)


def test_claim_table_escapes_bars_in_cells():
    claim = report.Claim("c", "||F(x)||", "1", True, "r")
    row = report.claims_markdown([claim]).splitlines()[2]
    assert row == "| c | \\|\\|F(x)\\|\\| | 1 | holds |"


def _repro(quick: Budget) -> Reproduction:
    return Reproduction(
        "demo", "t", "gn_batch_size", Budget((), "full"), quick, gn_batch_size.analyze
    )


def test_command_and_sweep_dirs(tmp_path: Path):
    repro = _repro(Budget(("norm=batchnorm,groupnorm", "trainer.max_epochs=1"), "quick"))
    assert sweep_dir(tmp_path, "demo", True) == tmp_path / "outputs/reproduce/demo-quick"
    assert sweep_dir(tmp_path, "demo", False) == tmp_path / "outputs/reproduce/demo"
    cmd = command(repro, True, tmp_path / "s", jobs=2)
    assert cmd[1:5] == ["train.py", "-m", "experiment=gn_batch_size", "norm=batchnorm,groupnorm"]
    assert "hydra/launcher=joblib" in cmd and "hydra.launcher.n_jobs=2" in cmd
    assert f"hydra.sweep.dir={tmp_path / 's'}" in cmd
    assert not any(c.startswith("hydra/launcher") for c in command(repro, False, tmp_path, 1))
    # jobs are found again by their fixed overrides; the swept ones differ per job
    assert task_overrides(repro, True) == {
        "experiment": "gn_batch_size",
        "trainer.max_epochs": "1",
    }


def test_only_jobs_of_the_current_grid_are_read_back(tmp_path: Path, gn_sweep: Path):
    # the experiment's grid (norm x batch), narrowed by the budget's own sweep over batch
    repro = _repro(Budget(("batch=32,2",), "quick"))
    values = grid(repro, True)
    assert values["batch"] == ["32", "2"] and "groupnorm" in values["norm"]
    assert grid(repro, False)["batch"] == ["32", "16", "8", "4", "2"]
    runs = load_sweep(gn_sweep)
    assert runs and all(in_grid(r, values) for r in runs)
    # rows an earlier grid of the same sweep dir left behind: another value, or a key missing
    stale = [
        replace(runs[0], overrides={**runs[0].overrides, "batch": "7"}),
        replace(runs[0], overrides={"norm": "batchnorm", "experiment": "gn_batch_size"}),
    ]
    assert not any(in_grid(r, values) for r in stale)
