"""dyt_vs_ln: Zhu, Chen, He, LeCun & Liu 2025, "Transformers without Normalization".

Three grids, every arm over seeds and paired by seed (a seed sets the init of the weights the arms
share and the data order):
- gpt: the Pre-LN char-level GPT (experiment=dyt_vs_ln_gpt) with LayerNorm, DyT and RMSNorm;
- alpha: DyT in the same GPT at other alpha0 (the paper's Sec. 7 sensitivity);
- dit: the tiny adaLN-Zero DiT (experiment=dyt_vs_ln_dit) with the same three norms.
`extract` reads the run logs into runs.csv; `render` decides from runs.csv alone.
"""

from __future__ import annotations

from normlab.analysis.logs import Run

GPT, ALPHA, DIT = "gpt", "alpha", "dit"


def grid_of(run: Run) -> str:
    """Which grid a job belongs to, from its overrides."""
    if run.get("experiment") == "dyt_vs_ln_dit":
        return DIT
    return ALPHA if run.get("norm.alpha0") else GPT


def arm(run: Run) -> str:
    """gpt/<norm>, alpha/<alpha0> or dit/<norm>."""
    grid = grid_of(run)
    if grid == ALPHA:
        return f"{ALPHA}/{float(run.get('norm.alpha0')):g}"
    return f"{grid}/{run.get('norm')}"


def extract(runs):  # written while the sweeps run
    raise NotImplementedError


def render(data):
    raise NotImplementedError


def measure_ln_maps(runs, jobs, repo):
    raise NotImplementedError
