"""deepnorm_depth: DeepNet (Wang et al. 2022), the early model update by depth and deep training.

Two grids. `update` (experiment=deepnorm_update): ||F(x, theta_t) - F(x, theta_0)|| after each
of the first 50 steps, Post-LN and DeepNorm at depth 6, 18 and 50, without warmup and with it.
`loss` (experiment=deepnorm_depth): the val loss of Post-LN and DeepNorm at depth 6 and 50 after
300 steps. `extract` reads the run logs into runs.csv; `render` draws the figure and decides the
claims from runs.csv alone.
"""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from normlab.analysis import claims as declared
from normlab.analysis import deepnorm_slope, gates
from normlab.analysis.curves import (
    DIVERGED_LOSS,
    VOCAB,
    diverged_seeds,
    final_loss,
    metric,
    paired,
    seed_curves,
    val_loss_rows,
)
from normlab.analysis.logs import Run
from normlab.analysis.report import Result
from normlab.analysis.stats import Interval
from normlab.tables import markdown_table

# ----- the claims: conf/reproduce/deepnorm_depth.yaml's claims:, built by normlab.analysis.claims
EARLY_STEP = 1  # "early update": update_norm after this many steps (the issue's and Fig. 4's start)
SHOWN_STEPS = (*range(1, 11), 20, 50)  # the steps the md's table lists

PLACEMENTS = {"post": "Post-LN", "deepnorm": "DeepNorm"}
UPDATE = "deepnorm_update"
UPDATE_ARM = re.compile(r"^update/(?P<placement>\w+)/d(?P<depth>\d+)/w(?P<warmup>\d+)$")
LOSS_ARM = re.compile(r"^(?P<placement>\w+)/d(?P<depth>\d+)$")


