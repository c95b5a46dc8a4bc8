# Over 400 lines: a declaration's grammar (kinds, each, groups, choices, any, thresholds) and checks
"""A reproduction's claims as data: the `claims:` list of conf/reproduce/NAME.yaml, built into
Claim objects (normlab.analysis.report) from the per-seed quantities its analysis extracted.

An entry says what a claim states and how it is tested; the analysis module gives the numbers
as a long table (arm, seed, x, metric, value: runs.csv's columns), of which an entry reads one
`quantity` (a metric) at an arm and, where the arm ran several, a setting `x` (e.g. a batch size).

    - claim: "GN's error is lower than BN's at b=2"   # the words the claim is tested in
      kind: difference                   # one of KINDS
      quantity: test/error               # the metric it reads
      of: {arm: batchnorm, x: 2}         # per seed: of - minus (ratio: of / over; count: of
      minus: {arm: groupnorm, x: 2}      #   against against; value: of as extracted)
      per_seed: "BN's test error minus GN's at b=2, points"
      region: {above: 0}                 # the paper's side: above / below / within [lo, hi]
      gates: [batchnorm/b2, groupnorm/b2]  # the gate arms that decide whether it is read
      final: true                        # compares final values (each arm must converge)
      source: paper                      # or ours, with `why`
      paper: "GN 24.1% vs BN 34.7%"      # the paper's number, quoted
      absent: {fraction: 0.1, paper: [23.6, 34.7], why: "..."}  # an equivalence band (BANDS)

A final difference of held-out losses (`held_out: true`; its first two gates are `of`'s arm and
`minus`'s) takes the budget test on its own region one window on; any other final claim, on the
sign of its arms' held-out loss gap (normlab.analysis.gates.RULES['budget']).

An `interval` claim reads no per-seed values: the analysis computes its interval (e.g. a
bootstrap over many values a seed) and passes it to `build` with how (`intervals`, by name);
the entry names it (`interval: "{arm}: r"`) and says what it is an estimate of (`estimate`).

A difference may `scale` its unit (100: an accuracy to points); a value may be `log` (a ratio).
A slope reads a list of arms, each `at` its abscissa (e.g. a depth): per seed, the least-squares
slope of log(quantity) on log(at) over the seeds with every point; with `minus`, a second list,
the first slope minus the second, paired by seed. `precluded: "{name}"` gives the verdict where
the values cannot answer the claim as run, in the analysis's words (empty: they can).

`each: {b: [16, 8, 4, 2]}` repeats an entry for each value ({b} in its strings and settings
replaced); `each: {lr: from_data}` for each value the analysis found in its data (`build`'s words
give lr as a list); `{each: ..., claims: [...]}` repeats a group of entries, in order (e.g. three
claims per lr). `present: [{arm, x}]` keeps an entry only where one of those has a value. The
analysis may fill other {name}s from its data (`build`'s words): a list's values are joined by
", " in a string, and an item of a list that names it is repeated for each value (a slope's arms,
its gates). A value may be picked by a word: `paper: {by: "{norm}", cases: {prmsnorm: "..."},
default: "..."}` is the case its filled `by` names (default: none does), e.g. a quote per norm
in one entry, so an `each` keeps its order. An `any` claim holds where any of its parts does:
its parts are the entries whose `part_of: {claim, label}` names it (e.g. a gap at each lr).
A declaration's `thresholds: {name: number}` fill {name} like words (a region may read
"{name}"), and its analysis shows them through `thresholds(NAME)`: each number has one home. A
claim no kind expresses stays code in its analysis module.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from normlab import layout
from normlab.analysis import stats
from normlab.analysis.report import PROVENANCE, AnyClaim, Claim, CountClaim, IntervalClaim

# the kinds, and the second operand each reads beside `of` (None: `of` alone)
KINDS = {
    "difference": "minus",  # per seed: of - minus, paired by seed
    "ratio": "over",  # per seed: of / over; its geometric mean, the CI on the log scale
    "value": None,  # per seed: of as extracted (a slope, a ratio taken within a seed)
    "count": "against",  # events (0 or 1 a seed) in `of` against `against`, each arm's seeds
    "slope": "minus",  # per seed: the log-log slope over `of`'s arms (minus `minus`'s), optional
    "interval": None,  # no per-seed values: the interval `build` is given by the name `interval`
    "any": None,  # holds where any of its parts does: the entries whose `part_of` names it
}
FROM_DATA = "from_data"  # `each: {name: from_data}`: the values `build`'s words give name
# an equivalence band's rules: a fraction of the paper's effect, one seed-to-seed SD of an
# arm's own quantity, or a band given as numbers; each with `why`, its words
BANDS = {"fraction": ("fraction", "paper"), "sd": ("sd",), "band": ("band",)}
KEYS = {"claim", "kind", "quantity", "of", *filter(None, KINDS.values()), "per_seed", "region",
        "gates", "final", "source", "why", "paper", "undecided", "log", "absent", "each",
        "present", "ceiling_against", "untrained_answers", "scale", "precluded", "interval",
        "estimate", "part_of", "held_out"}  # fmt: skip
REGIONS = {"above", "below", "within"}
CHOICE = {"by", "cases", "default"}  # a value picked by a word: {by, cases} and default, optional


def declaration(name: str, conf: Path | None = None) -> Path:
    """Where reproduction NAME is declared."""
    return (conf or layout.reproduce_dir()) / f"{name}.yaml"


def build(name: str, quantities: pd.DataFrame, words: dict | None = None,
          conf: Path | None = None, intervals: dict | None = None) -> list:  # fmt: skip
    """NAME's declared claims, in their order, with the per-seed values `quantities` gives;
    `words` fills the {name}s an entry's strings leave to the data (e.g. ln_rnn's {every});
    `intervals` gives an interval claim's {name: (stats.Interval, how it was computed)}."""
    path = declaration(name, conf)
    spec = yaml.safe_load(path.read_text())
    kept = [e for e in entries(spec, path, words or {}) if _present(e, quantities)]
    built = [_claim(e, quantities, intervals or {}) if e["kind"] != "any" else None for e in kept]
    return [c or _any(e, kept, built) for e, c in zip(kept, built, strict=True)]


