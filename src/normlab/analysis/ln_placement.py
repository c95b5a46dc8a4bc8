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
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from normlab.analysis import claims as declared
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
from normlab.analysis.report import Result
from normlab.analysis.stats import Interval

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


def slopes(table: pd.DataFrame) -> pd.Series:
    """{seed: the least-squares slope of ln(gradient norm) against the layer index}."""
    layers = np.asarray(table.columns, dtype=float)
    return pd.Series({seed: float(np.polyfit(layers, np.log(row.to_numpy(float)), 1)[0])
                      for seed, row in table.dropna().iterrows()}, dtype=float)  # fmt: skip


def warmup_grid(data: pd.DataFrame) -> tuple[list[float], int]:
    """The learning rates of the warmup grid, and its warmup length (the non-zero one)."""
    found = [m.groupdict() for a in data["arm"].unique() if (m := WARMUP_ARM.match(a))]
    lrs = sorted({float(m["lr"]) for m in found})
    warm = max((int(m["warmup"]) for m in found), default=0)
    return lrs, warm


def _warmup_arms(data: pd.DataFrame) -> list[str]:
    return sorted(a for a in data["arm"].unique() if WARMUP_ARM.match(a))


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


def _stuck(data: pd.DataFrame, arm: str) -> pd.Series | None:
    """{seed: 1 if it did not train (diverged, or final val loss within the trained gate's
    margin of the unigram loss), else 0}; None for an arm without gate rows (older runs)."""
    trivial = metric(data, arm, "gate/trivial_loss")
    if trivial.empty:
        return None
    bound = (1 - gates.TRAINED_MARGIN) * float(trivial["value"].iloc[0])
    return (final_loss(data, arm) >= bound).astype(int)


@dataclass(frozen=True)
class PostPair:
    """Post-LN's arms at one lr (without, with warmup), summed up once: `stuck` per arm (None
    without gate rows), the seeds that trained in both and their rows under arm + TRAINED."""

    lr: float
    arms: tuple[str, str]
    stuck: dict[str, pd.Series] | None
    seeds: list[int]
    trained: pd.DataFrame

    @property
    def counted(self) -> bool:  # both arms have gate rows, so their seeds can be counted
        return self.stuck is not None


def post_pairs(data: pd.DataFrame) -> list[PostPair]:
    """One PostPair per lr of the warmup grid, in lr order."""
    lrs, warm = warmup_grid(data)
    pairs = []
    for lr in lrs:
        a, b = _arm("post", lr, 0), _arm("post", lr, warm)
        stuck = {arm: _stuck(data, arm) for arm in (a, b)}
        if any(s is None for s in stuck.values()):
            pairs.append(PostPair(lr, (a, b), None, [], data.iloc[:0]))
            continue
        both = (stuck[a] == 0) & (stuck[b] == 0)
        seeds = sorted(both[both].index)
        rows = data[data["arm"].isin([a, b]) & data["seed"].isin(seeds)]
        pairs.append(PostPair(lr, (a, b), stuck, seeds, rows.assign(arm=rows["arm"] + TRAINED)))
    return pairs


def quantities(data: pd.DataFrame, pairs: list[PostPair]) -> pd.DataFrame:
    """What the declared claims read per seed: each profile's slope (`slope/<name>`, under
    Post-LN's or Pre-LN's arm); per warmup arm its `final_loss` (a diverged job's at
    DIVERGED_LOSS); per lr of Post-LN with gate rows in both arms, whether a seed did not train
    (`stuck`) and, where at least gates.MIN_SEEDS trained in both, those seeds' final losses
    (`final_loss_trained`); per lr without gate rows, every seed's (`final_loss_ungated`)."""
    rows = [(arms[p], seed, math.nan, f"slope/{name}", v)
            for _, arms, name in grad_panels(data) for p in PLACEMENTS
            for seed, v in slopes(grad_norms(data, arms[p], name)).items()]  # fmt: skip
    rows += [(a, seed, math.nan, "final_loss", v) for a in _warmup_arms(data)
             for seed, v in final_loss(data, a).items()]  # fmt: skip
    for pair in pairs:
        if not pair.counted:
            rows += [(a, seed, math.nan, "final_loss_ungated", v) for a in pair.arms
                     for seed, v in final_loss(data, a).items()]  # fmt: skip
            continue
        rows += [(a, seed, math.nan, "stuck", v) for a, stuck in pair.stuck.items()
                 for seed, v in stuck.items()]  # fmt: skip
        if len(pair.seeds) >= gates.MIN_SEEDS:
            rows += [(a, seed, math.nan, "final_loss_trained", v) for a in pair.arms
                     for seed, v in final_loss(pair.trained, a + TRAINED).items()]  # fmt: skip
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


