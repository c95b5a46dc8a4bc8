"""The sequential design the reproductions' seeds follow, and its error rate by simulation.

A claim is looked at up to three times: at its first seeds (`initial`), at the seeds its first
look plans (`stats.seeds_needed`, at most the cap), and at the cap. Every look decides at the
same nominal level, Pocock's boundary for three looks at a two-sided 0.05 (Pocock 1977; Jennison
& Turnbull 2000, Table 2.1: c = 2.289, so a nominal two-sided p of 0.0221): a verdict at any look
needs p below it. The looks' times depend on the first look's data, which Pocock's constant does
not cover by theory, so `simulate` runs the whole procedure on claims whose true effect sits
exactly on their bound (the worst case for a false "holds") and counts the false "holds": the
rate the md and docs/reproductions.md state. `python -m normlab.analysis.sequential` prints the
table (per look, overall, and family-wise under Holm at the same boundary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

LOOKS = 3  # first seeds, the plan, the cap
POCOCK_C = 2.289  # Pocock's constant boundary, K = 3 looks, two-sided alpha 0.05
BOUNDARY = 2.0 * float(scipy_stats.norm.sf(POCOCK_C))  # each look's nominal two-sided p: 0.0221
DESIGN = (
    f"group-sequential, looks at the first seeds, at the seeds the first look plans and at the "
    f"cap; each look decides only when the verdict's two-sided p is below {BOUNDARY:.4f} "
    f"(Pocock's boundary for {LOOKS} looks at a two-sided 0.05: c = {POCOCK_C}); "
    "the false 'holds' rate of the whole procedure, simulated, is in docs/reproductions.md"
)


def _t_half(n: np.ndarray) -> np.ndarray:
    """The t multiplier of a two-sided interval at the boundary's level, for n values."""
    return scipy_stats.t.isf(BOUNDARY / 2, n - 1)


def _look(x: np.ndarray, n: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the mean and the t statistic against `bound` of its first n[i] values."""
    idx = np.arange(x.shape[1])[None, :] < n[:, None]
    cnt = n.astype(float)
    mean = np.where(idx, x, 0.0).sum(1) / cnt
    var = (np.where(idx, (x - mean[:, None]) ** 2, 0.0)).sum(1) / (cnt - 1)
    t = (mean - bound) / np.sqrt(var / cnt)
    return mean, t


def _plan(mean: np.ndarray, sd: np.ndarray, bound: float, initial: int, cap: int) -> np.ndarray:
    """The seeds each claim's first look plans (stats.seeds_needed at the boundary's level),
    capped; the cap where no n up to it clears."""
    ns = np.arange(2, cap + 1)
    half = _t_half(ns)[None, :] * sd[:, None] / np.sqrt(ns)[None, :]
    clears = half < np.abs(mean - bound)[:, None]
    first = np.where(clears.any(1), ns[clears.argmax(1)], cap)
    return np.clip(first, initial, cap)


@dataclass(frozen=True)
class Simulated:
    """False 'holds' of claims whose true effect sits on their bound: by look and overall."""

    claims: int
    per_look: tuple[float, ...]  # the fraction first declared "holds" at look k
    overall: float
    mean_seeds: float


def simulate(claims: int = 10_000, initial: int = 3, cap: int = 12, seed: int = 0,
             sd: float = 1.0, raised: int | None = None,
             ) -> tuple[Simulated, np.ndarray, np.ndarray]:  # fmt: skip
    """Run `claims` null claims ("the effect lies above 0", true mean exactly 0, normal seeds)
    through the procedure: look at `initial` seeds; if undecided, at the plan; if still
    undecided and below the cap, at the cap; with `raised`, a cap raised after that look (a
    grid's `cap:`), once more at it. Returns the rates, and each claim's final p-value and
    whether it was declared to hold (for the family-wise simulation)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, sd, size=(claims, cap))
    if raised:  # drawn after the cap's seeds: the design without the raise sees the same ones
        x = np.hstack([x, rng.normal(0.0, sd, size=(claims, raised - cap))])
    looks = LOOKS + bool(raised)
    bound = 0.0
    n = np.full(claims, initial)
    decided = np.zeros(claims, bool)
    holds = np.zeros(claims, bool)
    t_final = np.zeros(claims)
    per_look = []
    stops = n.copy()
    mean, t = _look(x, n, bound)
    for look in range(looks):
        crit = _t_half(n)
        now = ~decided & (np.abs(t) > crit)
        per_look.append(float((now & (t > 0)).mean()))
        holds |= now & (t > 0)
        decided |= now
        t_final = np.where(~decided | now, t, t_final)
        stops = np.where(now, n, stops)
        if look == 0:
            sd1 = np.sqrt(np.maximum(((x[:, :initial] - mean[:, None]) ** 2).sum(1) / (initial - 1),
                                     1e-300))  # fmt: skip
            nxt = _plan(mean, sd1, bound, initial, cap)
        else:
            nxt = np.full(claims, raised if raised and look >= 2 else cap)  # the cap, then raised
        move = ~decided & (nxt > n)
        if not move.any():
            if look < looks - 2:  # a raised cap's look may still come (a re-look changes none)
                continue
            break
        n = np.where(move, nxt, n)
        stops = np.where(~decided, n, stops)
        mean, t = _look(x, n, bound)
    df = stops - 1
    p = 2.0 * scipy_stats.t.sf(np.abs(t_final), df)
    result = Simulated(claims, tuple(per_look) + (0.0,) * (looks - len(per_look)),
                       float(holds.mean()), float(stops.mean()))  # fmt: skip
    return result, p, holds


