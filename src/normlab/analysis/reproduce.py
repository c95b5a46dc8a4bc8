# Over 400 lines: the reproduce CLI: its options, their checks and each mode they select
"""Reproduce the papers' comparison plots from run logs.

    python scripts/reproduce.py NAME [--seeds N] [--quick] [--jobs N] [--threads N] [--root DIR]
    python scripts/reproduce.py NAME --decide      # declared initial seeds, then those the
                                                   # undecided claims plan for (up to the cap)
    python scripts/reproduce.py NAME --redraw      # from the committed runs.csv, no training
    python scripts/reproduce.py NAME --collect     # the jobs already in its sweep dirs, no
                                                   # training (each keeps its code version)
    python scripts/reproduce.py NAME --launcher slurm [--launcher-arg partition=gpu ...]
                                                   # each arm's jobs as a SLURM job array
                                                   # (conf/hydra/launcher/slurm.yaml), from a
                                                   # login node; --collect reads them back
    python scripts/reproduce.py NAME --launcher local   # the same through submitit's local
                                                   # executor on this machine (all of an arm's
                                                   # jobs at once, a share of the cores each)
    python scripts/reproduce.py NAME --grids G,..  # run only these grids; their arms' rows
                                                   # replace those in the committed runs.csv
    python scripts/reproduce.py NAME --grids G --subset KEY=V,..   # only the jobs at these
                                                   # values of a swept key; only their rows
                                                   # are replaced (a long grid over sessions)
    python scripts/reproduce.py NAME --norm X [--plugin MODULE]   # your norm as one more arm
    python scripts/reproduce.py card --norm X [--plugin MODULE] [--budget quick|card]
                                                   # X's report card (analysis/report_card.py)
    python scripts/reproduce.py all [--quick] [--jobs N]
    python scripts/reproduce.py --list
    python scripts/reproduce.py --readme           # README's Results table from the claims files

Runs NAME's sweeps (`python train.py -m experiment=... seed=0,1,2`) into fixed sweep dirs under
<root>/outputs/reproduce/NAME[-quick]/ (a finished job is reused only if its resolved config and
training code are unchanged), reads every job's logs, and writes under
<root>/outputs/figures[/quick]/: NAME/runs.csv (every number used), NAME/jobs.csv, and, drawn
from those two alone, NAME.{png,svg,md} and NAME.claims.csv. With --norm X (a registered norm,
e.g. a user's from --plugin MODULE) the reproductions that compare norms run X as one more arm of
those grids, and the evidence goes to NAME+X.* beside NAME's, the built-in arms' jobs reused.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import pandas as pd

from normlab import identity, layout
from normlab.analysis import gates, pending, report, sequential, sweep
from normlab.analysis.logs import parse_overrides, same_value
from normlab.analysis.readme import update_readme
from normlab.analysis.reproductions import REPRODUCTIONS
from normlab.analysis.sweep import Grid, Reproduction
from normlab.files import atomic_write
from normlab.sweep.summary import FINISHED, file_lock

REPO = layout.root()  # --root's default: the checkout (or the cwd of an installed normlab)
QUICK_SEEDS = 2  # --quick: the least that gives an interval
EVIDENCE_LOCK = ".evidence.lock"  # in NAME's sweep dir: held while its evidence is merged


def default_seeds(quick: bool, name: str) -> int:
    """--seeds when not given: the reproduction's declared initial seeds (2 under --quick)."""
    return QUICK_SEEDS if quick else REPRODUCTIONS[name].initial_seeds


def seed_cap(quick: bool, name: str) -> int:
    """The most seeds --decide runs for a claim: the reproduction's declared cap (QUICK_CAP
    under --quick)."""
    return QUICK_CAP if quick else REPRODUCTIONS[name].seed_cap


def seed_caps(quick: bool, name: str) -> sequential.Caps:
    """seed_cap, with the grids whose `cap:` raises it for the claims on their arms (none
    under --quick)."""
    return sequential.Caps(QUICK_CAP) if quick else REPRODUCTIONS[name].caps()


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def estimate(name: str, jobs: int = 1) -> str | None:
    """The full budget's time from the committed run (outputs/figures/NAME/jobs.csv): its jobs'
    wall times summed, divided by the jobs run at once (--jobs, capped as the sweep caps it);
    None without that file. Jobs already done in the sweep dirs take no time."""
    path = REPO / "outputs" / "figures" / name / "jobs.csv"
    if not path.is_file():
        return None
    walls = pd.read_csv(path)["wall_time_s"].dropna()
    cap = REPRODUCTIONS[name].max_jobs
    parallel = max(1, min(jobs, cap or jobs))
    total = float(walls.sum())
    source = f"{len(walls)} jobs, from the committed run's wall times"
    if parallel == 1:
        return f"about {_hours(total)} ({source})"
    return f"about {_hours(total / parallel)} at --jobs {parallel} ({_hours(total)} of {source})"


# normlab.run.task.OUTER_ENV (not imported: that module loads torch): set while the sweeps run,
# so that an interrupted job leaves the continue line to this command
OUTER_ENV = "NORMLAB_OUTER_COMMAND"
# this command as it was started (python scripts/reproduce.py, or normlab-reproduce outside a
# checkout), for its continue lines
PROGRAM = partial(layout.program, "scripts/reproduce.py", "normlab-reproduce",
                  "normlab.analysis.reproduce")  # fmt: skip
QUICK_JOB_S = 60.0  # a --quick job: about a minute (--help says so)


def job_total(repro: Reproduction, quick: bool, seeds: int | None) -> int:
    """How many jobs the grids of repro make: the product of each grid's swept values."""
    return sum(sweep.grid_size(g, repro.budget(quick), quick, seeds) for g in repro.grids)


def finished_jobs(repro: Reproduction, quick: bool, root: Path | None, seeds: int | None,
                  subset: Subset | None = None) -> int:  # fmt: skip
    """How many of repro's jobs (with `subset`, those at its values alone) already have a result
    in the sweep dirs under root, run by today's training code (reused; one of another version
    runs again, normlab.sweep.jobs)."""
    if root is None:
        return 0
    try:
        today = identity.code_version()
        return sum(r.status in FINISHED and r.code_version == today
                   for r in _runs(repro, quick, root, seeds, subset))  # fmt: skip
    except Exception:  # an unreadable log: the estimate counts that job as still to run
        return 0


def _runs(repro: Reproduction, quick: bool, root: Path, seeds: int | None,
          subset: Subset | None) -> list:  # fmt: skip
    """The jobs in repro's sweep dirs (sweep.runs), those at `subset`'s values alone where given:
    a --subset run's are its own, not the other seeds' of the same sweep dir."""
    found = sweep.runs(repro, quick, root, seeds)
    return [r for r in found if _at(r.overrides, subset)] if subset else found


