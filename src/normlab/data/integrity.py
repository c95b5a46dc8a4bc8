"""Checksums of dataset files, verified once per file version and cached."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from normlab.errors import DataError
from normlab.summary import atomic_write

CACHE = Path(os.environ.get("NORMLAB_CACHE", Path.home() / ".cache" / "normlab")) / "verified.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _key(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"


def _read_cache() -> dict[str, str]:
    try:
        return json.loads(CACHE.read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(cache: dict[str, str]) -> None:
    try:
        atomic_write(CACHE, json.dumps(cache, indent=0))
    except OSError:
        pass  # a read-only home only costs a re-hash next time


def digest(path: Path) -> str:
    """sha256 of a file, from the cache when this file version (path, size, mtime) was hashed."""
    path = Path(path)
    cache = _read_cache()
    key = _key(path)
    if key not in cache:
        cache[key] = sha256(path)
        _write_cache(cache)
    return cache[key]


def verify(path: Path, expected: str, hint: str) -> None:
    """Raise DataError unless path's sha256 is `expected`; a file version is hashed once."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"missing data file {path}. {hint}")
    actual = digest(path)
    if actual != expected:
        raise DataError(
            f"corrupted or truncated data file {path} ({path.stat().st_size} bytes): sha256 "
            f"{actual[:12]}... but the release has {expected[:12]}... Delete it and {hint}"
        )
