"""ln_placement: Xiong et al. 2020, Post-LN needs warmup, Pre-LN does not; gradients at init."""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt

from normlab.analysis.curves import decided, final, show
from normlab.analysis.logs import Run, pick
from normlab.analysis.report import Claim, Result, tidy

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


def _run(runs: list[Run], placement: str, warmup: bool) -> Run | None:
    found = [r for r in pick(runs, placement=placement) if (r.get(WARMUP, "0") != "0") == warmup]
    return found[0] if found else None


def _claims(runs: list[Run]) -> list[Claim]:
    post, pre = _run(runs, "post", False), _run(runs, "pre", False)
    g_post, g_pre = (grad_at_init(r) if r else [] for r in (post, pre))
    r_post = g_post[-1] / g_post[0] if len(g_post) > 1 and g_post[0] > 0 else math.nan
    r_pre = g_pre[-1] / g_pre[0] if len(g_pre) > 1 and g_pre[0] > 0 else math.nan
    post_nw, post_w = final(post, "val/loss"), final(_run(runs, "post", True), "val/loss")
    pre_nw, pre_w = final(pre, "val/loss"), final(_run(runs, "pre", True), "val/loss")
    return [
        Claim(
            "Post-LN's gradient norm at init grows with the layer index; Pre-LN's does not",
            PAPER["grad"],
            f"last/first block grad norm: Post-LN {r_post:.2f}, Pre-LN {r_pre:.2f}",
            (r_post > 1 and abs(math.log(r_pre)) < abs(math.log(r_post)))
            if decided(r_post, r_pre)
            else None,
            "holds if Post-LN's last-block/first-block gradient norm at step 0 is > 1 and Pre-LN's "
            "ratio is closer to 1 (in log scale)",
        ),
        Claim(
            "Post-LN needs warmup",
            PAPER["post_warmup"],
            f"Post-LN final val loss {show(post_nw)} without vs {show(post_w)} with warmup",
            post_nw - post_w > MIN_LOSS_GAP if decided(post_nw, post_w) else None,
            f"holds if Post-LN's final val loss without warmup is > {MIN_LOSS_GAP} nats worse "
            "than with warmup (a diverged run counts as infinitely worse)",
        ),
        Claim(
            "Pre-LN trains without warmup",
            PAPER["pre_no_warmup"],
            f"Pre-LN final val loss {show(pre_nw)} without vs {show(pre_w)} with warmup",
            pre_nw - pre_w <= MIN_LOSS_GAP if decided(pre_nw, pre_w) else None,
            f"holds if Pre-LN's final val loss without warmup is at most {MIN_LOSS_GAP} nats "
            "worse than with warmup",
        ),
    ]


def analyze(runs: list[Run]) -> Result:
    """Val loss curves (placement x warmup) and per-block gradient norms at initialization."""
    fig, (ax_loss, ax_grad) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows = []
    for i, (placement, label) in enumerate(PLACEMENTS.items()):
        for warmup in (False, True):
            run = _run(runs, placement, warmup)
            if run is None:
                continue
            name = f"{label}, {'warmup ' + run.get(WARMUP) if warmup else 'no warmup'}"
            loss = run.series("val/loss")
            tag = " (diverged)" if run.status == "diverged" else ""
            ax_loss.plot(
                loss["step"] + 1,
                loss["val/loss"],
                "-" if warmup else "--",
                color=f"C{i}",
                marker="o",
                ms=3,
                label=name + tag,
            )
            rows += [
                {
                    "panel": "val_loss",
                    "run": name,
                    "x_name": "step",
                    "x": s + 1,
                    "y_name": "val/loss",
                    "y": v,
                }
                for s, v in zip(loss["step"], loss["val/loss"], strict=True)
            ]
            if not warmup:
                grads = grad_at_init(run)
                ax_grad.plot(
                    range(1, len(grads) + 1), grads, marker="o", color=f"C{i}", label=label
                )
                rows += [
                    {
                        "panel": "grad_norm_init",
                        "run": label,
                        "x_name": "block",
                        "x": b + 1,
                        "y_name": "grad norm",
                        "y": g,
                    }
                    for b, g in enumerate(grads)
                ]
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
