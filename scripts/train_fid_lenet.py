"""Train the LeNet that fid_lenet measures in, with normlab's own training, and save it.

    python scripts/train_fid_lenet.py [--out outputs/fid_lenet/lenet.pt] [--epochs 5] [--force]

Runs `python train.py model=lenet norm=batchnorm model.net.activation=relu ...` into
<out dir>/run, then writes a self-contained fid_lenet file (net config, best weights by val/acc,
the data standardization) to --out. Extra arguments are passed to train.py as overrides.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

import normlab.config  # noqa: F401  (registers the resolvers the run's config uses)
from normlab.fid import save_feature_extractor

REPO = Path(__file__).resolve().parents[1]


def last_value(metrics_csv: Path, key: str) -> float | None:
    """The last non-empty value of column `key` in a Lightning metrics.csv."""
    if not metrics_csv.is_file():
        return None
    with open(metrics_csv) as f:
        values = [row[key] for row in csv.DictReader(f) if row.get(key)]
    return float(values[-1]) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/fid_lenet/lenet.pt", help="fid_lenet file")
    parser.add_argument("--epochs", type=int, default=5, help="training epochs")
    parser.add_argument("--force", action="store_true", help="retrain even if --out exists")
    args, overrides = parser.parse_known_args()
    out = Path(args.out)
    if out.is_file() and not args.force:
        print(f"{out} exists (use --force to retrain)")
        return
    run_dir = out.parent / "run"
    command = [
        sys.executable, str(REPO / "train.py"),
        "model=lenet", "norm=batchnorm", "model.net.activation=relu", "optim=adam",
        f"trainer.max_epochs={args.epochs}", "callbacks.norm_stats=null", "logger=csv",
        "test=true", f"hydra.run.dir={run_dir.resolve()}", *overrides,
    ]  # fmt: skip
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=REPO)

    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    net_config = OmegaConf.to_container(cfg.model.net, resolve=True)
    ckpt = torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    state = {k[len("net.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("net.")}
    datamodule = instantiate(cfg.data, root=str(Path(cfg.data.root).resolve()))
    datamodule.setup("fit")  # the standardization the LeNet was trained with
    metrics = run_dir / "csv" / "metrics.csv"
    test_acc = last_value(metrics, "test/acc")
    save_feature_extractor(
        out, net_config, state, datamodule.mean, datamodule.std,
        source=str(run_dir / "checkpoints" / "best.ckpt"), test_acc=test_acc,
    )  # fmt: skip
    print(f"wrote {out} (LeNet test/acc={test_acc})")


if __name__ == "__main__":
    main()
