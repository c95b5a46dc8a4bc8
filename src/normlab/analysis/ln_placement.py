# Over 400 lines: one paper's extraction, gradient and warmup claims and figure
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

from normlab.analysis import gates
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
from normlab.analysis.report import AnyClaim, Claim, CountClaim, Result
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
GRAD_KEY = re.compile(r"^grad_init/block_(\d+)/(w2|w2_enc|w2_dec)$")
# the GPT as `init` with unit-scale embeddings; the 6-6 encoder-decoder, per stack
INIT_GRIDS = {"init": "GPT", "init_unit": "GPT, unit-scale embeddings"}
STACKS = {"w2_enc": "encoder", "w2_dec": "decoder"}
TRAINED = " (trained seeds)"  # an arm's seeds that trained in both arms of a warmup pair
WARMUP_ARM = re.compile(r"^(?P<placement>\w+)/lr(?P<lr>[^/]+)/w(?P<warmup>\d+)$")


# ----- run logs -> runs.csv -------------------------------------------------------------------


def grad_at_init(run: Run) -> dict[str, list[float]]:
    """{name: grad_init/block_XX/<name> in block order} (logged at step 0): w2 for the GPT,
    w2_enc and w2_dec for the encoder-decoder."""
    found: dict[str, list[tuple[int, str]]] = {}
    for c in run.metrics.columns:
        if m := GRAD_KEY.match(c):
            found.setdefault(m.group(2), []).append((int(m.group(1)), c))
    out = {}
    for name, cols in found.items():
        rows = run.metrics.dropna(subset=[sorted(cols)[0][1]])
        if len(rows):
            out[name] = [float(rows.iloc[0][c]) for _, c in sorted(cols)]
    return out


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per init job: W2's gradient norm per layer (x = layer index from 1; grad_init/w2, or
    grad_init/w2_enc and _dec). Per warmup job: the val loss curve (x = steps trained), its last
    val loss, whether it diverged (1 or 0), and the rows of its gates."""
    rows, job = [], {}
    for run in runs:
        a, seed = run.arm, int(run.get("seed"))
        job[a, seed] = run  # warmup_post reruns some of warmup's arms: the later job is read
    for (a, seed), run in job.items():
        if a.split("/")[0] in (*INIT_GRIDS, "encdec"):
            if run.status == "ok":
                rows += [(a, seed, float(i + 1), f"grad_init/{name}", g)
                         for name, grads in grad_at_init(run).items()
                         for i, g in enumerate(grads)]  # fmt: skip
            continue
        rows += val_loss_rows(run, a, seed) + gates.gate_rows(run, a, seed)
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


# ----- runs.csv -> claims and figure ----------------------------------------------------------


def grad_norms(data: pd.DataFrame, arm: str, name: str = "w2") -> pd.DataFrame:
    """W2's gradient norm at init: a row per seed, a column per layer index."""
    rows = metric(data, arm, f"grad_init/{name}")
    return rows.pivot(index="seed", columns="x", values="value")


def grad_panels(data: pd.DataFrame) -> list[tuple[str, dict[str, str], str]]:
    """(title, {placement: arm}, metric name) of every gradient-at-init profile in runs.csv: the
    GPT per grid and depth, then the encoder-decoder's encoder and decoder."""
    panels = []
    for grid, model in INIT_GRIDS.items():
        depths = sorted({int(a.split("/d")[-1]) for a in data["arm"].unique()
                         if a.startswith(grid + "/")})  # fmt: skip
        panels += [(f"{model}, depth {d}", {p: f"{grid}/{p}/d{d}" for p in PLACEMENTS}, "w2")
                   for d in depths]  # fmt: skip
    if data["arm"].str.startswith("encdec/").any():
        panels += [(f"6-6 encoder-decoder, {stack}", {p: f"encdec/{p}" for p in PLACEMENTS}, name)
                   for name, stack in STACKS.items()]  # fmt: skip
    return panels


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


