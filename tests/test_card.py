"""The report card: slots declared with the reproductions, rows read from the committed evidence
through the reproductions' rules, bad --norm refused before any job, and (slow) a quick card of
examples/my_norm.py that resumes."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from normlab.analysis import card, stats

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf" / "reproduce"


def _script(name: str):
    """normlab.analysis.NAME: reproduce (scripts/reproduce.py's main) or report_card."""
    return importlib.import_module(f"normlab.analysis.{name}")


def _slot(reproduction: str) -> card.Slot:
    return next(s for s in card.slots(CONF) if s.reproduction == reproduction)


def test_slots_are_declared_with_their_reproductions_and_join_its_norm_grids():
    from normlab.analysis.reproductions import REPRODUCTIONS

    slots = card.slots(CONF)
    assert {s.reproduction for s in slots} >= {"bn_lenet", "gn_batch_size", "ln_rnn", "dyt_vs_ln"}
    for s in slots:
        grid = "" if s.grid == "main" else s.grid
        assert grid in REPRODUCTIONS[s.reproduction].norm_grids  # --norm X joins it
        assert s.baselines and s.quantities and s.delta_why
        assert all(q["kind"] in card.KINDS and q["better"] in ("lower", "higher")
                   for q in s.quantities)  # fmt: skip
    assert _slot("ln_rnn").arm("mine") == "mine" and _slot("dyt_vs_ln").arm("mine") == "gpt/mine"


def test_a_slot_on_a_grid_with_a_raised_cap_gets_that_cap(tmp_path):
    """A grid's `cap:` raises its claims' cap (sequential.Caps, as --decide reads it): a slot on
    that grid runs to it, a slot on another grid to the reproduction's."""
    import yaml

    spec = yaml.safe_load((CONF / "dyt_vs_ln.yaml").read_text())
    spec["grids"]["gpt"].update(cap=15, cap_why="a test's raise")
    (tmp_path / "dyt_vs_ln.yaml").write_text(yaml.safe_dump(spec))
    caps = {s.grid: s.cap for s in card.slots(tmp_path)}
    assert caps == {"gpt": 15, "dit": 12}


def test_a_builtin_norms_rows_come_from_the_committed_evidence_by_the_rules():
    """BN against the no-norm MLP: better on every quantity (the reproduction's own claims
    hold); a quantity the norm never ran reads 'not run', not a verdict."""
    slot = _slot("bn_lenet")
    data = pd.read_csv(REPO / "outputs" / "figures" / "bn_lenet" / "runs.csv")
    rows = card.rows(slot, "batchnorm", data)
    assert [r.verdicts["none"] for r in rows] == ["better"] * len(slot.quantities)
    assert all(r.norm.n == 20 for r in rows)
    absent = card.rows(slot, "layernorm", data)
    assert all(v == "not run" for r in absent for v in r.verdicts.values())
    table = card.table(rows)
    assert list(table["verdicts"]) == ["vs none: better"] * len(slot.quantities)


def test_a_norm_the_slot_cannot_take_reads_not_applicable_with_the_traits_reason():
    assert _slot("ln_rnn").applicable("batchnorm").startswith("not applicable: an LSTM's norm")
    assert _slot("ln_rnn").applicable("layernorm") == ""
    frame = card.table([(_slot("ln_rnn"), _slot("ln_rnn").applicable("batchnorm"))])
    assert frame["norm"].iloc[0].startswith("not applicable")


def test_an_equivalent_norm_reads_equivalent_within_its_band():
    q = {"name": "loss", "kind": "final", "metric": "m", "better": "lower", "delta": 0.5,
         "final": False}  # fmt: skip
    seeds = range(6)
    rows = [("n", s, float("nan"), "m", 1.0 + 0.01 * s) for s in seeds]
    rows += [("b", s, float("nan"), "m", 1.0 + 0.012 * s) for s in seeds]
    data = pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])
    slot = card.Slot("r", "t", "g", {"n": "n", "b": "b"}, ("b",), (q,), "a rule")
    assert card.rows(slot, "n", data)[0].verdicts == {"b": "equivalent (within ±0.5)"}
    q2 = {**q, "delta": 0.001}
    slot2 = card.Slot("r", "t", "g", {"n": "n", "b": "b"}, ("b",), (q2,), "a rule")
    assert card.rows(slot2, "n", data)[0].verdicts["b"].split(" (")[0] in ("undecided", "better")
    assert isinstance(card.rows(slot2, "n", data)[0].norm, stats.Interval)


