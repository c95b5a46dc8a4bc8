"""Checksums of dataset files, hashed from their content on every check, and atomic unpacking.

There is no cache of verified files: a cache keyed by path, size and mtime trusts a file that was
changed in place with its mtime kept. Hashing is cheap next to reading: sha256 of the 55 MB of
unpacked Fashion-MNIST takes about 0.05-0.1 s (SHA-NI, 2 busy cores), tiny Shakespeare ~1 ms.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import zlib
from pathlib import Path

from normlab.errors import DataError

BLOCK = 1 << 20


def cache_dir() -> Path:
    """normlab's writable cache folder: $NORMLAB_CACHE, default ~/.cache/normlab."""
    return Path(os.environ.get("NORMLAB_CACHE") or Path.home() / ".cache" / "normlab")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, expected: str, hint: str) -> None:
    """Raise DataError unless path's sha256 (hashed now, from its bytes) is `expected`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"missing data file {path}. {hint}")
    actual = sha256(path)
    if actual != expected:
        raise DataError(
            f"corrupted or truncated data file {path} ({path.stat().st_size} bytes): sha256 "
            f"{actual[:12]}... but the release has {expected[:12]}... Delete it and {hint}"
        )


def gunzip(src: Path, dst: Path, expected: str) -> None:
    """Unpack the gzip file src to dst, whose sha256 must be `expected`: written to a temp file
    in dst's folder, hashed on the way and moved in with one os.replace, so dst is either absent
    or the whole verified file (an interrupted unpack leaves no file at dst).

    OSError when no temp file can be made in dst's folder (read-only: the caller may try another
    folder); DataError for a broken .gz, a wrong result or a failed write."""
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".part")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, gzip.open(src, "rb") as f:
            try:
                for block in iter(lambda: f.read(BLOCK), b""):
                    digest.update(block)
                    out.write(block)
            except (EOFError, zlib.error, gzip.BadGzipFile) as err:
                raise DataError(f"corrupted or truncated data file {src}: {err}") from None
        if digest.hexdigest() != expected:
            raise DataError(
                f"{src} unpacks to sha256 {digest.hexdigest()[:12]}... but the release's "
                f"{dst.name} has {expected[:12]}...: corrupted or not the official file"
            )
        os.replace(tmp, dst)
    except OSError as err:  # disk full, quota...
        raise DataError(f"unpacking {src} into {dst.parent} failed ({err})") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def clause(err: BaseException) -> str:
    """An error as one clause: the last line of its message, without urllib's <...>
    (`urlopen error [Errno -2] Name or service not known`)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = (lines[-1] if lines else type(err).__name__).strip("<>")
    return text.removeprefix("urlopen error ")
