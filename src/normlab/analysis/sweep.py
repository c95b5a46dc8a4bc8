# Over 400 lines: a reproduction's grids, from their yaml to the multiruns and the jobs found again
"""Running a reproduction's sweeps through `python train.py -m` and finding its jobs again.

Each NAME, budget and grid has one fixed sweep dir (<root>/outputs/reproduce/NAME[-quick]/GRID):
a second invocation reuses it, and normlab.sweep.jobs skips a job only when summary.csv has a
finished row for its overrides with the same resolved config and training-code version
(normlab.identity); a changed config or code reruns it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import yaml
from omegaconf import OmegaConf

from normlab import layout
from normlab.analysis import claims, sequential
from normlab.analysis.logs import Run, load_sweep, parse_overrides, same_value
from normlab.analysis.report import JOBS_COLUMNS, Result
from normlab.sweep.callbacks import EXIT_JOBS_FAILED

REPO = layout.root()  # where the sweeps run and outputs/ goes: the checkout (or the cwd)


@dataclass(frozen=True)
class Budget:
    """Overrides added to the experiment's own settings, and what they amount to in words."""

    overrides: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Grid:
    """One multirun of a reproduction: an experiment config, overrides added to it (which may
    sweep), and overrides that shrink it further under --quick."""

    name: str  # its sweep dir below the reproduction's ("" for a reproduction of one grid)
    experiment: str  # conf/experiment/<experiment>.yaml
    overrides: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    seeds: int | None = None  # its own seed count under the full budget, whatever --seeds says
    arm: str = ""  # the arm its jobs run as (`arm=` in overrides; may interpolate swept keys)
    only_seeds: tuple[int, ...] = ()  # run only these of its seeds (--subset seed=..); all if ()
    cap: int | None = None  # its claims' seed cap, raised past the reproduction's, and why
    cap_why: str = ""

    def seed_count(self, seeds: int | None, quick: bool) -> int | None:
        """How many seeds the grid runs: its own count under the full budget, else --seeds'
        (--quick, a smoke test, runs every grid on --seeds, a pilot of fewer seeds on its own;
        None: a reproduction without seeds)."""
        if seeds is None or self.seeds is None:
            return seeds
        return min(seeds, self.seeds) if quick else self.seeds

    def all_overrides(self, budget: Budget, quick: bool) -> tuple[str, ...]:
        """The grid's overrides, then the budget's, then its quick ones: a later value of a key
        replaces an earlier one (Hydra takes each key once)."""
        items = (*self.overrides, *budget.overrides, *(self.quick if quick else ()))
        last = {item.partition("=")[0]: item for item in items}
        return tuple(dict.fromkeys(last[item.partition("=")[0]] for item in items))


