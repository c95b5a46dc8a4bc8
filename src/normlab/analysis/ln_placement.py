"""ln_placement: Xiong et al. 2020, gradients of W2 at init by layer (Fig. 3) and warmup.

Two grids. `init` (experiment=ln_placement_init, 10 seeds): each block's ||dL/dW2|| at init,
averaged over 32 training batches, Post-LN (no final norm) and Pre-LN (its final norm) at depth
6 and 12. `warmup` (experiment=ln_placement): the val loss of Post-LN and Pre-LN at 4 learning
rates without and with warmup. `extract` reads the run logs into runs.csv; `render` draws the
figure and decides the claims from runs.csv alone.
"""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

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
from normlab.analysis.report import AnyClaim, Claim, Result
from normlab.analysis.stats import ABOVE, BELOW, Interval

# ----- the paper's claims (Xiong et al. 2020, "On Layer Normalization in the Transformer") -----
PAPER = {
    "grad_post": "Fig. 3: at init, the gradient norm of W2 in Post-LN grows with the layer index",
    "grad_pre": "Fig. 3: at init, the gradient norm of W2 in Pre-LN stays about the same for "
    "every layer",
    "post_warmup": "Post-LN without warmup: 8.45 BLEU vs ~34 with warmup (IWSLT14 De-En)",
    "pre_no_warmup": "Pre-LN without warmup reaches the quality of Post-LN with warmup, faster",
}
# ----- thresholds of the rules ----------------------------------------------------------------
MAX_PRE_SLOPE = 0.05  # per layer: "does not grow" = ln(grad norm) rises by less than this a layer
MIN_LOSS_GAP = 0.05  # nats of val loss: "needs warmup" = worse without it by more than this
PRE_MARGIN = 0.05  # nats: Pre-LN "reaches" Post-LN's quality = at most this much worse

INIT = "ln_placement_init"
PLACEMENTS = {"post": "Post-LN", "pre": "Pre-LN"}
GRAD_KEY = re.compile(r"^grad_init/block_(\d+)/w2$")
INIT_ARM = re.compile(r"^init/(?P<placement>\w+)/d(?P<depth>\d+)$")
WARMUP_ARM = re.compile(r"^(?P<placement>\w+)/lr(?P<lr>[^/]+)/w(?P<warmup>\d+)$")


# ----- run logs -> runs.csv -------------------------------------------------------------------


def grad_at_init(run: Run) -> list[float]:
    """grad_init/block_XX/w2 (logged at step 0) in block order."""
    cols = sorted((int(m.group(1)), c) for c in run.metrics.columns if (m := GRAD_KEY.match(c)))
    rows = run.metrics.dropna(subset=[cols[0][1]]) if cols else pd.DataFrame()
    return [float(rows.iloc[0][c]) for _, c in cols] if len(rows) else []


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per init job: W2's gradient norm per layer (x = layer index from 1). Per warmup job: the
    val loss curve (x = steps trained), its last val loss and whether it diverged (1 or 0)."""
    rows = []
    for run in runs:
        a, seed = run.arm, int(run.get("seed"))
        if a.startswith("init/"):
            if run.status == "ok":
                rows += [
                    (a, seed, float(i + 1), "grad_init/w2", g)
                    for i, g in enumerate(grad_at_init(run))
                ]
            continue
        rows += val_loss_rows(run, a, seed)
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


# ----- runs.csv -> claims and figure ----------------------------------------------------------


def grad_norms(data: pd.DataFrame, placement: str, depth: int) -> pd.DataFrame:
    """W2's gradient norm at init: a row per seed, a column per layer index."""
    rows = metric(data, f"init/{placement}/d{depth}", "grad_init/w2")
    return rows.pivot(index="seed", columns="x", values="value")


def slopes(table: pd.DataFrame) -> list[float]:
    """Per seed: the least-squares slope of ln(gradient norm) against the layer index."""
    layers = np.asarray(table.columns, dtype=float)
    return [
        float(np.polyfit(layers, np.log(row.to_numpy(float)), 1)[0])
        for _, row in table.dropna().iterrows()
    ]


