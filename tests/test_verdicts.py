"""The decision on a reproduction's claims: gates, provenance, seeds to a decision, Holm."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from normlab.analysis import gates, report, sequential, stats, sweep
from normlab.analysis.logs import Run

REPO = Path(__file__).resolve().parents[1]


def claim(values, region=(0.0, stats.ABOVE), **kw) -> report.Claim:
    kw.setdefault("source", "paper")
    return report.Claim("c", "p", "q", list(values), region, **kw)


# ----- seeds to a decision ---------------------------------------------------------------------


def test_seeds_needed_is_the_least_n_whose_interval_clears_the_nearest_bound():
    values = [1.0, 1.5, 0.7]  # mean 1.0667, sd 0.4041
    n = stats.seeds_needed(values, (0.0, stats.ABOVE))
    sd, mean = np.std(values, ddof=1), np.mean(values)

    def half(k: int) -> float:
        return scipy_stats.t.ppf(0.975, k - 1) * sd / math.sqrt(k)

    assert half(n) < mean <= half(n - 1)
    assert n == 3 and stats.Interval.of(values).low > 0  # 3 seeds decide it already
    # a mean close to the bound needs many seeds; one on it, none
    assert stats.seeds_needed([0.1, 0.5, -0.2], (0.0, stats.ABOVE)) == 30
    assert stats.seeds_needed([-1.0, 0.0, 1.0], (0.0, stats.ABOVE)) is None
    # a band: the nearer of its bounds; a ratio: on the log scale
    assert stats.seeds_needed([0.4, 0.5, 0.6], (-1.0, 1.0)) == 3  # t(0.975, 1) = 12.7: not 2
    assert stats.seeds_needed([2.0, 2.2, 1.8], (1.0, stats.ABOVE), log=True) == 3
    assert stats.seeds_needed([1.0], (0.0, stats.ABOVE)) is None


@pytest.mark.parametrize(
    "values, region",
    [
        ([1.0, 1.5, 0.7], (0.0, stats.ABOVE)),
        ([0.1, 0.5, -0.2], (0.0, stats.ABOVE)),
        ([-2.0, -2.5, -1.9, -2.2], (0.0, stats.ABOVE)),
        ([0.1, -0.1, 0.05], (-0.5, 0.5)),
        ([0.45, 0.55, 0.6], (-0.5, 0.5)),
        ([1.2, 1.3, 1.25], (-0.5, 0.5)),
    ],
)
def test_p_value_decides_exactly_when_the_95_interval_does(values, region):
    verdict = stats.verdict(stats.Interval.of(values), region)
    assert (stats.p_value(values, region) < 0.05) == (verdict != stats.UNDECIDED)


def test_holm_rejects_step_down_and_leaves_nan_out_of_the_family():
    assert stats.holm([0.01, 0.04, 0.03]) == [True, False, False]  # 0.03 > 0.05 / 2
    assert stats.holm([0.01, 0.02, 0.03]) == [True, True, True]  # 0.02 < 0.05/2, 0.03 < 0.05
    assert stats.holm([0.01, math.nan]) == [True, False]  # a family of one
    assert stats.holm([0.2, 0.01]) == [False, True]


# ----- provenance ------------------------------------------------------------------------------


def test_a_claim_must_say_where_it_comes_from():
    with pytest.raises(ValueError, match="source must be one of"):
        report.Claim("c", "p", "q", [1.0], (0.0, stats.ABOVE))
    with pytest.raises(ValueError, match="says why"):
        report.Claim("c", "p", "q", [1.0], (0.0, stats.ABOVE), source="ours")
    row = claim([1.0, 2.0], source="ours", why="a threshold of ours").row()
    assert row["provenance"] == "ours: a threshold of ours"


# ----- gates -----------------------------------------------------------------------------------


def _rows(arm: str, seed: int, losses: list[float], val: float, trivial: float) -> list[tuple]:
    rows = [(arm, seed, float(10 * i), "gate/train_loss", v) for i, v in enumerate(losses)]
    return rows + [(arm, seed, 10.0 * len(losses), "gate/val_loss", val),
                   (arm, seed, math.nan, "gate/trivial_loss", trivial)]  # fmt: skip


def _data(*rows) -> pd.DataFrame:
    return pd.DataFrame([r for rs in rows for r in rs], columns=report.RUNS_COLUMNS)


FLAT = [2.0] * 5 + [1.0] * 15  # plateaued well before the end
FALLING = list(np.linspace(2.0, 0.5, 20))  # still falling at the end: 0.64 -> 0.5 over 20%


def test_trained_gate_fails_an_arm_at_the_trivial_loss_on_any_seed():
    ln10 = math.log(10)
    data = _data(_rows("ok", 0, FLAT, 0.9, ln10), _rows("stuck", 0, FLAT, 0.9, ln10),
                 _rows("stuck", 1, FLAT, 0.99 * ln10, ln10))  # fmt: skip
    assert gates.trained(data, "ok").passed is True
    stuck = gates.trained(data, "stuck")
    assert stuck.passed is False and "1 of 2 seeds" in stuck.measured
    assert stuck.status == "FAIL: did not train"
    assert gates.trained(data, "absent").passed is None


def test_not_saturated_gate_compares_each_value_with_its_ceiling():
    rows = [("a", 0, 6.0, "gate/value", 0.5), ("a", 0, 6.0, "gate/ceiling", 1.0),
            ("b", 0, 6.0, "gate/value", 1.0), ("b", 0, 6.0, "gate/ceiling", 1.0)]  # fmt: skip
    data = pd.DataFrame(rows, columns=report.RUNS_COLUMNS)
    assert gates.not_saturated(data, "a").passed is True
    assert gates.not_saturated(data, "b").status == "FAIL: saturated"


def test_unigram_loss_is_the_cross_entropy_of_training_frequencies(tmp_path: Path):
    path = tmp_path / "t.txt"
    path.write_text("aab" * 30 + "ab" * 5)  # val: the last 10% = 10 characters "ababababab"
    train = "aab" * 30
    p = {c: train.count(c) / len(train) for c in "ab"}
    expected = -(0.5 * math.log(p["a"]) + 0.5 * math.log(p["b"]))
    assert gates.unigram_loss(str(path)) == pytest.approx(expected)


def test_gate_rows_come_from_a_jobs_logs(tmp_path: Path):
    metrics = pd.DataFrame(
        [{"step": 9, "train/loss_step": 2.0}, {"step": 9, "val/loss": 1.5},
         {"step": 19, "train/loss_step": 1.0}, {"step": 19, "val/loss": 1.3},
         {"step": 19, "val/loss": 1.2}]  # step 19 validated twice (a resumed job): the last
    )  # fmt: skip
    run = Run({"seed": "0"}, "ok", tmp_path, metrics=metrics)  # no config: 10 classes
    rows = pd.DataFrame(gates.gate_rows(run, "a", 0), columns=report.RUNS_COLUMNS)
    assert rows[rows.metric == "gate/trivial_loss"]["value"].item() == pytest.approx(math.log(10))
    assert rows[rows.metric == "gate/train_loss"]["value"].tolist() == [2.0, 1.0]
    assert rows[rows.metric == "gate/val_loss"]["value"].tolist() == [1.5, 1.2]  # each, once
    assert gates.trained(rows, "a").measured.startswith("final val loss 1.200-1.200")
    diverged = Run({"seed": "0"}, "diverged", tmp_path, metrics=metrics)
    assert len(gates.gate_rows(diverged, "a", 0)) == len(rows)  # a diverged job is read too
    assert gates.gate_rows(Run({"seed": "0"}, "failed", tmp_path, metrics=metrics), "a", 0) == []


# ----- the decision ----------------------------------------------------------------------------


def test_a_failed_gate_makes_the_claims_that_read_the_arm_invalid():
    found = [gates.Gate("a", "trained", False, ""), gates.Gate("b", "converged", False, ""),
             gates.Gate("c", "trained", True, "")]  # fmt: skip
    claims = [claim([1.0, 1.1, 0.9], arms=("a", "c")), claim([1.0, 1.1, 0.9], arms=("b",)),
              claim([1.0, 1.1, 0.9], arms=("b",), final=True), claim([1.0, 1.1, 0.9])]  # fmt: skip
    d = gates.decide(claims, found, initial=3, cap=12)
    assert d[0].verdict == d[0].holm == (
        "invalid: a did not train; would decide it: a setting at which the arm trains")
    assert d[1].verdict == stats.HOLDS  # converged matters only where final values compare
    assert d[2].verdict.startswith("invalid: b still improving; would decide it: a longer budget")
    assert math.isnan(d[2].p_value)
    assert d[3].verdict == stats.HOLDS and d[3].gates == "pass"
    assert [x.tested for x in d] == [False, True, False, True]  # the family line counts these


def test_the_figure_says_which_arms_failed_and_the_verdicts_by_source():
    found = [gates.Gate("a", "trained", False, ""), gates.Gate("b", "converged", True, ""),
             gates.Gate("c", "not saturated", False, "")]  # fmt: skip
    claims = [claim([1.0, 1.1, 0.9], arms=("a",)), claim([1.0, 1.1, 0.9]),
              claim([-1.0, -1.1, -0.9], source="ours", why="w"),
              claim([1.0, -1.0, 0.1])]  # fmt: skip
    text = report.footer(found, claims, gates.decide(claims, found, initial=3, cap=12))
    assert text.splitlines() == [
        "Gates (3 arms): did not train: a; saturated: c.",
        "Claims [paper]: holds 1, invalid 1, undecided 1.",
        "Claims [ours]: does not hold 1.",
    ]
    passing = [gates.Gate("a", "trained", True, "")]
    assert report.footer(passing, [], []) == "Gates (1 arm): every measured gate passes."
    assert report.footer([], [], []).startswith("Gates: none measured")
    unknown = gates.Gate("b", "converged", None, "no train-loss curve in runs.csv")
    assert report.footer([unknown], [], []).startswith("Gates: none measured")
    assert report.footer([*passing, unknown], [], []) == (
        "Gates (2 arms): every measured gate passes; 1 of 2 not measured."
    )


def test_holm_column_corrects_at_the_sequential_boundary_over_the_tested_claims_only():
    # alone, each holds (p < the boundary); as a family of three, Holm keeps only the smallest
    values = [[0.5, 1.0, 0.7, 0.3, 0.6], [1.0, 0.2, 0.9, 0.3, 0.6], [1.0, 0.2, 0.9, 0.3, 0.6]]
    claims = [claim(v) for v in values]
    ps = [stats.p_value(v, (0.0, stats.ABOVE)) for v in values]
    bound = sequential.BOUNDARY
    assert all(p < bound for p in ps) and ps[0] < bound / 3 and ps[1] > bound / 2, ps
    d = gates.decide(claims, [], initial=3, cap=12)
    assert [x.verdict for x in d] == [stats.HOLDS] * 3
    assert [x.holm for x in d] == [stats.HOLDS, stats.UNDECIDED, stats.UNDECIDED]


def test_a_verdict_needs_its_p_below_the_sequential_boundary_not_only_its_95_ci():
    values = [1.0, 0.1, 0.9, 0.3, 0.5]  # the 95% CI clears 0, p between the boundary and 0.05
    p = stats.p_value(values, (0.0, stats.ABOVE))
    assert sequential.BOUNDARY < p < 0.05 and claim(values).verdict == stats.HOLDS
    d = gates.decide([claim(values)], [], initial=3, cap=12)[0]
    assert d.verdict == f"{stats.UNDECIDED}; not past the boundary" and d.holm == stats.UNDECIDED


def test_an_undecided_claim_says_the_seeds_it_needs_beyond_the_cap():
    d = gates.decide([claim([0.1, 0.5, -0.2])], [], initial=3, cap=12)[0]
    need = stats.seeds_needed([0.1, 0.5, -0.2], (0.0, stats.ABOVE), level=1 - sequential.BOUNDARY)
    assert need > stats.seeds_needed([0.1, 0.5, -0.2], (0.0, stats.ABOVE)) == 30
    assert d.planned_n == need and d.verdict.endswith(f"needs ~{need} seeds (cap 12)")
    d = gates.decide([claim([0.1, 0.5, -0.2])], [], initial=3, cap=60)[0]
    assert d.verdict == stats.UNDECIDED  # within the cap: --decide runs them


def test_planned_seeds_come_from_the_first_seeds_only_at_the_boundarys_level():
    first, more = [1.0, 1.5, 0.7], [1.0, 1.5, 0.7, 5.0, -3.0]
    assert gates.decide([claim(more)], [], 3, 12)[0].planned_n == stats.seeds_needed(
        first, (0.0, stats.ABOVE), level=1 - sequential.BOUNDARY
    )


def test_the_sequential_design_keeps_false_holds_at_or_below_5_percent():
    """10,000 null claims (true effect on the bound) through the whole procedure: the first 3
    seeds, the plan, the cap of 12; and families of 16 under Holm."""
    sim, _, _ = sequential.simulate(10_000, initial=3, cap=12)
    assert sim.overall <= 0.05 and sum(sim.per_look) == pytest.approx(sim.overall)
    assert all(r > 0 for r in sim.per_look[:2])  # the looks are real: each can decide
    assert sequential.holm_family(families=1_000, size=16) <= 0.05
    assert sequential.table() in (REPO / "docs" / "reproductions.md").read_text()  # docs true
    import normlab.analysis.sequential as seq  # the old rule (full alpha at each look) fails

    old = seq.BOUNDARY
    try:
        seq.BOUNDARY = 0.05
        assert seq.simulate(10_000, 3, 12)[0].overall > 0.05
    finally:
        seq.BOUNDARY = old


def test_a_raised_cap_adds_a_fourth_look_whose_rate_is_simulated_and_shown():
    """A grid's `cap:` (dyt_vs_ln's dit_long: 15): null claims still undecided at the cap of 12
    are looked at once more. The whole procedure's false 'holds' stay at or below 5%, the looks
    before it are the design's own (the same draws), and docs/reproductions.md shows the table."""
    base, _, _ = sequential.simulate(10_000, 3, 12)
    more, _, _ = sequential.simulate(10_000, 3, 12, raised=15)
    assert more.per_look[:3] == base.per_look and more.per_look[3] > 0  # the fourth look decides
    assert base.overall < more.overall <= 0.05 and more.mean_seeds > base.mean_seeds
    assert sequential.table(raised=15) in (REPO / "docs" / "reproductions.md").read_text()
    caps = sequential.Caps(12, (sequential.Raise("long", frozenset({"long/a", "long/b"}), 15,
                                                 "why"),))  # fmt: skip
    assert caps.of(("long/a", "short/a")) == 15 and caps.of(("short/a",)) == 12
    near = claim([0.05, 0.3, -0.1], arms=("long/a",))  # undecided, plans past both caps
    far = claim([0.05, 0.3, -0.1], arms=("short/a",))
    words = [d.verdict for d in gates.decide([near, far], [], 3, caps)]
    assert words[0].endswith("(cap 15)") and words[1].endswith("(cap 12)")
    assert f"is {more.overall:.4f}." in caps.text()
    assert "The long grid's cap is raised to 15 after its look at 12 (why)" in caps.text()


