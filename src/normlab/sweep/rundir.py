"""A run dir belongs to one run at a time and holds one config's run (docs/reliability.md).

`lock` takes an exclusive flock on `<run dir>/.run.lock`, held until the run's process ends (a
killed holder leaves no stale lock); a second run fails at once, naming the holder. A single
run's `Guard` is taken by the Hydra callback normlab.sweep.callbacks.RunDirGuard before Hydra
writes the run dir: it keeps the files Hydra overwrites (`.hydra/*.yaml`) and the length of its
log, so a run that fails before it starts leaves the dir as it found it (`restore`: a dir it
made is removed), and
`overwrite=true` moves an earlier run aside whole (`move_aside`). Standard library only: the
callback runs before torch loads.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from normlab.errors import RunDirError

log = logging.getLogger(__name__)
LOCK_FILE = ".run.lock"
OLD_PREFIX = ".old-"  # <run dir>/.old-<time>/: an earlier run moved aside by overwrite=true
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


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


def probe(dirs: Iterable[Path]) -> None:
    """Create (if needed) and write a file in each dir, so an unwritable dir fails before
    training instead of at the first checkpoint."""
    for folder in dirs:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".probe-")
            os.close(fd)
            os.unlink(tmp)
        except OSError as err:
            raise RunDirError(f"cannot write to {folder}: {err.strerror or err}") from err


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

    def __init__(self, run_dir: Path, hydra_subdir: str | None):
        self.run_dir = run_dir
        # the dirs this run makes (the run dir, and its parents not there yet): removed again
        # when it fails before it starts
        self.created = [d for d in (run_dir, *run_dir.parents) if not d.exists()]
        self.fd: int | None = lock(run_dir)
        self.hydra_dir = run_dir / hydra_subdir if hydra_subdir else None
        self.files = {}  # Hydra's files as they were: path -> bytes
        if self.hydra_dir is not None and self.hydra_dir.is_dir():
            self.files = {p: p.read_bytes() for p in self.hydra_dir.iterdir() if p.is_file()}
        self.logs = {p: p.stat().st_size for p in run_dir.glob("*.log") if p.is_file()}
        self.started = False  # set by start(); until then a failure restores the dir

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


def current() -> Guard | None:
    """The Guard of the single run in this process (None in a multirun job, on ranks other
    than 0 and when train() is called without Hydra's callbacks)."""
    return _guard


def release() -> None:
    global _guard
    if _guard is not None:
        _guard.finish()
        _guard = None
