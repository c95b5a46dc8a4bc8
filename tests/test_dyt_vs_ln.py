"""dyt_vs_ln's analysis: the LN-map fits, and verdicts that go either way on made-up runs.csv."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from normlab.analysis import claims as declared
from normlab.analysis import dyt_vs_ln as d
from normlab.analysis import gates
from normlab.analysis.logs import Run
from normlab.analysis.stats import FAILS, HOLDS

SEEDS = (0, 1, 2)


def test_fit_maps_tells_an_s_shape_from_a_line():
    rng = np.random.default_rng(0)
    x = rng.standard_t(3, 20_000) * 2  # heavy tails: the squashed ends are visible
    s_shape = d.fit_maps(x, 3 * np.tanh(0.6 * x) + rng.normal(0, 0.05, x.size))
    line = d.fit_maps(x, 0.7 * x + 0.1 + rng.normal(0, 0.05, x.size))
    u = {k: (1 - f["r2_tanh"]) / (1 - f["r2_line"]) for k, f in (("s", s_shape), ("l", line))}
    assert u["s"] < 0.05  # a tanh explains nearly all a line leaves
    assert 0.95 < u["l"] <= 1.0 + 1e-6  # a line's data: the tanh gains nothing
    assert s_shape["tanh_a"] * s_shape["tanh_b"] == pytest.approx(1.8, rel=0.05)  # slope at 0
    assert line["line_s"] == pytest.approx(0.7, abs=0.01)


def _runs(gpt_gap: float, fid_ratio: float, ln_shape: str) -> pd.DataFrame:
    """A made-up runs.csv: DyT's final val loss gpt_gap above LN's, its fid_lenet fid_ratio x
    LN's, and LN maps whose deeper layers are S-shaped ('s') or lines ('line')."""
    rows = []
    for seed in SEEDS:
        jitter = 0.002 * (seed - 1)
        for norm, loss in (("layernorm", 2.0), ("rmsnorm", 2.0 + jitter), ("dyt", 2.0 + gpt_gap)):
            rows += [(f"gpt/{norm}", seed, 600.0, "val/loss", loss + jitter),
                     (f"gpt/{norm}", seed, math.nan, "final/val_loss", loss + jitter),
                     (f"gpt/{norm}", seed, math.nan, "diverged", 0.0)]  # fmt: skip
        rows += [(d.RECIPE, seed, math.nan, "final/val_loss", 2.0 + gpt_gap + jitter),
                 (d.RECIPE, seed, math.nan, "diverged", 0.0)]  # DyT, the LLaMA recipe  # fmt: skip
        for norm, fid in (("layernorm", 20.0), ("dyt", 20.0 * fid_ratio), ("rmsnorm", 21.0)):
            rows.append((f"dit/{norm}", seed, math.nan, "final/fid_lenet", fid * (1 + jitter)))
        for depth in range(9):  # 4 blocks x 2 norms + the final norm
            r2_line = 0.99 if depth == 0 or ln_shape == "line" else 0.90
            r2_tanh = r2_line + (0.0005 if depth == 0 or ln_shape == "line" else 0.09)
            if depth > 0:  # seed noise; in lines, deeper layers a shade less tanh-like
                r2_tanh -= 0.001 * seed if ln_shape == "s" else 0.0002 - 0.00003 * seed
            for kind, value in (("r2_line", r2_line), ("r2_tanh", r2_tanh)):
                rows.append(("gpt/layernorm", seed, float(depth), f"ln_{kind}/layer{depth}", value))
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


def _declared(data: pd.DataFrame) -> list:
    """conf/reproduce/dyt_vs_ln.yaml's claims on these rows, as render builds them."""
    return declared.build("dyt_vs_ln", d.quantities(data), d.words(data))


def _verdicts(data: pd.DataFrame) -> dict[str, str]:
    return {c.claim: c.verdict for c in _declared(data)}


