# Over 400 lines: the validity gates and the decision that reads them: one rule set
"""Validity gates and the decision on a reproduction's claims, shared by every reproduction.

Before a claim is read, its arms answer a reviewer's first questions, from runs.csv alone:
- trained: each seed's final val loss lies further than TRAINED_MARGIN below the trivial
  predictor's loss (ln 10 for 10 classes, the unigram loss for a character LM, 1 for a
  diffusion model's noise prediction);
- converged (for claims that compare final values): the arm's seeds improved by less than
  CONVERGED_GAIN on average over the last 20% of their steps. A seed's late gain is its
  held-out (val) loss's where that is logged in both windows, else its train loss's (the mean
  of the logged losses in the last 10% of steps against the mean of those in the 10% before the
  last 20%: a window each, so one noisy step does not decide). The held-out loss is the
  quantity the claims compare: a run whose held-out loss has stopped falling is trained as far
  as held-out quantities go, and its further steps fit the training set (a classifier without
  weight decay drives its train loss toward 0 long after its test error has settled); one whose
  held-out loss still falls is still improving, however flat its noisy train loss. The arm is
  judged by its seeds' mean (a seed whose loss rose counts as 0), as its claims read their
  means: a rule that failed it on any one seed would fail a plateaued arm more often the more
  seeds it ran, each seed's gain carrying its own noise;
- not saturated (for quantities with a ceiling): each seed's value stays below the ceiling.
A failed gate makes the claims that read the arm `invalid: <arm> did not train` (or `still
improving`, `saturated`): the number is shown, never read as a gap. Then, per claim: the seeds
its interval needs (planned from the first seeds' paired SD), and the family's verdicts under
Holm's correction.

runs.csv rows the gates read (metric names; `gate_rows` writes them from a job's logs):
- gate/train_loss (x = step), gate/val_loss (x = step, each logged; the last is the final),
  gate/trivial_loss;
- gate/value and gate/ceiling for the not-saturated gate (written by the analysis itself).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from normlab.analysis import sequential, stats
from normlab.analysis.logs import Run

TRAINED_MARGIN = 0.05  # "did not train": final val loss >= (1 - 5%) x the trivial loss
MIN_SEEDS = 3  # a verdict reads at least this many seeds
CONVERGED_GAIN = 0.02  # "still improving" at a constant lr: mean late gain above 2% + 2 SE
DECAYED = 0.01  # a schedule whose last lr is at most 1% of its peak decays to its floor
MIN_POINTS = 10  # a constant-lr window's logged points: fewer, and the gate is not measured
BUDGET = (0.8, 1.0)  # the budget test reads its quantity at 80% and 100% of the steps
LR_END = "gate/lr_end"  # runs.csv: a job's lr at its last step over its peak (its schedule)
DECAYS = "gate/lr_decays"  # runs.csv: 1 where the schedule decays to a floor at its end (cosine)
FLOORED = ("cosine", "exponential")  # the schedules that end at their floor (min_lr_ratio)
WINDOWS = ((0.7, 0.8), (0.9, 1.0))  # the converged gate's two windows, fractions of the steps
TRAIN_LOSS = "gate/train_loss"  # the runs.csv metric of the train loss the gate reads
VAL_LOSS = "gate/val_loss"  # and of the held-out loss (its last row per seed: the final)
WORDS = {"trained": "did not train", "converged": "still improving",
         "not saturated": "saturated", "budget": "budget-dependent"}  # fmt: skip
RULES = {
    "trained": f"each seed's final val loss below {1 - TRAINED_MARGIN:g} x the trivial "
    "predictor's (ln 10 for 10 classes; the unigram loss of a character LM; 1, the noise's "
    "variance, for a diffusion model)",
    "converged": "by the arm's lr schedule (runs.csv's gate/lr_end, gate/lr_decays). A schedule "
    "that decays to its floor (a cosine or an exponential decay to its optim.min_lr_ratio, or "
    "any schedule ending at "
    f"most {DECAYED:.0%} of its peak) passes "
    "when every seed ran it to its end, as the papers compare at the end of one schedule; "
    "then each claim comparing final values takes the budget test (below), and the late gain "
    "is shown as a diagnostic only. At a constant lr (or one that ends above the floor) the "
    f"seeds' mean late gain must stay below {CONVERGED_GAIN:.0%} plus 2 standard errors (the "
    "windows' own noise): a seed's late gain is its loss's relative fall over its last 20% of "
    "steps (mean of the logged losses in the last 10% of steps vs. in the 10% before the last "
    "20%), the held-out loss's where logged in both windows, else the train loss's; each window "
    f"needs at least {MIN_POINTS} logged points (else not measured); a rise counts as 0",
    "budget": "for a claim comparing final values of an arm on a decaying schedule: its "
    "per-seed quantity at 80% and 100% of the steps (where the quantity is measured at the end "
    "only, the held-out loss gap between its arms), extrapolated one more window at the same "
    "drift; if the verdict would change at the sequential boundary (a claim on that gap itself: "
    "its own, by its region; any other: the gap's sign), the claim reads `budget-dependent`",
    "not saturated": "each seed's value below the quantity's ceiling",
}


@dataclass(frozen=True)
class Gate:
    """One gate of one arm: passed (True/False) or not measured (None), with what was measured."""

    arm: str
    gate: str  # trained | converged | not saturated
    passed: bool | None
    measured: str
    # a decaying schedule's converged gate: per seed, its held-out (else train) loss at 80% and
    # 100% of the steps, read by the budget test of the claims on this arm
    ends: tuple[tuple[int, float, float], ...] = ()

    @property
    def status(self) -> str:
        if self.passed is None:
            return "not measured"
        return "pass" if self.passed else f"FAIL: {WORDS[self.gate]}"


# ----- runs.csv rows from a job's logs ---------------------------------------------------------


@cache
def unigram_loss(path: str, val_fraction: float = 0.1) -> float:
    """The cross-entropy (nats) on the val split of the best context-free predictor: each
    character's frequency in the training split (the split of normlab.data.shakespeare)."""
    text = Path(path).read_text()
    cut = int(len(text) * (1 - val_fraction))
    train, val = Counter(text[:cut]), Counter(text[cut:])
    total_train, total_val = sum(train.values()), sum(val.values())
    # a character absent from the training split has no probability: it cannot be predicted
    return -sum(k / total_val * math.log(train[c] / total_train) for c, k in val.items()
                if train[c])  # fmt: skip


