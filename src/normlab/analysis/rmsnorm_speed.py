"""rmsnorm_speed: RMSNorm (Zhang & Sennrich 2019) step time and quality against LayerNorm."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt

from normlab.analysis.curves import decided, final, show
from normlab.analysis.logs import Run, pick
from normlab.analysis.report import LegacyClaim as Claim
from normlab.analysis.report import Result, tidy

# ----- the paper's claims (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization") ------
PAPER = {
    "faster": "7%-64% less running time than LayerNorm, depending on model and implementation",
    "quality": "comparable performance to LayerNorm",
    "prms": "pRMSNorm (p = 6.25%) comparable to RMSNorm / LayerNorm",
}
# ----- the rules that decide "holds" ------------------------------------------------------------
MIN_SAVING = 0.07  # the paper's smallest gain: RMSNorm's median step time >= 7% below LayerNorm's
MAX_LOSS_GAP = 0.05  # "comparable": final val loss within this many nats of LayerNorm's
SKIP_STEPS = 10  # the first steps (allocations, warm caches) are left out of the median
NORMS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "prmsnorm": "pRMSNorm (p=6.25%)"}
TIME_KEY = "time/step_ms"


def step_ms(run: Run | None, q: float = 0.5) -> float:
    """Quantile q (default the median) of time/step_ms after the first SKIP_STEPS steps."""
    if run is None or run.status != "ok":
        return math.nan
    s = run.series(TIME_KEY)
    s = s[s["step"] >= SKIP_STEPS][TIME_KEY]
    return float(s.quantile(q)) if len(s) else math.nan


def median_step_ms(run: Run | None) -> float:
    """Median time/step_ms after the first SKIP_STEPS steps (NaN when not logged)."""
    return step_ms(run)


def separated(a: Run | None, b: Run | None) -> bool:
    """Whether the interquartile ranges of two runs' step times do not overlap (else: noise)."""
    return step_ms(a, 0.75) < step_ms(b, 0.25) or step_ms(b, 0.75) < step_ms(a, 0.25)


def _one(runs: list[Run], norm: str) -> Run | None:
    found = pick(runs, norm=norm)
    return found[0] if found else None


def _claims(runs: list[Run]) -> list[Claim]:
    ln, rms = _one(runs, "layernorm"), _one(runs, "rmsnorm")
    t_ln, t_rms = median_step_ms(ln), median_step_ms(rms)
    saving = 1 - t_rms / t_ln if decided(t_ln, t_rms) else math.nan
    iqr = {
        n: f"{step_ms(r, 0.25):.0f}-{step_ms(r, 0.75):.0f}" for n, r in (("ln", ln), ("rms", rms))
    }
    loss = {n: final(_one(runs, n), "val/loss") for n in NORMS}
    gap_rms, gap_prms = loss["rmsnorm"] - loss["layernorm"], loss["prmsnorm"] - loss["layernorm"]
    return [
        Claim(
            "RMSNorm trains faster than LayerNorm",
            PAPER["faster"],
            f"median step {t_rms:.1f} ms vs {t_ln:.1f} ms: {100 * saving:.1f}% less time "
            f"(interquartile ranges {iqr['rms']} vs {iqr['ln']} ms)",
            saving >= MIN_SAVING if decided(saving) and separated(ln, rms) else None,
            f"holds if RMSNorm's median step time (steps >= {SKIP_STEPS}) is at least "
            f"{100 * MIN_SAVING:g}% below LayerNorm's, the paper's smallest gain; undecided when "
            "the two runs' interquartile ranges of step time overlap (the machine's noise)",
        ),
        Claim(
            "RMSNorm's quality is comparable to LayerNorm's",
            PAPER["quality"],
            f"final val loss {show(loss['rmsnorm'])} vs {show(loss['layernorm'])}",
            gap_rms <= MAX_LOSS_GAP if decided(gap_rms) else None,
            f"holds if the final val loss is at most {MAX_LOSS_GAP} nats above LayerNorm's",
        ),
        Claim(
            "pRMSNorm's quality is comparable too",
            PAPER["prms"],
            f"final val loss {show(loss['prmsnorm'])} vs {show(loss['layernorm'])}",
            gap_prms <= MAX_LOSS_GAP if decided(gap_prms) else None,
            f"holds if the final val loss is at most {MAX_LOSS_GAP} nats above LayerNorm's",
        ),
    ]


def analyze(runs: list[Run]) -> Result:
    """Step time per norm (as a ratio to LayerNorm) and validation loss curves."""
    fig, (ax_t, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = []
    t_ln = median_step_ms(_one(runs, "layernorm"))
    labels, ratios = [], []
    for i, (norm, label) in enumerate(NORMS.items()):
        run = _one(runs, norm)
        if run is None:
            continue
        t = median_step_ms(run)
        labels.append(label)
        ratios.append(t / t_ln)
        rows.append(
            {
                "panel": "step_time",
                "run": norm,
                "x_name": "norm",
                "x": norm,
                "y_name": "median step ms",
                "y": t,
                "ratio_to_layernorm": t / t_ln,
            }
        )
        loss = run.series("val/loss")
        ax_loss.plot(loss["step"] + 1, loss["val/loss"], marker="o", color=f"C{i}", label=label)
        rows += [
            {
                "panel": "val_loss",
                "run": norm,
                "x_name": "step",
                "x": s + 1,
                "y_name": "val/loss",
                "y": v,
            }
            for s, v in zip(loss["step"], loss["val/loss"], strict=True)
        ]
    bars = ax_t.bar(labels, ratios, color=[f"C{i}" for i in range(len(labels))])
    ax_t.bar_label(bars, fmt="%.3f")
    ax_t.axhline(1.0, color="gray", lw=0.8)
    ax_t.axhline(1 - MIN_SAVING, color="gray", ls=":", label="paper's smallest gain (-7%)")
    ax_t.set(title="median training step time / LayerNorm's", ylabel="ratio")
    ax_t.set_ylim(0, 1.15 * max(ratios + [1.0]))  # room for the bar labels
    ax_t.legend(fontsize=8)
    ax_loss.set(title="validation loss", xlabel="training step", ylabel="val loss (nats/char)")
    ax_loss.legend()
    fig.suptitle("RMSNorm vs LayerNorm: speed and quality, Pre-LN char-level Transformer")
    fig.tight_layout()
    return Result(fig, tidy(rows), _claims(runs))