def test_verdicts_hold_when_dyt_matches_and_ln_is_s_shaped():
    verdicts = _verdicts(_runs(gpt_gap=0.001, fid_ratio=1.01, ln_shape="s"))
    assert len(verdicts) == 7  # 2 DyTs (drop-in, recipe) vs LN, vs RMSNorm; DiT; tanh; depth
    assert set(verdicts.values()) == {HOLDS}, verdicts


def test_verdicts_fail_when_dyt_is_worse_and_ln_maps_are_lines():
    verdicts = _verdicts(_runs(gpt_gap=0.3, fid_ratio=1.5, ln_shape="line"))
    matches = [v for c, v in verdicts.items() if "within" in c]
    assert matches == [FAILS] * 5  # 2 GPT DyTs vs LN, vs RMSNorm; DiT
    tanh = [v for c, v in verdicts.items() if "tanh" in c or "S-shape" in c]
    assert tanh[0] == FAILS  # u ~ 0.95 per layer: not below 0.5
    assert tanh[1] == FAILS  # deeper layers no more tanh-like than the first


def test_a_users_norm_is_one_more_claim_against_layernorm():
    data = _runs(gpt_gap=0.001, fid_ratio=1.0, ln_shape="s")
    extra = data[data["arm"] == "gpt/dyt"].assign(arm="gpt/meanonly")
    claims = [c.claim for c in _declared(pd.concat([data, extra]))]
    assert any(c.startswith("GPT: meanonly's final val loss is within") for c in claims)
    assert d.arms_of(pd.concat([data, extra]), "gpt") == ["layernorm", "dyt", "rmsnorm",
                                                          "meanonly"]  # fmt: skip


def test_render_draws_from_runs_csv_alone():
    result = d.render(_runs(gpt_gap=0.001, fid_ratio=1.0, ln_shape="s"))
    assert len(result.claims) == 7 and result.figure.axes


def test_a_drop_in_that_did_not_train_answers_its_claim():
    """The drop-in DyT at the unigram loss: not training is the failure its "within 0.05 nats"
    claims test, so they do not hold, and say why (not invalid)."""
    from normlab.analysis import gates

    data = _runs(gpt_gap=1.3, fid_ratio=1.0, ln_shape="s")
    unigram = 3.35
    rows = []
    for arm, final in (("gpt/dyt", 3.34), ("gpt/layernorm", 2.0), ("gpt/rmsnorm", 2.0),
                       ("gpt/dyt_recipe", 2.0)):
        for seed in SEEDS:
            rows += [(arm, seed, math.nan, "gate/trivial_loss", unigram),
                     (arm, seed, 599.0, "gate/val_loss", final),
                     (arm, seed, math.nan, gates.LR_END, 0.1),  # the GPT's cosine to 0.1
                     (arm, seed, math.nan, gates.DECAYS, 1.0)]  # fmt: skip
    for arm in (a for a in data["arm"].unique() if a.startswith("gpt/")):  # plateaued
        rows += [(arm, seed, float(s), gates.TRAIN_LOSS, 2.0) for seed in SEEDS
                 for s in range(0, 600, 10)]  # fmt: skip
    data = pd.concat([data, pd.DataFrame(rows, columns=data.columns)], ignore_index=True)
    result = d.render(data)
    decided = dict(zip((c.claim for c in result.claims),
                       gates.decide(result.claims, result.gates, 3, 12), strict=True))  # fmt: skip
    drop_in = [v.verdict for c, v in decided.items() if c.startswith("GPT: DyT (drop-in)")]
    assert drop_in == ["does not hold (gpt/dyt did not train: the failure the claim tests)"] * 2
    recipe = [v.verdict for c, v in decided.items() if c.startswith(f"GPT: {d.RECIPE_LABEL}")]
    assert recipe and not any(v.startswith("invalid") for v in recipe)


