"""deepnorm_depth: DeepNet (Wang et al. 2022) Figs. 4-5, model update norm early in training."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt

from normlab.analysis.curves import decided, final, show
from normlab.analysis.logs import Run, pick
from normlab.analysis.report import LegacyClaim as Claim
from normlab.analysis.report import Result, tidy

# ----- the paper's claims (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers") --
PAPER = {
    "post_grows": "Figs. 4-5: Post-LN's model update ||F(x,θ_t) - F(x,θ_0)|| explodes at the "
    "start of training, more so the deeper the model",
    "deepnorm_bounded": "DeepNorm bounds the model update by O(η) (Sec. 4); Figs. 4-5: stays small",
    "deep_trains": "Deep Post-LN diverges; DeepNorm trains up to 1,000 layers (abstract)",
}
# ----- the rules that decide "holds" ------------------------------------------------------------
EARLY_STEPS = 100  # "early": the update norm's peak over the first this many steps
PLACEMENTS = {"post": "Post-LN", "pre": "Pre-LN", "deepnorm": "DeepNorm"}
DEPTH = "model.net.depth"


def early_peak(run: Run | None) -> float:
    """Largest update_norm over the first EARLY_STEPS steps (NaN when not logged)."""
    if run is None:
        return math.nan
    s = run.series("update_norm")
    s = s[s["step"] <= EARLY_STEPS]["update_norm"]
    return float(s.max()) if len(s) else math.nan


def _by_depth(runs: list[Run], placement: str) -> dict[int, Run]:
    return dict(sorted((int(r.get(DEPTH)), r) for r in pick(runs, placement=placement)))


def _claims(runs: list[Run]) -> list[Claim]:
    post, deep = _by_depth(runs, "post"), _by_depth(runs, "deepnorm")
    depths = sorted(set(post) & set(deep))
    if not depths:
        return [Claim(k, v, "runs missing", None, "") for k, v in PAPER.items()]
    lo, hi = depths[0], depths[-1]
    p_lo, p_hi, d_hi = early_peak(post[lo]), early_peak(post[hi]), early_peak(deep[hi])
    loss_post, loss_deep = final(post[hi], "val/loss"), final(deep[hi], "val/loss")
    return [
        Claim(
            "Post-LN's early model update grows with depth",
            PAPER["post_grows"],
            f"Post-LN peak update (first {EARLY_STEPS} steps): {p_lo:.3g} at depth {lo}, "
            f"{p_hi:.3g} at depth {hi}",
            p_hi > p_lo if decided(p_lo, p_hi) else None,
            f"holds if Post-LN's peak update_norm over the first {EARLY_STEPS} steps is larger at "
            "the largest depth than at the smallest",
        ),
        Claim(
            "DeepNorm's early model update stays bounded",
            PAPER["deepnorm_bounded"],
            f"peak update at depth {hi}: DeepNorm {d_hi:.3g} vs Post-LN {p_hi:.3g}",
            d_hi < p_hi if decided(d_hi, p_hi) else None,
            "holds if DeepNorm's peak early update_norm at the largest depth is below Post-LN's",
        ),
        Claim(
            f"at depth {hi} DeepNorm trains better than Post-LN",
            PAPER["deep_trains"],
            f"final val loss at depth {hi}: DeepNorm {show(loss_deep)}, Post-LN {show(loss_post)}",
            loss_deep < loss_post if decided(loss_deep, loss_post) else None,
            "holds if DeepNorm's final val loss at the largest depth is lower than Post-LN's "
            "(a diverged run counts as infinite loss)",
        ),
    ]


def analyze(runs: list[Run]) -> Result:
    """update_norm over the first steps, one panel per depth; final val loss against depth."""
    depths = sorted({int(r.get(DEPTH)) for r in runs if r.get(DEPTH)})
    fig, axes = plt.subplots(
        1, len(depths) + 1, figsize=(4.2 * (len(depths) + 1), 4), squeeze=False
    )
    rows = []
    for k, depth in enumerate(depths):
        ax = axes[0][k]
        for i, (placement, label) in enumerate(PLACEMENTS.items()):
            run = _by_depth(runs, placement).get(depth)
            if run is None:
                continue
            s = run.series("update_norm")
            ax.plot(s["step"], s["update_norm"], color=f"C{i}", label=label)
            rows += [
                {
                    "panel": f"update_norm/depth_{depth}",
                    "run": placement,
                    "x_name": "step",
                    "x": x,
                    "y_name": "update_norm",
                    "y": y,
                }
                for x, y in zip(s["step"], s["update_norm"], strict=True)
            ]
        ax.set(
            title=f"depth {depth}: model update",
            xlabel="training step",
            ylabel="||F(x,θ_t) - F(x,θ_0)||",
            yscale="log",
        )
        ax.legend(fontsize=8)
    ax = axes[0][-1]
    for i, (placement, label) in enumerate(PLACEMENTS.items()):
        by_depth = _by_depth(runs, placement)
        losses = {d: final(r, "val/loss") for d, r in by_depth.items()}
        ok = {d: v for d, v in losses.items() if math.isfinite(v)}
        ax.plot(list(ok), list(ok.values()), marker="o", color=f"C{i}", label=label)
        bad = [d for d, v in losses.items() if math.isinf(v)]
        if bad:  # diverged runs: a cross on the top edge
            top = max([v for v in ok.values()] or [1.0])
            ax.plot(
                bad, [top] * len(bad), "x", ms=12, mew=3, color=f"C{i}", label=f"{label} diverged"
            )
        rows += [
            {
                "panel": "final_val_loss",
                "run": placement,
                "x_name": "depth",
                "x": d,
                "y_name": "val/loss",
                "y": v,
                "status": by_depth[d].status,
            }
            for d, v in losses.items()
        ]
    ax.set(title="final validation loss", xlabel="depth (blocks)", ylabel="val loss", xscale="log")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()  # only the swept depths are labelled
    ax.legend(fontsize=8)
    fig.suptitle("Depth: Post-LN vs Pre-LN vs DeepNorm, tiny char-level Transformer (DeepNet)")
    fig.tight_layout()
    return Result(fig, tidy(rows), _claims(runs))
