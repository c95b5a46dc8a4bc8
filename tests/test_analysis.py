"""Reading run logs into the reproduction tables: fixture sweeps with known CSV values."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from normlab.analysis import (
    bn_lenet,
    deepnorm_depth,
    dit_conditioning,
    gates,
    gn_batch_size,
    ln_placement,
    logs,
    report,
    rmsnorm_speed,
    stats,
    sweep,
)
from normlab.analysis import claims as claims_mod
from normlab.analysis.logs import Run, load_sweep, parse_overrides, pick, same_value
from normlab.analysis.sweep import (
    Budget,
    Grid,
    Reproduction,
    grid_values,
    in_grid,
    jobs_frame,
    seed_override,
    sweep_dir,
    task_overrides,
    train_args,
)
from normlab.sweep import summary

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def gn_sweep(tmp_path: Path) -> Path:
    """A copy of the gn fixture sweep (run dirs relative to the sweep dir)."""
    return Path(shutil.copytree(FIXTURES / "gn_sweep", tmp_path / "gn_sweep"))


def test_parse_overrides_keeps_dotted_keys_and_values_as_text():
    parsed = parse_overrides("model.net.activation=relu batch=32 +tags=[a,b]")
    assert parsed == {"model.net.activation": "relu", "batch": "32", "tags": "[a,b]"}
    # Hydra's record of an interpolation override: norm.ghost_batch=${per_device}
    assert parse_overrides("norm.ghost_batch=$\\{per_device\\}") == {
        "norm.ghost_batch": "${per_device}"
    }


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


def test_load_sweep_finds_the_run_dirs_of_a_sweep_moved_from_another_root(gn_sweep: Path):
    """summary.csv written under another --root (absolute run dirs there, since gone): each job
    is read from its dir of the same name in this sweep dir."""
    summary = gn_sweep / "summary.csv"
    rows = pd.read_csv(summary, dtype=str, keep_default_na=False)
    rows["run_dir"] = "/gone/outputs/reproduce/gn/" + rows["run_dir"]
    rows.to_csv(summary, index=False)
    bn2 = pick(load_sweep(gn_sweep), norm="batchnorm", batch="2")[0]
    assert bn2.run_dir == gn_sweep / "1_norm=batchnorm,batch=2"
    assert bn2.last("test/acc") == pytest.approx(0.70)  # its metrics.csv, not the summary's 0.5


def test_a_resumed_jobs_wall_time_counts_its_earlier_runs(gn_sweep: Path):
    """summary.csv holds the last run's wall time; a job stopped and resumed adds the runs its
    last run resumed, from its train.log (run dir line to last line). Not added: an earlier job
    run again from scratch in the dir (changed), invocations that reused it; a job run once
    keeps its own."""
    log = gn_sweep / "1_norm=batchnorm,batch=2" / "train.log"

    def at(t: str, text: str) -> str:
        return f"[2026-01-01 {t},000]{text}"

    run = "[normlab.sweep.task][INFO] - run dir: x"
    log.write_text("\n".join([
        at("08:00:00", run),  # an earlier config's job, run again from scratch below
        at("08:30:00", "[normlab.callbacks.progress][INFO] - epoch 1/1"),
        at("09:59:00", "[normlab.sweep.jobs][INFO] - job [b=2] changed (config_hash): running"),
        at("10:00:00", run),
        at("10:01:40", "[normlab.callbacks.progress][INFO] - epoch 1/2"),
        "  a traceback line without a time",
        at("10:02:00", "[lightning][INFO] - Received SIGTERM: 15"),
        at("11:00:00", run),
        at("11:00:00", "[normlab.sweep.task][INFO] - job [b=2] was running: resuming from y"),
        at("11:00:30", "[normlab.callbacks.progress][INFO] - epoch 2/2"),
        at("12:00:00", "[normlab.sweep.jobs][INFO] - skipping finished job [b=2] (x)"),
        at("12:00:01", run),  # a later invocation that found it finished
        at("12:00:02", "[normlab.sweep.task][INFO] - objective"),
    ]) + "\n")  # fmt: skip
    assert logs.earlier_runs_s(log.parent) == 120.0  # 10:00-10:02 only
    runs = load_sweep(gn_sweep)
    assert pick(runs, norm="batchnorm", batch="2")[0].wall_time_s == pytest.approx(121.5)
    assert pick(runs, norm="batchnorm", batch="32")[0].wall_time_s == pytest.approx(1.5)
    log.write_text("\n".join(log.read_text().splitlines()[:6]) + "\n")  # ran once: nothing
    assert logs.earlier_runs_s(log.parent) == 0.0


def test_load_sweep_filters_by_overrides(gn_sweep: Path):
    assert len(load_sweep(gn_sweep, {"experiment": "gn_batch_size", "batch": "32"})) == 2
    assert load_sweep(gn_sweep, {"experiment": "bn_lenet"}) == []


def test_claim_table_escapes_bars_in_cells():
    claim = report.Claim("c", "||F(x)||", "q", [1.0, 1.0, 1.0], (0.0, stats.ABOVE), source="paper")
    decisions = gates.decide([claim], [], initial=3, cap=12)
    row = next(line for line in report.claims_table([claim], decisions, 3, 12).splitlines()
               if line.startswith("| c |"))  # fmt: skip
    assert row == "| c | paper | \\|\\|F(x)\\|\\| | 1 [1, 1] | 3 (3) | **holds** | holds |"


# ----- claims as measurements -------------------------------------------------------------------


def test_t_interval_of_three_seeds_is_the_mean_plus_minus_t_times_the_standard_error():
    i = stats.Interval.of([1.0, 2.0, 3.0])
    # sd 1, n 3, t(0.975, 2) = 4.302653 (tables): half-width 4.302653 / sqrt(3) = 2.48414
    assert (i.mean, i.n) == (2.0, 3)
    assert i.low == pytest.approx(2.0 - 2.48414, abs=1e-5)
    assert i.high == pytest.approx(2.0 + 2.48414, abs=1e-5)
    ratio = stats.Interval.of([2.0, 8.0], log=True)  # geometric mean 4, CI symmetric in log
    assert ratio.mean == pytest.approx(4.0)
    assert ratio.low * ratio.high == pytest.approx(16.0)
    assert not stats.Interval.of([1.0]).known  # one seed: no interval
    assert not stats.Interval.of([1.0, math.inf, 2.0]).known


@pytest.mark.parametrize(
    ("values", "region", "expected"),
    [
        ([3.0, 3.1, 2.9], (2.0, stats.ABOVE), stats.HOLDS),
        ([1.0, 1.1, 0.9], (2.0, stats.ABOVE), stats.FAILS),
        ([1.0, 3.0, 2.0], (2.0, stats.ABOVE), stats.UNDECIDED),  # CI straddles 2
        ([0.1, -0.1, 0.0], (-1.0, 1.0), stats.HOLDS),
        ([3.0, 3.1, 2.9], (-1.0, 1.0), stats.FAILS),
        ([-3.0, 3.0, 0.0], (-1.0, 1.0), stats.UNDECIDED),  # CI wider than the band on both sides
        ([0.2, 0.3, 0.25], (stats.BELOW, 0.5), stats.HOLDS),
        ([5.0], (0.0, stats.ABOVE), stats.MISSING),
    ],
)
def test_verdict_holds_only_with_the_whole_interval_on_the_papers_side(values, region, expected):
    assert stats.verdict(stats.Interval.of(values), region) == expected


def test_claim_row_rule_and_verdict_say_what_the_code_tested():
    claim = report.Claim(
        "c", "2.3x", "steps ratio", [3.0, 4.0, 5.0], (2.0, stats.ABOVE), log=True, source="paper"
    )
    row = claim.row()
    assert set(row) == {"claim", "provenance", "paper_number", "ours_mean", "ci_low", "ci_high",
                        "n_seeds", "verdict", "rule"}  # fmt: skip
    assert row["provenance"] == "paper"
    assert row["ours_mean"] == pytest.approx(60.0 ** (1 / 3))  # geometric mean
    assert row["n_seeds"] == 3 and row["verdict"] == claim.verdict
    assert "geometric mean" in row["rule"] and "wholly above 2" in row["rule"]
    assert "wholly below 2" in row["rule"]
    tie = report.Claim(
        "t", "", "d", [1.0, -1.0, 0.5], (0.0, stats.ABOVE), undecided="tie", source="paper"
    )
    assert tie.verdict == "tie" and tie.rule.endswith("otherwise tie")


def test_any_claim_holds_if_a_part_holds_and_fails_only_if_every_part_fails():
    def part(values: list[float]) -> report.Claim:
        return report.Claim("c", "p", "q", values, (0.05, stats.ABOVE), source="paper")

    holds, undecided, fails = part([0.5, 0.6, 0.7]), part([0.0, 0.2, 0.1]), part([-1, -1.1, -0.9])
    stronger = part([0.9, 1.0, 1.1])
    claim = report.AnyClaim(
        "any", "p", {"a": fails, "b": holds, "c": undecided, "d": stronger}, source="paper"
    )
    assert claim.verdict == stats.HOLDS and claim.deciding == "d"  # furthest above 0.05
    assert claim.ours() == f"{stronger.ours()} (d)" and claim.row()["ci_low"] == pytest.approx(
        stronger.interval.low
    )
    assert "any of a, b, c, d" in claim.rule and "no correction for testing 4" in claim.rule
    mixed = report.AnyClaim("any", "p", {"a": fails, "c": undecided}, source="paper")
    assert mixed.verdict == stats.UNDECIDED and mixed.deciding == "c"
    assert (
        report.AnyClaim("any", "p", {"a": fails, "b": fails}, source="paper").verdict == stats.FAILS
    )
    none = report.AnyClaim("any", "p", {"a": part([1.0])}, source="paper")
    assert none.verdict == stats.MISSING and none.row()["n_seeds"] == 1


def test_bootstrap_of_a_median_matches_its_exact_distribution():
    from scipy.stats import binom

    # The bootstrap median of n = 11 distinct values is the k-th smallest with
    # P(median <= x_(k)) = P(Bin(11, k / 11) >= 6): the exact 2.5% and 97.5% quantiles (this
    # sample's CDF steps are >= 0.017 away from both, so 10,000 resamples find them exactly).
    x = np.arange(1.0, 12.0) ** 2
    cdf = [binom.sf(5, 11, k / 11) for k in range(1, 12)]
    low = x[next(k for k, c in enumerate(cdf) if c >= 0.025)]
    high = x[next(k for k, c in enumerate(cdf) if c >= 0.975)]
    i = stats.bootstrap([x], np.median)
    assert (i.mean, i.low, i.high, i.n) == (36.0, low, high, 1) == (36.0, 9.0, 81.0, 1)
    assert stats.bootstrap([x], np.median) == i  # seeded: the same interval every time
    assert stats.bootstrap([x], np.median, seed=1).n == 1


def test_bootstrap_resamples_within_each_group():
    # stratified: every resample keeps three 1s and two 5s, so the pooled median is always 1;
    # pooled resampling would draw three 5s in about 32% of resamples
    i = stats.bootstrap([[1.0, 1.0, 1.0], [5.0, 5.0]], np.median)
    assert (i.mean, i.low, i.high, i.n) == (1.0, 1.0, 1.0, 2)
    assert not stats.bootstrap([[1.0, 2.0], []]).known
    assert not stats.bootstrap([[1.0, math.nan]]).known
    assert not stats.bootstrap([]).known


def test_a_joint_bootstrap_gives_each_statistic_the_interval_it_gets_alone():
    rng = np.random.default_rng(3)
    groups = [rng.lognormal(size=40), rng.lognormal(size=25)]

    def spread(v, axis=-1):
        return np.quantile(v, 0.9, axis=axis) - np.quantile(v, 0.1, axis=axis)

    both = stats.bootstrap_joint(
        groups, lambda v, axis=-1: {"median": np.median(v, axis=axis), "spread": spread(v, axis)},
        resamples=3000, seed=5,
    )  # fmt: skip
    assert both["median"] == stats.bootstrap(groups, np.median, resamples=3000, seed=5)
    assert both["spread"] == stats.bootstrap(groups, spread, resamples=3000, seed=5)
    assert both["median"] != both["spread"] and both["median"].n == 2
    assert stats.bootstrap_joint([[1.0], []], lambda v, axis=-1: {"m": v.mean(axis)}) == {}


def test_interval_claim_decides_on_a_given_interval_by_claims_rule():
    def claim(low: float, high: float) -> report.IntervalClaim:
        interval = stats.Interval(0.5 * (low + high), low, high, 3)
        return report.IntervalClaim("c", "7%", "median ratio", interval, (stats.BELOW, 0.93),
                                    "bootstrap", source="paper")  # fmt: skip

    assert claim(0.85, 0.92).verdict == stats.HOLDS
    assert claim(0.94, 1.02).verdict == stats.FAILS
    assert claim(0.90, 0.96).verdict == stats.UNDECIDED
    c = claim(0.85, 0.92)
    assert c.rule == (
        "median ratio. Holds if its 95% CI lies wholly below 0.93; does not hold if it lies "
        "wholly above 0.93; otherwise undecided (within noise)"
    )
    row = c.row()
    assert (row["ours_mean"], row["ci_low"], row["ci_high"], row["n_seeds"]) == (
        0.885,
        0.85,
        0.92,
        3,
    )
    assert c.ours() == "0.885 [0.85, 0.92]"
    t_claim = report.Claim("t", "p", "q", [1.0, 2.0, 3.0], (0.0, stats.ABOVE), source="paper")
    both = [t_claim, c]
    table = report.claims_table(both, gates.decide(both, [], 3, 12), 3, 12)
    assert f"CI: {stats.CI_METHOD}; bootstrap." in table
    alone = report.claims_table([t_claim], gates.decide([t_claim], [], 3, 12), 3, 12)
    assert f"CI: {stats.CI_METHOD}.\n" in alone  # as before


def test_seeds_text_lists_the_seeds_per_group_of_arms():
    same = pd.DataFrame({"arm": ["a", "a", "b", "b"], "seed": [0, 1, 1, 0]})
    assert report.seeds_text(same) == "0, 1 for every arm"
    rows = [("init/x", s) for s in range(4)] + [(a, s) for a in ("p", "q", "r") for s in (0, 1)]
    mixed = pd.DataFrame(rows, columns=["arm", "seed"])
    assert report.seeds_text(mixed) == "0, 1, 2, 3 for init/x; 0, 1 for the other 3 arms"
    # an arm whose jobs at one swept value ran more seeds than at another: listed per value
    jobs = pd.DataFrame(
        [("bn", s, f"norm=batchnorm per_device={b} seed={s}") for b in (32, 2) for s in range(5)]
        + [("bn", s, f"norm=batchnorm per_device=8 seed={s}") for s in range(3)]
        + [
            (n, s, f"norm={n} per_device={b} seed={s}")
            for n in ("gn", "ln")
            for b in (32, 2)
            for s in range(3)
        ],
        columns=["arm", "seed", "overrides"],
    )
    assert report.seeds_text(jobs) == (
        "0, 1, 2, 3, 4 for bn (per_device=2), bn (per_device=32); 0, 1, 2 for the other 3 arms"
    )
    # the arm's own name among its overrides (`arm=${...}`, which older jobs lack) is no setting
    named = pd.DataFrame([("up/d6", s, f"depth=6 seed={s}" + (" arm=up/${d}" if s > 2 else ""))
                          for s in range(5)] + [("up/d9", s, f"depth=9 seed={s}") for s in (0, 1)],
                         columns=["arm", "seed", "overrides"])  # fmt: skip
    assert report.seeds_text(named) == "0, 1 for up/d9; 0, 1, 2, 3, 4 for up/d6"


# ----- bn_lenet: logs -> runs.csv -> claims -------------------------------------------------------


def _bn_run(net: str, norm: str, seed: int, acc: list[float], p50: list[list[float]]) -> Run:
    """A finished job: held-out accuracy every 20 steps and every unit's percentiles."""
    rows = [{"step": 20 * (i + 1) - 1, "val/acc": a} for i, a in enumerate(acc)]
    for t, medians in enumerate(p50):  # band width 2 around each unit's median
        row = {"step": 20 * t}
        for k, m in enumerate(medians):
            layer = "net.layers.norm3"
            row |= {f"preact/{layer}/u{k:03d}/p15": m - 1, f"preact/{layer}/u{k:03d}/p50": m,
                    f"preact/{layer}/u{k:03d}/p85": m + 1}  # fmt: skip
        rows.append(row)
    rows.append({"step": 20 * len(acc), "test/acc": acc[-1]})
    experiment = "bn_mlp" if net == "mlp" else "bn_lenet"
    arm = f"{'mlp' if experiment == 'bn_mlp' else 'lenet'}/{norm}"
    overrides = {"norm": norm, "experiment": experiment, "seed": str(seed), "arm": arm}
    return Run(overrides, "ok", Path("."),
               metrics=pd.DataFrame(rows))  # fmt: skip


