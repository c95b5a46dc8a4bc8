"""Jobs run but not yet read: a --subset run whose seeds would leave a grid at a count none of
the design's looks (reproduce.off_look) keeps its rows in NAME/pending/{runs,jobs}.csv beside the
evidence, committed with it. A grid that takes more than one session to reach its next look so
loses nothing to a new machine (whose sweep dirs are gone): --decide counts the pending seeds as
run, and the run that completes the look lands them with its own. No claim reads them before.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from normlab.files import atomic_write
from normlab.sweep.summary import job_key

RUN_KEY = ["arm", "seed"]  # a runs.csv row's job (an arm's setting, `batchnorm/b2`, is its arm)
JOB_KEY = ["arm", "seed", "overrides"]  # a jobs.csv row's
Mask = Callable[[pd.DataFrame], pd.Series]


def paths(evidence: dict[str, Path]) -> dict[str, Path]:
    """Where NAME's pending rows wait: NAME/pending/{runs,jobs}.csv."""
    folder = evidence["runs"].parent / "pending"
    return {"runs": folder / "runs.csv", "jobs": folder / "jobs.csv"}


def read(path: Path) -> pd.DataFrame | None:
    """A runs.csv or jobs.csv as reproduce writes it (empty cells of its numbers read as NaN, of
    its words as ''), or None where there is none."""
    if not path.is_file():
        return None
    return pd.read_csv(path, keep_default_na=False,
                       na_values={"wall_time_s": [""], "x": [""], "value": [""]})  # fmt: skip


def jobs(evidence: dict[str, Path], with_pending: bool = True) -> pd.DataFrame | None:
    """The jobs NAME has run: its evidence's jobs.csv and (`with_pending`) the pending ones that
    are not in it (landed, not yet released)."""
    landed = read(evidence["jobs"])
    waiting = read(paths(evidence)["jobs"]) if with_pending else None
    if waiting is None:
        return landed
    if landed is None:
        return waiting
    return pd.concat([landed, _without(waiting, landed, JOB_KEY)], ignore_index=True)


def replaced(jobs_: pd.DataFrame | None, landing: pd.DataFrame) -> pd.DataFrame:
    """jobs.csv rows with a landing's in place of the same jobs' (a job run again)."""
    if jobs_ is None:
        return landing
    return pd.concat([_without(jobs_, landing, JOB_KEY), landing], ignore_index=True)


def _without(frame: pd.DataFrame, other: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """frame's rows but those of the jobs in other (the same `columns`)."""
    return frame[~_keys(frame, columns).isin(set(_keys(other, columns)))]


def _keys(frame: pd.DataFrame, columns: list[str]) -> pd.Series:
    """Each row's job, as one string of its `columns` (those the frame has); its overrides in any
    order (normlab.sweep.summary.job_key)."""
    held = [c for c in columns if c in frame]
    if frame.empty:
        return pd.Series([], index=frame.index, dtype=str)
    cells = frame[held].astype(str)
    if "overrides" in cells:
        cells["overrides"] = cells["overrides"].map(job_key)
    return cells.agg("\x1f".join, axis=1)


def join(
    evidence: dict[str, Path], data: pd.DataFrame, jobs_: pd.DataFrame, rows: Mask, ran: Mask,
    held: Callable[[str], bool],
) -> tuple[pd.DataFrame, pd.DataFrame, Mask, Mask]:  # fmt: skip
    """This landing's rows (runs, jobs, and the masks of the jobs it ran) with the pending rows of
    the arms it lands (`held`: whether an arm is one of its grids') that it did not run again."""
    pending = {k: read(p) for k, p in paths(evidence).items()}
    if pending["runs"] is None or pending["jobs"] is None:
        return data, jobs_, rows, ran
    mine_runs, mine_jobs = data[rows(data)], jobs_[ran(jobs_)]
    p_runs = pending["runs"][pending["runs"]["arm"].astype(str).map(held)]
    p_jobs = pending["jobs"][pending["jobs"]["arm"].astype(str).map(held)]
    p_runs, p_jobs = _without(p_runs, mine_runs, RUN_KEY), _without(p_jobs, mine_jobs, JOB_KEY)
    run_keys, job_keys = set(_keys(p_runs, RUN_KEY)), set(_keys(p_jobs, JOB_KEY))

    def rows_too(frame: pd.DataFrame) -> pd.Series:
        return rows(frame) | _keys(frame, RUN_KEY).isin(run_keys)

    def ran_too(frame: pd.DataFrame) -> pd.Series:
        return ran(frame) | _keys(frame, JOB_KEY).isin(job_keys)

    return (pd.concat([mine_runs, p_runs], ignore_index=True),
            pd.concat([mine_jobs, p_jobs], ignore_index=True), rows_too, ran_too)  # fmt: skip


def release(evidence: dict[str, Path], runs: pd.DataFrame, jobs_: pd.DataFrame,
            fmt: str) -> None:  # fmt: skip
    """Drop from pending the jobs now in the evidence (`runs`, `jobs_`: the rows landed); the
    folder goes with its last row."""
    where = paths(evidence)
    for key, landed, columns in (("runs", runs, RUN_KEY), ("jobs", jobs_, JOB_KEY)):
        frame = read(where[key])
        if frame is None:
            continue
        left = _without(frame, landed, columns)
        if left.empty:
            where[key].unlink()
        else:
            atomic_write(where[key], left.to_csv(index=False, float_format=fmt))
    folder = where["runs"].parent
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def note(evidence: dict[str, Path]) -> str:
    """The md's word on the jobs pending ('' where none): each arm's seeds, arms with the same
    seeds together; those the evidence holds are read (a look's landing draws its md before it
    releases them)."""
    frame, landed = read(paths(evidence)["jobs"]), read(evidence["jobs"])
    if frame is not None and landed is not None:
        frame = _without(frame, landed, JOB_KEY)
    if frame is None or frame.empty:
        return ""
    by_seeds: dict[tuple[int, ...], list[str]] = {}
    for arm, mine in frame.groupby("arm", sort=True):
        by_seeds.setdefault(tuple(sorted({int(s) for s in mine["seed"]})), []).append(str(arm))
    held = "; ".join(f"{', '.join(arms)} seed(s) {', '.join(map(str, s))}"
                     for s, arms in sorted(by_seeds.items()))  # fmt: skip
    return (f"Run, not yet read: {held} ({len(frame)} jobs, their rows in "
            f"{evidence['runs'].parent.name}/pending/). With them a grid would hold a seed count "
            "none of its looks, or a seed some of whose jobs did not run; the run that completes "
            "the look (`--decide`) lands them with its own, and reruns none but a seed's that is "
            "not whole.")