def warmup_grid(data: pd.DataFrame) -> tuple[list[float], int]:
    """The learning rates of the warmup grid, and its warmup length (the non-zero one)."""
    found = [m.groupdict() for a in data["arm"].unique() if (m := WARMUP_ARM.match(a))]
    lrs = sorted({float(m["lr"]) for m in found})
    warm = max((int(m["warmup"]) for m in found), default=0)
    return lrs, warm


def _arm(placement: str, lr: float, warmup: int) -> str:
    return f"{placement}/lr{lr:g}/w{warmup}"


def warmup_gap(data: pd.DataFrame, lr: float, warm: int) -> list[float]:
    """Per seed: Post-LN's final val loss without warmup minus with `warm` warmup steps."""
    return paired(final_loss(data, _arm("post", lr, 0)), final_loss(data, _arm("post", lr, warm)))


def best_lr(data: pd.DataFrame, placement: str, lrs: list[float], warmup: int) -> float | None:
    """The learning rate of the lowest final val loss, mean over seeds (None without runs)."""
    means = {lr: final_loss(data, _arm(placement, lr, warmup)).mean() for lr in lrs}
    means = {lr: m for lr, m in means.items() if not math.isnan(m)}
    return min(means, key=means.get) if means else None


def _grad_claims(data: pd.DataFrame, depths: list[int]) -> list[Claim]:
    """Per depth: Post-LN's slope above 0, Pre-LN's below MAX_PRE_SLOPE."""
    claims = []
    for depth in depths:
        quantity = (
            "slope of ln(||dL/dW2||) against the layer index (least squares over the "
            f"{depth} layers; ||dL/dW2|| averaged over the batches), per layer"
        )
        claims.append(
            Claim(
                f"Post-LN, depth {depth}: W2's gradient norm at init grows with the layer index",
                PAPER["grad_post"],
                quantity,
                slopes(grad_norms(data, "post", depth)),
                (0.0, ABOVE),
                source="paper",
            )
        )
        claims.append(
            Claim(
                f"Pre-LN, depth {depth}: W2's gradient norm at init does not grow with the layer "
                f"index (slope below {MAX_PRE_SLOPE:g} per layer: under "
                f"{100 * math.expm1(MAX_PRE_SLOPE):.0f}% growth a layer)",
                PAPER["grad_pre"],
                quantity,
                slopes(grad_norms(data, "pre", depth)),
                (BELOW, MAX_PRE_SLOPE),
                source="ours",
                why=f"the paper shows Pre-LN's profile flat; the bound {MAX_PRE_SLOPE:g} a layer "
                "is this suite's",
            )
        )
    return claims


def _warmup_claims(data: pd.DataFrame, lrs: list[float], warm: int) -> list[Claim | AnyClaim]:
    """Post-LN needs warmup per lr and at some lr; Pre-LN without it reaches Post-LN with it."""
    quantity = (
        f"Post-LN's final val loss without warmup minus with {warm} warmup steps, nats (a "
        f"diverged job counts as ln {VOCAB} = {DIVERGED_LOSS:.3f}, a uniform prediction's loss)"
    )
    per_lr = {
        f"lr {lr:g}": Claim(
            f"Post-LN needs warmup at lr {lr:g}: without it the val loss is more than "
            f"{MIN_LOSS_GAP:g} nats worse",
            PAPER["post_warmup"],
            quantity,
            warmup_gap(data, lr, warm),
            (MIN_LOSS_GAP, ABOVE),
            source="ours",
            why=f"the paper shows warmup needed; the {MIN_LOSS_GAP:g}-nat margin is this suite's",
            arms=(_arm("post", lr, 0), _arm("post", lr, warm)),
            final=True,
        )
        for lr in lrs
    }
    claims: list[Claim | AnyClaim] = list(per_lr.values())
    claims.append(
        AnyClaim("Post-LN needs warmup at some lr", PAPER["post_warmup"], per_lr, source="paper")
    )
    post_lr, pre_lr = best_lr(data, "post", lrs, warm), best_lr(data, "pre", lrs, 0)
    values = []
    if post_lr is not None and pre_lr is not None:
        values = paired(
            final_loss(data, _arm("pre", pre_lr, 0)), final_loss(data, _arm("post", post_lr, warm))
        )
    chosen = f"Pre-LN at lr {pre_lr:g}, Post-LN at lr {post_lr:g}" if values else "n/a"
    claims.append(
        Claim(
            "Pre-LN without warmup reaches the val loss of Post-LN with warmup (each at its best "
            f"lr): at most {PRE_MARGIN:g} nats worse",
            PAPER["pre_no_warmup"],
            "Pre-LN's final val loss without warmup minus Post-LN's with "
            f"{warm} warmup steps, nats, each at the lr of its lowest mean over seeds ({chosen}); "
            f"a diverged job counts as {DIVERGED_LOSS:.3f}",
            values,
            (BELOW, PRE_MARGIN),
            source="ours",
            why=f"the paper reports comparable or better loss; the {PRE_MARGIN:g}-nat margin is "
            "this suite's",
            final=True,
        )
    )
    return claims


