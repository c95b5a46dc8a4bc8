"""ln_placement: Xiong et al. 2020, Post-LN needs warmup, Pre-LN does not; gradients at init."""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import pandas as pd

from normlab.analysis.curves import decided, final, show
from normlab.analysis.logs import Run, pick
from normlab.analysis.report import LegacyClaim as Claim
from normlab.analysis.report import Result, tidy

# ----- the paper's claims (Xiong et al. 2020, "On Layer Normalization in the Transformer") -----
PAPER = {
    "grad": "Fig. 3: at init, Post-LN's gradient norm grows with the layer index; Pre-LN's stays "
    "about the same for every layer",
    "post_warmup": "Post-LN without warmup: 8.45 BLEU vs ~34 with warmup (IWSLT14 De-En)",
    "pre_no_warmup": "Pre-LN without warmup reaches the quality of Post-LN with warmup, faster",
}
# ----- the rules that decide "holds" ------------------------------------------------------------
MIN_LOSS_GAP = 0.05  # nats of val loss: "worse" means worse by more than this
GRAD_KEY = re.compile(r"grad_norm/block_(\d+)$")
PLACEMENTS = {"post": "Post-LN", "pre": "Pre-LN", "deepnorm": "DeepNorm"}
WARMUP = "optim.warmup_steps"


def grad_at_init(run: Run) -> list[float]:
    """grad_norm/block_XX at the first logged step, in block order."""
    cols = sorted((int(m.group(1)), c) for c in run.metrics.columns if (m := GRAD_KEY.match(c)))
    if not cols:
        return []
    rows = run.metrics.dropna(subset=[cols[0][1]]).sort_values("step")
    return [float(rows.iloc[0][c]) for _, c in cols] if len(rows) else []


def _runs(runs: list[Run], placement: str, warmup: bool) -> list[Run]:
    """The runs of one placement with / without warmup: one per seed, in seed order."""
    found = [r for r in pick(runs, placement=placement) if (r.get(WARMUP, "0") != "0") == warmup]
    return sorted(found, key=lambda r: r.get("seed"))


def _mean_final(runs: list[Run], key: str) -> float:
    """Mean over seeds of the final value (inf if any seed diverged, NaN if none finished)."""
    values = [final(r, key) for r in runs]
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def _grad_ratio(runs: list[Run]) -> tuple[float, list[float]]:
    """last-block / first-block gradient norm at init: geometric mean over seeds, and each."""
    ratios = []
    for run in runs:
        grads = grad_at_init(run)
        if len(grads) > 1 and grads[0] > 0:
            ratios.append(grads[-1] / grads[0])
    if not ratios:
        return math.nan, []
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios)), ratios


def _seeds(runs: list[Run]) -> str:
    return f"{len(runs)} seed{'s' if len(runs) != 1 else ''}"


def _each(ratios: list[float]) -> str:
    return " (per seed " + ", ".join(f"{r:.2f}" for r in ratios) + ")" if len(ratios) > 1 else ""


def _over(runs: list[Run], what: str = "mean") -> str:
    return f", {what} of {len(runs)} seeds" if len(runs) > 1 else ""


