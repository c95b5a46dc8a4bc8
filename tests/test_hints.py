"""Every hint the code prints is in docs/reliability.md's table ("Every hint, as printed") with
the test that runs it; the hints no other test runs are run here, shrunk."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from normlab.callbacks.progress import Estimate
from normlab.sweep.summary import read_summary

REPO = Path(__file__).resolve().parents[1]
HINTS = ("continue with:", "did you mean", "shorter: ", "Command: ", "redraws all from it")


def table() -> str:
    text = (REPO / "docs" / "reliability.md").read_text()
    return text.split("## Every hint, as printed", 1)[1]


def code(path: Path) -> str:
    """The file's string literals' text as far as a search needs: comments cut off."""
    return "\n".join(line.split("#")[0] for line in path.read_text().splitlines())


def test_the_hint_table_names_every_file_that_prints_a_hint_and_tests_that_exist():
    rows = table()
    files = [*REPO.glob("src/normlab/**/*.py"), *REPO.glob("scripts/*.py"), REPO / "train.py"]
    printing = {str(p.relative_to(REPO)) for p in files if any(h in code(p) for h in HINTS)}
    assert printing  # the search finds them
    assert not [f for f in sorted(printing) if f"| {f}" not in rows]
    for path, name in re.findall(r"(tests/test_\w+\.py)::(\w+)", rows):
        assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), (path, name)


def test_the_shorter_hint_runs_as_printed(tmp_path):
    line = Estimate(steps=2140, step_s=0.5, epochs=10, epoch_steps=214, val_s=1.0, threads=2).line()
    hints = re.findall(r"(\S+=\d+) \(about", line.split("shorter: ")[1])
    assert hints == ["trainer.max_epochs=1", "trainer.limit_train_batches=50"]
    assert "num_threads=1 is often" in line
    shrunk = ["trainer.limit_val_batches=2", "trainer.limit_test_batches=2", "num_threads=1"]
    done = subprocess.run(
        [sys.executable, "train.py", *hints, *shrunk, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 50 and last["epoch"] == 1  # one epoch of 50 batches


@pytest.mark.slow
def test_the_multirun_continue_line_resumes_the_sweep_as_printed(tmp_path):
    args = ["train.py", "-m", "seed=0,1", "batch=64", "trainer.max_epochs=2",
            "trainer.limit_train_batches=30", "trainer.limit_val_batches=2", "test=false",
            "callbacks.last_checkpoint.every_n_train_steps=5",
            f"hydra.sweep.dir={tmp_path}"]  # fmt: skip

    def terminal() -> None:  # SIGINT as from a terminal (a background test may ignore it)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=terminal)  # fmt: skip
    deadline = time.time() + 300
    while not list(tmp_path.glob("0_*/checkpoints/last.ckpt")):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 130, err[-3000:]
    hints = [h for h in err.splitlines() if h.startswith("continue with: ")]
    assert len(hints) == 1  # one line per interruption
    argv = shlex.split(hints[0].removeprefix("continue with: "))
    assert argv[:3] == ["python", "train.py", "-m"]
    resumed = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["status"] for r in read_summary(tmp_path)] == ["ok", "ok"]
    assert "resuming from" in next(tmp_path.glob("0_*/train.log")).read_text()


@pytest.mark.slow
def test_a_cards_continue_line_finishes_the_card_as_printed(tmp_path):
    cmd = ["scripts/reproduce.py", "card", "--norm", "meanonly", "--plugin", "examples.my_norm",
           "--budget", "quick", "--slots", "bn_lenet", "--threads", "1", "--root", str(tmp_path)]
    env = {**os.environ, "WANDB_MODE": "offline"}

    def terminal() -> None:  # SIGINT as from a terminal (a background test may ignore it)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, *cmd], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=terminal)  # fmt: skip
    deadline = time.time() + 600
    while "ok" not in "".join(p.read_text() for p in tmp_path.rglob("summary.csv")):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C: the terminal signals the whole group
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 130, err[-3000:]
    assert err.count("continue with: ") == 1, err[-3000:]
    argv = shlex.split(err.split("continue with: ")[1].splitlines()[0])
    assert argv[:2] == ["python", "scripts/reproduce.py"]
    again = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=900)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "skipping finished job" in again.stdout + again.stderr  # continued, not restarted
    assert (tmp_path / "outputs" / "cards" / "quick" / "meanonly.md").is_file()


def test_reproduce_sets_the_variable_that_quiets_its_jobs_continue_lines():
    from normlab.analysis import reproduce
    from normlab.run import task

    assert reproduce.OUTER_ENV == task.OUTER_ENV


def test_a_hint_starts_the_program_as_it_was_started(monkeypatch):
    from normlab import layout

    package = Path(layout.__file__).resolve().parent
    cases = {
        "train.py": ["python", "train.py"],
        "./train.py": ["python", "train.py"],
        "/elsewhere/checkout/train.py": ["python", "/elsewhere/checkout/train.py"],
        "/venv/bin/normlab-train": ["normlab-train"],  # a console script: no train.py here
        str(package / "train.py"): ["python", "-m", "normlab.train"],
    }
    for argv0, expected in cases.items():
        monkeypatch.setattr(sys, "argv", [argv0, "norm=groupnorm"])
        assert layout.program("train.py", "normlab-train", "normlab.train") == expected, argv0
    monkeypatch.setattr(sys, "argv", ["scripts/reproduce.py", "card"])
    assert layout.program("scripts/reproduce.py", "normlab-reproduce", "x") == [
        "python", "scripts/reproduce.py"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["/venv/bin/normlab-reproduce", "card"])
    assert layout.program("scripts/reproduce.py", "normlab-reproduce", "x") == ["normlab-reproduce"]


def entry_point(bin_dir: Path, name: str, module: str) -> None:
    """What pip writes for a [project.scripts] entry (pyproject.toml), into bin_dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / name
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom {module} import main\n"
        "if __name__ == '__main__':\n    sys.exit(main())\n"
    )
    script.chmod(0o755)


