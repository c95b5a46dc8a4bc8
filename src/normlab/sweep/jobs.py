"""A multirun job's place in its sweep, around the task function: the Hydra callback
normlab.sweep.callbacks.SweepJobs calls start (on_job_start) and end (on_job_end), and holds the
Job in between.

start: the job's identity (identity.config_hash, identity.code_version); a job whose row from an
earlier invocation of the sweep is finished with the same identity is reused, not run; else its
run dir is locked (a job another process runs now is not run: failed) and its row written as
running (a changed job's last.ckpt set aside: never resumed by the new job). Either way the run
is told through its guard (normlab.run.rundir: skip, or job with whether it resumes); the task
function (normlab.run.task) runs it and leaves its result there. end: the final row from that
result, the job's outcome (SweepExitCode reads them all). Standard library, omegaconf and yaml
only: the callback runs before torch loads.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict, read_write

from normlab import identity
from normlab.errors import RunDirError
from normlab.files import atomic_write
from normlab.run import rundir
from normlab.run.rundir import RESUMING, RUN_DIR  # noqa: F401  normlab.analysis.logs reads them here
from normlab.sweep import summary

log = logging.getLogger(__name__)
# What a job's train.log says as each run of it starts (normlab.analysis.logs reads its runs
# from them): the run's own lines (RUN_DIR, RESUMING), or, logged here, that it was reused.
SKIPPING = "skipping finished job "
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
    held: rundir.Guard | None = None  # the run's guard: the run leaves its result there
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


def _task_config(config: DictConfig) -> DictConfig:
    """The job's config as its task function gets it: without the hydra node."""
    task_cfg = copy.deepcopy(config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


def start(config: DictConfig) -> Job:
    """The job of config (a multirun job's, with its hydra node) in its sweep: reused, not run
    (its run dir in use: no row), or locked with its row written as running."""
    hc, cfg = config.hydra, _task_config(config)
    overrides, sweep_dir = " ".join(hc.overrides.task), Path(hc.sweep.dir)
    ident = {"config_hash": identity.config_hash(cfg),
             "code_version": identity.code_version()}  # fmt: skip
    job = Job(hc.job.num, overrides, sweep_dir, ident, summary.previous_row(sweep_dir, overrides))
    run_dir = Path(cfg.paths.output_dir)
    if job.reused:
        log.info(SKIPPING + "[%s] (%s)", overrides, job.before["run_dir"])  # type: ignore[index]
        summary.update_row(sweep_dir, {**job.before, "reused": 1})  # type: ignore[dict-item]
        rundir.skip(run_dir, job.earlier_objective(cfg.get("objective")))
        return job
    before = job.before or {}
    resume = f"job [{overrides}] was {before.get('status')}" if job.same else None
    try:
        job.held = rundir.job(run_dir, resume)  # another process runs this job now: leave it
    except RunDirError as err:
        log.error("job [%s] not run: %s", overrides, err)
        rundir.skip(run_dir, math.nan if cfg.get("objective") else None)  # a failed job's
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


def end(job: Job) -> None:
    """Write the job's final row from the result its run left on its guard (failed when the run
    left none), leave its outcome for SweepExitCode, release its run dir."""
    result = job.held.result if job.held is not None else None
    if result is not None:
        job.row.update(
            status=result["status"],
            error=result.get("error") or result.get("note", ""),
            wall_time_s=round(time.time() - job.started, 2),
            seed=result.get("seed"),
            **result["metrics"],
        )
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
    rundir.release()


def record_outcome(job: int, status: str) -> None:
    """Leave a multirun job's final status for SweepExitCode: a file named by the job number in
    the folder $NORMLAB_SWEEP_OUTCOMES (jobs may run in other processes: joblib, submitit)."""
    folder = os.environ.get(OUTCOMES_ENV)
    if folder:
        atomic_write(Path(folder) / str(job), status)