def _band(ax: plt.Axes, table: pd.DataFrame, color: str, label: str) -> None:
    """Geometric mean over seeds per layer and its 95% CI as a band."""
    intervals = [Interval.of(table[x].dropna(), log=True) for x in table.columns]
    x = list(table.columns)
    ax.plot(
        x,
        [i.mean for i in intervals],
        color=color,
        marker="o",
        ms=3,
        label=f"{label} ({len(table)} seeds)",
    )
    if all(i.known for i in intervals):
        ax.fill_between(
            x, [i.low for i in intervals], [i.high for i in intervals], color=color, alpha=0.2
        )


def _loss_vs_lr(ax: plt.Axes, data: pd.DataFrame, lrs: list[float], warm: int) -> None:
    """Final val loss against lr per placement and warmup: mean, 95% CI, each seed a dot."""
    arms = [(p, w) for p in PLACEMENTS for w in (0, warm)]
    diverged = False
    for j, (placement, warmup) in enumerate(arms):
        shift = 1.03 ** (j - (len(arms) - 1) / 2)  # side by side around each lr
        x = [lr * shift for lr in lrs]
        finals = [final_loss(data, _arm(placement, lr, warmup)) for lr in lrs]
        diverged |= any((f == DIVERGED_LOSS).any() for f in finals)
        intervals = [Interval.of(f) for f in finals]
        color = f"C{list(PLACEMENTS).index(placement)}"
        ax.errorbar(
            x,
            [i.mean for i in intervals],
            yerr=[(i.high - i.low) / 2 if i.known else 0.0 for i in intervals],
            fmt="o-" if warmup else "s--",
            mfc=color if warmup else "white",
            color=color,
            capsize=3,
            label=f"{PLACEMENTS[placement]}, warmup {warmup}",
        )
        for xi, f in zip(x, finals, strict=True):
            ax.plot([xi] * len(f), f.values, ".", color=color, alpha=0.35)
    if diverged:
        ax.axhline(DIVERGED_LOSS, color="grey", lw=0.8, ls=":", label=f"diverged: ln {VOCAB}")
    ax.set_xscale("log")
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
    ax.minorticks_off()
    ax.set(
        xlabel="peak learning rate (AdamW)",
        ylabel="final val loss (nats/char)",
        title="final val loss: mean, 95% CI, seeds as dots",
    )


def _curves(ax: plt.Axes, data: pd.DataFrame, lr: float, warm: int) -> None:
    """Val loss against steps at one lr: each seed thin, the mean over seeds thick."""
    for k, (placement, label) in enumerate(PLACEMENTS.items()):
        for warmup, style in ((0, "--"), (warm, "-")):
            seed_curves(ax, data, _arm(placement, lr, warmup), style, f"C{k}",
                        f"{label}, warmup {warmup} ({{n}} seeds)")  # fmt: skip
    ax.set(
        xlabel="training step",
        ylabel="val loss (nats/char)",
        title=f"val loss at lr {lr:g} (the lr of Post-LN's largest warmup gap)",
    )


