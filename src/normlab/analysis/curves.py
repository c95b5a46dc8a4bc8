"""Small helpers the Transformer and DiT analyses share: final values that know about divergence."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from normlab.analysis.logs import Run

VOCAB = 65  # tiny Shakespeare's characters (data.vocab_size, checked against the text)
DIVERGED_LOSS = math.log(VOCAB)  # a diverged language model's val loss: a uniform prediction's


def final(run: Run | None, key: str) -> float:
    """The last logged value of key for a finished run; inf for a diverged one; NaN if missing."""
    if run is None or run.status not in ("ok", "diverged"):
        return math.nan
    if run.status == "diverged":
        return math.inf
    return run.last(key)


def show(value: float, digits: int = 3) -> str:
    """A final value for a table: 'diverged' for inf, 'n/a' for a missing run."""
    if math.isnan(value):
        return "n/a"
    return "diverged" if math.isinf(value) else f"{value:.{digits}f}"


def decided(*values: float) -> bool:
    """True when no value is missing (NaN); inf (diverged) counts as a result."""
    return not any(math.isnan(v) for v in values)


# ----- language-model jobs in runs.csv (long: arm, seed, x, metric, value) ---------------------


def val_loss_rows(run: Run, arm: str, seed: int) -> list[tuple]:
    """A finished or diverged job's rows: its val loss curve (x = steps trained), its last val
    loss (`final/val_loss`) and whether it diverged (`diverged`, 1 or 0); none for a failed job."""
    if run.status not in ("ok", "diverged"):
        return []
    loss = run.series("val/loss").drop_duplicates("step", keep="last")  # a resumed job
    rows = [
        (arm, seed, float(s + 1), "val/loss", float(v))
        for s, v in zip(loss["step"], loss["val/loss"], strict=True)
    ]
    rows.append((arm, seed, math.nan, "final/val_loss", run.last("val/loss")))
    rows.append((arm, seed, math.nan, "diverged", float(run.status == "diverged")))
    return rows


def metric(data: pd.DataFrame, arm: str, name: str) -> pd.DataFrame:
    """The rows of one arm and metric."""
    return data[(data["arm"] == arm) & (data["metric"] == name)]


def final_loss(data: pd.DataFrame, arm: str) -> pd.Series:
    """{seed: final val loss}, a diverged job (or one without a finite val loss) at
    DIVERGED_LOSS, so a difference it makes stays finite."""
    final_ = metric(data, arm, "final/val_loss").set_index("seed")["value"]
    diverged = metric(data, arm, "diverged").set_index("seed")["value"]
    bad = (diverged.reindex(final_.index) == 1) | ~np.isfinite(final_)
    return final_.where(~bad, DIVERGED_LOSS).sort_index()


def paired(a: pd.Series, b: pd.Series) -> list[float]:
    """a - b over the seeds both have (Series indexed by seed)."""
    both = pd.concat([a, b], axis=1, keys=["a", "b"]).dropna()
    return list(both["a"] - both["b"])


def diverged_seeds(data: pd.DataFrame) -> str:
    """'arm seeds [..]; ...' of the diverged jobs, or 'none'."""
    rows = data[(data["metric"] == "diverged") & (data["value"] == 1)]
    counts = rows.groupby("arm")["seed"].apply(list)
    return "; ".join(f"{a} seeds {s}" for a, s in counts.items()) or "none"


def seed_curves(ax: plt.Axes, data: pd.DataFrame, arm: str, style: str, color: str, label: str,
                name: str = "val/loss"):  # fmt: skip
    """An arm's curve of metric `name` (the val loss; gate/train_loss, the train loss the gates
    read) against steps: each seed thin, the mean over seeds thick, labelled `label` with {n}
    replaced by the number of seeds (nothing drawn without runs)."""
    curves = metric(data, arm, name).pivot(index="x", columns="seed", values="value")
    for seed in curves.columns:
        ax.plot(curves.index, curves[seed], style, color=color, alpha=0.25, lw=0.8)
    if len(curves.columns):
        mean = curves.dropna().mean(axis=1)
        ax.plot(mean.index, mean.values, style, color=color, lw=2,
                label=label.format(n=len(curves.columns)))  # fmt: skip


def crossing(curve: pd.Series, target: float, rising: bool = False) -> float:
    """The step (the curve's index) at which a curve first reaches `target` (falls to it, or with
    `rising` rises to it), interpolated linearly between the evaluation before and the first at
    or past it: evaluations every few steps would otherwise make every seed's crossing the same
    multiple of the interval. NaN if never."""
    steps, values = curve.index.to_numpy(dtype=float), curve.to_numpy(dtype=float)
    sign = -1.0 if rising else 1.0
    hit = np.flatnonzero(sign * values <= sign * target + 1e-12)
    if not len(hit):
        return math.nan
    i = int(hit[0])
    if i == 0 or values[i - 1] == values[i]:
        return float(steps[i])
    share = (values[i - 1] - target) / (values[i - 1] - values[i])
    return float(steps[i - 1] + share * (steps[i] - steps[i - 1]))