def _grad_claims(data: pd.DataFrame) -> list[Claim]:
    """Per profile: Post-LN's slope above 0; Pre-LN's within +-MAX_PRE_SLOPE (flat)."""
    claims = []
    for title, arms, name in grad_panels(data):
        layers = grad_norms(data, arms["post"], name).shape[1]
        quantity = (
            f"slope of ln(||dL/dW2||) against the layer index (least squares over the {layers} "
            "layers; ||dL/dW2|| averaged over the batches), per layer"
        )
        claims.append(Claim(
            f"Post-LN, {title}: W2's gradient norm at init grows with the layer index",
            PAPER["grad_post"], quantity, slopes(grad_norms(data, arms["post"], name)),
            (0.0, ABOVE), source="paper", arms=(arms["post"],),
            absent=(-MAX_PRE_SLOPE, MAX_PRE_SLOPE),
            absent_why=f"flat by the band this suite calls Pre-LN's profile flat (+-"
            f"{MAX_PRE_SLOPE:g} a layer), fixed before any slope was measured",
        ))  # fmt: skip
        claims.append(Claim(
            f"Pre-LN, {title}: W2's gradient norm at init is flat over the layers (|slope| below "
            f"{MAX_PRE_SLOPE:g} per layer: within {100 * math.expm1(MAX_PRE_SLOPE):.0f}% a layer)",
            PAPER["grad_pre"], quantity, slopes(grad_norms(data, arms["pre"], name)),
            (-MAX_PRE_SLOPE, MAX_PRE_SLOPE), source="ours", arms=(arms["pre"],),
            why=f"the paper shows Pre-LN's profile flat; the band +-{MAX_PRE_SLOPE:g} a layer is "
            "this suite's",
        ))  # fmt: skip
    return claims


def _stuck(data: pd.DataFrame, arm: str) -> pd.Series | None:
    """{seed: 1 if it did not train (diverged, or final val loss within the trained gate's
    margin of the unigram loss), else 0}; None for an arm without gate rows (older runs)."""
    trivial = metric(data, arm, "gate/trivial_loss")
    if trivial.empty:
        return None
    bound = (1 - gates.TRAINED_MARGIN) * float(trivial["value"].iloc[0])
    return (final_loss(data, arm) >= bound).astype(int)


def _counted(data: pd.DataFrame, lr: float, warm: int) -> bool:
    """Whether both Post-LN arms at lr have gate rows, so their seeds can be counted."""
    return all(_stuck(data, _arm("post", lr, w)) is not None for w in (0, warm))


def _trained_pair(data: pd.DataFrame, lr: float, warm: int) -> tuple[pd.DataFrame, list[int]]:
    """Runs.csv rows of Post-LN's two arms at lr (without and with warmup) on the seeds that
    trained in both, under the arms' names + TRAINED (their gates are those seeds'), and the
    seeds."""
    a, b = _arm("post", lr, 0), _arm("post", lr, warm)
    both = (_stuck(data, a) == 0) & (_stuck(data, b) == 0)
    seeds = sorted(both[both].index)
    rows = data[data["arm"].isin([a, b]) & data["seed"].isin(seeds)]
    return rows.assign(arm=rows["arm"] + TRAINED), seeds


def _count_claims(data: pd.DataFrame, lr: float, warm: int) -> tuple[CountClaim, Claim, list[int]]:
    """At one lr: how often Post-LN did not train without warmup against with it (Fisher), the
    paired gap among the seeds that trained in both, and those seeds."""
    a, b = _arm("post", lr, 0), _arm("post", lr, warm)
    stuck_a, stuck_b = _stuck(data, a), _stuck(data, b)
    rows, seeds = _trained_pair(data, lr, warm)
    count = CountClaim(
        f"Post-LN at lr {lr:g}: without warmup more seeds fail to train than with {warm} steps",
        PAPER["post_warmup"],
        "seeds that did not train (diverged, or a final val loss within "
        f"{gates.TRAINED_MARGIN:.0%} of the unigram loss) without warmup against with it",
        (int(stuck_a.sum()), len(stuck_a), int(stuck_b.sum()), len(stuck_b)),
        source="ours",
        why="the paper shows Post-LN failing without warmup (8.45 BLEU); counting failed seeds "
        "is this suite's reading of it at this scale",
    )  # fmt: skip
    gap = Claim(
        f"Post-LN at lr {lr:g}, seeds that trained in both: without warmup the val loss is more "
        f"than {MIN_LOSS_GAP:g} nats worse",
        PAPER["post_warmup"],
        f"Post-LN's final val loss without warmup minus with {warm} warmup steps, nats, over the "
        f"seeds that trained in both arms ({', '.join(map(str, seeds)) or 'none'})",
        paired(final_loss(rows, a + TRAINED), final_loss(rows, b + TRAINED)),
        (MIN_LOSS_GAP, ABOVE),
        source="ours",
        why=f"the paper shows warmup needed; the {MIN_LOSS_GAP:g}-nat margin is this suite's",
        arms=(a + TRAINED, b + TRAINED),
        final=True,
    )  # fmt: skip
    return count, gap, seeds