def thresholds(name: str, conf: Path | None = None) -> dict:
    """NAME's declared `thresholds:` ({name: number}): the numbers its claims' rules use, for
    the figure and notes that show them."""
    return dict(yaml.safe_load(declaration(name, conf).read_text()).get("thresholds") or {})


def entries(spec: dict, path: Path, words: dict | None = None) -> list[dict]:
    """A declaration's claims entries, each repeated over its `each`, filled with `words` and
    checked: a bad kind, key, region, band or source, or an arm no grid declares, is a one-line
    error naming the yaml file and the entry. Without words (where a declaration is loaded,
    before any data) an entry over values from the data is checked once, its {names} unfilled."""
    arms = [a for g in spec.get("grids", {}).values() for a in g.get("arms", {})]
    arms += [f"{g}/${{norm}}" for g in spec.get("norm_grids", ())]  # --norm's (sweep.norm_arm)
    fixed = spec.get("thresholds") or {}
    clash = sorted(set(fixed) & set(words or {}))
    if clash:
        raise ValueError(f"{path}: thresholds {', '.join(clash)} are also words of the data")
    out = []
    for where, one in _expand(spec.get("claims") or [], f"{path}: claims", words):
        one = _choose(_fill(one, {**fixed, **(words or {})}), where)
        _check(one, arms, where)
        out.append((where, one))
    wholes = {e["claim"] for _, e in out if e["kind"] == "any"}
    for where, one in out:
        part_of = one.get("part_of")
        if part_of is not None and (not isinstance(part_of, dict) or set(part_of) != {"claim",
                                    "label"} or part_of["claim"] not in wholes):  # fmt: skip
            raise ValueError(f"{where}: part_of is {{claim, label}} naming an any claim "
                             f"declared here, got {part_of!r}")  # fmt: skip
    return [one for _, one in out]


def _where(at: str, entry: dict) -> str:
    words = entry.get("claim") if isinstance(entry, dict) else None
    return at + (f" ({words!r})" if words else "")


