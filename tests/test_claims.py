"""Claims declared as data (conf/reproduce/NAME.yaml's claims:, normlab.analysis.claims): a bad
entry fails in one line naming its file and entry; each kind builds its claim."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from normlab import layout
from normlab.analysis import claims, stats, sweep
from normlab.analysis.report import Claim, CountClaim, IntervalClaim

GN = layout.reproduce_dir() / "gn_batch_size.yaml"


def _with_entry(tmp_path, change: dict) -> tuple[dict, object]:
    """gn_batch_size's declaration with its first claim changed, written under tmp_path."""
    spec = yaml.safe_load(GN.read_text())
    spec["claims"][0] = {**spec["claims"][0], **change}
    path = tmp_path / "gn_batch_size.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return spec, path


@pytest.mark.parametrize("change, problem", [
    ({"kind": "paired"}, "kind 'paired' is not one of difference, ratio, value, count"),
    ({"of": {"arm": "batchnrom", "x": 2}}, "unknown arm 'batchnrom': no grid declares it"),
    ({"gates": ["batchnorm/b32", "batchnrom/b2"]}, "unknown gate arm 'batchnrom/b2'"),
])  # fmt: skip
def test_a_bad_claims_entry_fails_in_one_line_naming_the_file_and_entry(tmp_path, change, problem):
    spec, path = _with_entry(tmp_path, change)
    with pytest.raises(ValueError) as raised:
        sweep.load(path)  # where every declaration is read: before any run or redraw
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: claims[0] (\"BN's error rises by more than 2 points")
    assert problem in message


def test_every_declared_claims_entry_checks():
    for path in sorted(layout.reproduce_dir().glob("*.yaml")):
        claims.entries(yaml.safe_load(path.read_text()), path)


def _quantities() -> pd.DataFrame:
    rows = [("a", s, 1.0, "q", v) for s, v in enumerate([3.0, 4.0, 5.0, 6.0])]
    rows += [("b", s, 1.0, "q", v) for s, v in enumerate([1.0, 2.0, 2.5])]  # seed 3 missing
    rows += [("a", s, 2.0, "fail", v) for s, v in enumerate([1, 1, 0, 1])]
    rows += [("b", s, 2.0, "fail", v) for s, v in enumerate([0, 0, 0, 0])]
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


def _build(tmp_path, entry: dict) -> list:
    spec = {"grids": {"g": {"arms": {"a": [], "b": []}}},
            "claims": [{"claim": "a over b", "quantity": "q", "of": {"arm": "a", "x": 1},
                        "per_seed": "words", "paper": "quoted", "source": "paper", **entry}]}
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(spec))
    return claims.build("toy", _quantities(), conf=tmp_path)


def test_the_kinds_build_their_claims(tmp_path):
    (diff,) = _build(tmp_path, {"kind": "difference", "minus": {"arm": "b", "x": 1},
                                "region": {"above": 0}})  # fmt: skip
    assert isinstance(diff, Claim) and diff.values == [2.0, 2.0, 2.5]  # seeds both have
    assert diff.region == (0.0, stats.ABOVE) and not diff.log
    (ratio,) = _build(tmp_path, {"kind": "ratio", "over": {"arm": "b", "x": 1},
                                 "region": {"below": 2.5}})  # fmt: skip
    assert ratio.log and ratio.values == [3.0, 2.0, 2.0] and ratio.region == (-math.inf, 2.5)
    (value,) = _build(tmp_path, {"kind": "value", "region": {"within": [-1, 1]}})
    assert value.values == [3.0, 4.0, 5.0, 6.0] and value.region == (-1.0, 1.0)
    (count,) = _build(tmp_path, {"kind": "count", "quantity": "fail", "of": {"arm": "a"},
                                 "against": {"arm": "b"}, "source": "ours", "why": "a count"})
    assert isinstance(count, CountClaim) and count.counts == (3, 4, 0, 4)