class KillOnce(pl.Callback):
    """SIGINT its own process at batch `batch` of training, once: not again once `marker`
    exists, so a continue line run as printed (the same overrides) goes on to the end."""

    def __init__(self, batch: int, marker: str):
        self.batch, self.marker = batch, Path(marker)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.batch and not self.marker.exists():
            self.marker.touch()
            signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow
@pytest.mark.parametrize("started", ["normlab-train", "train.py"])
def test_an_interrupted_runs_continue_line_runs_as_printed(started, tmp_path):
    """normlab-train from a dir without train.py (an installed normlab, README) stopped by Ctrl+C
    after a checkpoint: its line says normlab-train and resumes there; python train.py stopped
    before its first checkpoint: its ckpt_path=last_or_new line starts anew and finishes."""
    here = tmp_path / "anywhere" if started == "normlab-train" else REPO
    here.mkdir(exist_ok=True)
    entry_point(tmp_path / "bin", "normlab-train", "normlab.train")
    path = [str(REPO / "tests"), str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path),
           "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    batch, every = (3, 2) if started == "normlab-train" else (1, 100)
    run = ["batch=32", "trainer.max_epochs=1", "trainer.limit_train_batches=4",
           "trainer.limit_val_batches=1", "test=false",
           f"callbacks.last_checkpoint.every_n_train_steps={every}",
           "+callbacks.kill._target_=test_hints.KillOnce", f"+callbacks.kill.batch={batch}",
           f"+callbacks.kill.marker={tmp_path / 'killed'}",
           f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    first = ["normlab-train"] if started == "normlab-train" else [sys.executable, "train.py"]
    proc = subprocess.run([*first, *run], cwd=here, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 130, proc.stderr[-3000:]
    (line,) = [h for h in proc.stderr.splitlines() if h.startswith("continue with: ")]
    argv = shlex.split(line.removeprefix("continue with: "))
    if started == "normlab-train":
        assert argv[0] == "normlab-train" and argv[-1] == "ckpt_path=last", line
    else:
        assert argv[:2] == ["python", "train.py"] and argv[-1] == "ckpt_path=last_or_new", line
        argv[0] = sys.executable  # the python of this test
    again = subprocess.run(argv, cwd=here, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 4
    resumed = "Restoring states from the checkpoint path" in again.stdout + again.stderr
    assert resumed == (started == "normlab-train")
    old_logs = [x for x in again.stderr.splitlines() if "Experiment logs directory" in x]
    assert all("(normlab: the run starts anew" in x for x in old_logs), old_logs


def test_the_missing_fashion_mnist_lines_work_as_printed(data_root, tmp_path):
    """Line 2: the named files (each .gz) put in the named dir; line 3: data.root at a folder
    holding FashionMNIST/raw. Either way the data module then sets up."""
    from normlab.data.fashion_mnist import FashionMNISTDataModule
    from normlab.errors import DataError

    with pytest.raises(DataError) as err:
        FashionMNISTDataModule(root=str(tmp_path / "data"), download=False).prepare_data()
    where, put, point = str(err.value).splitlines()
    raw = Path(where.removeprefix("Fashion-MNIST files missing from "))
    names = put.removeprefix("put there, each .gz or unpacked: ").split()
    assert len(names) == 4 and raw.parent.parent == tmp_path / "data", where
    raw.mkdir(parents=True)
    for name in names:
        shutil.copy(data_root / "FashionMNIST" / "raw" / f"{name}.gz", raw)
    FashionMNISTDataModule(root=str(tmp_path / "data"), download=False).prepare_data()
    assert point == "or point NORMLAB_DATA (or data.root) at a folder holding FashionMNIST/raw"
    FashionMNISTDataModule(root=str(data_root), download=False).prepare_data()


def test_the_missing_shakespeare_lines_work_as_printed(data_root, tmp_path):
    """input.txt put at the path the first line names: the data module then sets up."""
    from normlab.data.shakespeare import ShakespeareDataModule
    from normlab.errors import DataError

    def data() -> ShakespeareDataModule:
        return ShakespeareDataModule(root=str(tmp_path), download=False, batch_size=8)

    with pytest.raises(DataError) as err:
        first = data()
        first.prepare_data()
        first.setup("fit")
    missing, put, point = str(err.value).splitlines()
    path = Path(missing.removeprefix("tiny Shakespeare missing: no "))
    assert put.startswith("put input.txt there, from https://") and path.name == "input.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(data_root / "tinyshakespeare" / "input.txt", path)
    again = data()
    again.prepare_data()
    again.setup("fit")
    assert point == "or point NORMLAB_DATA (or data.root) at a folder holding tinyshakespeare/"


def test_the_log_every_n_steps_advice_runs_as_printed(tmp_path):
    """Lightning's warning on 5 batches under the logging interval says to set
    trainer.log_every_n_steps=N (N at most an epoch's batches): with N=5, no warning is left."""
    from normlab.console import ADVICE

    assert ADVICE[0][1].startswith("set trainer.log_every_n_steps=N, N at most the training ")
    shrunk = ["trainer.max_epochs=1", "trainer.limit_train_batches=5",
              "trainer.limit_val_batches=2", "test=false", "num_threads=1"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "train.py", *shrunk, "trainer.log_every_n_steps=5",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "smaller than the logging interval" not in done.stdout + done.stderr


def test_the_readmes_did_you_mean_example_builds_as_printed(compose, tmp_path):
    """README's typo example: its printed suggestion composes and builds the model (LeNet's
    GroupNorm layers have 6 and 16 channels; num_groups=4 failed there, after the hint)."""
    from hydra.utils import instantiate

    readme = (REPO / "README.md").read_text()
    typed, said = re.search(r"\$ python train\.py (norm\.num_grups=\S+)\n(did you mean [^\n]+)",
                            readme).groups()  # fmt: skip
    fixed = said.removeprefix("did you mean ").split("?")[0].split()
    assert fixed[0] == "norm=groupnorm" and fixed[1] == typed.replace("grups", "groups")
    instantiate(compose(fixed, tmp_path).model)  # a num_groups that divides every layer's width
