"""A norm's report card: its place in every reproduction that declares a norm slot.

A slot lives in its reproduction's conf/reproduce/NAME.yaml (`card:`): the grid a norm joins
(with overrides that cut it to the slot's question), the built-in norms' arms, the baselines,
and the quantities read per seed. `python scripts/reproduce.py card --norm X` runs X in each
slot's grid (as `reproduce.py NAME --norm X --grids G` does) and reads each quantity of X's arm
beside each baseline's, paired by seed, through the reproductions' own rules: the gates, the
sequential boundary, an equivalence band (`delta`) fixed in the slot with its reason. A verdict
is `better`, `worse`, `equivalent (within ±δ)`, `undecided` or `invalid: <gate>`. A built-in
norm's card reads the committed evidence alone (no training).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from normlab.analysis import gates, stats
from normlab.analysis.bn_lenet import SMOOTH, auc, smooth, steps_to
from normlab.analysis.curves import metric
from normlab.analysis.report import Claim, verdict_kind
from normlab.analysis.sweep import load, norm_arm
from normlab.tables import markdown_table

VERDICTS = {stats.HOLDS: "better", stats.FAILS: "worse", gates.ABSENT: "equivalent"}
SMOKE = "smoke: not evidence"


# ----- quantities: runs.csv rows of one arm -> a value per seed --------------------------------


def _final(data: pd.DataFrame, arm: str, q: dict) -> pd.Series:
    """The last value of `metric` per seed (at `x` where given)."""
    rows = metric(data, arm, q["metric"])
    if "x" in q:
        rows = rows[np.isclose(rows["x"].astype(float), float(q["x"]))]
    return rows.sort_values("x", kind="stable").groupby("seed")["value"].last()


def _rise(data: pd.DataFrame, arm: str, q: dict) -> pd.Series:
    """The metric at x[1] minus at x[0], per seed."""
    at = [_final(data, arm, {**q, "x": x}) for x in q["x"]]
    return (at[1] - at[0]).dropna()


def _curves(data: pd.DataFrame, arm: str, name: str) -> dict[int, pd.Series]:
    rows = metric(data, arm, name)
    return {int(s): g.set_index("x")["value"].sort_index() for s, g in rows.groupby("seed")}


def _steps_to(data: pd.DataFrame, arm: str, q: dict) -> pd.Series:
    """Steps the arm takes to `fraction` of the reference arm's final held-out accuracy (same
    seed; smoothed as bn_lenet smooths it); NaN where it never gets there."""
    mine, ref = _curves(data, arm, q["metric"]), _curves(data, q["reference"], q["metric"])
    out = {}
    for seed in sorted(set(mine) & set(ref)):
        target = q["fraction"] * float(ref[seed].tail(SMOOTH).mean())
        out[seed] = steps_to(smooth(mine[seed]), target)
    return pd.Series(out, dtype=float).dropna()


def _auc(data: pd.DataFrame, arm: str, q: dict) -> pd.Series:
    """The mean held-out accuracy over the run (bn_lenet.auc), per seed."""
    return pd.Series({s: auc(c) for s, c in _curves(data, arm, q["metric"]).items()}, dtype=float)


def _slope(data: pd.DataFrame, arm: str, q: dict) -> pd.Series:
    """|slope| of ln(metric) against its x (the layer index), per seed: 0 is flat."""
    table = metric(data, arm, q["metric"]).pivot(index="seed", columns="x", values="value")
    x = table.columns.to_numpy(dtype=float)
    return table.apply(lambda r: abs(float(np.polyfit(x, np.log(r.to_numpy(float)), 1)[0])),
                       axis=1).astype(float)  # fmt: skip


def _ratio(data: pd.DataFrame, arm: str, q: dict) -> pd.Series:
    """The median over a job's logged steps of `metric` / `over` (both logged at each x), per
    seed: e.g. the norm's calls' time over LayerNorm's, timed side by side (rmsnorm_speed)."""
    num, den = (metric(data, arm, q[k]).set_index(["seed", "x"])["value"]
                for k in ("metric", "over"))  # fmt: skip
    return (num / den).dropna().groupby(level="seed").median().astype(float)


def _share(data: pd.DataFrame, arm: str, q: dict) -> pd.Series:
    """The share of a step a part takes, per seed: 1 - the median over steps of the step
    `without` it over the step with it (`metric`): e.g. the norm's share of a training step."""
    return 1.0 - _ratio(data, arm, {"metric": q["without"], "over": q["metric"]})


