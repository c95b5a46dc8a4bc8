"""rmsnorm_speed: Zhang & Sennrich 2019, RMSNorm's training speed and quality against LayerNorm.

Two grids. `speed` (experiment=rmsnorm_speed): in each job the step time of the model with the
swept norm and of the same model with LayerNorm, paired step by step in one process
(callbacks.paired_step_time), at 1 and 2 threads; seeds are repeats; norm=layernorm is the
control (the same model on both sides). `quality` (experiment=rmsnorm_quality): the val loss of
LayerNorm, RMSNorm and pRMSNorm over 600 steps. `extract` reads the run logs into runs.csv;
`render` draws the figure and decides the claims from runs.csv alone.
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from normlab.analysis.curves import final_loss, metric, paired, val_loss_rows
from normlab.analysis.logs import Run
from normlab.analysis.report import Claim, IntervalClaim, Result
from normlab.analysis.stats import BELOW, Interval, bootstrap

# ----- the paper's claims (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization") ------
PAPER = {
    "faster": "7%-64% less running time than LayerNorm, depending on model and implementation",
    "quality": "comparable performance to LayerNorm",
    "prms_faster": "pRMSNorm: the RMS from p = 6.25% of the inputs, proposed as cheaper still; "
    "the 7%-64% range is RMSNorm's",
    "prms": "pRMSNorm (p = 6.25%) comparable to RMSNorm / LayerNorm",
}
# ----- the rules that decide "holds" ------------------------------------------------------------
MAX_RATIO = 0.93  # the step time ratio to LayerNorm at the paper's smallest gain, 7% less time
LOSS_MARGIN = 0.05  # "comparable": the final val loss within +-this many nats of LayerNorm's
RESAMPLES, BOOTSTRAP_SEED = 10_000, 0
CI_BOOTSTRAP = (
    f"speed: 95% percentile bootstrap interval of the pooled median, {RESAMPLES:,} resamples "
    f"of the pairs drawn within each repeat (stratified), RNG seed {BOOTSTRAP_SEED}"
)

SPEED = "rmsnorm_speed"
BASELINE = "layernorm"
NORMS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "prmsnorm": "pRMSNorm"}
MODEL_MS, BASELINE_MS = "time/model_step_ms", "time/baseline_step_ms"
BASELINE_FIRST = "time/baseline_first"
SPEED_ARM = re.compile(r"^speed/(?P<norm>\w+)/t(?P<threads>\d+)$")


# ----- run logs -> runs.csv -------------------------------------------------------------------


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per speed job: each timed pair (x = the run's step) as its two step times (ms) and which
    went first. Per quality job: the val loss curve (x = steps trained), its last val loss and
    whether it diverged."""
    rows = []
    for run in runs:
        a, seed = run.arm, int(run.get("seed"))
        if not a.startswith("speed/"):
            rows += val_loss_rows(run, a, seed)
            continue
        if run.status != "ok":
            continue
        for key in (MODEL_MS, BASELINE_MS, BASELINE_FIRST):
            series = run.series(key)
            rows += [
                (a, seed, float(s), key, float(v))
                for s, v in zip(series["step"], series[key], strict=True)
            ]
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


# ----- runs.csv -> claims and figure ----------------------------------------------------------


def pairs(data: pd.DataFrame, norm: str, threads: int) -> pd.DataFrame:
    """The timed pairs of one speed arm: a row per (seed, step) with both times, which went
    first, and the ratio (the norm's model / LayerNorm's)."""
    rows = data[data["arm"] == f"speed/{norm}/t{threads}"]
    table = rows.pivot_table(index=["seed", "x"], columns="metric", values="value")
    if table.empty or MODEL_MS not in table or BASELINE_MS not in table:
        return pd.DataFrame(columns=[MODEL_MS, BASELINE_MS, BASELINE_FIRST, "ratio"])
    table = table.dropna(subset=[MODEL_MS, BASELINE_MS])
    return table.assign(ratio=table[MODEL_MS] / table[BASELINE_MS])


def ratio_interval(table: pd.DataFrame) -> Interval:
    """The median of the per-pair ratios pooled over the repeats, and its bootstrap CI."""
    if table.empty:
        return bootstrap([])
    groups = [g["ratio"].to_numpy() for _, g in table.groupby(level="seed")]
    return bootstrap(groups, np.median, resamples=RESAMPLES, seed=BOOTSTRAP_SEED)


def repeat_medians(table: pd.DataFrame) -> pd.Series:
    """{seed: median ratio of that repeat's pairs}."""
    if table.empty:
        return pd.Series(dtype=float)
    return table["ratio"].groupby(level="seed").median()