def _expand(listed: list, at: str, words: dict | None) -> list[tuple[str, dict]]:
    """Each entry of a claims list (a group's entries in turn) once per value of its `each`
    (several keys go together, value by value), with where it is declared."""
    out = []
    for k, entry in enumerate(listed):
        where = _where(f"{at}[{k}]", entry)
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: an entry is a mapping, got {entry!r}")
        if "claims" in entry and (set(entry) != {"each", "claims"}
                                  or not isinstance(entry["claims"], list)):  # fmt: skip
            raise ValueError(f"{where}: a group is {{each: ..., claims: [entries]}}, got keys "
                             f"{', '.join(entry)}")  # fmt: skip
        rest = {key: v for key, v in entry.items() if key != "each"}
        for bound in _values(entry.get("each"), where, words):
            one = _fill(rest, bound)
            at_values = "".join(f" at {key}={v}" for key, v in bound.items())
            if "claims" in one:  # a group: its entries, named under it
                out += _expand(one["claims"], f"{at}[{k}]{at_values}: claims", words)
            else:
                out.append((where + at_values, one))
    return out


def _values(each, where: str, words: dict | None) -> list[dict]:
    """The names an `each` binds, one dict per value: its lists, or the lists `words` give for
    its from_data names (none given: one unbound pass, so the entry is still checked)."""
    if each is None:
        return [{}]
    if isinstance(each, dict) and words is not None:
        found = {n for n, v in words.items() if isinstance(v, list)}
        missing = [n for n, v in each.items() if v == FROM_DATA and n not in found]
        if missing:
            raise ValueError(f"{where}: each {', '.join(missing)}: from_data, but the analysis "
                             "gives no list of its values")  # fmt: skip
        each = {n: words[n] if v == FROM_DATA else v for n, v in each.items()}
    elif isinstance(each, dict):
        each = {n: v for n, v in each.items() if v != FROM_DATA}
        if not each:
            return [{}]
    lengths = {len(v) for v in each.values()} if isinstance(each, dict) else set()
    if len(lengths) != 1 or not all(isinstance(v, list) for v in each.values()):
        raise ValueError(f"{where}: each maps names to lists of one length (or {FROM_DATA}), "
                         f"got {each!r}")  # fmt: skip
    return [dict(zip(each, values, strict=True)) for values in zip(*each.values(), strict=True)]


def _fill(value, names: dict):
    """`value` with each {name} in its strings replaced by that name's value: a list's values
    joined by ", ", except that an item of a list naming a list is repeated for each value."""
    if isinstance(value, str):
        for key, v in names.items():
            text = ", ".join(map(str, v)) if isinstance(v, list) else str(v)
            value = value.replace(f"{{{key}}}", text)
        return value
    if isinstance(value, dict):
        return {key: _fill(v, names) for key, v in value.items()}
    if isinstance(value, list):
        out = []
        for item in value:  # repeated over the first list it names, if any
            lists = [k for k, v in names.items() if isinstance(v, list) and _names(item, k)]
            bindings = [{lists[0]: v} for v in names[lists[0]]] if lists else [{}]
            out += [_fill(item, {**names, **one}) for one in bindings]
        return out
    return value


def _choose(value, where: str):
    """`value` with each {by, cases, default} in it replaced by the case its `by` names (its
    default where none does). A `by` still naming {words} (checked before any data) picks the
    default, or the first case."""
    if isinstance(value, list):
        return [_choose(v, where) for v in value]
    if not isinstance(value, dict):
        return value
    if not ({"by", "cases"} <= set(value) and set(value) <= CHOICE):
        return {key: _choose(v, where) for key, v in value.items()}
    cases = value["cases"]
    if not isinstance(cases, dict) or not cases:
        raise ValueError(f"{where}: a choice's cases map words to values, got {cases!r}")
    picked = {str(k): v for k, v in cases.items()}.get(str(value["by"]))
    if picked is None and "default" in value:
        picked = value["default"]
    elif picked is None and re.search(r"\{[^}]*\}", str(value["by"])):
        picked = next(iter(cases.values()))
    elif picked is None:
        raise ValueError(f"{where}: by {value['by']!r} names none of the cases "
                         f"({', '.join(map(str, cases))}) and there is no default")  # fmt: skip
    return _choose(picked, where)


def _names(value, key: str) -> bool:
    """Whether {key} appears in any string of `value`."""
    if isinstance(value, str):
        return f"{{{key}}}" in value
    if isinstance(value, dict):
        return any(_names(v, key) for v in value.values())
    return isinstance(value, list) and any(_names(v, key) for v in value)