def holm_family(families: int = 2_000, size: int = 16, initial: int = 3, cap: int = 12,
                seed: int = 1, raised: int | None = None) -> float:  # fmt: skip
    """The family-wise rate of at least one false 'holds' among `size` null claims, each run
    through the sequential procedure, decided under Holm's correction at the boundary."""
    _, p, holds = simulate(families * size, initial, cap, seed, raised=raised)
    p, holds = p.reshape(families, size), holds.reshape(families, size)
    order = np.sort(p, axis=1)
    steps = BOUNDARY / (size - np.arange(size))
    passed = np.cumprod(order <= steps[None, :], axis=1).astype(bool)
    threshold = np.where(passed.any(1), order[np.arange(families), passed.sum(1) - 1], -1.0)
    rejected = (p <= threshold[:, None]) & holds  # a false "holds": rejected on the holds side
    return float(rejected.any(1).mean())


@dataclass(frozen=True)
class Raise:
    """A grid's `cap:` in conf/reproduce/NAME.yaml: its claims' cap raised past the
    reproduction's after their look at it, with the reason (a fourth look, simulated)."""

    grid: str
    arms: frozenset[str]  # the grid's arms (fixed names: a raise names what it extends)
    cap: int
    why: str


@dataclass(frozen=True)
class Caps:
    """The most seeds a claim runs to: the reproduction's cap, or the raised cap of a grid whose
    arms it reads."""

    cap: int
    raised: tuple[Raise, ...] = ()

    @staticmethod
    def given(cap: int | Caps) -> Caps:
        """A Caps from a cap number (every claim's), or the Caps given."""
        return cap if isinstance(cap, Caps) else Caps(cap)

    def of(self, arms: list[str] | tuple[str, ...]) -> int:
        return max([self.cap, *(r.cap for r in self.raised if r.arms & set(arms))])

    def text(self) -> str:
        """The md's sentence on the raises ("" without one): each with its simulated rate."""
        return "".join(
            f" The {r.grid} grid's cap is raised to {r.cap} after its look at {self.cap} "
            f"({r.why}): a fourth look at the same boundary, whose simulated false 'holds' rate "
            f"over the whole procedure is {simulate(cap=self.cap, raised=r.cap)[0].overall:.4f}."
            for r in self.raised
        )


def table(claims: int = 10_000, initial: int = 3, cap: int = 12, raised: int | None = None) -> str:
    """The simulation's table, as docs/reproductions.md shows it (`raised`: with a grid's cap
    raised after the look at `cap`)."""
    sim, _, _ = simulate(claims, initial, cap, raised=raised)
    fam = holm_family(initial=initial, cap=cap, raised=raised)
    rows = [f"| look {k + 1} | {r:.4f} |" for k, r in enumerate(sim.per_look)]
    after = f", raised to {raised} after the look at {cap}" if raised else ""
    return "\n".join(
        [
            f"Null claims: {sim.claims} (true effect on the bound), seeds {initial} first, "
            f"cap {cap}{after}; boundary p < {BOUNDARY:.4f} at every look; mean seeds run "
            f"{sim.mean_seeds:.2f}.",
            "",
            "| false 'holds' | rate |",
            "|---|---|",
            *rows,
            f"| overall | {sim.overall:.4f} |",
            f"| family of 16 under Holm (2,000 families) | {fam:.4f} |",
        ]
    )


if __name__ == "__main__":
    print(table())
    print(f"\n{table(raised=15)}")  # dyt_vs_ln's dit_long grid (its `cap:`)
    print(
        f"\nnominal per-look level: {BOUNDARY:.4f}; one-sided: {BOUNDARY / 2:.4f}; "
        f"z {POCOCK_C} (math check: {2 * (1 - 0.5 * (1 + math.erf(POCOCK_C / 2**0.5))):.4f})"
    )