KINDS: dict[str, Callable[[pd.DataFrame, str, dict], pd.Series]] = {
    "final": _final, "rise": _rise, "steps_to": _steps_to, "auc": _auc, "slope": _slope,
    "ratio": _ratio, "share": _share,
}  # fmt: skip


# ----- slots: conf/reproduce/NAME.yaml's `card:` ---------------------------------------------


@dataclass(frozen=True)
class Slot:
    """One question a norm is put to: a reproduction's grid, its baselines and quantities."""

    reproduction: str
    title: str
    grid: str  # the grid the norm joins
    arms: dict[str, str]  # built-in norm -> its arm in the committed evidence
    baselines: tuple[str, ...]  # built-in norms compared against
    quantities: tuple[dict, ...]  # name, kind, metric, better, delta, gates (arm templates)
    delta_why: str  # why each quantity's equivalence band is what it is
    overrides: tuple[str, ...] = ()  # cut the grid to the slot's question
    needs: dict = field(default_factory=dict)  # traits the norm must have (trait -> value)
    needs_why: str = ""  # the words of "not applicable"
    # where the grid's arms are a template (sweep.norm_arm): the norm's arm in it, `{norm}` for
    # the norm's name, as the slot's overrides render it (e.g. init/{norm}/post/d12)
    norm_arm: str = ""
    initial: int = gates.MIN_SEEDS  # the reproduction's declared seeds: the design's first look
    cap: int = gates.MIN_SEEDS  # ... and its last (its grid's raised cap: sequential.Caps)
    # how a baseline's committed jobs are checked under today's code (normlab.analysis.
    # baselines): {steps: N, metrics: [...]}, the first N steps replayed and those metrics'
    # committed values up to step N compared; {} where the slot declares no replay
    replay: dict = field(default_factory=dict)

    def arm(self, norm: str) -> str:
        """The arm a norm runs as here: a built-in's committed arm, else the one `--norm` runs
        (sweep.norm_arm; the slot's norm_arm where the grid's arms are a template)."""
        if norm in self.arms:
            return self.arms[norm]
        return self.norm_arm.format(norm=norm) if self.norm_arm else norm_arm(self.grid, norm)

    def applicable(self, norm: str) -> str:
        """'' where the norm fits the slot, else why not (from its traits)."""
        from normlab.norms import norm_traits  # lazy: torch loads only for a card

        traits = norm_traits(norm)
        if traits is None:
            return ""
        wrong = [t for t, v in self.needs.items() if getattr(traits, t) != v]
        return f"not applicable: {self.needs_why}" if wrong else ""


def slots(conf: Path) -> list[Slot]:
    """Every slot declared under conf/reproduce, in the reproductions' order."""
    found = []
    for path in sorted(conf.glob("*.yaml"), key=lambda p: (yaml.safe_load(p.read_text())
                                                           .get("order", 99), p.stem)):  # fmt: skip
        spec = yaml.safe_load(path.read_text())
        repro = load(path) if spec.get("card") else None  # its seeds and caps, as --decide's
        for s in spec.get("card", ()):
            found.append(Slot(path.stem, s["slot"], s["grid"], dict(s["arms"]),
                              tuple(s["baselines"]), tuple(s["quantities"]), s["delta_why"],
                              tuple(map(str, s.get("overrides", ()))), dict(s.get("needs", {})),
                              s.get("needs_why", ""), s.get("norm_arm", ""),
                              repro.initial_seeds, repro.caps().of(tuple(s["arms"].values())),
                              dict(s.get("replay") or {})))  # fmt: skip
    return found


# ----- rows: a slot's quantities, the norm against each baseline -------------------------------


@dataclass(frozen=True)
class Row:
    """One quantity of one slot: the norm's value, each baseline's, the verdicts against them."""

    slot: str
    reproduction: str
    quantity: str
    better: str  # lower | higher
    norm: stats.Interval
    baselines: dict[str, stats.Interval]
    verdicts: dict[str, str]  # baseline -> better | worse | equivalent (within ±d) | ...
    unrun: str = "not run"  # the norm's cell where it has no value (its jobs' outcome, if any)
    planned: dict[str, int] = field(default_factory=dict)  # baseline -> the seeds an undecided
    # verdict's plan asks for (stats.seeds_needed from the first seeds), at most the cap


