"""Where normlab's files are: its conf/, found through the package, and the root that
reproductions and benchmarks run from and write outputs/ under.

conf/ stays at the repo root beside train.py; src/normlab/conf is a symlink to it, which
setuptools follows when it builds the wheel (pyproject.toml's package-data copies the yaml files
into normlab/conf/), so `conf_dir()` finds the same files in a checkout, an editable install and an
installed wheel. Standard library only: train.py imports it before torch loads.
"""

from __future__ import annotations

import sys
from importlib.resources import files
from pathlib import Path


def conf_dir() -> Path:
    """normlab's conf/ (train.yaml and one folder per config group), through the package: the
    checkout's conf/ (via the symlink src/normlab/conf), or the copy inside an installed wheel."""
    return Path(str(files("normlab").joinpath("conf"))).resolve()


def reproduce_dir() -> Path:
    """conf/reproduce/: one NAME.yaml per reproduction (normlab.analysis.sweep.load)."""
    return conf_dir() / "reproduce"


def checkout() -> Path | None:
    """The source checkout normlab is imported from (the dir holding src/normlab, train.py and
    conf/), or None when normlab is an installed wheel."""
    root = Path(str(files("normlab"))).resolve().parents[1]
    return root if (root / "train.py").is_file() and (root / "src" / "normlab").is_dir() else None


def root() -> Path:
    """Where reproductions and benchmarks run and write outputs/ (their `--root` default): the
    checkout, or the current directory for an installed wheel."""
    return checkout() or Path.cwd()


def program(script: str, entry: str, module: str) -> list[str]:
    """How this process was started, for a hint's command to start it again the same way:
    `python <script>` as typed (sys.argv[0]: train.py, scripts/reproduce.py, from the dir it was
    typed in), `python -m <module>` for the package's own module, else the installed entry point
    (`normlab-train`): a wheel has no train.py, and outside a checkout `python train.py` fails."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if argv0.suffix != ".py" or argv0.name != Path(script).name:
        return [entry]
    package = Path(str(files("normlab"))).resolve()
    if argv0.resolve().is_relative_to(package):
        return ["python", "-m", module]
    return ["python", str(argv0)]