def test_bn_lenet_speedup_accuracy_and_drift_per_seed():
    runs = []
    for seed in range(3):
        # no norm: 0.5 then 0.8 from evaluation 11 (step 220); smoothed over 5 evaluations it
        # reaches its best (0.8) at evaluation 15: step 300. BN: 0.5, then 0.9 from evaluation
        # 1 + seed: its smoothed curve (the mean of up to 5) is >= 0.8 at steps 20, 80, 120.
        plain = [0.5] * 10 + [0.8] * 10
        bn = [0.5] * seed + [0.9] * (20 - seed)
        bn[-1] = 0.85  # the last evaluation is the test accuracy: 0.85 vs 0.8
        # unit medians: no norm drifts by 4 (unit 0) and 2 (unit 1); BN by 0.4 and 0.2
        runs += [
            _bn_run("mlp", "none", seed, plain, [[0, 0], [2, 1], [4, 2]]),
            _bn_run("mlp", "batchnorm", seed, bn, [[0, 0], [0.2, 0.1], [0.4, 0.2]]),
        ]
    data = bn_lenet.extract(runs)
    assert set(data.columns) == set(report.RUNS_COLUMNS)
    drift = data[data["metric"] == "drift"].set_index(["arm", "seed"])["value"]
    assert drift[("mlp/none", 0)] == pytest.approx((4 / 2 + 2 / 2) / 2)  # mean over the units
    result = bn_lenet.render(data)
    mlp = [c for c in result.claims if c.claim.startswith("MLP")]
    at95, at98, half, area, accuracy, stable = mlp
    # the no-norm net's final accuracy is 0.8 (its last 5 evaluations): smoothed, it reads 0.74
    # at step 280 and 0.8 at 300, so it crosses 95% (0.76) and 98% (0.784) of it between them
    # (interpolated); BN's smoothed curve (the mean of up to 5 evaluations) is 0.9 from step 20
    # (seed 0), 0.7 at 40 and 0.7667 at 60, 0.8 at 80 (seed 1), 0.74 at 100 and 0.82 at 120
    def lerp(x0, y0, x1, y1, target):
        return x0 + (target - y0) / (y1 - y0) * (x1 - x0)

    def ratios(target):
        plain_at = lerp(280, 0.74, 300, 0.8, target)
        bn_at = [20, lerp(40, 0.7, 60, 2.3 / 3, target) if target < 2.3 / 3 else
                 lerp(60, 2.3 / 3, 80, 0.8, target), lerp(100, 0.74, 120, 0.82, target)]
        return [plain_at / b for b in bn_at]

    assert at95.values == pytest.approx(ratios(0.76))
    assert at98.values == pytest.approx(ratios(0.784))
    assert half.values == at98.values and half.region == (2.0, stats.ABOVE)
    assert at95.verdict == stats.UNDECIDED  # geometric mean 5, CI [0.5, 50]
    # area under the curves from step 20 to 400 (trapezoids of 20 steps), over 380 steps
    plain_area = (9 * 20 * 0.5 + 20 * 0.65 + 9 * 20 * 0.8) / 380
    bn0_area = (18 * 20 * 0.9 + 20 * 0.875) / 380
    assert area.values[0] == pytest.approx(100 * (bn0_area - plain_area))
    assert accuracy.values == pytest.approx([5.0, 5.0, 5.0])  # points
    assert accuracy.verdict == stats.HOLDS and stable.verdict == stats.HOLDS
    assert stable.values == pytest.approx([0.1, 0.1, 0.1])
    assert accuracy.final and accuracy.arms == ("mlp/batchnorm", "mlp/none")
    assert {c.source for c in mlp} == {"paper", "ours"}
    lenet = [c for c in result.claims if c.claim.startswith("LeNet")]
    assert all(c.verdict == stats.MISSING for c in lenet)  # no LeNet jobs


