"""fid_lenet: the Fréchet distance (float64) and the LeNet feature pipeline.

The feature extractor in these tests is a randomly initialised LeNet (seed 0, eval mode), not
a trained one: it keeps the tests fast, and the checks below only need features that are a
fixed function of the image.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.linalg
import torch

from normlab import fid
from normlab.errors import ConfigError

LENET = {
    "_target_": "normlab.models.lenet.LeNet",
    "norm_layer": {"_target_": "normlab.norms.BatchNorm", "_partial_": True, "eps": 1e-5,
                   "momentum": 0.1, "affine": True, "track_running_stats": True, "sync": False,
                   "impl": "fast"},
    "activation": "relu",
}  # fmt: skip


def random_spd(n, seed):
    a = np.random.default_rng(seed).normal(size=(n, n))
    return a @ a.T / n + 0.1 * np.eye(n)


def test_identical_features_give_zero():
    f = np.random.default_rng(0).normal(size=(500, 84))
    stats = fid.feature_stats(f)
    assert abs(fid.frechet_distance(*stats, *stats)) < 1e-8


def test_gaussians_with_known_distance():
    # diagonal covariances: d^2 = |mu1 - mu2|^2 + sum (s1 - s2)^2 over the standard deviations
    mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    sd1, sd2 = np.array([1.0, 2.0, 0.5]), np.array([3.0, 2.0, 1.5])
    expected = 1 + 4 + (2**2 + 0 + 1)
    d = fid.frechet_distance(mu1, np.diag(sd1**2), mu2, np.diag(sd2**2))
    assert d == pytest.approx(expected, rel=1e-12)


def test_matches_the_sqrtm_formula():
    s1, s2 = random_spd(20, 1), random_spd(20, 2)
    mu1, mu2 = np.zeros(20), np.full(20, 0.3)
    covmean = scipy.linalg.sqrtm(s1 @ s2).real
    expected = (mu1 - mu2) @ (mu1 - mu2) + np.trace(s1 + s2 - 2 * covmean)
    assert fid.frechet_distance(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-8)


@pytest.fixture(scope="module")
def extractor(tmp_path_factory):
    from hydra.utils import instantiate

    torch.manual_seed(0)
    net = instantiate(LENET)
    path = tmp_path_factory.mktemp("fid") / "lenet.pt"
    fid.save_feature_extractor(path, LENET, net.state_dict(), 0.2860, 0.3530, note="random init")
    return fid.load_feature_extractor(path)


def test_test_set_halves_are_close_and_noise_is_far(extractor):
    pixels = fid.fashion_mnist_test_pixels(os.environ["NORMLAB_DATA"])[:4000]
    features = extractor(pixels)
    assert features.shape == (4000, 84) and features.dtype == np.float64
    first, second = fid.feature_stats(features[::2]), fid.feature_stats(features[1::2])
    halves = fid.frechet_distance(*first, *second)
    noise = torch.rand(2000, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    to_noise = fid.fid_lenet(extractor, noise, second)
    assert 0 <= halves < to_noise / 100


class TorchFeatures(torch.nn.Module):
    """The LeNet features as torchmetrics' custom feature module wants them: a tensor."""

    def __init__(self, extractor):
        super().__init__()
        self.extractor, self.num_features = extractor, 84

    def forward(self, pixels):
        return torch.from_numpy(self.extractor(pixels))


def test_fid_lenet_agrees_with_torchmetrics_frechet_distance(extractor):
    from torchmetrics.image.fid import FrechetInceptionDistance

    real = fid.fashion_mnist_test_pixels(os.environ["NORMLAB_DATA"])[:3000]
    flipped = real[:1500].flip(-2)  # upside down: other features, the same pixel values
    metric = FrechetInceptionDistance(feature=TorchFeatures(extractor), normalize=True)
    metric.update(real, real=True)
    metric.update(flipped, real=False)
    ours = fid.fid_lenet(extractor, flipped, fid.feature_stats(extractor(real)))
    assert ours > 1e-3 and float(metric.compute()) == pytest.approx(ours, rel=1e-6)


def test_missing_extractor_names_the_script(tmp_path):
    with pytest.raises(ConfigError, match="scripts/train_fid_lenet.py"):
        fid.load_feature_extractor(tmp_path / "nothing.pt")


class RecordingTask:
    """Stands in for a DiffusionTask: records the seed of each sampled batch."""

    num_classes = 10

    def __init__(self):
        self.seeds = []

    def sample_pixels(self, y, steps=None, guidance_scale=None, seed=0):
        self.seeds.append(seed)
        return torch.zeros(len(y), 1, 28, 28)


def test_sample_sets_of_different_seeds_share_no_starting_noise():
    sets = {}
    for seed in (0, 1):
        task = RecordingTask()
        pixels = fid.generate_pixels(task, 5000, seed=seed, batch_size=500)
        assert pixels.shape == (5000, 1, 28, 28)
        sets[seed] = task.seeds
    assert sets[0] == list(range(10))  # seed 0: the batch seeds val/fid_lenet always used
    assert len(sets[0]) == 10 and not set(sets[0]) & set(sets[1])
