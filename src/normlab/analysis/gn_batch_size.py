"""gn_batch_size: GroupNorm paper Fig. 1 / Tables 1-2, test error against the per-device batch."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt

from normlab.analysis.logs import Run, pick
from normlab.analysis.report import Claim, Result, tidy

# ----- the paper's claims (Wu & He 2018, ResNet-50 on ImageNet, val error %) --------------------
PAPER_BN_ERR = {32: 23.6, 2: 34.7}  # Table 2, BN at 32 and 2 images per GPU
PAPER_GN_ERR = {32: 24.1, 2: 24.1}  # Table 2, GN at 32 and 2 images per GPU
PAPER_ERR_AT_32 = {"batchnorm": 23.6, "groupnorm": 24.1, "layernorm": 25.3, "instancenorm": 28.4}
# ----- the rules that decide "holds" (percentage points of test error) -------------------------
MIN_BN_INCREASE = 2.0  # BN's error at batch 2 at least this much above its error at 32
MAX_GN_CHANGE = 1.5  # GN's error at every batch within this much of its error at 32

NORMS = {
    "batchnorm": "BatchNorm",
    "groupnorm": "GroupNorm",
    "layernorm": "LayerNorm",
    "instancenorm": "InstanceNorm",
}


def test_error(runs: list[Run], norm: str) -> dict[int, float]:
    """{batch: test error %} of one norm's finished jobs."""
    errors = {}
    for r in pick(runs, norm=norm):
        acc = r.last("test/acc") if r.status == "ok" else math.nan
        errors[int(r.get("batch"))] = 100.0 * (1.0 - acc)
    return dict(sorted(errors.items(), reverse=True))


def _claims(err: dict[str, dict[int, float]]) -> list[Claim]:
    bn, gn = err.get("batchnorm", {}), err.get("groupnorm", {})
    small, big = (min(bn), max(bn)) if bn else (2, 32)
    bn_rise = bn.get(small, math.nan) - bn.get(big, math.nan)
    gn_change = max((abs(v - gn.get(big, math.nan)) for v in gn.values()), default=math.nan)
    at_big = {n: e[big] for n, e in err.items() if big in e and not math.isnan(e[big])}
    ours_order = sorted(at_big, key=at_big.get)
    paper_order = sorted(PAPER_ERR_AT_32, key=PAPER_ERR_AT_32.get)

    def known(x: float) -> bool | None:  # None (undecided) when a run is missing
        return None if math.isnan(x) else True

    return [
        Claim(
            f"BN's error grows as the batch shrinks ({big} -> {small})",
            f"{PAPER_BN_ERR[32]}% -> {PAPER_BN_ERR[2]}% "
            f"(+{PAPER_BN_ERR[2] - PAPER_BN_ERR[32]:.1f})",
            f"{bn.get(big, math.nan):.1f}% -> {bn.get(small, math.nan):.1f}% ({bn_rise:+.1f})",
            known(bn_rise) and bn_rise >= MIN_BN_INCREASE,
            f"holds if BN's test error at the smallest batch is >= {MIN_BN_INCREASE:g} points "
            "above its error at the largest",
        ),
        Claim(
            "GN's error stays flat across batch sizes",
            f"{PAPER_GN_ERR[32]}% at 32, {PAPER_GN_ERR[2]}% at 2",
            ", ".join(f"{v:.1f}% at {b}" for b, v in gn.items()) + f" (max change {gn_change:.1f})",
            known(gn_change) and gn_change <= MAX_GN_CHANGE,
            f"holds if GN's test error at every batch is within {MAX_GN_CHANGE:g} points of its "
            "error at the largest batch",
        ),
        Claim(
            f"GN beats BN at batch {small}",
            f"GN {PAPER_GN_ERR[2]}% vs BN {PAPER_BN_ERR[2]}% at 2",
            f"GN {gn.get(small, math.nan):.1f}% vs BN {bn.get(small, math.nan):.1f}%",
            known(gn.get(small, math.nan) + bn.get(small, math.nan)) and gn[small] < bn[small],
            "holds if GN's test error is lower than BN's at the smallest batch",
        ),
        Claim(
            f"error order at batch {big}: BN < GN < LN < IN (Table 1)",
            ", ".join(f"{NORMS[n]} {PAPER_ERR_AT_32[n]}%" for n in paper_order),
            ", ".join(f"{NORMS[n]} {at_big[n]:.1f}%" for n in ours_order),
            None if len(at_big) < len(paper_order) else ours_order == paper_order,
            "holds if our four norms rank in the paper's order of error at the largest batch",
        ),
    ]


def analyze(runs: list[Run]) -> Result:
    """Test error against batch size for each norm (absolute and relative to the largest batch)."""
    err = {n: e for n in NORMS if (e := test_error(runs, n))}
    fig, (ax, ax_rel) = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = []
    for norm, by_batch in err.items():
        batches, values = list(by_batch), list(by_batch.values())
        base = by_batch[max(batches)]
        ax.plot(batches, values, marker="o", label=NORMS[norm])
        ax_rel.plot(batches, [v - base for v in values], marker="o", label=NORMS[norm])
        rows += [
            {
                "panel": "test_error",
                "run": norm,
                "x_name": "batch",
                "x": b,
                "y_name": "test error %",
                "y": v,
                "error_minus_largest_batch": v - base,
            }
            for b, v in by_batch.items()
        ]
    for a, label in ((ax, "test error (%)"), (ax_rel, "error - error at largest batch (points)")):
        a.set_xscale("log", base=2)
        a.set_xticks(sorted({b for e in err.values() for b in e}))
        a.get_xaxis().set_major_formatter(plt.ScalarFormatter())
        a.invert_xaxis()  # as in the paper: the batch shrinks to the right
        a.set_xlabel("images per batch (lr scaled linearly)")
        a.set_ylabel(label)
        a.grid(alpha=0.3)
        a.legend()
    ax.set_title("LeNet / Fashion-MNIST test error")
    ax_rel.set_title("change from the largest batch")
    fig.suptitle("Batch size: BN vs GN, LN, IN (GN paper Fig. 1)")
    fig.tight_layout()
    return Result(fig, tidy(rows), _claims(err))