def test_an_entry_repeats_over_each_and_keeps_only_where_present(tmp_path):
    built = _build(tmp_path, {
        "claim": "a at {x}", "kind": "value", "each": {"x": [1, 2, 3]},
        "of": {"arm": "a", "x": "{x}"}, "present": [{"arm": "a", "x": "{x}"}],
        "quantity": "q", "region": {"above": 0}})  # fmt: skip
    assert [c.claim for c in built] == ["a at 1"]  # q only at x=1; x=2, 3 have none


def test_equivalence_bands_by_their_rules(tmp_path):
    base = {"kind": "difference", "minus": {"arm": "b", "x": 1}, "region": {"above": 0}}
    (frac,) = _build(tmp_path, {**base, "absent": {
        "fraction": 0.1, "paper": [23.6, 34.7], "why": "{fraction:g} of {effect:.1f}"}})
    assert frac.absent == (-0.1 * (34.7 - 23.6), 0.1 * (34.7 - 23.6))
    assert frac.absent_why == "0.1 of 11.1"
    (sd,) = _build(tmp_path, {**base, "absent": {"sd": {"arm": "b", "x": 1}, "why": "{sd:.3g}"}})
    width = float(pd.Series([1.0, 2.0, 2.5]).std(ddof=1))
    assert sd.absent == (-width, width) and sd.absent_why == f"{width:.3g}"


def _spec(tmp_path, listed: list) -> object:
    spec = {"grids": {"g": {"arms": {"a": [], "b": []}}}, "claims": listed}
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return tmp_path / "toy.yaml"


def _entry(**change) -> dict:
    return {"claim": "a at {x}", "kind": "value", "quantity": "q", "of": {"arm": "a", "x": 1},
            "per_seed": "words", "region": {"above": 0}, "paper": "quoted", "source": "paper",
            **change}  # fmt: skip


def test_each_from_data_and_a_group_repeat_in_order_over_the_values_the_analysis_found(tmp_path):
    group = {"each": {"x": "from_data", "y": "from_data"},
             "claims": [_entry(claim="first at {x} ({y})"),
                        _entry(claim="second at {x}, gates over {xs}",
                               gates=["{xs}"])]}  # fmt: skip
    _spec(tmp_path, [group, _entry(claim="last")])
    words = {"x": [1, 2], "y": ["one", "two"], "xs": ["a", "b"]}
    built = claims.build("toy", _quantities(), words, conf=tmp_path)
    assert [c.claim for c in built] == ["first at 1 (one)", "second at 1, gates over a, b",
                                        "first at 2 (two)", "second at 2, gates over a, b",
                                        "last"]  # fmt: skip
    assert built[1].arms == ("a", "b")  # a list item naming a list: one item per value
    none = claims.build("toy", _quantities(), {"x": [], "y": [], "xs": []}, conf=tmp_path)
    assert [c.claim for c in none] == ["last"]  # no values found: the group builds nothing


def _sloped() -> pd.DataFrame:
    """u = c * x^2 in arm a and c * x^0.5 in arm b, per seed; seed 2 lacks a at x=4."""
    rows = [(arm, s, x, "u", c * x**p) for arm, p in (("a", 2.0), ("b", 0.5))
            for s, c in enumerate([1.0, 2.0, 3.0]) for x in (1.0, 2.0, 4.0)
            if (arm, s, x) != ("a", 2, 4.0)]  # fmt: skip
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


def test_a_slope_is_log_log_per_seed_over_its_points_and_minus_pairs_by_seed(tmp_path):
    points = {arm: [{"arm": arm, "x": "{x}", "at": "{x}"}] for arm in ("a", "b")}
    _spec(tmp_path, [_entry(claim="slope", kind="slope", quantity="u", of=points["a"]),
                     _entry(claim="gap", kind="slope", quantity="u", of=points["a"],
                            minus=points["b"])])  # fmt: skip
    slope, gap = claims.build("toy", _sloped(), {"x": [1, 2, 4]}, conf=tmp_path)
    assert slope.values == pytest.approx([2.0, 2.0]) and not slope.log  # seed 2: a point missing
    assert gap.values == pytest.approx([1.5, 1.5])