def _gap_claim(data: pd.DataFrame, lr: float, warm: int) -> Claim:
    """At one lr without gate rows (older runs): the paired gap over every seed."""
    return Claim(
        f"Post-LN needs warmup at lr {lr:g}: without it the val loss is more than "
        f"{MIN_LOSS_GAP:g} nats worse",
        PAPER["post_warmup"],
        f"Post-LN's final val loss without warmup minus with {warm} warmup steps, nats (a "
        f"diverged job counts as ln {VOCAB} = {DIVERGED_LOSS:.3f}, a uniform prediction's loss)",
        warmup_gap(data, lr, warm),
        (MIN_LOSS_GAP, ABOVE),
        source="ours",
        why=f"the paper shows warmup needed; the {MIN_LOSS_GAP:g}-nat margin is this suite's",
        arms=(_arm("post", lr, 0), _arm("post", lr, warm)),
        final=True,
    )  # fmt: skip


def _warmup_claims(data: pd.DataFrame, lrs: list[float], warm: int) -> tuple[list, list[str]]:
    """Post-LN needs warmup per lr (failed seeds by Fisher's test and the gap among trained
    seeds where the runs have gate rows, the gap over all seeds where not) and at some lr; Pre-LN
    without it reaches Post-LN with it. Also the lrs whose gap is left out, as fewer than
    gates.MIN_SEEDS seeds trained in both arms there (only the count is tested)."""
    per_lr: dict[str, Claim] = {}
    claims: list = []
    left_out: list[str] = []
    for lr in lrs:
        if not _counted(data, lr, warm):
            per_lr[f"lr {lr:g}"] = _gap_claim(data, lr, warm)
            claims.append(per_lr[f"lr {lr:g}"])
            continue
        count, gap, seeds = _count_claims(data, lr, warm)
        claims.append(count)
        if len(seeds) < gates.MIN_SEEDS:  # a note says so
            names = ", ".join(map(str, seeds)) or "none"
            left_out.append(f"lr {lr:g} ({len(seeds)} of {count.counts[1]}: seed {names})")
            continue
        per_lr[f"lr {lr:g}"] = gap
        claims.append(gap)
    claims.append(
        AnyClaim(
            "Post-LN needs warmup at some lr (its val loss gap)",
            PAPER["post_warmup"],
            per_lr,
            source="paper",
        )  # fmt: skip
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
            arms=(_arm("pre", pre_lr, 0), _arm("post", post_lr, warm)) if values else (),
            final=True,
        )
    )
    return claims, left_out


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


def _grad_panel(ax: plt.Axes, data: pd.DataFrame, title: str, arms: dict, name: str) -> None:
    for k, (placement, label) in enumerate(PLACEMENTS.items()):
        table = grad_norms(data, arms[placement], name)
        if not table.empty:
            _band(ax, table, f"C{k}", label)
    ax.set_yscale("log")
    ax.set(xlabel="layer index", ylabel="||dL/dW2|| at init", title=title)
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)


