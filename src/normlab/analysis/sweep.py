"""Running a reproduction's sweep through `python train.py -m` and finding its jobs again.

Each NAME and budget has one fixed sweep dir (<root>/outputs/reproduce/NAME, NAME-quick): a
second invocation reuses it, and normlab.run.main skips every job whose overrides already have
a status=ok row in its summary.csv, so only missing or failed jobs run again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from normlab.analysis.logs import Run, load_sweep, parse_overrides, same_value
from normlab.analysis.report import Result

REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Budget:
    """Overrides added to the experiment's own settings, and what they amount to in words."""

    overrides: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Reproduction:
    """A paper figure: the experiment config that sweeps it, two budgets, and its analysis."""

    name: str
    title: str
    experiment: str  # conf/experiment/<experiment>.yaml, with hydra.sweeper.params
    full: Budget
    quick: Budget
    analyze: Callable[[list[Run]], Result]
    requires: tuple[str, ...] = ()  # conf/ files the sweep needs (models other engineers add)
    max_jobs: int | None = None  # cap on parallel jobs (timing sweeps run one job at a time)
    prepare: Callable[[Path], None] | None = None  # makes files the jobs read (run from REPO)

    def budget(self, quick: bool) -> Budget:
        return self.quick if quick else self.full

    def missing(self, repo: Path = REPO) -> list[str]:
        """conf/ files this reproduction needs that are not there yet."""
        return [
            p
            for p in (f"experiment/{self.experiment}.yaml", *self.requires)
            if not (repo / "conf" / p).is_file()
        ]


def sweep_dir(root: Path, name: str, quick: bool) -> Path:
    """The fixed sweep dir of a NAME and budget under root."""
    return root / "outputs" / "reproduce" / (f"{name}-quick" if quick else name)


def figures_dir(root: Path, quick: bool) -> Path:
    """Where figures go: outputs/figures (full budget), outputs/figures/quick (--quick)."""
    base = root / "outputs" / "figures"
    return base / "quick" if quick else base


def job_threads(jobs: int) -> int:
    """Torch threads per job: the cores shared out between the parallel jobs."""
    return max(1, (os.cpu_count() or 1) // jobs)


def command(repro: Reproduction, quick: bool, sweep: Path, jobs: int) -> list[str]:
    """The `python train.py -m ...` command of a sweep (joblib launcher when jobs > 1)."""
    cmd = [sys.executable, "train.py", "-m", f"experiment={repro.experiment}"]
    cmd += list(repro.budget(quick).overrides)
    cmd.append(f"hydra.sweep.dir={sweep}")
    if jobs > 1:
        cmd += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
    return cmd


def task_overrides(repro: Reproduction, quick: bool) -> dict[str, str]:
    """The overrides every job of this sweep carries (the key its summary rows are found by)."""
    items = [f"experiment={repro.experiment}", *repro.budget(quick).overrides]
    return {
        k: v
        for k, v in parse_overrides(" ".join(items)).items()
        if not k.startswith("hydra") and not _is_sweep(v)  # a sweep's values differ per job
    }


def _is_sweep(value: str) -> bool:
    """'32,2' is a sweep over two values; '[32,2]' and quoted strings are single values."""
    return "," in value and not value.startswith(("[", "{", "'", '"'))


def run(repro: Reproduction, quick: bool, root: Path, jobs: int, log=print) -> float:
    """Run (or complete) the sweep; return its wall time in seconds."""
    jobs = max(1, min(jobs, repro.max_jobs or jobs))
    sweep = sweep_dir(root, repro.name, quick).resolve()
    cmd = command(repro, quick, sweep, jobs)
    # Threads through the environment, not an override: a job's overrides are its identity in
    # summary.csv, and the same job run with another --jobs must still count as done.
    threads = str(job_threads(jobs))
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    if repro.prepare is not None:
        repro.prepare(REPO)
    log("+ " + " ".join(cmd))
    start = time.time()
    done = subprocess.run(cmd, cwd=REPO, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{repro.name}: sweep exited with code {done.returncode}")
    return time.time() - start


def grid(repro: Reproduction, quick: bool, repo: Path = REPO) -> dict[str, list[str]]:
    """The swept keys of this sweep and their values: the experiment's hydra.sweeper.params,
    where the budget's overrides of the same keys (or its own sweeps) replace them."""
    conf = OmegaConf.load(repo / "conf" / "experiment" / f"{repro.experiment}.yaml")
    params = OmegaConf.select(conf, "hydra.sweeper.params", default=None) or {}
    values = {str(k): _values(str(v)) for k, v in params.items()}
    for key, value in parse_overrides(" ".join(repro.budget(quick).overrides)).items():
        if key in values or _is_sweep(value):
            values[key] = _values(value)
    return values


def _values(text: str) -> list[str]:
    return text.split(",") if _is_sweep(text) else [text]


def in_grid(run: Run, values: dict[str, list[str]]) -> bool:
    """Whether a job belongs to the sweep as it is now: a value of the grid for every swept key
    (a row left in summary.csv by an earlier grid of the same sweep dir does not)."""
    return all(
        any(same_value(run.overrides.get(key), v) for v in allowed)
        for key, allowed in values.items()
    )


def runs(repro: Reproduction, quick: bool, root: Path) -> list[Run]:
    """The jobs of this NAME and budget, read back from the sweep's logs (only the current
    grid's: after a change of the experiment's grid, older rows stay in summary.csv)."""
    found = load_sweep(sweep_dir(root, repro.name, quick), task_overrides(repro, quick))
    values = grid(repro, quick)
    return [r for r in found if in_grid(r, values)]


def ensure_fid_lenet(repo: Path) -> None:
    """val/fid_lenet measures in a trained LeNet: train it once if outputs/fid_lenet lacks it."""
    if not (repo / "outputs" / "fid_lenet" / "lenet.pt").is_file():
        subprocess.run([sys.executable, "scripts/train_fid_lenet.py"], cwd=repo, check=True)