@dataclass(frozen=True)
class Reproduction:
    """A paper figure: the grids that sweep it, two budgets, and its analysis.

    Every arm runs with --seeds seeds (a grid with its own `seeds` keeps that count under the
    full budget); every number the analysis uses is kept in runs.csv (`extract`: run logs -> long
    table), and the figure and claims come from that table alone (`render`), so --redraw needs
    no logs.
    """

    name: str
    title: str
    grids: tuple[Grid, ...]  # one per (declared grid, arm): one multirun each
    full: Budget
    quick: Budget
    extract: Callable[[list[Run]], pd.DataFrame]
    render: Callable[[pd.DataFrame], Result]
    max_jobs: int | None = None  # cap on parallel jobs (timing sweeps run one job at a time)
    prepare: Callable[[Path], None] | None = None  # makes files the jobs read (run from REPO)
    # measures more of the finished jobs (runs, parallel jobs, REPO), before extract reads them
    finish: Callable[[list[Run], int, Path], None] | None = None
    # which runs.csv rows came from the jobs whose swept key took one of the values (data, key,
    # values -> mask): `reproduce.py NAME --subset KEY=V,..` replaces only those jobs' rows
    job_rows: Callable[[pd.DataFrame, str, list[str]], pd.Series] | None = None
    # grids whose arms are norms: `reproduce.py NAME --norm X` adds X as an arm of each
    norm_grids: tuple[str, ...] = ()
    initial_seeds: int = 3  # seeds run first
    seed_cap: int = 12  # the most seeds `--decide` runs for a claim still undecided

    def budget(self, quick: bool) -> Budget:
        return self.quick if quick else self.full

    def caps(self) -> sequential.Caps:
        """Its seed cap, with each grid whose `cap:` raises it for the claims on its arms."""
        raised = {g.name: sequential.Raise(g.name, frozenset(a.arm for a in self.grids
                                                             if a.name == g.name),
                                           g.cap, g.cap_why)
                  for g in self.grids if g.cap}  # fmt: skip
        return sequential.Caps(self.seed_cap, tuple(raised.values()))

    def only(self, names: list[str]) -> Reproduction:
        """The same reproduction with only the named grids, or arms of a grid (a fixed arm's
        name, e.g. dit/layernorm); an unknown name is an error."""
        known = list(dict.fromkeys(g.name for g in self.grids))
        arms = [g.arm for g in self.grids if "$" not in g.arm]
        unknown = [n for n in names if n not in known and n not in arms]
        if unknown:
            raise ValueError(f"{self.name}: no grid or arm {', '.join(unknown)}; its grids: "
                             f"{known}")  # fmt: skip
        return replace(self, grids=tuple(g for g in self.grids if {g.name, g.arm} & set(names)))

    def narrow(
        self, key: str, values: list[str], quick: bool, seeds: int | None = None
    ) -> Reproduction:
        """The same reproduction with the swept `key` run at only `values`, each among every
        grid's own values for it (a session's share of a long grid); anything else is an error.
        Its jobs are the grid's own: the same overrides, so the same identity and run dirs.
        `seed` narrows the seeds each grid runs (of `seeds`, or its own count)."""
        if key == "seed":
            grids = tuple(_seeds_of(g, values, quick, seeds) for g in self.grids)
            return replace(self, grids=grids)
        if self.job_rows is None and not all(_arm_pattern(g.arm, key) for g in self.grids):
            raise ValueError(f"{self.name}: --subset needs its analysis to say which rows a job "
                             f"wrote (job_rows in its conf/reproduce yaml), or every grid's arm "
                             f"to name {key} (${{{key}}})")  # fmt: skip
        grids = []
        for g in self.grids:
            declared = grid_values(g, self.budget(quick), quick).get(key)
            if declared is None or len(declared) < 2:
                raise ValueError(f"{self.name}: grid {g.name or 'main'} ({g.arm}) does not sweep "
                                 f"{key}")  # fmt: skip
            extra = [v for v in values if not any(same_value(v, d) for d in declared)]
            if extra:
                raise ValueError(f"{self.name}: {key}={','.join(extra)} is not among grid "
                                 f"{g.name or 'main'}'s values {','.join(declared)}")  # fmt: skip
            grids.append(replace(g, overrides=(*g.overrides, f"{key}={','.join(values)}")))
        return replace(self, grids=tuple(grids))

    def rows_at(self, data: pd.DataFrame, subset: Sequence[tuple[str, list[str]]]) -> pd.Series:
        """Which rows of a runs.csv came from the jobs `narrow` keeps for every (key, values) of
        `subset`: a row's seed for seed, the analysis's job_rows for a swept key, else the rows
        whose arm names one of the values where the grids' arms name the key."""
        mask = pd.Series(True, index=data.index)
        for key, values in subset:
            if key == "seed":
                mask &= data["seed"].isin([int(v) for v in values])
            elif self.job_rows is not None:
                mask &= self.job_rows(data, key, values)
            else:
                mask &= self.named_rows(data, key, values)
        return mask

    def named_rows(self, data: pd.DataFrame, key: str, values: list[str]) -> pd.Series:
        """The rows whose arm is a grid's arm at one of `values` of `key` (its `${key}` read
        back from the arm's name, e.g. dit_conditioning's `deep/${model.net.conditioning}`)."""
        mask = pd.Series(False, index=data.index)
        for g in self.grids:
            pattern = _arm_pattern(g.arm, key)
            if pattern is None:
                raise ValueError(f"{self.name}: grid {g.name or 'main'}'s arm {g.arm} does not "
                                 f"name {key}")  # fmt: skip
            named = data["arm"].astype(str).str.extract(f"^{pattern}$")["v"]
            mask |= named.map(lambda x: isinstance(x, str)
                              and any(same_value(x, v) for v in values))  # fmt: skip
        return mask

    def with_norm(self, norm: str, plugin: str | None,
                  cut: dict[str, tuple[str, ...]] | None = None) -> Reproduction:  # fmt: skip
        """The same reproduction with a registered norm (a user's, from module `plugin`) as one
        more arm of every grid in norm_grids: a grid <grid>-<norm> of the same experiment with
        norm=custom norm._target_=${normlab.norm:<norm>} (its sweep of built-in norms replaced by
        that one; the resolver gives a registered name's class path, a class path as it is), its arm
        `<grid>/<norm>` (`<norm>` for the unnamed main grid); `cut` adds overrides per grid (a
        report card's slot cut to its question)."""
        if not self.norm_grids:
            raise ValueError(f"{self.name} has fixed arms: --norm works with "
                             "a reproduction that compares norms")  # fmt: skip
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", norm):
            raise ValueError(f"--norm must be a registered norm's name, got {norm!r}")
        target = f"norm._target_=${{normlab.norm:{norm}}}"  # conf/norm/custom.yaml's class
        extra = ("norm=custom", target, *([f"plugins=[{plugin}]"] if plugin else ()))
        firsts = {g.name: g for g in reversed(self.grids) if g.name in self.norm_grids}
        cut = cut or {}
        added = tuple(  # the cut last under either budget: a smoke run asks the same question
            arm_grid(replace(g, name=f"{g.name or 'main'}-{norm}",
                             overrides=(*_own(g), *extra, *cut.get(g.name, ())),
                             quick=(*g.quick, *cut.get(g.name, ()))),
                     norm_arm(g.name, norm, g.arm))
            for g in firsts.values()
        )  # fmt: skip
        return replace(self, grids=self.grids + added)


