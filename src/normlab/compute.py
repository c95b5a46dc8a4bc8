"""Process-level compute settings of a run that are not torch's: the C heap."""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

KEEP_BYTES = 2**30  # blocks up to 1 GiB come from the heap, and up to 1 GiB free stays there
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>


def keep_heap() -> bool:
    """Keep freed memory in the process (glibc): True if set, False (with a warning) if not glibc.

    glibc gives blocks above its mmap threshold (at most 32 MiB by default) their own mapping and
    returns it to the OS when freed, and trims the heap top; every new full-size tensor then
    starts on fresh pages, and the page faults can cost as much as the arithmetic on them
    (scripts/bench.py --keep-heap). Raising both thresholds to 1 GiB keeps the memory for reuse:
    faster, at the cost of a resident size that stays at its peak.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES) and libc.mallopt(
            _M_TRIM_THRESHOLD, KEEP_BYTES
        )
    except (OSError, AttributeError):
        ok = False
    if not ok:
        log.warning("keep_heap: no glibc mallopt on this system; the C heap is left as it is")
    return bool(ok)
