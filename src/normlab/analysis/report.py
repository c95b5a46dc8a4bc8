# Over 400 lines: the claim kinds and the evidence files (tables, runs.csv) they are written to
"""What a reproduction produces: a figure, the numbers behind it, and a claim-vs-ours table."""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import matplotlib

matplotlib.use("Agg")  # files only, no display
matplotlib.rcParams["svg.hashsalt"] = "normlab"  # the same figure gives the same svg ids

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from normlab.analysis import gates, sequential, stats  # noqa: E402
from normlab.analysis.logs import parse_overrides  # noqa: E402
from normlab.tables import cell, markdown_table  # noqa: E402, F401 (cell: report.cell)


@dataclass
class ClaimBase:
    """What every claim kind shares: its words, the paper's number, provenance, the arms whose
    gates decide whether it is read, and how a gate or an absent effect bears on it. A kind adds
    its per-seed values and its test: a paired difference or ratio (`Claim`, a slope is one per
    seed too), an interval computed elsewhere (`IntervalClaim`), a count (`CountClaim`), any of
    several parts (`AnyClaim`); `absent` makes any of them an equivalence test as well."""

    claim: str  # what this suite tested, in its own words
    paper_number: str  # the paper's figure for it, quoted
    source: str = field(default="", kw_only=True)  # "paper" (it states it) or "ours" (see why)
    why: str = field(default="", kw_only=True)  # for an "ours" claim: why this threshold/quantity
    arms: tuple[str, ...] = field(default=(), kw_only=True)  # their gates decide validity
    final: bool = field(default=False, kw_only=True)  # final values: each arm must converge
    # its values are its first two arms' final held-out loss gap (first minus second): the budget
    # test reads its own region one window on, not only the gap's sign
    held_out: bool = field(default=False, kw_only=True)
    # the verdict when the values cannot answer the claim as run (e.g. "not comparable: ..."):
    # shown as gates' invalid verdicts are, and left out of Holm's family
    precluded: str = field(default="", kw_only=True)
    # a ceiling on these arms' values can only understate the paper's side (a saturated update
    # is an understated one): their saturation leaves a "holds" valid, and only a "holds"
    ceiling_against: tuple[str, ...] = field(default=(), kw_only=True)
    # arms whose not training is the failure the claim tests (a drop-in that does not train is
    # not "within 0.05 nats"): their trained gate answers the claim instead of voiding it
    untrained_answers: tuple[str, ...] = field(default=(), kw_only=True)
    # an equivalence band around no effect, fixed before the effect was seen (absent_why says
    # by which rule): where the claim does not hold, an interval inside it concludes "absent"
    absent: tuple[float, float] | None = field(default=None, kw_only=True)
    absent_why: str = field(default="", kw_only=True)

    def __post_init__(self) -> None:
        check_source(self)
        if self.absent is not None and not self.absent_why:
            raise ValueError(f"claim {self.claim!r}: an equivalence band says its rule "
                             "(absent_why=...)")  # fmt: skip

    @property
    def verdict(self) -> str:
        return self.precluded or self.test_verdict()

    def test_verdict(self) -> str:
        """The kind's own verdict, before gates and the sequential boundary."""
        return stats.verdict(self.interval, self.region, getattr(self, "undecided",
                                                                 stats.UNDECIDED))  # fmt: skip

    def ours(self) -> str:
        return _ours(self.interval)

    def row(self) -> dict[str, object]:
        """The claim's row of NAME.claims.csv."""
        return _row(self)


@dataclass
class Claim(ClaimBase):
    """A claim tested on a per-seed quantity (a paired difference, a ratio, a slope): its mean,
    95% CI over seeds, rule and verdict."""

    quantity: str  # what one seed contributes, in words with its unit
    values: list[float]  # one value per seed (arms compared within a seed)
    region: tuple[float, float]  # where the paper's side lies: (2, ABOVE) is "above 2"
    log: bool = False  # a ratio: geometric mean, CI on the log scale
    undecided: str = stats.UNDECIDED  # the verdict's words when the CI straddles the threshold
    ci_method: ClassVar[str] = stats.CI_METHOD

    @property
    def interval(self) -> stats.Interval:
        return stats.Interval.of(self.values, log=self.log)

    @property
    def rule(self) -> str:
        side, other = stats.region_text(self.region)
        mean = "geometric mean" if self.log else "mean"
        return (
            f"per seed: {self.quantity}. Holds if the 95% CI of its {mean} over seeds lies "
            f"wholly {side}; does not hold if it lies wholly {other}; otherwise {self.undecided}"
        ) + _absent_text(self)