@pytest.mark.parametrize("change, problem", [
    ({"cap_why": None}, "a raised cap needs its reason (cap_why)"),
    ({"cap": 12}, "12 does not raise the reproduction's cap 12"),
    ({"arms": {"dit_long/lr${optim.optimizer.lr}": ["norm=layernorm"]}},
     "only a grid of fixed arm names can raise its cap"),
])  # fmt: skip
def test_a_bad_raised_cap_fails_in_one_line(tmp_path, change, problem):
    import yaml

    path = REPO / "conf" / "reproduce" / "dyt_vs_ln.yaml"
    spec = yaml.safe_load(path.read_text())
    grid = spec["grids"]["dit_long"]
    grid.update({k: v for k, v in change.items() if v is not None})
    grid.pop("cap_why") if change.get("cap_why", 1) is None else None
    spec.pop("claims", None)  # the claims entries check their arms against the grids
    bad = tmp_path / "dyt_vs_ln.yaml"
    bad.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError) as raised:
        sweep.load(bad)
    assert str(raised.value) == f"dyt_vs_ln.yaml: grids.dit_long.cap: {problem}"


def test_decide_takes_a_raised_grid_on_to_its_cap_after_the_look_at_the_reproductions(
        tmp_path, monkeypatch):  # fmt: skip
    """--decide: the dit_long claim still undecided at the cap of 12 runs on to its grid's 15
    (only the missing seeds), and no other grid goes past 12."""
    script = _script()
    figures = tmp_path / "outputs" / "figures"
    (figures / "dyt_vs_ln").mkdir(parents=True)
    arms = "dit_long/dyt_patch dit_long/layernorm"
    frame = pd.DataFrame([("undecided (within noise)", 18.0, arms)],
                         columns=["verdict", "planned_seeds", "arms"])  # fmt: skip
    frame.to_csv(figures / "dyt_vs_ln.claims.csv", index=False)
    rows = [(a, s, "ok") for a in ("dit_long/dyt_patch", "dit_long/layernorm") for s in range(12)]
    pd.DataFrame(rows, columns=["arm", "seed", "status"]).to_csv(
        figures / "dyt_vs_ln" / "jobs.csv", index=False)  # fmt: skip
    calls = []
    monkeypatch.setattr(script, "reproduce",
                        lambda *a, **k: calls.append((a[4], a[5], k["subset"])))  # fmt: skip
    script.decide("dyt_vs_ln", False, 1, tmp_path, ["dit_long"])
    assert calls == [(15, ["dit_long"], [("seed", ["12", "13", "14"])])]


