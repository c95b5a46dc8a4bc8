"""The sweep summary: one row per multirun job (overrides -> status, final metrics, wall time).

Rows are keyed by the job's overrides (in any order), written under a file lock and replaced
atomically, so parallel jobs (joblib launcher) never lose each other's rows and a reader never
sees half a file.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

# atomic_write and file_lock are also read from here by analysis/readme.py and scripts/reproduce.py
from normlab.files import atomic_write, file_lock
from normlab.tables import markdown_table

log = logging.getLogger(__name__)
# a job's identity (normlab.identity) and whether its row was reused from an earlier
# invocation
IDENTITY_COLUMNS = ["reused", "config_hash", "code_version"]
FIRST_COLUMNS = ["job", "overrides", "status", "error", "wall_time_s", "seed", "run_dir",
                 *IDENTITY_COLUMNS]  # fmt: skip


def _locked(sweep_dir: Path) -> contextlib.AbstractContextManager[None]:
    return file_lock(sweep_dir / ".summary.lock")


KEY_COLUMNS = ("job", "overrides", "status", "run_dir")  # what every row must have


def read_summary(sweep_dir: str | Path) -> list[dict[str, str]]:
    """The rows of sweep_dir/summary.csv; ValueError naming the file when it is damaged."""
    path = Path(sweep_dir) / "summary.csv"
    if not path.exists():
        return []
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            missing = [c for c in KEY_COLUMNS if c not in (reader.fieldnames or [])]
    except (csv.Error, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is damaged: {err}") from err
    if missing:
        raise ValueError(f"{path} is damaged: no column {', '.join(missing)}")
    for number, row in enumerate(rows, start=2):
        if None in row or any(row.get(c) is None for c in KEY_COLUMNS):
            raise ValueError(f"{path} is damaged: line {number} has the wrong number of fields")
    return rows


def _job_rows(sweep_dir: Path) -> list[dict[str, str]]:
    """A row per job dir of the sweep (<job number>_<overrides>/.hydra/overrides.yaml), its
    outcome unknown: status failed, so the job is run again."""
    rows = []
    for overrides_file in sorted(sweep_dir.glob("*/.hydra/overrides.yaml")):
        job_dir = overrides_file.parent.parent
        number = job_dir.name.split("_", 1)[0]
        try:
            overrides = yaml.safe_load(overrides_file.read_text()) or []
        except (OSError, yaml.YAMLError):
            continue
        rows.append({
            "job": number if number.isdigit() else "",
            "overrides": " ".join(str(o) for o in overrides),
            "status": "failed",
            "error": "row rebuilt from the job dir: its outcome was lost with a damaged "
                     "summary.csv",
            "run_dir": str(job_dir),
        })  # fmt: skip
    return rows


def _rows(sweep_dir: Path) -> list[dict[str, str]]:
    """read_summary; a damaged summary.csv is renamed beside it (summary.csv.damaged-<time>)
    and its rows rebuilt from the job dirs, with a warning. Call under _locked."""
    try:
        return read_summary(sweep_dir)
    except ValueError as err:
        path = sweep_dir / "summary.csv"
        backup = path.with_name(f"summary.csv.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        path.replace(backup)
        rows = _job_rows(sweep_dir)
        _write(sweep_dir, rows)
        log.warning("%s; moved it to %s and rebuilt %d rows from the job dirs (their jobs run "
                    "again)", err, backup, len(rows))  # fmt: skip
        return rows


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else str(value)


def _markdown(rows: list[dict[str, str]], columns: list[str]) -> str:
    shown = [c for c in columns if c not in ("run_dir", "error")] + ["error"]
    return markdown_table(shown, ([row.get(c, "") for c in shown] for row in rows), 200) + "\n"


def job_key(overrides: str) -> str:
    """A job's overrides in one order: the same for the same overrides in any order (a
    reproduction that moves an override between its lists, or a sweep that lists its keys in
    another order, runs the same job)."""
    return " ".join(sorted(overrides.split()))


def same_job(a: str, b: str) -> bool:
    """Whether two override strings name the same job (job_key)."""
    return job_key(a) == job_key(b)


def update_row(sweep_dir: str | Path, row: dict[str, Any]) -> None:
    """Insert or replace the row of the same job (same_job), or of the same run dir (which now
    holds this job); rewrite csv and md."""
    sweep_dir = Path(sweep_dir)
    with _locked(sweep_dir):
        rows = [
            r
            for r in _rows(sweep_dir)
            if not same_job(r["overrides"], str(row["overrides"]))
            and not (row.get("run_dir") and r.get("run_dir") == str(row["run_dir"]))
        ]
        rows.append({k: _fmt(v) for k, v in row.items()})
        _write(sweep_dir, rows)


def _write(sweep_dir: Path, rows: list[dict[str, str]]) -> None:
    """Rewrite summary.csv and summary.md with rows (sorted by job). Call under _locked."""
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
    with _locked(Path(sweep_dir)):
        rows = _rows(Path(sweep_dir))
    return next((r for r in rows if same_job(r["overrides"], overrides)), None)
