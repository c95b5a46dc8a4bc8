"""bn_lenet: BatchNorm paper Fig. 1 (and Table 2's steps-to-accuracy) on Fashion-MNIST.

Two sigmoid networks, with and without BN after each hidden layer, the same SGD per network:
the BN paper's own MLP (3 x 100) on its protocol (weights from a small Gaussian, plain SGD,
batches of 60) and LeNet (the d2l BatchNorm chapter, SGD with momentum). The quantities: the
steps each net takes to 95% and 98% of the no-norm net's final held-out accuracy, the area under
the held-out accuracy curve, the test accuracy, and the drift of the sigmoid inputs. `extract`
reads the run logs into runs.csv; `render` draws the figure and decides the claims from runs.csv
alone.
"""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from normlab.analysis import claims as declared
from normlab.analysis import gates
from normlab.analysis.curves import crossing
from normlab.analysis.logs import Run
from normlab.analysis.report import Result

# the claims: conf/reproduce/bn_lenet.yaml's claims:, built by normlab.analysis.claims
TARGETS = (0.95, 0.98)  # fractions of the no-norm net's final accuracy the step counts reach
STEPS_RATIO, AUC = "steps_ratio", "auc"  # `quantities`' per-seed numbers beside runs.csv's

NETS = {"lenet": "LeNet", "mlp": "MLP 3x100 (the BN paper's)"}
DECAY = "lenet_decay"  # LeNet's grid with its lr decayed exponentially to 1% of its peak
COSINE = "lenet_cosine"  # and with it decayed by a cosine to 0 over twice the steps
EVERY = 20  # steps between held-out evaluations
SMOOTH = 5  # evaluations averaged (100 steps) before looking for the target
NORMS = {"none": "no norm", "batchnorm": "BatchNorm"}
QUANTILES = ("p15", "p50", "p85")
UNIT = re.compile(r"^preact/(?P<layer>.+)/u(?P<unit>\d+)/(?P<q>p\d\d)$")


# ----- run logs -> runs.csv -------------------------------------------------------------------


def unit_drift(metrics: pd.DataFrame) -> tuple[float, pd.DataFrame]:
    """Drift of every unit's sigmoid input, averaged over the layer's units, and unit 0's band.

    A unit's drift: (max - min over training of its median) / (mean over training of its
    15-85th percentile width): how far its input's centre wanders, in widths of its spread.
    """
    cols = {m.group("unit", "q"): c for c in metrics.columns if (m := UNIT.match(c))}
    if not cols:
        return math.nan, pd.DataFrame()
    units = sorted({u for u, _ in cols})
    rows = metrics.dropna(subset=[cols[(units[0], "p50")]]).sort_values("step")

    def q(name: str) -> np.ndarray:  # (steps, units)
        return rows[[cols[(u, name)] for u in units]].to_numpy(dtype=float)

    p15, p50, p85 = q("p15"), q("p50"), q("p85")
    drift = (p50.max(0) - p50.min(0)) / np.maximum((p85 - p15).mean(0), 1e-12)
    band = pd.DataFrame({"step": rows["step"].to_numpy(), **{n: v[:, 0] for n, v in
                         zip(QUANTILES, (p15, p50, p85), strict=True)}})  # fmt: skip
    return float(drift.mean()), band


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per job: held-out accuracy every 20 steps, final test accuracy, mean unit drift, and the
    percentiles of unit 0 (the one drawn)."""
    rows = []
    for run in runs:
        if run.status != "ok":
            continue
        a, seed = run.arm, int(run.get("seed"))
        acc = run.series("val/acc")
        rows += [
            (a, seed, float(s + 1), "val/acc", float(v))
            for s, v in zip(acc["step"], acc["val/acc"], strict=True)
        ]
        rows.append((a, seed, math.nan, "test/acc", run.last("test/acc")))
        rows += gates.gate_rows(run, a, seed)
        drift, band = unit_drift(run.metrics)
        rows.append((a, seed, math.nan, "drift", drift))
        for qn in QUANTILES if len(band) else ():
            rows += [(a, seed, float(s), f"unit0/{qn}", float(v))
                     for s, v in zip(band["step"], band[qn], strict=True)]  # fmt: skip
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


# ----- runs.csv -> claims and figure ----------------------------------------------------------


def _curve(data: pd.DataFrame, arm_: str, metric: str) -> dict[int, pd.Series]:
    """{seed: value by x} of a logged series."""
    rows = data[(data["arm"] == arm_) & (data["metric"] == metric)]
    return {int(s): g.set_index("x")["value"].sort_index() for s, g in rows.groupby("seed")}


def smooth(curve: pd.Series) -> pd.Series:
    """The mean of the last SMOOTH evaluations at each step (fewer at the start): the max of a
    raw curve of 2,000-image evaluations is partly noise."""
    return curve.rolling(SMOOTH, min_periods=1).mean()


def steps_to(curve: pd.Series, target: float) -> float:
    """The step at which the (smoothed) accuracy first rises to target (interpolated); NaN if
    never."""
    return crossing(curve, target, rising=True)


def final(curve: pd.Series) -> float:
    """A net's final held-out accuracy: the mean of its last SMOOTH evaluations."""
    return float(smooth(curve).iloc[-1])