def test_from_data_the_analysis_does_not_give_fails_naming_the_file_and_entry(tmp_path):
    path = _spec(tmp_path, [_entry(each={"x": "from_data"})])
    claims.entries(yaml.safe_load(path.read_text()), path)  # loaded: checked once, unfilled
    with pytest.raises(ValueError) as raised:
        claims.build("toy", _quantities(), {}, conf=tmp_path)
    assert str(raised.value) == (f"{path}: claims[0] ('a at {{x}}'): each x: from_data, but the "
                                 "analysis gives no list of its values")  # fmt: skip


def test_precluded_takes_the_analysis_words(tmp_path):
    _spec(tmp_path, [_entry(claim="read", precluded="{apart}")])
    (kept,) = claims.build("toy", _quantities(), {"apart": ""}, conf=tmp_path)
    (apart,) = claims.build("toy", _quantities(), {"apart": "not comparable: x"}, conf=tmp_path)
    assert kept.precluded == "" and apart.verdict == "not comparable: x"


def test_an_arm_from_the_data_is_checked_against_the_grids_and_a_norm_grids_norm(tmp_path):
    """An arm the analysis names ({arm} before the data, matched loosely) must be one a grid
    declares once filled, or a --norm run's <grid>/<norm> in a norm grid."""
    spec = {
        "grids": {"g": {"arms": {"g/a": [], "g/b": []}}},
        "norm_grids": ["g"],
        "claims": [_entry(claim="{arm}", each={"arm": "from_data"}, of={"arm": "{arm}"})],
    }
    path = tmp_path / "toy.yaml"
    claims.entries(spec, path)  # loaded: {arm} matches loosely
    assert [e["of"]["arm"] for e in claims.entries(spec, path, {"arm": ["g/a", "g/mine"]})] == [
        "g/a", "g/mine"]  # fmt: skip
    unknown = r"claims\[0\] \('\{arm\}'\) at arm=h/x: unknown arm 'h/x'"  # the value named
    with pytest.raises(ValueError, match=unknown):
        claims.entries(spec, path, {"arm": ["h/x"]})


def _interval_entry(**change) -> dict:
    return {"claim": "{arm} is fast", "kind": "interval", "interval": "{arm}: r",
            "estimate": "r of {arm}", "region": {"below": 0.93}, "gates": ["{arm}"],
            "paper": "quoted", "source": "paper", **change}  # fmt: skip


def test_an_interval_claim_reads_the_interval_the_analysis_computed_by_its_name(tmp_path):
    _spec(tmp_path, [_interval_entry(each={"arm": "from_data"}, precluded="{why_not}")])
    found = {"a: r": (stats.Interval(0.9, 0.85, 0.92, 3), "a bootstrap"),
             "b: r": (stats.Interval(1.0, 0.95, 1.05, 3), "a bootstrap")}  # fmt: skip
    a, b = claims.build("toy", _quantities(), {"arm": ["a", "b"], "why_not": ""},
                        conf=tmp_path, intervals=found)  # fmt: skip
    assert isinstance(a, IntervalClaim) and a.interval == found["a: r"][0]
    assert (a.claim, a.quantity, a.arms, a.ci_method) == ("a is fast", "r of a", ("a",),
                                                          "a bootstrap")  # fmt: skip
    assert a.region == (stats.BELOW, 0.93) and a.verdict == stats.HOLDS
    assert b.verdict == stats.FAILS
    with pytest.raises(ValueError, match="the analysis gives no interval 'a: r'"):
        claims.build("toy", _quantities(), {"arm": ["a"], "why_not": ""}, conf=tmp_path)


def test_a_choice_picks_a_value_by_a_word_and_keeps_the_order(tmp_path):
    quote = {"by": "{arm}", "cases": {"b": "b's quote"}, "default": "the others'"}
    group = {"each": {"arm": "from_data"},
             "claims": [_interval_entry(paper=quote), _interval_entry(claim="{arm} again")]}
    _spec(tmp_path, [group])
    found = {f"{a}: r": (stats.Interval(0.9, 0.85, 0.92, 3), "how") for a in "ab"}
    built = claims.build("toy", _quantities(), {"arm": ["a", "b"]}, conf=tmp_path,
                         intervals=found)  # fmt: skip
    assert [(c.claim, c.paper_number) for c in built] == [
        ("a is fast", "the others'"), ("a again", "quoted"),
        ("b is fast", "b's quote"), ("b again", "quoted")]  # fmt: skip


