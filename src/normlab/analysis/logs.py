"""Reading run logs: a sweep's summary.csv and each job's Lightning metrics.csv.

Every number a figure shows comes through here, from files a run wrote: nothing is typed in.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normlab.config import register_resolvers
from normlab.sweep import jobs
from normlab.sweep.summary import FIRST_COLUMNS, read_summary

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
# the lines normlab.sweep logs as a job's run starts: its first line (normlab.sweep.task), this
# run continuing the one before, and (normlab.sweep.jobs, before the run's first line) a reuse
RUN_START, RESUMED = f" - {jobs.RUN_DIR}", f": {jobs.RESUMING}"
JOBS_LOG, SKIPPED = f"[{jobs.log.name}]", jobs.SKIPPING


def parse_overrides(text: str) -> dict[str, str]:
    """'norm=batchnorm batch=32' -> {'norm': 'batchnorm', 'batch': '32'} (values kept as text)."""
    pairs = {}
    for item in text.split():
        key, _, value = item.partition("=")
        # Hydra records an interpolation given as an override escaped: ${b} as $\{b\}, and a
        # resolver's ${r:b} as $\{r\:b\}
        unescaped = value.replace("\\{", "{").replace("\\}", "}").replace("\\:", ":")
        pairs[key.lstrip("+~")] = unescaped
    return pairs


def metrics_file(run_dir: Path) -> Path | None:
    """The CSV logger's metrics.csv somewhere below a run dir (None when the run wrote none)."""
    direct = run_dir / "csv" / "metrics.csv"
    if direct.is_file():
        return direct
    found = sorted(run_dir.rglob("metrics.csv"))
    return found[0] if found else None


def earlier_runs_s(run_dir: Path) -> float:
    """Seconds a job's earlier runs took, when it was stopped and resumed: from its train.log,
    each run its last run resumed (in a chain) from its 'run dir:' line to its last timestamped
    line (the time a stopped run worked past its last line is not counted); 0 for a job that
    ran once. Invocations that found it finished (reused) and an earlier job run again from
    scratch in the same dir (its config or code changed) are not its runs."""
    path = run_dir / "train.log"
    if not path.is_file():
        return 0.0
    runs: list[list] = []  # [start, end, kind]: kind fresh, resume or reuse
    pending = "fresh"  # the kind normlab.sweep.jobs logged for the next run, before its run dir
    for line in path.read_text(errors="replace").splitlines():
        stamp = STAMP.match(line)
        if stamp is None:
            continue
        if JOBS_LOG in line:
            pending = "reuse" if SKIPPED in line else "fresh"
            continue
        when = pd.Timestamp(stamp[1].replace(",", "."))
        if RUN_START in line or not runs:
            runs.append([when, when, pending])
            pending = "fresh"
        runs[-1][1] = when
        if RESUMED in line:
            runs[-1][2] = "resume"
    worked = [r for r in runs if r[2] != "reuse"]
    total, i = 0.0, len(worked) - 1
    while i > 0 and worked[i][2] == "resume":
        total += (worked[i - 1][1] - worked[i - 1][0]).total_seconds()
        i -= 1
    return total


def read_metrics(run_dir: Path) -> pd.DataFrame:
    """All rows of a run's metrics.csv (empty frame when there is none)."""
    path = metrics_file(run_dir)
    if path is None or path.stat().st_size == 0:
        return pd.DataFrame()
    return pd.read_csv(path)


@dataclass
class Run:
    """One job of a sweep: its overrides, status, final metrics and logged time series."""

    overrides: dict[str, str]
    status: str
    run_dir: Path
    final: dict[str, float] = field(default_factory=dict)
    metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    error: str = ""
    wall_time_s: float = math.nan  # all its runs' (a stopped and resumed job's too)
    reused: int = 0  # 1: an invocation found it finished with the same identity and kept it
    code_version: str = ""

    def get(self, key: str, default: str = "") -> str:
        """The value this job gave an override key (e.g. 'norm'), or default."""
        return self.overrides.get(key, default)

    def series(self, key: str, x: str = "step") -> pd.DataFrame:
        """Rows of metrics.csv where `key` was logged, as columns [x, key], sorted by x."""
        if key not in self.metrics.columns or x not in self.metrics.columns:
            return pd.DataFrame(columns=[x, key])
        rows = self.metrics[[x, key]].dropna()
        return rows.sort_values(x, kind="stable").reset_index(drop=True)

    def setting(self, key: str, default: object = None) -> object:
        """A key of the job's composed config (<run dir>/.hydra/config.yaml), resolved in it;
        default when the file or the key is missing."""
        if self._config is None:
            return default
        value = OmegaConf.select(self._config, key, default=default)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    @cached_property
    def _config(self) -> DictConfig | None:
        """The job's composed config, read once (None when the run dir holds none)."""
        path = self.run_dir / ".hydra" / "config.yaml"
        if not path.is_file():
            return None
        register_resolvers()
        return OmegaConf.load(path)  # type: ignore[return-value]

    @property
    def arm(self) -> str:
        """The arm the job ran as: its config's `arm` (set by scripts/reproduce.py), resolved;
        the `arm=` override as given when the run dir holds no config."""
        return str(self.setting("arm", None) or self.get("arm"))

    def last(self, key: str) -> float:
        """The last logged value of `key` (metrics.csv first, then the summary row); NaN if none."""
        values = self.series(key)[key] if key in self.metrics.columns else []
        if len(values):
            return float(values.iloc[-1])
        return self.final.get(key, math.nan)


def _float(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def same_value(logged: str | None, given: str) -> bool:
    """Whether an override value Hydra logged is the one given (it writes false as False,
    3e-3 as 0.003)."""
    if logged is None:
        return False
    if logged == given or logged.lower() == given.lower():
        return True
    try:
        return float(logged) == float(given)
    except ValueError:
        return False


def _resolve(run_dir: str, sweep_dir: Path) -> Path:
    """A job's run dir: as written if it exists, else inside this sweep dir (a relative run dir
    written by a fixture; an absolute one of a sweep since moved, e.g. from another --root)."""
    path = Path(run_dir)
    if path.exists():
        return path
    if path.is_absolute():
        return sweep_dir / path.name
    return sweep_dir / path


def load_sweep(sweep_dir: str | Path, match: dict[str, str] | None = None) -> list[Run]:
    """Every job in <sweep_dir>/summary.csv whose overrides contain `match`, with its metrics."""
    sweep_dir = Path(sweep_dir)
    runs = []
    for row in read_summary(sweep_dir):
        overrides = parse_overrides(row.get("overrides", ""))
        if not all(same_value(overrides.get(k), v) for k, v in (match or {}).items()):
            continue
        run_dir = _resolve(row.get("run_dir", ""), sweep_dir)
        final = {
            k: _float(v) for k, v in row.items() if k not in FIRST_COLUMNS and v not in ("", None)
        }
        runs.append(
            Run(
                overrides=overrides,
                status=row.get("status", ""),
                run_dir=run_dir,
                final=final,
                metrics=read_metrics(run_dir),
                error=row.get("error", ""),
                # the summary's wall time is its last run's: the earlier runs' are added
                wall_time_s=_float(row.get("wall_time_s", "")) + earlier_runs_s(run_dir),
                reused=int(row.get("reused") or 0),
                code_version=row.get("code_version", ""),
            )
        )
    return runs


def pick(runs: list[Run], **values: str) -> list[Run]:
    """The runs whose overrides have all the given values (keys with dots passed as '__')."""
    wanted = {k.replace("__", "."): str(v) for k, v in values.items()}
    return [r for r in runs if all(r.get(k) == v for k, v in wanted.items())]