@dataclass
class IntervalClaim(ClaimBase):
    """A claim decided, by Claim's rule, on an interval computed elsewhere: e.g. the bootstrap
    interval of a median over many values per seed (stats.bootstrap)."""

    quantity: str  # what the interval is of, in words with its unit
    interval: stats.Interval  # its estimate (as mean), low, high, and n seeds behind it
    region: tuple[float, float]  # where the paper's side lies
    ci_method: str  # how the interval was computed (the md's CI line)
    undecided: str = stats.UNDECIDED

    @property
    def rule(self) -> str:
        side, other = stats.region_text(self.region)
        return (
            f"{self.quantity}. Holds if its 95% CI lies wholly {side}; does not hold if it lies "
            f"wholly {other}; otherwise {self.undecided}"
        )


@dataclass
class CountClaim(ClaimBase):
    """A claim on how often an event (e.g. a seed that did not train) happens in arm a against
    arm b over seeds: the difference of the two fractions with Newcombe's 95% interval, decided
    by Fisher's exact test (two-sided p below the sequential boundary, on the side the
    difference lies). No event in either arm is no test: it says so instead of planning seeds."""

    quantity: str  # the event, in words
    counts: tuple[int, int, int, int]  # events in a, seeds of a, events in b, seeds of b
    region: tuple[float, float] = (0.0, stats.ABOVE)  # the paper's side: a fails more often
    ci_method: ClassVar[str] = "a difference of fractions: Newcombe's (Wilson score) interval"

    def __post_init__(self) -> None:
        super().__post_init__()
        k_a, n_a, k_b, n_b = self.counts
        if not self.precluded and k_a == 0 and k_b == 0:
            self.precluded = (f"no events in either arm (0 of {n_a}, 0 of {n_b}): not a test; "
                              "this setting does not produce the failure it counts")  # fmt: skip

    @property
    def test(self) -> tuple[stats.Interval, float]:
        return stats.proportions(*self.counts)

    @property
    def interval(self) -> stats.Interval:
        return self.test[0]

    @property
    def p_value(self) -> float:
        return self.test[1]

    def test_verdict(self) -> str:
        p, d = self.p_value, self.interval.mean
        if math.isnan(p) or p >= sequential.BOUNDARY:
            return stats.UNDECIDED
        return stats.side(d, self.region)

    @property
    def rule(self) -> str:
        k_a, n_a, k_b, n_b = self.counts
        side, _ = stats.region_text(self.region)
        level = f"{sequential.BOUNDARY:.4f}"
        return (
            f"counted over seeds: {self.quantity} ({k_a} of {n_a} against {k_b} of {n_b}); the "
            f"difference of the fractions, with Newcombe's 95% interval. Holds if Fisher's "
            f"exact test (two-sided) gives p < {level} (the sequential boundary) with the "
            f"difference {side}; does not hold if p < {level} the other way; otherwise "
            f"{stats.UNDECIDED}; no event in either arm is not a test"
        )


def _absent_text(claim: ClaimBase) -> str:
    if claim.absent is None:
        return ""
    lo, hi = claim.absent
    return (f"; where it does not hold, absent at this scale if the interval at the sequential "
            f"boundary lies inside [{lo:g}, {hi:g}] (two one-sided tests; the band: "
            f"{claim.absent_why})")  # fmt: skip


PROVENANCE = ("paper", "ours")


def check_source(claim) -> None:
    """A claim says where it comes from: the paper (its number quoted) or this suite (why)."""
    if claim.source not in PROVENANCE:
        raise ValueError(f"claim {claim.claim!r}: source must be one of {PROVENANCE}, "
                         f"got {claim.source!r}")  # fmt: skip
    if claim.source == "ours" and not claim.why:
        raise ValueError(f"claim {claim.claim!r}: an 'ours' claim says why (why=...)")


def _ours(i: stats.Interval) -> str:
    ci = f" [{fmt(i.low)}, {fmt(i.high)}]" if i.known else " [CI n/a]"
    return f"{fmt(i.mean)}{ci}"


def _row(claim: Claim | IntervalClaim | AnyClaim | CountClaim) -> dict[str, object]:
    """A claim's row of NAME.claims.csv, before its gates and Holm's correction (`decided_row`)."""
    i = claim.interval
    return {
        "claim": claim.claim,
        "provenance": claim.source if claim.source == "paper" else f"ours: {claim.why}",
        "paper_number": claim.paper_number,
        "ours_mean": i.mean,
        "ci_low": i.low,
        "ci_high": i.high,
        "n_seeds": i.n,
        "verdict": claim.verdict,
        "rule": claim.rule,
    }


