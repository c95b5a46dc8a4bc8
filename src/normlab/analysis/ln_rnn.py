"""ln_rnn: Ba, Kiros & Hinton 2016, layer normalization speeds up the training of an RNN.

Two grids of experiment=ln_rnn, the character-level LSTM LM with norm=none and norm=layernorm:
- pilot (seed 0): each LSTM at three learning rates; each is compared at its own best;
- main: each LSTM at the lr the pilot found best for it (declared in conf/reproduce/ln_rnn.yaml),
  over seeds, paired by seed (same init of the shared weights, same training windows).
Two claims: the LN-LSTM reaches the plain LSTM's best val loss in fewer steps, and ends lower.
`extract` reads the run logs into runs.csv; `render` decides from runs.csv alone.
"""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import pandas as pd

from normlab.analysis import claims as declared
from normlab.analysis import gates
from normlab.analysis.curves import crossing, metric, seed_curves, val_loss_rows
from normlab.analysis.logs import Run
from normlab.analysis.report import Result, markdown_table

# the claims: conf/reproduce/ln_rnn.yaml's claims:, built by normlab.analysis.claims
NORMS = {"none": "plain LSTM", "layernorm": "LN-LSTM"}
VAL, FINAL, LR = "val/loss", "final/val_loss", "lr"
SPEEDUP = "speedup"  # per seed: plain's steps to its best val loss / the LN-LSTM's (`speedup`)
PILOT_ARM = re.compile(r"^pilot/(?P<norm>[a-z]+)/lr(?P<lr>[\d.e-]+)$")


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per finished (or diverged) job: its val loss after every val_check_interval steps and its
    last one, its lr, and the rows its gates read."""
    rows = []
    for run in runs:
        seed = int(run.get("seed"))
        rows += val_loss_rows(run, run.arm, seed)
        rows.append((run.arm, seed, math.nan, LR, float(run.setting("optim.optimizer.lr"))))
        rows += gates.gate_rows(run, run.arm, seed)
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


def pilot(data: pd.DataFrame) -> pd.DataFrame:
    """The pilot's table: norm, lr, final val loss (seed 0, one job each), sorted."""
    rows = []
    for a in sorted(data["arm"].unique()):
        m = PILOT_ARM.match(a)
        final = metric(data, a, FINAL)["value"]
        if m and len(final):
            rows.append((m["norm"], float(m["lr"]), float(final.iloc[0])))
    return pd.DataFrame(rows, columns=["norm", "lr", "val_loss"]).sort_values(
        ["norm", "lr"], ignore_index=True
    )


def arm_lr(data: pd.DataFrame, a: str) -> float:
    """The lr an arm of `main` ran at (NaN before runs.csv had it)."""
    rows = metric(data, a, LR)["value"]
    return float(rows.iloc[0]) if len(rows) else math.nan


def pilot_note(data: pd.DataFrame) -> str:
    """The pilot's table and whether each main arm runs at its LSTM's best lr."""
    table = pilot(data)
    if table.empty:
        return "Pilot (grid `pilot`): not in runs.csv."
    rows, checks = [], []
    for norm, g in table.groupby("norm", sort=False):
        best = g.loc[g["val_loss"].idxmin()]
        rows += [[NORMS.get(norm, norm), f"{r.lr:g}", f"{r.val_loss:.4f}",
                  "lowest" if r.lr == best.lr else ""] for r in g.itertuples()]  # fmt: skip
        lr, name = arm_lr(data, norm), NORMS.get(norm, norm)
        if lr == best.lr:
            edge = " (the grid's edge)" if best.lr in (g["lr"].min(), g["lr"].max()) else ""
            checks.append(f"{name} at lr {lr:g}, the pilot's lowest{edge}")
        else:
            checks.append(f"{name} at lr {lr:g}, NOT the pilot's lowest ({best.lr:g})")
    return (
        "Pilot (grid `pilot`, seed 0, one job each): each LSTM at "
        f"{', '.join(f'{lr:g}' for lr in sorted(table['lr'].unique()))}; final val loss:\n\n"
        + markdown_table(["LSTM", "lr", "final val loss", ""], rows)
        + "\n\nThe claims compare each LSTM at its own lowest (grid `main`): "
        + "; ".join(checks)
        + "."
    )