def _versus(values: pd.Series, base: pd.Series, q: dict, slot: Slot, arms: tuple[str, str],
            found) -> tuple[str, int | None]:  # fmt: skip
    """The norm against one baseline on one quantity: the paired difference, oriented so that
    above 0 is better, decided as a claim (gates, boundary, equivalence band) at the slot's
    reproduction's seeds; with the seeds its plan asks for where it is undecided and short of
    them (up to the cap, as `reproduce.py NAME --decide` plans)."""
    pair = pd.concat([values, base], axis=1, keys=["n", "b"]).dropna()
    sign = 1.0 if q["better"] == "higher" else -1.0
    delta = float(q["delta"])
    claim = Claim(f"{arms[0]} vs {arms[1]}", "", q["name"], list(sign * (pair["n"] - pair["b"])),
                  (0.0, stats.ABOVE), source="ours", why="a report card's comparison",
                  arms=tuple(g.format(arm=a) for a in arms for g in q.get("gates", ["{arm}"])),
                  final=bool(q.get("final", True)), absent=(-delta, delta),
                  absent_why=slot.delta_why)  # fmt: skip
    decision = gates.decide([claim], found, slot.initial, slot.cap)[0]
    kind = verdict_kind(decision.verdict)
    if kind == gates.ABSENT:
        return f"equivalent (within ±{delta:g})", None
    if kind == "invalid":
        return decision.verdict.split("; would")[0], None
    planned = decision.planned_n if kind == "undecided" and decision.tested else None
    if not planned:
        return VERDICTS.get(kind, kind), None
    if planned <= len(pair):  # run to its plan (or past it) and still undecided
        return VERDICTS.get(kind, kind), min(planned, slot.cap)
    more = f"~{planned} seeds would decide it" + (f", past the cap {slot.cap}"
                                                  if planned > slot.cap else "")  # fmt: skip
    return f"{VERDICTS.get(kind, kind)} ({more})", min(planned, slot.cap)


def rows(slot: Slot, norm: str, data: pd.DataFrame, smoke: bool = False) -> list[Row]:
    """The slot's rows for a norm, from runs.csv rows holding its arm and the baselines'."""
    arm = slot.arm(norm)
    gate_arms = sorted({g.format(arm=a) for q in slot.quantities for g in q.get("gates", ["{arm}"])
                        for a in [arm, *(slot.arm(b) for b in slot.baselines)]})  # fmt: skip
    found = gates.gates(data, gate_arms)
    out = []
    for q in slot.quantities:
        values = KINDS[q["kind"]](data, arm, q)
        bases = {b: KINDS[q["kind"]](data, slot.arm(b), q) for b in slot.baselines if b != norm}
        decided = {b: (SMOKE, None) if smoke else ("not run", None) if values.empty or v.empty
                   else _versus(values, v, q, slot, (arm, slot.arm(b)), found)
                   for b, v in bases.items()}  # fmt: skip
        out.append(Row(slot.title, slot.reproduction, q["name"], q["better"],
                       stats.Interval.of(list(values)),
                       {b: stats.Interval.of(list(v)) for b, v in bases.items()},
                       {b: text for b, (text, _) in decided.items()},
                       planned={b: n for b, (_, n) in decided.items() if n}))  # fmt: skip
    return out


def seeds_to_decide(rows: list[Row]) -> int | None:
    """The seeds a slot's undecided verdicts plan for (the largest plan, at most the cap), or
    None where every verdict is decided (or plans none)."""
    plans = [n for r in rows for n in r.planned.values()]
    return max(plans) if plans else None


def _cell(i: stats.Interval, unrun: str = "not run") -> str:
    if i.n == 0 or math.isnan(i.mean):
        return unrun
    ci = f" [{i.low:.3g}, {i.high:.3g}]" if i.known else ""
    return f"{i.mean:.3g}{ci} (n={i.n})"


def table(card: list[Row | tuple[Slot, str]]) -> pd.DataFrame:
    """The card as one table: a row per slot quantity (or per slot not applicable / not run)."""
    out = []
    for r in card:
        if isinstance(r, tuple):
            slot, why = r
            out.append({"slot": slot.title, "reproduction": slot.reproduction, "quantity": "",
                        "better": "", "norm": why, "baselines": "", "verdicts": ""})  # fmt: skip
            continue
        out.append({"slot": r.slot, "reproduction": r.reproduction, "quantity": r.quantity,
                    "better": r.better, "norm": _cell(r.norm, r.unrun),
                    "baselines": "; ".join(f"{b} {_cell(i)}" for b, i in r.baselines.items()),
                    "verdicts": "; ".join(f"vs {b}: {v}" for b, v in r.verdicts.items())})
    return pd.DataFrame(out)