def _arm_pattern(arm: str, key: str) -> str | None:
    """A regex matching an arm name rendered from the template `arm`, its `${key}` captured
    as `v` (any other interpolation matched loosely); None if `arm` does not name `key`."""
    token = "${" + key + "}"
    if token not in arm:
        return None
    parts = re.split(r"(\$\{[^}]*\})", arm)
    first = parts.index(token)
    return "".join("(?P<v>.+?)" if i == first else "(?P=v)" if p == token
                   else ".+?" if p.startswith("${") else re.escape(p)
                   for i, p in enumerate(parts))  # fmt: skip


NAMES_ITS_NORM = "${normlab.norm_name:norm}"  # an arm template that names the job's norm


def norm_arm(grid: str, norm: str, template: str = "") -> str:
    """The arm a norm added to a grid runs as (`--norm`, a report card): `<grid>/<norm>` (the
    norm's name alone in the unnamed main grid); where the grid's arms are a `template` over
    its swept keys, that template under `<grid>/<norm>/` (one arm per job, as the built-in
    norms' are), or the template as it stands where it names the job's norm itself."""
    if NAMES_ITS_NORM in template:
        return template
    head = f"{grid}/{norm}" if grid not in ("", "main") else norm
    if "$" not in template:
        return head
    return f"{head}/{template.removeprefix(f'{grid}/')}"


def _seeds_of(g: Grid, values: list[str], quick: bool, seeds: int | None) -> Grid:
    """The grid running only the seeds `values`, each one of those it runs."""
    count = g.seed_count(seeds, quick)
    if count is None:
        raise ValueError(f"grid {g.name or 'main'} runs no seeds")
    wanted = [int(v) for v in values if v.isdigit()]
    if len(wanted) < len(values) or any(s >= count for s in wanted):
        raise ValueError(f"seed={','.join(values)}: grid {g.name or 'main'} runs seeds "
                         f"0..{count - 1}")  # fmt: skip
    return replace(g, only_seeds=tuple(wanted))


def _own(g: Grid) -> tuple[str, ...]:
    """A grid's overrides without its arm's name."""
    return tuple(o for o in g.overrides if not o.startswith("arm="))


def arm_grid(g: Grid, arm: str, overrides: tuple[str, ...] = ()) -> Grid:
    """The multirun of one arm of a declared grid: the grid's overrides, the arm's, `arm=NAME`."""
    return replace(g, overrides=(*_own(g), *overrides, f"arm={arm}"), arm=arm)


# ----- declarations: conf/reproduce/NAME.yaml ---------------------------------------------------

DECLARED = layout.reproduce_dir()


def _function(path: str, module: str) -> Callable:
    """`name` from the analysis module, or a dotted `package.module.name`."""
    mod, _, attr = path.rpartition(".") if "." in path else (module, "", path)
    return getattr(importlib.import_module(mod), attr)


def _flat(items) -> tuple[str, ...]:
    """A declaration's override list, with any entry that is itself a list spliced in: a YAML
    anchor names a list once (`quick: &dit [...]`) and an alias reuses it, alone (`*dit`) or
    extended (`[*dit, optim.optimizer.lr=2e-3]`)."""
    return tuple(o for item in items or () for o in (_flat(item) if isinstance(item, list)
                                                     else (item,)))  # fmt: skip


