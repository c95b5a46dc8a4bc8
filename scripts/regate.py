"""Re-collect the gate rows a committed runs.csv predates, with no training.

    python scripts/regate.py NAME [NAME ...]     # or: all

New jobs write these rows when their logs are read (normlab.analysis.gates.gate_rows); the
committed evidence of older jobs gets them here, from what runs.csv and the configs hold:
- gate/lr_end (the converged gate's schedule kind): each gate arm's grid is found by its arm
  pattern, its experiment composed with the grid's overrides (a swept key at its first value:
  no grid sweeps the schedule), and the lr at the seed's last logged step taken over its peak;
- gate/val_loss and gate/trivial_loss for an arm that logged its held-out curve (val/loss) but
  no gate rows (jobs older than the gates), the trivial loss from the data its grid reads.
Rows already present are kept; the file is rewritten only where rows are added.
"""

from __future__ import annotations

import math
import sys
from functools import cache
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import normlab.config  # noqa: F401  (registers the resolvers conf/ uses)
from normlab.analysis import gates
from normlab.analysis.report import FLOAT
from normlab.analysis.reproductions import REPRODUCTIONS

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from reproduce import arm_pattern  # noqa: E402  (scripts/ is not a package)


def _first(override: str) -> str:
    """A sweep override at its first value (`per_device=32,2` -> `per_device=32`)."""
    key, _, value = override.partition("=")
    return f"{key}={value.split(',')[0]}" if "," in value and "[" not in value else override


@cache
def _config(experiment: str, overrides: tuple[str, ...]) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", [f"experiment={experiment}", *overrides, "seed=0"])
    # the parts read here only: the rest interpolates the run dir Hydra sets at run time
    return {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("optim", "data")}


def _grid_of(repro, arm: str):
    """The grid whose jobs ran a gate arm: its arm pattern matches the gate arm, or the gate
    arm less its last segments (gn_batch_size's `batchnorm/b32`); the longest match wins."""
    found = []
    for g in repro.grids:
        pattern, parts = arm_pattern(g.arm), arm.split("/")
        for k in range(len(parts), 0, -1):
            if pattern.fullmatch("/".join(parts[:k])):
                found.append((k, len(g.arm), g))
                break
    return max(found, key=lambda f: f[:2])[2] if found else None


def regate(name: str) -> int:
    """Add the missing gate rows to outputs/figures/NAME/runs.csv; the rows added."""
    repro, path = REPRODUCTIONS[name], REPO / "outputs" / "figures" / name / "runs.csv"
    data = pd.read_csv(path)
    rows = []
    for arm, own in data.groupby("arm", sort=False):
        grid = _grid_of(repro, str(arm))
        if grid is None:
            continue
        overrides = tuple(_first(o) for o in grid.all_overrides(repro.full, False)
                          if not o.startswith("arm="))  # fmt: skip
        cfg = _config(grid.experiment, overrides)
        metrics = set(own["metric"])
        if "val/loss" in metrics and gates.VAL_LOSS not in metrics:
            val = own[own["metric"] == "val/loss"]
            rows += [(arm, s, x, gates.VAL_LOSS, v) for s, x, v in
                     zip(val["seed"], val["x"], val["value"], strict=True)]  # fmt: skip
            text = Path(cfg["data"]["root"]) / "tinyshakespeare" / "input.txt"
            trivial = gates.unigram_loss(str(text), float(cfg["data"].get("val_fraction", 0.1)))
            rows += [(arm, s, math.nan, "gate/trivial_loss", trivial)
                     for s in sorted(set(val["seed"]))]  # fmt: skip
            metrics |= {gates.VAL_LOSS}
        if gates.LR_END in metrics or not metrics & {gates.VAL_LOSS, gates.TRAIN_LOSS}:
            continue
        curves = pd.concat([own[own["metric"].isin([gates.TRAIN_LOSS, gates.VAL_LOSS])],
                            pd.DataFrame([r for r in rows if r[0] == arm and r[3] ==
                                          gates.VAL_LOSS], columns=own.columns)])  # fmt: skip
        for seed, last in curves.groupby("seed")["x"].max().items():
            rows += gates.schedule_rows(str(arm), int(seed), cfg["optim"], int(last) + 1)
    if rows:
        added = pd.DataFrame(rows, columns=data.columns)
        pd.concat([data, added], ignore_index=True).to_csv(path, index=False, float_format=FLOAT)
    return len(rows)


def main(argv: list[str]) -> None:
    names = list(REPRODUCTIONS) if argv == ["all"] else argv
    unknown = [n for n in names if n not in REPRODUCTIONS]
    if not names or unknown:
        raise SystemExit(f"usage: regate.py NAME [NAME ...] | all; NAME one of "
                         f"{list(REPRODUCTIONS)}")  # fmt: skip
    for name in names:
        print(f"{name}: {regate(name)} gate rows added", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
