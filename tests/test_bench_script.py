"""The bench (normlab.bench, `python scripts/bench.py`) at tiny shapes and budgets: tables,
CSVs, targets and verdicts; structure only, never speed."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import TINY

import normlab.bench as bench
from normlab.bench import norms, train


@pytest.fixture
def tiny_bench(monkeypatch, tmp_path):
    monkeypatch.setattr(norms, "CNN", (4, 8, 3, 3))
    monkeypatch.setattr(norms, "SEQ", (2, 3, 64))  # GroupNorm: 32 groups
    monkeypatch.setattr(bench, "OUT", tmp_path)
    monkeypatch.setattr(norms, "MIN_TOTAL_S", 0.02)
    monkeypatch.setattr(norms, "COMPILE_BACKEND", "eager")  # dynamo's graph, no compiler
    same = [*TINY, "test=false", "batch=16"]
    monkeypatch.setattr(train, "TRAIN_CASES", {"lenet": (same, 2), "lenet_extra": (same, 2)})
    monkeypatch.setattr(train, "EXTRA_WORK", {"lenet_extra": "+ work the hand loop does not do"})
    tiny_run = ["trainer.max_epochs=2", "trainer.limit_train_batches=2", "batch=16",
                "trainer.limit_val_batches=1", "trainer.limit_test_batches=1"]  # fmt: skip
    monkeypatch.setattr(train, "END_TO_END", {"tiny_train_py": tiny_run})
    return tmp_path


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_norms_part_rates_every_impl_against_its_baseline(tiny_bench, capsys):
    bench.main(["norms", "--rounds", "1", "--threads", "1"])
    rows = read(tiny_bench / "norms.csv")
    cases = {(r["shape"], r["norm"]) for r in rows}
    assert len(cases) == len(norms.norm_cases()) == 12
    for shape, norm in cases:
        layers = {r["layer"]: r for r in rows if (r["shape"], r["norm"]) == (shape, norm)}
        baseline = next(r for r in layers.values() if float(r["time_ratio"]) == 1.0)
        assert all(r["baseline"] == baseline["layer"] for r in layers.values())
        row = layers["normlab fast"]  # the one target; manual and reference are reported
        assert row["target"] == "<= 1.05"
        assert row["ok"] == ("yes" if float(row["time_ratio"]) <= 1.05 else "NO")
        for impl in ("fast", "reference", "manual"):
            row = layers[f"normlab {impl}"]
            assert float(row["ms"]) > 0 and float(row["mem_ratio"]) > 0
            assert impl == "fast" or row["target"] == row["ok"] == ""
    rms = next(r for r in rows if r["norm"] == "rmsnorm" and r["layer"] == "normlab fast"
               and r["shape"] == "2x3x64")  # fmt: skip
    assert float(rms["vs_layernorm"]) > 0
    for shape in ("4x8x3x3", "2x3x64"):  # the fused op against torch.compile(nn.RMSNorm)
        row = next(r for r in rows if r["norm"] == "rmsnorm" and r["shape"] == shape
                   and r["layer"].startswith("torch.compile(RMSNorm"))  # fmt: skip
        assert float(row["fast_vs_compiled"]) > 0 and float(row["ms"]) > 0
        assert row["note"] == f"normlab fast {float(row['fast_vs_compiled']):.3f}x this"
    assert "| normlab reference |" in capsys.readouterr().out
    md = (tiny_bench / "norms.md").read_text()
    assert "`python scripts/bench.py norms --rounds 1 --threads 1`: torch" in md
    assert "| normlab reference |" in md


def test_out_writes_the_tables_elsewhere(tiny_bench, tmp_path_factory, capsys):
    out = tmp_path_factory.mktemp("elsewhere") / "bench"
    bench.main(["norms", "--rounds", "1", "--threads", "1", "--out", str(out)])
    assert read(out / "norms.csv") and "--out" in (out / "norms.md").read_text()
    assert not list(tiny_bench.iterdir())  # nothing in the default dir
    assert f"CSV and markdown in {out}" in capsys.readouterr().out


def test_train_part_holds_only_equal_work_to_the_target(tiny_bench, capsys):
    bench.main(["train", "--rounds", "1", "--threads", "1"])
    rows = read(tiny_bench / "train.csv")
    assert {(r["case"], r["measure"]) for r in rows} == {
        (c, m) for c in ("lenet", "lenet_extra") for m in train.MEASURES.values()
    } | {("tiny_train_py", train.END_TO_END_MEASURE)}
    whole = next(r for r in rows if r["case"] == "tiny_train_py")
    assert float(whole["hand_s"]) > 0 and float(whole["normlab_s"]) > 0
    assert whole["steps"] == "4" and whole["target"] == "<= 1.15"
    assert whole["ok"] == ("yes" if float(whole["ratio"]) <= 1.15 else "NO")
    assert "test/acc" in whole["note"] and "(hand)" in whole["note"]
    for r in rows:
        if r is whole:
            continue
        assert float(r["hand_s"]) > 0 and float(r["normlab_s"]) > 0
        assert r["mean_loss_hand"] == r["mean_loss_normlab"]  # same model, batches, optimizer
        held = r["case"] == "lenet" and r["measure"] == "median step, paired"
        assert (r["target"] == "<= 1.05 each run") == held
        worst = max(float(x) for x in r["per_run"].split())  # one per round: --rounds 1
        assert r["ok"] == ("" if not held else "yes" if worst <= 1.05 else "NO")
    assert {r["note"] for r in rows if r["case"] == "lenet_extra"} == {
        "+ work the hand loop does not do"
    }
    assert "## Training" in capsys.readouterr().out
    assert "| lenet_extra | median step, paired |" in (tiny_bench / "train.md").read_text()


def test_the_default_output_dir_is_ignored_by_git_and_not_the_committed_tables():
    import subprocess

    default = bench.OUT.relative_to(bench.REPO)
    assert default != Path("outputs/bench")
    for path in (default / "norms.csv", default / "keep_heap" / "train.md"):
        ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=bench.REPO)
        assert ignored.returncode == 0, f"{path} is not ignored by git"


def ctrl_c_in_fit(*args, **kwargs):
    """What Lightning makes of a Ctrl+C inside fit: sys.exit(1) while handling it."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise SystemExit(1)  # noqa: B904 (Lightning's own)