def trivial_loss(run: Run) -> float:
    """The trivial predictor's loss for a job's data: ln(classes), the unigram loss, or for a
    diffusion model's noise prediction 1 (predicting zero noise: the MSE is the noise's unit
    variance)."""
    if "Diffusion" in str(run.setting("model._target_", "")):
        return 1.0
    target = str(run.setting("data._target_", ""))
    if "Shakespeare" not in target:  # the image data sets: 10 classes
        return math.log(10)
    root = Path(str(run.setting("data.root")))
    return unigram_loss(str(root / "tinyshakespeare" / "input.txt"),
                        float(run.setting("data.val_fraction", 0.1)))  # fmt: skip


def gate_rows(run: Run, arm: str, seed: int) -> list[tuple]:
    """The rows the trained and converged gates read, from one job's metrics.csv; none for a
    job that neither finished nor diverged (as `curves.val_loss_rows`)."""
    if run.status not in ("ok", "diverged"):
        return []
    rows = [(arm, seed, math.nan, "gate/trivial_loss", trivial_loss(run))]
    for key in ("train/loss_step", "train/loss"):
        curve = run.series(key)
        if len(curve):
            rows += [(arm, seed, float(s), TRAIN_LOSS, float(v))
                     for s, v in zip(curve["step"], curve[key], strict=True)]  # fmt: skip
            break
    val = run.series("val/loss").drop_duplicates("step", keep="last")  # a resumed job: once
    rows += [(arm, seed, float(s), VAL_LOSS, float(v))
             for s, v in zip(val["step"], val["val/loss"], strict=True)]  # fmt: skip
    steps = max((r[2] for r in rows if r[3] in (TRAIN_LOSS, VAL_LOSS)), default=math.nan)
    optim = {k: run.setting(f"optim.{k}") for k in ("schedule", "warmup_steps", "min_lr_ratio")}
    if optim["schedule"] is not None and not math.isnan(steps):
        rows += schedule_rows(arm, seed, optim, int(steps) + 1)
    return rows


