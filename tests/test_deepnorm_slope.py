"""deepnorm_depth's model_update grid: slopes over depth, DeepNorm/Post-LN ratios, saturation."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from normlab.analysis import deepnorm_depth, gates, report, stats
from normlab.analysis.logs import Run

DEPTHS = (6, 12, 25, 50, 100)
NOISE = (1.0, 1.2, 0.85)  # per seed, shared by the arms of a seed


def _run(placement: str, depth: int, lr: str, seed: int, blocks: float) -> Run:
    overrides = {
        "experiment": "deepnorm_model_update",
        "placement": placement,
        "model.net.depth": str(depth),
        "optim.optimizer.lr": lr,
        "seed": str(seed),
        "arm": f"model_update/{placement}/d{depth}/lr{lr}",
    }
    rows = [
        {"step": 0, "update_norm": math.nan},
        {
            "step": 1,
            "update_norm": 3 * blocks,
            "update/blocks": blocks,
            "update/model": 1.5 * blocks,
        },
    ]
    return Run(overrides, "ok", Path("."), metrics=pd.DataFrame(rows))


def _update(placement: str, depth: int, lr: float, seed: int) -> float:
    """Post-LN: lr-proportional, linear in depth (slope 1); DeepNorm: depth^0.1, 6/70 of it at 6."""
    if placement == "post":
        return 70 * lr * depth / 6 * NOISE[seed]
    return 6 * lr * (depth / 6) ** 0.1 * NOISE[seed] * (1 + 0.01 * seed)


def _runs(lrs=("1e-05", "0.001")) -> list[Run]:
    return [
        _run(p, d, lr, seed, _update(p, d, float(lr), seed))
        for p in ("post", "deepnorm")
        for d in DEPTHS
        for lr in lrs
        for seed in range(3)
    ]


def _rendered(tmp_path: Path, runs: list[Run]) -> report.Result:
    path = tmp_path / "runs.csv"  # render reads runs.csv as written
    deepnorm_depth.extract(runs).to_csv(path, index=False, float_format=report.FLOAT)
    return deepnorm_depth.render(pd.read_csv(path))


def test_slopes_and_ratios_within_seeds(tmp_path: Path):
    result = _rendered(tmp_path, _runs())
    claims = {c.claim: c for c in result.claims}
    assert len(claims) == 2 * (3 + len(DEPTHS))  # per lr: 3 slope claims, a ratio per depth
    post = claims["lr 1e-05: Post-LN's model update grows with depth (log-log slope > 0)"]
    assert post.values == pytest.approx([1.0] * 3, abs=1e-4) and post.verdict == stats.HOLDS
    assert set(post.arms) == {f"model_update/post/d{d}/lr1e-05" for d in DEPTHS}
    flat = claims["lr 1e-05: DeepNorm's model update is bounded in depth (log-log slope < 0.25)"]
    assert flat.values == pytest.approx([0.1] * 3, abs=1e-4) and flat.verdict == stats.HOLDS
    assert flat.source == "ours" and flat.region == (stats.BELOW, 0.25)  # the yaml's
    gap = claims[
        "lr 1e-05: DeepNorm's model update grows less with depth than Post-LN's "
        "(slope difference > 0)"
    ]
    assert gap.values == pytest.approx([0.9] * 3, abs=1e-4) and gap.verdict == stats.HOLDS
    at_100 = claims["lr 1e-05, depth 100: DeepNorm's model update is smaller than Post-LN's"]
    expected = [6 / 70 * (100 / 6) ** -0.9 * (1 + 0.01 * s) for s in range(3)]
    assert at_100.values == pytest.approx(expected, rel=1e-4) and at_100.log
    assert any("| lr 1e-05 | Post-LN | whole model |" in n for n in result.notes)
    assert len(result.figure.axes) == 6  # the model_update row below the 2 x 2 of the others
    plt.close(result.figure)


def test_a_saturated_post_ln_arm_understates_its_claims_so_a_holds_stays_valid(tmp_path: Path):
    """A capped Post-LN update can only understate Post-LN's growth and its lead over DeepNorm:
    the gate still fails (shown), and the claims that hold in spite of it stay read."""
    result = _rendered(tmp_path, _runs())
    failed = {g.arm for g in result.gates if g.passed is False}
    # Post-LN at lr 1e-3 reads 0.07 x depth / 6 x noise: 1.17 and 1.4 at depth 100 (0.99 in
    # the third seed), at most 0.7 at depth 50
    assert failed == {"model_update/post/d100/lr0.001"}
    assert {g.gate for g in result.gates} == {"not saturated"}
    decisions = gates.decide(result.claims, result.gates, 3, 12)
    verdicts = {c.claim: d.verdict for c, d in zip(result.claims, decisions, strict=True)}
    assert verdicts["lr 0.001: Post-LN's model update grows with depth (log-log slope > 0)"] == (
        stats.HOLDS
    )
    assert verdicts["lr 0.001, depth 100: DeepNorm's model update is smaller than Post-LN's"] == (
        stats.HOLDS
    )
    at_100 = next(c for c in result.claims if c.claim.startswith("lr 0.001, depth 100"))
    assert at_100.ceiling_against == ("model_update/post/d100/lr0.001",)
    assert verdicts["lr 0.001, depth 50: DeepNorm's model update is smaller than Post-LN's"] == (
        stats.HOLDS
    )
    assert verdicts["lr 1e-05: Post-LN's model update grows with depth (log-log slope > 0)"] == (
        stats.HOLDS
    )
    plt.close(result.figure)


def test_a_missing_depth_leaves_that_seed_out_of_the_slope(tmp_path: Path):
    runs = [
        r
        for r in _runs(("0.0001",))
        if r.get("arm") != "model_update/post/d25/lr0.0001" or r.get("seed") != "1"
    ]
    result = _rendered(tmp_path, runs)
    post = next(c for c in result.claims if c.claim.startswith("lr 0.0001: Post-LN's"))
    assert len(post.values) == 2  # seeds 0 and 2: the slope needs every depth
    plt.close(result.figure)


def test_the_grid_measures_one_step_without_warmup_at_three_lrs(compose, tmp_path: Path):
    from hydra.core.hydra_config import HydraConfig

    from normlab.analysis import sweep
    from normlab.analysis.reproductions import REPRODUCTIONS

    grid = next(g for g in REPRODUCTIONS["deepnorm_depth"].grids if g.name == "model_update")
    assert grid.arm.startswith("model_update/${placement.name}/d${model.net.depth}/lr")
    cfg = compose([f"experiment={grid.experiment}", "seed=3"], tmp_path)
    assert not HydraConfig.get().sweeper.params  # the grid is conf/reproduce/deepnorm_depth's
    full = REPRODUCTIONS["deepnorm_depth"].full
    assert sweep.grid_values(grid, full, False) == {
        "placement": ["post", "deepnorm"],
        "model.net.depth": ["6", "12", "25", "50", "100"],
        "optim.optimizer.lr": ["1e-5", "1e-4", "1e-3"],
    }
    assert cfg.trainer.max_steps == 1 and cfg.callbacks.update_norm.steps == 1
    assert cfg.callbacks.update_norm.blocks == "net.blocks"
    assert cfg.optim.warmup_steps == 0 and cfg.optim.schedule == "constant"
