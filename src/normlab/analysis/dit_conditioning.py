"""dit_conditioning: DiT (Peebles & Xie 2023) Table 4, conditioning mechanisms compared by FID."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt

from normlab.analysis.curves import decided, final, show
from normlab.analysis.logs import Run, pick
from normlab.analysis.report import LegacyClaim as Claim
from normlab.analysis.report import Result, tidy

# ----- the paper's claims (DiT Table 4: XL/2, 400K steps, FID-50K on ImageNet 256) -------------
PAPER_FID = {"adaln_zero": 19.47, "adaln": 25.21, "cross_attn": 26.14, "in_context": 35.24}
# ----- the rule that decides "holds": the order of final val/fid_lenet -------------------------
CONDITIONINGS = {
    "adaln_zero": "adaLN-Zero",
    "adaln": "adaLN",
    "cross_attn": "cross-attention",
    "in_context": "in-context",
}
KEY = "model.net.conditioning"
FID = "val/fid_lenet"


def _one(runs: list[Run], conditioning: str) -> Run | None:
    found = pick(runs, **{KEY.replace(".", "__"): conditioning})
    return found[0] if found else None


def _claims(runs: list[Run]) -> list[Claim]:
    fid = {c: final(_one(runs, c), FID) for c in CONDITIONINGS}
    paper_order = sorted(PAPER_FID, key=PAPER_FID.get)
    ours_order = sorted(fid, key=lambda c: fid[c])
    all_known = decided(*fid.values())
    best = min(fid, key=lambda c: fid[c])
    return [
        Claim(
            "adaLN-Zero gives the best FID",
            f"adaLN-Zero {PAPER_FID['adaln_zero']} (best of four)",
            f"adaLN-Zero {show(fid['adaln_zero'], 2)}; best: {CONDITIONINGS[best]}",
            best == "adaln_zero" if all_known else None,
            "holds if adaLN-Zero's final val/fid_lenet is the lowest of the four",
        ),
        Claim(
            "FID order adaLN-Zero < adaLN < cross-attention < in-context",
            " < ".join(f"{CONDITIONINGS[c]} {PAPER_FID[c]}" for c in paper_order),
            " < ".join(f"{CONDITIONINGS[c]} {show(fid[c], 2)}" for c in ours_order),
            ours_order == paper_order if all_known else None,
            "holds if the four final val/fid_lenet values rank in the paper's order",
        ),
    ]


def analyze(runs: list[Run]) -> Result:
    """val/fid_lenet over training and validation loss, per conditioning."""
    fig, (ax_fid, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = []
    for i, (cond, label) in enumerate(CONDITIONINGS.items()):
        run = _one(runs, cond)
        if run is None:
            continue
        for ax, key in ((ax_fid, FID), (ax_loss, "val/loss")):
            s = run.series(key)
            ax.plot(s["step"] + 1, s[key], marker="o", color=f"C{i}", label=label)
            rows += [
                {"panel": key, "run": cond, "x_name": "step", "x": x + 1, "y_name": key, "y": y}
                for x, y in zip(s["step"], s[key], strict=True)
            ]
    ax_fid.set(
        title="FID in a Fashion-MNIST LeNet's features (lower is better)",
        xlabel="training step",
        ylabel="val/fid_lenet",
    )
    ax_loss.set(title="validation loss (EMA weights)", xlabel="training step", ylabel="val/loss")
    for ax in (ax_fid, ax_loss):
        ax.legend()
    fig.suptitle("DiT conditioning (DiT Table 4), tiny DiT on Fashion-MNIST")
    fig.tight_layout()
    notes = []
    if not any(math.isfinite(final(_one(runs, c), FID)) for c in CONDITIONINGS):
        notes.append("no finished run logged val/fid_lenet")
    loss = {c: final(_one(runs, c), "val/loss") for c in CONDITIONINGS}
    if decided(*loss.values()):  # the denoising loss, beside the FID the claims are about
        order = sorted(loss, key=lambda c: loss[c])
        notes.append(
            "final val/loss (EMA weights, not a paper claim: the paper reports FID): "
            + " < ".join(f"{CONDITIONINGS[c]} {show(loss[c], 4)}" for c in order)
            + (" (the paper's FID order)" if order == sorted(PAPER_FID, key=PAPER_FID.get) else "")
        )
    return Result(fig, tidy(rows), _claims(runs), notes)
