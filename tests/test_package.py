"""normlab as a package: conf/ found through it, its console entry points, and a built wheel that
trains from a fresh venv outside the checkout."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from normlab import layout
from normlab.analysis import sweep

REPO = Path(__file__).resolve().parents[1]
CONF_FILES = sorted(p.relative_to(REPO / "conf").as_posix() for p in REPO.glob("conf/**/*.yaml"))


def test_conf_is_found_through_the_package_and_is_the_checkouts():
    assert layout.conf_dir() == (REPO / "conf").resolve()
    assert (layout.conf_dir() / "train.yaml").is_file()
    assert layout.checkout() == REPO and layout.root() == REPO
    # the reproductions' declarations are read from there, and outputs/ stays the checkout's
    assert sweep.DECLARED == REPO / "conf" / "reproduce" and sweep.REPO == REPO


def test_the_entry_points_name_the_functions_the_checkouts_commands_run():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {
        "normlab-train": "normlab.train:main",
        "normlab-reproduce": "normlab.analysis.reproduce:main",
    }
    for target in scripts.values():
        module, _, name = target.partition(":")
        assert callable(getattr(__import__(module, fromlist=[name]), name))
    assert "from normlab.train import main" in (REPO / "train.py").read_text()
    assert (
        "from normlab.analysis.reproduce import main"
        in (REPO / "scripts" / "reproduce.py").read_text()
    )


def build_wheel(out: Path) -> Path:
    """The wheel `pip wheel . --no-deps --no-build-isolation` builds, from a copy of the files it
    is built from (so that no build/ dir is left in the checkout)."""
    src = out / "src-copy"
    for name in ("pyproject.toml", "README.md"):
        src.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("src", "conf"):  # src/normlab/conf stays a symlink to ../../conf
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=ignore)
    assert (src / "src" / "normlab" / "conf").is_symlink()
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
           "--no-index", "-w", str(out / "dist")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = (out / "dist").glob("normlab-*.whl")
    return wheel


def fresh_venv(where: Path) -> Path:
    """A venv whose own site-packages comes first and the running environment's (torch,
    Lightning, Hydra: the tests' environment, CI's venv included) after it, appended by a .pth
    file: like --system-site-packages, but that environment's own .pth files are not processed,
    so an editable normlab installed there (a path or finder .pth) cannot shadow the wheel."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    own = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    theirs = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(own) / "environment.pth").write_text("".join(f"{p}\n" for p in theirs))
    return python


@pytest.mark.slow
def test_the_wheel_trains_from_a_fresh_venv_outside_the_checkout(tmp_path):
    """Build the wheel, install it (--no-deps) into a fresh venv outside the checkout, and run
    `normlab-train debug=fdr` there, from a dir outside the checkout."""
    wheel = build_wheel(tmp_path / "build")
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(n.removeprefix("normlab/conf/") for n in names
                  if n.startswith("normlab/conf/")) == CONF_FILES  # fmt: skip
    print(f"{wheel.name}: {len(CONF_FILES)} conf files, e.g. normlab/conf/debug/fdr.yaml")

    python = fresh_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["NORMLAB_DATA"] = os.environ.get("NORMLAB_DATA") or str(REPO.parent / "shared" / "data")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
               "--no-index", str(wheel)]  # fmt: skip
    done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = subprocess.run(
        [python, "-c", "import normlab.layout as l; print(l.__file__); print(l.conf_dir()); "
         "print(l.checkout())"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    venv = (tmp_path / "venv").resolve()
    assert Path(found[0]).resolve().is_relative_to(venv), found  # the wheel's, not a checkout's
    assert Path(found[1]) == Path(found[0]).resolve().parent / "conf" and found[2] == "None"

    train = tmp_path / "venv" / "bin" / "normlab-train"
    done = subprocess.run([str(train), "debug=fdr"], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    out = done.stdout + done.stderr
    print(f"$ cd {elsewhere} && {train} debug=fdr\n{out[-1500:]}")
    assert done.returncode == 0, out[-3000:]
    assert "`Trainer.fit` stopped: `max_steps=1` reached" in out  # it trained (one batch)
    assert "test/acc" in out and "test/loss" in out  # and tested
    (hydra_yaml,) = (elsewhere / "outputs").rglob(".hydra/hydra.yaml")  # outputs/ under the cwd
    config = hydra_yaml.read_text()
    assert f"path: {found[1]}\n      schema: file\n      provider: main" in config

    # normlab-reproduce reads the reproductions' declarations from the wheel's conf/ too
    reproduce = tmp_path / "venv" / "bin" / "normlab-reproduce"
    done = subprocess.run([str(reproduce), "--list"], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    listed = {line.split(":")[0] for line in done.stdout.splitlines() if not line[:1].isspace()}
    assert listed >= {Path(f).stem for f in CONF_FILES if f.startswith("reproduce/")}, listed