def estimate_before(
    repro: Reproduction, quick: bool, jobs: int, seeds: int | None, partial_run: bool,
    root: Path | None = None, subset: Subset | None = None,
) -> str | None:  # fmt: skip
    """What a run will take, said before it starts: the full run of NAME from its committed
    wall times (estimate); --quick as about a minute a job; a --norm or --grids run as its jobs
    at the committed median wall time of its grids' arms, over the jobs run at once; with
    `root`, the jobs already finished there (of `subset`'s values, where given) are left out
    (reused, not run)."""
    total = job_total(repro, quick, seeds)
    done = min(finished_jobs(repro, quick, root, seeds, subset), total)
    if not quick and not partial_run and not done:
        return estimate(repro.name, jobs)
    count = total - done
    reused = f", {done} of {total} finished before" if done else ""
    parallel = max(1, min(jobs, repro.max_jobs or jobs))
    if quick:
        took = _hours(count * QUICK_JOB_S / parallel)
        return (f"about {took} ({count} quick jobs, about a minute each, {parallel} at "
                f"once{reused})")  # fmt: skip
    path = REPO / "outputs" / "figures" / repro.name / "jobs.csv"
    if not path.is_file():
        return None
    committed = pd.read_csv(path)
    names = tuple(f"{g.name}/" for g in repro.grids)
    mine = committed[committed["arm"].astype(str).str.startswith(names)]["wall_time_s"].dropna()
    walls = mine if len(mine) else committed["wall_time_s"].dropna()
    per_job = float(walls.median())
    return (
        f"about {_hours(count * per_job / parallel)} ({count} jobs at the committed median "
        f"{per_job:.0f} s a job of these grids' arms, {parallel} at once{reused})"
    )


def progress_line(name: str, done: int, total: int, fresh: int, elapsed: float) -> str:
    """`NAME: jobs k/N done, ETA T`: T is what is left at the pace of the jobs finished in this
    run (elapsed over fresh); `ETA unknown` before the first of them."""
    line = f"{name}: jobs {done}/{total} done"
    if fresh <= 0:
        return f"{line}, ETA unknown"
    return f"{line}, ETA {_hours(max(total - done, 0) * elapsed / fresh)}"


def run_showing_progress(
    repro: Reproduction, quick: bool, root: Path, jobs: int, seeds: int | None,
    threads: int | None, every: float = 15.0, launcher: str | None = None,
    launcher_args: tuple[str, ...] = (), subset: Subset | None = None,
    on_cut: Callable[[], None] | None = None,
) -> float:  # fmt: skip
    """sweep.run, printing progress_line every `every` s when more of its jobs (`subset`'s,
    where given) have finished (read back from the grids' summaries, as the analysis reads
    them); `on_cut` is called where it stops short (an interrupt, a failed sweep)."""
    total = job_total(repro, quick, seeds)
    start, stop = time.monotonic(), threading.Event()

    def finished() -> int:
        try:
            # a job's summary row is written at its start ('running'): done once it ended
            return sum(r.status != "running" for r in _runs(repro, quick, root, seeds, subset))
        except Exception:  # a log mid-write: read it next time (a progress line stops no run)
            return -1

    def watch() -> None:
        before = shown = max(finished(), 0)
        while not stop.wait(every):
            now = finished()
            if now > shown:
                shown = now
                elapsed = time.monotonic() - start
                print(progress_line(repro.name, now, total, now - before, elapsed), flush=True)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    outer = os.environ.get(OUTER_ENV)
    os.environ[OUTER_ENV] = "1"  # the jobs leave the continue line to this command (or a card)
    try:
        return sweep.run(repro, quick, root, jobs, seeds, threads=threads, launcher=launcher,
                         launcher_args=launcher_args)  # fmt: skip
    except BaseException:
        if on_cut is not None:
            on_cut()
        raise
    finally:
        stop.set()
        watcher.join(timeout=5)
        if outer is None:
            os.environ.pop(OUTER_ENV, None)


def list_names() -> str:
    """One block per NAME: its title, both budgets and the full one's estimated time."""
    lines = []
    for r in REPRODUCTIONS.values():
        lines += [
            f"{r.name}: {r.title}",
            f"    full:  {r.full.text}",
            f"    quick: {r.quick.text}",
        ]
        took = estimate(r.name)
        if took:
            lines.append(f"    time (full): {took}")
    return "\n".join(lines)


class Interrupt:
    """Ctrl+C while a sweep runs: its train.py (in the same process group) gets the signal too,
    saves its state and stops; this waits for it instead of killing it, then stops with a
    message (a second Ctrl+C, or one while no sweep runs, stops at once)."""

    def __init__(self) -> None:
        self.requested = False

    @staticmethod
    def _children() -> bool:
        try:
            tasks = Path("/proc/self/task").glob("*/children")  # Linux: each thread's children
            return any(path.read_text().split() for path in tasks)
        except OSError:
            return False

    def __call__(self, signum: int, frame: object) -> None:
        if self.requested or not self._children():
            raise KeyboardInterrupt
        self.requested = True
        print("interrupt: waiting for the running job to save its state (Ctrl+C again to stop "
              "at once)", file=sys.stderr, flush=True)  # fmt: skip

    def stop(self, argv: list[str], root: Path) -> SystemExit:
        """Say where things are and how to continue; the exit (130) to raise."""
        command = shlex.join([*PROGRAM(), *argv])
        kept = root / "outputs" / "reproduce"
        print(f"interrupted: the finished jobs in {kept} are reused, a stopped one resumes "
              f"from its last.ckpt if it has one\n"
              f"continue with: {command}", file=sys.stderr, flush=True)  # fmt: skip
        return SystemExit(128 + signal.SIGINT)


def command_text(
    name: str,
    quick: bool,
    seeds: int | None,
    norm: str | None = None,
    plugin: str | None = None,
    decided: bool = False,
) -> str:
    """The command a figure's md shows: with `decided` (its arms ran unequal seed counts), the
    seeds to a decision that gave them, not a --seeds that would run every arm to the most."""
    cmd = f"python scripts/reproduce.py {name}"
    if decided:
        cmd += " --decide"
    elif seeds is not None and seeds != default_seeds(quick, name):
        cmd += f" --seeds {seeds}"
    if norm:
        cmd += f" --norm {norm}" + (f" --plugin {plugin}" if plugin else "")
    return cmd + (" --quick" if quick else "")


def quick_note(repro: Reproduction) -> str:
    """The first note of a --quick md: the notes below it describe the full budget."""
    return (
        f"This is a --quick run ({repro.quick.text}). The notes below are written for the full "
        f"budget ({repro.full.text}): where they quote its steps, seeds or sizes, they describe "
        "that run, not this one."
    )