def _of(data: pd.DataFrame, start: str) -> list:
    """The declared claims whose words start so (e.g. 'DiT, ': the dit_long grid's)."""
    return [c for c in _declared(data) if c.claim.startswith(start)]


def _long(data: pd.DataFrame) -> list:
    """The long grids' claims (their words name the steps)."""
    return [c for c in _declared(data) if c.claim.startswith("GPT, ")]


def test_the_long_grids_test_the_recipe_against_each_base_that_ran():
    """long/layernorm and long/rmsnorm (the paper's LLaMA baseline): a claim each against the
    recipe at their steps, paired by seed; a base that did not run has no claim."""
    rows = []
    for seed in SEEDS:
        for arm, loss in (("layernorm", 1.61), ("rmsnorm", 1.70), ("dyt_recipe", 1.72)):
            loss += 0.001 * seed
            rows += [(f"{d.LONG}/{arm}", seed, 2999.0, "val/loss", loss),
                     (f"{d.LONG}/{arm}", seed, math.nan, "final/val_loss", loss)]  # fmt: skip
    data = pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])
    claims = {c.claim: c for c in _long(data)}
    recipe = f"GPT, 2,999 steps: {d.RECIPE_LABEL}'s final val loss is within +-0.05 nats of"
    vs_ln, vs_rms = claims[f"{recipe} LayerNorm's"], claims[f"{recipe} RMSNorm's"]
    assert vs_ln.values == pytest.approx([0.11] * 3) and vs_ln.verdict == FAILS
    assert vs_rms.values == pytest.approx([0.02] * 3) and vs_rms.verdict == HOLDS
    assert vs_rms.arms == (f"{d.LONG}/dyt_recipe", f"{d.LONG}/rmsnorm") and vs_rms.final
    without = _long(data[data["arm"] != f"{d.LONG}/rmsnorm"])
    assert [c.claim for c in without] == [f"{recipe} LayerNorm's"]


def test_the_long_dit_is_held_to_layernorm_at_its_steps_with_each_norms_piloted_lr():
    """dit_long: the patched DyT's fid_lenet against LayerNorm's at its steps, paired by seed;
    the lr pilot's note gives each norm's lowest and says where dit_long runs another lr."""
    rows = []
    for seed in SEEDS:
        for norm, fid, lr in (("layernorm", 10.0, 2e-3), ("dyt_patch", 10.5, 4e-3)):
            a = f"{d.DIT_LONG}/{norm}"
            rows += [(a, seed, 2400.0, "val/loss", 0.05), (a, seed, math.nan, d.LR, lr),
                     (a, seed, math.nan, "final/fid_lenet", fid * (1 + 0.001 * seed))]  # fmt: skip
    for norm, fids in (("layernorm", (11.0, 10.0, 10.5)), ("dyt_patch", (12.0, 11.0, 10.0))):
        for lr, fid in zip((2e-3, 4e-3, 8e-3), fids, strict=True):
            a = f"{d.DIT_LONG_LR}/{norm}/lr{lr:g}"
            rows.append((a, 0, math.nan, "final/fid_lenet", fid))  # its lr: in its name
    data = pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])
    (claim,) = _of(data, "DiT, ")
    assert claim.claim == ("DiT, 2,400 steps: DyT, authors' DiT patch's fid_lenet is within "
                           "+-10% of LayerNorm's")  # fmt: skip
    assert claim.values == pytest.approx([1.05] * 3) and claim.verdict == HOLDS
    assert claim.arms == (f"{d.DIT_LONG}/dyt_patch", f"{d.DIT_LONG}/layernorm") and claim.final
    assert _of(data, "DiT: ") == []  # the dit grid's arms absent: no claim read
    note = d._lr_pilot_note(data, d.DIT_LONG_LR, d.DIT_LONG, "lr pilot")
    assert (
        "(seed 0; fid_lenet by lr): LayerNorm: 0.002: 11.00; 0.004: 10.00; 0.008: 10.50; "
        "lowest at 0.004;" in note
    )
    assert "the dit_long grid runs it at 0.002, NOT the pilot's lowest (0.004)" in note
    assert "lowest at 0.008 (the grid's edge); the dit_long grid runs it at 0.004, NOT" in note
    fixed = data.copy()
    fixed.loc[(fixed["arm"] == f"{d.DIT_LONG}/layernorm") & (fixed["metric"] == d.LR),
              "value"] = 4e-3  # fmt: skip
    assert "runs it at 0.004, the pilot's lowest" in d._lr_pilot_note(
        fixed, d.DIT_LONG_LR, d.DIT_LONG, "lr pilot")  # fmt: skip
    twice = pd.concat([data, data[data["arm"].str.startswith(d.DIT_LONG_LR)].assign(seed=1)])
    note = d._lr_pilot_note(twice, d.DIT_LONG_LR, d.DIT_LONG, "lr pilot")  # --quick: 2 seeds
    assert "(mean of seeds 0, 1; fid_lenet by lr): LayerNorm: 0.002: 11.00; 0.004: 10.00;" in note
    logged = pd.DataFrame(
        [(f"{d.DIT_LONG_LR}/layernorm/lr0.002", 0, 800.0, "val/loss", 0.06)], columns=data.columns
    )  # the pilot's steps: its last val loss's
    note = d._lr_pilot_note(pd.concat([data, logged]), d.DIT_LONG_LR, d.DIT_LONG, "lr pilot")
    assert "(seed 0, 800 steps; the dit_long grid trains 2,400; fid_lenet by lr)" in note
    gated = d.render(pd.concat([_runs(0.001, 1.0, "s"), data], ignore_index=True)).gates
    assert {g.arm for g in gated} >= {f"{d.DIT_LONG}/layernorm", f"{d.DIT_LONG}/dyt_patch"}


