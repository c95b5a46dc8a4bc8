"""The path of a run's cfg through the code, call by call: `python train.py` (shrunk, in this
process) enters few modules in turn and does not go back up the layers (tests/test_layers.py).

    python tests/test_run_path.py [-m]      # prints the path of a single run (-m: a job's)
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from test_layers import LAYER, part

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "normlab"
TINY = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1", "logger=csv", "callbacks.norm_stats=null"]  # fmt: skip


@functools.cache
def module_of(filename: str) -> str | None:
    """normlab.run.task for src/normlab/run/task.py, train.py, None for anything else."""
    path = Path(os.path.abspath(filename))
    if path == REPO / "train.py":
        return "train.py"
    if not path.is_relative_to(SRC):
        return None
    return ".".join(("normlab", *path.relative_to(SRC).with_suffix("").parts)).removesuffix(
        ".__init__"
    )


def cfg_calls(argv: list[str]) -> list[tuple[str, str | None]]:
    """(module, calling module) of each call that takes train.py's cfg, as `python train.py
    ARGV` runs in this process."""
    seen: dict[str, Any] = {}
    stack: list[Any] = []
    calls: list[tuple[str, str | None]] = []

    def returned(frame, event, arg):  # the local trace of a call that takes cfg
        if event == "return" and stack and stack[-1] is frame:
            stack.pop()
        return returned

    def called(frame, event, arg):  # sys.settrace: Python calls only, not C calls
        module = module_of(frame.f_code.co_filename)
        if module is None:
            return None
        if module == "normlab.train" and frame.f_code.co_name == "_train":  # cfg's first stop
            seen["cfg"] = frame.f_locals["cfg"]
        if "cfg" in seen and any(v is seen["cfg"] for v in frame.f_locals.values()):
            calls.append((module, module_of(stack[-1].f_code.co_filename) if stack else None))
            stack.append(frame)
            return returned
        return None

    old_argv, old_cwd = sys.argv, os.getcwd()
    sys.argv = ["train.py", *argv]
    os.chdir(REPO)
    sys.settrace(called)
    try:
        runpy.run_path("train.py", run_name="__main__")
    except SystemExit as exit:
        assert not exit.code, exit.code
    finally:
        sys.settrace(None)
        sys.argv = old_argv
        os.chdir(old_cwd)
        GlobalHydra.instance().clear()
    return calls


def path(calls: list[tuple[str, str | None]]) -> dict[str, Any]:
    """The modules entered in turn (a call from another module), how many of them go up a
    layer, and how many go back into a module already left."""
    layer = {m: LAYER.get("train.py" if m == "train.py" else part(m), -1) for m, _ in calls}
    entered = [(m, c) for m, c in calls if m != c]
    order = [m for m, _ in entered]
    return {
        "entered": order,
        "up": sum(c is not None and layer[m] > layer.get(c, -1) for m, c in entered),
        "again": sum(m in order[:i] for i, m in enumerate(order)),
    }


def test_a_single_runs_cfg_enters_few_modules_and_never_goes_up(tmp_path):
    found = path(cfg_calls([*TINY, f"hydra.run.dir={tmp_path / 'run'}"]))
    first = ["normlab.train", "normlab.config", "normlab.run", "normlab.run.task"]
    assert found["entered"][:4] == first  # train.py and normlab-train: normlab.train's _train
    assert len(found["entered"]) <= 12 and found["up"] == 0, found


def test_a_multirun_jobs_cfg_enters_few_modules_and_never_goes_up(tmp_path):
    found = path(cfg_calls(["-m", *TINY, "batch=32", f"hydra.sweep.dir={tmp_path / 'sweep'}"]))
    assert not any(m.startswith("normlab.sweep") for m in found["entered"])  # callbacks only
    assert len(found["entered"]) <= 12 and found["up"] == 0, found


if __name__ == "__main__":
    import tempfile

    where = tempfile.mkdtemp()
    multi = "-m" in sys.argv
    args = ["-m", *TINY, "batch=32", f"hydra.sweep.dir={where}/sweep"] if multi else [
        *TINY, f"hydra.run.dir={where}/run"]  # fmt: skip
    found = path(cfg_calls(args))
    print(" -> ".join(found["entered"]))
    print(f"{len(found['entered'])} modules entered in turn, {found['up']} up a layer, "
          f"{found['again']} back into a module already left")  # fmt: skip