def _gates(data: pd.DataFrame, lrs: list[float], warm: int) -> list[gates.Gate]:
    """The warmup arms' gates, and those of each Post-LN pair's seeds that trained in both."""
    arms = sorted(a for a in data["arm"].unique() if WARMUP_ARM.match(a))
    found = gates.gates(data, arms)
    for lr in lrs:
        if _counted(data, lr, warm):
            rows, _ = _trained_pair(data, lr, warm)
            found += gates.gates(rows, sorted(rows["arm"].unique()))
    return found


def render(data: pd.DataFrame) -> Result:
    """W2's gradient norm at init per layer (the GPT at depth 6 and 12, with unit-scale
    embeddings too, and the encoder-decoder's two stacks), final val loss against lr (with and
    without warmup), and val loss curves at the lr where warmup matters most to Post-LN."""
    lrs, warm = warmup_grid(data)
    panels = grad_panels(data)
    rows = (len(panels) + 1) // 2 + 1
    fig, axes = plt.subplots(rows, 2, figsize=(13, 4.2 * rows), squeeze=False)
    for ax, (title, arms, name) in zip(axes[:-1].flat, panels, strict=False):
        _grad_panel(ax, data, f"{title}: W2's gradient norm at init (geo. mean, 95% CI)", arms,
                    name)  # fmt: skip
    gaps = {lr: float(np.mean(g)) for lr in lrs if (g := warmup_gap(data, lr, warm))}
    _loss_vs_lr(axes[-1][0], data, lrs, warm)
    axes[-1][0].legend(fontsize=8)
    if gaps:
        _curves(axes[-1][1], data, max(gaps, key=gaps.get), warm)
        axes[-1][1].legend(fontsize=8)
    fig.suptitle("LayerNorm placement: gradients at init (char-level GPT, 6-6 encoder-decoder) "
                 "and warmup (GPT) (Xiong et al. 2020)")  # fmt: skip
    fig.tight_layout()
    warmup, left_out = _warmup_claims(data, lrs, warm)
    claims = _grad_claims(data) + warmup
    return Result(fig, claims, _notes(data, lrs, left_out), gates=_gates(data, lrs, warm))


def _notes(data: pd.DataFrame, lrs: list[float], left_out: list[str]) -> list[str]:
    """How the quantities were measured and encoded, with the numbers they depend on; the lrs
    whose gap among the seeds that trained in both was left out (`_warmup_claims`)."""
    pre = {title: slopes(grad_norms(data, arms["pre"], name))
           for title, arms, name in grad_panels(data)}  # fmt: skip
    left = []
    if left_out:
        left.append(
            f"No gap among the seeds that trained in both Post-LN arms is claimed where fewer "
            f"than {gates.MIN_SEEDS} did: {'; '.join(left_out)}. Only the count of seeds that did "
            "not train is tested there."
        )
    return [
        "Gradients at init (grids `init`, `init_unit`: experiment=ln_placement_init; `encdec`: "
        "experiment=ln_placement_encdec): no optimizer step; at fit start forward and backward "
        "on the first training batches of the model at init, each layer's ||dL/dW2|| (W2 = the "
        "FFN's second matrix) averaged over the batches. The GPT: N(0, 0.02) embeddings "
        "(`init`) or those times 50, at unit scale (`init_unit`); Post-LN without a final norm, "
        "Pre-LN with it. The encoder-decoder (model=seq2seq): Xiong et al.'s own setup at a "
        "quarter width, 6 encoder and 6 decoder layers of torch's nn.Transformer layers (d 128, "
        "4 heads, FFN 256, ReLU), Xavier-uniform init, N(0, 1/d) embeddings times sqrt(d) plus "
        "sinusoids; it reads 64 characters and predicts the next 64; Pre-LN with a final "
        "LayerNorm per stack. A seed sets the init and the batches, shared by the placements.",
        f"Pre-LN's rule is two-sided: flat holds when the slope's CI lies within "
        f"+-{MAX_PRE_SLOPE:g} per layer, and does not hold when it lies wholly outside (the "
        "gradient grows, or shrinks, by more than that a layer). Mean Pre-LN slopes per layer: "
        + ", ".join(f"{t}: {np.mean(v):+.3f}" for t, v in pre.items() if v)
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
        *left,
    ]