def evidence_name(name: str, norm: str | None) -> str:
    """NAME, or NAME+X for a run with the norm X added."""
    return f"{name}+{norm}" if norm else name


def _plugin(jobs: pd.DataFrame) -> str | None:
    """The plugin module the jobs imported (their plugins=[...] override), if any."""
    for overrides in jobs.get("overrides", []):
        found = re.search(r"plugins=\[([^\]]+)\]", str(overrides))
        if found:
            return found.group(1)
    return None


def _free_counts(repro: Reproduction, jobs: pd.DataFrame) -> pd.Series:
    """Seeds per arm, arms of a grid that keeps its own count aside (unless every arm ran that
    many)."""
    counts = jobs.groupby("arm")["seed"].nunique()
    own = [g.seeds for g in repro.grids if g.seeds is not None]
    free = counts[~counts.isin(own)]
    return free if len(free) else counts


def seeds_given(repro: Reproduction, jobs: pd.DataFrame) -> int:
    """The --seeds behind a jobs.csv: the most seeds an arm ran (pilots' own counts aside)."""
    return int(_free_counts(repro, jobs).max())


def seeds_decided(repro: Reproduction, jobs: pd.DataFrame) -> bool:
    """Whether a jobs.csv's arms ran unequal seed counts (pilots' own counts aside): seeds to a
    decision (--decide) ran more where a claim planned more."""
    return _free_counts(repro, jobs).nunique() > 1


def redraw(name: str, quick: bool, root: Path, norm: str | None = None) -> dict[str, Path]:
    """Draw NAME's (or NAME+norm's) figure, md and claims from its runs.csv and jobs.csv alone."""
    repro = REPRODUCTIONS[name]
    out = sweep.figures_dir(root, quick)
    evidence = evidence_name(name, norm)
    paths = report.evidence_paths(out, evidence)
    if not paths["runs"].is_file():
        raise SystemExit(f"{evidence}: no {paths['runs']} to redraw from (run it first)")
    data = pd.read_csv(paths["runs"])
    jobs = pd.read_csv(paths["jobs"], keep_default_na=False, na_values={"wall_time_s": [""]})
    seeds = seeds_given(repro, jobs)
    title = repro.title + (f"; with the norm {norm}" if norm else "")
    result = repro.render(data)
    if norm:
        result = within(result, data, name)
    if quick and result.notes:  # the analysis writes its notes for the full budget
        result.notes.insert(0, quick_note(repro))
    plugin = _plugin(jobs) if norm else None
    return report.write_evidence(
        result, out, evidence, title,
        command_text(name, quick, seeds, norm, plugin, seeds_decided(repro, jobs)),
        repro.budget(quick).text, jobs, default_seeds(quick, name), seed_caps(quick, name),
        redraw_text(name, quick, norm, plugin), smoke=quick,
        more_notes=None if quick or norm else partial(_off_look_notes, name, paths, repro),
    )  # fmt: skip


def within(result: report.Result, data: pd.DataFrame, name: str) -> report.Result:
    """A `--norm` run of some grids (a report card's slot) holds only their arms: the claims and
    gates on arms it lacks are left to NAME's own md, which decides them on its evidence; the
    arms it holds that NAME's analysis does not gate (the norm's own) get their gates here."""
    present = set(data["arm"])

    def held(arm: str) -> bool:  # an arm, or one of its settings (`batchnorm/b2`)
        return arm in present or arm.rsplit("/", 1)[0] in present

    claims = [c for c in result.claims if all(held(a) for a in report.claim_arms(c))]
    found = [g for g in result.gates if held(g.arm)]
    left = len(result.claims) - len(claims)
    found += gates.gates(data, sorted(present - {g.arm.rsplit("/", 1)[0] for g in found}
                                      - {g.arm for g in found}))  # fmt: skip
    if not left:
        return replace(result, gates=found)
    note = (f"{left} of the reproduction's {len(result.claims)} claims read arms this run does "
            f"not hold: they are decided in outputs/figures/{name}.md, and left out here with "
            "their arms' gates.")  # fmt: skip
    return replace(result, claims=claims, gates=found, notes=[note, *result.notes])


def redraw_text(name: str, quick: bool, norm: str | None, plugin: str | None) -> str:
    """The command that redraws a figure's files, as the md prints it (NAME+X: with --norm)."""
    cmd = f"python scripts/reproduce.py {name}"
    if norm:
        cmd += f" --norm {norm}" + (f" --plugin {plugin}" if plugin else "")
    return cmd + " --redraw" + (" --quick" if quick else "")


def _merge(new: pd.DataFrame, path: Path, jobs: Callable[[pd.DataFrame], pd.Series] | None = None
           ) -> pd.DataFrame:  # fmt: skip
    """new's rows in place of the rows of the same arms in the file at path (if any); with
    `jobs` (rows -> mask of the rows of the jobs this invocation ran), only new's rows of those
    jobs, in place of those rows of the same arms (the sweep dir also holds the grid's other
    finished jobs, e.g. the other seeds of a `--subset seed=2`, whose rows stay as they were)."""
    if jobs is not None:
        new = new[jobs(new)]
    old = pending.read(path)
    if old is None:
        return new
    replaced = old["arm"].isin(set(new["arm"]))
    if jobs is not None:
        replaced &= jobs(old)
    kept = old[~replaced]
    return pd.concat([kept, new], ignore_index=True).sort_values(["arm", "seed"], kind="stable")


Subset = list[tuple[str, list[str]]]  # --subset's (KEY, values), one per option


def parse_subset(text: str) -> tuple[str, list[str]] | None:
    """One --subset KEY=V1,V2 -> (KEY, [V1, V2]); None if it is not of that form."""
    key, sep, values = text.partition("=")
    if not (key and sep and values) or "=" in values or "" in values.split(","):
        return None
    return key, values.split(",")


def _selected(
    name: str, quick: bool, seeds: int, grids: list[str] | None, norm: str | None,
    plugin: str | None, subset: Subset | None, cut: dict[str, tuple[str, ...]] | None,
) -> Reproduction:  # fmt: skip
    """NAME's reproduction cut to what this invocation runs (--norm's arms added, --grids,
    --subset); a choice that cannot work exits in one line."""
    repro = REPRODUCTIONS[name]
    try:
        if norm:
            repro = repro.with_norm(norm, plugin, cut)
        if grids:
            repro = repro.only(grids)
        for key, values in subset or ():
            repro = repro.narrow(key, values, quick, seeds)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    return repro


