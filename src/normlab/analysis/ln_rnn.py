"""ln_rnn: Ba, Kiros & Hinton 2016, layer normalization speeds up the training of an RNN.

One grid (experiment=ln_rnn): the character-level LSTM LM with norm=none and norm=layernorm,
each over seeds, paired by seed (same init of the shared weights, same training windows). Two
claims: the LN-LSTM reaches the plain LSTM's best val loss in fewer steps, and ends lower.
`extract` reads the run logs into runs.csv; `render` decides from runs.csv alone.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd

from normlab.analysis.curves import metric, seed_curves, val_loss_rows
from normlab.analysis.logs import Run
from normlab.analysis.report import Claim, Result
from normlab.analysis.stats import ABOVE

# ----- the paper's claims (Ba, Kiros & Hinton 2016), quoted --------------------------------------
PAPER = {
    "faster": "'layer normalization can substantially reduce the training time' (abstract); "
    "Figs. 2-6: LN models' validation curves fall faster (plots, no single number)",
    "lower": "Figs. 2-6 and Tables 2-5: LN models end at a lower validation error or loss",
}
NORMS = {"none": "plain LSTM", "layernorm": "LN-LSTM"}
VAL, FINAL = "val/loss", "final/val_loss"


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per finished (or diverged) job: its val loss after every EVERY steps and its last one."""
    rows = []
    for run in runs:
        rows += val_loss_rows(run, run.arm, int(run.get("seed")))
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


# ----- runs.csv -> claims and figure -------------------------------------------------------------


def curves(data: pd.DataFrame, a: str) -> dict[int, pd.Series]:
    """{seed: val loss by steps trained} of one arm."""
    rows = metric(data, a, VAL)
    return {int(s): g.set_index("x")["value"].sort_index() for s, g in rows.groupby("seed")}


def steps_to(curve: pd.Series, target: float) -> float:
    """The first step at which the val loss is <= target; NaN if never."""
    hit = curve[curve <= target + 1e-12]
    return float(hit.index[0]) if len(hit) else math.nan


def every(data: pd.DataFrame) -> int:
    """The steps between two val losses of a job (the experiment's val_check_interval)."""
    steps = metric(data, "none", VAL).groupby("seed")["x"].apply(lambda x: x.sort_values().diff())
    return int(steps.dropna().min()) if steps.notna().any() else 0


def speedup(plain: pd.Series, ln: pd.Series, interval: int) -> float:
    """The plain LSTM's steps to its best val loss / the LN-LSTM's steps to that loss. Where the
    LN-LSTM never gets there, its steps count as one evaluation (`interval` steps) past its
    last: an upper bound on the speedup, so the bias favours the paper."""
    target = float(plain.min())
    ln_steps = steps_to(ln, target)
    if math.isnan(ln_steps):
        ln_steps = float(ln.index[-1]) + interval
    return steps_to(plain, target) / ln_steps


def _claims(data: pd.DataFrame) -> list[Claim]:
    plain, ln = curves(data, "none"), curves(data, "layernorm")
    seeds, n = sorted(set(plain) & set(ln)), every(data)
    final = pd.concat(
        [metric(data, a, FINAL).set_index("seed")["value"] for a in NORMS], axis=1, keys=NORMS
    ).dropna()
    return [
        Claim(
            "the LN-LSTM reaches the plain LSTM's best val loss in fewer steps",
            PAPER["faster"],
            f"steps the plain LSTM takes to its best val loss / steps the LN-LSTM takes to reach "
            f"it (val loss every {n} steps; LN never there: its last step + {n}, favouring the "
            "paper)",
            [speedup(plain[s], ln[s], n) for s in seeds],
            (1.0, ABOVE),
            log=True,
            source="paper",
            arms=NORMS,
        ),
        Claim(
            "the LN-LSTM's final val loss is lower than the plain LSTM's",
            PAPER["lower"],
            "the plain LSTM's final val loss minus the LN-LSTM's (same seed), nats",
            list(final["none"] - final["layernorm"]),
            (0.0, ABOVE),
            source="paper",
            arms=NORMS,
            final=True,
        ),
    ]


def render(data: pd.DataFrame) -> Result:
    """Val loss against steps, each seed thin and the mean thick, per arm."""
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for i, (a, label) in enumerate(NORMS.items()):
        seed_curves(ax, data, a, "-", f"C{i}", f"{label} ({{n}} seeds)")
    ax.set(xlabel="training step", ylabel="val loss (nats per character)",
           title="char-level LSTM on tiny Shakespeare: with and without LayerNorm")  # fmt: skip
    ax.title.set_fontsize(9)
    if ax.lines:
        ax.legend(fontsize=8)
        low = min(line.get_ydata().min() for line in ax.lines)
        ax.set_ylim(low - 0.05, low + 1.5)  # the first evaluations (~4 nats) would flatten the rest
    fig.tight_layout()
    notes = [
        "Paired by seed: a seed sets the init of the weights both arms share (identical in both:"
        " the norms draw no random numbers) and the training windows; the LN-LSTM adds three "
        "LayerNorms per layer (the gates' input term, their recurrent term, the "
        "cell state before the output tanh, as in the LN paper's LN-LSTM).",
        "The LN paper's RNNs (attentive reader, skip-thoughts, DRAW, order embeddings) trained "
        "for days on GPUs; here a 2-layer LSTM of 256 units, 1,200 steps on one CPU thread.",
    ]
    return Result(fig, _claims(data), notes)