def steps_ratio(plain: pd.Series, bn: pd.Series, fraction: float) -> float:
    """Steps the no-norm net takes to `fraction` of its final accuracy / steps BN takes to the
    same accuracy (both smoothed). Where BN never gets there, its steps are counted as one
    evaluation past its last one: an upper bound on the ratio, so the bias favours the paper."""
    target = fraction * final(plain)
    bn_steps = steps_to(smooth(bn), target)
    if math.isnan(bn_steps):
        bn_steps = float(bn.index[-1]) + EVERY
    return steps_to(smooth(plain), target) / bn_steps


def auc(curve: pd.Series) -> float:
    """The mean held-out accuracy over the run (area under the curve / its steps), points."""
    x, y = curve.index.to_numpy(dtype=float), curve.to_numpy(dtype=float)
    return 100.0 * float(np.trapezoid(y, x) / (x[-1] - x[0]))


def quantities(data: pd.DataFrame) -> pd.DataFrame:
    """runs.csv's rows and, from each net's held-out accuracy curves, per seed: the steps ratio
    at each of TARGETS (under the BN arm, x the target) and each arm's area under its curve
    (auc): the quantities conf/reproduce/bn_lenet.yaml's claims read."""
    rows = []
    for net in NETS:
        arms = (f"{net}/batchnorm", f"{net}/none")
        bn_acc, plain_acc = _curve(data, arms[0], "val/acc"), _curve(data, arms[1], "val/acc")
        seeds = sorted(set(bn_acc) & set(plain_acc))
        rows += [(arms[0], s, f, STEPS_RATIO, steps_ratio(plain_acc[s], bn_acc[s], f))
                 for f in TARGETS for s in seeds]  # fmt: skip
        for a, acc in zip(arms, (bn_acc, plain_acc), strict=True):
            rows += [(a, s, math.nan, AUC, auc(acc[s])) for s in seeds]
    if not rows:
        return data
    return pd.concat([data, pd.DataFrame(rows, columns=data.columns)], ignore_index=True)


def _decayed(ax: plt.Axes, data: pd.DataFrame) -> None:
    """LeNet's held-out accuracy at the end of a decaying lr: exponential to 1% over the 2,700
    steps (the BN paper's kind of decay; dotted), and a cosine to 0 over twice the steps
    (dashed). Its claims, final test accuracy, are the yaml's."""
    for grid, style, how in ((DECAY, ":", "exponential"), (COSINE, "--", "cosine")):
        for j, (norm, label) in enumerate(NORMS.items()):
            for line in _seed_lines(ax, _curve(data, f"{grid}/{norm}", "val/acc"), f"C{j}",
                                    f"{label}, lr decayed ({how})"):  # fmt: skip
                line.set_linestyle(style)


def _seed_lines(
    ax: plt.Axes, curves: dict[int, pd.Series], color: str, label: str
) -> list[plt.Line2D]:
    """Each seed thin, their mean (at the x every seed has) thick; the lines drawn."""
    lines = []
    for curve in curves.values():
        lines += ax.plot(curve.index, curve.values, color=color, alpha=0.3, lw=0.8)
    if curves:
        mean = pd.concat(curves.values(), axis=1).dropna().mean(axis=1)
        lines += ax.plot(mean.index, mean.values, color=color, lw=2,
                         label=f"{label} ({len(curves)} seeds)")  # fmt: skip
    return lines


