"""A report card's baselines: read as committed, read after a replay matched, or retrained.

A slot's baselines are its reproduction's committed jobs (outputs/figures/NAME/runs.csv and
jobs.csv). Any edit of training code changes normlab.identity.code_version, so a baseline arm
whose jobs ran another version than today's is checked before a card reads it, more cheaply
than by retraining it: per version its jobs ran, the job of its lowest seed is replayed under
today's code (its committed overrides, stopped after the slot's `replay: {steps: N}` by
normlab.analysis.stop_at.StopAt, the lr schedule untouched), read back by the reproduction's
own extract, and the slot's `replay` metrics compared with the committed values at the same
steps up to N (TOLERANCE). Every replay matches: the card reads the arm. One differs, or cannot
be compared (the slot declares no replay, a seed of several jobs, a replay too long or one that
failed): the card retrains the arm at the slot's seeds, into its own NAME+norm evidence beside
the norm's arms (outputs/figures/NAME/ is never written), and compares the norm with that.
`--retrain-baselines` retrains every stale arm, `--reuse-baselines` reads them unchecked.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from normlab import layout
from normlab.analysis import card, sweep
from normlab.analysis.logs import Run, parse_overrides, read_metrics
from normlab.analysis.reproductions import REPRODUCTIONS
from normlab.tables import markdown_table

REPO = layout.root()
# |today - committed| <= REL * |committed| + ABS: runs.csv keeps 6 significant digits (%.6g),
# a float32 about 7; a replay on the same code and seed repeats its run to the last bit here
TOLERANCE = (1e-5, 1e-7)
REPLAY_S = 60.0  # the most a replay may take (one core, from the committed job's wall time)
START_S = 20.0  # a replay's own cost: Python, torch and Lightning loading, the data read
QUICK_JOB_S = 60.0  # a --budget quick job (as report_card's)
POLICIES = ("check", "retrain", "reuse")  # default, --retrain-baselines, --reuse-baselines

Runner = Callable[[str, str, int], pd.DataFrame]  # (reproduction, overrides, steps) -> runs rows


@dataclass(frozen=True)
class Baseline:
    """What a card does with one baseline arm of one slot, and why."""

    slot: str
    reproduction: str
    norm: str  # the baseline's norm
    arm: str
    versions: tuple[str, ...]  # the training-code versions its committed jobs ran
    today: str
    action: str  # read | retrain | replay (still to check)
    how: str  # same version | replay matched | --reuse-baselines | replay differs | ...
    why: str = ""  # the sentence the card says

    @property
    def status(self) -> str:
        done = {"read": "read", "retrain": "retrained", "replay": "to replay"}[self.action]
        return f"{done} ({self.how})"

    @property
    def trained(self) -> str:
        """Under which code its jobs ran, against today's."""
        if self.versions == (self.today,):
            return f"trained under today's code {self.today}"
        return f"trained under code {', '.join(self.versions) or 'unknown'}, today's {self.today}"

    def line(self, norm: str) -> str:
        """The console's line on it."""
        said = f"{self.trained}; {self.why}" if self.why else self.trained
        return f"card {norm}: {self.reproduction}, {self.arm}: {self.status}: {said}"