def markdown(norm: str, frame: pd.DataFrame, header: list[str]) -> str:
    """The card's md: its header lines, then the table."""
    columns = ["slot", "quantity (better)", f"{norm} mean [95% CI]", "baselines", "verdict"]
    body = [(r.slot, f"{r.quantity} ({r.better})" if r.quantity else "", r.norm, r.baselines,
             r.verdicts) for r in frame.itertuples()]  # fmt: skip
    return "\n".join([*header, "", markdown_table(columns, body), ""])


def figure(norm: str, card: list[Row], path: Path) -> None:
    """Per slot quantity, the norm beside its baselines with 95% intervals."""
    # lazy: matplotlib loads only where a card is drawn, after report has set the Agg backend
    import matplotlib.pyplot as plt  # noqa: PLC0415

    shown = [r for r in card if isinstance(r, Row)]
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(2.6 * max(1, len(shown)), 3.2),
                             squeeze=False)  # fmt: skip
    for ax, r in zip(axes[0], shown, strict=False):
        names = [norm, *r.baselines]
        ints = [r.norm, *r.baselines.values()]
        for k, i in enumerate(ints):
            if i.n and not math.isnan(i.mean):
                err = [[i.mean - i.low], [i.high - i.mean]] if i.known else None
                ax.errorbar(k, i.mean, yerr=err, fmt="o", color="C0" if k == 0 else "C7")
        ax.set_xticks(range(len(names)), names, rotation=45, fontsize=7)
        ax.set_title(f"{r.reproduction}\n{r.quantity}", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def leaderboard(cards: dict[str, pd.DataFrame]) -> str:
    """The built-in norms' cards as one table: norms as rows, slot quantities as columns, each
    cell the norm's mean and its verdict against the slot's reference norm (its first baseline;
    the full list of verdicts is in each card), '-' where the norm did not run there."""
    # a column per slot quantity: two slots of one reproduction (bn_lenet's MLP and LeNet) may
    # read the same quantity
    columns = list(dict.fromkeys(f"{r.reproduction}, {r.slot}: {r.quantity}"
                                 for c in cards.values() for r in c.itertuples() if r.quantity))
    body = []
    for norm, c in cards.items():
        cells = {}
        for r in c.itertuples():
            if not r.quantity or r.norm == "not run":
                continue
            # the first verdict, without the seeds its plan asks for (the card itself says them)
            first = re.sub(r" \(~\d+ seeds[^)]*\)", "", str(r.verdicts).split("; ")[0])
            cells[f"{r.reproduction}, {r.slot}: {r.quantity}"] = (
                f"{r.norm.split(' [')[0].split(' (n=')[0]} ({first})" if first else r.norm)
        body.append((norm, *(cells.get(k, "-") for k in columns)))
    return markdown_table(["norm", *columns], body)


# How to run a card, as docs/cards.md ends (report_card.leaderboard writes it)
RUN_A_CARD = """## Put a norm of your own through it

```
python scripts/reproduce.py card --norm meanonly --plugin examples.my_norm --budget quick
python scripts/reproduce.py card --norm meanonly --plugin examples.my_norm
python scripts/reproduce.py card --norm meanonly --plugin examples.my_norm --decide
```

- `--budget quick`: a smoke run of minutes (every slot a few steps), written under the ignored
  outputs/cards/quick/, labelled "smoke: not evidence", with no verdicts.
- the default budget (`card`): evidence. Each slot runs its reproduction's grid, cut to the
  slot's question, at the reproduction's first seeds; the command prints its estimate first
  (from the committed jobs' wall times), its progress as jobs end, and a continue line when
  interrupted (finished jobs are reused).
- `--decide`: a slot whose verdicts are undecided at its first seeds runs on to the seeds they
  plan for, then to the reproduction's cap where still undecided (the reproductions' three
  looks, `reproduce.py NAME --decide`).
- Baselines: a slot compares the norm with its reproduction's committed arms. An arm trained
  under older training code is replayed first, its first steps under today's code against the
  committed values (the slot's `replay:`, normlab.analysis.baselines): read where they match,
  retrained beside the norm where they differ or no replay is declared. The card's md tables
  each arm as read or retrained, and why. `--retrain-baselines` retrains every such arm,
  `--reuse-baselines` reads them unchecked (a quick card's default: a smoke run is no evidence).

A norm is a registered name or a class path (`--norm pkg.Class`); `--plugin MODULE` imports the
module that registers it (examples/my_norm.py). A slot the norm cannot take (its traits, e.g.
batch statistics in a causal Transformer) reads "not applicable" with the reason."""
