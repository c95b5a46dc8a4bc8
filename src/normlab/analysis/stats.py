"""Claims as measurements: a per-seed quantity, its 95% t-interval, and a three-way verdict.

A claim holds when the whole interval lies on the paper's side of its threshold (inside the
paper's region), does not hold when the whole interval lies outside it, and is undecided
(within noise) otherwise. Ratios are averaged on the log scale (a geometric mean) and their
interval exponentiated back. A statistic of many values per seed (a median of step times, say)
gets a bootstrap interval instead (`bootstrap`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

LEVEL = 0.95
HOLDS, FAILS = "holds", "does not hold"
UNDECIDED = "undecided (within noise)"
MISSING = "undecided (fewer than 2 seeds, or a value not finite)"
CI_METHOD = (
    "95% Student-t interval of the mean over seeds (mean +- t(0.975, n-1) * sd / sqrt(n)); "
    "ratios on the log scale (geometric mean), exponentiated back"
)


@dataclass(frozen=True)
class Interval:
    """Mean of n per-seed values and its 95% t-interval (NaN: n < 2 or a value not finite); from
    `bootstrap`, the statistic of the pooled values (as `mean`), its interval and n groups."""

    mean: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float], log: bool = False) -> Interval:
        x = np.asarray(list(values), dtype=float)
        n = len(x)
        if log:
            with np.errstate(divide="ignore", invalid="ignore"):
                x = np.log(x)
        if n < 2 or not np.all(np.isfinite(x)):
            mean = float(x.mean()) if n and np.all(np.isfinite(x)) else math.nan
            back = math.exp(mean) if log and not math.isnan(mean) else mean
            return cls(back, math.nan, math.nan, n)
        mean, sem = float(x.mean()), float(x.std(ddof=1)) / math.sqrt(n)
        half = float(scipy_stats.t.ppf(0.5 + LEVEL / 2, n - 1)) * sem
        low, high = mean - half, mean + half
        if log:
            return cls(math.exp(mean), math.exp(low), math.exp(high), n)
        return cls(mean, low, high, n)

    @property
    def known(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))


def bootstrap(
    groups: Sequence[Sequence[float]],
    statistic: Callable[..., np.ndarray] = np.median,
    resamples: int = 10_000,
    seed: int = 0,
    level: float = LEVEL,
) -> Interval:
    """Percentile bootstrap interval of `statistic` over the values of all groups pooled.

    Each resample draws every group's values with replacement from that group alone (stratified:
    a group keeps its size, e.g. a seed's steps stay that seed's), pools them and applies
    `statistic(values, axis=-1)`; the interval is the (1 - level) / 2 and (1 + level) / 2
    quantiles of the resampled statistics. The RNG is seeded: the same values give the same
    interval. NaN interval when a group is empty or a value is not finite.
    """
    joint = bootstrap_joint(groups, lambda v, axis=-1: {"": statistic(v, axis=axis)},
                            resamples, seed, level)  # fmt: skip
    return joint[""] if joint else Interval(math.nan, math.nan, math.nan, len(groups))


def bootstrap_joint(
    groups: Sequence[Sequence[float]],
    statistics: Callable[..., dict[str, np.ndarray]],
    resamples: int = 10_000,
    seed: int = 0,
    level: float = LEVEL,
) -> dict[str, Interval]:
    """`bootstrap` of several statistics at once, on the same resamples: `statistics(values,
    axis=-1)` returns a dict of them (each as `bootstrap`'s statistic would), so what they
    share (the values drawn, a median two of them use) is computed once per resample. Each
    interval is the one `bootstrap` gives that statistic alone with the same seed; {} when a
    group is empty or a value is not finite."""
    arrays = [np.asarray(list(g), dtype=float) for g in groups]
    if not arrays or any(len(a) == 0 or not np.all(np.isfinite(a)) for a in arrays):
        return {}
    estimates = statistics(np.concatenate(arrays), axis=-1)
    rng = np.random.default_rng(seed)
    chunk = 1000  # resamples drawn at a time: memory of chunk x all values
    resampled: dict[str, list[np.ndarray]] = {k: [] for k in estimates}
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        drawn = [a[rng.integers(0, len(a), size=(size, len(a)))] for a in arrays]
        for k, values in statistics(np.concatenate(drawn, axis=1), axis=-1).items():
            resampled[k].append(values)
    quantiles = [(1 - level) / 2, (1 + level) / 2]
    intervals = {}
    for k, estimate in estimates.items():
        low, high = np.quantile(np.concatenate(resampled[k]), quantiles)
        intervals[k] = Interval(float(estimate), float(low), float(high), len(arrays))
    return intervals


def verdict(interval: Interval, region: tuple[float, float], undecided: str = UNDECIDED) -> str:
    """holds: the interval inside `region` (the paper's side); does not hold: wholly outside it;
    otherwise `undecided`."""
    lo, hi = region
    if not interval.known:
        return MISSING
    if lo <= interval.low and interval.high <= hi:
        return HOLDS
    if interval.high < lo or interval.low > hi:
        return FAILS
    return undecided


def side(mean: float, region: tuple[float, float]) -> str:
    """The verdict a decided test takes: holds where the mean lies in `region`, else not."""
    lo, hi = region
    return HOLDS if lo <= mean <= hi else FAILS


def _num(x: float) -> str:
    return f"{x:g}"


def region_text(region: tuple[float, float]) -> tuple[str, str]:
    """How the rule states the paper's side and the other side of a region."""
    lo, hi = region
    if math.isinf(hi):
        return f"above {_num(lo)}", f"below {_num(lo)}"
    if math.isinf(lo):
        return f"below {_num(hi)}", f"above {_num(hi)}"
    return f"inside [{_num(lo)}, {_num(hi)}]", f"outside [{_num(lo)}, {_num(hi)}]"


ABOVE = math.inf  # readability: region=(2.0, ABOVE) is "above 2"
BELOW = -math.inf


# ----- seeds to a decision, p-values and Holm's correction ---------------------------------------


def _side_distance(mean: float, region: tuple[float, float]) -> float:
    """How far the mean lies from the bound the interval has to clear: inside the region, the
    nearer bound (to hold, the interval must fit inside); outside, the nearer bound too (to not
    hold, the interval must stay outside)."""
    lo, hi = region
    return min(abs(mean - b) for b in (lo, hi) if math.isfinite(b))


def _on_scale(
    values: Sequence[float], region: tuple[float, float], log: bool
) -> tuple[np.ndarray, tuple[float, float]]:
    """The values and the region on the scale the interval is taken on (log for a ratio)."""
    x = np.asarray(list(values), dtype=float)
    if not log:
        return x, region
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log(x)
    lo, hi = (math.log(b) if b > 0 else -math.inf for b in region)
    return x, (lo, hi)


def seeds_needed(
    values: Sequence[float], region: tuple[float, float], log: bool = False, limit: int = 10_000,
    level: float = LEVEL,
) -> int | None:  # fmt: skip
    """The smallest n whose t-interval at `level`, at the observed mean and SD of `values`,
    clears the bound nearest the mean: n with t((1 + level) / 2, n-1) * sd / sqrt(n) < distance.
    None when fewer than 2 finite values, or when no n up to `limit` does (the mean sits on a
    bound)."""
    x, region = _on_scale(values, region, log)
    if len(x) < 2 or not np.all(np.isfinite(x)):
        return None
    distance, sd = _side_distance(float(x.mean()), region), float(x.std(ddof=1))
    if sd == 0.0:
        return len(x) if distance > 0 else None
    n = np.arange(2, limit + 1)
    clears = scipy_stats.t.ppf(0.5 + level / 2, n - 1) * sd / np.sqrt(n) < distance
    return int(n[clears.argmax()]) if clears.any() else None


def p_value(values: Sequence[float], region: tuple[float, float], log: bool = False) -> float:
    """Two-sided p-value of the verdict: 2 x the one-sided p of the side the mean lies on (inside
    the region: the larger of the two one-sided t-tests against its finite bounds, as TOST does;
    outside: the t-test against the nearer bound). p < 0.05 exactly when the 95% CI decides."""
    x, (lo, hi) = _on_scale(values, region, log)
    if len(x) < 2 or not np.all(np.isfinite(x)):
        return math.nan
    n, mean, sd = len(x), float(x.mean()), float(x.std(ddof=1))
    if sd == 0.0:  # no spread: decided unless the mean sits on a bound
        return 1.0 if mean in (lo, hi) else 0.0
    se = sd / math.sqrt(n)
    t = scipy_stats.t(n - 1)
    if lo <= mean <= hi:  # toward holding: both finite bounds cleared
        p_one = max(float(t.sf((mean - lo) / se)) if math.isfinite(lo) else 0.0,
                    float(t.cdf((mean - hi) / se)) if math.isfinite(hi) else 0.0)  # fmt: skip
    else:  # toward not holding: beyond the nearer bound
        bound = lo if mean < lo else hi
        p_one = float(t.sf(abs(mean - bound) / se))
    return min(1.0, 2.0 * p_one)


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson's 95% score interval of a proportion k / n."""
    z = float(scipy_stats.norm.ppf(0.5 + LEVEL / 2))
    p, d = k / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return centre - half, centre + half


def proportions(k_a: int, n_a: int, k_b: int, n_b: int) -> tuple[Interval, float]:
    """The difference of two proportions k_a / n_a - k_b / n_b with Newcombe's 95% interval
    (from Wilson's per proportion), and Fisher's exact two-sided p-value of the 2x2 table."""
    if min(n_a, n_b) < 1:
        return Interval(math.nan, math.nan, math.nan, 0), math.nan
    pa, pb = k_a / n_a, k_b / n_b
    (la, ua), (lb, ub) = wilson(k_a, n_a), wilson(k_b, n_b)
    d = pa - pb
    low = d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)
    high = d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)
    table = [[k_a, n_a - k_a], [k_b, n_b - k_b]]
    p = float(scipy_stats.fisher_exact(table, alternative="two-sided")[1])
    return Interval(d, low, high, min(n_a, n_b)), p


def holm(p_values: Sequence[float], alpha: float = 1 - LEVEL) -> list[bool]:  # noqa: D401
    """Holm's step-down procedure: which hypotheses are rejected at family-wise level alpha
    (NaN p-values are not in the family and never rejected)."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    rejected = [False] * len(p_values)
    for rank, (p, i) in enumerate(tested):
        if p > alpha / (len(tested) - rank):
            break
        rejected[i] = True
    return rejected