claim_arms = gates.claim_arms  # the arms a claim reads (its callers here, and claims.csv's)


def decided_row(claim, decision: gates.Decision) -> dict[str, object]:
    """A claim's row of NAME.claims.csv: the row, with the verdict after its gates, the seeds
    planned for it, the arms it reads, its p-value and the verdict under Holm's correction."""
    row = claim.row()
    row.update(verdict=decision.verdict, gates=decision.gates, planned_seeds=decision.planned_n,
               arms=" ".join(claim_arms(claim)), p_value=decision.p_value,
               verdict_holm=decision.holm)  # fmt: skip
    return {k: row[k] for k in CLAIMS_COLUMNS}


# NAME.claims.csv's columns, written even where a run decides no claim (a card slot's evidence)
CLAIMS_COLUMNS = ["claim", "provenance", "paper_number", "ours_mean", "ci_low", "ci_high",
                  "n_seeds", "planned_seeds", "arms", "gates", "verdict", "p_value",
                  "verdict_holm", "rule"]  # fmt: skip


@dataclass
class AnyClaim(ClaimBase):
    """A claim that holds when any of its parts does (e.g. at some learning rate): holds if one
    part holds, does not hold if every part does not, otherwise undecided. Its numbers are the
    deciding part's: the one furthest inside the paper's region among the best verdicts. The
    gates decide it on its valid parts (`gates.decide`)."""

    parts: dict[str, Claim] = field(default_factory=dict)  # label -> that part's claim
    ci_method: ClassVar[str] = stats.CI_METHOD

    ORDER = (stats.HOLDS, stats.UNDECIDED, stats.FAILS)

    def _rank(self, label: str) -> tuple[int, float]:
        part = self.parts[label]
        verdict = part.verdict
        rank = self.ORDER.index(verdict) if verdict in self.ORDER else len(self.ORDER)
        (lo, hi), i = part.region, part.interval
        depth = min(i.low - lo, hi - i.high) if i.known else -math.inf
        return rank, -depth

    @property
    def deciding(self) -> str:
        """The label of the part whose numbers the row shows."""
        return min(self.parts, key=self._rank)

    @property
    def interval(self) -> stats.Interval:
        return self.parts[self.deciding].interval if self.parts else stats.Interval.of([])

    def test_verdict(self) -> str:
        verdicts = [p.verdict for p in self.parts.values()]
        if stats.HOLDS in verdicts:
            return stats.HOLDS
        if verdicts and all(v == stats.FAILS for v in verdicts):
            return stats.FAILS
        if stats.UNDECIDED in verdicts or stats.FAILS in verdicts:
            return stats.UNDECIDED
        return stats.MISSING

    @property
    def rule(self) -> str:
        names = ", ".join(self.parts)
        return (
            f"holds if the claim holds for any of {names} (each by its own rule; no correction "
            f"for testing {len(self.parts)}); does not hold if it does not hold for every one; "
            "otherwise undecided. Shown: the mean and CI of the part "
            "furthest inside its region among the best verdicts"
        )

    def ours(self) -> str:
        return f"{self.parts[self.deciding].ours()} ({self.deciding})" if self.parts else "n/a"


@dataclass
class Result:
    """An analysed reproduction: its figure, claims and notes."""

    figure: plt.Figure
    claims: list  # Claim, IntervalClaim, AnyClaim
    notes: list[str] = field(default_factory=list)
    gates: list[gates.Gate] = field(default_factory=list)  # every arm's validity gates
    sections: dict[str, str] = field(default_factory=dict)  # md sections after the notes


def verdict_kind(verdict: str) -> str:
    """A verdict's kind for counting: its words before any detail ('invalid: a ...' ->
    'invalid', 'absent at this scale (within ±1)' -> 'absent at this scale')."""
    return verdict.split(":")[0].split(" (")[0].split(";")[0]


