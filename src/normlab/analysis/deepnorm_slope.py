"""deepnorm_depth's grid `model_update`: DeepNet's model update against depth (Wang et al. 2022).

F is the blocks (experiment=deepnorm_model_update, callbacks.update_norm.blocks): their output
on the stream that entered the first block at init, so that neither the embedding's own change
nor the head counts. The quantity is relative, ||F(x, θ_1) - F(x, θ_0)|| / ||F(x, θ_0)||, after
one AdamW step without warmup, per lr. The claims (conf/reproduce/deepnorm_depth.yaml's, the
`each: {lr: from_data}` group): the log-log slope of the update against depth (per seed, least
squares over the depths) for Post-LN and for DeepNorm, and DeepNorm's update over Post-LN's at
each depth. Post-LN's and DeepNorm's blocks end in a LayerNorm, so the output of every token
has norm sqrt(d_model): a relative update of 1 means the output turned by 60 degrees (an output
unrelated to the first reads sqrt(2), the most is 2). At or above CEILING an arm is saturated,
and the not-saturated gate makes the claims reading it invalid.
"""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import pandas as pd

from normlab.analysis import gates
from normlab.analysis.logs import Run
from normlab.analysis.stats import Interval
from normlab.tables import markdown_table

STEP = 1  # the update after this many steps: the paper's "per SGD step after initialization"
CEILING = 1.0  # relative update at which the blocks' output is saturated (module docstring)
PREFIX = "model_update"
ARM = re.compile(rf"^{PREFIX}/(?P<placement>\w+)/d(?P<depth>\d+)/lr(?P<lr>[0-9.eE+-]+)$")
METRICS = {"update/blocks": "blocks", "update/model": "whole model"}
PLACEMENTS = {"post": "Post-LN", "deepnorm": "DeepNorm"}
LR_STYLES = (":", "--", "-", "-.")  # the smallest lr dotted, the next dashed, ...


def arm(placement: str, depth: int, lr: float) -> str:
    return f"{PREFIX}/{placement}/d{depth}/lr{lr:g}"


def is_arm(name: str) -> bool:
    return ARM.match(name) is not None


# ----- run logs -> runs.csv -------------------------------------------------------------------


def rows(run: Run, seed: int) -> list[tuple]:
    """The relative updates after each logged step, with the gate's value and ceiling (the
    blocks' update) at each; the arm is named by its lr as `float:g` writes it (a norm's arm
    added to the grid, <grid>/<norm>/..., as it ran)."""
    m = ARM.match(run.arm)
    a = arm(m["placement"], int(m["depth"]), float(m["lr"])) if m else run.arm
    out = []
    for metric in METRICS:
        s = run.series(metric).drop_duplicates("step", keep="last")
        out += [
            (a, seed, float(x), metric, float(v)) for x, v in zip(s["step"], s[metric], strict=True)
        ]
        if metric == "update/blocks":
            out += [
                (a, seed, float(x), "gate/value", float(v))
                for x, v in zip(s["step"], s[metric], strict=True)
            ]
            out += [(a, seed, float(x), "gate/ceiling", CEILING) for x in s["step"]]
    return out


# ----- runs.csv -> claims, gates, figure, notes -----------------------------------------------


def grid(data: pd.DataFrame) -> tuple[list[int], list[float]]:
    """The depths and lrs of the grid in runs.csv."""
    found = [m.groupdict() for a in data["arm"].unique() if (m := ARM.match(a))]
    return sorted({int(m["depth"]) for m in found}), sorted({float(m["lr"]) for m in found})


def arms(data: pd.DataFrame) -> list[str]:
    return sorted(a for a in data["arm"].unique() if is_arm(a))


def at_step(
    data: pd.DataFrame, placement: str, depths: list[int], lr: float, metric: str = "update/blocks"
) -> pd.DataFrame:
    """The update after STEP steps: a row per seed, a column per depth (NaN where missing)."""
    cols = {}
    for d in depths:
        sel = data[
            (data["arm"] == arm(placement, d, lr))
            & (data["metric"] == metric)
            & (data["x"] == float(STEP))
        ]
        cols[d] = sel.set_index("seed")["value"]
    return pd.DataFrame(cols)


def _lr_text(lr: float) -> str:
    return f"lr {lr:g}"


def ratio(data: pd.DataFrame, depth: int, lr: float) -> list[float]:
    """{seed: DeepNorm's relative update / Post-LN's} at one depth and lr, seeds both have."""
    both = pd.concat(
        [at_step(data, p, [depth], lr)[depth] for p in ("deepnorm", "post")],
        axis=1,
        keys=["d", "p"],
    ).dropna()
    return list(both["d"] / both["p"])


def words(data: pd.DataFrame) -> dict:
    """What conf/reproduce/deepnorm_depth.yaml's model_update claims read from the data: its
    lrs (as the arms name them), depths, and the step the update is read after."""
    depths, lrs = grid(data)
    return {"lr": [f"{lr:g}" for lr in lrs], "depth": depths, "step": STEP}


