"""A report card's baselines (normlab.analysis.baselines): a stale baseline arm is replayed under
today's code and read where the replay matches its committed values, retrained where it differs
or cannot be compared; --retrain-baselines and --reuse-baselines; the card md's table. The
replays here are fakes that hand back runs.csv rows; (slow) one real replay of the BN paper's
MLP."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pandas as pd
import pytest

from normlab.analysis import baselines, card

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf" / "reproduce"
TODAY = "today0000000000"


def _mlp() -> card.Slot:
    return next(s for s in card.slots(CONF) if s.reproduction == "bn_lenet" and s.grid == "mlp")


@pytest.fixture
def figures(tmp_path) -> Path:
    """A copy of bn_lenet's committed evidence, to perturb."""
    out = tmp_path / "figures"
    shutil.copytree(REPO / "outputs" / "figures" / "bn_lenet", out / "bn_lenet")
    return out


def _as_committed(figures: Path, calls: list | None = None):
    """A replay that logs what the committed job logged (seed from its overrides): rows read
    from the unperturbed evidence in the repo, not the copy under test."""
    runs = pd.read_csv(REPO / "outputs" / "figures" / "bn_lenet" / "runs.csv")

    def runner(name: str, overrides: str, steps: int) -> pd.DataFrame:
        given = dict(o.split("=", 1) for o in overrides.split())
        if calls is not None:
            calls.append((name, given["arm"], int(given["seed"]), steps))
        mine = runs[(runs["arm"] == given["arm"]) & (runs["seed"] == int(given["seed"]))]
        return mine[mine["x"] <= steps]

    return runner


def _settled(figures: Path, policy: str = "check", runner=None, slot=None, today=TODAY):
    slot = slot or _mlp()
    first = baselines.pending([slot], "mine", policy, today, figures)
    lines: list[str] = []
    done = baselines.settle(first, [slot], "mine", figures, runner=runner, log=lines.append)
    return {b.arm: b for b in done}, lines


def test_a_stale_baseline_whose_replay_matches_is_read_saying_what_matched(figures):
    calls: list = []
    got, lines = _settled(figures, runner=_as_committed(figures, calls))
    none = got["mlp/none"]
    assert (none.action, none.how) == ("read", "replay matched")
    # one replay per code version the arm's jobs ran, at that version's lowest seed, 40 steps
    jobs = pd.read_csv(figures / "bn_lenet" / "jobs.csv")
    mine = jobs[jobs["arm"] == "mlp/none"]
    assert sorted(c[2] for c in calls if c[1] == "mlp/none") == sorted(
        mine.groupby("code_version")["seed"].min()
    )
    assert {c[3] for c in calls} == {40}
    assert "val/acc at step 40: committed 0.098, today 0.098" in none.why
    assert any(line.startswith("card mine: bn_lenet, mlp/none: read (replay matched)")
               for line in lines)  # fmt: skip


def test_a_replay_that_differs_retrains_that_arm_and_says_where(figures):
    path = figures / "bn_lenet" / "runs.csv"
    runs = pd.read_csv(path)
    at = ((runs["arm"] == "mlp/none") & (runs["seed"] == 0) & (runs["metric"] == "val/acc")
          & (runs["x"] == 20))  # fmt: skip
    assert at.sum() == 1
    runs.loc[at, "value"] += 0.001  # two evaluation images of 2,000: far past the tolerance
    runs.to_csv(path, index=False)
    got, _ = _settled(figures, runner=_as_committed(figures))
    assert (got["mlp/none"].action, got["mlp/none"].how) == ("retrain", "replay differs")
    assert "val/acc at step 20: committed 0.1055, today 0.1045" in got["mlp/none"].why
    assert got["mlp/batchnorm"].action == "read"  # the other arm's replays still match