def reproduce(
    name: str,
    quick: bool,
    jobs: int,
    root: Path,
    seeds: int | None,
    grids: list[str] | None = None,
    norm: str | None = None,
    plugin: str | None = None,
    collect: bool = False,
    threads: int | None = None,
    subset: Subset | None = None,
    cut: dict[str, tuple[str, ...]] | None = None,
    launcher: str | None = None,
    launcher_args: tuple[str, ...] = (),
) -> Path:
    """Run one NAME's sweeps (reusing finished jobs) and write its figure, data and md. With
    `grids`, only those grids run and their arms' rows replace the same arms' rows in the
    evidence already there (the other arms' rows kept as they are); with `subset` ((KEY,
    values), ...), only their jobs at those values of every KEY run, and only those jobs' rows
    are replaced (Reproduction.rows_at); with `norm`, the norm
    joins the grids that compare norms (Reproduction.with_norm; `cut`: overrides per grid, a
    report card's slot); with `launcher` (sweep.LAUNCHERS), the jobs go through that Hydra
    launcher (`launcher_args`: KEY=VALUE set on it), and are read back as any other's."""
    if seeds is None:
        seeds = default_seeds(quick, name)
    repro = _selected(name, quick, seeds, grids, norm, plugin, subset, cut)
    took = None if collect else estimate_before(repro, quick, jobs, seeds, bool(grids or norm),
                                                root, subset)  # fmt: skip
    if took:
        print(f"{name}: {took}; finished jobs are reused", flush=True)
    # --collect: the finished jobs as they are (each keeps its own code version in jobs.csv)
    seconds, sequenced = 0.0, bool(subset) and not (quick or norm)  # a share of a grid
    if not collect:  # a share cut short keeps its finished jobs (pending/)
        keep = partial(keep_cut, name, repro, quick, root, seeds, subset) if sequenced else None
        seconds = run_showing_progress(repro, quick, root, jobs, seeds, threads,
                                       launcher=launcher, launcher_args=launcher_args,
                                       subset=subset, on_cut=keep)  # fmt: skip
    runs = finished_runs(repro, quick, root, seeds) if sequenced else sweep.runs(
        repro, quick, root, seeds)  # fmt: skip
    if not runs:
        raise SystemExit(f"{name}: no jobs in {sweep.sweep_dir(root, name, quick)}")
    if repro.finish is not None:
        repro.finish(runs, max(1, min(jobs, repro.max_jobs or jobs)), sweep.REPO)
    frame = sweep.jobs_frame(runs)  # read once: the message below and the landing
    bad, of = not_ok(frame, subset)
    if bad:
        print(f"{name}: {bad} of {of} jobs not ok (see the md's jobs table)")
    paths = report.evidence_paths(sweep.figures_dir(root, quick), evidence_name(name, norm))
    paths["runs"].parent.mkdir(parents=True, exist_ok=True)
    data = repro.extract(runs)[report.RUNS_COLUMNS]
    draw = partial(redraw, name, quick, root, norm)  # the md from the files, as --redraw
    with file_lock(sweep.sweep_dir(root, name, quick) / EVIDENCE_LOCK):
        drawn = land_or_hold(name, paths, repro, data, frame, bool(grids), draw, subset, sequenced)
    if drawn is None:
        return paths["md"]
    print(f"{name}: {seconds:.0f} s, wrote {drawn['md']} (+ figure, data)", flush=True)
    return drawn["md"]


def finished_runs(repro: Reproduction, quick: bool, root: Path, seeds: int | None) -> list:
    """The runs of repro's sweep dirs but those killed mid-run (their row still 'running'): a
    share of a grid lands or holds only these (a killed job is no evidence yet)."""
    return [r for r in sweep.runs(repro, quick, root, seeds) if r.status != "running"]


def keep_cut(name: str, repro: Reproduction, quick: bool, root: Path, seeds: int | None,
             subset: Subset) -> None:  # fmt: skip
    """A share of a grid cut short (Ctrl+C, say before a session ends): its finished jobs wait
    in NAME/pending/, as a finished share's would when they leave the grid off its looks, so a
    commit keeps them for a new machine. Where they would complete a look, or cannot be read,
    it says so: `--collect` with the same options lands them."""
    again = f"`--collect` with the same options lands the finished jobs of {name}"
    try:
        runs = finished_runs(repro, quick, root, seeds)
        frame = sweep.jobs_frame(runs) if runs else None
        finished = int(_jobs_at(frame, subset).sum()) if frame is not None else 0
        if not finished:
            return
        paths = report.evidence_paths(sweep.figures_dir(root, quick), name)
        with file_lock(sweep.sweep_dir(root, name, quick) / EVIDENCE_LOCK):
            held = hold(name, paths, repro, lambda: repro.extract(runs)[report.RUNS_COLUMNS],
                        frame, subset)  # fmt: skip
        if held is None:
            print(f"{name}: cut at a look: {again}", file=sys.stderr, flush=True)
        else:
            print(f"{name}: cut short: its {finished} finished job(s) are kept in "
                  f"{paths['runs'].parent.name}/pending/\n{held}", file=sys.stderr,
                  flush=True)  # fmt: skip
    except Exception as err:  # the cut is the news: this adds to it, never hides it
        print(f"{name}: the finished jobs were not kept in pending/ ({err}): {again}",
              file=sys.stderr, flush=True)  # fmt: skip


def land_or_hold(name: str, paths: dict[str, Path], repro: Reproduction, data: pd.DataFrame,
                 jobs: pd.DataFrame, merge: bool, draw: Callable[[], dict[str, Path]],
                 subset: Subset | None, sequenced: bool) -> dict[str, Path] | None:  # fmt: skip
    """Land a run's rows (runs.csv's `data`, jobs.csv's `jobs`) and draw its md (None: held).
    `sequenced` (a --subset run of the full budget, a share of a grid): where the grid would
    then hold a seed count none of the design's looks, the rows wait in NAME/pending/ instead
    (`off_look`); where it holds a look, the pending rows of its grids land with its own."""
    rows = partial(repro.rows_at, subset=subset) if subset else None
    ran = partial(_jobs_at, subset=subset) if subset else None
    if not (sequenced and rows and ran):
        return land_and_draw(data, jobs, paths, merge, rows, ran, draw)
    waiting = hold(name, paths, repro, lambda: data, jobs, subset)
    if waiting:
        print(waiting, flush=True)
        return None
    data, jobs, rows, ran = pending.join(paths, data, jobs, rows, ran, partial(_of_grids, repro))
    held = whole_seeds(paths, list(repro.grids), jobs[ran(jobs)])
    jobs = stamp_looks(jobs, ran, {g: len(seeds) for g, seeds in held.items()}, repro)
    drawn = land_and_draw(data, jobs, paths, merge, rows, ran, draw)
    pending.release(paths, data[rows(data)], jobs[ran(jobs)], report.FLOAT)
    return drawn