def load(path: Path) -> Reproduction:
    """A reproduction from its declaration: grids x arms, budgets, seeds, and the analysis
    module's extract and render (and optional prepare/finish)."""
    spec = yaml.safe_load(path.read_text())
    claims.entries(spec, path)  # a bad claims entry fails here, naming the file and the entry
    module = importlib.import_module(spec["analysis"])
    grids = []
    for name, g in spec["grids"].items():
        base = Grid(name if name != "main" else "", g["experiment"], _flat(g.get("overrides")),
                    _flat(g.get("quick")), g.get("seeds"), cap=g.get("cap"),
                    cap_why=g.get("cap_why", ""))  # fmt: skip
        _check_cap(path, name, base, g, spec.get("seeds", {}).get("cap", 12))
        grids += [arm_grid(base, arm, _flat(o)) for arm, o in g["arms"].items()]
    budgets = {k: Budget(_flat(b.get("overrides")), b["text"])
               for k, b in spec["budgets"].items()}  # fmt: skip
    hooks = {k: _function(spec[k], spec["analysis"])
             for k in ("prepare", "finish", "job_rows") if k in spec}  # fmt: skip
    return Reproduction(
        name=path.stem,
        title=spec["title"],
        grids=tuple(grids),
        full=budgets["full"],
        quick=budgets["quick"],
        extract=module.extract,
        render=getattr(module, spec.get("render", "render")),
        max_jobs=spec.get("max_jobs"),
        # the grids a norm joins: --norm's, and every report-card slot's (main: the unnamed)
        norm_grids=tuple(dict.fromkeys([*spec.get("norm_grids", ()), *(
            "" if c["grid"] == "main" else c["grid"] for c in spec.get("card", ()))])),
        initial_seeds=spec.get("seeds", {}).get("initial", 3),
        seed_cap=spec.get("seeds", {}).get("cap", 12),
        **hooks,
    )


def _check_cap(path: Path, name: str, grid: Grid, g: dict, cap: int) -> None:
    """A grid's `cap:` raises its claims' cap past the reproduction's (a fourth look, simulated
    in the md): it names its reason and fixed arms (the claims it extends), or fails here."""
    if grid.cap is None:
        return
    where = f"{path.name}: grids.{name}.cap"
    if not grid.cap_why:
        raise ValueError(f"{where}: a raised cap needs its reason (cap_why)")
    if grid.cap <= cap:
        raise ValueError(f"{where}: {grid.cap} does not raise the reproduction's cap {cap}")
    if any("$" in arm for arm in g["arms"]):
        raise ValueError(f"{where}: only a grid of fixed arm names can raise its cap")


def declared(conf: Path = DECLARED) -> dict[str, Reproduction]:
    """Every reproduction declared under conf/reproduce, in their `order`."""
    paths = sorted(conf.glob("*.yaml"), key=lambda p: (yaml.safe_load(p.read_text())["order"], p))
    return {p.stem: load(p) for p in paths}


def seed_override(seeds: int | None, only: tuple[int, ...] = ()) -> tuple[str, ...]:
    """seed=0,1,...,n-1 (a sweep over n seeds), or those of them in `only`; nothing for a
    reproduction without seeds."""
    if seeds is None:
        return ()
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    return (f"seed={','.join(str(s) for s in range(seeds) if not only or s in only)}",)


def sweep_dir(root: Path, name: str, quick: bool, grid: str = "") -> Path:
    """The fixed sweep dir of a NAME, budget and grid under root."""
    base = root / "outputs" / "reproduce" / (f"{name}-quick" if quick else name)
    return base / grid if grid else base


def figures_dir(root: Path, quick: bool) -> Path:
    """Where figures go: outputs/figures (full budget), outputs/figures/quick (--quick)."""
    base = root / "outputs" / "figures"
    return base / "quick" if quick else base


