"""The LeNet that fid_lenet measures in: which file (`feature_file`), its training recipe, its
cache, training it on first use.

By default fid_lenet measures in the committed LeNet (normlab.fid.COMMITTED_FILE, trained by
this recipe and pinned by its sha256), so values compare across machines and versions. A
retrained one (`features` "cached", or `--out FILE` here) is another feature space: its values
compare only with values measured in the same file. The one home of that training:
`scripts/train_fid_lenet.py`, the `fid` callback (FIDLeNet) and scripts/fid.py come here.

    python -m normlab.run.fid_lenet [--epochs 5] [--cache-dir outputs/fid_lenet] [--out FILE]
                                    [--force] [train.py overrides ...]

The LeNet is trained (normlab.run.fid_lenet, in a child process: this module stays below the
run it needs) by normlab's own training (`normlab.run.train`) on the config
`python train.py <RECIPE> trainer.max_epochs=<epochs> <overrides>` would run, and cached at

    <cache dir>/<config hash>-<data checksum>/lenet.pt          (cache dir: outputs/fid_lenet)

keyed by that fully resolved config (paths left out: `normlab.identity.config_hash`) and by a
checksum of the Fashion-MNIST files it learns and is tested on, so another recipe, budget or
data set gets its own file. The file is written atomically (a temp file, then a rename) under a
lock, so jobs that need it at the same time train it once. Its training run (logs, checkpoints)
stays beside it in `run/`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, open_dict

import normlab
from normlab import config, identity, layout
from normlab.errors import ConfigError

# LeNet + BatchNorm with ReLU, Adam, the test split evaluated; norm statistics not logged
RECIPE = (
    "model=lenet",
    "norm=batchnorm",
    "model.net.activation=relu",
    "optim=adam",
    "callbacks.norm_stats=null",
    "logger=csv",
    "test=true",
)
EPOCHS = 5  # 5 epochs: 0.3 min on an idle 2-core CPU, 3-8 min on a busy one
CACHE_DIR = Path("outputs") / "fid_lenet"
SRC = Path(normlab.__file__).resolve().parents[1]  # the dir holding the normlab package
COMMITTED, CACHED = "committed", "cached"  # the `features` that are not a file path


def compose_recipe(
    epochs: int = EPOCHS,
    overrides: Sequence[str] = (),
    data_root: str | Path | None = None,
    conf_dir: str | Path | None = None,
) -> DictConfig:
    """The training config of the LeNet; data_root None keeps the config's (paths.data_dir)."""
    overrides = [*RECIPE, f"trainer.max_epochs={epochs}", *overrides]
    cfg = config.compose(overrides, "<run dir>", conf_dir or layout.conf_dir())
    if data_root is not None:
        with open_dict(cfg):
            cfg.paths.data_dir = str(Path(data_root).resolve())
    return cfg


def cache_file(cache_dir: str | Path, cfg: DictConfig, data_checksum: str) -> Path:
    """<cache_dir>/<config hash>-<data checksum>/lenet.pt (12 hex digits of each)."""
    return Path(cache_dir) / f"{identity.config_hash(cfg)[:12]}-{data_checksum[:12]}" / "lenet.pt"


def feature_file(
    features: str = COMMITTED,
    cache_dir: str | Path = CACHE_DIR,
    epochs: int = EPOCHS,
    overrides: Sequence[str] = (),
    data_root: str | Path | None = None,
    conf_dir: str | Path | None = None,
) -> Path:
    """The fid_lenet file `features` names: "committed" the packaged LeNet (checked against
    its pin when loaded), "cached" this recipe's LeNet in `cache_dir` (`ensure`: trained in a
    child process if missing), anything else a path to a fid_lenet file."""
    if features == COMMITTED:
        from normlab.fid import COMMITTED_FILE  # lazy: torch (seconds)

        return COMMITTED_FILE
    if features == CACHED:
        return ensure(cache_dir, epochs, overrides, data_root, conf_dir)
    if not isinstance(features, str | os.PathLike) or not str(features):
        raise ConfigError(
            f"callbacks.fid.features={features!r}: give {COMMITTED}, {CACHED} or a fid_lenet file"
        )
    return Path(features)


def ensure(
    cache_dir: str | Path = CACHE_DIR,
    epochs: int = EPOCHS,
    overrides: Sequence[str] = (),
    data_root: str | Path | None = None,
    conf_dir: str | Path | None = None,
) -> Path:
    """`build` in a child process (normlab.run.fid_lenet): the training there leaves this
    process's RNG streams, threads and Hydra state alone (a run that trains the LeNet first runs
    as one that finds it cached). Its output goes to this process's stdout/stderr."""
    command = [sys.executable, "-m", "normlab.run.fid_lenet", "--epochs", str(epochs)]
    command += ["--cache-dir", str(Path(cache_dir).resolve())]
    if data_root is not None:
        command += ["--data-root", str(Path(data_root).resolve())]
    if conf_dir is not None:
        command += ["--conf-dir", str(Path(conf_dir).resolve())]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
    }
    with tempfile.TemporaryDirectory() as tmp:
        answer = Path(tmp) / "path"
        done = subprocess.run([*command, "--path-file", str(answer), *overrides], env=env)
        if done.returncode or not answer.is_file():
            raise ConfigError(
                f"fid_lenet: getting its LeNet failed (`{' '.join([*command, *overrides])}` "
                f"exited with {done.returncode}, see its output above); or drop the metric "
                "with callbacks.fid=null"
            )
        return Path(answer.read_text())