def render(data: pd.DataFrame) -> Result:
    """W2's gradient norm at init per layer (depth 6, 12), final val loss against lr (with and
    without warmup), and val loss curves at the lr where warmup matters most to Post-LN."""
    depths = sorted({int(m["depth"]) for a in data["arm"].unique() if (m := INIT_ARM.match(a))})
    lrs, warm = warmup_grid(data)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    grad_axes = [axes[0][0], axes[0][1]]
    for ax, depth in zip(grad_axes, depths, strict=False):
        for k, (placement, label) in enumerate(PLACEMENTS.items()):
            table = grad_norms(data, placement, depth)
            if not table.empty:
                _band(ax, table, f"C{k}", label)
        ax.set_yscale("log")
        ax.set(
            xlabel="layer index (block)",
            ylabel="||dL/dW2|| at init",
            title=f"depth {depth}: W2's gradient norm at init, geometric mean, 95% CI",
        )
        ax.legend(fontsize=8)
    gaps = {lr: float(np.mean(g)) for lr in lrs if (g := warmup_gap(data, lr, warm))}
    _loss_vs_lr(axes[1][0], data, lrs, warm)
    axes[1][0].legend(fontsize=8)
    if gaps:
        _curves(axes[1][1], data, max(gaps, key=gaps.get), warm)
        axes[1][1].legend(fontsize=8)
    fig.suptitle(
        "LayerNorm placement: gradients at init and warmup, char-level GPT (Xiong et al. 2020)"
    )
    fig.tight_layout()
    claims = _grad_claims(data, depths) + _warmup_claims(data, lrs, warm)
    return Result(fig, claims, _notes(data, depths, lrs))


def _notes(data: pd.DataFrame, depths: list[int], lrs: list[float]) -> list[str]:
    """How the quantities were measured and encoded, with the numbers they depend on."""
    pre = {d: slopes(grad_norms(data, "pre", d)) for d in depths}
    return [
        "Gradients at init (grid `init`, experiment=ln_placement_init): no optimizer step; at fit "
        "start forward and backward on the first training batches of the model at init, each "
        "block's ||dL/dW2|| (W2 = MLP.fc2, the FFN's second matrix) averaged over the batches. "
        "Post-LN has no final norm (its last block ends in one), Pre-LN its final norm. A seed "
        "sets the init and the batches; a Post-LN and a Pre-LN job of one seed share both (the "
        "same weights: the norms draw no random numbers).",
        f"Pre-LN's rule is one-sided with a margin: it holds when the slope's CI lies below "
        f"{MAX_PRE_SLOPE:g} per layer. A region below 0 would demand a gradient that provably "
        "shrinks with the layer index, more than the paper's 'about the same', and a flat "
        "gradient (slope 0) would stay undecided whatever the seeds. Mean Pre-LN slopes per "
        "layer (the paper's Fig. 3 shows Pre-LN flat): "
        + ", ".join(
            f"depth {d}: {np.mean(v):.3f} (it {'shrinks' if np.mean(v) < 0 else 'grows'} "
            "towards the last layer)"
            for d, v in pre.items()
            if v
        )
        + ".",
        "Warmup (grid `warmup`, experiment=ln_placement): a seed sets the init and the training "
        "windows (data.seed follows seed); the arms of a seed share both. The val loss is the "
        "mean cross-entropy on the same fixed windows of the last 10% of the text for every "
        "job (data.val_batches x batch); final = at the last step. Learning rates: "
        + ", ".join(f"{lr:g}" for lr in lrs)
        + "; every one reported.",
        f"A diverged job (the divergence guard stopped it: loss NaN or 10x its first) counts as "
        f"a val loss of ln {VOCAB} = {DIVERGED_LOSS:.3f}, a uniform prediction's (about the "
        "loss at init): a gap it makes is finite, so the interval stays defined. Diverged jobs: "
        + diverged_seeds(data)
        + ".",
        "Best lr (Pre-LN without, Post-LN with warmup): the lr of the lowest final val loss, "
        "mean over the same seeds the comparison then uses; both sides are chosen that way.",
        f"'Post-LN needs warmup at some lr' tests {len(lrs)} learning rates without a "
        "multiplicity correction: read it with the per-lr rows.",
    ]