def found_gates(data: pd.DataFrame) -> list[gates.Gate]:
    """The not-saturated gate of every arm (one step: the trained gates do not apply)."""
    return [gates.not_saturated(data, a) for a in arms(data)]


def _styles(lrs: list[float]) -> dict[float, str]:
    return {lr: LR_STYLES[k % len(LR_STYLES)] for k, lr in enumerate(lrs)}


def depth_panel(ax: plt.Axes, data: pd.DataFrame) -> None:
    """The blocks' relative update after STEP against depth: geometric mean over seeds, seeds as
    dots, a line per placement and lr; the ceiling drawn."""
    depths, lrs = grid(data)
    styles = _styles(lrs)
    for k, placement in enumerate(PLACEMENTS):
        for lr in lrs:
            table = at_step(data, placement, depths, lr)
            ax.plot(
                depths,
                [Interval.of(table[d].dropna(), log=True).mean for d in depths],
                styles[lr],
                marker="o",
                color=f"C{k}",
                label=f"{PLACEMENTS[placement]}, {_lr_text(lr)}",
            )
            for d in depths:
                v = table[d].dropna()
                ax.plot([d] * len(v), v.values, ".", color=f"C{k}", alpha=0.35)
    ax.axhline(
        CEILING,
        color="red",
        lw=1.0,
        ls="--",
        label=f"ceiling {CEILING:g}: saturated (output turned 60°)",
    )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="depth (blocks)",
        ylabel=f"||F(x,θ_{STEP}) - F(x,θ_0)|| / ||F(x,θ_0)||, F = the blocks",
        title=f"DeepNet's model update after step {STEP}, no warmup: geometric mean, seeds",
    )
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.legend(fontsize=7, ncol=2, loc="lower right")


def ratio_panel(ax: plt.Axes, data: pd.DataFrame) -> None:
    """DeepNorm's update / Post-LN's against depth, per lr: geometric mean over seeds, 95% CI."""
    depths, lrs = grid(data)
    styles = _styles(lrs)
    for lr in lrs:
        intervals = [Interval.of(ratio(data, d, lr), log=True) for d in depths]
        ax.errorbar(
            depths,
            [i.mean for i in intervals],
            yerr=[
                [i.mean - i.low if i.known else 0.0 for i in intervals],
                [i.high - i.mean if i.known else 0.0 for i in intervals],
            ],
            fmt=styles[lr],
            marker="o",
            color="C2",
            capsize=3,
            label=_lr_text(lr),
        )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="depth (blocks)",
        ylabel="DeepNorm's relative update / Post-LN's",
        title=f"DeepNorm against Post-LN after step {STEP}: geometric mean, 95% CI",
    )
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.legend(fontsize=7)


def table(data: pd.DataFrame) -> str:
    """The relative updates after STEP, blocks and whole model: geometric means over seeds."""
    depths, lrs = grid(data)
    out = []
    for lr in lrs:
        for placement, label in PLACEMENTS.items():
            for metric, name in METRICS.items():
                t = at_step(data, placement, depths, lr, metric)
                means = [Interval.of(t[d].dropna(), log=True).mean for d in depths]
                out.append(
                    [
                        _lr_text(lr),
                        label,
                        name,
                        *("n/a" if math.isnan(m) else f"{m:.3g}" for m in means),
                    ]
                )
    return markdown_table(["lr", "placement", "F", *(f"depth {d}" for d in depths)], out)


def notes(data: pd.DataFrame) -> list[str]:
    """How the model update was measured, and its table."""
    return [
        f"DeepNet's model update (grid `{PREFIX}`, experiment=deepnorm_model_update): "
        f"||F(x, θ_{STEP}) - F(x, θ_0)|| / ||F(x, θ_0)|| after {STEP} AdamW step(s) at a constant "
        "lr without warmup, Frobenius norms over 8 sequences of the run's first training batch "
        "(eval mode). F = the blocks: run on the stream that entered the first block at init, so "
        "the embedding's own change and the head are left out (DeepNet's theorems bound the "
        "update of the N layers; the embedding and head are the same in both placements, and "
        "the relative measure needs no scale of its own; the paper plots the absolute ||∆F||, "
        "and as the blocks' output ends in a LayerNorm in both placements, of norm sqrt(d_model) "
        "per token at init, the relative update is the absolute one over a constant shared by "
        "every arm). Fig. 5's models are 64-128-2 tiny Transformers of depth 6L-6L to 100L-100L; "
        "here a decoder of width 64. F = the whole model: the logits, "
        "embedding and head included. Slopes are least squares over the depths within a seed; "
        f"ratios within a seed, averaged on the log scale. The ceiling: {CEILING:g} (the "
        "blocks' output ends in a LayerNorm, so this is an output turned by 60°; unrelated "
        "outputs read sqrt(2)); an arm with a seed at or above it is saturated and the claims "
        f"reading it invalid. Geometric means over seeds:\n\n{table(data)}\n",
    ]