@pytest.mark.parametrize(
    ("norm", "plugin", "says"),
    [
        ("nosuchnorm", None, "is not a registered norm"),
        ("nosuch_pkg.Norm", None, "does not import"),
        ("normlab.norms.create_norm", None, "not an nn.Module class"),
        ("meanonly", "no_such_plugin_module", "does not import"),
    ],
)
def test_a_bad_norm_fails_in_one_line_before_any_job(norm, plugin, says, monkeypatch):
    rc = _script("report_card")
    reproduce = _script("reproduce")
    monkeypatch.setattr(reproduce, "reproduce", lambda *a, **k: pytest.fail("a job started"))
    with pytest.raises(SystemExit) as stop:
        rc.run(norm, plugin, True, 1, 1, REPO)
    text = str(stop.value)
    assert says in text and "\n" not in text


def test_the_leaderboard_has_a_row_per_builtin_card(tmp_path):
    rc = _script("report_card")
    (tmp_path / "outputs" / "cards").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    for norm in ("batchnorm", "layernorm"):
        rc.write(norm, card.slots(CONF), {s.title: s.applicable(norm) for s in card.slots(CONF)},
                 False, tmp_path)  # fmt: skip
        # the committed evidence is the repo's: write() read it, tmp_path holds only the card
        assert (tmp_path / "outputs" / "cards" / f"{norm}.png").is_file()
    text = rc.leaderboard(tmp_path).read_text()
    lines = [line for line in text.splitlines() if line.startswith("| batchnorm") or
             line.startswith("| layernorm")]  # fmt: skip
    assert len(lines) == 2 and "better" in lines[0]