def test_a_value_within_the_fp32_tolerance_still_matches(figures):
    path = figures / "bn_lenet" / "runs.csv"
    runs = pd.read_csv(path)
    at = (runs["arm"] == "mlp/none") & (runs["metric"] == "gate/train_loss")
    runs.loc[at, "value"] *= 1 + 2e-6  # below %.6g's last digit
    runs.to_csv(path, index=False)
    got, _ = _settled(figures, runner=_as_committed(figures))
    assert got["mlp/none"].how == "replay matched"
    assert baselines.close(1.0, 1.0 + 5e-6) and not baselines.close(1.0, 1.0 + 5e-5)


def test_a_replay_that_cannot_be_compared_retrains(figures):
    def fails(name, overrides, steps):
        raise RuntimeError("the replay exited with code 1: boom")

    got, _ = _settled(figures, runner=fails)
    assert {b.how for b in got.values()} == {"replay failed"}
    assert all(b.action == "retrain" and "boom" in b.why for b in got.values())

    def says_nothing(name, overrides, steps):  # a replay that logged none of the metrics
        return pd.DataFrame(columns=["arm", "seed", "x", "metric", "value"])

    got, _ = _settled(figures, runner=says_nothing)
    assert all(b.how == "replay differs" and "logged no" in b.why for b in got.values())


@pytest.mark.parametrize(
    ("policy", "action", "how"),
    [("retrain", "retrain", "--retrain-baselines"), ("reuse", "read", "--reuse-baselines")],
)
def test_the_flags_retrain_or_read_every_stale_arm_without_a_replay(figures, policy, action,
                                                                    how):  # fmt: skip
    calls: list = []
    got, _ = _settled(figures, policy, runner=_as_committed(figures, calls))
    assert calls == []
    assert {(b.action, b.how) for b in got.values()} == {(action, how)}


def test_an_arm_trained_under_todays_code_is_read_without_a_replay(figures):
    path = figures / "bn_lenet" / "jobs.csv"
    jobs = pd.read_csv(path)
    jobs.loc[jobs["arm"] == "mlp/none", "code_version"] = TODAY
    jobs.to_csv(path, index=False)
    calls: list = []
    got, _ = _settled(figures, runner=_as_committed(figures, calls))
    assert (got["mlp/none"].action, got["mlp/none"].how) == ("read", "same version")
    assert {c[1] for c in calls} == {"mlp/batchnorm"}


def test_a_slot_without_a_replay_retrains_and_a_template_arm_is_read_saying_so(figures):
    slot = card.Slot("bn_lenet", "t", "mlp", {"none": "mlp/none"}, ("none",), (), "why")
    got, _ = _settled(figures, runner=_as_committed(figures), slot=slot)
    assert (got["mlp/none"].action, got["mlp/none"].how) == ("retrain", "no replay")
    assert "no replay declared" in got["mlp/none"].why
    assert baselines.retrainable("bn_lenet", "mlp/none")
    assert not baselines.retrainable("ln_placement", "init/post/d12")  # a template's arm


def test_a_card_retrains_an_arm_beside_the_norm_and_tables_it(figures, tmp_path, monkeypatch,
                                                               capsys):  # fmt: skip
    """card --norm X --slots bn_lenet: a baseline whose replay differs runs in the slot's grids
    beside the norm's (into NAME+X); the estimate comes first; the md tables every arm."""
    rc = importlib.import_module("normlab.analysis.report_card")
    reproduce = importlib.import_module("normlab.analysis.reproduce")
    path = figures / "bn_lenet" / "runs.csv"
    runs = pd.read_csv(path)
    runs.loc[(runs["arm"] == "lenet/none") & (runs["metric"] == "val/acc"), "value"] += 0.01
    runs.to_csv(path, index=False)
    monkeypatch.setattr(rc, "COMMITTED", figures)
    monkeypatch.setattr(baselines, "run_replay", _as_committed(figures))
    ran = []
    monkeypatch.setattr(
        reproduce,
        "reproduce",
        lambda name, quick, jobs, root, seeds, grids, *a, **k: ran.append(grids),
    )
    paths = rc.run("rmsnorm", None, False, 1, 1, tmp_path, ["bn_lenet"])
    assert ran == [["mlp-rmsnorm"], ["lenet-rmsnorm", "lenet/none"], ["lenet_cosine-rmsnorm"]]
    out = capsys.readouterr().out
    assert out.index("1 baseline arms retrained after their replay") > out.index("slots to train")
    assert "bn_lenet, lenet/none: retrained (replay differs)" in out
    md = paths["md"].read_text()
    table = md[md.index("## Baselines: read or retrained") :]
    assert "| none (lenet/none) |" in table and "retrained (replay differs)" in table
    assert table.count("read (replay matched)") == 5
    assert "--retrain-baselines" not in md and "--reuse-baselines" not in md