def schedule_rows(arm: str, seed: int, optim: dict, steps: int) -> list[tuple]:
    """The runs.csv row of a job's schedule (LR_END): its lr at its last step over its peak,
    from its config's optim.schedule, warmup_steps and min_lr_ratio over its `steps`."""
    from normlab.tasks.base import lr_lambda  # lazy: torch loads only where a job is read

    factor = lr_lambda(str(optim["schedule"]), int(optim.get("warmup_steps") or 0),
                       lambda: steps, float(optim.get("min_lr_ratio") or 0.0))  # fmt: skip
    end = float(factor(steps - 1))
    floored = str(optim["schedule"]) in FLOORED or end <= DECAYED
    return [(arm, seed, math.nan, LR_END, end), (arm, seed, math.nan, DECAYS, float(floored))]


# ----- the gates, from runs.csv ----------------------------------------------------------------


def _windows(curve: pd.Series) -> tuple[pd.Series, pd.Series]:
    """A loss curve's (indexed by step) logged losses in the gate's two WINDOWS: steps in
    (70%, 80%] of the last step, and in (90%, 100%]."""
    last = float(curve.index.max())
    return tuple(curve[(curve.index > a * last) & (curve.index <= b * last)] for a, b in WINDOWS)


def late_gain(curve: pd.Series) -> float:
    """Relative improvement of a loss curve (indexed by step) over its last 20% of steps: the
    mean over its first window against the mean over its last."""
    before, end = _windows(curve)
    if not len(before) or not len(end):
        return math.nan
    return (float(before.mean()) - float(end.mean())) / float(before.mean())


def late_gain_se(curve: pd.Series) -> float:
    """The standard error of `late_gain` from the spread of the logged losses within its two
    windows (NaN with fewer than 2 in either): the noise a single seed's gain carries."""
    before, end = _windows(curve)
    if len(before) < 2 or len(end) < 2:
        return math.nan
    var = before.var() / len(before) + end.var() / len(end)
    return math.sqrt(float(var)) / float(before.mean())


def _seeds(data: pd.DataFrame, arm: str, metric: str) -> pd.DataFrame:
    return data[(data["arm"] == arm) & (data["metric"] == metric)]


def trained(data: pd.DataFrame, arm: str) -> Gate:
    val, trivial = _seeds(data, arm, VAL_LOSS), _seeds(data, arm, "gate/trivial_loss")
    if val.empty or trivial.empty:
        return Gate(arm, "trained", None, "no val loss in runs.csv")
    ref = float(trivial["value"].iloc[0])
    final = val.sort_values("x", kind="stable").groupby("seed")["value"].last()
    stuck = int((final >= (1 - TRAINED_MARGIN) * ref).sum())
    # a diverged job the analysis keeps no loss curve of: named, as its claims leave it out
    flagged = _seeds(data, arm, "diverged")
    gone = sorted({int(s) for s in flagged.loc[flagged["value"] == 1, "seed"]} - set(final.index))
    seeds = ", ".join(map(str, gone))
    named = f"; {len(gone)} diverged, no final loss (seed {seeds})" if gone else ""
    return Gate(arm, "trained", stuck == 0,
                f"final val loss {final.min():.3f}-{final.max():.3f} vs trivial {ref:.3f}; "
                f"{stuck} of {len(final)} seeds within {TRAINED_MARGIN:.0%}{named}")  # fmt: skip


def _per_seed(curves: pd.DataFrame, of) -> pd.Series:
    """`of` (late_gain, late_gain_se) of each seed's curve (runs.csv rows of one metric)."""
    if curves.empty:
        return pd.Series(dtype=float)
    return curves.groupby("seed").apply(lambda g: of(g.set_index("x")["value"]),
                                        include_groups=False)  # fmt: skip


def _at(curve: pd.Series, fraction: float) -> float:
    """A loss curve (indexed by step) read at `fraction` of its last step, linearly interpolated
    between the logged steps on either side."""
    curve = curve.sort_index()
    x = fraction * float(curve.index.max())
    return float(np.interp(x, curve.index.astype(float), curve.to_numpy(dtype=float)))


def _chosen(data: pd.DataFrame, arm: str) -> pd.DataFrame:
    """Per seed, the curve the gate reads: the held-out loss's where logged in both windows,
    else the train loss's (rows of runs.csv, one metric per seed)."""
    train, held = _seeds(data, arm, TRAIN_LOSS), _seeds(data, arm, VAL_LOSS)
    out = []
    for seed in sorted(set(train["seed"]) | set(held["seed"])):
        own = held[held["seed"] == seed]
        if len(own) and all(len(w) for w in _windows(own.set_index("x")["value"])):
            out.append(own)
        elif len(train[train["seed"] == seed]):
            out.append(train[train["seed"] == seed])
    return pd.concat(out) if out else train