@pytest.mark.slow
def test_a_quick_card_of_my_norm_runs_resumes_and_says_it_is_a_smoke_run(tmp_path):
    """examples/my_norm.py's mean-only LayerNorm, quick, the bn_lenet slot: rows written under
    the ignored outputs/cards/quick/, smoke-labelled, no verdicts; a second run reuses its jobs."""
    env = {**os.environ, "WANDB_MODE": "offline"}
    cmd = [sys.executable, "scripts/reproduce.py", "card", "--norm", "meanonly", "--plugin",
           "examples.my_norm", "--budget", "quick", "--slots", "bn_lenet", "--threads", "1",
           "--root", str(tmp_path)]  # fmt: skip
    first = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-2000:]
    mine = [s for s in card.slots(CONF) if s.reproduction == "bn_lenet"]  # MLP, LeNet twice
    assert "about" in first.stdout and f"slot {len(mine)}/{len(mine)} done" in first.stdout
    md = (tmp_path / "outputs" / "cards" / "quick" / "meanonly.md").read_text()
    assert card.SMOKE in md and not re.search(r"vs \w+: (better|worse)", md)  # no verdicts
    rows = pd.read_csv(tmp_path / "outputs" / "cards" / "quick" / "meanonly.csv")
    assert len(rows) == sum(len(s.quantities) for s in mine)
    numbers = rows["norm"].astype(str).str.match(r"-?\d")  # a value, not 'not run' or the like
    assert numbers.groupby(rows["slot"]).any().all()  # every slot's arm ran, under its own name
    # the md's Command: line as printed (the options that change no result added) reruns it
    printed = re.search(r"^Command: `python (scripts/reproduce\.py card [^`]+)`", md, re.M)[1]
    assert printed == ("scripts/reproduce.py card --norm meanonly --plugin examples.my_norm "
                       "--budget quick --slots bn_lenet")  # fmt: skip
    again = subprocess.run([sys.executable, *printed.split(), "--threads", "1", "--root",
                            str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=900)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    jobs = pd.read_csv(tmp_path / "outputs" / "figures" / "quick" / "bn_lenet+meanonly" /
                       "jobs.csv")  # fmt: skip
    assert (jobs["reused"] == 1).all()  # resumed: every job found finished


def test_the_committed_cards_and_leaderboard_are_the_evidence_read_again(tmp_path):
    """outputs/cards/NORM.csv and docs/cards.md are what the committed evidence gives now: a
    reproduction's new seeds must be followed by `card --norm NORM` and `card --leaderboard`."""
    rc = _script("report_card")
    slots = card.slots(CONF)
    for path in sorted((REPO / "outputs" / "cards").glob("*.csv")):
        norm = path.stem
        for own in (REPO / "outputs" / "figures").glob(f"*+{norm}"):  # a trained card's rows
            if own.is_dir():
                shutil.copytree(own, tmp_path / "outputs" / "figures" / own.name,
                                dirs_exist_ok=True)  # fmt: skip
        rc.write(norm, slots, {s.title: s.applicable(norm) for s in slots}, False, tmp_path)
        again = tmp_path / "outputs" / "cards" / f"{norm}.csv"
        assert again.read_text() == path.read_text(), f"{norm}: rerun card --norm {norm}"
    assert rc.leaderboard(tmp_path).read_text() == (REPO / "docs" / "cards.md").read_text()


def test_a_cards_command_line_names_its_slots_when_it_has_only_some():
    rc = _script("report_card")
    every = card.slots(CONF)
    base = "python scripts/reproduce.py card --norm meanonly --plugin examples.my_norm"
    assert rc.card_command("meanonly", "examples.my_norm", False, every) == base
    some = [s for s in every if s.reproduction == "bn_lenet"]
    assert rc.card_command("meanonly", "examples.my_norm", True, some) == (
        f"{base} --budget quick --slots bn_lenet"
    )


def test_a_cell_without_a_value_says_how_the_norms_jobs_ended(tmp_path):
    """'not run' only where the norm has no jobs there; a norm whose jobs diverged, or finished
    without logging the quantity, says so: a result, not a gap."""
    rc = _script("report_card")
    slot = _slot("deepnorm_depth")
    assert rc._outcome(slot, "mine", False, tmp_path) == "not run"
    path = tmp_path / "outputs" / "figures" / "deepnorm_depth+mine" / "jobs.csv"
    path.parent.mkdir(parents=True)
    arm = slot.arm("mine")
    pd.DataFrame({"arm": [arm, arm, "other"], "seed": [0, 1, 0],
                  "status": ["diverged", "ok", "ok"]}).to_csv(path, index=False)  # fmt: skip
    assert rc._outcome(slot, "mine", False, tmp_path) == "diverged in 1 of 2 jobs"
    pd.DataFrame({"arm": [arm], "seed": [0], "status": ["ok"]}).to_csv(path, index=False)
    assert rc._outcome(slot, "mine", False, tmp_path) == "no value from its 1 finished jobs"
    row = card.Row("s", "r", "q", "lower", stats.Interval.of([]), {}, {}, unrun="diverged")
    assert card.table([row])["norm"].iloc[0] == "diverged"


def _noisy(n: int, gap: float, sd: float = 0.1) -> pd.DataFrame:
    """runs.csv rows of a norm `n` and a baseline `b`, `gap` apart (the norm lower) over n seeds."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = [(a, s, float("nan"), "m", 1.0 - (gap if a == "n" else 0.0) + sd * rng.normal())
            for s in range(n) for a in ("n", "b")]  # fmt: skip
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


def _planning_slot(delta: float = 0.001) -> card.Slot:
    q = {"name": "loss", "kind": "final", "metric": "m", "better": "lower", "delta": delta,
         "final": False}  # fmt: skip
    return card.Slot("r", "t", "g", {"n": "n", "b": "b"}, ("b",), (q,), "a rule", initial=3,
                     cap=12)  # fmt: skip


def test_an_undecided_verdict_says_the_seeds_its_plan_asks_for_as_the_reproductions_plan():
    """At the first 3 seeds a small noisy gap is undecided: the cell names the seeds the plan
    asks for (stats.seeds_needed, as `reproduce.py NAME --decide` plans); a clear gap plans
    nothing."""
    slot = _planning_slot()
    row = card.rows(slot, "n", _noisy(3, 0.08))[0]
    planned = row.planned["b"]
    assert 3 < planned <= 12
    assert re.fullmatch(r"undecided \(~\d+ seeds would decide it(, past the cap 12)?\)",
                        row.verdicts["b"])  # fmt: skip
    assert card.seeds_to_decide([row]) == planned
    clear = card.rows(slot, "n", _noisy(3, 2.0))[0]
    assert clear.verdicts["b"] == "better" and clear.planned == {}
    assert card.seeds_to_decide([clear]) is None


def _shifting(n: int, late: float) -> pd.DataFrame:
    """The norm 0.2 better than the baseline at seeds 0-2 (a plan of a few more seeds), `late`
    better at every later seed."""
    diffs = [0.2, 0.1, 0.3] + [late] * max(0, n - 3)
    rows = [(a, s, float("nan"), "m", 1.0 - (d if a == "n" else 0.0))
            for s, d in enumerate(diffs[:n]) for a in ("n", "b")]  # fmt: skip
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


@pytest.mark.parametrize(("late", "runs"), [(0.2, ["plan"]), (-0.2, ["plan", 12])])
def test_decide_runs_a_slot_to_its_plan_then_to_the_cap_only_while_undecided(late, runs,
                                                                             monkeypatch):
    """--decide: a slot undecided at its first seeds runs to its plan; decided there it stops,
    still undecided (the later seeds go the other way) it runs to the cap: the reproductions'
    three looks. A slot decided at its first seeds runs nothing more."""
    rc, reproduce = _script("report_card"), _script("reproduce")
    slot, seen, ran = _planning_slot(), [], {"n": 3}
    monkeypatch.setattr(rc, "_evidence", lambda *a: _shifting(ran["n"], late))

    def fake(name, quick, jobs, root, seeds, grids, norm, plugin, **kw):
        assert (name, grids, norm, kw["cut"]) == ("r", ["g-n"], "n", {"g": ()})
        seen.append(seeds)
        ran["n"] = seeds

    monkeypatch.setattr(reproduce, "reproduce", fake)
    plan = card.seeds_to_decide(card.rows(slot, "n", _shifting(3, late)))
    assert 3 < plan < 12
    rc._to_a_decision(slot, "n", None, 1, 1, REPO)
    assert seen == [plan if r == "plan" else r for r in runs]
    seen.clear()
    monkeypatch.setattr(rc, "_evidence", lambda *a: _noisy(3, 2.0))
    rc._to_a_decision(slot, "n", None, 1, 1, REPO)
    assert seen == []


def test_a_slots_evidence_md_decides_only_the_claims_on_arms_it_holds():
    """A card's slot runs the norm's arm alone (NAME+norm's evidence): the reproduction's claims
    on the built-in arms it lacks are left to NAME's md (a note says so), and the norm's own arm
    gets its gates; evidence holding every arm keeps every claim."""
    from normlab.analysis.reproductions import REPRODUCTIONS

    rc = _script("reproduce")
    committed = pd.read_csv(REPO / "outputs" / "figures" / "bn_lenet" / "runs.csv")
    mine = committed[committed["arm"] == "mlp/batchnorm"].assign(arm="mlp/mine")
    repro = REPRODUCTIONS["bn_lenet"]
    alone = rc.within(repro.render(mine), mine, "bn_lenet")
    assert alone.claims == [] and {g.arm for g in alone.gates} == {"mlp/mine"}
    assert alone.notes[0].startswith("14 of the reproduction's 14 claims read arms")
    every = pd.concat([committed, mine], ignore_index=True)
    whole = rc.within(repro.render(every), every, "bn_lenet")
    assert len(whole.claims) == 14 and "mlp/mine" in {g.arm for g in whole.gates}
