"""The sweep summary: one row per multirun job (overrides -> status, final metrics, wall time).

Rows are keyed by the job's overrides (in any order), written under a file lock and replaced
atomically, so parallel jobs (joblib launcher) never lose each other's rows and a reader never
sees half a file.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# a job's identity (normlab.identity) and whether its row was reused from an earlier invocation
IDENTITY_COLUMNS = ["reused", "config_hash", "code_version"]
FIRST_COLUMNS = ["job", "overrides", "status", "error", "wall_time_s", "seed", "run_dir",
                 *IDENTITY_COLUMNS]  # fmt: skip


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


def _locked(sweep_dir: Path) -> contextlib.AbstractContextManager[None]:
    return file_lock(sweep_dir / ".summary.lock")


def read_summary(sweep_dir: str | Path) -> list[dict[str, str]]:
    path = Path(sweep_dir) / "summary.csv"
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else str(value)


def _markdown(rows: list[dict[str, str]], columns: list[str]) -> str:
    shown = [c for c in columns if c not in ("run_dir", "error")] + ["error"]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for row in rows:
        cells = [row.get(c, "").replace("|", "\\|").replace("\n", " ")[:200] for c in shown]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def same_job(a: str, b: str) -> bool:
    """Whether two override strings name the same job: the same overrides, in any order (a
    reproduction that moves an override between its lists runs the same job)."""
    return sorted(a.split()) == sorted(b.split())


def update_row(sweep_dir: str | Path, row: dict[str, Any]) -> None:
    """Insert or replace the row of the same job (same_job), or of the same run dir (which now
    holds this job); rewrite csv and md."""
    sweep_dir = Path(sweep_dir)
    with _locked(sweep_dir):
        rows = [
            r
            for r in read_summary(sweep_dir)
            if not same_job(r["overrides"], str(row["overrides"]))
            and not (row.get("run_dir") and r.get("run_dir") == str(row["run_dir"]))
        ]
        rows.append({k: _fmt(v) for k, v in row.items()})
        rows.sort(key=lambda r: int(r["job"]) if r.get("job", "").isdigit() else 1 << 30)
        metric_cols = sorted({k for r in rows for k in r} - set(FIRST_COLUMNS))
        columns = FIRST_COLUMNS + metric_cols
        with tempfile.SpooledTemporaryFile(mode="w+", newline="") as buf:
            writer = csv.DictWriter(buf, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
            buf.seek(0)
            atomic_write(sweep_dir / "summary.csv", buf.read())
        atomic_write(sweep_dir / "summary.md", _markdown(rows, columns))


FINISHED = ("ok", "diverged")  # a result; "failed" and "running" (killed) jobs are redone


def previous_row(sweep_dir: str | Path, overrides: str) -> dict[str, str] | None:
    """The row an earlier invocation of this sweep wrote for a job with these overrides."""
    return next((r for r in read_summary(sweep_dir) if same_job(r["overrides"], overrides)), None)
