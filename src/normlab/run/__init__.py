"""One run: train.py's task function (main), which calls train(cfg) (build, fit, test), in its
run dir, locked by this run (rundir), resumed from a checkpoint (resume), its interrupt hint and
exit codes (task). Nothing here imports normlab.sweep: a sweep sets a job up from its Hydra
callbacks, through rundir.

    task.py      main: a single run or a multirun job; the interrupt hint; exit codes
    training.py  train = build + fit (lightning-hydra-template's train()), and their parts
    resume.py    ckpt_path, checking a checkpoint or an earlier run against the config
    rundir.py    the run dir's lock and guard (standard library only)
    callbacks.py the Hydra callback that takes a single run's guard before Hydra writes
    fid_lenet.py the LeNet fid_lenet measures in, trained by one run (python -m)

Importing this package loads neither torch nor Lightning: train.py imports it before it checks
the config (`python train.py --cfg job` and bad-input errors stay under a second).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from normlab.run import rundir

__all__ = ["main", "train", "build", "fit", "Objects"]
_TRAINING = ("train", "build", "fit", "Objects", "build_task", "build_callbacks",
             "build_loggers", "build_trainer")  # fmt: skip


def main(cfg: DictConfig, validated: bool = False) -> float | None:
    """train.py's task function: one run of cfg (task.main), unless whoever runs it as a
    multirun job said not to (rundir.skip): then what it said to return, without torch."""
    held = rundir.current()
    if held is not None and held.skip is not None:
        return held.skip[0]
    from normlab.run import task  # lazy: torch and Lightning (seconds), after the checks above

    return task.main(cfg, validated)


def __getattr__(name: str) -> Any:
    """normlab.run.train and the rest of training.py, imported on first use."""
    if name in _TRAINING:
        from normlab.run import training  # lazy: torch and Lightning (seconds), see above

        return getattr(training, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