def _decaying(arm: str, seed: int, loss: list[float], last: float | None = None) -> list[tuple]:
    """A job on a cosine schedule (gate/lr_decays 1): its held-out loss at steps 0..n-1."""
    steps = np.linspace(0.0, last or 100.0, len(loss))
    return [(arm, seed, float(x), gates.VAL_LOSS, v) for x, v in zip(steps, loss, strict=True)] + [
        (arm, seed, math.nan, gates.LR_END, 0.0), (arm, seed, math.nan, gates.DECAYS, 1.0),
        (arm, seed, math.nan, "gate/trivial_loss", 2.3)]  # fmt: skip


def test_a_decaying_schedule_converges_when_every_seed_ran_it_to_its_end():
    falling = list(np.linspace(2.0, 1.0, 11))  # still falling: the late gain is a diagnostic
    data = _data(*[_decaying("a", s, falling) for s in range(3)],
                 *[_decaying("b", s, falling, last=100.0 if s else 60.0) for s in range(3)])
    a, b = gates.converged(data, "a"), gates.converged(data, "b")
    assert a.passed is True and "ran it to step 100" in a.measured and "(diagnostic)" in a.measured
    assert [e[0] for e in a.ends] == [0, 1, 2] and a.ends[0][1:] == pytest.approx((1.2, 1.0))
    assert b.passed is False and "seeds ended at steps 60-100" in b.measured


def test_a_constant_lr_fails_only_past_the_threshold_plus_two_standard_errors():
    steps = np.arange(100.0)
    flat = [("flat", 0, x, gates.TRAIN_LOSS, 1.0) for x in steps]
    falling = [("falling", 0, x, gates.TRAIN_LOSS, 2.0 - x / 100) for x in steps]
    noisy = [("noisy", 0, x, gates.TRAIN_LOSS, (1.0 - 0.0015 * x) * (1.3 if x % 2 else 0.7))
             for x in steps]  # ~3% gain, but a window's noise is larger: within 2 SE
    sparse = [("sparse", 0, x, gates.TRAIN_LOSS, 1.0) for x in steps[::10]]
    data = _data(flat, falling, noisy, sparse)
    assert gates.converged(data, "flat").passed is True
    assert gates.converged(data, "falling").passed is False
    noisy_gate = gates.converged(data, "noisy")
    assert gates.late_gain(pd.Series([r[4] for r in noisy], index=steps)) > gates.CONVERGED_GAIN
    assert noisy_gate.passed is True and "+ 2 SE" in noisy_gate.measured
    sparse_gate = gates.converged(data, "sparse")
    assert sparse_gate.passed is None and "log more often" in sparse_gate.measured


def _final(values, arms, **kw):
    return report.Claim("c", "p", "q", values, (0.0, stats.ABOVE), source="paper", arms=arms,
                        final=True, **kw)  # fmt: skip


def test_the_budget_test_flags_a_claim_whose_arms_gap_would_change_one_window_on():
    """Arm a's held-out loss sits on b's at the end but falls faster: one more window at the
    same drift separates them, so a final-value comparison depends on the budget; a gap that
    holds steady does not."""
    def curve(at80: float, end: float, s: int) -> list[float]:  # 11 points: 80% is the 9th
        return [2.0] * 8 + [at80 + 0.01 * s, (at80 + end) / 2, end + 0.003 * s]

    fall = _data(*[_decaying("a", s, curve(1.2, 1.0, s)) for s in range(3)],
                 *[_decaying("b", s, curve(1.0, 1.0, -s)) for s in range(3)])  # fmt: skip
    found = gates.gates(fall, ["a", "b"])
    values = [1.0, 1.1, 0.9, 1.05, 0.95]
    d = gates.decide([_final(values, ("a", "b"))], found, 3, 12)[0]
    assert d.verdict == "budget-dependent: a against b" and not d.tested
    steady = _data(*[_decaying("a", s, curve(1.2, 1.2, s)) for s in range(3)],
                   *[_decaying("b", s, curve(1.0, 1.0, -s)) for s in range(3)])  # fmt: skip
    found = gates.gates(steady, ["a", "b"])
    assert gates.decide([_final(values, ("a", "b"))], found, 3, 12)[0].verdict == "holds"


