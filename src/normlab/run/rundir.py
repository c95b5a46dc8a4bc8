"""A run dir belongs to one run at a time and holds one config's run (docs/reliability.md).

`lock` takes an exclusive flock on `<run dir>/.run.lock`, held until the run's process ends (a
killed holder leaves no stale lock); a second run fails at once, naming the holder. A single
run's `Guard` is taken by the Hydra callback normlab.run.callbacks.RunDirGuard before Hydra
writes the run dir: it keeps the files Hydra overwrites (`.hydra/*.yaml`) and the length of its
log, so a run that fails before it starts leaves the dir as it found it (`restore`: a dir it
made is removed), and `overwrite=true` moves an earlier run aside whole (`move_aside`).

A multirun job's Guard is taken by whoever runs the job in its sweep, from a Hydra callback
(normlab.sweep.callbacks.SweepJobs, before the task function): `job` locks the dir and says
whether the run resumes its last.ckpt; `skip` tells the run not to run (reused, or its dir in
use) and what it returns. The run leaves its result on the Guard (`result`) for that callback's
on_job_end, which releases it. Standard library only: the callbacks run before torch loads.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from normlab.errors import RunDirError
from normlab.files import probe

log = logging.getLogger(__name__)
LOCK_FILE = ".run.lock"
OLD_PREFIX = ".old-"  # <run dir>/.old-<time>/: an earlier run moved aside by overwrite=true
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")
LAST, LAST_OR_NEW = "last", "last_or_new"  # ckpt_path values naming this run dir's last.ckpt
# What a run's log says as it starts (normlab.analysis.logs reads a job's runs from them): its
# run dir, and that it resumes the run before.
RUN_DIR, RESUMING = "run dir: ", "resuming from "


def run_dir(cfg: Any) -> Path:
    """A run's dir: cfg.paths.output_dir (cfg a DictConfig: omegaconf is not imported here)."""
    return Path(cfg.paths.output_dir)


