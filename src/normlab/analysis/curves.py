"""Small helpers the Transformer and DiT analyses share: final values that know about divergence."""

from __future__ import annotations

import math

from normlab.analysis.logs import Run


def final(run: Run | None, key: str) -> float:
    """The last logged value of key for a finished run; inf for a diverged one; NaN if missing."""
    if run is None or run.status not in ("ok", "diverged"):
        return math.nan
    if run.status == "diverged":
        return math.inf
    return run.last(key)


def show(value: float, digits: int = 3) -> str:
    """A final value for a table: 'diverged' for inf, 'n/a' for a missing run."""
    if math.isnan(value):
        return "n/a"
    return "diverged" if math.isinf(value) else f"{value:.{digits}f}"


def decided(*values: float) -> bool:
    """True when no value is missing (NaN); inf (diverged) counts as a result."""
    return not any(math.isnan(v) for v in values)
