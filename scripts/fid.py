"""fid_lenet of DiT checkpoints (EMA weights) against the Fashion-MNIST test set.

    python scripts/fid.py CKPT [CKPT ...] [--num-samples 1000] [--steps 25]
                          [--guidance-scale G] [--lenet committed|cached|FILE] [--seed 0]
                          [--num-threads 1]

One JSON line per checkpoint, in their order, each scored with the same settings; the LeNet and
the test set's features load once. Different --seed values draw disjoint starting noise: two
seeds of one checkpoint give the resampling noise of fid_lenet. Each line also reports the
sampling time in seconds.

Each model is rebuilt from its run's composed config (<run dir>/.hydra/config.yaml, the run dir
being CKPT/../..; or --config, for one checkpoint). fid_lenet is NOT Inception FID: see
normlab.fid.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

import normlab.config  # registers the resolvers the run's config uses
from normlab import fid, fid_train
from normlab.errors import UserError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", type=Path, nargs="+", help="checkpoints of diffusion runs")
    parser.add_argument("--config", type=Path, help="default: CKPT/../../.hydra/config.yaml")
    parser.add_argument(
        "--lenet",
        default=fid_train.COMMITTED,
        help="committed (default: the committed LeNet), cached (normlab.fid_train's, trained "
        "if missing) or a fid_lenet file",
    )
    parser.add_argument("--data-root", default=os.environ.get("NORMLAB_DATA", "data"))
    parser.add_argument("--num-samples", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=None, help="DDIM steps (default: model's)")
    parser.add_argument("--guidance-scale", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--num-threads", type=int, default=1, help="torch threads (CPU)")
    args = parser.parse_args()
    if args.config is not None and len(args.ckpt) > 1:
        parser.error("--config names the config of one checkpoint; give one CKPT with it")
    torch.set_num_threads(args.num_threads)
    features = fid.load_feature_extractor(
        fid_train.feature_file(args.lenet, data_root=args.data_root)
    )
    reference = fid.feature_stats(features(fid.fashion_mnist_test_pixels(args.data_root)))
    for ckpt in args.ckpt:
        print(json.dumps(score(ckpt, args, features, reference)), flush=True)


def score(ckpt: Path, args: argparse.Namespace, features, reference) -> dict:
    """The JSON line of one checkpoint: its fid_lenet and the settings it was scored with."""
    cfg = OmegaConf.load(args.config or ckpt.parent.parent / ".hydra" / "config.yaml")
    normlab.config.import_plugins(cfg)  # a norm of the run's own plugins
    task = instantiate(cfg.model)
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    task.load_state_dict(state)
    start = time.perf_counter()
    generated = fid.generate_pixels(
        task, args.num_samples, args.steps, args.guidance_scale, args.seed, args.batch_size
    )
    sample_seconds = time.perf_counter() - start
    return {
        "ckpt": str(ckpt),
        "fid_lenet": fid.fid_lenet(features, generated, reference),
        "num_samples": args.num_samples,
        "seed": args.seed,
        "steps": args.steps or task.sample_steps,
        "guidance_scale": task.guidance_scale
        if args.guidance_scale is None
        else args.guidance_scale,
        "sample_seconds": round(sample_seconds, 1),
        "num_threads": args.num_threads,
        "lenet_sha256": features.sha256[:12],
    }


if __name__ == "__main__":
    try:
        main()
    except UserError as err:
        raise SystemExit(f"error: {err}") from None