def lock(run_dir: Path) -> int:
    """Lock run_dir for this process: an open file descriptor (closing it releases the lock),
    or RunDirError naming the process that holds it."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise RunDirError(f"cannot write to run dir {run_dir}: {err.strerror or err}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 256).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise RunDirError(
            f"run dir {run_dir} is in use by {holder}: wait for that run to end, or run in "
            "another dir"
        ) from None
    os.ftruncate(fd, 0)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode())
    return fd


def other_rank() -> bool:
    """Whether this process is a data-parallel rank other than 0 (it shares rank 0's run dir)."""
    return any(os.environ.get(name, "0") not in ("", "0") for name in RANK_VARIABLES)


def claim(run_dir: Path, dirs: Iterable[Path], move_aside: bool) -> None:
    """A run starts writing: its dir and `dirs` (checkpoints) probed (an unwritable one fails
    now, not after an epoch), an earlier run of another config moved aside when `move_aside`
    (overwrite=true), and from now on a single run's dir is its own (Guard.start)."""
    probe([run_dir, *dirs])
    if move_aside and _guard is not None:
        log.info("overwrite=true: moved the earlier run to %s", _guard.move_aside())
    if _guard is not None:
        _guard.start()


def write_error(err: BaseException, run_dir: Path) -> RunDirError | None:
    """The failed write behind err (a file under run_dir, a full disk or a read-only file
    system), as one line; None for any other error."""
    run_dir = Path(os.path.abspath(run_dir))
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError):
            name = seen.filename
            inside = isinstance(name, str) and Path(os.path.abspath(name)).is_relative_to(run_dir)
            if inside or seen.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                return RunDirError(f"cannot write to run dir {run_dir}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return None


class Guard:
    """A single run's hold on its dir: the lock, and what was there before Hydra wrote."""

    def __init__(self, run_dir: Path, hydra_subdir: str | None, locked: bool = True):
        self.run_dir = run_dir
        # the dirs this run makes (the run dir, and its parents not there yet): removed again
        # when it fails before it starts
        self.created = [d for d in (run_dir, *run_dir.parents) if not d.exists()]
        self.fd: int | None = lock(run_dir) if locked else None
        self.hydra_dir = run_dir / hydra_subdir if hydra_subdir else None
        self.files = {}  # Hydra's files as they were: path -> bytes
        if self.hydra_dir is not None and self.hydra_dir.is_dir():
            self.files = {p: p.read_bytes() for p in self.hydra_dir.iterdir() if p.is_file()}
        self.logs = {p: p.stat().st_size for p in run_dir.glob("*.log") if p.is_file()}
        self.started = False  # set by start(); until then a failure restores the dir
        self.job = False  # a multirun job's: its sweep, not the run, decides what was there
        self.resume: str | None = None  # a job's: why it resumes its last.ckpt (logged)
        self.skip: tuple[float | None] | None = None  # a job not to run: (what the run returns,)
        self.result: dict[str, Any] | None = None  # the run's result ({'status', 'metrics', ...})

    def previous_config(self) -> str | None:
        """The .hydra/config.yaml of the run that was in the dir before this one, if any."""
        data = self.files.get(self.hydra_dir / "config.yaml") if self.hydra_dir else None
        return None if data is None else data.decode()

    def _earlier(self, path: Path) -> bool:
        """Whether path (an entry of the run dir) is an earlier run's file, not one Hydra
        writes at every start or this module's."""
        return not (
            path.name == LOCK_FILE
            or path.name.startswith(OLD_PREFIX)
            or path == self.hydra_dir
            or (path.suffix == ".log" and path.is_file())
        )

    def holds_run(self) -> bool:
        """Whether an earlier run started in this dir: its config and files of its own
        (checkpoints, metrics, trackers) are there."""
        return self.previous_config() is not None and any(
            self._earlier(p) for p in self.run_dir.iterdir()
        )

    def move_aside(self) -> Path:
        """Move the earlier run's files, its Hydra files and its log lines to
        <run dir>/.old-<time>/; return that dir."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        dest, n = self.run_dir / f"{OLD_PREFIX}{stamp}", 1
        while dest.exists():
            dest, n = self.run_dir / f"{OLD_PREFIX}{stamp}-{n}", n + 1
        dest.mkdir()
        for path in [p for p in self.run_dir.iterdir() if self._earlier(p)]:
            path.rename(dest / path.name)
        for path, data in self.files.items():
            (dest / path.parent.name).mkdir(exist_ok=True)
            (dest / path.parent.name / path.name).write_bytes(data)
        for path, size in self.logs.items():  # Hydra appends to the log file: split it
            data = path.read_bytes()
            (dest / path.name).write_bytes(data[:size])
            with open(path, "r+b") as f:
                f.write(data[size:])
                f.truncate()
        self.files, self.logs = {}, {}
        return dest

    def restore(self) -> None:
        """Put back Hydra's files and cut the log to its earlier length; a run dir this run
        made is removed, with the parents it made when they are empty."""
        if self.created:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            for folder in self.created[1:]:
                try:
                    folder.rmdir()
                except OSError:  # another run's dir is in it now
                    break
            return
        for path, data in self.files.items():
            if not path.is_file() or path.read_bytes() != data:
                path.write_bytes(data)
        for path, size in self.logs.items():
            if path.is_file() and path.stat().st_size > size:
                os.truncate(path, size)

    def start(self) -> None:
        """The run starts writing: from now on its dir is its own."""
        self.started = True

    def finish(self) -> None:
        """Restore the dir unless the run started; release the lock."""
        if not self.started:
            self.restore()
            self.started = True
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_guard: Guard | None = None


def guard(run_dir: Path, hydra_subdir: str | None) -> Guard:
    """Take the single run's Guard (finished at exit at the latest)."""
    global _guard
    _guard = Guard(run_dir, hydra_subdir)
    atexit.register(_guard.finish)
    return _guard


def job(run_dir: Path, resume: str | None) -> Guard:
    """Take a multirun job's Guard: its dir locked (RunDirError when in use); `resume`, why it
    resumes the last.ckpt in its dir (None: it runs anew). Released by release()."""
    global _guard
    _guard = Guard(run_dir, None)
    _guard.started, _guard.job, _guard.resume = True, True, resume
    return _guard


def skip(run_dir: Path, value: float | None) -> Guard:
    """A multirun job that is not to run (finished before, or its dir in use): the run returns
    `value` (its objective) at once, with nothing locked or written."""
    global _guard
    _guard = Guard(run_dir, None, locked=False)
    _guard.started, _guard.job, _guard.skip = True, True, (value,)
    return _guard


def current() -> Guard | None:
    """The Guard of the run in this process (None on ranks other than 0, in a multirun job
    nobody took one for, and when train() is called without Hydra's callbacks)."""
    return _guard


def release() -> None:
    global _guard
    if _guard is not None:
        _guard.finish()
        _guard = None