def job_threads(jobs: int, threads: int | None = None) -> int:
    """Torch threads per job: `threads` where given (e.g. 1, to run two reproductions side by
    side), else the cores shared out between the parallel jobs: this process's OMP_NUM_THREADS
    where set (e.g. by a test worker, or by the user), else every core."""
    own = os.environ.get("OMP_NUM_THREADS", "").split(",")[0]  # OpenMP's '4,2': 4 at the top
    cores = int(own) if own.isdigit() and int(own) > 0 else os.cpu_count() or 1
    return threads or max(1, cores // jobs)


def threads_env(threads: int) -> dict[str, str]:
    """This process's environment with torch's thread pools (OpenMP, MKL) set to `threads`: how
    a child job is given its share of the cores."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def train_args(
    grid: Grid, budget: Budget, quick: bool, sweep: Path, jobs: int, seeds: tuple[str, ...] = ()
) -> list[str]:
    """The arguments of one grid's `python train.py -m ...` multirun (joblib launcher when
    jobs > 1); normlab.sweep.multiruns runs it and prints it as that command. The seeds come
    first, so Hydra's sweep (the last key varies fastest) runs the jobs seed by seed: a grid
    whose arms one multirun sweeps (dit_conditioning's `model.net.conditioning=a,b,..`) cut
    short leaves whole seeds, every arm of each, which a look can read, not some arms of every
    seed, which --decide would run again on a new machine (normlab.analysis.pending)."""
    args = ["-m", f"experiment={grid.experiment}", *seeds, *grid.all_overrides(budget, quick)]
    args.append(f"hydra.sweep.dir={sweep}")
    if jobs > 1:
        args += ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
    return args


def task_overrides(grid: Grid, budget: Budget, quick: bool) -> dict[str, str]:
    """The overrides every job of a grid carries (the key its summary rows are found by)."""
    items = [f"experiment={grid.experiment}", *grid.all_overrides(budget, quick)]
    return {
        k: v
        for k, v in parse_overrides(" ".join(items)).items()
        if not k.startswith("hydra") and not _is_sweep(v)  # a sweep's values differ per job
    }


def _is_sweep(value: str) -> bool:
    """'32,2' is a sweep over two values; '[32,2]' and quoted strings are single values."""
    return "," in value and not value.startswith(("[", "{", "'", '"'))


def run_child(cmd: list[str], env: dict[str, str]) -> int:
    """Run the sweep's child (from the checkout) in a process group of its own and pass each
    SIGINT this process gets on to that group, once: a terminal's Ctrl+C (to the foreground
    group: here) and a `kill -INT <pid>` of this process alone then stop the jobs alike, each
    saving its state. Its exit code. The child stops itself if this process dies first
    (normlab.sweep.multiruns.follow_parent), so no training outlives it."""
    with subprocess.Popen(cmd, cwd=REPO, env=env, process_group=0) as child:
        before = signal.getsignal(signal.SIGINT)
        if before is signal.SIG_IGN or threading.current_thread() is not threading.main_thread():
            return child.wait()  # ignored here, so there too; or no handler can be set

        def forward(signum: int, frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGINT)
            if not callable(before):  # SIG_DFL
                raise KeyboardInterrupt
            before(signum, frame)  # reproduce's Interrupt: waits for the jobs, or stops

        signal.signal(signal.SIGINT, forward)
        try:
            return child.wait()
        finally:
            signal.signal(signal.SIGINT, before)


def run(
    repro: Reproduction,
    quick: bool,
    root: Path,
    jobs: int,
    seeds: int | None = None,
    log=print,
    threads: int | None = None,
    launcher: str | None = None,
    launcher_args: Sequence[str] = (),
) -> float:
    """Run (or complete) every grid's sweep, one `train.py -m` multirun each, all in one process
    (normlab.sweep.multiruns: torch and Lightning load once); return the wall time in seconds. A
    sweep in which some jobs failed or diverged (exit code EXIT_JOBS_FAILED) still counts: its
    summary has their status, and the analysis reads it; one stopped by a SIGINT sent to it
    alone (`kill -INT <pid>`: exit 130, or killed by it) raises KeyboardInterrupt, as a Ctrl+C
    here does. `launcher` (a key of LAUNCHERS) sends each grid's jobs through that Hydra
    launcher, with `launcher_args` (KEY=VALUE) set on it; None runs them here, `jobs` at once
    (joblib when more than one)."""
    jobs = max(1, min(jobs, repro.max_jobs or jobs))
    # Threads through the environment, not an override: a job's overrides are its identity in
    # summary.csv, and the same job run with another --jobs must still count as done.
    if launcher == "slurm":  # a job's torch takes the cores SLURM gives it (cpus_per_task)
        env = threads_env(threads) if threads else dict(os.environ)
    elif launcher == "local":  # submitit's local executor starts every job of a multirun at once
        at_once = max(grid_size(g, repro.budget(quick), quick, seeds) for g in repro.grids)
        env = threads_env(job_threads(at_once, threads))
    else:
        env = threads_env(job_threads(jobs, threads))
    if repro.prepare is not None:
        repro.prepare(REPO)
    start = time.time()
    runs = []
    for g in repro.grids:
        sweep = sweep_dir(root, repro.name, quick, g.name).resolve()
        seeded = seed_override(g.seed_count(seeds, quick), g.only_seeds)
        args = train_args(g, repro.budget(quick), quick, sweep, 1 if launcher else jobs, seeded)
        if launcher is not None:
            args += launcher_overrides(launcher, launcher_args)
        runs.append(args)
    cmd = [sys.executable, "-m", "normlab.sweep.multiruns", json.dumps(runs)]
    code = run_child(cmd, env)  # it prints each multirun's command as it starts
    if code in (128 + signal.SIGINT, -signal.SIGINT):
        raise KeyboardInterrupt
    if code == EXIT_JOBS_FAILED:
        log(f"{repro.name}: some jobs failed or diverged, see the summary.md named above")
    elif code != 0:
        raise RuntimeError(f"{repro.name}: sweep exited with code {code}")
    return time.time() - start


# --launcher NAME of scripts/reproduce.py -> conf/hydra/launcher/NAME (normlab's presets over
# the submitit plugin's submitit_slurm and submitit_local)
LAUNCHERS = {"slurm": "slurm", "local": "local"}


def launcher_overrides(launcher: str, launcher_args: Sequence[str] = ()) -> list[str]:
    """The overrides that send a multirun's jobs through LAUNCHERS[launcher], KEY=VALUE of
    `launcher_args` set on it (hydra.launcher.KEY=VALUE: Hydra's, not the jobs' overrides, so not
    part of a job's identity)."""
    return [f"hydra/launcher={LAUNCHERS[launcher]}",
            *(f"hydra.launcher.{arg}" for arg in launcher_args)]  # fmt: skip


def grid_size(g: Grid, budget: Budget, quick: bool, seeds: int | None) -> int:
    """How many jobs a grid's multirun runs: the product of its swept values."""
    values = grid_values(g, budget, quick, g.seed_count(seeds, quick))
    return math.prod(len(v) for v in values.values())


def grid_values(
    g: Grid, budget: Budget, quick: bool, seeds: int | None = None
) -> dict[str, list[str]]:
    """The swept keys of a grid and their values: the experiment's hydra.sweeper.params, where
    the grid's and budget's overrides of the same keys (or their own sweeps) replace them."""
    conf = OmegaConf.load(layout.conf_dir() / "experiment" / f"{g.experiment}.yaml")
    params = OmegaConf.select(conf, "hydra.sweeper.params", default=None) or {}
    values = {str(k): _values(str(v)) for k, v in params.items()}
    extra = " ".join((*g.all_overrides(budget, quick), *seed_override(seeds, g.only_seeds)))
    for key, value in parse_overrides(extra).items():
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


def runs(repro: Reproduction, quick: bool, root: Path, seeds: int | None = None) -> list[Run]:
    """The jobs of this NAME and budget, read back from every grid's logs (only the current
    grids' jobs: after a change of a grid, older rows stay in summary.csv but are not read)."""
    found = []
    budget = repro.budget(quick)
    for g in repro.grids:
        sweep = sweep_dir(root, repro.name, quick, g.name)
        values = grid_values(g, budget, quick, g.seed_count(seeds, quick))
        rows = load_sweep(sweep, task_overrides(g, budget, quick))
        found += [r for r in rows if in_grid(r, values)]
    return found


def jobs_frame(runs: list[Run]) -> pd.DataFrame:
    """One row per job: arm, seed, status, error, wall time, reused, code version, overrides."""
    rows = [
        {
            "arm": r.arm,
            "seed": int(r.get("seed")),
            "status": r.status,
            "error": r.error,
            "wall_time_s": r.wall_time_s,
            "reused": r.reused,
            "code_version": r.code_version,
            "overrides": " ".join(f"{k}={v}" for k, v in r.overrides.items()),
        }
        for r in runs
    ]
    frame = pd.DataFrame(rows, columns=JOBS_COLUMNS)
    return frame.sort_values(["arm", "seed"], kind="stable").reset_index(drop=True)


def ensure_fid_lenet(repo: Path) -> None:
    """val/fid_lenet measures in the committed LeNet: check it against its pinned sha256 before
    the jobs start (an altered file fails here, once). Nothing is trained; jobs given
    callbacks.fid.features=cached train their LeNet on first use, once (normlab.fid_train)."""
    from normlab import fid  # lazy: torch loads only in the reproductions that score FID

    fid.load_feature_extractor(fid.COMMITTED_FILE)