def committed(reproduction: str, figures: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The reproduction's committed runs.csv and jobs.csv."""
    base = figures / reproduction
    jobs = pd.read_csv(base / "jobs.csv", keep_default_na=False, na_values={"wall_time_s": [""]})
    return pd.read_csv(base / "runs.csv"), jobs


def retrainable(reproduction: str, arm: str) -> bool:
    """Whether a card can run the arm alone (`reproduce.py NAME --grids ARM`): a fixed arm of a
    grid, not one rendered from a template over the grid's swept keys."""
    return any(g.arm == arm for g in REPRODUCTIONS[reproduction].grids)


def _versions(jobs: pd.DataFrame) -> tuple[str, ...]:
    return tuple(sorted(set(jobs["code_version"].astype(str)) - {""}))


def _unreplayable(slot: card.Slot, jobs: pd.DataFrame, runs: pd.DataFrame) -> str:
    """'' where the arm's stale jobs can be replayed cheaply, else why not."""
    if not slot.replay:
        return (f"no replay declared for this slot (conf/reproduce/{slot.reproduction}.yaml, "
                "card: replay)")  # fmt: skip
    for _, mine in jobs.groupby("code_version"):
        seed = int(mine["seed"].min())
        if (mine["seed"] == seed).sum() > 1:
            return f"its seed {seed} is {(mine['seed'] == seed).sum()} jobs (a swept key)"
        took = replay_s(slot, mine[mine["seed"] == seed].iloc[0], runs)
        if took > REPLAY_S:
            return f"a replay of {slot.replay['steps']} steps would take about {took:.0f} s"
    return ""


def replay_s(slot: card.Slot, job: pd.Series, runs: pd.DataFrame) -> float:
    """A replay's seconds: its start, then the committed job's wall time in proportion of the
    steps replayed to the steps it logged."""
    mine = runs[(runs["arm"] == job["arm"]) & (runs["seed"] == job["seed"])]
    last = float(mine["x"].max()) if mine["x"].notna().any() else math.nan
    wall = float(job["wall_time_s"]) if pd.notna(job["wall_time_s"]) else math.inf
    share = min(1.0, slot.replay["steps"] / last) if last > 0 else 1.0
    return START_S + share * wall


def pending(slots: list[card.Slot], norm: str, policy: str, today: str,
            figures: Path) -> list[Baseline]:  # fmt: skip
    """Each slot's baseline arms, decided as far as can be before any replay runs: read (same
    version, or --reuse-baselines), retrain (--retrain-baselines, or no cheap replay), or
    replay (a stale arm to check)."""
    out = []
    for s in slots:
        runs, jobs = committed(s.reproduction, figures)
        for b in (b for b in s.baselines if b != norm):
            arm = s.arm(b)
            mine = jobs[jobs["arm"] == arm]
            base = Baseline(s.title, s.reproduction, b, arm, _versions(mine), today, "read", "")
            stale = mine[mine["code_version"].astype(str) != today]
            out.append(_feasible(_first_call(base, s, stale, runs, policy)))
    return out


def _feasible(b: Baseline) -> Baseline:
    """An arm to retrain that a card cannot run alone (its grid's arms are a template over the
    grid's swept keys, which `--grids` cannot select one of) is read as committed, saying so."""
    if b.action != "retrain" or retrainable(b.reproduction, b.arm):
        return b
    return replace(b, action="read", how=f"{b.how}; cannot retrain", why=(
        f"{b.why}; a card cannot run this arm alone (its grid's arms are a template): read as "
        f"committed; retrain it with python scripts/reproduce.py {b.reproduction} --grids GRID"
    ))  # fmt: skip


def _first_call(base: Baseline, slot: card.Slot, stale: pd.DataFrame, runs: pd.DataFrame,
                policy: str) -> Baseline:  # fmt: skip
    if stale.empty:
        return replace(base, how="same version")
    if policy == "reuse":
        return replace(base, how="--reuse-baselines", why="read unchecked")
    if policy == "retrain":
        return replace(base, action="retrain", how="--retrain-baselines", why="retrained as asked")
    why = _unreplayable(slot, stale, runs)
    if why:
        return replace(base, action="retrain", how="no replay", why=why)
    return replace(base, action="replay", how="stale")


# ----- the replay ------------------------------------------------------------------------------


def run_replay(reproduction: str, overrides: str, steps: int) -> pd.DataFrame:
    """The committed job (its overrides) under today's code, stopped after `steps` steps, on one
    thread, in a scratch dir: its runs.csv rows as the reproduction's extract reads them."""
    stop = f"+callbacks.replay_stop={{_target_: normlab.analysis.stop_at.StopAt, step: {steps}}}"
    with tempfile.TemporaryDirectory(prefix="normlab-replay-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "normlab.train", *overrides.split(), stop, "test=false",
               "progress=none", f"hydra.run.dir={run_dir}"]  # fmt: skip
        done = subprocess.run(cmd, cwd=REPO, env=sweep.threads_env(1), capture_output=True,
                              text=True, timeout=900)  # fmt: skip
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the replay exited with code {done.returncode}: {tail}")
        run = Run(parse_overrides(overrides), "ok", run_dir, metrics=read_metrics(run_dir))
        return REPRODUCTIONS[reproduction].extract([run])


def close(a: float, b: float) -> bool:
    rel, absolute = TOLERANCE
    return abs(a - b) <= rel * abs(a) + absolute


def compare(replayed: pd.DataFrame, committed_rows: pd.DataFrame, metrics: list[str],
            steps: int) -> tuple[bool, list[tuple[str, float, float, float]], str]:  # fmt: skip
    """The committed values of `metrics` at steps up to `steps` against the replay's: (all
    within TOLERANCE, the points (metric, step, committed, today), why not where they are not)."""
    want = committed_rows[committed_rows["metric"].isin(metrics) & (committed_rows["x"] <= steps)]
    if want.empty:
        return False, [], f"the committed evidence logs none of {metrics} by step {steps}"
    got = replayed.dropna(subset=["x"]).set_index(["metric", "x"])["value"]
    points, why = [], ""
    for r in want.sort_values(["x", "metric"]).itertuples():
        if (r.metric, r.x) not in got.index:
            return False, points, f"the replay logged no {r.metric} at step {r.x:g}"
        points.append((r.metric, float(r.x), float(r.value), float(got[(r.metric, r.x)])))
        if not why and not close(points[-1][2], points[-1][3]):
            why = f"{r.metric} at step {r.x:g}: committed {r.value:.6g}, today {points[-1][3]:.6g}"
    return not why, points, why


def check(b: Baseline, slot: card.Slot, figures: Path, runner: Runner) -> Baseline:
    """A stale arm replayed, per version its jobs ran, at that version's lowest seed: read where
    every replay matches, else retrain (why)."""
    runs, jobs = committed(b.reproduction, figures)
    stale = jobs[(jobs["arm"] == b.arm) & (jobs["code_version"].astype(str) != b.today)]
    steps, metrics = int(slot.replay["steps"]), list(slot.replay["metrics"])
    said = []
    for version, group in stale.groupby("code_version"):
        job = group.sort_values("seed", kind="stable").iloc[0]
        which = f"seed {job['seed']} (code {version})"
        rows = runs[(runs["arm"] == b.arm) & (runs["seed"] == job["seed"])]
        try:
            replayed = runner(b.reproduction, str(job["overrides"]), steps)
        except Exception as err:  # a replay that fails or reads back nothing cannot be compared
            return replace(b, action="retrain", how="replay failed",
                           why=f"the replay of {which} cannot be compared: {err}")  # fmt: skip
        same, points, why = compare(replayed, rows, metrics, steps)
        if not same:
            return replace(b, action="retrain", how="replay differs",
                           why=f"the replay of the first {steps} steps of {which} differs: {why}"
                           )  # fmt: skip
        metric, x, was, now = max((p for p in points if p[0] == metrics[0]),
                                  key=lambda p: p[1], default=points[-1])  # fmt: skip
        said.append(f"{which}: {len(points)} values within tolerance, {metric} at step {x:g}: "
                    f"committed {was:.6g}, today {now:.6g}")  # fmt: skip
    return replace(b, action="read", how="replay matched",
                   why=f"replay of the first {steps} steps matches ({'; '.join(said)})"
                   )  # fmt: skip


def settle(decided: list[Baseline], slots: list[card.Slot], norm: str, figures: Path,
           quick: bool = False, runner: Runner | None = None,
           log: Callable[[str], None] = print) -> list[Baseline]:  # fmt: skip
    """The arms still to check replayed (check); every arm's line logged as it is settled, then
    the time the arms a replay sends to retraining add."""
    by_title = {s.title: s for s in slots}
    out = []
    for b in decided:
        if b.action == "replay":
            b = _feasible(check(b, by_title[b.slot], figures, runner or run_replay))
        log(b.line(norm))
        out.append(b)
    more = [b for b in out if b.action == "retrain" and b.how.startswith("replay")]
    if more:
        extra = sum(retrain_s(by_title[b.slot], b.arm, quick, figures) for b in more)
        log(f"card {norm}: {len(more)} baseline arms retrained after their replay: about "
            f"{extra / 60:.0f} min more of one core")  # fmt: skip
    return out


def of_arms(frame: pd.DataFrame, arms: tuple[str, ...]) -> pd.Series:
    """The runs.csv rows of these arms, each with its settings' (`ln/x/b2` of `ln/x`)."""
    pattern = "|".join(f"{re.escape(a)}(?:/.+)?" for a in arms)
    return frame["arm"].astype(str).str.fullmatch(pattern).astype(bool)


def retrained(decided: list[Baseline] | None, slot: card.Slot) -> tuple[str, ...]:
    """The slot's baseline arms the card retrains (run beside the norm's, into NAME+norm)."""
    return tuple(b.arm for b in decided or () if b.slot == slot.title and b.action == "retrain")


def retrain_s(slot: card.Slot, arm: str, quick: bool, figures: Path) -> float:
    """A retrained arm's seconds of one core: its committed jobs per seed, at their median wall
    time (a quick job: a minute), times the seeds the card runs."""
    _, jobs = committed(slot.reproduction, figures)
    mine = jobs[jobs["arm"] == arm]
    per_seed = len(mine) / max(1, mine["seed"].nunique())
    wall = QUICK_JOB_S if quick else float(mine["wall_time_s"].median())
    return (2 if quick else slot.initial) * per_seed * wall


def costs(decided: list[Baseline], slots: list[card.Slot], quick: bool,
          figures: Path) -> tuple[int, float, float]:  # fmt: skip
    """The arms still to replay, their replays' seconds, and the seconds of retraining all of
    them (the most the replays can add)."""
    by_title = {s.title: s for s in slots}
    checks = [b for b in decided if b.action == "replay"]
    replays = sum(replays_s(b, by_title[b.slot], figures) for b in checks)
    worst = sum(retrain_s(by_title[b.slot], b.arm, quick, figures) for b in checks)
    return len(checks), replays, worst


def replays_s(b: Baseline, slot: card.Slot, figures: Path) -> float:
    """The seconds of an arm's replays (one per stale version)."""
    runs, jobs = committed(b.reproduction, figures)
    stale = jobs[(jobs["arm"] == b.arm) & (jobs["code_version"].astype(str) != b.today)]
    firsts = stale.sort_values("seed", kind="stable").groupby("code_version").head(1)
    return sum(replay_s(slot, job, runs) for _, job in firsts.iterrows())


def markdown(decided: list[Baseline]) -> str:
    """The card md's table: per slot and baseline arm, read or retrained, and why."""
    columns = ["slot", "baseline (arm)", "trained under", "today", "baseline is", "why"]
    body = [(b.slot, f"{b.norm} ({b.arm})", ", ".join(b.versions) or "unknown", b.today,
             b.status, b.why or "-") for b in decided]  # fmt: skip
    return "\n".join([
        "## Baselines: read or retrained", "",
        "Each baseline arm's committed jobs (outputs/figures/NAME/jobs.csv, code_version: "
        "normlab.identity) against today's training code. A stale arm is replayed under today's "
        "code (its lowest seed per version it ran, its committed overrides, the slot's first "
        f"steps) and read where its logged values match the committed ones (|today - committed| "
        f"<= {TOLERANCE[0]:g} x |committed| + {TOLERANCE[1]:g}); otherwise it is retrained at the "
        "card's seeds into the card's own NAME+norm evidence and the norm compared with that.",
        "", markdown_table(columns, body), ""])  # fmt: skip
