"""The Hydra task function of train.py (main): train(cfg) as a single run, or as a multirun job.

A single run that fails on bad input or diverges exits non-zero with one line. A multirun job
never raises: its failure is its result, and the sweep goes on. Whoever runs the job in its
sweep says, from a Hydra callback before this runs, whether it runs at all and whether it
resumes, and reads its result after (on the run's rundir.Guard). A run or job ended by Ctrl+C
or SIGTERM prints where it is and the command that continues it (exit 128 + the signal).

normlab.run.main imports this module once a run is to run: a job its sweep does not run returns
before torch loads.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from normlab import layout, loggers
from normlab.errors import ConfigError, user_error
from normlab.run import rundir
from normlab.run.resume import read_checkpoint
from normlab.run.rundir import LAST, LAST_OR_NEW, RESUMING, RUN_DIR, run_dir
from normlab.run.training import OUTER_ENV, train  # OUTER_ENV: an outer command continues it

log = logging.getLogger(__name__)
FAILED: dict[str, Any] = {"status": "failed", "metrics": {}}


def _hydra() -> Any | None:
    return HydraConfig.get() if HydraConfig.initialized() else None


def main(cfg: DictConfig, validated: bool = False) -> float | None:
    """One run or multirun job of cfg; the metric a sweeper optimizes (objective).
    `validated`: cfg passed config.validate already (train.py checks a single run's config
    before torch loads)."""
    held = rundir.current()
    hc = _hydra()
    if not rundir.other_rank():
        log.info(RUN_DIR + "%s", run_dir(cfg).absolute())
    try:
        if hc is not None and hc.mode.name == "MULTIRUN":
            return _job(cfg, held, " ".join(hc.overrides.task))
        return _single_run(cfg, validated)
    except BaseException as err:
        signum = loggers.killed_by(err)
        if not signum:  # Ctrl+C, SIGTERM: where the run is and how to go on
            raise
        if held is not None and held.job:
            rundir.release()  # its dir is free for the command that continues it
        if not rundir.other_rank():
            text = interrupted(cfg, hc, signum)
            if os.environ.get(OUTER_ENV):  # one continue line per interruption: the outer one
                text = text.split("\ncontinue with:")[0]
            print(text, file=sys.stderr)
        raise SystemExit(128 + signum) from None


def _single_run(cfg: DictConfig, validated: bool) -> float | None:
    """train(cfg); a user's error, a failed write or a run that did not end ok: one line."""
    try:
        result, _ = train(cfg, validated=validated)
    except Exception as err:
        if loggers.killed_by(err):
            raise
        cause = user_error(err) or rundir.write_error(err, run_dir(cfg))
        if cause is None:
            raise
        raise SystemExit(f"error: {cause}") from None
    if result["status"] != "ok":
        raise SystemExit(f"error: run {result['status']}: {result['note']} ({run_dir(cfg)})")
    return objective(cfg, result)


def _job(cfg: DictConfig, held: rundir.Guard | None, overrides: str) -> float | None:
    """train(cfg) as a multirun job (resumed when `held` says so); its result left on `held`
    for its sweep, a failure logged and recorded there, not raised."""
    try:
        checkpoint = _resume_point(cfg, held, overrides)
        result, _ = train(cfg, checkpoint)
    except Exception as err:  # a failing job is recorded; the sweep goes on
        log.error("job [%s] failed:\n%s", overrides, traceback.format_exc())
        cause = user_error(err) or rundir.write_error(err, run_dir(cfg)) or err
        result = {**FAILED, "error": f"{type(cause).__name__}: {cause}"}
    if held is not None:
        held.result = {**result, "seed": result.get("seed", cfg.seed)}
    return objective(cfg, result)


def _resume_point(cfg: DictConfig, held: rundir.Guard | None, overrides: str) -> dict | None:
    """The last.ckpt a stopped earlier run of the same job left, when `held` resumes it (read
    once; ckpt_path set to it); None for a new job, or when it is damaged (moved aside: the job
    runs anew)."""
    last = run_dir(cfg) / "checkpoints" / "last.ckpt"
    if held is None or not held.resume or cfg.get("ckpt_path") is not None or not last.is_file():
        return None
    try:
        checkpoint = read_checkpoint(last, "last.ckpt")
    except ConfigError as err:  # a run killed while the file was copied in, a full disk
        aside = last.with_name(f"last.damaged-{time.strftime('%Y%m%d-%H%M%S')}.ckpt")
        last.replace(aside)
        log.warning("job [%s]: %s; moved it to %s, running the job from scratch",
                    overrides, err, aside)  # fmt: skip
        return None
    log.info("%s: " + RESUMING + "%s (step %d)", held.resume, last, checkpoint["global_step"])
    with open_dict(cfg):
        cfg.ckpt_path = LAST
    return checkpoint


def interrupted(cfg: DictConfig, hc: Any, signum: int) -> str:
    """Two lines for a run or sweep ended by a signal: where it is, and the command that
    continues it (the same overrides, its dir, and for a single run ckpt_path=last, or
    last_or_new before its first checkpoint; a multirun skips finished jobs and resumes the
    others)."""
    name = signal.Signals(signum).name
    start = layout.program("train.py", "normlab-train", "normlab.train")  # as it was started
    if hc is not None and hc.mode.name == "MULTIRUN":
        argv = [a for a in sys.argv[1:] if not a.startswith("hydra.sweep.dir=")]
        argv = argv if {"-m", "--multirun"} & set(argv) else ["-m", *argv]
        sweep_dir = Path(hc.sweep.dir).absolute()
        command = [*start, *argv, f"hydra.sweep.dir={sweep_dir}"]
        return (
            f"interrupted ({name}): sweep dir {sweep_dir}, job {hc.job.num} in "
            f"{run_dir(cfg).absolute()}\ncontinue with: {shlex.join(command)}"
        )
    here = run_dir(cfg).absolute()
    last = here / "checkpoints" / "last.ckpt"
    kept = [o for o in (hc.overrides.task if hc is not None else [])
            if not o.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir="))]  # fmt: skip
    resume = LAST if last.is_file() else LAST_OR_NEW
    command = [*start, *kept, f"hydra.run.dir={here}", f"ckpt_path={resume}"]
    where = "resumable from checkpoints/last.ckpt" if last.is_file() else "no checkpoint yet"
    return f"interrupted ({name}): run dir {here}, {where}\ncontinue with: {shlex.join(command)}"


def objective(cfg: DictConfig, result: dict[str, Any]) -> float | None:
    """The metric a sweeper optimizes (cfg.objective, e.g. val/acc); NaN when the run failed."""
    name = cfg.get("objective")
    if not name:
        return None
    value = result["metrics"].get(name, math.nan)
    return value if result["status"] == "ok" else math.nan
