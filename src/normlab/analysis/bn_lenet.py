"""bn_lenet: BatchNorm paper Fig. 1 (and the d2l BatchNorm chapter) on LeNet / Fashion-MNIST."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt

from normlab.analysis.logs import Run, pick
from normlab.analysis.report import Claim, Result, fmt, tidy

# ----- the paper's claims (Ioffe & Szegedy 2015), quoted; the only numbers typed here ---------
PAPER = {
    "faster": "ImageNet (Table 2): BN-Baseline reaches Inception's 72.2% in 13.3M vs 31.0M steps "
    "(2.3x); 14x with a 5x learning rate",
    "accuracy": "Fig. 1a (MNIST): BN's test accuracy is higher (a plot, no number in the text)",
    "stable": "Fig. 1b,c: without BN the sigmoid input's 15/50/85th percentiles drift; with BN "
    "they are 'much more stable' (a plot, no number)",
}
# ----- the rules that decide "holds" -----------------------------------------------------------
MIN_SPEEDUP = 2.0  # BN reaches the no-norm run's best val/acc at least this many times sooner
MAX_DRIFT_RATIO = 0.5  # BN's percentile drift at most half the no-norm run's

UNIT_KEY = "preact/net.classifier.norm4/{q}"  # NormStats: one unit of the last hidden layer
QUANTILES = ("p15", "p50", "p85")
ACTIVATIONS = ("sigmoid", "relu")
NORMS = {"batchnorm": "BatchNorm", "none": "no norm"}


def steps_to_reach(run: Run, target: float) -> float:
    """The first step at which val/acc >= target (inf if never)."""
    acc = run.series("val/acc")
    hit = acc[acc["val/acc"] >= target - 1e-9]
    return float(hit["step"].iloc[0]) + 1 if len(hit) else math.inf


def drift(run: Run) -> float:
    """How far the unit's median wanders over training, in units of its mean 15-85 band width."""
    p15, p50, p85 = (run.series(UNIT_KEY.format(q=q))[UNIT_KEY.format(q=q)] for q in QUANTILES)
    if not len(p50):
        return math.nan
    width = float((p85.values - p15.values).mean())
    return float(p50.max() - p50.min()) / max(width, 1e-12)


def _one(runs: list[Run], activation: str, norm: str) -> Run | None:
    found = pick(runs, model__net__activation=activation, norm=norm)
    return found[0] if found and found[0].status == "ok" else None


def _claims(runs: list[Run]) -> list[Claim]:
    claims = []
    for act in ACTIVATIONS:
        bn, plain = _one(runs, act, "batchnorm"), _one(runs, act, "none")
        tag = "" if act == "sigmoid" else " (relu: beyond the paper's sigmoid net)"
        if bn is None or plain is None:
            for key in ("faster", "accuracy", "stable"):
                claims.append(Claim(f"{key}{tag}", PAPER[key], "run missing", None, ""))
            continue
        target = float(plain.series("val/acc")["val/acc"].max())
        speedup = steps_to_reach(plain, target) / steps_to_reach(bn, target)
        claims.append(
            Claim(
                f"BN trains faster{tag}",
                PAPER["faster"],
                f"BN reaches no-norm's best val acc {target:.3f} {fmt(speedup)}x sooner "
                f"(step {steps_to_reach(bn, target):.0f} vs {steps_to_reach(plain, target):.0f})",
                speedup >= MIN_SPEEDUP,
                f"holds if BN reaches the no-norm run's best val/acc in at most 1/{MIN_SPEEDUP:g} "
                "of the steps (val/acc is measured once per epoch)",
            )
        )
        acc_bn, acc_plain = bn.last("test/acc"), plain.last("test/acc")
        claims.append(
            Claim(
                f"BN reaches a higher test accuracy{tag}",
                PAPER["accuracy"],
                f"test acc {acc_bn:.3f} (BN) vs {acc_plain:.3f} (none)",
                acc_bn > acc_plain,
                "holds if BN's final test/acc is higher than the no-norm run's",
            )
        )
        d_bn, d_plain = drift(bn), drift(plain)
        claims.append(
            Claim(
                f"BN keeps the {act} input distribution stable{tag}",
                PAPER["stable"],
                f"median drift {fmt(d_bn)} (BN) vs {fmt(d_plain)} (none) band widths",
                None if math.isnan(d_bn + d_plain) else d_bn <= MAX_DRIFT_RATIO * d_plain,
                "drift = (max - min of the unit's p50 over training) / mean(p85 - p15); holds if "
                f"BN's drift <= {MAX_DRIFT_RATIO:g} x the no-norm run's",
            )
        )
    return claims


def analyze(runs: list[Run]) -> Result:
    """Accuracy per epoch and the percentile bands of one last-hidden-layer unit, per activation."""
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5), squeeze=False)
    rows = []
    for i, act in enumerate(ACTIVATIONS):
        ax_acc = axes[i][0]
        for j, (norm, label) in enumerate(NORMS.items()):
            run = _one(runs, act, norm)
            ax_band = axes[i][2 - j]  # (b) without BN, (c) with BN, as in the paper
            ax_band.set_title(f"{act} input, 1 unit of last hidden layer: {label}", fontsize=10)
            if run is None:
                ax_band.text(0.5, 0.5, "run missing or failed", ha="center")
                continue
            acc = run.series("val/acc")
            ax_acc.plot(acc["step"] + 1, acc["val/acc"], marker="o", label=label)
            rows += [
                {
                    "panel": f"{act}/val_acc",
                    "run": norm,
                    "x_name": "step",
                    "x": s + 1,
                    "y_name": "val/acc",
                    "y": v,
                }
                for s, v in zip(acc["step"], acc["val/acc"], strict=True)
            ]
            for q, style in zip(QUANTILES, ("--", "-", "--"), strict=True):
                key = UNIT_KEY.format(q=q)
                s = run.series(key)
                ax_band.plot(s["step"], s[key], style, color="C0", label=q)
                rows += [
                    {
                        "panel": f"{act}/preact_{norm}",
                        "run": norm,
                        "x_name": "step",
                        "x": x,
                        "y_name": q,
                        "y": y,
                    }
                    for x, y in zip(s["step"], s[key], strict=True)
                ]
            ax_band.set_xlabel("training step")
            ax_band.legend(fontsize=8)
        ax_acc.set_title(f"{act}: validation accuracy")
        ax_acc.set_xlabel("training step")
        ax_acc.set_ylabel("val/acc")
        if ax_acc.lines:
            ax_acc.legend()
    for i in range(2):  # the two band panels of a row share their y range
        lows, highs = zip(*(axes[i][k].get_ylim() for k in (1, 2)), strict=True)
        for k in (1, 2):
            axes[i][k].set_ylim(min(lows), max(highs))
    fig.suptitle("BatchNorm on LeNet / Fashion-MNIST (BN paper Fig. 1)")
    fig.tight_layout()
    return Result(fig, tidy(rows), _claims(runs))