def render(data: pd.DataFrame) -> Result:
    """Per network: held-out accuracy against steps, and unit 0's percentiles without / with BN."""
    fig, axes = plt.subplots(len(NETS), 3, figsize=(15, 4.2 * len(NETS)), squeeze=False)
    arms = []
    for i, (net, title) in enumerate(NETS.items()):
        ax_acc = axes[i][0]
        for j, (norm, label) in enumerate(NORMS.items()):
            _seed_lines(ax_acc, _curve(data, f"{net}/{norm}", "val/acc"), f"C{j}", label)
            ax = axes[i][1 + j]  # (b) without BN, (c) with BN, as in the paper
            bands = {q: _curve(data, f"{net}/{norm}", f"unit0/{q}") for q in QUANTILES}
            for k, seed in enumerate(sorted(bands["p50"])):
                for q, style in zip(QUANTILES, ("--", "-", "--"), strict=True):
                    c = bands[q][seed]
                    ax.plot(c.index, c.values, style, color=f"C{k + 2}", lw=1,
                            label=f"seed {seed}" if q == "p50" else None)  # fmt: skip
            ax.set_title(f"{title}: {label}, unit 0 of the last hidden layer\n"
                         "15/50/85th percentiles of its sigmoid input", fontsize=9)  # fmt: skip
            ax.set_xlabel("training step")
            if ax.lines:
                ax.legend(fontsize=7)
        lows, highs = zip(*(axes[i][k].get_ylim() for k in (1, 2)), strict=True)
        for k in (1, 2):  # the two band panels of a row share their y range
            axes[i][k].set_ylim(min(lows), max(highs))
        ax_acc.set_title(f"{title}: held-out accuracy (2,000 images)", fontsize=9)
        ax_acc.set_xlabel("training step")
        ax_acc.set_ylabel("accuracy")
        if ax_acc.lines:
            ax_acc.legend(fontsize=8)
        arms += [f"{net}/{norm}" for norm in NORMS]
        if net == "lenet":  # the same LeNet at the end of a decayed lr
            _decayed(ax_acc, data)
            arms += [f"{grid}/{norm}" for grid in (DECAY, COSINE) for norm in NORMS]
    fig.suptitle("BatchNorm on sigmoid networks, Fashion-MNIST (BN paper Fig. 1)")
    fig.tight_layout()
    notes = [
        "Held fixed across seeds: the 5,000 held-out images (split_seed=0), of which the first "
        "2,000 are scored every 20 steps, and the 10k test images. A seed sets the init, the "
        "data order and so the images seen; BN and no-norm runs of one seed share all three "
        "(the norm layers draw no random numbers).",
        "Steps to a target as in the BN paper's Table 2, with the target a fraction (95%, 98%) "
        "of the no-norm net's final held-out accuracy (the mean of its last "
        f"{SMOOTH} evaluations), per seed: its steps to the target over BN's steps to the same "
        f"accuracy. Both curves are first averaged over {SMOOTH} consecutive evaluations "
        f"({SMOOTH * EVERY} steps): a 2,000-image evaluation is partly noise.",
        "MLP: the paper's protocol (Sec. 4.1): 3 x 100 sigmoid units, weights drawn from "
        "N(0, 0.01^2) ('small random Gaussian values'; the std is ours, the paper gives none), "
        "zero biases, plain SGD (lr 0.5, ours: the paper gives none) on batches of 60, the same "
        "for both arms; 22,500 steps on Fashion-MNIST (the paper: 50k on MNIST). LeNet: "
        "PyTorch's default init, SGD with momentum 0.9, lr 0.1, 2,700 steps; its no-norm net "
        "may still be rising at the end, which the converged gate reports: then its final "
        "test accuracy is a speed claim at that budget. LeNet, lr decayed: the same "
        "recipe with the lr decayed exponentially from 0.1 to 0.001 over the 2,700 steps "
        "(dotted), and by a cosine from 0.1 to 0 over 5,400 steps (dashed), so both arms end "
        "at the schedule's floor.",
    ]
    claims = declared.build("bn_lenet", quantities(data), {"every": EVERY, "smooth": SMOOTH})
    return Result(fig, claims, notes, gates.gates(data, arms))
