"""A multirun job's place in its sweep, around the task function: the Hydra callback
normlab.sweep.callbacks.SweepJobs calls start (on_job_start) and end (on_job_end).

start: the job's identity (identity.config_hash, identity.code_version); a job whose row from an
earlier invocation of the sweep is finished with the same identity is reused, not run; else its
run dir is locked (a job another process runs now is not run: failed) and its row written as
running (a changed job's last.ckpt set aside: never resumed by the new job). The task function
(normlab.sweep.task) runs it, resuming a stopped job, and hands its result to finish. end: the
final row, the job's outcome (SweepExitCode reads them all) and the lock released. Standard
library, omegaconf and yaml only: the callback runs before torch loads.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict, read_write

from normlab.errors import RunDirError
from normlab.sweep import identity, rundir, summary

log = logging.getLogger(__name__)
# What a job's train.log says as each run of it starts (normlab.analysis.logs reads its runs
# from them): its run dir, that it resumes the run before, or, logged here, that it was reused.
RUN_DIR, RESUMING, SKIPPING = "run dir: ", "resuming from ", "skipping finished job "
OUTCOMES_ENV = "NORMLAB_SWEEP_OUTCOMES"  # the folder a multirun's jobs leave their status in


@dataclass
class Job:
    """One multirun job of this process, from on_job_start to on_job_end."""

    num: int
    overrides: str  # its overrides, space-joined: its key in summary.csv
    sweep_dir: Path
    ident: dict[str, str]  # config_hash and code_version
    before: dict[str, str] | None  # its row from an earlier invocation of the sweep
    row: dict[str, Any] = field(default_factory=dict)  # what this invocation writes (running)
    lock: int | None = None  # the run dir's lock while it runs
    started: float = 0.0  # when its row was written as running

    @property
    def same(self) -> bool:
        """Whether an earlier invocation ran this job with the same identity."""
        before = self.before
        return before is not None and all(before.get(k) == v for k, v in self.ident.items())

    @property
    def reused(self) -> bool:
        return self.same and self.before["status"] in summary.FINISHED  # type: ignore[index]

    def earlier_objective(self, name: str | None) -> float | None:
        """A reused job's objective (cfg.objective) from its earlier row: None when not set."""
        value = self.before.get(name or "")  # type: ignore[union-attr]
        return float(value) if value not in (None, "") else None

    def release(self) -> None:
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


_current: Job | None = None


def current() -> Job | None:
    """The job this process runs now (None outside a multirun job)."""
    return _current


def _task_config(config: DictConfig) -> DictConfig:
    """The job's config as its task function gets it: without the hydra node."""
    task_cfg = copy.deepcopy(config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


def start(config: DictConfig) -> Job:
    """The job of config (a multirun job's, with its hydra node) in its sweep: reused, not run
    (its run dir in use: no row), or locked with its row written as running."""
    global _current
    hc, cfg = config.hydra, _task_config(config)
    overrides, sweep_dir = " ".join(hc.overrides.task), Path(hc.sweep.dir)
    ident = {"config_hash": identity.config_hash(cfg),
             "code_version": identity.code_version()}  # fmt: skip
    job = _current = Job(hc.job.num, overrides, sweep_dir, ident,
                         summary.previous_row(sweep_dir, overrides))  # fmt: skip
    run_dir = Path(cfg.paths.output_dir)
    if job.reused:
        log.info(SKIPPING + "[%s] (%s)", overrides, job.before["run_dir"])  # type: ignore[index]
        summary.update_row(sweep_dir, {**job.before, "reused": 1})  # type: ignore[dict-item]
        return job
    try:
        job.lock = rundir.lock(run_dir)  # another process runs this job now: leave it
    except RunDirError as err:
        log.error("job [%s] not run: %s", overrides, err)
        return job
    last = run_dir / "checkpoints" / "last.ckpt"
    if job.before is not None and not job.same:
        changed = [k for k, v in ident.items() if job.before.get(k) != v]
        log.info("job [%s] changed (%s): running it again", overrides, ", ".join(changed))
        if last.is_file():  # a checkpoint of the old job must never be resumed by the new one
            last.replace(last.with_name("last.stale.ckpt"))
    job.row = {"job": job.num, "overrides": overrides, "status": "running",
               "run_dir": str(run_dir), "reused": 0, **ident}  # fmt: skip
    summary.update_row(sweep_dir, job.row)
    job.started = time.time()
    return job


def finish(job: Job, result: dict[str, Any], seed: Any) -> None:
    """The task function's result of the job ({'status', 'metrics', and 'error' or 'note'})."""
    job.row.update(
        status=result["status"],
        error=result.get("error") or result.get("note", ""),
        wall_time_s=round(time.time() - job.started, 2),
        seed=result.get("seed", seed),
        **result["metrics"],
    )


def end() -> None:
    """Write the job's final row (failed when its task function never reported), leave its
    outcome for SweepExitCode, release its run dir."""
    global _current
    job, _current = _current, None
    if job is None:
        return
    if job.reused:
        outcome = job.before["status"]  # type: ignore[index]
    elif not job.row:  # not run: its run dir was in use
        outcome = "failed"
    else:
        if job.row["status"] == "running":
            job.row.update(status="failed", error="the job ended without a result")
        summary.update_row(job.sweep_dir, job.row)
        outcome = job.row["status"]
    record_outcome(job.num, outcome)
    job.release()


def record_outcome(job: int, status: str) -> None:
    """Leave a multirun job's final status for SweepExitCode: a file named by the job number in
    the folder $NORMLAB_SWEEP_OUTCOMES (jobs may run in other processes: joblib, submitit)."""
    folder = os.environ.get(OUTCOMES_ENV)
    if folder:
        summary.atomic_write(Path(folder) / str(job), status)
