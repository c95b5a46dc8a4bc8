"""deepnorm_depth: DeepNet (Wang et al. 2022), the early model update by depth and deep training.

Two grids. `update` (experiment=deepnorm_update): ||F(x, theta_t) - F(x, theta_0)|| after each
of the first 50 steps, Post-LN and DeepNorm at depth 6, 18 and 50, without warmup and with it.
`loss` (experiment=deepnorm_depth): the val loss of Post-LN and DeepNorm at depth 6 and 50 after
300 steps. `extract` reads the run logs into runs.csv; `render` draws the figure and decides the
claims from runs.csv alone.
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

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
from normlab.analysis.report import Claim, Result
from normlab.analysis.stats import ABOVE, BELOW, Interval
from normlab.tables import markdown_table

# ----- the paper's claims (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers") --
PAPER = {
    "post_grows": "Figs. 4-5: Post-LN's model update ||F(x,θ_t) - F(x,θ_0)|| is large at the start "
    "of training, the larger the deeper the model (Sec. 3: it explodes with depth)",
    "deepnorm_bounded": "Sec. 4 (Theorem 4.2): DeepNorm bounds the model update by O(η), whatever "
    "the depth; Figs. 4-5: it stays small",
    "deep_trains": "Deep Post-LN fails to train; DeepNorm trains up to 1,000 layers (abstract, "
    "Table 1)",
}
# ----- thresholds of the rules ----------------------------------------------------------------
EARLY_STEP = 1  # "early update": update_norm after this many steps (the issue's and Fig. 4's start)
GROWTH = 2.0  # Post-LN's early update at the largest depth / at the smallest: at least this
DEEPNORM_SHARE = 0.2  # DeepNorm's early update at the largest depth / Post-LN's: at most this
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


def ratios(num: pd.Series, den: pd.Series) -> list[float]:
    """num / den over the seeds both have."""
    both = pd.concat([num, den], axis=1, keys=["n", "d"]).dropna()
    return list(both["n"] / both["d"])


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


# the provenance of the claims held to the growth bound
OURS_GROWTH = {"source": "ours",
               "why": f"DeepNet shows the update growing with depth; the {GROWTH:g}x bound is "
               "this suite's"}  # fmt: skip


def _update_claims(data: pd.DataFrame, depths: list[int], warmup: int) -> list[Claim]:
    lo, hi = depths[0], depths[-1]
    when = _warm_text(warmup)
    early_text = f"early update = ||F(x,θ_t) - F(x,θ_0)|| after step {EARLY_STEP}"

    def claim(text: str, paper: str, quantity: str, reads: list[tuple[str, int]], values=None,
              **kw) -> Claim:  # fmt: skip
        """A claim on the ratio of the first arm's early update to the second's (or on
        `values`), on the log scale; `reads`: the (placement, depth) arms it reads."""
        if values is None:
            (a, d_a), (b, d_b) = reads
            values = ratios(early(data, a, d_a, warmup), early(data, b, d_b, warmup))
        arms = tuple(_update_arm(placement, d, warmup) for placement, d in reads)
        return Claim(f"{when}: {text}", PAPER[paper], f"{quantity} ({early_text})", values,
                     log=True, arms=arms, **kw)  # fmt: skip

    # fmt: off
    return [
        claim(f"Post-LN's early update at depth {hi} is at least {GROWTH:g}x its update at depth "
              f"{lo}", "post_grows", f"Post-LN's early update at depth {hi} / at depth {lo}",
              [("post", hi), ("post", lo)], region=(GROWTH, ABOVE), **OURS_GROWTH),
        claim(f"Post-LN's early update rises with depth ({', '.join(map(str, depths))})",
              "post_grows", "the smallest ratio of Post-LN's early update between consecutive "
              "depths", [("post", d) for d in depths], list(rising(data, depths, warmup)),
              region=(1.0, ABOVE), source="paper"),
        claim(f"DeepNorm's early update at depth {hi} is no larger than Post-LN's at depth {lo}",
              "deepnorm_bounded", f"DeepNorm's early update at depth {hi} / Post-LN's at depth "
              f"{lo}", [("deepnorm", hi), ("post", lo)], region=(BELOW, 1.0),
              source="paper"),
        claim(f"DeepNorm's early update at depth {hi} is at most {DEEPNORM_SHARE:g}x Post-LN's "
              f"at depth {hi}", "deepnorm_bounded", f"DeepNorm's early update at depth {hi} / "
              f"Post-LN's at depth {hi}", [("deepnorm", hi), ("post", hi)],
              region=(BELOW, DEEPNORM_SHARE), source="ours",
              why=f"DeepNet shows DeepNorm's update smaller; the {DEEPNORM_SHARE:g}x share is "
              "this suite's"),
        claim(f"DeepNorm's early update grows less than {GROWTH:g}x from depth {lo} to {hi} (the "
              "bound does not depend on depth)", "deepnorm_bounded", f"DeepNorm's early update "
              f"at depth {hi} / at depth {lo}", [("deepnorm", hi), ("deepnorm", lo)],
              region=(BELOW, GROWTH), **OURS_GROWTH),
    ]
    # fmt: on


def _loss_claim(data: pd.DataFrame, depth: int) -> Claim:
    return Claim(
        f"at depth {depth} DeepNorm reaches a lower val loss than Post-LN",
        PAPER["deep_trains"],
        f"Post-LN's final val loss minus DeepNorm's at depth {depth}, nats (a diverged job "
        f"counts as ln {VOCAB} = {DIVERGED_LOSS:.3f})",
        paired(final_loss(data, f"post/d{depth}"), final_loss(data, f"deepnorm/d{depth}")),
        (0.0, ABOVE),
        source="paper",
        # the gates of DeepNorm's arm only: Post-LN failing to train is the paper's claim itself,
        # not a defect of the run
        arms=(f"deepnorm/d{depth}",),
        final=True,
    )


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
    claims = [c for w in warmups for c in _update_claims(data, depths, w)] if depths else []
    if deep:
        claims.append(_loss_claim(data, deep[-1]))
    notes, found = _notes(data, depths, warmups, deep), []
    if slope_arms:
        deepnorm_slope.depth_panel(axes[2][0], data)
        deepnorm_slope.ratio_panel(axes[2][1], data)
        claims += deepnorm_slope.claims(data)
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
