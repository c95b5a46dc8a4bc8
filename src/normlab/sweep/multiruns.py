"""Several multiruns of train.py in turn, in this one process:

    python -m normlab.sweep.multiruns '[["-m", "experiment=bn_lenet", ...], ...]'

run from the checkout. Each list is run as `python train.py ARGS` runs it (train.py executed as
__main__ with those arguments; from an installed normlab without a checkout, as `normlab-train
ARGS` runs it), so its jobs, run dirs and summary rows are the same; torch,
Lightning and torchmetrics load once here instead of once per multirun (about 5 s each on this
CPU, against quick jobs of a few seconds). A reproduction's grids run this way
(normlab.analysis.sweep.run).

Each multirun prints its command first. One whose jobs failed or diverged (EXIT_JOBS_FAILED)
does not stop the rest; any other non-zero exit (a bad config, Ctrl+C) stops them and is this
process's exit code. Otherwise the exit code is EXIT_JOBS_FAILED when some multirun's was, else 0.
"""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import signal
import sys
from pathlib import Path

from hydra.core.global_hydra import GlobalHydra

from normlab.sweep.callbacks import EXIT_JOBS_FAILED
from normlab.train import main as train_main

TRAIN = "train.py"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _code(exit: SystemExit) -> int:
    """The exit status Python gives a process ended by this SystemExit."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)  # SystemExit("error: ...") says its line and exits 1
    return 1


def _fresh_workers() -> None:
    """Stop the joblib worker pool a multirun leaves for reuse (hydra/launcher=joblib): the next
    multirun's workers must start with its own environment (its jobs' outcome folder,
    normlab.sweep.jobs.OUTCOMES_ENV), as they do in a process of their own."""
    reusable = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(reusable, "_executor", None)
    if executor is not None:
        executor.shutdown(wait=True, kill_workers=True)


def run(args: list[str]) -> int:
    """`python train.py ARGS` in this process; its exit code."""
    checkout = Path(TRAIN).is_file()  # run from a checkout (normlab.analysis.sweep.run's cwd)
    print("+ " + " ".join([sys.executable, TRAIN] if checkout else ["normlab-train"]), *args,
          flush=True)  # fmt: skip
    sys.argv = [TRAIN if checkout else "normlab-train", *args]
    try:
        if checkout:
            runpy.run_path(TRAIN, run_name="__main__")
        else:
            train_main()
        return 0
    except SystemExit as exit:
        return _code(exit)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        GlobalHydra.instance().clear()
        _fresh_workers()


def follow_parent() -> None:
    """Ctrl+C this process group (these multiruns and their joblib workers) if the process that
    started it dies first (Linux: PR_SET_PDEATHSIG, by way of SIGUSR2), so its jobs save their
    state and stop rather than train on with no one to read them."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    signal.signal(signal.SIGUSR2, lambda *_: os.killpg(0, signal.SIGINT))
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGUSR2)
    if os.getppid() != parent:  # it died before prctl took effect
        os.killpg(0, signal.SIGINT)


def main(runs: list[list[str]]) -> int:
    failed = False
    for args in runs:
        code = run(args)
        if code not in (0, EXIT_JOBS_FAILED):
            return code
        failed |= code == EXIT_JOBS_FAILED
    return EXIT_JOBS_FAILED if failed else 0


if __name__ == "__main__":
    try:
        follow_parent()
        raise SystemExit(main(json.loads(sys.argv[1])))
    except KeyboardInterrupt:  # Ctrl+C between multiruns (inside one, its run says how to resume)
        print("interrupted (SIGINT)", file=sys.stderr)
        raise SystemExit(130) from None
