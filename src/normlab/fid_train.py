"""The LeNet that fid_lenet measures in: which file (`feature_file`), its training recipe, its
cache, training it on first use.

By default fid_lenet measures in the committed LeNet (normlab.fid.COMMITTED_FILE, trained by
this recipe and pinned by its sha256), so values compare across machines and versions. A
retrained one (`features` "cached", or `--out FILE` here) is another feature space: its values
compare only with values measured in the same file. The one home of that training:
`scripts/train_fid_lenet.py`, the `fid` callback (FIDLeNet) and scripts/fid.py come here.

    python -m normlab.fid_train [--epochs 5] [--cache-dir outputs/fid_lenet] [--out FILE]
                                [--force] [train.py overrides ...]

The LeNet is trained by normlab's own training (`normlab.run.train`) on the config
`python train.py <RECIPE> trainer.max_epochs=<epochs> <overrides>` would run, and cached at

    <cache dir>/<config hash>-<data checksum>/lenet.pt          (cache dir: outputs/fid_lenet)

keyed by that fully resolved config (paths left out: `normlab.sweep.identity.config_hash`) and by a
checksum of the Fashion-MNIST files it learns and is tested on, so another recipe, budget or
data set gets its own file. The file is written atomically (a temp file, then a rename) under a
lock, so jobs that need it at the same time train it once. Its training run (logs, checkpoints)
stays beside it in `run/`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

import normlab
from normlab import config
from normlab.errors import ConfigError, UserError
from normlab.sweep import identity
from normlab.sweep.summary import file_lock

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
REPO_CONF = SRC.parent / "conf"  # conf/ of the source tree normlab is installed from
COMMITTED, CACHED = "committed", "cached"  # the `features` that are not a file path


def compose_recipe(
    epochs: int = EPOCHS,
    overrides: Sequence[str] = (),
    data_root: str | Path | None = None,
    conf_dir: str | Path | None = None,
) -> DictConfig:
    """The training config of the LeNet; data_root None keeps the config's (paths.data_dir)."""
    overrides = [*RECIPE, f"trainer.max_epochs={epochs}", *overrides]
    cfg = config.compose(overrides, "<run dir>", conf_dir or REPO_CONF)
    if data_root is not None:
        with open_dict(cfg):
            cfg.paths.data_dir = str(Path(data_root).resolve())
    return cfg


def cache_file(cache_dir: str | Path, cfg: DictConfig, data_checksum: str) -> Path:
    """<cache_dir>/<config hash>-<data checksum>/lenet.pt (12 hex digits of each)."""
    return Path(cache_dir) / f"{identity.config_hash(cfg)[:12]}-{data_checksum[:12]}" / "lenet.pt"


def build(
    cache_dir: str | Path = CACHE_DIR,
    epochs: int = EPOCHS,
    overrides: Sequence[str] = (),
    data_root: str | Path | None = None,
    conf_dir: str | Path | None = None,
    force: bool = False,
) -> Path:
    """The cached fid_lenet file of this recipe and data, trained in this process unless cached
    (or when `force`). Prints a line when it trains and one when it is done."""
    from hydra.utils import instantiate

    cfg = compose_recipe(epochs, overrides, data_root, conf_dir)
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()  # missing (offline) or corrupted files fail here
    out = cache_file(Path(cache_dir).resolve(), cfg, datamodule.checksum())
    with file_lock(out.parent / ".lock"):
        if out.is_file() and not force:
            return out
        say(
            f"fid_lenet: no LeNet cached for this config and data; training one "
            f"({epochs} epoch{'s' * (epochs != 1)}, minutes on a busy CPU) into {out}"
        )
        start = time.time()
        test_acc = train(cfg, out)
        acc = "n/a" if test_acc is None else f"{test_acc:.4f}"
        say(f"fid_lenet: trained in {(time.time() - start) / 60:.1f} min, test/acc {acc}")
    return out


def train(cfg: DictConfig, out: Path) -> float | None:
    """Train cfg's LeNet in <out dir>/run and write the fid_lenet file `out`; its test/acc."""
    import torch
    from hydra.utils import instantiate

    from normlab.fid import save_feature_extractor
    from normlab.run import train as train_run

    run_dir = out.parent / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted attempt is never resumed
    with open_dict(cfg):
        cfg.paths.output_dir = str(run_dir)
    result, _ = train_run(cfg)
    if result["status"] != "ok":
        raise UserError(f"fid_lenet: training the LeNet ended with status {result['status']!r}")
    best = Path(cfg.callbacks.model_checkpoint.dirpath) / "best.ckpt"
    ckpt = torch.load(best, map_location="cpu", weights_only=False)
    state = {k[len("net.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("net.")}
    datamodule = instantiate(cfg.data)
    datamodule.setup("fit")  # the standardization the LeNet was trained with
    test_acc = result["metrics"].get("test/acc")
    save_feature_extractor(
        out,
        OmegaConf.to_container(cfg.model.net, resolve=True),
        state,
        datamodule.mean,
        datamodule.std,
        source=str(best),
        test_acc=test_acc,
        config_hash=identity.config_hash(cfg),
        data_checksum=datamodule.checksum(),
    )
    return test_acc


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
        from normlab.fid import COMMITTED_FILE

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
    """`build` in a child process: the training there leaves this process's RNG streams,
    threads and Hydra state alone (a run that trains the LeNet first runs as one that finds
    it cached). Its output goes to this process's stdout/stderr."""
    command = [sys.executable, "-m", "normlab.fid_train", "--epochs", str(epochs)]
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


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="training epochs")
    parser.add_argument("--cache-dir", default=str(CACHE_DIR), help="the cache's root")
    parser.add_argument("--data-root", help="Fashion-MNIST root (default: paths.data_dir)")
    parser.add_argument("--conf-dir", help="normlab's conf/ (default: the source tree's)")
    parser.add_argument("--out", help="also copy the file here")
    parser.add_argument("--force", action="store_true", help="retrain even if cached")
    parser.add_argument("--path-file", help=argparse.SUPPRESS)  # ensure() reads the path here
    args, overrides = parser.parse_known_args(argv)
    try:
        path = build(
            args.cache_dir, args.epochs, overrides, args.data_root, args.conf_dir, args.force
        )
    except UserError as err:
        raise SystemExit(f"error: {err}") from None
    if args.path_file:  # ensure() asked: the path goes there, stdout stays the caller's
        Path(args.path_file).write_text(str(path))
        return
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        shutil.copyfile(path, tmp)
        os.replace(tmp, out)  # atomically, as the cache file itself
        print(f"fid_lenet file: {out} (a copy of {path})")
    else:
        print(f"fid_lenet file: {path}")


if __name__ == "__main__":
    main()