def test_a_held_out_claim_takes_the_budget_test_on_its_own_region():
    """A claim whose values are its arms' held-out loss gap reads its own region one window on:
    a gap within its margin that only widens on the paper's side keeps its verdict (the gap's
    sign alone would pass the boundary one window on, and flag it); a gap inside a band that
    would leave it one window on is flagged."""
    def data(g80: list[float], g100: list[float]) -> pd.DataFrame:  # b flat, a off b by a gap
        def curve(at80: float, end: float) -> list[float]:  # 11 points: 80% is the 9th
            return [3.0] * 8 + [at80, (at80 + end) / 2, end]

        return _data(*[_decaying("a", s, curve(1.0 + lo, 1.0 + hi))
                       for s, (lo, hi) in enumerate(zip(g80, g100, strict=True))],
                     *[_decaying("b", s, curve(1.0, 1.0)) for s in range(len(g100))])  # fmt: skip

    g100 = [-0.025, -0.050, -0.065, -0.101]  # a ahead, its sign not past the boundary yet
    found = gates.gates(data([g + 0.02 for g in g100], g100), ["a", "b"])

    def margin(held_out: bool) -> report.Claim:  # "a at most 0.05 worse than b"
        return report.Claim("c", "p", "q", g100, (stats.BELOW, 0.05), source="paper",
                            arms=("a", "b"), final=True, held_out=held_out)  # fmt: skip

    assert gates.decide([margin(True)], found, 3, 12)[0].verdict == "holds"
    assert gates.decide([margin(False)], found, 3, 12)[0].verdict == "budget-dependent: a against b"
    level = [0.0, 0.01, -0.01, 0.005]  # inside +-0.05 now, 0.06 lower one window on
    found = gates.gates(data([g + 0.06 for g in level], level), ["a", "b"])
    band = report.Claim("c", "p", "q", level, (-0.05, 0.05), source="paper", arms=("a", "b"),
                        final=True, held_out=True)  # fmt: skip
    assert gates.decide([band], found, 3, 12)[0].verdict == "budget-dependent: a against b"


def test_an_absent_effect_is_concluded_by_two_one_sided_tests_within_the_band():
    near = [0.01, -0.02, 0.0, 0.015, -0.01, 0.005]
    kw = {"absent": (-0.1, 0.1), "absent_why": "a rule"}
    d = gates.decide([claim(near, **kw)], [], 3, 12)[0]
    assert d.verdict == "absent at this scale (within ±0.1)" and d.p_value < sequential.BOUNDARY
    wide = gates.decide([claim([0.3, -0.4, 0.05], **kw)], [], 3, 12)[0]
    assert wide.verdict.startswith("undecided")
    with pytest.raises(ValueError, match="absent_why"):
        claim(near, absent=(-0.1, 0.1))


def test_a_ceiling_that_understates_the_claim_keeps_only_a_holds_valid():
    sat = [gates.Gate("post", "not saturated", False, "at it")]
    up = _final([1.0, 1.1, 0.9, 1.05], ("post",), ceiling_against=("post",))
    down = _final([-1.0, -1.1, -0.9, -1.05], ("post",), ceiling_against=("post",))
    conv = [gates.Gate("post", "converged", True, "")]
    assert gates.decide([up], sat + conv, 3, 12)[0].verdict == stats.HOLDS
    assert gates.decide([down], sat + conv, 3, 12)[0].verdict.startswith("invalid: post saturated")
    plain = _final([1.0, 1.1, 0.9, 1.05], ("post",))
    assert gates.decide([plain], sat + conv, 3, 12)[0].verdict.startswith("invalid: post saturated")


def test_a_did_not_train_that_the_claim_tests_answers_it():
    stuck = [gates.Gate("dyt", "trained", False, ""), gates.Gate("ln", "converged", True, ""),
             gates.Gate("ln", "trained", True, "")]  # fmt: skip
    c = report.Claim("within", "p", "q", [1.2, 1.3, 1.25], (-0.05, 0.05), source="paper",
                     arms=("dyt", "ln"), final=True, untrained_answers=("dyt",))  # fmt: skip
    d = gates.decide([c], stuck, 3, 12)[0]
    assert d.verdict == "does not hold (dyt did not train: the failure the claim tests)"
    c2 = report.Claim("within", "p", "q", [1.2, 1.3, 1.25], (-0.05, 0.05), source="paper",
                      arms=("dyt", "ln"), final=True)  # fmt: skip
    assert gates.decide([c2], stuck, 3, 12)[0].verdict.startswith("invalid: dyt did not train")


def test_a_count_claim_with_no_event_in_either_arm_is_no_test():
    c = report.CountClaim("c", "p", "q", (0, 8, 0, 8), source="paper")
    d = gates.decide([c], [], 3, 12)[0]
    assert d.verdict.startswith("no events in either arm (0 of 8, 0 of 8): not a test")
    assert d.planned_n is None and not d.tested


def _script():
    from normlab.analysis import reproduce  # scripts/reproduce.py's main

    return reproduce


def test_seeds_to_decide_extends_each_grid_to_the_most_its_undecided_claims_plan(tmp_path):
    """Per grid: the most any undecided claim that reads its arms (or their settings, b2 of
    batchnorm) plans, up to the cap; a decided claim plans nothing, and a grid no undecided claim
    reads is not run again (batchnorm_precise/b2 is not a setting of batchnorm)."""
    from normlab.analysis.sweep import Grid

    script = _script()
    arms = {"bn": "batchnorm", "gn": "groupnorm", "ln": "layernorm", "precise": "batchnorm_precise"}
    grids = [Grid(name, "x", arm=arm) for name, arm in arms.items()]
    path = tmp_path / "c.claims.csv"
    rows = [("undecided (within noise)", 7.0, "batchnorm/b2 groupnorm/b2"),
            ("holds", 40.0, "layernorm/b32 groupnorm/b32"),
            ("undecided (within noise); needs ~53 seeds (cap 12)", 53.0, "batchnorm_precise/b2"),
            ("invalid: groupnorm/b2 still improving", 9.0, "groupnorm/b2")]  # fmt: skip
    pd.DataFrame(rows, columns=["verdict", "planned_seeds", "arms"]).to_csv(path, index=False)
    assert script.seeds_to_decide(path, 12, grids) == {"bn": 7, "gn": 7, "precise": 12}
    assert script.seeds_to_decide(path, 6, grids) == {"bn": 6, "gn": 6, "precise": 6}
    assert script.seeds_to_decide(path, 12, grids[2:3]) == {}
    # a tie is undecided too: an order within noise plans its seeds as any undecided claim
    tie = [*rows, ("tie (within noise); not past the boundary", 8.0, "layernorm/b2")]
    pd.DataFrame(tie, columns=["verdict", "planned_seeds", "arms"]).to_csv(path, index=False)
    assert script.seeds_to_decide(path, 12, grids) == {"bn": 7, "gn": 7, "ln": 8, "precise": 12}
    # an undecided claim that names no arms cannot say which grid its seeds go to: an error (it
    # once read every grid, and ran a decided grid's seeds to the cap)
    columns = ["claim", "verdict", "planned_seeds", "arms"]
    unnamed = [("the unnamed one", "undecided (within noise)", 8.0, "")]
    pd.DataFrame(unnamed, columns=columns).to_csv(path, index=False)
    with pytest.raises(SystemExit, match="'the unnamed one' plans seeds but names no arms"):
        script.seeds_to_decide(path, 12, grids)
    pd.DataFrame([("decided", "holds", 3.0, "")], columns=columns).to_csv(path, index=False)
    assert script.seeds_to_decide(path, 12, grids) == {}