def _any_parts(**change) -> list:
    """Two parts (at x 1 and 2) of an any claim, and the any claim."""
    part = _entry(each={"x": [1, 2]}, of={"arm": "a", "x": "{x}"},
                  part_of={"claim": "a at some x", "label": "x {x}"})
    whole = {"claim": "a at some x", "kind": "any", "paper": "quoted", "source": "paper"}
    return [part, {**whole, **change}]


@pytest.mark.parametrize("listed, problem", [
    ([{"each": {"x": [1]}, "claims": [_entry()], "kind": "value"}],
     "a group is {each: ..., claims: [entries]}"),
    ([_entry(kind="slope", of={"arm": "a"})], "a slope reads a list of {arm, x, at}"),
    ([_entry(kind="slope", of=[{"arm": "a", "x": 1}])], "an arm to read is {arm, at, x}"),
    ([{"each": {"x": [1]}, "claims": [_entry(kind="paired")]}],
     "claims[0] at x=1: claims[0] ('a at 1'): kind 'paired' is not one of"),
    ([{k: v for k, v in _interval_entry().items() if k != "estimate"}],
     "an interval claim declares estimate"),
    ([_interval_entry(per_seed="words")], "an interval claim reads no per_seed"),
    ([_entry(interval="a: r")], "a value claim reads no interval"),
    ([_interval_entry(each={"arm": ["a"]}, paper={"by": "{arm}", "cases": {"b": "q"}})],
     "by 'a' names none of the cases (b) and there is no default"),
    (_any_parts(claim="a at any x"), "part_of is {claim, label} naming an any claim declared"),
    (_any_parts(region={"above": 0}), "an any claim reads no region"),
    ([_entry(gates=["a (trained)", "b, trained"])], "unknown gate arm 'b, trained'"),
    ([_entry(held_out=True)], "a value claim reads no held_out"),
    ([_entry(kind="difference", minus={"arm": "b"}, held_out=True, gates=["b", "a (trained)"])],
     "held_out reads its first two gates as of's arm and minus's (a, b), got b, a"),
])  # fmt: skip
def test_a_bad_entry_of_any_kind_fails_in_one_line_naming_the_file_and_entry(tmp_path, listed,
                                                                             problem):  # fmt: skip
    path = _spec(tmp_path, listed)
    with pytest.raises(ValueError) as raised:
        claims.entries(yaml.safe_load(path.read_text()), path)  # as sweep.load checks it
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{path}: claims[") and problem in message


def test_an_any_claim_holds_on_any_of_the_parts_that_name_it_in_order(tmp_path):
    _spec(tmp_path, _any_parts())
    rows = [("a", s, x, "q", v) for x, values in ((1, [-1.0, -1.1, -0.9]), (2, [1.0, 1.1, 0.9]))
            for s, v in enumerate(values)]  # fmt: skip
    quantities = pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])
    one, two, whole = claims.build("toy", quantities, conf=tmp_path)
    assert list(whole.parts) == ["x 1", "x 2"] and whole.parts["x 2"] is two
    assert (one.verdict, two.verdict, whole.verdict) == (stats.FAILS, stats.HOLDS, stats.HOLDS)
    assert whole.deciding == "x 2"


def test_thresholds_fill_the_entries_and_are_read_where_declared(tmp_path):
    path = _spec(tmp_path, [_entry(claim="a above {gap}", region={"above": "{gap}"})])
    spec = {**yaml.safe_load(path.read_text()), "thresholds": {"gap": 0.5}}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    (built,) = claims.build("toy", _quantities(), conf=tmp_path)
    assert built.claim == "a above 0.5" and built.region == (0.5, stats.ABOVE)
    assert claims.thresholds("toy", conf=tmp_path) == {"gap": 0.5}
    with pytest.raises(ValueError, match="thresholds gap are also words of the data"):
        claims.build("toy", _quantities(), {"gap": 1.0}, conf=tmp_path)