def converged(data: pd.DataFrame, arm: str) -> Gate:
    """The converged gate, by the arm's schedule (RULES['converged'])."""
    curves = _chosen(data, arm)
    if curves.empty:
        return Gate(arm, "converged", None, "no loss curve in runs.csv")
    gains = _per_seed(curves, late_gain)
    lr_end, decays = _seeds(data, arm, LR_END)["value"], _seeds(data, arm, DECAYS)["value"]
    if len(decays) and bool((decays == 1).all()):
        return _decayed(curves, gains, arm, float(lr_end.max()))
    return _constant(curves, gains, arm, "" if len(lr_end) else " (schedule not recorded)")


def _decayed(curves: pd.DataFrame, gains: pd.Series, arm: str, lr_end: float) -> Gate:
    """A decaying schedule: passed when every seed ran it to its end (its last logged step is
    the arm's), with each seed's loss at 80% and 100% of its steps for the budget test."""
    last = curves.groupby("seed")["x"].max()
    ran = bool(last.min() >= 0.99 * last.max())
    ends = tuple((int(seed), _at(g.set_index("x")["value"], BUDGET[0]),
                  _at(g.set_index("x")["value"], BUDGET[1]))
                 for seed, g in curves.groupby("seed"))  # fmt: skip
    short = "" if ran else f"; seeds ended at steps {int(last.min())}-{int(last.max())}"
    gain = f"{gains.min():+.1%} to {gains.max():+.1%}" if gains.notna().all() else "n/a"
    return Gate(arm, "converged", ran,
                f"schedule decays to {lr_end:.3g} x its peak; {len(last)} seeds ran it to step "
                f"{int(last.max())}{short}; late gain {gain} (diagnostic)", ends)  # fmt: skip


def _constant(curves: pd.DataFrame, gains: pd.Series, arm: str, note: str) -> Gate:
    """A constant lr: the seeds' mean late gain below CONVERGED_GAIN plus 2 SE of that mean
    (from the spread of the logged losses within each seed's windows)."""
    points = curves.groupby("seed").apply(
        lambda g: min(len(w) for w in _windows(g.set_index("x")["value"])), include_groups=False)
    if gains.isna().any() or int(points.min()) < MIN_POINTS:
        return Gate(arm, "converged", None,
                    f"a window holds {int(points.min())} logged points, fewer than {MIN_POINTS}: "
                    "log more often in the gate's windows")  # fmt: skip
    se = _per_seed(curves, late_gain_se)
    mean = float(gains.clip(lower=0.0).mean())
    se_mean = math.sqrt(float((se**2).sum())) / len(se)
    limit = CONVERGED_GAIN + 2 * se_mean
    return Gate(arm, "converged", mean < limit,
                f"constant lr{note}: late gain {gains.min():+.1%} to {gains.max():+.1%}; mean "
                f"{mean:+.1%} over {len(gains)} seeds against {CONVERGED_GAIN:.0%} + 2 SE = "
                f"{limit:.1%}")  # fmt: skip


def late_gain_gate(data: pd.DataFrame, arm: str) -> Gate:
    """The late-gain rule alone, whatever the schedule: a pilot choosing a budget reads it (the
    budget at which the loss stopped falling), as gn_batch_size's pilot chose its epochs."""
    curves = _seeds(data, arm, TRAIN_LOSS)
    if curves.empty:
        return Gate(arm, "converged", None, "no train-loss curve in runs.csv")
    gains = _per_seed(curves, late_gain)
    if gains.isna().any():
        return Gate(arm, "converged", None, "too few logged train losses for the rule")
    noise = _per_seed(curves, late_gain_se).max()
    # NaN where the held-out loss was not logged in both windows: the train loss decides alone
    held = _per_seed(_seeds(data, arm, VAL_LOSS), late_gain).reindex(gains.index)
    seed_gain = held.fillna(gains)  # each seed's: the held-out loss's where logged
    # a seed whose loss rose over the window gained nothing: it does not offset another's gain
    mean = float(seed_gain.clip(lower=0.0).mean())
    # the noise is shown, not used: a reader sees where one seed's gain is within its noise
    shown = "" if math.isnan(noise) else f" (a seed's SE up to {noise:.1%})"
    if held.notna().any():
        shown += f"; held-out loss's {held.min():+.1%} to {held.max():+.1%}"
    above = int((seed_gain >= CONVERGED_GAIN).sum())
    return Gate(arm, "converged", mean < CONVERGED_GAIN,
                f"late gain {gains.min():+.1%} to {gains.max():+.1%}{shown}; mean {mean:+.1%} "
                f"over {len(gains)} seeds ({above} at or above {CONVERGED_GAIN:.0%})")  # fmt: skip