def test_a_subset_run_lands_only_where_its_grid_then_holds_one_of_its_looks(tmp_path, capsys):
    """The design looks at a grid's first seeds, its plan and its cap: a --subset run of seeds
    after which a grid would hold another count does not land (its jobs wait in the sweep dir),
    so no claim is read at a look the simulated error rate does not cover."""
    from normlab.analysis.sweep import Grid

    script = _script()
    name = "dit_conditioning"  # its first seeds 3, cap 12
    paths = report.evidence_paths(tmp_path, name)
    rows = [("undecided (within noise)", 7.0, "adaln_zero adaln")]
    pd.DataFrame(rows, columns=["verdict", "planned_seeds", "arms"]).to_csv(paths["claims"],
                                                                           index=False)  # fmt: skip
    grid = Grid("conditioning", "x", arm="${model.net.conditioning}")
    repro = SimpleNamespace(grids=(grid,))  # the grids that ran
    paths["jobs"].parent.mkdir(parents=True)
    jobs = [(arm, s, "ok") for arm in ("adaln_zero", "adaln") for s in range(5)]
    pd.DataFrame(jobs, columns=["arm", "seed", "status"]).to_csv(paths["jobs"], index=False)
    assert script.looks(name, paths, [grid]) == {"conditioning": [3, 7, 12]}

    def run(*seeds, status="ok"):  # a --subset seed=.. run: its subset and its jobs' rows
        rows = [(arm, s, status) for arm in ("adaln_zero", "adaln") for s in seeds]
        subset = [("seed", [str(s) for s in seeds])]
        return subset, pd.DataFrame(rows, columns=["arm", "seed", "status"])

    assert script.off_look(name, paths, repro, *run(5, 6)) is None  # 7: the plan
    b2 = pd.DataFrame([("adaln", 2, "ok")], columns=["arm", "seed", "status"])
    assert script.off_look(name, paths, repro, [("b", ["2"])], b2) is None  # no seeds: no look's
    held = script.off_look(name, paths, repro, *run(5))
    assert held.startswith(f"{name}: not landed: with seed(s) 5 the conditioning grid would "
                           "hold 6 seeds, none of its looks (3, 7, 12")  # fmt: skip
    assert held.endswith(f"`python scripts/reproduce.py {name} --decide`), which reruns none "
                         "of them")  # fmt: skip
    # a share cut short names the seeds it keeps, not every seed its --subset asked for
    cut = script.off_look(name, paths, repro, run(5, 6)[0], run(5)[1])
    assert cut.startswith(f"{name}: not landed: with seed(s) 5 the conditioning grid would hold "
                          "6 seeds")  # fmt: skip
    # a seed whose job failed ran all the same: the evidence holds it (it is not read as ok)
    jobs.append(("adaln", 5, "failed"))
    jobs.append(("adaln_zero", 5, "ok"))
    pd.DataFrame(jobs, columns=["arm", "seed", "status"]).to_csv(paths["jobs"], index=False)
    assert script.off_look(name, paths, repro, *run(6)) is None
    # a seed one of whose jobs was killed (dropped before landing) is not whole: its other jobs
    # wait (no claim reads a seed some arms lack), as does a seed all of whose jobs ran but one
    killed = run(6)[1].iloc[:1]
    held = script.off_look(name, paths, repro, [("seed", ["6"])], killed)
    assert held.startswith(f"{name}: not landed: seed(s) 6 of the conditioning grid lack jobs "
                           "that ran to their end")  # fmt: skip
    for landing, broken in ((killed, [("conditioning", [6])]), (run(6)[1], [])):
        whole = script.whole_seeds(paths, [grid], landing)
        assert script.broken_seeds([grid], landing, whole) == broken
    assert script.off_looks(name, paths, [grid]) == [("conditioning", 6, [3, 7, 12])]
    note = script.off_look_note(name, script.off_looks(name, paths, [grid]))
    assert note.startswith("Seeds off the design's looks: conditioning holds 6 (its looks: 3, "
                           "7, 12).")  # fmt: skip


def test_seeds_short_of_a_look_wait_committed_in_pending_and_land_with_the_look(tmp_path, capsys):
    """A grid that takes more than a session to reach its next look loses nothing to a new
    machine: a share of its seeds short of the look waits in NAME/pending/ (read by no claim);
    --decide counts those seeds as run, and the run that completes the look lands them with its
    own, after which pending/ is gone. A pending job run again lands once, as run again."""
    from normlab.analysis import pending
    from normlab.analysis.sweep import Grid

    script = _script()
    name = "dit_conditioning"  # its first seeds 3, cap 12
    paths = report.evidence_paths(tmp_path, name)
    pd.DataFrame([("undecided (within noise)", 7.0, "adaln_zero adaln")],
                 columns=["verdict", "planned_seeds", "arms"]).to_csv(paths["claims"],
                                                                       index=False)  # fmt: skip
    grid = Grid("conditioning", "x", arm="${model.net.conditioning}")
    arms = ("adaln_zero", "adaln")

    def evidence(seeds, value=1.0):  # the runs.csv and jobs.csv rows of these seeds' jobs
        runs = pd.DataFrame([(a, s, "final/fid", value) for a in arms for s in seeds],
                            columns=["arm", "seed", "metric", "value"])  # fmt: skip
        jobs = pd.DataFrame([(a, s, "ok", f"seed={s} c={a}") for a in arms for s in seeds],
                            columns=["arm", "seed", "status", "overrides"])  # fmt: skip
        return runs, jobs

    def at(data, subset):  # Reproduction.rows_at for a seed subset
        return data["seed"].isin([int(v) for _, vs in subset for v in vs])

    repro = SimpleNamespace(grids=(grid,), rows_at=at)
    paths["runs"].parent.mkdir(parents=True)
    runs, jobs = evidence(range(3))
    runs.to_csv(paths["runs"], index=False)
    jobs.to_csv(paths["jobs"], index=False)
    drawn, notes = [], []

    def draw():
        drawn.append(pd.read_csv(paths["runs"]))
        notes.append(pending.note(paths))  # the md's word on the pending jobs, as drawn
        return {"md": paths["md"]}

    def land(seeds, value=1.0):  # a --subset seed=.. run whose sweep dir holds only `seeds`
        runs, jobs = evidence(seeds, value)
        subset = [("seed", [str(s) for s in seeds])]
        return script.land_or_hold(name, paths, repro, runs, jobs, True, draw, subset, True)

    assert land([3, 4]) is None and not drawn  # 5 seeds: none of 3, 7, 12
    assert "their rows wait in dit_conditioning/pending/ (commit it)" in capsys.readouterr().out
    where = pending.paths(paths)
    assert sorted(pd.read_csv(where["jobs"])["seed"]) == [3, 3, 4, 4]
    assert sorted(set(pd.read_csv(paths["runs"])["seed"])) == [0, 1, 2]  # the evidence as it was
    # a new machine: --decide counts the pending seeds as run, and their share of 7 runs none
    assert script.seeds_run(pending.jobs(paths), [grid]) == {"conditioning": {0, 1, 2, 3, 4}}
    assert script.seeds_run(paths["jobs"], [grid]) == {"conditioning": {0, 1, 2}}
    note = pending.note(paths)
    assert note.startswith("Run, not yet read: adaln, adaln_zero seed(s) 3, 4 (4 jobs")
    assert land([5]) is None  # 6: still none of the looks; seed 5 joins seeds 3, 4
    assert sorted(set(pd.read_csv(where["runs"])["seed"])) == [3, 4, 5]
    # the look: seeds 6 and a rerun of 4 complete 7; every pending job lands, 4 as rerun, once
    assert land([4, 6], value=2.0) == {"md": paths["md"]}
    landed = drawn[-1]
    assert sorted(landed["seed"]) == sorted([*range(7)] * 2)
    assert notes[-1] == ""  # the md drawn at the look says none waits: it read them all
    assert (landed[landed["seed"].isin([4, 6])]["value"] == 2.0).all()
    assert (landed[landed["seed"].isin([3, 5])]["value"] == 1.0).all()
    assert sorted(pd.read_csv(paths["jobs"])["seed"]) == sorted([*range(7)] * 2)
    assert not where["runs"].parent.exists() and pending.note(paths) == ""
    assert script.off_looks(name, paths, [grid]) == []
    # decided at its plan, the claim plans nothing more: the landing's stamp keeps 7 a look
    pd.DataFrame([("holds", 4.0, "adaln_zero adaln")],
                 columns=["verdict", "planned_seeds", "arms"]).to_csv(paths["claims"],
                                                                       index=False)  # fmt: skip
    assert script.looks(name, paths, [grid]) == {"conditioning": [3, 7, 12]}
    assert script.stamped_looks(pd.read_csv(paths["jobs"]), [grid]) == {"conditioning": {7}}
    assert script.off_looks(name, paths, [grid]) == []
    unstamped = pd.read_csv(paths["jobs"]).drop(columns=[script.LOOK])
    unstamped.to_csv(paths["jobs"], index=False)  # as landed before the stamp: off the looks
    assert script.off_looks(name, paths, [grid]) == [("conditioning", 7, [3, 12])]