def hold(name: str, paths: dict[str, Path], repro: Reproduction, data: Callable[[], pd.DataFrame],
         jobs: pd.DataFrame, subset: Subset) -> str | None:
    """Where a share of a grid (`jobs`: jobs.csv rows, the share's those at `subset`) would leave
    it off its looks (`off_look`): its rows (`data()`: runs.csv's) wait, committed, in
    NAME/pending/ for the run that completes the look, and why (None: they may land)."""
    ran = partial(_jobs_at, subset=subset)
    waiting = off_look(name, paths, repro, subset, jobs[ran(jobs)])
    if waiting:
        land_evidence(data(), jobs, pending.paths(paths), True,
                      partial(repro.rows_at, subset=subset), ran)  # fmt: skip
    return waiting


def _of_grids(repro: Reproduction, arm: str) -> bool:
    """Whether an arm (runs.csv's or jobs.csv's) is one a grid of repro runs."""
    return any(reads(arm, g.arm) for g in repro.grids)


def looks(name: str, paths: dict[str, Path], grids: list[Grid],
          claims: pd.DataFrame | None = None) -> dict[str, list[int]]:  # fmt: skip
    """Per grid: the seed counts its evidence may hold, the design's looks
    (normlab.analysis.sequential): the first seeds, the most its undecided claims (NAME's
    claims.csv, or `claims`: its rows, as seeds_to_decide reads them) plan, as --decide runs
    it, the cap, a raised cap, and the looks its jobs landed at (`stamp_looks`: a plan of
    claims since decided)."""
    repro, initial, cap = REPRODUCTIONS[name], default_seeds(False, name), seed_cap(False, name)
    claims = paths["claims"] if claims is None else claims
    known = isinstance(claims, pd.DataFrame) or claims.is_file()
    plans = seeds_to_decide(claims, cap, grids) if known else {}
    raised = {g.name: g.cap for g in repro.grids if g.cap}
    landed = stamped_looks(pending.jobs(paths, with_pending=False), grids)
    return {g.name: sorted({initial, plans.get(g.name, initial), cap, raised.get(g.name, cap),
                            *landed.get(g.name, ())}) for g in grids}  # fmt: skip


def off_looks(name: str, paths: dict[str, Path], grids: list[Grid],
              landing: pd.DataFrame | None = None, claims: pd.DataFrame | None = None,
              whole: dict[str, set[int]] | None = None) -> list[tuple[str, int, list[int]]]:
    """The grids whose evidence holds a seed count none of its looks (`looks`), each with that
    count and its looks: a claim read there is looked at once more than the design's simulated
    error rate covers. With `landing` (a landing's jobs.csv rows), the count it would hold with
    those and the pending ones (normlab.analysis.pending); `whole`: whole_seeds of the same, where
    the caller has them. A pilot's seeds are its own."""
    whole = whole_seeds(paths, grids, landing) if whole is None else whole
    allowed = looks(name, paths, grids, claims)
    return [(g, len(s), allowed[g]) for g, s in whole.items() if s and len(s) not in allowed[g]]


def whole_seeds(paths: dict[str, Path], grids: list[Grid], landing: pd.DataFrame | None = None
                ) -> dict[str, set[int]]:  # fmt: skip
    """Per grid (but a pilot, whose seeds are its own): the seeds its evidence holds whole, each
    with all its jobs run (failed or not: a failed job is the evidence's too); with `landing` (a
    landing's jobs.csv rows, in place of the same jobs'), with those and the pending ones."""
    held = pending.jobs(paths, with_pending=landing is not None)
    if landing is not None:
        held = pending.replaced(held, landing)
    found = seeds_run(held, grids, ok_only=False)
    return {g.name: found.get(g.name, set()) for g in grids if g.seeds is None}


def broken_seeds(grids: list[Grid], landing: pd.DataFrame, whole: dict[str, set[int]]
                 ) -> list[tuple[str, list[int]]]:  # fmt: skip
    """Per grid (but a pilot): the seeds of a landing (jobs.csv rows) that are not whole with it
    and the pending jobs (`whole`: whole_seeds with the landing; some arm lacks some of the
    seed's jobs). No claim may read them: a claim pairs its arms by seed, and would read such a
    seed off the design's looks."""
    found = []
    for g in grids:
        if g.name in whole:
            mine = {int(s) for s in landing.loc[of_grid(landing, g), "seed"]}
            if broken := sorted(mine - whole[g.name]):
                found.append((g.name, broken))
    return found


LOOK = "look"  # jobs.csv: the seed count a sequenced landing left its grid at, a look of the design


def stamp_looks(jobs: pd.DataFrame, ran: Callable[[pd.DataFrame], pd.Series],
                counts: dict[str, int], repro: Reproduction) -> pd.DataFrame:  # fmt: skip
    """The landing's jobs (`ran`), each stamped with the look it completes (`counts`, its grid's
    seeds after it): once its claims are decided their plan is gone from claims.csv, and the
    stamp keeps the count a look of the md's note (`off_looks`)."""
    jobs = jobs.copy()
    if LOOK not in jobs:
        jobs[LOOK] = float("nan")
    for g in repro.grids:
        if g.name in counts:
            mine = ran(jobs) & of_grid(jobs, g)
            jobs.loc[mine, LOOK] = counts[g.name]
    return jobs


def stamped_looks(jobs: pd.DataFrame | None, grids: list[Grid]) -> dict[str, set[int]]:
    """Per grid: the looks its jobs were landed at (`stamp_looks`)."""
    if jobs is None or LOOK not in jobs:
        return {}
    stamped = pd.to_numeric(jobs[LOOK], errors="coerce")
    found = {}
    for g in grids:
        found[g.name] = {int(n) for n in stamped[of_grid(jobs, g)].dropna()}
    return found


def _seeds(subset: Subset | None) -> frozenset[int]:
    """A --subset's seeds (none where it names no seed)."""
    return frozenset(int(v) for k, values in subset or () if k == "seed" for v in values)


def _off_look_notes(name: str, paths: dict[str, Path], repro: Reproduction,
                    claims: pd.DataFrame) -> list[str]:  # fmt: skip
    """The md's note on off-look grids, from this draw's decided claims (runs.csv alone)."""
    off = off_looks(name, paths, list(repro.grids), claims=claims)
    waiting = pending.note(paths)
    return [off_look_note(name, off)] * bool(off) + [waiting] * bool(waiting)


def off_look_note(name: str, off: list[tuple[str, int, list[int]]]) -> str:
    """The md's note on grids whose evidence holds a count none of their looks."""
    grids = "; ".join(f"{g} holds {n} (its looks: {', '.join(map(str, k))})" for g, n, k in off)
    return (f"Seeds off the design's looks: {grids}. They landed before the sequential design, "
            "or as shares of a grid; the claims on them are read at every seed held, a look the "
            "simulated error rate does not cover. The next run lands only at a look "
            f"(`python scripts/reproduce.py {name} --decide`).")