def test_the_card_reads_a_retrained_arm_from_its_own_evidence(figures, tmp_path, monkeypatch):
    rc = importlib.import_module("normlab.analysis.report_card")
    monkeypatch.setattr(rc, "COMMITTED", figures)
    slot = _mlp()
    own = tmp_path / "outputs" / "figures" / "bn_lenet+mine"
    own.mkdir(parents=True)
    rows = [("mlp/none", 0, float("nan"), "test/acc", 0.5), ("mlp/mine", 0, 20.0, "val/acc", 0.2),
            ("mlp/batchnorm", 0, float("nan"), "test/acc", 0.1)]  # fmt: skip
    pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"]).to_csv(own / "runs.csv")
    data = rc._evidence(slot, "mine", False, tmp_path, ("mlp/none",))
    none = data[(data["arm"] == "mlp/none") & (data["metric"] == "test/acc")]
    assert list(none["value"]) == [0.5]  # the retrained arm's rows, its committed ones dropped
    bn = data[(data["arm"] == "mlp/batchnorm") & (data["metric"] == "test/acc")]
    assert 0.1 not in list(bn["value"]) and len(bn) > 1  # not retrained: the committed rows
    assert rc.card_command("mine", None, False, [slot], policy="reuse").endswith(
        "--reuse-baselines --slots bn_lenet"
    )


@pytest.mark.slow
def test_a_real_replay_of_the_bn_mlps_first_steps_matches_its_committed_values():
    """Today's code, the committed job of mlp/none at seed 0, 40 steps on one thread: its
    held-out accuracies and training losses as committed (a minute or two of CPU)."""
    runs = pd.read_csv(REPO / "outputs" / "figures" / "bn_lenet" / "runs.csv")
    mine = runs[(runs["arm"] == "mlp/none") & (runs["seed"] == 0)]
    replayed = baselines.run_replay("bn_lenet", "norm=none experiment=bn_mlp arm=mlp/none seed=0",
                                    40)  # fmt: skip
    same, points, why = baselines.compare(replayed, mine, ["val/acc", "gate/train_loss"], 40)
    assert same, why
    assert [(m, x) for m, x, *_ in points] == [
        ("gate/train_loss", 19.0),
        ("val/acc", 20.0),
        ("gate/train_loss", 39.0),
        ("val/acc", 40.0),
    ]


def test_a_quick_card_reads_its_baselines_unchecked_and_its_command_omits_that_default(
        monkeypatch):  # fmt: skip
    """--budget quick is a smoke run: no replay, no retraining (reuse), and its md's Command
    line reruns it without the flag; a card-budget one names the policy it was not given."""
    rc = importlib.import_module("normlab.analysis.report_card")
    seen = []
    monkeypatch.setattr(rc, "run", lambda *a: seen.append(a[-1]) or (_ for _ in ()).throw(
        SystemExit(0)))  # fmt: skip
    for argv in (["--budget", "quick"], [], ["--budget", "quick", "--retrain-baselines"]):
        with pytest.raises(SystemExit):
            rc.main(["--norm", "rmsnorm", *argv])
    assert seen == ["reuse", "check", "retrain"]
    some = [s for s in card.slots(rc.CONF) if s.reproduction == "bn_lenet"]
    assert "baselines" not in rc.card_command("x", None, True, some, policy="reuse")
    assert rc.card_command("x", None, False, some, policy="reuse").endswith(
        "--reuse-baselines --slots bn_lenet")  # fmt: skip
    assert "--retrain-baselines" in rc.card_command("x", None, True, some, policy="retrain")