def _claims(runs: list[Run]) -> list[Claim]:
    post, pre = _runs(runs, "post", False), _runs(runs, "pre", False)
    (r_post, each_post), (r_pre, each_pre) = _grad_ratio(post), _grad_ratio(pre)
    post_w, pre_w = (_mean_final(_runs(runs, p, True), "val/loss") for p in ("post", "pre"))
    post_nw, pre_nw = _mean_final(post, "val/loss"), _mean_final(pre, "val/loss")
    return [
        Claim(
            "Post-LN's gradient norm at init grows with the layer index; Pre-LN's does not",
            PAPER["grad"],
            f"last/first block grad norm{_over(post, 'geometric mean')}: Post-LN "
            f"{r_post:.2f}{_each(each_post)}, Pre-LN {r_pre:.2f}{_each(each_pre)}",
            (r_post > 1 and abs(math.log(r_pre)) < abs(math.log(r_post)))
            if decided(r_post, r_pre)
            else None,
            "holds if Post-LN's last-block/first-block gradient norm at step 0 (geometric mean "
            "over seeds) is > 1 and Pre-LN's ratio is closer to 1 (in log scale)",
        ),
        Claim(
            "Post-LN needs warmup",
            PAPER["post_warmup"],
            f"Post-LN final val loss {show(post_nw)} without vs {show(post_w)} with warmup"
            f"{_over(post)}",
            post_nw - post_w > MIN_LOSS_GAP if decided(post_nw, post_w) else None,
            f"holds if Post-LN's final val loss without warmup (mean over seeds) is > "
            f"{MIN_LOSS_GAP} nats worse than with warmup (a diverged run counts as infinitely "
            "worse)",
        ),
        Claim(
            "Pre-LN trains without warmup",
            PAPER["pre_no_warmup"],
            f"Pre-LN final val loss {show(pre_nw)} without vs {show(pre_w)} with warmup"
            f"{_over(pre)}",
            pre_nw - pre_w <= MIN_LOSS_GAP if decided(pre_nw, pre_w) else None,
            f"holds if Pre-LN's final val loss without warmup (mean over seeds) is at most "
            f"{MIN_LOSS_GAP} nats worse than with warmup",
        ),
    ]


def analyze(runs: list[Run]) -> Result:
    """Val loss curves (placement x warmup; each seed thin, their mean bold) and per-block
    gradient norms at initialization (each seed thin, their mean bold)."""
    fig, (ax_loss, ax_grad) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = []
    for i, (placement, label) in enumerate(PLACEMENTS.items()):
        for warmup in (False, True):
            group = _runs(runs, placement, warmup)
            if not group:
                continue
            name = f"{label}, {'warmup ' + group[0].get(WARMUP) if warmup else 'no warmup'}"
            style = "-" if warmup else "--"
            curves = []
            for run in group:
                loss = run.series("val/loss").set_index("step")["val/loss"]
                loss = loss[~loss.index.duplicated(keep="last")]
                curves.append(loss)
                seed = run.get("seed", "")
                if len(group) > 1:
                    ax_loss.plot(loss.index + 1, loss.values, style, color=f"C{i}", alpha=0.3)
                rows += [
                    {"panel": "val_loss", "run": name, "seed": seed, "status": run.status,
                     "x_name": "step", "x": s + 1, "y_name": "val/loss", "y": v}
                    for s, v in loss.items()
                ]  # fmt: skip
            mean = pd.concat(curves, axis=1).mean(axis=1)  # steps every seed logged
            diverged = sum(r.status == "diverged" for r in group)
            tag = f" ({diverged} diverged)" if diverged else ""
            ax_loss.plot(mean.index + 1, mean.values, style, color=f"C{i}", marker="o", ms=3,
                         label=f"{name}{tag}, mean of {_seeds(group)}")  # fmt: skip
            if not warmup:
                per_run = [(run, grad_at_init(run)) for run in group]
                grads = [g for _, g in per_run if g]
                for g in grads if len(grads) > 1 else []:
                    ax_grad.plot(range(1, len(g) + 1), g, color=f"C{i}", alpha=0.3)
                if grads:
                    avg = [sum(col) / len(col) for col in zip(*grads, strict=False)]
                    ax_grad.plot(range(1, len(avg) + 1), avg, marker="o", color=f"C{i}",
                                 label=f"{label}, mean of {_seeds(grads)}")  # fmt: skip
                rows += [
                    {"panel": "grad_norm_init", "run": label, "seed": run.get("seed", ""),
                     "status": run.status, "x_name": "block", "x": b + 1,
                     "y_name": "grad norm", "y": g}
                    for run, run_grads in per_run
                    for b, g in enumerate(run_grads)
                ]  # fmt: skip
    ax_loss.set(xlabel="training step", ylabel="val loss (nats/char)", title="validation loss")
    ax_loss.legend(fontsize=8)
    ax_grad.set(
        xlabel="block (layer index)",
        ylabel="grad norm of block weights",
        title="gradient norm per layer at initialization",
        yscale="log",
    )
    ax_grad.legend()
    fig.suptitle("Norm placement and warmup, char-level Transformer LM (Xiong et al. 2020)")
    fig.tight_layout()
    return Result(fig, tidy(rows), _claims(runs))