def fmt(value: float, digits: int = 3) -> str:
    """A number for a table: 'n/a' for NaN."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}g}"


def footer(found: list[gates.Gate], claims: list, decisions: list[gates.Decision]) -> str:
    """What a figure alone must say, printed under it: which arms failed which gate (a failed arm
    stays drawn; its claims are invalid), and the verdicts by the claims' source."""
    unmeasured = sum(g.passed is None for g in found)
    if unmeasured == len(found):
        lines = ["Gates: none measured (the runs predate the gates)."]
    else:
        failed: dict[str, list[str]] = {}
        for g in found:
            if g.passed is False:
                failed.setdefault(gates.WORDS[g.gate], []).append(g.arm)
        arms = len({g.arm for g in found})
        lines = [f"Gates ({arms} arm{'s' * (arms != 1)}): " + ("; ".join(
            f"{word}: {', '.join(a)}" for word, a in failed.items()) or "every measured gate "
            "passes") + (f"; {unmeasured} of {len(found)} not measured" if unmeasured else "")
            + "."]  # fmt: skip
    for source in ("paper", "ours"):
        verdicts = [verdict_kind(d.verdict) for c, d in zip(claims, decisions, strict=True)
                    if getattr(c, "source", "") == source]  # fmt: skip
        if verdicts:
            counts = Counter(verdicts)
            lines.append(f"Claims [{source}]: " + ", ".join(
                f"{k} {n}" for k, n in sorted(counts.items())) + ".")  # fmt: skip
    return "\n".join(textwrap.fill(line, 180) for line in lines)


def _figure_and_header(
    result: Result, paths: dict[str, Path], name: str, title: str, command: str, budget: str,
    under: str = "",
) -> list[str]:  # fmt: skip
    """Save the figure with `under` printed beneath it (png, svg without a date: the same
    figure gives the same file) and return the md's first lines."""
    if under:
        result.figure.text(0.0, 0.0, under, ha="left", va="top", fontsize=7, wrap=False,
                           transform=result.figure.transFigure)  # fmt: skip
    result.figure.savefig(paths["png"], dpi=120, bbox_inches="tight")
    result.figure.savefig(paths["svg"], bbox_inches="tight", metadata={"Date": None})
    plt.close(result.figure)
    return [
        f"# {name}: {title}",
        "",
        f"![{name}]({name}.png)",
        "",
        f"Command: `{command}`  ",
        f"Budget: {budget}  ",
    ]


# ----- seeded reproductions: runs.csv + jobs.csv -> figure, claims.csv, md ----------------------

RUNS_COLUMNS = ["arm", "seed", "x", "metric", "value"]
JOBS_COLUMNS = ["arm", "seed", "status", "error", "wall_time_s", "reused", "code_version",
                "overrides"]  # fmt: skip
FLOAT = "%.6g"  # every number written: stable text for byte-identical redraws


def evidence_paths(out_dir: Path, name: str) -> dict[str, Path]:
    """Where a seeded reproduction's files live: NAME/{runs,jobs}.csv and NAME.{png,svg,md,..}."""
    return {
        "runs": out_dir / name / "runs.csv",
        "jobs": out_dir / name / "jobs.csv",
        "png": out_dir / f"{name}.png",
        "svg": out_dir / f"{name}.svg",
        "md": out_dir / f"{name}.md",
        "claims": out_dir / f"{name}.claims.csv",
    }


def _seed_set(seeds: pd.Series) -> tuple[int, ...]:
    """The distinct seeds of some jobs, in order."""
    return tuple(sorted(set(map(int, seeds))))


def _settings(jobs: pd.DataFrame) -> pd.Series:
    """Each job's arm, with the values of the overrides (seed and the arm's own name aside) that
    its arm's jobs ran at unequal seed sets, e.g. 'batchnorm (per_device=2)'; its arm alone where
    all share seeds."""
    labels = jobs["arm"].astype(str)
    if "overrides" not in jobs:
        return labels
    for arm, rows in jobs.groupby("arm", sort=False):
        keys = pd.DataFrame([parse_overrides(o) for o in rows["overrides"].fillna("")],
                            index=rows.index)  # fmt: skip
        keys = keys.drop(columns=["seed", "arm"], errors="ignore")
        varying = [k for k in keys.columns if keys[k].nunique(dropna=False) > 1]
        at = pd.Series([", ".join(f"{k}={keys.at[i, k]}" for k in varying) for i in rows.index],
                       index=rows.index)  # fmt: skip
        seeds = rows.groupby(at)["seed"].agg(_seed_set)
        if seeds.nunique() > 1:
            labels[rows.index] = [f"{arm} ({a})" for a in at]
    return labels