def off_look(name: str, paths: dict[str, Path], repro: Reproduction, subset: Subset,
             landing: pd.DataFrame) -> str | None:  # fmt: skip
    """Why a --subset run's jobs (`landing`, their jobs.csv rows) may not land yet, or None: with
    them a grid would hold a seed count that is none of its looks (`off_looks`, with the pending
    seeds), or it holds a seed of which some jobs did not run to their end (killed, or a share
    cut short: `broken_seeds`). They wait in NAME/pending/ for the run that completes the look,
    or the seed."""
    seeds, grids = _seeds(subset), list(repro.grids)
    waiting = pending.paths(paths)["jobs"].is_file()  # they land with it
    if not (seeds or waiting):  # a share of other keys than seeds: nothing to count
        return None
    whole = whole_seeds(paths, grids, landing)
    broken = broken_seeds(grids, landing, whole) if seeds else []
    if broken:
        grid, which = broken[0]
        return (f"{name}: not landed: seed(s) {', '.join(map(str, which))} of the {grid} grid "
                "lack jobs that ran to their end; their rows wait in "
                f"{paths['runs'].parent.name}/pending/ (commit it) until the seed is whole "
                f"(`python scripts/reproduce.py {name} --decide` runs it, reusing the finished "
                "jobs a sweep dir holds)")  # fmt: skip
    off = off_looks(name, paths, grids, landing, whole=whole)
    if not off:
        return None
    grid, n, allowed = off[0]
    kept = sorted({int(s) for s in landing["seed"]})  # not the subset's: a cut keeps fewer
    return (f"{name}: not landed: with seed(s) {', '.join(map(str, kept))} the {grid} "
            f"grid would hold {n} seeds, none of its looks ({', '.join(map(str, allowed))}: the "
            "first seeds, the plan, the cap); their rows wait in "
            f"{paths['runs'].parent.name}/pending/ (commit it) for the run that completes the "
            f"next look (`python scripts/reproduce.py {name} --decide`), which reruns none of "
            "them")


def land_and_draw(data: pd.DataFrame, jobs: pd.DataFrame, paths: dict[str, Path], merge: bool,
                  rows, ran, draw: Callable[[], dict[str, Path]]) -> dict[str, Path]:  # fmt: skip
    """land_evidence, then `draw` the md from it; where drawing fails (or is interrupted),
    runs.csv and jobs.csv go back to what they were, so the evidence lands with its md or not
    at all (the finished jobs stay in the sweep dir: the same command, or --collect, lands
    them)."""
    kept = {k: paths[k].read_text() if paths[k].is_file() else None for k in ("runs", "jobs")}
    land_evidence(data, jobs, paths, merge, rows, ran)
    try:
        return draw()
    except BaseException:
        for key, before in kept.items():
            if before is None:
                paths[key].unlink(missing_ok=True)
            else:
                atomic_write(paths[key], before)
        print(f"{paths['runs'].parent.name}: drawing failed, so its evidence is left as it was; "
              "the finished jobs stay in the sweep dir", file=sys.stderr)  # fmt: skip
        raise


def land_evidence(
    data: pd.DataFrame,
    jobs: pd.DataFrame,
    paths: dict[str, Path],
    merge: bool,
    rows: Callable[[pd.DataFrame], pd.Series] | None = None,
    ran: Callable[[pd.DataFrame], pd.Series] | None = None,
) -> None:
    """Write runs.csv and jobs.csv; with `merge` (--grids), the rows in place of the same arms'
    (of the same jobs' with `rows` and `ran`: --subset) in the files there. Called under NAME's
    EVIDENCE_LOCK: two reproduce processes of one NAME on different --grids (a core each) read,
    merge and write the same files when they finish, one at a time."""
    if merge:
        data, jobs = _merge(data, paths["runs"], rows), _merge(jobs, paths["jobs"], ran)
    for key, frame in (("runs", data), ("jobs", jobs)):  # readers see the old or the new file
        atomic_write(paths[key], frame.to_csv(index=False, float_format=report.FLOAT))


def not_ok(jobs: pd.DataFrame, subset: Subset | None) -> tuple[int, int]:
    """How many of this invocation's jobs (a jobs frame's rows; with --subset, the subset's
    alone, not the sweep dir's other jobs) are not ok, and of how many."""
    ours = jobs[_jobs_at(jobs, subset)] if subset else jobs
    return int((ours["status"] != "ok").sum()), len(ours)


def _jobs_at(jobs: pd.DataFrame, subset: Subset) -> pd.Series:
    """Which rows of a jobs.csv ran at the subset's values of every key (their overrides)."""

    return jobs["overrides"].map(lambda o: _at(parse_overrides(str(o)), subset)).astype(bool)


def _at(given: dict, subset: Subset) -> bool:
    """Whether a job's overrides are at the subset's values of every key."""
    return all(any(same_value(given.get(k), v) for v in values) for k, values in subset)


def arm_pattern(grid_arm: str) -> re.Pattern[str]:
    """The arms a grid's jobs run as: its arm, where each interpolation of a swept key
    (`pilot/lr${optim.optimizer.lr}`) stands for any value (`pilot/lr0.002`)."""
    parts = re.split(r"\$\{[^}]*\}", grid_arm)
    # a value stands within one path segment: `${placement.name}/d${depth}` (the loss grid's
    # `post/d6`) must not match another grid's `update/post/d6/w0`
    return re.compile("[^/]+?".join(map(re.escape, parts)))


def of_grid(jobs: pd.DataFrame, g: Grid) -> pd.Series:
    """Which rows of a jobs.csv (or runs.csv) are a grid's: their arm one its jobs run as."""
    return jobs["arm"].astype(str).str.fullmatch(arm_pattern(g.arm).pattern)


def reads(arms: str, grid_arm: str) -> bool:
    """Whether a claim whose arms are `arms` (claims.csv, space-joined) reads a grid's arm: one
    of the arms its jobs run as, or one of their settings (`batchnorm/b2` of `batchnorm`)."""
    pattern = arm_pattern(grid_arm)
    return any(pattern.fullmatch(a) or pattern.fullmatch(a.rsplit("/", 1)[0]) for a in arms.split())


