"""Every hint the code prints is in docs/reliability.md's table ("Every hint, as printed") with
the test that runs it; the hints no other test runs are run here, shrunk."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

from normlab.callbacks.progress import Estimate

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