def seeds_text(jobs: pd.DataFrame) -> str:
    """The seeds each arm ran: '0, 1, 2 for every arm', or a list per group of arms (the
    largest group last, as 'the other N arms'). An arm whose jobs at some swept values ran other
    seeds than at others is listed per value, e.g. 'batchnorm (per_device=2)'."""
    per_arm = jobs.groupby(_settings(jobs), sort=True)["seed"].agg(_seed_set)
    groups: dict[tuple[int, ...], list[str]] = {}
    for arm, seeds in per_arm.items():
        groups.setdefault(seeds, []).append(str(arm))
    if len(groups) == 1:
        return f"{', '.join(map(str, next(iter(groups))))} for every arm"
    *fewer, (most_seeds, most) = sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[0]))
    parts = [f"{', '.join(map(str, seeds))} for {', '.join(arms)}" for seeds, arms in fewer]
    rest = f"the other {len(most)} arms" if len(most) > 1 else most[0]
    return "; ".join([*parts, f"{', '.join(map(str, most_seeds))} for {rest}"])


def gates_table(found: list[gates.Gate]) -> str:
    """The validity gates of every arm, before any claim is read."""
    if not found:
        return "No gate measured: runs.csv predates the gates (rerun the reproduction).\n"
    rows = [(g.arm, g.gate, g.measured, f"**{g.status}**") for g in found]
    lines = [markdown_table(["arm", "gate", "measured", "status"], rows), ""]
    lines += [f"- *{name}*: {rule}." for name, rule in gates.RULES.items()]
    lines += [
        "- A claim reading an arm that fails its trained (or, comparing final values, "
        "converged; or not-saturated) gate is `invalid`: its number is shown, not read. A claim "
        "comparing final values is also `invalid` where an arm's converged gate was not "
        "measured: convergence is shown, not assumed. Three exceptions keep valid evidence: a "
        "ceiling that can only understate the claim's side leaves a `holds` valid; an arm's not "
        "training answers a claim where that is the failure it tests (the verdict says so); an "
        "any-of claim is decided on its valid parts.",
        "",
    ]
    return "\n".join(lines)


def claims_table(claims: list, decisions: list[gates.Decision], initial: int,
                 cap: int | sequential.Caps) -> str:  # fmt: skip
    """The claims as a markdown table (provenance, mean and 95% CI over seeds, seeds run and
    planned, verdict, verdict under Holm), their rules and how their intervals were computed."""
    cap = sequential.Caps.given(cap)
    precluded = sum(bool(getattr(c, "precluded", "")) for c in claims)
    tested = sum(d.tested for d in decisions)
    others = "invalid by their gates" + (" or precluded (its verdict says why)"
                                         if precluded else "")  # fmt: skip
    columns = ["claim (as tested here)", "source", "paper", "ours: mean [95% CI]",
               "seeds (planned)", "verdict", "Holm"]  # fmt: skip
    rows = [
        (c.claim, "paper" if c.source == "paper" else "ours", c.paper_number, c.ours(),
         f"{c.interval.n} ({d.planned_n if d.planned_n is not None else 'n/a'})",
         f"**{d.verdict}**", d.holm)
        for c, d in zip(claims, decisions, strict=True)
    ]  # fmt: skip
    lines = [
        f"Family: {len(claims)} claims, {tested} tested (the others {others}); "
        "the last column decides them under Holm's correction at the sequential boundary "
        "(two-sided p of each verdict's test, `normlab.analysis.stats.p_value`).  ",
        f"Design: {sequential.DESIGN}. Seeds: {initial} first; `planned` is the n whose interval "
        f"at the boundary's level would clear the nearest bound at the first {initial} seeds' "
        f"mean and SD (`stats.seeds_needed`), run up to a cap of {cap.cap} "
        f"(`reproduce.py NAME --decide`).{cap.text()}  ",
        "Verdicts beside holds / does not hold: `absent at this scale (within ±δ)`, an "
        "equivalence by two one-sided tests in a band fixed before the effect was seen (its "
        "rule says which); `budget-dependent: <arms>`, a final-value comparison one more "
        "window of the same drift would change (gates); `invalid: ...`, a gate keeps it from "
        "being read.  ",
        "Source: `paper`, the paper states it (its number quoted); `ours`, a threshold or "
        "quantity of this suite (why below): a verdict on it is on this suite's test, not on "
        "the paper.",
        "",
        markdown_table(columns, rows),
        "",
        "Rules (in code: `normlab.analysis`; the rule each verdict was decided by):",
        "",
    ]
    for c in claims:
        why = f" Ours because: {c.why}." if c.source == "ours" else ""
        lines.append(f"- *{c.claim}*: {c.rule}.{why}")
    methods = dict.fromkeys(c.ci_method for c in claims) or {stats.CI_METHOD: None}
    lines += ["", f"CI: {'; '.join(methods)}.", ""]
    return "\n".join(lines)


