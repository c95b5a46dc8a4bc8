"""fid_lenet: a Fréchet distance between generated and real Fashion-MNIST images, in the feature
space of a small LeNet classifier trained by this suite.

This is NOT the Inception FID of Heusel et al. (2017) and its numbers are not comparable with
published FIDs: the features are the 84 penultimate activations (after fc2, its norm and its
activation) of a LeNet trained on Fashion-MNIST (`normlab.fid_train`), not the 2048
pool3 features of an ImageNet Inception-v3. It only compares models within this suite, scored
with the same LeNet file, the same number of generated images and the same reference set.
Like FID it is biased upwards for small sample counts: compare runs at equal `num_samples`.

The LeNet file (`save_feature_extractor`) is self-contained: the network's config (`_target_`
and arguments), its weights, and the standardization (mean, std) it was trained with. One file
is committed with the package (`COMMITTED_FILE`, its sha256 pinned in `COMMITTED_SHA256`) and is
the default, as Inception's weights are FID's: two trainings of the same recipe give different
files, so fid_lenet values compare only when measured with the same file. Every load computes
the file's sha256 (`LeNetFeatures.sha256`), and the committed file must match its pin.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from torch import nn

from normlab.errors import ConfigError

FORMAT = "normlab.fid_lenet/1"
TRAIN_HINT = "python scripts/train_fid_lenet.py --out {path}"
# the LeNet every committed fid_lenet value was measured with (normlab.fid_train's recipe,
# 5 epochs, test/acc 0.9097), shipped as package data
COMMITTED_FILE = Path(__file__).resolve().parent / "assets" / "fid_lenet.pt"
COMMITTED_SHA256 = "8d0698580ee702422ccdc08d4a0ab9ddf62e84c2ec27a76d1e89d99e46bcadb1"


# ----- the Fréchet distance ------------------------------------------------------------------


def feature_stats(features: np.ndarray | torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean (F,) and covariance (F, F) of (N, F) features, in float64."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or f.shape[0] < 2:
        raise ValueError(f"feature_stats needs (N >= 2, F) features, got shape {f.shape}")
    return f.mean(0), np.cov(f, rowvar=False)


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    """Symmetric square root of a symmetric positive semi-definite matrix (eigen-decomposition)."""
    eigvals, eigvecs = np.linalg.eigh((matrix + matrix.T) / 2)
    return (eigvecs * np.sqrt(np.clip(eigvals, 0, None))) @ eigvecs.T


def frechet_distance(
    mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray
) -> float:
    """d^2 = |mu1 - mu2|^2 + tr(S1) + tr(S2) - 2 tr((S1 S2)^(1/2)), in float64.

    tr((S1 S2)^(1/2)) = tr((S1^(1/2) S2 S1^(1/2))^(1/2)): the second matrix is symmetric PSD,
    so its square root's trace is the sum of the square roots of its eigenvalues (no complex
    parts to discard, unlike a general sqrtm of S1 S2).
    """
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    s1, s2 = np.asarray(sigma1, np.float64), np.asarray(sigma2, np.float64)
    root1 = _sqrt_psd(s1)
    middle = root1 @ s2 @ root1
    tr_sqrt = np.sqrt(np.clip(np.linalg.eigvalsh((middle + middle.T) / 2), 0, None)).sum()
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2 * tr_sqrt)


# ----- the LeNet feature extractor -----------------------------------------------------------


class LeNetFeatures(nn.Module):
    """Pixels in [0, 1] (N, 1, 28, 28) -> standardized -> the LeNet's penultimate features."""

    def __init__(self, net: nn.Module, mean: float, std: float, sha256: str = "") -> None:
        super().__init__()
        self.net = net.eval().requires_grad_(False)
        self.mean, self.std = float(mean), float(std)
        self.sha256 = sha256  # of the file it was loaded from ("": not from a file)

    @torch.no_grad()
    def forward(self, pixels: torch.Tensor, batch_size: int = 1000) -> np.ndarray:
        """(N, 84) float64 features; images quantized to 8 bits first, as real ones are."""
        self.net.eval()
        out = []
        for chunk in pixels.split(batch_size):
            x = (chunk.clamp(0, 1) * 255).round() / 255
            out.append(self.net.penultimate((x - self.mean) / self.std).double())
        return torch.cat(out).cpu().numpy()