# ----- runs.csv -> claims and figure -------------------------------------------------------------


def curves(data: pd.DataFrame, a: str) -> dict[int, pd.Series]:
    """{seed: val loss by steps trained} of one arm."""
    rows = metric(data, a, VAL)
    return {int(s): g.set_index("x")["value"].sort_index() for s, g in rows.groupby("seed")}


def steps_to(curve: pd.Series, target: float) -> float:
    """The step at which the val loss first falls to target (interpolated); NaN if never."""
    return crossing(curve, target)


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


def quantities(data: pd.DataFrame) -> pd.DataFrame:
    """runs.csv's rows and, per seed both LSTMs ran, the LN-LSTM's speedup (under its arm):
    the quantities conf/reproduce/ln_rnn.yaml's claims read."""
    plain, ln = curves(data, "none"), curves(data, "layernorm")
    n = every(data)
    rows = [("layernorm", s, math.nan, SPEEDUP, speedup(plain[s], ln[s], n))
            for s in sorted(set(plain) & set(ln))]  # fmt: skip
    if not rows:
        return data
    return pd.concat([data, pd.DataFrame(rows, columns=data.columns)], ignore_index=True)


def _loss_panel(ax: plt.Axes, data: pd.DataFrame, name: str, what: str) -> None:
    for i, (a, label) in enumerate(NORMS.items()):
        lr = arm_lr(data, a)
        seed_curves(ax, data, a, "-", f"C{i}", f"{label}, lr {lr:g} ({{n}} seeds)", name)
    ax.set(xlabel="training step", ylabel=f"{what} loss (nats per character)",
           title=f"{what} loss, each LSTM at its pilot's best lr")  # fmt: skip
    ax.title.set_fontsize(9)
    if ax.lines:
        ax.legend(fontsize=8)
        low = min(line.get_ydata().min() for line in ax.lines)
        ax.set_ylim(low - 0.05, low + 1.5)  # the first evaluations (~4 nats) would flatten the rest


def _pilot_panel(ax: plt.Axes, data: pd.DataFrame) -> None:
    for i, (norm, g) in enumerate(pilot(data).groupby("norm", sort=False)):
        color = f"C{list(NORMS).index(norm)}" if norm in NORMS else f"C{i + 2}"
        ax.plot(g["lr"], g["val_loss"], "o-", color=color, label=NORMS.get(norm, norm))
    ax.set_xscale("log")
    ax.set(xlabel="AdamW lr", ylabel="final val loss (seed 0)", title="pilot: final val loss by lr")
    ax.title.set_fontsize(9)
    if ax.lines:
        ax.legend(fontsize=8)


def render(data: pd.DataFrame) -> Result:
    """Val and train loss against steps (each seed thin, the mean thick, per arm), and the lr
    pilot."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    _loss_panel(axes[0], data, VAL, "val")
    _loss_panel(axes[1], data, gates.TRAIN_LOSS, "train")
    _pilot_panel(axes[2], data)
    fig.suptitle("char-level LSTM on tiny Shakespeare: with and without LayerNorm", fontsize=10)
    fig.tight_layout()
    notes = [
        "Paired by seed: a seed sets the init of the weights both arms share (identical in both:"
        " the norms draw no random numbers) and the training windows; the LN-LSTM adds three "
        "LayerNorms per layer (the gates' input term, their recurrent term, the "
        "cell state before the output tanh, as in the LN paper's LN-LSTM).",
        "The LN paper's RNNs (attentive reader, skip-thoughts, DRAW, order embeddings) trained "
        "for days on GPUs; here a 2-layer LSTM of 256 units, 1,200 steps on one CPU thread.",
        pilot_note(data),
    ]
    arms = [*NORMS, *(a for a in sorted(data["arm"].unique()) if a not in NORMS)]
    claims = declared.build("ln_rnn", quantities(data), {"every": every(data)})
    return Result(fig, claims, notes, gates.gates(data, arms))