def settings(jobs: pd.DataFrame) -> list[str] | None:
    """Per job, the overrides that tell it from its arm's other jobs (the seed aside), where an
    arm ran more than one job per seed (gn_batch_size's b); None where each (arm, seed) is one."""
    if not jobs.duplicated(["arm", "seed"]).any():
        return None
    tokens = [str(o).split() if isinstance(o, str) else [] for o in jobs["overrides"]]
    shared = {arm: set.intersection(*(set(t) for a, t in zip(jobs["arm"], tokens, strict=True)
                                      if a == arm)) for arm in set(jobs["arm"])}  # fmt: skip
    return [" ".join(t for t in tok if t not in shared[arm] and not t.startswith("seed="))
            for arm, tok in zip(jobs["arm"], tokens, strict=True)]  # fmt: skip


def jobs_table(jobs: pd.DataFrame) -> str:
    """The jobs the figure was drawn from: arm, seed, (where an arm ran several jobs a seed)
    what sets each apart, status, wall time, reused or not."""
    setting = settings(jobs)
    rows = []
    for k, job in enumerate(jobs.itertuples()):
        error = f" ({str(job.error)[:80]})" if isinstance(job.error, str) and job.error else ""
        reused = "yes" if job.reused == 1 else "no"
        apart = () if setting is None else (setting[k],)
        rows.append((job.arm, job.seed, *apart, f"{job.status}{error}", fmt(job.wall_time_s, 4),
                     reused))  # fmt: skip
    columns = ["arm", "seed", *([] if setting is None else ["setting"]), "status",
               "wall time (s)", "reused"]  # fmt: skip
    return markdown_table(columns, rows) + "\n"


SMOKE = "smoke: not evidence"


def write_evidence(
    result: Result, out_dir: Path, name: str, title: str, command: str, budget: str,
    jobs: pd.DataFrame, initial: int = 3, cap: int | sequential.Caps = 12, redraw: str = "",
    smoke: bool = False, more_notes: Callable[[pd.DataFrame], list[str]] | None = None,
) -> dict[str, Path]:  # fmt: skip
    """Write NAME.png, .svg, .md and .claims.csv from an analysed runs.csv (no run logs read).
    `redraw` is the command that redraws it (default `reproduce.py NAME --redraw`); a `smoke`
    run (--quick) reads no gate and no verdict: each claim says it is a smoke run."""
    paths = evidence_paths(out_dir, name)
    out_dir.mkdir(parents=True, exist_ok=True)
    decisions = gates.decide(result.claims, result.gates, initial, cap)
    if smoke:
        decisions = [replace(d, verdict=SMOKE, holm=SMOKE, tested=False) for d in decisions]
    under = f"{SMOKE}: a --quick run, its gates and verdicts are not read." if smoke else (
        footer(result.gates, result.claims, decisions))
    text = _figure_and_header(result, paths, name, title, command, budget, under)
    claims = pd.DataFrame(
        [decided_row(c, d) for c, d in zip(result.claims, decisions, strict=True)],
        columns=CLAIMS_COLUMNS,
    )
    claims.to_csv(paths["claims"], index=False, float_format=FLOAT)
    times = jobs["wall_time_s"].dropna()
    versions = sorted({str(v) for v in jobs["code_version"].dropna()})
    text += [
        f"Seeds: {seeds_text(jobs)} (a seed sets the init, the data order and the training "
        "subset; arms compared within a seed share all three)  ",
        f"Jobs: {len(jobs)}, {int((jobs['status'] == 'ok').sum())} ok; their own wall time "
        f"{times.sum():.0f} s in all, {times.max():.0f} s the longest  ",
        f"Training code version(s): {', '.join(versions) or 'n/a'} (normlab.identity)  ",
        f"Data: [{name}/runs.csv]({name}/runs.csv) holds every number below; "
        f"`{redraw or f'python scripts/reproduce.py {name} --redraw'}` redraws all from it",
        "",
        "## Gates",
        "",
        gates_table(result.gates),
        "## Claims",
        "",
        claims_table(result.claims, decisions, initial, cap),
    ]
    notes = result.notes + (more_notes(claims) if more_notes else [])  # from the decided rows
    if notes:
        text += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    for title, body in result.sections.items():
        text += [f"## {title}", "", body, ""]
    text += ["## Jobs", "", jobs_table(jobs)]
    paths["md"].write_text("\n".join(text))
    return paths