# ----- run logs -> runs.csv -------------------------------------------------------------------


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per update job: update_norm after each step (x = steps taken). Per loss job: the val loss
    curve, its last val loss and whether it diverged."""
    rows = []
    for run in runs:
        a, seed = run.arm, int(run.get("seed"))
        if a.startswith(f"{deepnorm_slope.PREFIX}/"):  # a norm's arm too (a report card's)
            rows += deepnorm_slope.rows(run, seed) if run.status in ("ok", "diverged") else []
            continue
        if not a.startswith("update/"):
            rows += val_loss_rows(run, a, seed) + gates.gate_rows(run, a, seed)
            continue
        if run.status not in ("ok", "diverged"):
            continue
        s = run.series("update_norm").drop_duplicates("step", keep="last")
        rows += [
            (a, seed, float(x), "update_norm", float(v))
            for x, v in zip(s["step"], s["update_norm"], strict=True)
        ]
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


# ----- runs.csv -> claims and figure ----------------------------------------------------------


def _update_arm(placement: str, depth: int, warmup: int) -> str:
    return f"update/{placement}/d{depth}/w{warmup}"


def updates(data: pd.DataFrame, placement: str, depth: int, warmup: int) -> pd.DataFrame:
    """update_norm: a row per seed, a column per step."""
    rows = metric(data, _update_arm(placement, depth, warmup), "update_norm")
    return rows.pivot(index="seed", columns="x", values="value")


def early(data: pd.DataFrame, placement: str, depth: int, warmup: int) -> pd.Series:
    """{seed: update_norm after EARLY_STEP steps}."""
    table = updates(data, placement, depth, warmup)
    if float(EARLY_STEP) not in table.columns:
        return pd.Series(dtype=float)
    return table[float(EARLY_STEP)].dropna()


def update_grid(data: pd.DataFrame) -> tuple[list[int], list[int]]:
    """The depths and warmup lengths of the update grid."""
    found = [m.groupdict() for a in data["arm"].unique() if (m := UPDATE_ARM.match(a))]
    return sorted({int(m["depth"]) for m in found}), sorted({int(m["warmup"]) for m in found})


def loss_depths(data: pd.DataFrame) -> list[int]:
    found = [m.groupdict() for a in data["arm"].unique() if (m := LOSS_ARM.match(a))]
    return sorted({int(m["depth"]) for m in found})


def _warm_text(warmup: int) -> str:
    return f"{warmup} warmup steps" if warmup else "no warmup"


def rising(data: pd.DataFrame, depths: list[int], warmup: int) -> pd.Series:
    """{seed: the smallest ratio of Post-LN's early update between consecutive depths}: above 1
    when it rises at every step in depth."""
    table = pd.concat([early(data, "post", d, warmup) for d in depths], axis=1).dropna()
    steps = [table.iloc[:, k + 1] / table.iloc[:, k] for k in range(len(depths) - 1)]
    return pd.concat(steps, axis=1).min(axis=1) if steps else pd.Series(dtype=float)


def quantities(data: pd.DataFrame) -> pd.DataFrame:
    """runs.csv's rows and the two quantities the claims read that no job logs: `rising` per
    warmup (under Post-LN's deepest update arm) and `final_loss` per loss arm (curves.final_loss:
    a diverged job's at ln VOCAB)."""
    depths, warmups = update_grid(data)
    rows = [(_update_arm("post", depths[-1], w), seed, math.nan, "rising", v)
            for w in warmups for seed, v in rising(data, depths, w).items()]  # fmt: skip
    loss_arms = sorted(a for a in data["arm"].unique() if LOSS_ARM.match(a))
    rows += [(a, seed, math.nan, "final_loss", v) for a in loss_arms
             for seed, v in final_loss(data, a).items()]  # fmt: skip
    return pd.concat([data, pd.DataFrame(rows, columns=data.columns)], ignore_index=True)


def words(data: pd.DataFrame) -> dict:
    """What the declared claims read from the data: the update grid's depths (the smallest and
    largest), warmups and their words, the loss grid's deepest, model_update's lrs and depths."""
    depths, warmups = update_grid(data)
    return {"update_depth": depths, "lo": depths[0] if depths else "",
            "hi": depths[-1] if depths else "", "warmup": warmups,
            "when": [_warm_text(w) for w in warmups], "early_step": EARLY_STEP,
            "loss_depth": loss_depths(data)[-1:], "diverged": f"ln {VOCAB} = {DIVERGED_LOSS:.3f}",
            **deepnorm_slope.words(data)}  # fmt: skip


def _styles(depths: list[int]) -> dict[int, str]:
    """A line style per depth, the deepest solid (colour is the placement's in every panel)."""
    styles = (":", "--", "-.", "-")
    return {d: styles[len(styles) - len(depths) + k] for k, d in enumerate(depths)}


def _update_panel(
    ax: plt.Axes, data: pd.DataFrame, depths: list[int], warmup: int, styles: dict[int, str]
) -> None:
    """update_norm against step: geometric mean over seeds and its 95% CI per placement, depth."""
    for k, placement in enumerate(PLACEMENTS):
        for depth in depths:
            table = updates(data, placement, depth, warmup)
            if table.empty:
                continue
            intervals = [Interval.of(table[x].dropna(), log=True) for x in table.columns]
            x = list(table.columns)
            ax.plot(
                x,
                [i.mean for i in intervals],
                styles[depth],
                color=f"C{k}",
                label=f"{PLACEMENTS[placement]}, depth {depth}",
            )
            if all(i.known for i in intervals):
                ax.fill_between(
                    x, [i.low for i in intervals], [i.high for i in intervals], color=f"C{k}",
                    alpha=0.12,
                )  # fmt: skip
    ax.axvline(EARLY_STEP, color="grey", lw=0.8, ls=":")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="training step",
        ylabel="||F(x,θ_t) - F(x,θ_0)||",
        title=f"model update, {_warm_text(warmup)}: geometric mean, 95% CI",
    )
    ax.legend(fontsize=7, ncol=2)


def _early_panel(ax: plt.Axes, data: pd.DataFrame, depths: list[int], warmups: list[int]) -> None:
    """The early update against depth: geometric mean over seeds, 95% CI, seeds as dots."""
    for k, placement in enumerate(PLACEMENTS):
        for warmup in warmups:
            values = [early(data, placement, d, warmup) for d in depths]
            intervals = [Interval.of(v, log=True) for v in values]
            shift = 1.04 if warmup else 1 / 1.04
            x = [d * shift for d in depths]
            ax.errorbar(
                x,
                [i.mean for i in intervals],
                yerr=[
                    [i.mean - i.low if i.known else 0.0 for i in intervals],
                    [i.high - i.mean if i.known else 0.0 for i in intervals],
                ],
                fmt="s--" if warmup else "o-",
                mfc=f"C{k}" if not warmup else "white",
                color=f"C{k}",
                capsize=3,
                label=f"{PLACEMENTS[placement]}, {_warm_text(warmup)}",
            )
            for xi, v in zip(x, values, strict=True):
                ax.plot([xi] * len(v), v.values, ".", color=f"C{k}", alpha=0.35)
    ax.set(xscale="log", yscale="log", xlabel="depth (blocks)")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.set(
        ylabel=f"||F(x,θ_t) - F(x,θ_0)|| after step {EARLY_STEP}",
        title="early model update by depth: geometric mean, 95% CI, seeds as dots",
    )
    ax.legend(fontsize=7)


def _loss_panel(
    ax: plt.Axes, data: pd.DataFrame, depths: list[int], styles: dict[int, str]
) -> None:
    """Val loss curves: each seed thin, the mean over seeds thick; a diverged job at ln 65."""
    for k, placement in enumerate(PLACEMENTS):
        for depth in depths:
            arm_ = f"{placement}/d{depth}"
            i = Interval.of(final_loss(data, arm_))
            ci = f" [{i.low:.3f}, {i.high:.3f}]" if i.known else ""
            label = f"{PLACEMENTS[placement]}, depth {depth}: final {i.mean:.3f}{ci}"
            seed_curves(ax, data, arm_, styles[depth], f"C{k}", label)
    ax.set(
        xlabel="training step",
        ylabel="val loss (nats/char)",
        title="val loss (final: mean over seeds [95% CI])",
    )
    if ax.lines:
        ax.legend(fontsize=7)


def render(data: pd.DataFrame) -> Result:
    """The model update against step (no warmup, warmup), the early update against depth, and
    the val loss curves of the loss grid; with the `model_update` grid, DeepNet's relative update
    of the blocks against depth and DeepNorm's over Post-LN's below them."""
    depths, warmups = update_grid(data)
    deep = loss_depths(data)
    slope_arms = deepnorm_slope.arms(data)
    styles = _styles(sorted(set(depths) | set(deep)))  # a depth's line style in every panel
    n_rows = 3 if slope_arms else 2
    fig, axes = plt.subplots(n_rows, 2, figsize=(13, 4.5 * n_rows))
    for ax, warmup in zip((axes[0][0], axes[0][1]), warmups, strict=False):
        _update_panel(ax, data, depths, warmup, styles)
    if depths:
        _early_panel(axes[1][0], data, depths, warmups)
    _loss_panel(axes[1][1], data, deep, styles)
    claims = declared.build("deepnorm_depth", quantities(data), words(data))
    notes, found = _notes(data, depths, warmups, deep), []
    if slope_arms:
        deepnorm_slope.depth_panel(axes[2][0], data)
        deepnorm_slope.ratio_panel(axes[2][1], data)
        notes[-1:-1] = deepnorm_slope.notes(data)  # before the note on scale
        found = deepnorm_slope.found_gates(data)
    found += gates.gates(data, sorted(a for a in data["arm"].unique() if LOSS_ARM.match(a)))
    fig.suptitle("Depth: Post-LN vs DeepNorm, char-level GPT (d_model 64; DeepNet)")
    fig.tight_layout()
    return Result(fig, claims, notes, gates=found)


def update_table(data: pd.DataFrame, depths: list[int], warmup: int) -> str:
    """update_norm at SHOWN_STEPS: geometric mean over seeds per placement and depth."""
    rows = []
    for placement, label in PLACEMENTS.items():
        for depth in depths:
            table = updates(data, placement, depth, warmup)
            cells = []
            for s in SHOWN_STEPS:
                column = table.get(float(s))
                mean = Interval.of(column.dropna(), log=True).mean if column is not None else None
                cells.append("n/a" if mean is None or np.isnan(mean) else f"{mean:.3g}")
            rows.append([label, depth, *cells])
    return markdown_table(["placement", "depth", *(f"step {s}" for s in SHOWN_STEPS)], rows)


def _notes(data: pd.DataFrame, depths: list[int], warmups: list[int], deep: list[int]) -> list[str]:
    """How the quantities were measured, with the numbers they depend on."""
    notes = [
        "Model update (grid `update`, experiment=deepnorm_update): F(x, θ_t) is the logits on 8 "
        "sequences of the run's first training batch, in eval mode; update_norm is the mean over "
        "their tokens of ||F(x, θ_t) - F(x, θ_0)||, after every one of the first 50 AdamW steps "
        "(lr 1e-3, constant after the warmup). A seed sets the init, the batches and x; the "
        "Post-LN and DeepNorm jobs of a seed share the batches.",
        f"Ratios are taken within a seed and averaged on the log scale (geometric mean). The "
        f"early update is update_norm after step {EARLY_STEP}: with Adam the size of a step "
        "hardly depends on the depth, so the change of the output it causes shows how much the "
        "model amplifies an update; later the updates of many steps add up (the table). "
        "Geometric means over seeds, per step:",
    ]
    for warmup in warmups:
        notes.append(f"{_warm_text(warmup)}:\n\n{update_table(data, depths, warmup)}\n")
    for warmup in warmups:
        rise = rising(data, depths, warmup)
        notes.append(
            f"{_warm_text(warmup)}: Post-LN's early update rose at every step in depth "
            f"({' < '.join(map(str, depths))}) in {int((rise > 1).sum())} of {len(rise)} seeds."
        )
    if deep:
        lo = deep[0]
        post, deepnorm = final_loss(data, f"post/d{lo}"), final_loss(data, f"deepnorm/d{lo}")
        gap = Interval.of(paired(post, deepnorm))
        notes.append(
            "Final loss (grid `loss`, experiment=deepnorm_depth): 300 AdamW steps (lr 1e-3, 100 "
            "warmup steps, cosine), the val loss on the same fixed windows for every job. At "
            f"depth {lo}, Post-LN minus DeepNorm: {gap.mean:.3f} [{gap.low:.3f}, {gap.high:.3f}] "
            "nats. A diverged job (the divergence guard stopped it) counts as a val loss of "
            f"ln {VOCAB} = {DIVERGED_LOSS:.3f}. Diverged jobs: {diverged_seeds(data)}."
        )
    notes.append(
        "Scale: the paper trains 6-1,000-layer encoder-decoders (d_model 512+) for tens of "
        "thousands of steps on translation; here a decoder of width 64 for 300 steps."
    )
    return notes
