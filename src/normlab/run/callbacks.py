"""The run's Hydra callback (conf/hydra/default.yaml: hydra.callbacks.run_dir): a single run's
hold on its run dir, taken before Hydra writes there and released at its end. (A multirun job's
is taken and released by its sweep's callback, normlab.sweep.callbacks.SweepJobs.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from normlab.errors import RunDirError
from normlab.run import rundir


class RunDirGuard(Callback):
    """A single run locks its run dir and keeps what Hydra is about to overwrite there, before
    Hydra writes (normlab.run.rundir). A dir in use fails at once, with nothing written; ranks
    other than 0 share rank 0's dir and hold nothing."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if rundir.other_rank():
            return
        try:
            rundir.guard(Path(str(config.hydra.run.dir)).absolute(), config.hydra.output_subdir)
        except RunDirError as err:  # Hydra turns a callback's exception into a warning
            raise SystemExit(f"error: {err}") from None

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        rundir.release()