def test_a_pending_job_is_the_same_job_whatever_the_order_of_its_overrides():
    """A sweep that lists its keys in another order (its seeds first, since jobs run seed by
    seed) runs the same jobs: a pending job run again replaces its row, it does not land twice."""
    from normlab.analysis import pending

    columns = ["arm", "seed", "overrides", "value"]
    before = pd.DataFrame([("adaln", 4, "experiment=x model.net.conditioning=adaln seed=4", 1.0),
                           ("adaln", 3, "experiment=x model.net.conditioning=adaln seed=3", 1.0)],
                          columns=columns)  # fmt: skip
    again = pd.DataFrame([("adaln", 4, "experiment=x seed=4 model.net.conditioning=adaln", 2.0)],
                         columns=columns)  # fmt: skip
    both = pending.replaced(before, again)
    assert sorted(zip(both["seed"], both["value"], strict=True)) == [(3, 1.0), (4, 2.0)]
    moved = again.assign(overrides="experiment=x seed=4 model.net.conditioning=in_context")
    assert len(pending.replaced(before, moved)) == 3  # another job: both kept


def test_a_cut_share_keeps_its_finished_jobs_in_pending(tmp_path, monkeypatch, capsys):
    """Ctrl+C on a share of a grid (a session about to end): the jobs that finished wait in
    NAME/pending/, the one killed mid-run (its row still 'running') does not; where the finished
    jobs would complete a look it says `--collect` lands them instead."""
    from normlab.analysis import pending
    from normlab.analysis.sweep import Grid

    script = _script()
    name = "dit_conditioning"  # its first seeds 3, cap 12
    paths = report.evidence_paths(tmp_path / "outputs" / "figures", name)
    paths["jobs"].parent.mkdir(parents=True)
    pd.DataFrame([("undecided (within noise)", 12.0, "adaln_zero adaln")],
                 columns=["verdict", "planned_seeds", "arms"]).to_csv(paths["claims"],
                                                                       index=False)  # fmt: skip
    arms = ("adaln_zero", "adaln")
    pd.DataFrame([(a, s, "ok", f"seed={s} c={a}") for a in arms for s in range(3)],
                 columns=["arm", "seed", "status", "overrides"]).to_csv(paths["jobs"],
                                                                        index=False)  # fmt: skip
    runs = [SimpleNamespace(arm=a, seed=s, status=st)
            for a, s, st in [("adaln_zero", 3, "ok"), ("adaln", 3, "running"),
                             ("adaln_zero", 4, "ok"), ("adaln", 4, "ok")]]  # fmt: skip

    def frame(found):
        return pd.DataFrame([(r.arm, r.seed, r.status, f"seed={r.seed} c={r.arm}") for r in found],
                            columns=["arm", "seed", "status", "overrides"])  # fmt: skip

    monkeypatch.setattr(script.sweep, "runs", lambda *a: runs)
    monkeypatch.setattr(script.sweep, "jobs_frame", frame)
    repro = SimpleNamespace(
        grids=(Grid("conditioning", "x", arm="${model.net.conditioning}"),),
        rows_at=lambda data, subset: data["seed"].isin([3, 4]),
        extract=lambda found: frame(found).assign(x=None, metric="m", value=1.0))
    script.keep_cut(name, repro, False, tmp_path, 12, [("seed", ["3", "4"])])
    kept = pd.read_csv(pending.paths(paths)["jobs"])
    held = sorted(zip(kept["arm"], kept["seed"], strict=True))
    assert held == [("adaln", 4), ("adaln_zero", 3), ("adaln_zero", 4)]
    said = capsys.readouterr().err  # seed 3 lacks a job: it runs again, seed 4 does not
    assert "cut short: its 3 finished job(s) are kept in dit_conditioning/pending/" in said
    assert "seed(s) 3 of the conditioning grid lack jobs that ran to their end" in said
    assert sorted(set(pd.read_csv(pending.paths(paths)["runs"])["seed"])) == [3, 4]
    # finished, the same jobs with seed 3's second arm would hold 5: off the looks still; at
    # 12 (a look) nothing is held, and --collect is named
    pending.paths(paths)["jobs"].parent.joinpath("jobs.csv").unlink()
    pending.paths(paths)["runs"].unlink()
    runs[:] = [SimpleNamespace(arm=a, seed=s, status="ok") for a in arms for s in range(3, 12)]
    script.keep_cut(name, repro, False, tmp_path, 12, [("seed", [str(s) for s in range(3, 12)])])
    assert "cut at a look: `--collect` with the same options" in capsys.readouterr().err
    assert not pending.paths(paths)["jobs"].exists()