def test_a_bn_run_that_never_reaches_the_target_counts_with_a_bound_favouring_the_paper():
    x = pd.Index([20.0 * (i + 1) for i in range(20)])
    plain = pd.Series([0.5] * 10 + [0.8] * 10, index=x)
    never = pd.Series([0.5] * 20, index=x)
    # the no-norm net crosses 0.76 between steps 280 (0.74 smoothed) and 300 (0.8): at 286.7
    assert bn_lenet.steps_ratio(plain, never, 0.95) == pytest.approx((280 + 20 / 3) / (400 + 20))


# ----- gn_batch_size: logs -> runs.csv -> claims ----------------------------------------------


def _gn_run(norm: str, b: int, seed: int, error: float, fixed: bool = False) -> Run:
    overrides = {"norm": norm, "per_device": str(b), "seed": str(seed), "arm": norm}
    if fixed:
        overrides.update(batch="256", arm=gn_batch_size.FIXED)
    metrics = pd.DataFrame([{"step": 10, "test/acc": 1 - error / 100, "train/loss_epoch": 0.3}])
    return Run(overrides, "ok", Path("."), metrics=metrics)


def test_gn_batch_size_claims_from_paired_seeds():
    noise = [0.0, 0.2, -0.2]
    base = {"batchnorm": 10.0, "groupnorm": 12.0, "layernorm": 12.1, "instancenorm": 15.0}
    runs = []
    for seed, e in enumerate(noise):
        for norm, err in base.items():
            for b in (32, 16, 8, 4, 2):
                # BN +10 points at b=2; GN +0.1 at b=2, +3 at b=4; others flat
                rise = {"batchnorm": {2: 10.0}, "groupnorm": {2: 0.1, 4: 3.0}}.get(norm, {})
                own = [0.5, -0.5, 0.1][seed] if norm == "layernorm" else 0.0  # not shared
                runs.append(_gn_run(norm, b, seed, err + e + own + rise.get(b, 0.0)))
        runs += [_gn_run("batchnorm", b, seed, 10.0 + e + (5.0 if b == 2 else 0.0), fixed=True)
                 for b in (16, 8, 4, 2)]  # fmt: skip
    runs.append(Run({"norm": "groupnorm", "per_device": "2", "seed": "3"}, "failed", Path(".")))
    data = gn_batch_size.extract(runs)
    assert len(data[data["metric"] == "test/error"]) == 3 * (4 * 5 + 4)  # failed job left out
    claims = {c.claim: c for c in gn_batch_size.render(data).claims}
    verdict = {k.split(" (")[0]: c.verdict for k, c in claims.items()}
    assert verdict["BN's error rises by more than 2 points from 32 to 2 images per device"] == (
        stats.HOLDS
    )
    assert verdict["GN's error at b=2 stays within +-1 point of b=32"] == stats.HOLDS
    assert verdict["GN's error at b=4 stays within +-1 point of b=32"] == stats.FAILS
    assert verdict["GN's error is lower than BN's at b=2"] == stats.HOLDS
    assert verdict["at b=32: BN's error is lower than GN's"] == stats.HOLDS
    assert verdict["at b=32: GN's error is lower than LN's"] == "tie (within noise)"
    assert verdict["at b=32: LN's error is lower than IN's"] == stats.HOLDS
    fixed = next(c for k, c in claims.items() if k.startswith("with SGD's batch fixed"))
    assert fixed.values == pytest.approx([5.0, 5.0, 5.0]) and fixed.verdict == stats.HOLDS


def _allconv_runs(bn_rise: float, gn_rise: float) -> list[Run]:
    """All-conv jobs at b = 32, 8, 2, 3 seeds: BN rising by `bn_rise` points from 32 to 2, GN by
    `gn_rise`; a LeNet BN job beside them."""
    runs = [_gn_run("batchnorm", 32, 0, 10.0)]
    for seed, noise in enumerate([0.0, 0.3, -0.3]):
        for norm, base, rise in (("batchnorm", 9.0, bn_rise), ("groupnorm", 9.5, gn_rise)):
            for b in (32, 8, 2):
                run = _gn_run(norm, b, seed, base + noise + {32: 0.0, 8: rise / 3, 2: rise}[b])
                runs.append(replace(run, overrides={**run.overrides, "arm": f"allconv/{norm}"}))
    return runs


@pytest.mark.parametrize(
    ("bn_rise", "gn_rise", "verdicts"),
    [
        (6.0, 0.2, [stats.HOLDS, stats.HOLDS, stats.HOLDS]),  # the paper's picture
        (-1.0, 3.0, [stats.FAILS, stats.FAILS, stats.FAILS]),  # LeNet's: BN flat, GN rising
    ],
)
def test_gn_batch_size_allconv_claims(bn_rise, gn_rise, verdicts):
    data = gn_batch_size.extract(_allconv_runs(bn_rise, gn_rise))
    ac = data[data["arm"].str.startswith("allconv/") & (data["metric"] == "test/error")]
    assert sorted(ac["x"].unique()) == [2, 8, 32] and len(ac) == 2 * 3 * 3
    result = gn_batch_size.render(data)
    claims = [c for c in result.claims if c.claim.startswith("all-conv net: ")]
    rise, flat, lower = claims
    assert [c.verdict for c in claims] == verdicts
    assert rise.values == pytest.approx([bn_rise] * 3)
    assert flat.values == pytest.approx([gn_rise] * 3)
    assert lower.values == pytest.approx([9.0 + bn_rise - 9.5 - gn_rise] * 3)
    assert rise.arms == ("allconv/batchnorm/b32", "allconv/batchnorm/b2") and rise.final
    assert flat.arms == ("allconv/groupnorm/b32", "allconv/groupnorm/b2") and flat.final
    assert lower.arms == ("allconv/batchnorm/b2", "allconv/groupnorm/b2") and lower.final
    assert [c.source for c in claims] == ["ours", "ours", "paper"]
    assert "34.7" in rise.paper_number and "10.6 points lower" in lower.paper_number
    assert any(n.startswith("All-conv net") for n in result.notes)
    # gates per arm and b only: allconv/batchnorm's '/b' is not a b
    shown = {g.arm for g in result.gates if g.arm.startswith("allconv/")}
    assert shown == {f"allconv/{n}/b{b}" for n in ("batchnorm", "groupnorm") for b in (32, 8, 2)}
    assert len(result.figure.axes) == 5
    panel = result.figure.axes[4]
    assert panel.get_title().startswith("all-conv net")
    legend = sorted(t.get_text() for t in panel.get_legend().get_texts())
    assert legend == ["BN (3 seeds)", "GN (3 seeds)"]
    plt.close(result.figure)
    # LeNet's claims are not the all-conv net's: its BN has one job, at b=32
    lenet = next(c for c in result.claims if c.claim.startswith("BN's error rises"))
    assert lenet.values == []