def speed_arms(data: pd.DataFrame) -> list[tuple[str, int]]:
    """(norm, threads) of every speed arm in the data, in NORMS order then by threads."""
    found = {
        (m["norm"], int(m["threads"])) for a in data["arm"].unique() if (m := SPEED_ARM.match(a))
    }
    rank = {norm: i for i, norm in enumerate(NORMS)}
    return sorted(found, key=lambda nt: (rank.get(nt[0], len(rank)), nt[1]))


def _label(norm: str) -> str:
    return NORMS.get(norm, norm) + (" (control)" if norm == BASELINE else "")


def _threads(n: int) -> str:
    return f"{n} thread" + ("s" if n != 1 else "")


def _speed_claims(data: pd.DataFrame, threads: list[int]) -> list[IntervalClaim]:
    claims = []
    for norm, paper in (("rmsnorm", PAPER["faster"]), ("prmsnorm", PAPER["prms_faster"])):
        for t in threads:
            table = pairs(data, norm, t)
            claims.append(
                IntervalClaim(
                    f"{NORMS[norm]} trains faster than LayerNorm by at least the paper's smallest "
                    f"gain ({100 * (1 - MAX_RATIO):g}%), {_threads(t)}",
                    paper,
                    f"the median, over the timed pairs of all repeats pooled, of the pair's "
                    f"ratio (step time of the model with {NORMS[norm]} / step time of the same "
                    f"model with LayerNorm, both stepped on the same batch in the same process), "
                    f"{_threads(t)}",
                    ratio_interval(table),
                    (BELOW, MAX_RATIO),
                    CI_BOOTSTRAP,
                    source="paper",
                )
            )
    return claims


def _quality_claims(data: pd.DataFrame, steps: int) -> list[Claim]:
    base = final_loss(data, f"quality/{BASELINE}")
    return [
        Claim(
            f"{NORMS[norm]}'s val loss is within {LOSS_MARGIN:g} nats of LayerNorm's "
            "(comparable quality)",
            PAPER["quality" if norm == "rmsnorm" else "prms"],
            f"{NORMS[norm]}'s final val loss (after {steps} steps) minus LayerNorm's, nats",
            paired(final_loss(data, f"quality/{norm}"), base),
            (-LOSS_MARGIN, LOSS_MARGIN),
            source="ours",
            why=f"the paper reports comparable quality; the +-{LOSS_MARGIN:g}-nat band is this "
            "suite's",
            arms=(f"quality/{norm}", f"quality/{BASELINE}"),
            final=True,
        )
        for norm in ("rmsnorm", "prmsnorm")
    ]


def _ratio_panel(ax: plt.Axes, data: pd.DataFrame, arms: list[tuple[str, int]]) -> None:
    """Each repeat's median ratio (dots) and the pooled median with its bootstrap CI."""
    for i, (norm, t) in enumerate(arms):
        table = pairs(data, norm, t)
        color = f"C{list(NORMS).index(norm)}" if norm in NORMS else "C7"
        medians = repeat_medians(table)
        offsets = np.linspace(-0.15, 0.15, len(medians)) if len(medians) > 1 else [0.0]
        ax.plot(i + np.asarray(offsets), medians.values, ".", color=color, alpha=0.6)
        interval = ratio_interval(table)
        if interval.known:
            ax.errorbar(
                [i],
                [interval.mean],
                yerr=[[interval.mean - interval.low], [interval.high - interval.mean]],
                fmt="o",
                ms=7,
                capsize=4,
                color=color,
            )
    ax.axhline(1.0, color="grey", lw=0.8, label="1: as fast as LayerNorm")
    ax.axhline(MAX_RATIO, color="grey", ls=":", label=f"{MAX_RATIO:g}: the paper's smallest gain")
    ax.set_xticks(
        range(len(arms)),
        [_label(n).replace(" ", "\n") + f"\n{_threads(t)}" for n, t in arms],
        fontsize=8,
    )
    ax.set(
        ylabel="step time / LayerNorm's (paired)",
        title="step time ratio: pooled median, 95% bootstrap CI; dots: each repeat's median",
    )
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)