def seeds_to_decide(claims_csv: Path | pd.DataFrame, cap: int, grids: list[Grid]
                    ) -> dict[str, int]:  # fmt: skip
    """Per grid name: the seeds the undecided claims (a tie among them) that read its arms plan
    for (the most any of them needs, at most `cap`); a grid no undecided claim with a plan reads
    is left out. The claims: NAME.claims.csv, or its rows as a frame."""
    claims = claims_csv if isinstance(claims_csv, pd.DataFrame) else pd.read_csv(
        claims_csv, keep_default_na=False, na_values={"planned_seeds": [""]})  # fmt: skip
    undecided = claims["verdict"].map(report.verdict_kind).isin(["undecided", "tie"])
    open_ = claims[undecided & claims["planned_seeds"].notna()]
    arms = open_["arms"] if "arms" in open_ else pd.Series("", index=open_.index)
    unnamed = open_[arms.str.strip() == ""]
    if len(unnamed):  # its seeds would go to no grid, or (read as every grid's) to all of them
        what = unnamed["claim"].iloc[0]
        raise SystemExit(f"{claims_csv.name}: the undecided claim '{what}' plans seeds but names "
                         "no arms: its analysis must pass Claim(arms=...)")  # fmt: skip
    plan: dict[str, int] = {}
    for g in grids:
        planned = zip(arms, open_["planned_seeds"], strict=True)
        needs = [int(n) for a, n in planned if reads(a, g.arm)]
        if needs:
            plan[g.name] = max(plan.get(g.name, 0), min(cap, max(needs)))
    return plan


QUICK_CAP = 3  # --decide --quick: a smoke test of the plan, one seed past the quick ones


def seeds_run(jobs_csv: Path | pd.DataFrame | None, grids: list[Grid], ok_only: bool = True
              ) -> dict[str, set[int]]:  # fmt: skip
    """Per grid name: the seeds every arm of it has in the evidence (a jobs.csv, or its rows), each
    with all its jobs (as many as the arm's most complete seed has: every value of a swept key,
    e.g. each b) ok, or (`ok_only` False) run whatever their status."""
    if isinstance(jobs_csv, pd.DataFrame):
        jobs = jobs_csv
    elif jobs_csv is None or not jobs_csv.is_file():
        return {}
    else:
        jobs = pd.read_csv(jobs_csv, keep_default_na=False)
    found: dict[str, set[int]] = {}
    for g in grids:
        mine = jobs[of_grid(jobs, g)]
        if mine.empty:
            found[g.name] = set()
        for _, arm in mine.groupby("arm"):  # each arm its jobs run as (an lr of a pilot's)
            counts = arm.groupby("seed")["status"].agg(
                lambda s: (len(s), (s == "ok").all() or not ok_only))
            full = max(n for n, _ in counts)
            seeds = {int(s) for s, (n, fine) in counts.items() if fine and n == full}
            found[g.name] = found.get(g.name, seeds) & seeds
    return found


def decide(name: str, quick: bool, jobs: int, root: Path, grids: list[str] | None,
           threads: int | None = None, launcher: str | None = None,
           launcher_args: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """Seeds to a decision: the reproduction at its initial seeds, then, once, each grid at the
    seeds the undecided claims that read its arms plan for (up to the declared cap). Only the
    seeds a grid's evidence lacks run, landed beside the others (--subset seed=..), so a machine
    without the earlier sweep dirs reruns no finished seed. Grids no undecided claim reads, and
    grids with a seed count of their own (pilots), are not run."""
    repro = REPRODUCTIONS[name]
    initial = default_seeds(quick, name)
    cap = seed_cap(quick, name)
    paths = report.evidence_paths(sweep.figures_dir(root, quick), name)
    chosen = [g for g in repro.grids
              if (grids is None or g.name in grids) and (quick or g.seeds is None)]  # fmt: skip

    def run_missing(target: dict[str, int], why: str) -> None:
        held, todo = seeds_run(pending.jobs(paths), chosen), {}  # pending ones run too
        for g, n in target.items():
            missing = tuple(s for s in range(n) if s not in held.get(g, set()))
            if missing:
                todo.setdefault((n, missing), []).append(g)
        for (n, missing), names in sorted(todo.items()):
            seeds = ",".join(map(str, missing))
            print(f"{name}: {why.format(grids=', '.join(names), n=n, cap=cap)}; running seed(s) "
                  f"{seeds}", flush=True)  # fmt: skip
            reproduce(name, quick, jobs, root, n, names, threads=threads,
                      subset=[("seed", list(map(str, missing)))], launcher=launcher,
                      launcher_args=launcher_args)  # fmt: skip

    if not paths["claims"].is_file():  # nothing drawn yet: the first seeds, every job
        reproduce(name, quick, jobs, root, initial, grids, threads=threads, launcher=launcher,
                  launcher_args=launcher_args)  # fmt: skip
    else:
        run_missing({g.name: initial for g in chosen}, "grids {grids} lack of the first {n} seeds")
    plan = {g: n for g, n in seeds_to_decide(paths["claims"], cap, chosen).items() if n > initial}
    if not plan:
        print(f"{name}: no undecided claim plans more than {initial} seeds")
    run_missing(plan, "the undecided claims on grids {grids} plan {n} seeds (cap {cap})")
    # the design's third look (normlab.analysis.sequential): still undecided at the plan, the cap
    last = {g: cap for g in seeds_to_decide(paths["claims"], cap, chosen) if plan.get(g, 0) < cap}
    run_missing(last, "claims on grids {grids} still undecided at their plan: the cap, {n} seeds")
    # a grid's `cap:` raised past the cap: a fourth look (its rate simulated in the md)
    raised = {g.name: g.cap for g in chosen if g.cap and not quick}
    more = {g: raised[g] for g in seeds_to_decide(paths["claims"], cap, chosen) if g in raised}
    run_missing(more, "claims on grids {grids} still undecided at the cap: their raised cap, "
                "{n} seeds")  # fmt: skip
    return paths["md"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help=f"one of {list(REPRODUCTIONS)} or 'all'")
    parser.add_argument("--quick", action="store_true", help="tiny budget (about a minute each)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel jobs (joblib launcher)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per job (default: the cores shared out between the --jobs, "
        "OMP_NUM_THREADS of them where set; 1 runs two reproductions side by side)",
    )
    parser.add_argument("--root", type=Path, default=REPO, help="where outputs/ goes")
    parser.add_argument("--list", action="store_true", help="print names and budgets")
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        help=f"seeds per arm (default: the declared initial seeds; {QUICK_SEEDS} quick)",
    )
    parser.add_argument(
        "--redraw", action="store_true", help="redraw from the committed runs.csv, no training"
    )
    parser.add_argument(
        "--readme", action="store_true", help="rewrite README's Results table from claims files"
    )
    parser.add_argument(
        "--grids",
        help="comma-separated grids (or fixed arms, e.g. dit/layernorm) to run; their arms "
        "replace those in the evidence",
    )
    parser.add_argument(
        "--subset",
        action="append",
        help="KEY=V,..: with --grids, run only the jobs at these values of a swept key (e.g. "
        "per_device=2, or seed=0,1); only those jobs' rows replace the evidence's; repeat it "
        "for more keys",
    )
    parser.add_argument("--norm", help="a registered norm (or a norm class's path) to add as an "
                        "arm (norm=custom)")
    parser.add_argument(
        "--collect",
        action="store_true",
        help="no training: the jobs already in the sweep dirs (run by hand, on a cluster, or "
        "before a cut) into the evidence, each with its own code version",
    )
    parser.add_argument(
        "--decide",
        action="store_true",
        help="seeds to a decision: the declared initial seeds, then once the seeds the "
        "undecided claims plan for, up to the declared cap",
    )
    parser.add_argument("--plugin", help="module that registers --norm (plugins=[MODULE])")
    return _launcher_options(parser)


