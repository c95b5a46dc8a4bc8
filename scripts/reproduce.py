"""Reproduce the papers' comparison plots from run logs.

    python scripts/reproduce.py NAME [--seeds N] [--quick] [--jobs N] [--root DIR]
    python scripts/reproduce.py NAME --redraw      # from the committed runs.csv, no training
    python scripts/reproduce.py all [--quick] [--jobs N]
    python scripts/reproduce.py --list
    python scripts/reproduce.py --readme           # README's Results table from the claims files

Runs NAME's sweeps (`python train.py -m experiment=... seed=0,1,2`) into fixed sweep dirs under
<root>/outputs/reproduce/NAME[-quick]/ (a finished job is reused only if its resolved config and
training code are unchanged), reads every job's logs, and writes under
<root>/outputs/figures[/quick]/: NAME/runs.csv (every number used), NAME/jobs.csv, and, drawn
from those two alone, NAME.{png,svg,md} and NAME.claims.csv.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from normlab.analysis import report, sweep
from normlab.analysis.readme import update_readme
from normlab.analysis.reproductions import REPRODUCTIONS
from normlab.analysis.sweep import Reproduction

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SEEDS = 3  # --seeds when not given
QUICK_SEEDS = 2  # --quick: the least that gives an interval


def default_seeds(quick: bool) -> int:
    return QUICK_SEEDS if quick else DEFAULT_SEEDS


def list_names() -> str:
    """One block per NAME: its title and both budgets."""
    lines = []
    for r in REPRODUCTIONS.values():
        lines += [
            f"{r.name}: {r.title}",
            f"    full:  {r.full.text}",
            f"    quick: {r.quick.text}",
        ]
    return "\n".join(lines)


def command_text(name: str, quick: bool, seeds: int | None) -> str:
    """The command a figure's md shows."""
    cmd = f"python scripts/reproduce.py {name}"
    if seeds is not None and seeds != default_seeds(quick):
        cmd += f" --seeds {seeds}"
    return cmd + (" --quick" if quick else "")


def seeds_given(repro: Reproduction, jobs: pd.DataFrame, quick: bool) -> int:
    """The --seeds behind a jobs.csv: the most seeds an arm ran, arms of a grid that keeps its own
    count aside (unless every arm ran that many)."""
    counts = jobs.groupby("arm")["seed"].nunique()
    own = [] if quick else [g.seeds for g in repro.grids if g.seeds is not None]
    free = counts[~counts.isin(own)]
    return int((free if len(free) else counts).max())


def redraw(name: str, quick: bool, root: Path) -> dict[str, Path]:
    """Draw NAME's figure, md and claims from its runs.csv and jobs.csv alone."""
    repro = REPRODUCTIONS[name]
    out = sweep.figures_dir(root, quick)
    paths = report.evidence_paths(out, name)
    if not paths["runs"].is_file():
        raise SystemExit(f"{name}: no {paths['runs']} to redraw from (run it first)")
    data = pd.read_csv(paths["runs"])
    jobs = pd.read_csv(paths["jobs"], keep_default_na=False, na_values={"wall_time_s": [""]})
    seeds = seeds_given(repro, jobs, quick)
    return report.write_evidence(
        repro.render(data), out, name, repro.title, command_text(name, quick, seeds),
        repro.budget(quick).text, jobs,
    )  # fmt: skip


def reproduce(name: str, quick: bool, jobs: int, root: Path, seeds: int | None) -> Path:
    """Run one NAME's sweeps (reusing finished jobs) and write its figure, data and md."""
    repro = REPRODUCTIONS[name]
    if seeds is None:
        seeds = default_seeds(quick)
    seconds = sweep.run(repro, quick, root, jobs, seeds)
    runs = sweep.runs(repro, quick, root, seeds)
    if not runs:
        raise SystemExit(f"{name}: no jobs in {sweep.sweep_dir(root, name, quick)}")
    if repro.finish is not None:
        repro.finish(runs, max(1, min(jobs, repro.max_jobs or jobs)), sweep.REPO)
    not_ok = [r for r in runs if r.status != "ok"]
    if not_ok:
        print(f"{name}: {len(not_ok)} of {len(runs)} jobs not ok (see the md's jobs table)")
    paths = report.evidence_paths(sweep.figures_dir(root, quick), name)
    paths["runs"].parent.mkdir(parents=True, exist_ok=True)
    data = repro.extract(runs)[report.RUNS_COLUMNS]
    data.to_csv(paths["runs"], index=False, float_format=report.FLOAT)
    job_rows = sweep.jobs_frame(runs, repro.arm)
    job_rows.to_csv(paths["jobs"], index=False, float_format=report.FLOAT)
    paths = redraw(name, quick, root)  # the md comes from the files, as --redraw makes it
    print(f"{name}: {seconds:.0f} s, wrote {paths['md']} (+ figure, data)", flush=True)
    return paths["md"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help=f"one of {list(REPRODUCTIONS)} or 'all'")
    parser.add_argument("--quick", action="store_true", help="tiny budget (about a minute each)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel jobs (joblib launcher)")
    parser.add_argument("--root", type=Path, default=REPO, help="where outputs/ goes")
    parser.add_argument("--list", action="store_true", help="print names and budgets")
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        help=f"seeds per arm (default {DEFAULT_SEEDS}; {QUICK_SEEDS} quick)",
    )
    parser.add_argument(
        "--redraw", action="store_true", help="redraw from the committed runs.csv, no training"
    )
    parser.add_argument(
        "--readme", action="store_true", help="rewrite README's Results table from claims files"
    )
    args = parser.parse_args(argv)
    if args.list:
        print(list_names())
        return
    if args.readme:
        print(f"wrote {update_readme(args.root.resolve())}")
        return
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.name not in (*REPRODUCTIONS, "all"):
        parser.error(f"NAME must be one of {list(REPRODUCTIONS)} or 'all', got {args.name!r}")
    names = list(REPRODUCTIONS) if args.name == "all" else [args.name]
    start, failed = time.time(), []
    for name in names:
        try:
            if args.redraw:
                paths = redraw(name, args.quick, args.root.resolve())
                print(f"{name}: redrew {paths['md']} from {paths['runs']}")
            else:
                reproduce(name, args.quick, args.jobs, args.root.resolve(), args.seeds)
        except (SystemExit, RuntimeError) as err:
            if args.name != "all":
                raise
            print(f"{name}: FAILED: {err}", file=sys.stderr, flush=True)
            failed.append(name)
    if len(names) > 1:
        print(f"all: {time.time() - start:.0f} s; failed: {failed or 'none'}")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
