"""What a reproduction produces: a figure, the numbers behind it, and a claim-vs-ours table."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from normlab.analysis.logs import Run  # noqa: E402


@dataclass
class Claim:
    """One paper claim: the paper's number, ours, and whether the rule says it holds."""

    claim: str
    paper: str
    ours: str
    holds: bool | None  # None: not decidable (a run missing or failed)
    rule: str

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "does not hold", None: "undecided"}[self.holds]


@dataclass
class Result:
    """An analysed sweep: figure, tidy data (one row per plotted point) and claims."""

    figure: plt.Figure
    data: pd.DataFrame
    claims: list[Claim]
    notes: list[str] = field(default_factory=list)


def fmt(value: float, digits: int = 3) -> str:
    """A number for a table: 'n/a' for NaN."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}g}"


def cell(text: str) -> str:
    """Text safe inside a markdown table cell (a norm's bars |x| would split the row)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def tidy(rows: list[dict]) -> pd.DataFrame:
    """Rows of plotted points -> a frame with the columns every NAME.csv shares first."""
    frame = pd.DataFrame(rows)
    first = [c for c in ("panel", "run", "x_name", "x", "y_name", "y") if c in frame.columns]
    return frame[first + [c for c in frame.columns if c not in first]]


def claims_markdown(claims: list[Claim]) -> str:
    """The claim table (paper claim | paper's number | our number | holds or not) and its rules."""
    lines = [
        "| paper claim | paper's number | our number | holds? |",
        "|---|---|---|---|",
    ]
    for c in claims:
        cells = (c.claim, c.paper, c.ours, c.verdict)
        lines.append("| " + " | ".join(cell(x) for x in cells) + " |")
    lines += ["", "Rules (in code: `normlab.analysis`, one per claim):", ""]
    rules = {}  # claims that share a rule (the same test per setting) list it once
    for c in claims:
        if c.rule:
            rules.setdefault(c.rule, []).append(c.claim)
    lines += [f"- *{'; '.join(names)}*: {rule}" for rule, names in rules.items()]
    return "\n".join(lines) + "\n"


def _shown(path: object) -> str:
    """A run dir as written in a report: relative to the working dir when below it."""
    try:
        return str(Path(str(path)).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def runs_markdown(runs: list[Run]) -> str:
    """Which jobs the figure was drawn from: overrides, status, wall time, run dir."""
    lines = ["| job overrides | status | wall time (s) | run dir |", "|---|---|---|---|"]
    for r in runs:
        overrides = " ".join(f"{k}={v}" for k, v in r.overrides.items())
        status = r.status + (f" ({r.error[:80]})" if r.error else "")
        cells = (overrides, status, fmt(r.wall_time_s, 4), _shown(r.run_dir))
        lines.append("| " + " | ".join(cell(x) for x in cells) + " |")
    return "\n".join(lines) + "\n"


def write(
    result: Result,
    out_dir: Path,
    name: str,
    title: str,
    command: str,
    budget: str,
    runs: list[Run],
    wall_time_s: float | None = None,
) -> dict[str, Path]:
    """Write NAME.png, NAME.svg, NAME.csv and NAME.md into out_dir; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: out_dir / f"{name}.{ext}" for ext in ("png", "svg", "csv", "md")}
    result.figure.savefig(paths["png"], dpi=120, bbox_inches="tight")
    result.figure.savefig(paths["svg"], bbox_inches="tight")
    plt.close(result.figure)
    result.data.to_csv(paths["csv"], index=False)
    text = [
        f"# {name}: {title}",
        "",
        f"![{name}]({name}.png)",
        "",
        f"Command: `{command}`  ",
        f"Budget: {budget}  ",
    ]
    if wall_time_s is not None:  # short when the jobs were reused from an earlier invocation
        text.append(f"Wall time of this invocation: {wall_time_s:.0f} s  ")
    job_times = [r.wall_time_s for r in runs if r.wall_time_s is not None]
    if job_times:
        total, longest = sum(job_times), max(job_times)
        text.append(f"Jobs' own wall time: {total:.0f} s in all, {longest:.0f} s the longest  ")
    text += ["", "## Claims", "", claims_markdown(result.claims)]
    if result.notes:
        text += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    text += ["## Runs", "", runs_markdown(runs)]
    paths["md"].write_text("\n".join(text))
    return paths
