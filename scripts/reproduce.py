"""Reproduce the papers' comparison plots from run logs.

    python scripts/reproduce.py NAME [--quick] [--jobs N] [--root DIR]
    python scripts/reproduce.py all [--quick] [--jobs N]
    python scripts/reproduce.py --list

Runs NAME's sweep (`python train.py -m experiment=NAME ...`) into the fixed sweep dir
<root>/outputs/reproduce/NAME[-quick] (finished jobs are skipped, not rerun), reads every
job's metrics.csv, and writes <root>/outputs/figures[/quick]/NAME.{png,svg,csv,md}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from normlab.analysis import report, sweep
from normlab.analysis.reproductions import REPRODUCTIONS

REPO = Path(__file__).resolve().parents[1]


def list_names() -> str:
    """One block per NAME: its title and both budgets."""
    lines = []
    for r in REPRODUCTIONS.values():
        missing = r.missing()
        state = f"  [not available: conf/{', conf/'.join(missing)} missing]" if missing else ""
        lines += [
            f"{r.name}: {r.title}{state}",
            f"    full:  {r.full.text}",
            f"    quick: {r.quick.text}",
        ]
    return "\n".join(lines)


def reproduce(name: str, quick: bool, jobs: int, root: Path) -> Path:
    """Run one NAME's sweep (skipping finished jobs) and write its figure, csv and md."""
    repro = REPRODUCTIONS[name]
    missing = repro.missing()
    if missing:
        raise SystemExit(f"{name}: needs conf/{', conf/'.join(missing)} (not there yet)")
    seconds = sweep.run(repro, quick, root, jobs)
    runs = sweep.runs(repro, quick, root)
    if not runs:
        raise SystemExit(f"{name}: no jobs in {sweep.sweep_dir(root, name, quick)}/summary.csv")
    not_ok = [r for r in runs if r.status != "ok"]
    if not_ok:
        print(f"{name}: {len(not_ok)} of {len(runs)} jobs not ok (see the md's Runs table)")
    budget = repro.budget(quick)
    cmd = f"python scripts/reproduce.py {name}" + (" --quick" if quick else "")
    paths = report.write(
        repro.analyze(runs),
        sweep.figures_dir(root, quick),
        name,
        repro.title,
        cmd,
        budget.text,
        runs,
        seconds,
    )
    print(f"{name}: {seconds:.0f} s, wrote {paths['png']} (+ .svg .csv .md)", flush=True)
    return paths["md"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help=f"one of {list(REPRODUCTIONS)} or 'all'")
    parser.add_argument("--quick", action="store_true", help="tiny budget (about a minute each)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel jobs (joblib launcher)")
    parser.add_argument("--root", type=Path, default=REPO, help="where outputs/ goes")
    parser.add_argument("--list", action="store_true", help="print names and budgets")
    args = parser.parse_args(argv)
    if args.list:
        print(list_names())
        return
    if args.name not in (*REPRODUCTIONS, "all"):
        parser.error(f"NAME must be one of {list(REPRODUCTIONS)} or 'all', got {args.name!r}")
    names = list(REPRODUCTIONS) if args.name == "all" else [args.name]
    start, failed = time.time(), []
    for name in names:
        try:
            reproduce(name, args.quick, args.jobs, args.root.resolve())
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