def test_gn_batch_size_compares_only_jobs_that_trained_the_same_epochs():
    """A grid landing a share at a time: b=32 already at the pilot's 32 epochs, b=8 and b=2
    still at the old 2. A claim across the two budgets is not comparable (its gap would measure
    the budget); one within a budget is read; one arm's seeds at two budgets are not read."""

    def at(run: Run, epochs: str) -> Run:
        return replace(run, overrides={**run.overrides, "trainer.max_epochs": epochs})

    runs = [at(r, "32" if r.get("per_device") == "32" else "2") for r in _allconv_runs(6.0, 0.2)]
    result = gn_batch_size.render(gn_batch_size.extract(runs))
    rise, flat, lower = [c for c in result.claims if c.claim.startswith("all-conv net: ")]
    assert rise.verdict == ("not comparable: its jobs trained different epochs "
                            "(allconv/batchnorm/b32: 32; allconv/batchnorm/b2: 2)")  # fmt: skip
    assert flat.verdict.startswith("not comparable") and lower.verdict == stats.HOLDS
    runs = [at(r, "32") if r.get("seed") == "2" and r.get("per_device") == "2" else r
            for r in runs]  # fmt: skip
    lower = gn_batch_size.render(gn_batch_size.extract(runs)).claims[-1]
    assert lower.claim.startswith("all-conv net: GN's error is lower")
    assert lower.verdict == (
        "not comparable: its jobs trained different epochs "
        "(allconv/batchnorm/b2: 2, 32; allconv/groupnorm/b2: 2, 32)"
    )
    plt.close("all")


def test_gn_batch_size_with_one_allconv_norm_run_reads_its_own_claim_only():
    """A share of one norm's all-conv grid on a fresh root (the README's --grids allconv/bn
    --subset per_device=2): BN's rise is read, the comparisons with GN have no values."""
    runs = [r for r in _allconv_runs(6.0, 0.2) if r.arm != "allconv/groupnorm"]
    result = gn_batch_size.render(gn_batch_size.extract(runs))
    rise, flat, lower = [c for c in result.claims if c.claim.startswith("all-conv net: ")]
    assert rise.values == pytest.approx([6.0] * 3) and flat.values == lower.values == []
    plt.close("all")


def test_gn_batch_size_without_allconv_jobs_has_no_allconv_claims_or_panel():
    runs = [_gn_run(norm, b, seed, 10.0 + seed) for norm in ("batchnorm", "groupnorm")
            for b in (32, 2) for seed in range(3)]  # fmt: skip
    result = gn_batch_size.render(gn_batch_size.extract(runs))
    assert not any("all-conv" in c.claim for c in result.claims)
    assert not any("All-conv" in n for n in result.notes) and len(result.figure.axes) == 4
    plt.close(result.figure)


