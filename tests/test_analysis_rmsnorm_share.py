"""rmsnorm_speed's per-model arms: LayerNorm's share s of a step, the op ratio r, the step ratio
1 - s(1 - r) they predict, and the `unreachable` verdict when s is below the paper's 7%."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from normlab.analysis import gates, report, rmsnorm_speed, stats
from normlab.analysis.logs import Run

STEPS = 41


def _model_run(model: str, norm: str, seed: int, s: float, r: float, off: float = 0.0) -> Run:
    """A per-model speed job: LayerNorm's twin at 100 + seed ms (spread +-2% over the steps), the
    no-norm twin at (1 - s) of it, LayerNorm's calls at 10 ms and the norm's at r x 10 ms, and
    the norm's twin at 1 - s(1 - r) + `off` of LayerNorm's (spread alike)."""
    i = np.arange(STEPS)
    base = (100.0 + seed) * (1 + 0.02 * np.sin(i))
    wobble = 1 + 0.004 * np.cos(3 * i)
    rows = [{"step": 0, "lr-AdamW/pg1": 1e-5}]  # a row of another metric: not a step
    rows += [
        {"step": 10 + k, "time/model_step_ms": base[k] * (1 - s * (1 - r) + off) * wobble[k],
         "time/baseline_step_ms": base[k], "time/identity_step_ms": base[k] * (1 - s) / wobble[k],
         "time/model_op_ms": 10.0 * r * wobble[k], "time/baseline_op_ms": 10.0,
         "time/baseline_first": float(k % 2)}
        for k in i
    ]  # fmt: skip
    overrides = {"experiment": "rmsnorm_speed", "norm": norm, "num_threads": "1",
                 "seed": str(seed), "arm": f"speed/{model}/{norm}/t1"}  # fmt: skip
    return Run(overrides, "ok", Path("."), metrics=pd.DataFrame(rows))


# model -> (LayerNorm's share, RMSNorm's op ratio, measured step ratio off its prediction by)
SETTINGS = {"gpt128": (0.03, 0.5, 0.0), "gpt256": (0.10, 0.5, 0.05), "lstm": (0.30, 0.6, 0.0)}


@pytest.fixture(scope="module")
def result() -> report.Result:
    runs = [
        _model_run(model, norm, seed, s, 1.0 if norm == "layernorm" else r, off)
        for model, (s, r, off) in SETTINGS.items()
        for norm in ("layernorm", "rmsnorm")
        for seed in range(3)
    ]
    data = rmsnorm_speed.extract(runs)
    assert set(data.columns) == set(report.RUNS_COLUMNS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rmsnorm_speed, "RESAMPLES", 1000)  # the intervals' width is not tested
        out = rmsnorm_speed.render(data)
    yield out
    plt.close(out.figure)


def _claim(result: report.Result, start: str, model: str) -> report.IntervalClaim:
    label = rmsnorm_speed.model_label(model)
    return next(c for c in result.claims if c.claim.startswith(start) and label in c.claim)


def test_share_op_ratio_and_prediction_arithmetic():
    table = pd.DataFrame({
        rmsnorm_speed.MODEL_MS: [97.0, 97.0], rmsnorm_speed.BASELINE_MS: [100.0, 100.0],
        rmsnorm_speed.IDENTITY_MS: [90.0, 90.0], rmsnorm_speed.MODEL_OP: [3.0, 3.0],
        rmsnorm_speed.BASELINE_OP: [10.0, 10.0],
    }, index=pd.MultiIndex.from_tuples([(0, 1), (0, 2)], names=["seed", "x"]))  # fmt: skip
    columns = {c: table[c].to_numpy() for c in table}
    assert rmsnorm_speed.share(columns) == pytest.approx(0.10)
    assert rmsnorm_speed.op_ratio(columns) == pytest.approx(0.3)
    numbers = rmsnorm_speed.speed_numbers(columns)
    assert numbers["predicted"] == pytest.approx(1 - 0.10 * (1 - 0.3))  # 0.93
    assert numbers["gap"] == pytest.approx(0.97 - 0.93)
    joint = rmsnorm_speed.joint_intervals(table)
    assert joint["measured"].mean == pytest.approx(0.97) and joint["s"].mean == pytest.approx(0.1)


def test_unreachable_when_the_share_is_below_seven_percent(result):
    faster = "RMSNorm trains faster than LayerNorm by at least the paper's smallest gain"
    small, wide, lstm = (_claim(result, faster, m) for m in ("gpt128", "gpt256", "lstm"))
    assert small.verdict.startswith("unreachable: LayerNorm is s=0.030 [")
    assert small.verdict.endswith("of the step, so no norm can save 7%")
    assert small.interval.mean == pytest.approx(1 - 0.03 * 0.5, abs=2e-3)  # still shown
    assert not wide.precluded and wide.verdict == stats.FAILS  # s = 0.10: the claim is read
    assert not lstm.precluded and lstm.verdict == stats.HOLDS  # 1 - 0.3 x 0.4 = 0.88 < 0.93
    decisions = gates.decide(result.claims, result.gates, 3, 12)
    decided = dict(zip([c.claim for c in result.claims], decisions, strict=True))
    assert decided[small.claim].verdict == decided[small.claim].holm == small.precluded
    assert math.isnan(decided[small.claim].p_value)  # not in Holm's family
    assert decided[lstm.claim].verdict == stats.HOLDS
    table = report.claims_table(result.claims, decisions, 3, 12)
    assert "or precluded (its verdict says why)" in table
    assert f"**{small.precluded}**" in table


def test_op_ratio_and_prediction_claims(result):
    op = "RMSNorm's own calls take at least 7% less time than LayerNorm's"
    for model, (_, r, _) in SETTINGS.items():
        claim = _claim(result, op, model)
        assert claim.interval.mean == pytest.approx(r, abs=5e-3)
        assert claim.source == "paper" and claim.verdict == stats.HOLDS
    agree = "RMSNorm's step ratio to LayerNorm is the one its share and op ratio predict"
    assert _claim(result, agree, "gpt128").verdict == stats.HOLDS
    assert _claim(result, agree, "lstm").verdict == stats.HOLDS
    off = _claim(result, agree, "gpt256")  # measured 0.05 above its prediction
    assert off.verdict == stats.FAILS and off.interval.mean == pytest.approx(0.05, abs=5e-3)
    assert off.source == "ours" and off.region == (-0.02, 0.02) and "1 - s(1 - r)" in off.why
    assert not any("LayerNorm (control)" in c.claim for c in result.claims)


def test_share_table_and_notes(result):
    table = result.sections["Norm share"]
    rows = [line for line in table.splitlines() if line.startswith("| GPT") or "LSTM" in line]
    assert len(rows) == 6  # 3 models x (control, RMSNorm)
    lstm = next(line for line in rows if "LN-LSTM" in line and "RMSNorm" in line)
    cells = [c.strip() for c in lstm.strip("|").split("|")]
    assert cells[3].startswith("0.300 [") and cells[4].startswith("0.600 [")
    assert cells[5].startswith("0.880 [") and cells[7] == str(3 * STEPS)
    assert any("no norm" in n and "GPT d_model 256, RMSNorm" in n for n in result.notes)
    assert not any(rmsnorm_speed.EARLIER_LAYOUT == n for n in result.notes)
