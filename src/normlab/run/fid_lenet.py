"""Train the LeNet fid_lenet measures in, with one normlab run, or find it cached (its recipe,
cache and file: normlab.fid_train, which runs this in a child process; see its docstring).

    python -m normlab.run.fid_lenet [--epochs 5] [--cache-dir outputs/fid_lenet] [--out FILE]
                                    [--force] [train.py overrides ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from normlab import identity
from normlab.errors import UserError
from normlab.fid import save_feature_extractor
from normlab.fid_train import CACHE_DIR, EPOCHS, cache_file, compose_recipe
from normlab.files import file_lock
from normlab.run.training import train as train_run


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
