"""Hydra callbacks (conf/hydra/default.yaml: hydra.callbacks): hooks around a multirun and each
of its jobs, outside the task function (normlab.run.task.main). A single run's is
normlab.run.callbacks.RunDirGuard."""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from normlab.sweep import jobs
from normlab.sweep.jobs import OUTCOMES_ENV

EXIT_JOBS_FAILED = 3  # a multirun ran every job, and some failed or diverged


class CreateSweepDir(Callback):
    """Create the sweep dir before the sweeper starts (Optuna's sqlite storage lives in it)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        Path(config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)


class SweepJobs(Callback):
    """A multirun job in its sweep (normlab.sweep.jobs): reused when it finished with the same
    identity, locked, resumed when stopped; its summary row and outcome written at its end.
    The job of this process is this callback's, from on_job_start to on_job_end."""

    def __init__(self) -> None:
        self.job: jobs.Job | None = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if HydraConfig.get().mode.name == "MULTIRUN":
            self.job = jobs.start(config)

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        job, self.job = self.job, None
        if job is not None:
            jobs.end(job)


class SweepExitCode(Callback):
    """After a multirun, print where its summary is; when a job failed or diverged, print one
    line more and exit with EXIT_JOBS_FAILED; every job has run and written its summary row by
    then. All ok: exit 0."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = Path(config.hydra.sweep.dir) / f".outcomes-{os.getpid()}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        os.environ[OUTCOMES_ENV] = str(folder)  # inherited by the launcher's worker processes

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        folder = os.environ.pop(OUTCOMES_ENV, None)
        if folder is None:
            return
        statuses = [p.read_text() for p in Path(folder).iterdir() if not p.name.startswith(".")]
        shutil.rmtree(folder, ignore_errors=True)
        sweep_dir = Path(config.hydra.sweep.dir).absolute()
        if (sweep_dir / "summary.md").is_file():
            print(f"summary: {sweep_dir / 'summary.md'} (and summary.csv)", flush=True)
        bad = Counter(status for status in statuses if status != "ok")
        if bad:
            counts = ", ".join(f"{n} {status}" for status, n in sorted(bad.items()))
            summary = Path(config.hydra.sweep.dir) / "summary.csv"
            print(f"error: {counts} of {len(statuses)} jobs ({summary})", file=sys.stderr)
            raise SystemExit(EXIT_JOBS_FAILED)