def not_saturated(data: pd.DataFrame, arm: str) -> Gate:
    value, ceiling = _seeds(data, arm, "gate/value"), _seeds(data, arm, "gate/ceiling")
    if value.empty or ceiling.empty:
        return Gate(arm, "not saturated", None, "no ceiling for this quantity")
    at = value.merge(ceiling, on=["seed", "x"], suffixes=("", "_ceiling"))
    hit = int((at["value"] >= at["value_ceiling"]).sum())
    ratio = (at["value"] / at["value_ceiling"]).max()
    return Gate(arm, "not saturated", hit == 0,
                f"up to {ratio:.2f} x the ceiling; {hit} of {len(at)} values at it")  # fmt: skip


def by_arm(data: pd.DataFrame) -> defaultdict[str, pd.DataFrame]:
    """runs.csv's rows split by arm, each arm's in their order (an arm without rows: none): a
    gate reads one arm's rows, and selecting them from a long runs.csv (~450k rows) for each
    gate costs more than the gate."""
    split = {str(arm): rows for arm, rows in data.groupby("arm", sort=False)}
    return defaultdict(lambda: data.iloc[:0], split)


def gates(data: pd.DataFrame, arms: list[str]) -> list[Gate]:
    """Every gate of every arm that has the rows it reads (a gate with none is left out)."""
    found, rows = [], by_arm(data)
    for arm in arms:
        own = rows[arm]
        for gate in (trained(own, arm), converged(own, arm), not_saturated(own, arm)):
            if gate.passed is not None or gate.gate != "not saturated":
                found.append(gate)
    return found


# ----- the decision: gates, seeds to a decision, Holm ------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the md and claims.csv say of a claim after its gates, planned seeds and Holm."""

    verdict: str
    holm: str
    planned_n: int | None
    p_value: float
    gates: str
    tested: bool = True  # False where its gates or `precluded` keep it from being read


def _failed(claim, found: list[Gate]) -> list[Gate]:
    """The gates that keep a claim from being read: trained and not saturated on its arms (and
    converged where it compares final values, shown, not assumed). A ceiling that can only
    understate the claim's side leaves a "holds" valid; a did-not-train that is the failure the
    claim tests answers it (`_answered`)."""
    if hasattr(claim, "parts"):  # any of k parts: `_valid_parts` decides it on its valid ones
        return list(dict.fromkeys(g for part in claim.parts.values() for g in _failed(part, found)))
    wanted = {"trained", "not saturated"} | ({"converged"} if claim.final else set())
    holds = claim.verdict == stats.HOLDS
    failed = [g for g in found if g.arm in claim.arms and g.gate in wanted and g.passed is False
              and not (g.gate == "not saturated" and holds and g.arm in claim.ceiling_against)
              and not (g.gate == "trained" and g.arm in claim.untrained_answers)]  # fmt: skip
    if claim.final:  # final values compared: each arm must be shown converged, not assumed
        shown = {g.arm for g in found if g.gate == "converged" and g.passed is not None}
        untrained = {g.arm for g in found if g.gate == "trained" and g.passed is False}
        failed += [Gate(a, "converged", None, "not measured") for a in claim.arms
                   if a not in shown and a not in untrained]  # fmt: skip
    if any(g.gate == "trained" for g in failed if g.arm in claim.untrained_answers):
        return failed
    # an arm that did not train, where that answers the claim, is not asked to converge
    answered = {g.arm for g in found if g.gate == "trained" and g.passed is False
                and g.arm in claim.untrained_answers}  # fmt: skip
    return [g for g in failed if not (g.arm in answered and g.gate == "converged")]


def _answered(claim, found: list[Gate]) -> str:
    """The words a verdict gains where an arm's not training is the failure the claim tests."""
    arms = [g.arm for g in found if g.gate == "trained" and g.passed is False
            and g.arm in getattr(claim, "untrained_answers", ())]  # fmt: skip
    return f" ({', '.join(arms)} did not train: the failure the claim tests)" if arms else ""