def test_a_diverged_dit_seed_is_named_by_its_gate_and_claim_and_left_out_of_the_pairs():
    """A DiT job that diverged has no fid_lenet: runs.csv records that it diverged, the pairs
    read the seeds both arms finished, and the arm's trained gate and the claim's rule name it."""
    a_ln, a_dyt = f"{d.DIT_LONG}/layernorm", f"{d.DIT_LONG}/dyt_patch"
    gone = Run({"arm": a_ln, "seed": "3"}, "diverged", Path("."))
    rows = d.extract([gone]).values.tolist()
    assert rows == [[a_ln, 3, pytest.approx(math.nan, nan_ok=True), "diverged", 1.0]]
    for seed in (0, 1, 2, 3):
        for a, fid in ((a_ln, 10.0), (a_dyt, 10.5)):
            if (a, seed) == (a_ln, 3):
                continue
            rows += [(a, seed, 2400.0, "val/loss", 0.05), (a, seed, 2400.0, gates.VAL_LOSS, 0.05),
                     (a, seed, math.nan, "gate/trivial_loss", 1.0),
                     (a, seed, math.nan, "final/fid_lenet", fid * (1 + 0.001 * seed))]  # fmt: skip
    data = pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])
    (claim,) = _of(data, "DiT, ")
    assert claim.values == pytest.approx([1.05] * 3)  # seeds 0-2: seed 3 has no LN fid_lenet
    assert claim.quantity.endswith(
        "after 2,400 steps; left out, diverged (no fid_lenet): dit_long/layernorm seeds [3]"
    )
    ln, dyt = gates.trained(data, a_ln), gates.trained(data, a_dyt)
    assert ln.passed and ln.measured.endswith(
        "0 of 3 seeds within 5%; 1 diverged, no final loss (seed 3)"
    )
    assert dyt.passed and dyt.measured.endswith("0 of 4 seeds within 5%")
    finished = data[data["metric"] != "diverged"]  # none diverged: the texts as before
    assert "left out" not in _of(finished, "DiT, ")[0].quantity
    assert "diverged" not in gates.trained(finished, a_ln).measured