def save_feature_extractor(
    path: str | Path,
    net_config: Mapping[str, Any],
    state_dict: Mapping[str, torch.Tensor],
    mean: float,
    std: float,
    **meta: Any,
) -> Path:
    """Write a self-contained fid_lenet file: net config, weights, standardization, metadata.
    Atomically (a temp file beside it, then a rename): a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "format": FORMAT,
        "net": dict(net_config),
        "state_dict": dict(state_dict),
        "mean": float(mean),
        "std": float(std),
        "meta": meta,
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(blob, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def file_sha256(path: str | Path) -> str:
    """The sha256 hex digest of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _net_config(net: dict) -> dict:
    """A file's LeNet config; one written before norm configs were partials (`norm: {name: X,
    <keywords>}`, as the committed file) reads as `norm_layer: norm_partial(X, <keywords>)`."""
    legacy = net.get("norm")
    if not (isinstance(legacy, dict) and "name" in legacy and "norm_layer" not in net):
        return net
    layer = {"_target_": "normlab.norms.norm_partial", **legacy}
    return {**{k: v for k, v in net.items() if k != "norm"}, "norm_layer": layer}


def load_feature_extractor(path: str | Path) -> LeNetFeatures:
    """Read a file written by `save_feature_extractor`; a clear error when it is missing, or
    when it is the committed file and its bytes are not the pinned ones."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"fid_lenet needs a trained LeNet at {path}: run `{TRAIN_HINT.format(path=path)}` "
            "(a few minutes on a CPU), or drop the metric with callbacks.fid=null"
        )
    sha256 = file_sha256(path)
    if path.resolve() == COMMITTED_FILE.resolve() and sha256 != COMMITTED_SHA256:
        raise ConfigError(
            f"fid_lenet: the committed LeNet {path} has sha256 {sha256}, its pin is "
            f"{COMMITTED_SHA256} (normlab.fid.COMMITTED_SHA256): restore the file, or measure "
            "with your own with callbacks.fid.features=FILE"
        )
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise ConfigError(
            f"{path} is not a fid_lenet file ({FORMAT}); rebuild it: "
            + TRAIN_HINT.format(path=path)
        )
    net = instantiate(_net_config(blob["net"]))
    net.load_state_dict(blob["state_dict"])
    return LeNetFeatures(net, blob["mean"], blob["std"], sha256)


def fashion_mnist_test_pixels(root: str | Path) -> torch.Tensor:
    """The 10,000 Fashion-MNIST test images as (N, 1, 28, 28) floats in [0, 1]."""
    # lazy: Lightning (the data module's) loads only to read the test images
    from normlab.data.fashion_mnist import FashionMNISTDataModule

    images = FashionMNISTDataModule(root=str(root), download=False).test_images()
    return images.float().div(255).unsqueeze(1)


# ----- scoring a diffusion model -------------------------------------------------------------


SEED_STRIDE = 10_000  # batch seeds of one sample set: seed * SEED_STRIDE + batch index


def generate_pixels(
    task: Any,
    num_samples: int,
    steps: int | None = None,
    guidance_scale: float | None = None,
    seed: int = 0,
    batch_size: int = 500,
) -> torch.Tensor:
    """`num_samples` images in [0, 1], classes balanced (label i % num_classes), batch i seeded
    with seed * SEED_STRIDE + i, from the task's EMA weights: different seeds draw disjoint
    starting noise (up to SEED_STRIDE batches)."""
    labels = torch.arange(num_samples) % task.num_classes
    batches = labels.split(batch_size)
    if len(batches) > SEED_STRIDE:
        raise ConfigError(f"fid: {len(batches)} batches, at most {SEED_STRIDE} per seed")
    return torch.cat([
        task.sample_pixels(y, steps=steps, guidance_scale=guidance_scale,
                           seed=seed * SEED_STRIDE + i).cpu()
        for i, y in enumerate(batches)
    ])  # fmt: skip


def fid_lenet(
    features: LeNetFeatures,
    generated: torch.Tensor,
    reference_stats: tuple[np.ndarray, np.ndarray],
) -> float:
    """fid_lenet of generated pixels (N, 1, 28, 28) in [0, 1] against reference (mean, cov)."""
    mu, sigma = feature_stats(features(generated))
    return frechet_distance(mu, sigma, *reference_stats)