def _known(arm: str, arms: list[str], gate: bool = False) -> bool:
    """An arm a grid declares (a templated one, e.g. deep/${x}, matched loosely); a gate arm
    may be one followed by /its setting (gn_batch_size's batchnorm/b2) or by a qualifier in
    brackets (ln_placement's "post/lr0.001/w0 (trained seeds)"). An arm still naming {words}
    (checked before any data) matches loosely too."""
    if re.search(r"\{[^}]*\}", arm):
        loose = re.sub(r"\\\{[^}]*\\\}", ".+", re.escape(arm))
        if any(re.fullmatch(loose, re.sub(r"\$\{[^}]*\}", "x", a)) for a in arms):
            return True
    for a in arms:
        pattern = re.sub(r"\\\$\\\{[^}]*\\\}", ".+", re.escape(a))
        if re.fullmatch(pattern + (r"(/.+| \(.+\))?" if gate else ""), arm):
            return True
    return False


def _check(entry: dict, arms: list[str], where: str) -> None:
    def fail(problem: str) -> None:
        raise ValueError(f"{where}: {problem}")

    unknown = sorted(set(entry) - KEYS)
    if unknown:
        fail(f"unknown key(s) {', '.join(unknown)}; an entry's keys: {', '.join(sorted(KEYS))}")
    kind = entry.get("kind")
    if kind not in KINDS:
        fail(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    second, interval = KINDS[kind], ["interval", "estimate"]  # an interval's, not per seed
    a_kind = ("an " if kind[0] in "aeiou" else "a ") + kind
    reads = {"interval": interval, "any": []}.get(kind, ["quantity", "of", "per_seed"])
    needed = ["claim", *reads, "paper", "source"]
    needed += [second] if second and kind != "slope" else []  # a slope's minus is optional
    needed += [] if kind in ("count", "any") else ["region"]
    missing = [key for key in needed if key not in entry]
    if missing:
        fail(f"{a_kind} claim declares {', '.join(missing)}")
    extra = [key for key in filter(None, KINDS.values()) if key in entry and key != second]
    extra += [key for key in ("scale",) if key in entry and kind != "difference"]
    extra += [key for key in ("held_out",) if key in entry and (kind != "difference"
                                                                or "scale" in entry)]  # fmt: skip
    extra += [key for key in ("log",) if key in entry and kind != "value"]
    others = ["quantity", "of", "per_seed", "present"] if kind == "interval" else interval
    others += ["quantity", "of", "per_seed", "region", "gates", "absent"] if kind == "any" else []
    extra += [key for key in dict.fromkeys(others) if key in entry]
    if extra:
        fail(f"{a_kind} claim reads no {', '.join(extra)}")
    if entry.get("held_out"):
        _check_held_out(entry, fail)
    if entry["source"] not in PROVENANCE:
        fail(f"source must be one of {', '.join(PROVENANCE)}, got {entry['source']!r}")
    if entry["source"] == "ours" and not entry.get("why"):
        fail("an 'ours' claim says why (why: ...)")
    if "region" in entry:
        _region(entry["region"], fail)
    band = entry.get("absent")
    if band is not None and (not isinstance(band, dict) or not band.get("why")
                             or sum(b in band for b in BANDS) != 1):  # fmt: skip
        fail(f"absent is one of {', '.join(BANDS)} with its why, got {band!r}")
    _check_arms(entry, arms, fail)


def _check_held_out(entry: dict, fail) -> None:
    """A held_out claim's first two gates are `of`'s arm and `minus`'s, in that order, each as a
    gate names an arm (`_known`): the budget test reads its gap there. Checked once the data
    filled them (an unfilled {name} may stand for both)."""
    gates = [str(g) for g in entry.get("gates", ())][:2]
    want = [entry["of"]["arm"], entry["minus"]["arm"]]
    filled = gates and "{" not in "".join(gates + want)
    if filled and not (len(gates) == 2 and all(
            _known(g, [w], gate=True) for g, w in zip(gates, want, strict=True))):  # fmt: skip
        fail(f"held_out reads its first two gates as of's arm and minus's ({', '.join(want)}), "
             f"got {', '.join(gates)}")


def _check_arms(entry: dict, arms: list[str], fail) -> None:
    """Every arm an entry reads, and its gate arms, are declared; a selection is {arm, x} (a
    slope's, a list of {arm, x, at})."""
    second, band = KINDS[entry["kind"]], entry.get("absent") or {}
    operands = [entry[key] for key in ("of", second) if key and key in entry]
    slope = entry["kind"] == "slope"
    if slope and not all(isinstance(o, list) and o for o in operands):
        fail(f"a slope reads a list of {{arm, x, at}}, got {operands!r}")
    points = [sel for o in operands for sel in o] if slope else operands
    selections = [*points, *entry.get("present", ()), *([band["sd"]] if "sd" in band else [])]
    for k, sel in enumerate(selections):
        keys = {"arm", "x", "at"} if slope and k < len(points) else {"arm", "x"}
        if (not isinstance(sel, dict) or "arm" not in sel or set(sel) - keys
                or ("at" in keys and "at" not in sel)):  # fmt: skip
            fail(f"an arm to read is {{{', '.join(sorted(keys))}}} (x optional), got {sel!r}")
        if not _known(sel["arm"], arms):
            fail(f"unknown arm {sel['arm']!r}: no grid declares it (arms: {', '.join(arms)})")
    for gate in entry.get("gates", ()):
        if not _known(gate, arms, gate=True):
            fail(f"unknown gate arm {gate!r}: not a declared arm (or arm/setting)")


def _region(region, fail) -> tuple[float, float]:
    """{above: a} -> (a, ABOVE); {below: b} -> (BELOW, b); {within: [a, b]} -> (a, b)."""
    if not isinstance(region, dict) or len(region) != 1 or set(region) - REGIONS:
        fail(f"region is one of {{above: a}}, {{below: b}}, {{within: [a, b]}}, got {region!r}")
    ((side, bound),) = region.items()
    if side == "within":
        if not isinstance(bound, list) or len(bound) != 2:
            fail(f"region within is [low, high], got {bound!r}")
        return float(bound[0]), float(bound[1])
    return (float(bound), stats.ABOVE) if side == "above" else (stats.BELOW, float(bound))


def _fail(problem: str) -> None:
    raise ValueError(problem)


def _rows(quantities: pd.DataFrame, quantity: str, sel: dict) -> pd.DataFrame:
    """One arm's rows of `quantity` (at its setting x, where given)."""
    rows = quantities[(quantities["arm"] == sel["arm"]) & (quantities["metric"] == quantity)]
    return rows[rows["x"].astype(float) == float(sel["x"])] if "x" in sel else rows


def per_seed(quantities: pd.DataFrame, quantity: str, sel: dict) -> pd.Series:
    """One arm's `quantity` (at its setting x, where given), a value per seed, by seed."""
    values = _rows(quantities, quantity, sel).set_index("seed")["value"]
    if values.index.duplicated().any():
        raise ValueError(f"{quantity} of {sel}: more than one value per seed (say its x)")
    return values.sort_index()


def _operand(quantities: pd.DataFrame, quantity: str, sel, kind: str) -> pd.Series:
    """What one operand gives per seed: its arm's values, or a slope's slopes."""
    if kind == "slope":
        return slopes(quantities, quantity, sel)
    return per_seed(quantities, quantity, sel)


def slopes(quantities: pd.DataFrame, quantity: str, points: list[dict]) -> pd.Series:
    """{seed: the least-squares slope of log(quantity) on log(at)} over a slope's points (each
    an arm at its abscissa `at`), the seeds with every point; none with fewer than two points."""
    table = pd.DataFrame({float(p["at"]): per_seed(quantities, quantity,
                                                   {k: p[k] for k in ("arm", "x") if k in p})
                          for p in points})  # fmt: skip
    full = table.dropna()
    if full.shape[1] < 2:
        return pd.Series(dtype=float)
    x = np.log(np.asarray(table.columns, dtype=float))
    return full.apply(lambda r: float(np.polyfit(x, np.log(r.to_numpy(float)), 1)[0]), axis=1)


def _paired(a: pd.Series, b: pd.Series) -> pd.DataFrame:
    """The seeds both have a value at, a row each."""
    return pd.concat([a, b], axis=1, join="inner").dropna()


def _present(entry: dict, quantities: pd.DataFrame) -> bool:
    """Whether the entry is kept: it says no `present`, or one of those arms has a value."""
    sels = entry.get("present")
    return not sels or any(_rows(quantities, entry["quantity"], s)["value"].notna().any()
                           for s in sels)  # fmt: skip


def _absent(entry: dict, quantities: pd.DataFrame) -> dict:
    """The claim's equivalence band and its rule in words; none where its rule gives none (an
    SD of fewer than two values)."""
    band = entry.get("absent")
    if band is None:
        return {}
    if "fraction" in band:
        low, high = band["paper"]
        effect = abs(high - low)
        delta = band["fraction"] * effect
        return {
            "absent": (-delta, delta),
            "absent_why": band["why"].format(fraction=band["fraction"], effect=effect),
        }
    if "sd" in band:
        values = per_seed(quantities, entry["quantity"], band["sd"]).dropna()
        if len(values) < 2:
            return {}
        sd = float(values.std(ddof=1))
        return {"absent": (-sd, sd), "absent_why": band["why"].format(sd=sd)}
    low, high = band["band"]
    return {"absent": (float(low), float(high)), "absent_why": band["why"]}


def _claim(entry: dict, quantities: pd.DataFrame, intervals: dict):
    """One entry's Claim (CountClaim for a count, IntervalClaim for an interval) over the seeds
    its arms share."""
    shared = dict(
        source=entry["source"], why=entry.get("why", ""), arms=tuple(entry.get("gates", ())),
        final=bool(entry.get("final", False)), held_out=bool(entry.get("held_out", False)),
        ceiling_against=tuple(entry.get("ceiling_against", ())),
        untrained_answers=tuple(entry.get("untrained_answers", ())),
        precluded=entry.get("precluded", ""),  # e.g. "{apart}": the analysis's words, or none
        **_absent(entry, quantities),
    )  # fmt: skip
    undecided = {"undecided": entry["undecided"]} if "undecided" in entry else {}
    if entry["kind"] == "interval":
        return _interval(entry, intervals, {**shared, **undecided})
    kind, quantity = entry["kind"], entry["quantity"]
    of = _operand(quantities, quantity, entry["of"], kind)
    words = dict(claim=entry["claim"], paper_number=entry["paper"], quantity=entry["per_seed"])
    if kind == "count":
        a, b = of.dropna(), per_seed(quantities, quantity, entry["against"]).dropna()
        counts = (int(a.sum()), len(a), int(b.sum()), len(b))  # each arm's own seeds
        region = _region(entry["region"], _fail) if "region" in entry else (0.0, stats.ABOVE)
        return CountClaim(**words, counts=counts, region=region, **shared)
    if kind == "value" or (kind == "slope" and "minus" not in entry):
        values, log = list(of), bool(entry.get("log", False))  # a NaN stays: no interval
    else:
        pair = _paired(of, _operand(quantities, quantity, entry[KINDS[kind]], kind))
        first, second = pair.iloc[:, 0], pair.iloc[:, 1]
        if kind == "ratio":
            values = list(first / second)
        else:  # `scale` changes a difference's unit (e.g. 100: an accuracy to points)
            values = list(entry["scale"] * (first - second) if "scale" in entry else first - second)
        log = kind == "ratio"
    return Claim(**words, values=values, region=_region(entry["region"], _fail), log=log,
                 **undecided, **shared)  # fmt: skip


def _any(entry: dict, kept: list[dict], built: list) -> AnyClaim:
    """An any entry's AnyClaim: its parts are the kept entries whose part_of names it, by
    their labels, in order."""
    parts = {e["part_of"]["label"]: c for e, c in zip(kept, built, strict=True)
             if (e.get("part_of") or {}).get("claim") == entry["claim"]}  # fmt: skip
    return AnyClaim(entry["claim"], entry["paper"], parts=parts, source=entry["source"],
                    why=entry.get("why", ""))  # fmt: skip


def _interval(entry: dict, intervals: dict, shared: dict) -> IntervalClaim:
    """An interval entry's IntervalClaim: the interval the analysis computed, by its name."""
    if entry["interval"] not in intervals:
        raise ValueError(f"claim {entry['claim']!r}: the analysis gives no interval "
                         f"{entry['interval']!r}")  # fmt: skip
    interval, how = intervals[entry["interval"]]
    return IntervalClaim(entry["claim"], entry["paper"], entry["estimate"], interval,
                         _region(entry["region"], _fail), how, **shared)  # fmt: skip