def _loss_panel(ax: plt.Axes, data: pd.DataFrame) -> None:
    """Val loss against steps per norm: mean over seeds and its 95% t-interval as a band."""
    for k, (norm, label) in enumerate(NORMS.items()):
        curves = metric(data, f"quality/{norm}", "val/loss").pivot(
            index="x", columns="seed", values="value"
        )
        curves = curves.dropna()
        if curves.empty:
            continue
        intervals = [Interval.of(row.to_numpy()) for _, row in curves.iterrows()]
        x = list(curves.index)
        ax.plot(x, [i.mean for i in intervals], color=f"C{k}",
                label=f"{label} ({curves.shape[1]} seeds)")  # fmt: skip
        if all(i.known for i in intervals):
            lows, highs = [i.low for i in intervals], [i.high for i in intervals]
            ax.fill_between(x, lows, highs, color=f"C{k}", alpha=0.2)
    ax.set(
        xlabel="training step",
        ylabel="val loss (nats/char)",
        title="val loss: mean over seeds, 95% CI band",
    )
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)


def render(data: pd.DataFrame) -> Result:
    """Step time ratios to LayerNorm per norm and thread count, and val loss curves per norm."""
    arms = speed_arms(data)
    threads = sorted({t for _, t in arms}) or [1, 2]
    losses = data[data["metric"] == "val/loss"]
    steps = int(losses["x"].max()) if len(losses) else 0
    fig, (ax_t, ax_loss) = plt.subplots(1, 2, figsize=(13, 4.6))
    _ratio_panel(ax_t, data, arms)
    _loss_panel(ax_loss, data)
    fig.suptitle("RMSNorm vs LayerNorm: paired step time and val loss, Pre-LN char-level GPT "
                 "(Zhang & Sennrich 2019)")  # fmt: skip
    fig.tight_layout()
    claims = _speed_claims(data, threads) + _quality_claims(data, steps)
    return Result(fig, claims, _notes(data, arms, steps))


def _arm_note(data: pd.DataFrame, norm: str, t: int) -> str:
    """One speed arm: each repeat's median, both sides' median times, and the order effect."""
    table = pairs(data, norm, t)
    if table.empty:
        return f"{NORMS.get(norm, norm)}, {_threads(t)}: no timed pairs"
    medians = repeat_medians(table)
    interval = ratio_interval(table)
    first = table[table[BASELINE_FIRST] == 1]["ratio"]
    second = table[table[BASELINE_FIRST] == 0]["ratio"]
    return (
        f"{_label(norm)}, {_threads(t)}: pooled median {interval.mean:.3f} "
        f"[{interval.low:.3f}, {interval.high:.3f}] over {len(table)} pairs; per repeat "
        + ", ".join(f"seed {s}: {m:.3f}" for s, m in medians.items())
        + f"; median step {table[MODEL_MS].median():.1f} ms vs LayerNorm's "
        f"{table[BASELINE_MS].median():.1f} ms; LayerNorm's twin stepped first in "
        f"{len(first)} of {len(table)} pairs (median ratio {first.median():.3f} then, "
        f"{second.median():.3f} when it stepped second)"
    )


def _notes(data: pd.DataFrame, arms: list[tuple[str, int]], steps: int) -> list[str]:
    """How the quantities were measured, and the numbers a reader needs to judge the spread."""
    notes = [
        "Speed (grid `speed`, experiment=rmsnorm_speed): in each job, after each of the run's "
        "training steps, two twins built from the run's model config with the run's seed (one "
        "with the job's norm, one with LayerNorm; each with its own AdamW and lr schedule) took "
        "one step each on that batch, in a random order, each timed by the same code from its "
        "forward pass to its lr-schedule step; Lightning's loop around the run's own step is in "
        "neither time. The first pairs of a job are warmup, left out. A pair's ratio is the "
        "job's-norm twin's time / the LayerNorm twin's. Seeds are repeats of the whole job (init "
        "and batches follow the seed; both twins share them), run one job at a time.",
        "The bootstrap interval covers the pair-to-pair noise within these repeats (each "
        "repeat's pairs resampled on their own), not run-to-run spread beyond them: compare "
        "the per-repeat medians below with it. norm=layernorm is the control: the same model "
        "on both sides, so its ratio shows what the pairing itself reads (1 if unbiased).",
    ]
    notes += [_arm_note(data, norm, t) for norm, t in arms]
    finals = {n: final_loss(data, f"quality/{n}") for n in NORMS}
    notes.append(
        f"Quality (grid `quality`, experiment=rmsnorm_quality): {steps} AdamW steps (warmup "
        "then cosine); the val loss is the mean cross-entropy "
        "on the same fixed windows of the last 10% of the text for every job; final = at the "
        "last step. A seed sets the init and the training windows; the three norms of a seed "
        "share both. Final val loss per seed: "
        + "; ".join(
            f"{NORMS[n]} " + ", ".join(f"{v:.3f}" for v in f.values) for n, f in finals.items()
        )
        + "."
    )
    return notes