def words(data: pd.DataFrame, pairs: list[PostPair]) -> dict:
    """What the declared claims read from the data: the profiles (panel, arms, metric, layers),
    the warmup grid's lrs with the seeds that trained in both Post-LN arms at each, its warmup
    length, the best lrs of the Pre-LN claim, and the words of the encodings."""
    panels = grad_panels(data)
    lrs, warm = warmup_grid(data)
    post_lr, pre_lr = best_lr(data, "post", lrs, warm), best_lr(data, "pre", lrs, 0)
    chosen = post_lr is not None and pre_lr is not None
    return {
        "panel": [t for t, _, _ in panels], "post": [a["post"] for _, a, _ in panels],
        "pre": [a["pre"] for _, a, _ in panels], "grad": [n for _, _, n in panels],
        "layers": [grad_norms(data, a["post"], n).shape[1] for _, a, n in panels],
        "flat_percent": f"{100 * math.expm1(_threshold('max_pre_slope')):.0f}",
        "lr": [f"{lr:g}" for lr in lrs], "warm": warm,
        "trained": [", ".join(map(str, p.seeds)) or "none" if p.counted else ""
                    for p in pairs],  # fmt: skip
        "trained_margin": f"{gates.TRAINED_MARGIN:.0%}",
        "pre_lr": f"{pre_lr:g}" if chosen else "n/a",
        "post_lr": f"{post_lr:g}" if chosen else "n/a",
        "chosen": f"Pre-LN at lr {pre_lr:g}, Post-LN at lr {post_lr:g}" if chosen else "n/a",
        "reach_arms": [_arm("pre", pre_lr, 0), _arm("post", post_lr, warm)] if chosen else [],
        "diverged": f"ln {VOCAB} = {DIVERGED_LOSS:.3f}", "diverged_loss": f"{DIVERGED_LOSS:.3f}",
    }  # fmt: skip


def _threshold(name: str) -> float:
    return float(declared.thresholds("ln_placement")[name])


def _left_out(pairs: list[PostPair]) -> list[str]:
    """The lrs whose gap among the seeds that trained in both Post-LN arms is not claimed, as
    fewer than gates.MIN_SEEDS did (only their count is tested), each with those seeds."""
    return [f"lr {p.lr:g} ({len(p.seeds)} of {len(p.stuck[p.arms[0]])}: seed "
            f"{', '.join(map(str, p.seeds)) or 'none'})"
            for p in pairs if p.counted and len(p.seeds) < gates.MIN_SEEDS]  # fmt: skip


def _band(ax: plt.Axes, table: pd.DataFrame, color: str, label: str) -> None:
    """Geometric mean over seeds per layer and its 95% CI as a band."""
    intervals = [Interval.of(table[x].dropna(), log=True) for x in table.columns]
    x = list(table.columns)
    ax.plot(x, [i.mean for i in intervals], color=color, marker="o", ms=3,
            label=f"{label} ({len(table)} seeds)")  # fmt: skip
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


def _gates(data: pd.DataFrame, pairs: list[PostPair]) -> list[gates.Gate]:
    """The warmup arms' gates, and those of each Post-LN pair's seeds that trained in both."""
    found = gates.gates(data, _warmup_arms(data))
    for p in pairs:
        if p.counted:
            found += gates.gates(p.trained, sorted(p.trained["arm"].unique()))
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
    pairs = post_pairs(data)
    claims = declared.build("ln_placement", quantities(data, pairs), words(data, pairs))
    return Result(fig, claims, _notes(data, lrs, _left_out(pairs)), gates=_gates(data, pairs))


def _notes(data: pd.DataFrame, lrs: list[float], left_out: list[str]) -> list[str]:
    """How the quantities were measured and encoded, with the numbers they depend on; the lrs
    whose gap among the seeds that trained in both was left out (`_left_out`)."""
    pre = {title: slopes(grad_norms(data, arms["pre"], name))
           for title, arms, name in grad_panels(data)}  # fmt: skip
    band = _threshold("max_pre_slope")
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
        f"+-{band:g} per layer, and does not hold when it lies wholly outside (the "
        "gradient grows, or shrinks, by more than that a layer). Mean Pre-LN slopes per layer: "
        + ", ".join(f"{t}: {np.mean(v):+.3f}" for t, v in pre.items() if len(v))
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