def test_a_sweep_cut_short_calls_its_on_cut_then_stops(tmp_path, monkeypatch):
    """reproduce passes keep_cut as on_cut for a share of a grid: a sweep that stops short (an
    interrupt, a failure) calls it once, and the stop goes on as before."""
    from normlab.analysis.reproductions import REPRODUCTIONS

    script = _script()

    def cut(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(script.sweep, "run", cut)
    called = []
    with pytest.raises(KeyboardInterrupt):
        script.run_showing_progress(REPRODUCTIONS["dit_conditioning"], False, tmp_path, 1, 12, 1,
                                    on_cut=lambda: called.append("kept"))  # fmt: skip
    assert called == ["kept"]


def test_a_grid_arm_pattern_matches_its_own_arms_alone(tmp_path):
    """An interpolated value stands within one path segment: deepnorm_depth's loss grid
    (`${placement.name}/d${model.net.depth}`, run as post/d6) neither plans for nor holds the
    seeds of its update grid's arms (update/post/d6/w0)."""
    from normlab.analysis.sweep import Grid

    script = _script()
    loss = Grid("loss", "x", arm="${placement.name}/d${model.net.depth}")
    update = Grid("update", "x", arm="update/${placement.name}/d${model.net.depth}/w${optim.w}")
    assert script.reads("post/d6 deepnorm/d50", loss.arm)
    assert not script.reads("update/post/d6/w0 update/post/d50/w0", loss.arm)
    assert script.reads("update/post/d6/w0", update.arm)
    assert not script.reads("post/d6", update.arm)
    jobs = [("post/d6", s, "ok") for s in range(12)] + [("update/post/d6/w0", s, "ok") for s in
                                                         range(3)]  # fmt: skip
    pd.DataFrame(jobs, columns=["arm", "seed", "status"]).to_csv(tmp_path / "jobs.csv")
    held = script.seeds_run(tmp_path / "jobs.csv", [loss, update])
    assert held == {"loss": set(range(12)), "update": {0, 1, 2}}


def test_a_grid_whose_arm_interpolates_a_swept_key_is_found_by_its_jobs_arms(tmp_path):
    """pilot/lr${optim.optimizer.lr} runs as pilot/lr0.002, pilot/lr0.004, ...: a claim on one
    of those reads the grid, and the grid holds the seeds each of those arms has."""
    from normlab.analysis.sweep import Grid

    script = _script()
    pilot = Grid("pilot", "x", arm="pilot/lr${optim.optimizer.lr}")
    other = Grid("other", "x", arm="pilot")  # a prefix of the interpolated arm's, not its grid
    path = tmp_path / "c.claims.csv"
    rows = [("undecided (within noise)", 6.0, "pilot/lr0.002/b2 none")]
    pd.DataFrame(rows, columns=["verdict", "planned_seeds", "arms"]).to_csv(path, index=False)
    assert script.seeds_to_decide(path, 12, [pilot, other]) == {"pilot": 6}
    jobs = [("pilot/lr0.002", s, "ok") for s in (0, 1, 2)] + [
        ("pilot/lr0.004", s, "ok") for s in (0, 1)
    ]
    pd.DataFrame(jobs, columns=["arm", "seed", "status"]).to_csv(tmp_path / "jobs.csv")
    assert script.seeds_run(tmp_path / "jobs.csv", [pilot, other]) == {
        "pilot": {0, 1},
        "other": set(),
    }


def test_decide_runs_only_the_seeds_each_planned_grid_lacks(tmp_path, monkeypatch, capsys):
    """--decide: the first seeds (all of them on a fresh root; else only those the evidence
    lacks), then one run per (planned count, missing seeds) with the grids that plan it, only the
    missing seeds (--subset seed=..): a machine without the earlier sweep dirs reruns no finished
    seed. A seed with a job not ok, or without one of its settings (a b), counts as missing.
    Claims still undecided at their plan go on to the cap (the sequential design's third look)."""
    script = _script()
    figures = tmp_path / "outputs" / "figures"
    (figures / "gn_batch_size").mkdir(parents=True)
    claims = [
        ("undecided (within noise)", 5.0, "batchnorm/b2 groupnorm/b2"),
        ("undecided (within noise)", 4.0, "batchnorm/b32"),
        ("undecided (within noise)", 9.0, "batchnorm_precise/b2"),
        ("undecided (within noise)", 7.0, "pilot/gn"),
    ]  # a pilot keeps its own seeds

    def evidence(seeds: dict[str, list[int]]) -> None:
        frame = pd.DataFrame(claims, columns=["verdict", "planned_seeds", "arms"])
        frame.to_csv(figures / "gn_batch_size.claims.csv", index=False)
        rows = [(arm, s, "ok") for arm, ss in seeds.items() for s in ss for _ in ("b32", "b2")]
        frame = pd.DataFrame(rows, columns=["arm", "seed", "status"])
        frame.to_csv(figures / "gn_batch_size" / "jobs.csv", index=False)

    calls = []

    def fake(name, quick, jobs, root, seeds, grids=None, threads=None, subset=None, **launch):
        calls.append((seeds, grids, subset))
        evidence({"batchnorm": [0, 1, 2], "groupnorm": [0, 1, 2], "batchnorm_precise": [0, 1, 2]})

    monkeypatch.setattr(script, "reproduce", fake)
    grids = ["bn", "gn", "bn_precise", "pilot/gn"]
    script.decide("gn_batch_size", False, 1, tmp_path, grids)  # a fresh root: the first 3 seeds
    nine = [("seed", ["3", "4", "5", "6", "7", "8"])]
    to_cap = [("seed", [str(s) for s in range(3, 12)])]  # the fake lands no seed: all missing
    assert calls == [(3, grids, None), (5, ["bn", "gn"], [("seed", ["3", "4"])]),
                     (9, ["bn_precise"], nine), (12, ["bn", "gn", "bn_precise"], to_cap)]
    assert "grids bn, gn plan 5 seeds (cap 12); running seed(s) 3,4" in capsys.readouterr().out

    # the evidence holds gn's 3 and 4 already, but bn's seed 1 lacks its b=2 job
    evidence({"batchnorm": [0, 1, 2], "groupnorm": [0, 1, 2, 3, 4], "batchnorm_precise": [0, 1, 2]})
    jobs = pd.read_csv(figures / "gn_batch_size" / "jobs.csv")
    jobs.drop(jobs[(jobs["arm"] == "batchnorm") & (jobs["seed"] == 1)].index[:1]).to_csv(
        figures / "gn_batch_size" / "jobs.csv", index=False)  # fmt: skip
    calls.clear()
    record = lambda *a, **k: calls.append((a[4], a[5], k["subset"]))  # noqa: E731
    monkeypatch.setattr(script, "reproduce", record)
    script.decide("gn_batch_size", False, 1, tmp_path, grids)
    assert calls[:3] == [(3, ["bn"], [("seed", ["1"])]), (5, ["bn"], [("seed", ["1", "3", "4"])]),
                         (9, ["bn_precise"], nine)]  # fmt: skip
    assert {n for n, _, _ in calls[3:]} == {12}  # the third look: each grid to the cap


# ----- declared reproductions ------------------------------------------------------------------


def test_every_declared_reproduction_loads_with_its_arms_named_in_the_overrides():
    declared = sweep.declared()
    assert declared and all(r.grids for r in declared.values())
    for repro in declared.values():
        for g in repro.grids:
            assert g.arm and g.overrides[-1] == f"arm={g.arm}"
        assert 2 <= repro.initial_seeds <= repro.seed_cap


def test_a_declarations_yaml_alias_reuses_an_override_list_alone_or_extended(tmp_path):
    """`quick: &q [...]` names a list once; `*q` reuses it and `[*q, more]` extends it."""
    (tmp_path / "demo.yaml").write_text(
        "title: t\nanalysis: normlab.analysis.bn_lenet\n"
        "budgets: {full: {text: f}, quick: {text: q, overrides: [[a=1], b=2]}}\n"
        "grids:\n"
        "  one: {experiment: e, quick: &q [x=1, y=2], arms: {one/a: [[n=1, m=2]]}}\n"
        "  two: {experiment: e, quick: *q, arms: {two/a: []}}\n"
        "  three: {experiment: e, quick: [*q, z=3], arms: {three/a: []}}\n"
    )
    repro = sweep.load(tmp_path / "demo.yaml")
    one, two, three = repro.grids
    assert one.quick == two.quick == ("x=1", "y=2") and three.quick == ("x=1", "y=2", "z=3")
    assert one.overrides == ("n=1", "m=2", "arm=one/a") and repro.quick.overrides == ("a=1", "b=2")


def test_an_arms_name_interpolates_the_keys_its_grid_sweeps(compose, tmp_path):
    repro = sweep.declared()["ln_placement"]
    warmup = next(g for g in repro.grids if g.name == "warmup")
    one = {"placement": "post", "optim.optimizer.lr": "0.002", "optim.warmup_steps": "0"}
    fixed = [o for o in warmup.overrides if o.split("=")[0] not in one]  # one job of the sweep
    assert len(fixed) == len(warmup.overrides) - len(one)  # the grid sweeps these three keys
    cfg = compose([f"experiment={warmup.experiment}", *fixed,
                   *(f"{k}={v}" for k, v in one.items())], tmp_path)  # fmt: skip
    assert cfg.arm == "post/lr0.002/w0"


def test_proportions_give_newcombes_interval_and_fishers_exact_p():
    # Newcombe (1998), Table II, example (a): 56/70 vs 48/80 -> 0.2000 (0.0524, 0.3339)
    interval, p = stats.proportions(56, 70, 48, 80)
    assert interval.mean == pytest.approx(0.2)
    assert (interval.low, interval.high) == pytest.approx((0.0524, 0.3339), abs=5e-4)
    assert p == pytest.approx(scipy_stats.fisher_exact([[56, 14], [48, 32]])[1])


def test_a_count_claim_is_decided_by_fishers_test_on_the_side_of_the_difference():
    def claim(counts):
        return report.CountClaim("a fails more", "paper number", "failed seeds", counts,
                                 source="paper")  # fmt: skip

    assert claim((8, 8, 0, 8)).verdict == stats.HOLDS  # p = 0.00016
    assert claim((0, 8, 8, 8)).verdict == stats.FAILS
    assert claim((3, 8, 1, 8)).verdict == stats.UNDECIDED  # p = 0.57
    decision = gates.decide([claim((8, 8, 0, 8))], [], 3, 12)[0]
    assert decision.holm == stats.HOLDS and decision.p_value < 0.001


def test_an_any_claim_is_decided_on_its_valid_parts():
    def part(arm, values=(1.0, 1.1, 0.9, 1.05, 0.95)):
        return report.Claim("c", "p", "q", list(values), (0.5, stats.ABOVE), source="paper",
                            arms=(arm,), final=True)  # fmt: skip

    claim = report.AnyClaim("any", "p", {"a": part("a"), "b": part("b")}, source="paper")
    stuck = gates.Gate("b", "converged", False, "late gain 5%")
    ok = [gates.Gate(a, "converged", True, "late gain 0%") for a in "ab"]
    assert gates.decide([claim], ok, 3, 12)[0].verdict == stats.HOLDS
    assert gates.decide([claim], [ok[0], stuck], 3, 12)[0].verdict == stats.HOLDS  # a holds
    low = report.AnyClaim("any", "p", {"a": part("a", (0.1, 0.2, 0.0, 0.1, 0.15)), "b": part("b")},
                          source="paper")  # fmt: skip
    low_d = gates.decide([low], [ok[0], stuck], 3, 12)[0]
    assert low_d.verdict.startswith("invalid: b still improving")


def test_a_final_value_claim_needs_each_arms_convergence_shown_not_assumed():
    final = report.Claim("c", "p", "q", [1.0, 1.1, 0.9], (0.5, stats.ABOVE), source="paper",
                         arms=("a", "b"), final=True)  # fmt: skip
    early = report.Claim("e", "p", "q", [1.0, 1.1, 0.9], (0.5, stats.ABOVE), source="paper",
                         arms=("a", "b"))  # fmt: skip
    shown = [gates.Gate("a", "converged", True, ""), gates.Gate("b", "converged", None, "")]
    d_final, d_early = gates.decide([final, early], shown, 3, 12)
    assert d_final.verdict.startswith("invalid: b converged not measured; would decide it: its")
    assert math.isnan(d_final.p_value)
    assert d_early.verdict == stats.HOLDS  # not a final value: convergence is not asked
    both = gates.decide([final], [*shown[:1], gates.Gate("b", "converged", True, "")], 3, 12)
    assert both[0].verdict == stats.HOLDS


def test_a_verdict_reads_at_least_three_seeds():
    claim = report.Claim("c", "p", "q", [1.0, 1.1], (0.5, stats.ABOVE), source="paper")
    decision = gates.decide([claim], [], 3, 12)[0]
    assert decision.verdict == "undecided (2 seeds, fewer than 3)" == decision.holm
    # a failed gate on too few seeds: still no verdict; the gates column names the failure
    failed = gates.decide([report.Claim("c", "p", "q", [1.0], (0.5, stats.ABOVE), source="paper",
                                        arms=("a",))], [gates.Gate("a", "trained", False, "")],
                          3, 12)[0]  # fmt: skip
    assert failed.verdict == "undecided (1 seeds, fewer than 3)"
    assert failed.gates == "a did not train"


def test_the_family_counts_a_claim_precluded_and_invalid_once():
    """A precluded claim whose arm also fails a gate is one claim left out, not two, and its
    verdict gives both reasons (the family line names both kinds)."""
    both = report.Claim("both", "p", "q", [1.0, 1.1, 0.9], (0.5, stats.ABOVE), source="paper",
                        arms=("a",), precluded="not comparable: x")  # fmt: skip
    read = report.Claim("read", "p", "q", [1.0, 1.1, 0.9], (0.5, stats.ABOVE), source="paper")
    found = [gates.Gate("a", "trained", False, "")]
    decisions = gates.decide([both, read], found, 3, 12)
    assert decisions[0].verdict.startswith("invalid: a did not train; not comparable: x; would")
    table = report.claims_table([both, read], decisions, 3, 12)
    assert "Family: 2 claims, 1 tested" in table


def test_the_jobs_table_tells_apart_an_arms_jobs_of_one_seed():
    """Where an arm ran several jobs a seed (gn_batch_size: one per b), the jobs table shows
    what sets each apart; where every (arm, seed) is one job, it has no such column."""
    jobs = pd.DataFrame({
        "arm": ["bn", "bn", "bn", "gn"], "seed": [0, 0, 1, 0],
        "overrides": ["per_device=32 norm=batchnorm arm=bn seed=0",
                      "per_device=2 norm=batchnorm arm=bn seed=0",
                      "per_device=32 norm=batchnorm arm=bn seed=1", "norm=groupnorm arm=gn seed=0"],
        "status": "ok", "error": "", "wall_time_s": 1.0, "reused": 0,
    })  # fmt: skip
    assert report.settings(jobs) == ["per_device=32", "per_device=2", "per_device=32", ""]
    table = report.jobs_table(jobs)
    assert "| arm | seed | setting | status |" in table
    assert "| bn | 0 | per_device=2 | ok |" in table
    single = report.jobs_table(jobs.drop(index=1))
    assert report.settings(jobs.drop(index=1)) is None and "setting" not in single


def test_verdict_changes_name_the_rule_each_change_came_from():
    vc = _script_named("verdict_changes")
    assert vc.rule_of("invalid: a still improving", "holds") == "converged gate by schedule"
    assert vc.rule_of("undecided (within noise)", "absent at this scale (within ±1)").startswith(
        "equivalence")
    assert vc.rule_of("holds", "undecided (within noise); not past the boundary").startswith(
        "sequential boundary")
    assert vc.rule_of("invalid: p saturated", "holds").startswith("saturation one-sided")
    assert vc.rule_of("holds", "does not hold") == "its number (new evidence)"


def _script_named(name: str):
    import importlib
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    return importlib.import_module(name)
