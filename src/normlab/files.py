"""Writing files that other processes read: atomically (atomic_write), under a lock shared across
processes (file_lock), and a dir checked writable before a run needs it (probe). Standard
library only: Hydra's callbacks use it before torch loads."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from normlab.errors import RunDirError


def atomic_write(path: Path, text: str) -> None:
    """Write text to path via a temp file + rename: readers see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created, with its dir) across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