@pytest.mark.parametrize(
    ("part", "during", "wrote", "left"),
    [
        ("all", "train", "saved {out}/norms.csv and norms.md", "train"),
        ("all", "norms", "nothing saved yet", "all"),
        ("train", "train", "nothing saved yet", "train"),
    ],
)
def test_ctrl_c_says_what_was_saved_and_how_to_continue(
    part, during, wrote, left, tiny_bench, monkeypatch, capsys
):
    monkeypatch.setattr(norms, "bench", lambda rounds, tick=None: [{"norm": "x", "ms": 1.0}])
    monkeypatch.setattr(norms if during == "norms" else train, "bench", ctrl_c_in_fit)
    with pytest.raises(SystemExit) as exit_:
        bench.main([part, "--rounds", "1", "--out", str(tiny_bench)])
    assert exit_.value.code == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-2].startswith("interrupted (SIGINT): " + wrote.format(out=tiny_bench))
    assert lines[-1] == (
        f"continue with: python scripts/bench.py {left} --rounds 1 --out {tiny_bench}"
    )
    assert sum(line.startswith("continue with:") for line in lines) == 1
    assert (tiny_bench / "norms.csv").exists() == (wrote != "nothing saved yet")


def test_an_error_that_is_not_a_signal_is_raised_as_it_is(tiny_bench, monkeypatch):
    def broken(rounds, tick=None):
        raise RuntimeError("a bug")

    monkeypatch.setattr(norms, "bench", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        bench.main(["norms", "--out", str(tiny_bench)])


def test_bench_says_how_long_first_then_done_and_eta_as_cases_end(tiny_bench, monkeypatch, capsys):
    one = norms.norm_cases()[:1]  # one small case (the tiny CNN shape)
    monkeypatch.setattr(norms, "norm_cases", lambda: one)
    bench.main(["norms", "--rounds", "1", "--threads", "1"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    first = next(i for i, line in enumerate(lines) if "estimate: about" in line)
    assert "for 1 cases (1 rounds each" in lines[first]
    assert first <= 1  # after the setting line, before any work
    done = [line for line in lines if " done, ETA " in line]
    assert done == ["1/1 done, ETA 0 s (cpu float32 4x8x3x3 batchnorm)"]


def test_bench_eta_scales_what_is_left_by_the_measured_speed():
    from normlab.bench import eta

    said: list[str] = []
    progress = eta.Progress({"a": 60.0, "b": 60.0, "c": 120.0}, said.append)
    progress.planned_done, progress.done = 60.0, 1  # a ran twice as slow as planned
    assert progress.line("a", elapsed=120.0) == "1/3 done, ETA 6 min (a)"
    assert eta.estimate_line({"a": 60.0, "b": 60.0}, 2).startswith(
        "estimate: about 2 min for 2 cases (2 rounds each"
    )
    planned = eta.plan("train", 2, ["train_py_default"])
    assert list(planned) == ["train_py_default"] and planned["train_py_default"] > 60


def test_the_continue_line_after_ctrl_c_runs_as_printed(tiny_bench, monkeypatch, capsys):
    """`all` stopped in its train part: the line names the part left (train) with the same
    options, and run as printed it writes that part beside the saved norms tables (one tiny
    in-process case: the part itself is test_train_part_holds_only_equal_work_to_the_target's)."""
    import shlex

    monkeypatch.setattr(norms, "bench", lambda rounds, tick=None: [{"norm": "x", "ms": 1.0}])
    real = train.bench
    monkeypatch.setattr(train, "bench", ctrl_c_in_fit)
    with pytest.raises(SystemExit) as exit_:
        bench.main(["all", "--rounds", "1", "--threads", "1", "--train-cases", "lenet",
                    "--out", str(tiny_bench)])  # fmt: skip
    assert exit_.value.code == 130
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("continue with:")]
    argv = shlex.split(line.removeprefix("continue with: "))
    assert argv == ["python", "scripts/bench.py", "train", "--rounds", "1", "--threads", "1",
                    "--train-cases", "lenet", "--out", str(tiny_bench)], line  # fmt: skip
    monkeypatch.setattr(train, "bench", real)  # no Ctrl+C this time
    bench.main(argv[2:])  # scripts/bench.py's main, with the printed arguments
    assert (tiny_bench / "train.csv").is_file() and (tiny_bench / "norms.csv").is_file()
