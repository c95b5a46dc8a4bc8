"""ln_rnn's analysis on made-up runs.csv: the lr pilot, the claims at each LSTM's best lr, gates."""

from __future__ import annotations

import math

import pandas as pd

from normlab.analysis import gates
from normlab.analysis import ln_rnn as r

SEEDS = (0, 1, 2)
COLUMNS = ["arm", "seed", "x", "metric", "value"]


def _job(arm: str, seed: int, lr: float, end: float, trivial: float = 3.3) -> list[tuple]:
    """A job whose val loss falls from 3.0 to `end` over 1,200 steps, its train loss flat at
    the end (converged), at lr `lr`."""
    steps = range(50, 1201, 50)
    val = [end + (3.0 - end) * math.exp(-s / 150) for s in steps]
    rows = [(arm, seed, float(s), "val/loss", v) for s, v in zip(steps, val, strict=True)]
    rows += [(arm, seed, math.nan, "final/val_loss", val[-1]),
             (arm, seed, math.nan, "diverged", 0.0),
             (arm, seed, math.nan, "lr", lr), (arm, seed, math.nan, "gate/trivial_loss", trivial),
             (arm, seed, 1199.0, "gate/val_loss", val[-1]),
             (arm, seed, math.nan, gates.LR_END, 0.1),  # the LSTM's cosine to 0.1 x its peak
             (arm, seed, math.nan, gates.DECAYS, 1.0)]  # fmt: skip
    rows += [(arm, seed, float(s), "gate/train_loss", v) for s, v in zip(steps, val, strict=True)]
    return rows


def _runs(ln_lr: float = 2e-3, plain_end: float = 1.8, ln_end: float = 1.6) -> pd.DataFrame:
    """Pilot: the plain LSTM best at 1e-3, the LN-LSTM at 2e-3; main at ln_lr for the LN-LSTM."""
    rows = []
    for norm, ends in (("none", (1.9, 1.8, 1.85)), ("layernorm", (1.7, 1.65, 1.6))):
        for lr, end in zip((5e-4, 1e-3, 2e-3), ends, strict=True):
            rows += _job(f"pilot/{norm}/lr{lr:g}", 0, lr, end)
    for seed in SEEDS:
        rows += _job("none", seed, 1e-3, plain_end + 0.01 * seed)
        rows += _job("layernorm", seed, ln_lr, ln_end + 0.01 * seed)
    return pd.DataFrame(rows, columns=COLUMNS)


def test_the_pilot_table_marks_each_lstms_lowest_and_checks_the_main_arms():
    data = _runs()
    table = r.pilot(data)
    assert list(zip(table["norm"], table["lr"], strict=True)) == [
        ("layernorm", 5e-4), ("layernorm", 1e-3), ("layernorm", 2e-3),
        ("none", 5e-4), ("none", 1e-3), ("none", 2e-3)]  # fmt: skip
    note = r.pilot_note(data)
    assert "LN-LSTM at lr 0.002, the pilot's lowest (the grid's edge)" in note
    assert "plain LSTM at lr 0.001, the pilot's lowest." in note
    assert "NOT" not in note
    off = r.pilot_note(_runs(ln_lr=1e-3))  # the main arm not at the pilot's lowest: said so
    assert "LN-LSTM at lr 0.001, NOT the pilot's lowest (0.002)" in off


def test_claims_compare_the_main_arms_and_can_fail():
    holds = {c.claim: c.verdict for c in r.render(_runs()).claims}
    assert all(v == "holds" for v in holds.values()), holds
    worse = {c.claim: c.verdict for c in r.render(_runs(ln_end=2.0)).claims}
    assert all(v == "does not hold" for v in worse.values()), worse


def test_an_arm_at_the_trivial_loss_makes_its_claims_invalid():
    data = _runs()
    stuck = data["arm"].eq("layernorm") & data["metric"].eq("gate/trivial_loss")
    data.loc[stuck, "value"] = 1.5  # the LN-LSTM's final val loss is above 0.95 x this
    result = r.render(data)
    decided = gates.decide(result.claims, result.gates, 3, 12)
    verdicts = [d.verdict.split("; would")[0] for d in decided]
    assert verdicts == ["invalid: layernorm did not train"] * 2
    shown = {(g.arm, g.gate): g.passed for g in result.gates}
    assert shown[("pilot/none/lr0.001", "converged")] is True  # the pilot's arms shown too