def _valid_parts(claim, found: list[Gate]):
    """An any-of claim decided on its valid parts: the claim with only the parts whose arms pass
    their gates (itself where every part passes, or none does)."""
    valid = {k: p for k, p in claim.parts.items() if not _failed(p, found)}
    if not valid or len(valid) == len(claim.parts):
        return claim, _failed(claim, found)
    reduced = replace(claim, parts=valid)
    if reduced.verdict == stats.HOLDS:  # one valid part holds: the invalid ones cannot undo it
        return reduced, []
    return claim, _failed(claim, found)


# what would decide a claim a gate keeps from being read, by the gate's failure
FIXES = {
    "did not train": "a setting at which the arm trains",
    "still improving": "a longer budget at this lr (or the paper's lr decay)",
    "saturated": "a setting below the quantity's ceiling (a lower lr)",
    "not measured": "its gate rows (scripts/regate.py) or more logged points",
}


def _fixes(fail: list[Gate]) -> str:
    """'; would decide it: ...' for the gates a claim failed."""
    words = dict.fromkeys(FIXES["not measured"] if g.passed is None else FIXES[WORDS[g.gate]]
                          for g in fail)  # fmt: skip
    return f"; would decide it: {' and '.join(words)}"


def _word(gate: Gate) -> str:
    """What a gate that keeps a claim from being read says of its arm."""
    return WORDS[gate.gate] if gate.passed is False else f"{gate.gate} not measured"


def _values(claim) -> tuple[list[float], tuple[float, float], bool] | None:
    """The per-seed values, region and scale a claim is decided on (None: an interval computed
    elsewhere, as a bootstrap)."""
    if hasattr(claim, "parts"):
        if not claim.parts:
            return None
        part = claim.parts[claim.deciding]
        return part.values, part.region, part.log
    if hasattr(claim, "values"):
        return claim.values, claim.region, claim.log
    return None


def _p(claim) -> float:
    if hasattr(claim, "p_value"):  # a test of its own (CountClaim: Fisher's exact test)
        return claim.p_value
    if hasattr(claim, "parts"):  # any of k parts: Bonferroni within the claim
        ps = [stats.p_value(p.values, p.region, p.log) for p in claim.parts.values()]
        ps = [p for p in ps if not math.isnan(p)]
        return min(1.0, min(ps) * len(claim.parts)) if ps else math.nan
    if hasattr(claim, "values"):
        return stats.p_value(claim.values, claim.region, claim.log)
    return math.nan


def _side(claim) -> str:
    region = claim.region if hasattr(claim, "region") else claim.parts[claim.deciding].region
    return stats.side(claim.interval.mean, region)


def _sequential(claim, p: float) -> tuple[str, float]:
    """The claim's verdict at the sequential boundary, and the p it was decided by: a verdict
    its 95% CI reaches but whose p is not below the boundary stays undecided; where it does not
    hold and it has an equivalence band, "absent" if the two one-sided tests clear it."""
    verdict = claim.verdict
    if verdict in (stats.HOLDS, stats.FAILS) and not math.isnan(p) and p >= sequential.BOUNDARY:
        verdict = f"{getattr(claim, 'undecided', stats.UNDECIDED)}; not past the boundary"
    band, picked = getattr(claim, "absent", None), _values(claim)
    if band is None or picked is None or verdict == stats.HOLDS:
        return verdict, p
    p_absent = stats.p_value(picked[0], band, picked[2])
    inside = band[0] <= stats.Interval.of(picked[0], picked[2]).mean <= band[1]
    if inside and p_absent < sequential.BOUNDARY:
        half = (band[1] - band[0]) / 2
        return f"{ABSENT} (within ±{half:.3g})", p_absent
    return verdict, p


ABSENT = "absent at this scale"


def _budget(claim, found: list[Gate]) -> str:
    """The budget test of a claim comparing final values (RULES['budget']): the pair of arms
    whose held-out loss gap would change its verdict one window on, or ''. A `held_out` claim's
    values are that gap of its first two arms, so its own region decides; any other's, the
    gap's sign."""
    if not getattr(claim, "final", False):
        return ""
    ends = {g.arm: {s: (a, b) for s, a, b in g.ends} for g in found
            if g.gate == "converged" and g.ends}  # fmt: skip
    own = getattr(claim, "held_out", False)
    arms = [a for a in (claim.arms[:2] if own else claim_arms(claim)) if a in ends]
    region = claim.region if own else (0.0, stats.ABOVE)
    for other in arms[1:]:
        seeds = sorted(set(ends[arms[0]]) & set(ends[other]))
        if len(seeds) < MIN_SEEDS:
            continue
        gap = [(ends[arms[0]][s][1] - ends[other][s][1], ends[arms[0]][s][0] - ends[other][s][0])
               for s in seeds]  # fmt: skip
        now = [g100 for g100, _ in gap]
        later = [2 * g100 - g80 for g100, g80 in gap]
        if _decided(now, region) != _decided(later, region):
            return f"{arms[0]} against {other}"
    return ""