def _launcher_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--launcher and --launcher-arg: a reproduction's jobs through a Hydra launcher."""
    parser.add_argument(
        "--launcher",
        choices=sorted(sweep.LAUNCHERS),
        help="send each grid's jobs through this Hydra launcher instead of running them here: "
        "slurm (a SLURM job array per multirun, one multirun per arm of a grid, from a login "
        "node; conf/hydra/launcher/slurm.yaml) or local (submitit on this machine, every job "
        "of a multirun at once); a job at its time limit is requeued and resumes from its "
        "last.ckpt",
    )
    parser.add_argument(
        "--launcher-arg",
        action="append",
        metavar="KEY=VALUE",
        help="with --launcher: set hydra.launcher.KEY=VALUE (e.g. partition=gpu, "
        "timeout_min=600, account=abc); repeat it for more keys",
    )
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Subset:
    """The options' combinations that cannot work fail here, in one line; the parsed --subset."""
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.name not in (*REPRODUCTIONS, "all"):
        parser.error(f"NAME must be one of {list(REPRODUCTIONS)} or 'all', got {args.name!r}")
    if args.plugin and not args.norm:
        parser.error("--plugin goes with --norm (the norm it registers)")
    if args.decide and (args.seeds or args.norm or args.collect or args.redraw):
        parser.error("--decide plans its own seeds: not with --seeds, --norm, --collect or "
                     "--redraw")  # fmt: skip
    if (args.grids or args.norm) and args.name == "all":
        parser.error("--grids and --norm take one NAME, not 'all'")
    if args.launcher and (args.collect or args.redraw or args.readme):
        parser.error("--launcher runs jobs: not with --collect, --redraw or --readme (which "
                     "read finished jobs or evidence)")  # fmt: skip
    if args.launcher and args.jobs != 1:
        parser.error("--jobs runs jobs at once on this machine (joblib): with --launcher the "
                     "launcher decides (slurm: hydra.launcher.array_parallelism; local: all "
                     "of a multirun)")  # fmt: skip
    if args.launcher_arg and not args.launcher:
        parser.error("--launcher-arg goes with --launcher")
    for text in args.launcher_arg or ():
        key, sep, value = text.partition("=")
        if not (key and sep and value) or key.startswith(("hydra", "+", "~")):
            parser.error(f"--launcher-arg takes KEY=VALUE (a key of hydra.launcher), got {text!r}")
    if args.subset and not args.grids:
        parser.error("--subset goes with --grids (the grids whose jobs it selects)")
    if args.subset and (args.decide or args.redraw or args.norm):
        parser.error("--subset selects jobs to run or collect: not with --decide, --redraw or "
                     "--norm")  # fmt: skip
    subset = [parse_subset(text) for text in args.subset or ()]
    for text, parsed in zip(args.subset or (), subset, strict=True):
        if parsed is None:
            parser.error(f"--subset takes KEY=VALUE[,VALUE...], got {text!r}")
    if len({key for key, _ in subset}) < len(subset):  # type: ignore[misc]
        parser.error("--subset: one option per key")
    if args.launcher == "slurm" and shutil.which("sbatch") is None:
        raise SystemExit("error: --launcher slurm: no sbatch on this machine (not a SLURM login "
                         "node): run it where sbatch is, or use --launcher local")  # fmt: skip
    return subset  # type: ignore[return-value]  # None parsed: parser.error above


def main(argv: list[str] | None = None) -> None:
    """`python scripts/reproduce.py ...` and `normlab-reproduce ...` (argv: sys.argv[1:])."""
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["card"]:  # a norm's report card: normlab.analysis.report_card
        from normlab.analysis import report_card  # lazy: only `card` needs it; it imports this

        report_card.main(given[1:])
        return
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        print(list_names())
        return
    if args.readme:
        print(f"wrote {update_readme(args.root.resolve())}")
        return
    subset = _check(parser, args)
    grids = [g for g in args.grids.split(",") if g] if args.grids else None
    names = list(REPRODUCTIONS) if args.name == "all" else [args.name]
    interrupt = Interrupt()
    before = signal.signal(signal.SIGINT, interrupt)
    try:
        _run(args, names, grids, interrupt, subset)
    except (KeyboardInterrupt, SystemExit, RuntimeError) as err:
        if not (interrupt.requested or isinstance(err, KeyboardInterrupt)):
            raise
        raise interrupt.stop(sys.argv[1:] if argv is None else argv, args.root.resolve()) from None
    finally:
        signal.signal(signal.SIGINT, before)


def _run(args: argparse.Namespace, names: list[str], grids: list[str] | None,
         interrupt: Interrupt, subset: Subset | None = None) -> None:  # fmt: skip
    start, failed = time.time(), []
    launcher_args = tuple(args.launcher_arg or ())
    for name in names:
        if interrupt.requested:
            raise KeyboardInterrupt
        try:
            if args.redraw:
                paths = redraw(name, args.quick, args.root.resolve(), args.norm)
                print(f"{name}: redrew {paths['md']} from {paths['runs']}")
            elif args.decide:
                decide(name, args.quick, args.jobs, args.root.resolve(), grids, args.threads,
                       args.launcher, launcher_args)  # fmt: skip
            else:
                reproduce(name, args.quick, args.jobs, args.root.resolve(), args.seeds, grids,
                          args.norm, args.plugin, args.collect, args.threads, subset,
                          launcher=args.launcher, launcher_args=launcher_args)  # fmt: skip
        except (SystemExit, RuntimeError) as err:
            if args.name != "all" or interrupt.requested:
                raise
            print(f"{name}: FAILED: {err}", file=sys.stderr, flush=True)
            failed.append(name)
    if interrupt.requested:  # a Ctrl+C its jobs swallowed (one landing in a teardown, say):
        raise KeyboardInterrupt  # it still stops here and says how to continue
    if len(names) > 1:
        print(f"all: {time.time() - start:.0f} s; failed: {failed or 'none'}")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