def _pilot_run(
    norm: str, epochs: int, train: list[float], val: list[float], prefix: str = "pilot/"
) -> Run:
    """A pilot job at b=32: its train loss logged every 10 steps, its val loss each epoch."""
    steps = len(train) * 10
    rows = [{"step": 10 * i + 9, "train/loss_step": v} for i, v in enumerate(train)]
    rows += [{"step": (k + 1) * steps // len(val) - 1, "val/loss": v} for k, v in enumerate(val)]
    rows.append({"step": steps - 1, "test/acc": 0.9, "train/loss_epoch": train[-1]})
    overrides = {"norm": norm, "per_device": "32", "seed": "0", "arm": f"{prefix}{norm}",
                 "trainer.max_epochs": str(epochs)}  # fmt: skip
    return Run(overrides, "ok", Path("."), metrics=pd.DataFrame(rows))


def test_gn_batch_size_pilot_picks_the_fewest_epochs_every_norm_passes_the_converged_gate():
    """The pilot holds each budget's job to gates.converged: at 8 epochs BN's train and held-out
    losses still fall; at 16 its train loss still falls (memorizing) but its held-out loss is
    flat, GN's losses are flat: 16 is the budget."""
    falling, flat = list(np.linspace(1.0, 0.2, 50)), [1.0] * 10 + [0.3] * 40
    held_falling, held_flat = list(np.linspace(0.5, 0.3, 10)), [0.5] * 3 + [0.3] * 7
    runs = [
        _pilot_run("bn", 8, falling, held_falling),
        _pilot_run("gn", 8, flat, held_flat),
        _pilot_run("bn", 16, falling, held_flat),
        _pilot_run("gn", 16, flat, held_flat),
    ]
    data = gn_batch_size.extract(runs)
    table = gn_batch_size.pilot(data)
    passed = {(r.arm, r.epochs): r.gate.passed for r in table.itertuples()}
    assert passed == {("pilot/bn", 8.0): False, ("pilot/bn", 16.0): True,
                      ("pilot/gn", 8.0): True, ("pilot/gn", 16.0): True}  # fmt: skip
    assert gn_batch_size.pilot_epochs(table) == 16
    assert gn_batch_size.pilot_epochs(table[table["epochs"] == 8]) != 8  # NaN: none passes
    section = gn_batch_size.render(data).sections["Pilot: the budget at which b=32 converges"]
    assert "every norm passes: 16" in section and "held-out loss's" in section
    plt.close("all")


def test_gn_batch_size_each_net_has_its_own_pilot_and_budget():
    """The all-conv net's pilot picks its own budget (8: BN's held-out loss flat there) beside
    LeNet's (16), each in its own table; neither net's jobs count in the other's pick."""
    falling, flat = list(np.linspace(1.0, 0.2, 50)), [1.0] * 10 + [0.3] * 40
    held_falling, held_flat = list(np.linspace(0.5, 0.3, 10)), [0.5] * 3 + [0.3] * 7
    ac = gn_batch_size.ALLCONV_PILOT
    runs = [
        _pilot_run("bn", 8, falling, held_falling),
        _pilot_run("bn", 16, flat, held_flat),
        _pilot_run("bn", 8, falling, held_flat, ac),
        _pilot_run("gn", 8, flat, held_flat, ac),
        _pilot_run("gn", 4, falling, held_falling, ac),
    ]
    data = gn_batch_size.extract(runs)
    lenet, allconv = gn_batch_size.pilot(data), gn_batch_size.pilot(data, "allconv")
    assert set(lenet["arm"]) == {"pilot/bn"} and set(allconv["arm"]) == {ac + "bn", ac + "gn"}
    assert gn_batch_size.pilot_epochs(lenet) == 16 and gn_batch_size.pilot_epochs(allconv) == 8
    section = gn_batch_size.render(data).sections["Pilot: the budget at which b=32 converges"]
    lenet_part, allconv_part = section.split("**All-conv net**")
    assert "`--grids pilot/bn`" in lenet_part and "every norm passes: 16" in lenet_part
    assert f"`--grids {ac}bn,{ac}gn`" in allconv_part and "every norm passes: 8" in allconv_part
    plt.close("all")


@pytest.mark.parametrize(("epochs", "words"), [(16, "16 epochs, the pilot's budget"),
                                               (2, "2 epochs (the pilot's: 16)")])  # fmt: skip
def test_gn_batch_size_notes_give_the_jobs_budget_from_their_logs(epochs, words):
    """The notes' budget: the jobs' epochs, against the pilot's pick, and their SGD steps."""
    flat = [1.0] * 10 + [0.3] * 40
    runs = [_pilot_run("bn", 16, flat, [0.3] * 10), _pilot_run("gn", 16, flat, [0.3] * 10)]
    for b, steps in ((32, 500), (2, 8000)):
        metrics = pd.DataFrame([{"step": steps, "test/acc": 0.9, "train/loss_epoch": 0.3}])
        overrides = {"norm": "batchnorm", "per_device": str(b), "seed": "0", "arm": "batchnorm",
                     "trainer.max_epochs": str(epochs)}  # fmt: skip
        runs.append(Run(overrides, "ok", Path("."), metrics=metrics))
    notes = gn_batch_size.render(gn_batch_size.extract(runs)).notes
    budget = f"{words} (500 SGD steps at b=32, 8,000 at b=2)"
    assert any(note.startswith(f"{words[0].upper()}{words[1:]}") for note in notes), notes
    assert sum(budget in note for note in notes) == 2  # the setup note and the b=32-to-2 note
    plt.close("all")


# ----- ln_placement: logs -> runs.csv -> claims -------------------------------------------------


def _init_run(placement: str, depth: int, seed: int, slope: float) -> Run:
    """An init job whose W2 gradient norms grow by exp(slope) a layer (U-shaped on top)."""
    bend = [0.3 * (i - (depth - 1) / 2) ** 2 / depth for i in range(depth)]  # no slope of its own
    norms = {f"grad_init/block_{i:02d}/w2": 0.1 * math.exp(slope * i + bend[i])
             for i in range(depth)}  # fmt: skip
    overrides = {"experiment": "ln_placement_init", "placement": placement,
                 "model.net.depth": str(depth), "seed": str(seed),
                 "arm": f"init/{placement}/d{depth}"}  # fmt: skip
    return Run(overrides, "ok", Path("."), metrics=pd.DataFrame([{"step": 0, **norms}]))


def _lm_run(placement: str, lr: str, warmup: int, seed: int, final: float, status="ok") -> Run:
    """A warmup job: val loss 3.5 after 50 steps and `final` after 100."""
    overrides = {"experiment": "ln_placement", "placement": placement, "optim.optimizer.lr": lr,
                 "optim.warmup_steps": str(warmup), "seed": str(seed),
                 "arm": f"{placement}/lr{float(lr):g}/w{warmup}"}  # fmt: skip
    rows = [{"step": 49, "val/loss": 3.5}, {"step": 99, "val/loss": final}]
    return Run(overrides, status, Path("."), metrics=pd.DataFrame(rows))


def _verdicts(result: report.Result) -> dict[str, str]:
    return {c.claim.split(":")[0]: c.verdict for c in result.claims}


def test_ln_placement_slopes_of_the_gradient_at_init_per_seed():
    slopes = {("post", 6): [0.10, 0.12, 0.08], ("pre", 6): [-0.10, -0.12, -0.08],
              ("post", 12): [-0.05, 0.05, 0.0], ("pre", 12): [0.20, 0.25, 0.22]}  # fmt: skip
    runs = [_init_run(p, d, seed, b) for (p, d), bs in slopes.items() for seed, b in enumerate(bs)]
    data = ln_placement.extract(runs)
    assert sorted(data["x"].unique()) == list(range(1, 13))  # layer index from 1
    assert set(data["arm"]) == {"init/post/d6", "init/pre/d6", "init/post/d12", "init/pre/d12"}
    result = ln_placement.render(data)
    claims = {c.claim.split(":")[0]: c for c in result.claims}
    for (placement, depth), expected in slopes.items():
        name = f"{ln_placement.PLACEMENTS[placement]}, GPT, depth {depth}"
        assert claims[name].values == pytest.approx(expected)  # the U-shape adds no slope
    verdicts = _verdicts(result)
    assert verdicts["Post-LN, GPT, depth 6"] == stats.HOLDS  # CI above 0
    assert verdicts["Pre-LN, GPT, depth 6"] == stats.FAILS  # CI below -0.05: it shrinks
    assert verdicts["Post-LN, GPT, depth 12"] == stats.UNDECIDED  # CI contains 0
    assert verdicts["Pre-LN, GPT, depth 12"] == stats.FAILS  # CI above 0.05
    flat = claims_mod.thresholds("ln_placement")["max_pre_slope"]  # as declared
    band = (-flat, flat)  # flat: two-sided
    assert claims["Pre-LN, GPT, depth 6"].region == band
    plt.close(result.figure)


def test_ln_placement_warmup_gap_with_a_diverged_run_and_the_best_lrs(tmp_path: Path):
    final = {  # (placement, lr, warmup) -> final val loss per seed
        ("post", "5e-4", 0): [2.30, 2.31, 2.29], ("post", "5e-4", 100): [2.30, 2.30, 2.30],
        ("post", "1e-3", 0): [math.nan, 4.15, 4.20], ("post", "1e-3", 100): [2.20, 2.21, 2.19],
        ("pre", "5e-4", 0): [2.10, 2.10, 2.10], ("pre", "5e-4", 100): [2.12, 2.11, 2.10],
        ("pre", "1e-3", 0): [2.00, 2.50, 2.50], ("pre", "1e-3", 100): [2.40, 2.40, 2.40],
    }  # fmt: skip
    runs = [
        _lm_run(p, lr, w, seed, v, "diverged" if math.isnan(v) else "ok")
        for (p, lr, w), values in final.items()
        for seed, v in enumerate(values)
    ]
    runs.append(_lm_run("pre", "5e-4", 0, 3, 9.9, status="failed"))  # left out
    data = ln_placement.extract(runs)
    assert set(data["arm"]) == {f"{p}/lr{float(lr):g}/w{w}" for p, lr, w in final}
    curve = data[(data["arm"] == "post/lr0.001/w100") & (data["metric"] == "val/loss")]
    assert list(curve[curve["seed"] == 0]["x"]) == [50.0, 100.0]  # steps trained
    data = data[~data["metric"].str.startswith("gate/")]  # runs from before the gates: the gap
    path = tmp_path / "runs.csv"  # render reads runs.csv as written: NaN as an empty cell
    data.to_csv(path, index=False, float_format=report.FLOAT)
    result = ln_placement.render(pd.read_csv(path))
    claims = {c.claim.split(":")[0]: c for c in result.claims}
    diverged = ln_placement.DIVERGED_LOSS  # ln 65, a uniform prediction's loss
    gap = claims["Post-LN needs warmup at lr 0.001"]
    assert gap.values == pytest.approx([diverged - 2.20, 4.15 - 2.21, 4.20 - 2.19], abs=1e-5)
    assert gap.verdict == stats.HOLDS
    assert claims["Post-LN needs warmup at lr 0.0005"].verdict == stats.FAILS  # CI below 0.05
    some = claims["Post-LN needs warmup at some lr (its val loss gap)"]
    assert some.verdict == stats.HOLDS and some.deciding == "lr 0.001"
    # best lrs by the mean over seeds: Pre-LN 5e-4 (2.10 vs 2.33), Post-LN 1e-3 (2.20 vs 2.30)
    reach = next(c for c in result.claims if c.claim.startswith("Pre-LN without warmup"))
    assert "Pre-LN at lr 0.0005, Post-LN at lr 0.001" in reach.quantity
    assert reach.values == pytest.approx([-0.10, -0.11, -0.09], abs=1e-5)
    assert reach.verdict == stats.HOLDS and reach.region == (
        stats.BELOW, claims_mod.thresholds("ln_placement")["pre_margin"])
    assert any("post/lr0.001/w0 seeds [0]" in note for note in result.notes)
    plt.close(result.figure)


def test_ln_placement_claims_no_gap_over_fewer_than_three_seeds_that_trained_in_both():
    # gate rows (these runs' trivial loss: ln 10 = 2.303): a final val loss of 2.30 did not train
    final = {  # (lr, warmup) -> Post-LN's final val loss per seed
        ("5e-4", 0): [1.60, 1.62, 1.61, 1.63], ("5e-4", 100): [1.50, 1.51, 1.52, 1.50],
        ("1e-3", 0): [2.30, 2.30, 2.30, 1.60], ("1e-3", 100): [1.50, 2.30, 1.50, 1.50],
    }  # fmt: skip
    runs = [_lm_run("post", lr, w, seed, v) for (lr, w), values in final.items()
            for seed, v in enumerate(values)]  # fmt: skip
    result = ln_placement.render(ln_placement.extract(runs))
    names = [c.claim for c in result.claims]
    assert "Post-LN at lr 0.0005, seeds that trained in both" in " ".join(names)  # 4 of 4
    assert not any(n.startswith("Post-LN at lr 0.001, seeds that trained") for n in names)
    count = next(c for c in result.claims if c.claim.startswith("Post-LN at lr 0.001: without"))
    assert count.counts == (3, 4, 1, 4)  # still tested: 3 of 4 failed without warmup, 1 with
    assert any("lr 0.001 (1 of 4: seed 3)" in note for note in result.notes)
    some = next(c for c in result.claims if "at some lr" in c.claim)
    assert "lr 0.001" not in some.rule
    plt.close(result.figure)


def _update_run(placement: str, depth: int, warmup: int, seed: int, first: float) -> Run:
    """An update job: update_norm `first` after step 1, then growing 10% a step for 49 steps."""
    overrides = {"experiment": "deepnorm_update", "placement": placement,
                 "model.net.depth": str(depth), "optim.warmup_steps": str(warmup),
                 "seed": str(seed), "arm": f"update/{placement}/d{depth}/w{warmup}"}  # fmt: skip
    rows = [{"step": t, "update_norm": first * 1.1 ** (t - 1)} for t in range(1, 51)]
    return Run(overrides, "ok", Path("."), metrics=pd.DataFrame(rows))


def _depth_run(placement: str, depth: int, seed: int, final: float, status="ok") -> Run:
    overrides = {"experiment": "deepnorm_depth", "placement": placement,
                 "model.net.depth": str(depth), "seed": str(seed),
                 "arm": f"{placement}/d{depth}"}  # fmt: skip
    rows = [{"step": 149, "val/loss": 3.0}, {"step": 299, "val/loss": final}]
    return Run(overrides, status, Path("."), metrics=pd.DataFrame(rows))


def test_deepnorm_depth_update_ratios_within_seeds_and_the_deep_loss_gap(tmp_path: Path):
    noise = [1.0, 1.1, 0.9]  # per seed, shared by the arms of a seed: ratios cancel it
    post = {6: 0.03, 18: 0.1, 50: 0.3}  # grows 10x from 6 to 50 (no warmup)
    deep = {6: 0.003, 18: 0.004, 50: 0.005}  # grows 1.67x: bounded, 1/60 of Post-LN's at 50
    runs = [
        _update_run(p, d, w, seed, table[d] * n * (0.01 if w else 1.0))
        for p, table in (("post", post), ("deepnorm", deep))
        for d in table
        for w in (0, 100)
        for seed, n in enumerate(noise)
    ]
    # with warmup, Post-LN does not grow at depth 18 in seed 2: "rises with depth" fails there
    runs = [r for r in runs if r.overrides != _update_run("post", 18, 100, 2, 0).overrides]
    runs.append(_update_run("post", 18, 100, 2, 0.03 * 0.9 * 0.01 * 0.5))
    losses = {("post", 6): [2.0, 2.1, 1.9], ("deepnorm", 6): [2.05, 2.1, 2.0],
              ("post", 50): [math.nan, 4.0, 4.1], ("deepnorm", 50): [2.2, 2.3, 2.2]}  # fmt: skip
    runs += [
        _depth_run(p, d, seed, v, "diverged" if math.isnan(v) else "ok")
        for (p, d), values in losses.items()
        for seed, v in enumerate(values)
    ]
    data = deepnorm_depth.extract(runs)
    path = tmp_path / "runs.csv"
    data.to_csv(path, index=False, float_format=report.FLOAT)
    result = deepnorm_depth.render(pd.read_csv(path))
    claims = {c.claim: c for c in result.claims}
    assert len(claims) == 11
    grows = claims[
        "no warmup: Post-LN's early update at depth 50 is at least 2x its update at depth 6"
    ]
    assert grows.values == pytest.approx([10.0] * 3, rel=1e-4) and grows.verdict == stats.HOLDS
    assert grows.log and grows.interval.mean == pytest.approx(10.0, rel=1e-4)
    rises = claims["no warmup: Post-LN's early update rises with depth (6, 18, 50)"]
    assert rises.values == pytest.approx([3.0] * 3, rel=1e-4) and rises.verdict == stats.HOLDS
    warm_rises = claims["100 warmup steps: Post-LN's early update rises with depth (6, 18, 50)"]
    assert warm_rises.values[2] == pytest.approx(0.5, rel=1e-4)
    assert warm_rises.verdict == stats.UNDECIDED  # two seeds rise 3.33x, one falls to 0.5x
    below = claims["no warmup: DeepNorm's early update at depth 50 is no larger than Post-LN's at "
                   "depth 6"]  # fmt: skip
    assert below.values == pytest.approx([0.005 / 0.03] * 3, rel=1e-4)
    assert below.verdict == stats.HOLDS
    share = claims["no warmup: DeepNorm's early update at depth 50 is at most 0.2x Post-LN's at "
                   "depth 50"]  # fmt: skip
    assert share.verdict == stats.HOLDS and share.region == (stats.BELOW, 0.2)
    own = claims["no warmup: DeepNorm's early update grows less than 2x from depth 6 to 50 (the "
                 "bound does not depend on depth)"]  # fmt: skip
    assert own.values == pytest.approx([0.005 / 0.003] * 3, rel=1e-4)
    assert own.verdict == stats.HOLDS
    loss = claims["at depth 50 DeepNorm reaches a lower val loss than Post-LN"]
    assert loss.values == pytest.approx(
        [deepnorm_depth.DIVERGED_LOSS - 2.2, 1.7, 1.9], abs=1e-5
    )  # the diverged seed counts at ln 65
    assert loss.verdict == stats.HOLDS
    assert any("post/d50 seeds [0]" in note for note in result.notes)
    assert any("rose at every step in depth (6 < 18 < 50) in 2 of 3 seeds" in n
               for n in result.notes)  # fmt: skip
    plt.close(result.figure)


def test_deepnorm_depth_a_bounded_post_ln_fails_the_growth_claims():
    runs = [
        _update_run(p, d, 0, seed, first * n)
        for p, first in (("post", 0.03), ("deepnorm", 0.03))  # equal and flat in depth
        for d in (6, 18, 50)
        for seed, n in enumerate([1.0, 1.05, 0.95])
    ]
    result = deepnorm_depth.render(deepnorm_depth.extract(runs))
    verdicts = {c.claim: c.verdict for c in result.claims}
    assert verdicts["no warmup: Post-LN's early update at depth 50 is at least 2x its update at "
                    "depth 6"] == stats.FAILS  # fmt: skip
    assert verdicts["no warmup: DeepNorm's early update at depth 50 is at most 0.2x Post-LN's at "
                    "depth 50"] == stats.FAILS  # fmt: skip
    plt.close(result.figure)


# a reproduction's analysis where a test needs none: arm, extract, render
ANALYSIS = (pd.DataFrame, lambda data: None)


# ----- sweeps of a reproduction ---------------------------------------------------------------


def test_train_args_sweep_dirs_and_grid_values(tmp_path: Path):
    grid = Grid(
        "bn", "gn_batch_size", ("norm=batchnorm", "per_device=16,8"), quick=("per_device=2",)
    )
    budget = Budget(("trainer.max_epochs=1", "per_device=32,2"), "quick")
    assert sweep_dir(tmp_path, "demo", True, "bn") == tmp_path / "outputs/reproduce/demo-quick/bn"
    assert sweep_dir(tmp_path, "demo", False) == tmp_path / "outputs/reproduce/demo"
    args = train_args(grid, budget, True, tmp_path / "s", jobs=2, seeds=seed_override(2))
    # the seeds first (the slowest key of the sweep: it runs seed by seed); a later value of a
    # key replaces an earlier one, in the earlier one's place
    assert args[:6] == ["-m", "experiment=gn_batch_size", "seed=0,1", "norm=batchnorm",
                        "per_device=2", "trainer.max_epochs=1"]  # fmt: skip
    assert "hydra/launcher=joblib" in args and f"hydra.sweep.dir={tmp_path / 's'}" in args
    assert task_overrides(grid, budget, True) == {
        "experiment": "gn_batch_size", "norm": "batchnorm", "per_device": "2",
        "trainer.max_epochs": "1",
    }  # fmt: skip
    values = grid_values(grid, budget, False, seeds=3)
    assert values == {"per_device": ["32", "2"], "seed": ["0", "1", "2"]}
    run = Run({"per_device": "2", "seed": "1", "norm": "batchnorm"}, "ok", tmp_path)
    assert in_grid(run, values)
    assert not in_grid(replace(run, overrides={**run.overrides, "per_device": "7"}), values)
    assert not in_grid(replace(run, overrides={"per_device": "2"}), values)  # seed missing
    with pytest.raises(ValueError):
        seed_override(0)


def test_a_grid_with_its_own_seeds_keeps_them_under_the_full_budget(tmp_path, monkeypatch):
    own = Grid("init", "ln_placement_init", seeds=10)
    other = Grid("bn", "gn_batch_size", ("norm=batchnorm",))
    assert (own.seed_count(3, False), other.seed_count(3, False)) == (10, 3)
    assert own.seed_count(2, True) == 2  # --quick, a smoke test: --seeds for every grid,
    pilot = Grid("pilot", "gn_batch_size", seeds=1)  # a pilot of fewer seeds on its own
    assert (pilot.seed_count(2, True), pilot.seed_count(3, False)) == (1, 1)
    assert own.seed_count(None, False) is None  # a reproduction without seeds
    repro = Reproduction("demo", "t", (own, other), Budget((), "f"), Budget((), "q"), *ANALYSIS)
    commands = []
    monkeypatch.setattr(sweep, "run_child", lambda cmd, env: commands.append(cmd) or 0)
    sweep.run(repro, False, tmp_path, jobs=1, seeds=3)
    sweep.run(repro, True, tmp_path, jobs=1, seeds=2)
    # one process per call, its train.py arguments per grid (normlab.sweep.multiruns)
    assert all(cmd[1:3] == ["-m", "normlab.sweep.multiruns"] for cmd in commands)
    grids = [args for cmd in commands for args in json.loads(cmd[-1])]
    seeds = [[a for a in args if a.startswith("seed=")] for args in grids]
    assert seeds == [["seed=0,1,2,3,4,5,6,7,8,9"], ["seed=0,1,2"], ["seed=0,1"], ["seed=0,1"]]
    init = sweep.sweep_dir(tmp_path, "demo", False, "init")
    for seed in range(12):  # seeds 10 and 11: left by an earlier grid with more seeds
        overrides = f"placement=post model.net.depth=6 experiment=ln_placement_init seed={seed}"
        summary.update_row(init, {"job": seed, "overrides": overrides, "status": "ok",
                                  "run_dir": str(tmp_path / str(seed))})  # fmt: skip
    found = sweep.runs(repro, False, tmp_path, seeds=3)
    assert sorted(int(r.get("seed")) for r in found) == list(range(10))


def test_jobs_frame_has_one_row_per_job_with_its_identity(gn_sweep: Path):
    runs = load_sweep(gn_sweep)
    for r in runs:
        r.overrides["seed"] = "0"
    for r in runs:
        r.overrides["arm"] = r.get("norm")
    jobs = jobs_frame(runs)
    assert set(jobs["arm"]) == {r.get("norm") for r in runs}
    assert list(jobs.columns) == report.JOBS_COLUMNS and len(jobs) == 5
    assert jobs["error"].tolist().count("RuntimeError: boom") == 1


# ----- rmsnorm_speed: logs -> runs.csv -> claims ------------------------------------------------


def _speed_run(norm: str, threads: int, seed: int, ratio: float, status: str = "ok") -> Run:
    """A speed job: 301 timed pairs from step 10, LayerNorm's twin at 100 + seed ms and the norm's
    twin at `ratio` +- 0.05 (evenly spread: every repeat's median ratio is `ratio`)."""
    base = 100.0 + seed
    ratios = ratio + np.linspace(-0.05, 0.05, 301)[::-1]
    rows = [{"step": 0, "lr-AdamW/pg1": 1e-5}]  # a row of another metric: not a pair
    rows += [{"step": 10 + i, "time/model_step_ms": r * base, "time/baseline_step_ms": base,
              "time/baseline_first": float(i % 2)} for i, r in enumerate(ratios)]  # fmt: skip
    overrides = {"experiment": "rmsnorm_speed", "norm": norm, "num_threads": str(threads),
                 "seed": str(seed), "arm": f"speed/{norm}/t{threads}"}  # fmt: skip
    return Run(overrides, status, Path("."), metrics=pd.DataFrame(rows))


def _quality_run(norm: str, seed: int, final: float) -> Run:
    overrides = {"experiment": "rmsnorm_quality", "norm": norm, "seed": str(seed),
                 "arm": f"quality/{norm}"}  # fmt: skip
    rows = [{"step": 299, "val/loss": 3.0}, {"step": 599, "val/loss": final}]
    return Run(overrides, "ok", Path("."), metrics=pd.DataFrame(rows))


def test_rmsnorm_speed_bootstrap_median_ratios_and_paired_val_loss(tmp_path: Path):
    ratio = {("layernorm", 1): 1.0, ("layernorm", 2): 1.0, ("rmsnorm", 1): 0.85,
             ("rmsnorm", 2): 1.0, ("prmsnorm", 1): 0.93, ("prmsnorm", 2): 0.96}  # fmt: skip
    runs = [_speed_run(n, t, seed, r) for (n, t), r in ratio.items() for seed in range(3)]
    runs[-1] = _speed_run("prmsnorm", 2, 2, 0.5, status="failed")  # left out: 2 repeats
    ln = [2.40, 2.45, 2.42]
    gaps = {"layernorm": [0.0] * 3, "rmsnorm": [0.01, 0.012, 0.008], "prmsnorm": [0.2, 0.21, 0.19]}
    runs += [_quality_run(n, s, ln[s] + g[s]) for n, g in gaps.items() for s in range(3)]
    data = rmsnorm_speed.extract(runs)
    assert set(data.columns) == set(report.RUNS_COLUMNS)
    speed = data[data["arm"].str.startswith("speed/")]
    assert len(speed) == (6 * 3 - 1) * 301 * 3  # pairs x (both times, which went first)
    assert set(speed["x"]) == set(range(10, 311))  # the run's steps
    path = tmp_path / "runs.csv"
    data.to_csv(path, index=False, float_format=report.FLOAT)
    result = rmsnorm_speed.render(pd.read_csv(path))
    claims = {c.claim: c for c in result.claims}
    faster = "trains faster than LayerNorm by at least the paper's smallest gain (7%)"
    rms1, rms2 = claims[f"RMSNorm {faster}, 1 thread"], claims[f"RMSNorm {faster}, 2 threads"]
    prms1, prms2 = claims[f"pRMSNorm {faster}, 1 thread"], claims[f"pRMSNorm {faster}, 2 threads"]
    assert rms1.interval.mean == pytest.approx(0.85, abs=1e-5) and rms1.verdict == stats.HOLDS
    assert rms1.interval.n == 3 and rms1.interval.high < 0.93
    assert rms2.verdict == stats.FAILS and rms2.interval.low > 0.93  # CI wholly above 0.93
    assert prms1.interval.mean == pytest.approx(0.93, abs=1e-5)
    assert prms1.interval.low < 0.93 < prms1.interval.high and prms1.verdict == stats.UNDECIDED
    assert prms2.interval.n == 2 and prms2.verdict == stats.FAILS
    assert rms1.region == (stats.BELOW, 0.93) and "bootstrap" in rms1.ci_method
    comparable = "val loss is within 0.05 nats of LayerNorm's (comparable quality)"
    rms_q, prms_q = claims[f"RMSNorm's {comparable}"], claims[f"pRMSNorm's {comparable}"]
    assert rms_q.values == pytest.approx(gaps["rmsnorm"], abs=1e-5)
    assert rms_q.verdict == stats.HOLDS and rms_q.region == (-0.05, 0.05)
    assert prms_q.verdict == stats.FAILS and "after 600 steps" in prms_q.quantity
    control = next(n for n in result.notes if n.startswith("LayerNorm (control), 1 thread"))
    assert "seed 0: 1.000, seed 1: 1.000, seed 2: 1.000" in control
    assert "stepped first in 450 of 903 pairs" in control  # odd pairs: 150 a repeat
    again = rmsnorm_speed.render(pd.read_csv(path))  # a redraw: the same bootstrap draws
    assert [c.row() for c in again.claims] == [c.row() for c in result.claims]
    plt.close(result.figure)
    plt.close(again.figure)
    assert runs[0].arm == "speed/layernorm/t1"
    assert runs[-1].arm == "quality/prmsnorm"


# ----- dit_conditioning: logs -> runs.csv -> claims ---------------------------------------------


def _dit_run(root: Path, conditioning: str, seed: int, fid: float, loss: float,
             resampled: float | None = None, depth: int = 4, eps: float = 1e-6) -> Run:  # fmt: skip
    """A finished DiT job: its config (fid settings, depth), val loss per epoch and final fid;
    at a depth other than 4, a job of the deep grid (arm deep/<conditioning>)."""
    arm = conditioning if depth == 4 else dit_conditioning.DEEP + conditioning
    run_dir = root / f"{arm.replace('/', '-')}-{seed}"
    (run_dir / ".hydra").mkdir(parents=True)
    fid_cfg = {"num_samples": 5000, "steps": None, "guidance_scale": 1.0, "seed": 0}
    net = {"hidden_size": 96, "depth": depth, "num_heads": 4, "patch_size": 4}
    if seed == 2 and depth == 4:  # a config from before the shapes were explicit: tiny's depth
        net = {"size": "tiny", "depth": None}
    net["conditioning"], net["norm_eps"] = conditioning, eps
    cfg = {"callbacks": {"fid": fid_cfg}, "model": {"sample_steps": 25, "guidance_scale": 1.5,
                                                    "net": net},
           "optim": {"schedule": "cosine", "warmup_steps": 0, "min_lr_ratio": 0.0}}  # fmt: skip
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    if resampled is not None:
        (run_dir / dit_conditioning.RESAMPLE_FILE).write_text(f'{{"fid_lenet": {resampled}}}\n')
    metrics = pd.DataFrame(
        [
            {"step": 299, "val/loss": loss + 0.05},
            {"step": 599, "val/loss": loss, "val/fid_lenet": fid},
            # a train loss flat over its last 40% of steps: the converged gate passes
            *({"step": s, "train/loss_step": loss + 0.05 * (s < 360)} for s in range(0, 600, 20)),
        ]
    )
    overrides = {"experiment": "dit_conditioning", dit_conditioning.KEY: conditioning,
                 "seed": str(seed), "arm": arm}  # fmt: skip
    return Run(overrides, "ok", run_dir, metrics=metrics)


def test_dit_conditioning_deep_grid_asks_whether_adaln_zeros_gain_grows_with_depth(tmp_path):
    """4 blocks: adaLN 2 above adaLN-Zero; 8 blocks: 4 above. The gain grows by 2 a seed, read
    only where both depths ran their norms at the same eps."""

    def runs(root: Path, deep_eps: float) -> list[Run]:
        fids = {(4, "adaln_zero"): 10.0, (4, "adaln"): 12.0, (8, "adaln_zero"): 9.0,
                (8, "adaln"): 13.0}  # fmt: skip
        return [_dit_run(root, c, s, f + [0.0, 0.3, -0.2][s] + 0.1 * s * (c == "adaln"), 0.05,
                         depth=d, eps=1e-6 if d == 4 else deep_eps)
                for (d, c), f in fids.items() for s in range(3)]  # fmt: skip

    data = dit_conditioning.extract(runs(tmp_path / "same", 1e-6))
    result = dit_conditioning.render(data)
    claims = {c.claim: c for c in result.claims}
    deep = claims["in a DiT of 8 blocks, adaLN-Zero's fid_lenet is lower than adaLN's"]
    assert deep.values == pytest.approx([4.0, 4.1, 4.2]) and deep.verdict == stats.HOLDS
    grows = claims["adaLN-Zero's fid_lenet gain over adaLN grows with depth (4 to 8 blocks)"]
    assert grows.values == pytest.approx([2.0, 2.0, 2.0]) and grows.verdict == stats.HOLDS
    assert grows.source == "ours" and set(grows.arms) == {"adaln_zero", "adaln", "deep/adaln_zero",
                                                          "deep/adaln"}  # fmt: skip
    assert {g.arm for g in result.gates} == {"adaln_zero", "adaln", "deep/adaln_zero",
                                             "deep/adaln"}  # fmt: skip
    assert any("eps 1e-06 at 4 blocks, 1e-06 at 8 blocks" in n for n in result.notes)
    assert len(result.figure.axes) == 4  # fid at 4 blocks, at 8; val and train loss curves
    plt.close(result.figure)

    apart = dit_conditioning.render(dit_conditioning.extract(runs(tmp_path / "apart", 1e-5)))
    grows = next(c for c in apart.claims if "grows with depth" in c.claim)
    assert grows.verdict == (
        "not comparable: the norms' eps differ between the arms (1e-05 vs 1e-06)"
    )
    decided = gates.decide(apart.claims, apart.gates, initial=3, cap=12)[-1]
    assert decided.verdict == decided.holm == grows.verdict  # shown, outside Holm's family
    plt.close(apart.figure)
    unrecorded = data[~((data["arm"] == "deep/adaln") & (data["metric"] == "config/norm_eps"))]
    result = dit_conditioning.render(unrecorded)
    assert result.claims[-1].verdict.startswith("not comparable: an arm's runs do not record")
    plt.close(result.figure)


def test_dit_conditioning_pairwise_ranks_ties_and_the_best_of_four(tmp_path: Path):
    fid = {"adaln_zero": 10.0, "adaln": 12.0, "cross_attn": 12.0, "in_context": 20.0}
    jitter = {"adaln": [0.5, -0.5, 0.1], "cross_attn": [-0.5, 0.5, -0.1]}  # adaLN ~ cross-attn
    runs = [
        _dit_run(tmp_path, c, s, f + [0.0, 0.2, -0.2][s] + jitter.get(c, [0, 0, 0])[s],
                 0.05 + 0.001 * f, resampled=f + 0.3 if s == 0 else None)
        for c, f in fid.items() for s in range(3)
    ]  # fmt: skip
    runs.append(Run({"experiment": "dit_conditioning", dit_conditioning.KEY: "adaln", "seed": "3"},
                    "failed", tmp_path))  # fmt: skip
    data = dit_conditioning.extract(runs)
    assert set(data["arm"]) == set(fid)  # the failed job left out
    assert len(data[data["metric"] == dit_conditioning.RESAMPLED_FID]) == 4
    settings = data[data["metric"].str.startswith("config/")].groupby("metric")["value"]
    assert settings.unique().map(list).to_dict() == {
        "config/depth": [4.0], "config/fid_guidance": [1.0], "config/fid_samples": [5000.0],
        "config/fid_steps": [25.0],  # null: the model's sample_steps
        "config/norm_eps": [1e-6],
    }  # fmt: skip
    result = dit_conditioning.render(data)
    verdict = {c.claim: c.verdict for c in result.claims}
    assert verdict["adaLN-Zero's fid_lenet is the lowest of the four"] == stats.HOLDS
    assert verdict["adaLN-Zero's fid_lenet is lower than adaLN's"] == stats.HOLDS
    assert verdict["adaLN's fid_lenet is lower than cross-attention's"] == "tie (within noise)"
    assert verdict["cross-attention's fid_lenet is lower than in-context's"] == stats.HOLDS
    best = next(c for c in result.claims if c.claim.startswith("adaLN-Zero's fid_lenet is the"))
    assert best.values == pytest.approx([1.5, 1.5, 1.9])  # the smallest gap per seed: adaLN's
    # final values compared: the converged gate of every arm a claim reads decides its validity
    assert all(c.final and c.arms for c in result.claims)
    assert {g.arm for g in result.gates} == set(fid)
    loss = next(c for c in result.claims if "val loss is the lowest" in c.claim)
    assert loss.verdict == stats.HOLDS and loss.claim.startswith("second measure, not the paper's")
    assert [c.claim for c in result.claims][1:7] == [
        f"{dit_conditioning.NAMES[b]}'s fid_lenet is lower than {dit_conditioning.NAMES[w]}'s"
        for b, w in itertools.combinations(["adaln_zero", "adaln", "cross_attn", "in_context"], 2)
    ]  # every pair, in the paper's order
    assert any("10.00 vs 10.30" in n for n in result.notes)  # resampling noise, seed 0
    plt.close(result.figure)

    # reversed: adaLN beats adaLN-Zero on every seed -> the rank does not hold
    flipped = data.copy()
    rows = (flipped["arm"] == "adaln") & (flipped["metric"] == dit_conditioning.FINAL_FID)
    flipped.loc[rows, "value"] -= 5.0
    claims = {c.claim: c for c in dit_conditioning.render(flipped).claims}
    assert claims["adaLN-Zero's fid_lenet is lower than adaLN's"].verdict == stats.FAILS
    assert claims["adaLN-Zero's fid_lenet is the lowest of the four"].verdict == stats.FAILS


def test_dit_conditioning_resamples_each_arms_first_seed_with_its_own_fid_settings(tmp_path):
    runs = [_dit_run(tmp_path, "adaln", s, 10.0, 0.05) for s in (2, 0)]
    for run in runs:
        (run.run_dir / "checkpoints").mkdir()
        (run.run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    cfg = OmegaConf.load(runs[0].run_dir / ".hydra" / "config.yaml")
    cfg.callbacks.fid.update(features="lenet.pt", data_root="data", batch_size=500, steps=25)
    OmegaConf.save(cfg, runs[1].run_dir / ".hydra" / "config.yaml")
    cmd = dit_conditioning._resample_command(runs[1], threads=1, repo=tmp_path)
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert cmd[2] == str(runs[1].run_dir / "checkpoints" / "last.ckpt")
    assert flags["--seed"] == "1" and flags["--num-samples"] == "5000"  # the fid seed's next
    assert flags["--guidance-scale"] == "1.0" and flags["--steps"] == "25"
    assert flags["--lenet"] == "lenet.pt"  # the run's own LeNet
    del cfg.callbacks.fid["features"]  # a config from before `features`: its file in `ckpt`
    cfg.callbacks.fid.ckpt = "old.pt"
    OmegaConf.save(cfg, runs[1].run_dir / ".hydra" / "config.yaml")
    cmd = dit_conditioning._resample_command(runs[1], threads=1, repo=tmp_path)
    assert cmd[cmd.index("--lenet") + 1] == "old.pt"
    # a run dir that has its second score is not scored again (no subprocess started)
    (runs[1].run_dir / dit_conditioning.RESAMPLE_FILE).write_text('{"fid_lenet": 1.0}\n')
    dit_conditioning.resample(runs, jobs=2, repo=tmp_path)
    assert not (runs[0].run_dir / dit_conditioning.RESAMPLE_FILE).exists()  # not the first seed


# stands in for scripts/fid.py: logs its checkpoints, prints a JSON line for each (a checkpoint
# in a dir named *broken* fails the process, after the lines before it)
FAKE_FID = """
import json, sys
from pathlib import Path
ckpts = [a for a in sys.argv[1:] if a.endswith(".ckpt")]
with open(Path(__file__).with_name("calls.log"), "a") as log:
    log.write(" ".join(Path(c).parent.parent.name for c in ckpts) + "\\n")
for c in ckpts:
    if "broken" in c:
        sys.exit(1)
    print("some warning")
    print(json.dumps({"ckpt": c, "fid_lenet": float(len(c)), "seed": 1}))
"""


@pytest.mark.parametrize("jobs", [1, 2])
def test_resample_scores_the_checkpoints_of_one_setting_in_one_process_per_job(tmp_path, jobs):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "fid.py").write_text(FAKE_FID)
    arms = ["adaln", "adaln_zero", "cross_attn", "in_context", "broken"]
    runs = [_dit_run(tmp_path, a, 0, 10.0, 0.05) for a in arms]
    runs.append(_dit_run(tmp_path, "adaln", 3, 10.0, 0.05))  # not its arm's first seed
    for i, run in enumerate(runs):
        (run.run_dir / "checkpoints").mkdir()
        (run.run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
        cfg = OmegaConf.load(run.run_dir / ".hydra" / "config.yaml")
        cfg.callbacks.fid.update(features="lenet.pt", data_root="data", batch_size=500)
        if i == 3:  # one arm's fid settings differ: it is scored in a process of its own
            cfg.callbacks.fid.num_samples = 100
        OmegaConf.save(cfg, run.run_dir / ".hydra" / "config.yaml")
    dit_conditioning.resample(runs, jobs=jobs, repo=tmp_path)
    calls = (tmp_path / "scripts" / "calls.log").read_text().split("\n")[:-1]
    same = ["adaln-0", "adaln_zero-0", "cross_attn-0", "broken-0"]
    expected = [" ".join(same[i::jobs]) for i in range(jobs)] + ["in_context-0"]
    assert sorted(calls) == sorted(expected)
    for run in runs[:4]:  # each scored checkpoint's own JSON line, whole
        line = (run.run_dir / dit_conditioning.RESAMPLE_FILE).read_text()
        ckpt = str(run.run_dir / "checkpoints" / "last.ckpt")
        assert json.loads(line) == {"ckpt": ckpt, "fid_lenet": float(len(ckpt)), "seed": 1}
    assert not (runs[4].run_dir / dit_conditioning.RESAMPLE_FILE).exists()  # its process failed
    assert not (runs[5].run_dir / dit_conditioning.RESAMPLE_FILE).exists()  # not a first seed


def _checkpointed(runs: list[Run]) -> None:
    """Give each run a last.ckpt and a LeNet of its own (what _resample_command needs)."""
    for run in runs:
        (run.run_dir / "checkpoints").mkdir()
        (run.run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
        cfg = OmegaConf.load(run.run_dir / ".hydra" / "config.yaml")
        cfg.callbacks.fid.update(features="lenet.pt", data_root="data", batch_size=500)
        OmegaConf.save(cfg, run.run_dir / ".hydra" / "config.yaml")


def test_resample_scores_no_later_seed_of_a_subset_run(tmp_path):
    """`--subset seed=5` gives resample seed 5 alone: not its arm's first seed (the grids run
    seeds 0 up, and seed 0 was scored by the run that ran it), so nothing is scored. A first
    seed that did not finish leaves the score to the next seed of the same run."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "fid.py").write_text(FAKE_FID)
    later = [_dit_run(tmp_path, a, 5, 10.0, 0.05) for a in ("adaln", "adaln_zero")]
    failed = replace(_dit_run(tmp_path, "cross_attn", 0, 10.0, 0.05), status="diverged")
    runs = [*later, failed, _dit_run(tmp_path, "cross_attn", 1, 10.0, 0.05)]
    _checkpointed(runs)
    dit_conditioning.resample(later, jobs=1, repo=tmp_path)
    assert not any((r.run_dir / dit_conditioning.RESAMPLE_FILE).exists() for r in later)
    assert not (tmp_path / "scripts" / "calls.log").exists()  # no scripts/fid.py started
    dit_conditioning.resample(runs[2:], jobs=1, repo=tmp_path)
    assert (tmp_path / "scripts" / "calls.log").read_text() == "cross_attn-1\n"


def test_an_arm_named_by_a_resolver_reads_back_from_hydras_escaped_override():
    logged = r"norm=none arm=$\{normlab.norm_name\:norm\} seed=0"
    assert parse_overrides(logged)["arm"] == "${normlab.norm_name:norm}"