def claim_arms(claim) -> tuple[str, ...]:
    """The arms a claim reads (an AnyClaim: its own and every part's), in order: the grids that
    run them are the ones its planned seeds extend (`reproduce.py NAME --decide`)."""
    parts = getattr(claim, "parts", {}).values()
    return tuple(dict.fromkeys([*claim.arms, *(a for part in parts for a in part.arms)]))


def _decided(values: list[float], region: tuple[float, float]) -> str:
    """Which side of `region` the values' mean is past at the sequential boundary ('' where
    neither): the verdict the budget test compares now and one window on."""
    if stats.p_value(values, region) >= sequential.BOUNDARY:
        return ""
    return stats.side(sum(values) / len(values), region)


def decide(claims: list, found: list[Gate], initial: int,
           cap: int | sequential.Caps) -> list[Decision]:  # fmt: skip
    """Per claim: its verdict after the gates and the budget test, decided at the sequential
    boundary (normlab.analysis.sequential); the seeds its interval needs, planned from its first
    `initial` values (seeds in order) and capped at `cap` (or at the raised cap of a grid whose
    arms it reads); the verdict under Holm's correction at the boundary over the claims that
    passed their gates."""
    caps = sequential.Caps.given(cap)
    read = [_valid_parts(c, found) if hasattr(c, "parts") else (c, _failed(c, found))
            for c in claims]  # fmt: skip
    budget = [_budget(c, found) if not f else "" for c, f in read]
    decided = [(c.verdict, math.nan) if f or b or c.precluded else _sequential(c, _p(c))
               for (c, f), b in zip(read, budget, strict=True)]  # fmt: skip
    ps = [p for _, p in decided]
    rejected = stats.holm(ps, alpha=sequential.BOUNDARY)
    return [_decision(c, f, b, v, p, rej, initial, caps.of(claim_arms(c)), found)
            for (c, f), b, (v, p), rej in zip(read, budget, decided, rejected, strict=True)]


def _decision(claim, fail: list[Gate], budget: str, verdict: str, p: float, rej: bool,
              initial: int, cap: int, found: list[Gate]) -> Decision:  # fmt: skip
    """One claim's Decision (decide's body, claim by claim)."""
    gate_text = "; ".join(f"{g.arm} {_word(g)}" for g in fail)
    picked = _values(claim)
    planned = (None if picked is None or claim.precluded else
               stats.seeds_needed(picked[0][:initial], picked[1], picked[2],
                                  level=1 - sequential.BOUNDARY))  # fmt: skip
    if picked is not None and 0 < len(picked[0]) < MIN_SEEDS:  # no verdict, not even invalid
        verdict = holm = f"undecided ({len(picked[0])} seeds, fewer than {MIN_SEEDS})"
        return Decision(verdict, holm, planned, p, gate_text or "pass")
    precluded = claim.precluded
    tested = not fail and not precluded and not budget
    if fail:  # and where also precluded, both reasons: the family line counts each
        verdict = holm = (f"invalid: {gate_text}" + (f"; {precluded}" if precluded else "")
                          + _fixes(fail))  # fmt: skip
    elif precluded:  # e.g. unreachable by construction: shown, not tested
        verdict = holm = precluded
    elif budget:
        verdict = holm = f"budget-dependent: {budget}"
    elif math.isnan(p):
        holm = "n/a (interval not from seeds)" if picked is None else verdict
    elif verdict.startswith(ABSENT):
        holm = verdict if rej else stats.UNDECIDED
    else:
        holm = _side(claim) if rej else stats.UNDECIDED
    if tested:
        verdict += _answered(claim, found)
    if tested and verdict.startswith("undecided") and planned and planned > cap:
        verdict = f"{verdict}; needs ~{planned} seeds (cap {cap})"
    return Decision(verdict, holm, planned, p, gate_text or "pass", tested)
