"""normlab.fid_train: the LeNet of fid_lenet, trained on first use and cached by its config and
the data's checksum. Trained here on a shrunk budget (2 steps): the pipeline, not the LeNet."""

from __future__ import annotations

import os

import pytest
from conftest import REPO

from normlab import fid, fid_train
from normlab.callbacks.fid import FIDLeNet
from normlab.errors import ConfigError

TINY = [
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "num_threads=1",
]
DATA = os.environ["NORMLAB_DATA"]


@pytest.fixture
def recipe():
    """compose_recipe, with Hydra's global config reset afterwards."""
    from hydra.core.hydra_config import HydraConfig

    yield lambda *a, **kw: fid_train.compose_recipe(*a, conf_dir=REPO / "conf", **kw)
    HydraConfig.instance().cfg = None


def test_first_use_trains_once_then_the_cache_serves(tmp_path, capfd):
    cache = tmp_path / "cache"
    path = fid_train.ensure(cache, epochs=1, overrides=TINY, conf_dir=REPO / "conf")
    err = capfd.readouterr().err
    assert "fid_lenet: no LeNet cached for this config and data; training one (1 epoch" in err
    assert "fid_lenet: trained in" in err
    assert path.name == "lenet.pt" and path.parent.parent == cache.resolve()
    config_key, data_key = path.parent.name.split("-")
    assert len(config_key) == len(data_key) == 12
    assert sorted(p.name for p in path.parent.iterdir()) == [".lock", "lenet.pt", "run"]
    features = fid.load_feature_extractor(path)
    assert features(fid.fashion_mnist_test_pixels(DATA)[:10]).shape == (10, 84)

    mtime = path.stat().st_mtime_ns
    again = fid_train.ensure(cache, epochs=1, overrides=TINY, conf_dir=REPO / "conf")
    assert again == path and path.stat().st_mtime_ns == mtime
    assert "training one" not in capfd.readouterr().err

    # the fid callback with no file given: the same cache, before training starts
    callback = FIDLeNet(DATA, cache_dir=str(cache), lenet_epochs=1, lenet_overrides=TINY)
    callback.setup(None, None, "fit")
    mean, cov = callback.reference
    assert mean.shape == (84,) and cov.shape == (84, 84)
    assert "training one" not in capfd.readouterr().err


def test_the_cache_key_follows_config_and_data_not_paths(recipe, tmp_path):
    def where(*args, checksum="a" * 64, **kw):
        return fid_train.cache_file(tmp_path, recipe(*args, **kw), checksum)

    base = where(1, TINY)
    assert where(1, TINY) == base
    assert where(2, TINY) != base  # the budget
    assert where(1, [*TINY, "model.net.pool=max"]) != base  # the recipe
    assert where(1, TINY, checksum="b" * 64) != base  # the data
    assert where(1, TINY, data_root=tmp_path / "x") == where(1, TINY, data_root=tmp_path / "y")


def test_dit_uses_the_cache_by_default(compose, tmp_path):
    cfg = compose(["experiment=dit"], tmp_path)
    assert cfg.callbacks.fid.ckpt is None
    assert cfg.callbacks.fid.cache_dir == "outputs/fid_lenet"
    assert cfg.callbacks.fid.lenet_epochs == fid_train.EPOCHS


def test_a_given_file_is_used_as_is(tmp_path):
    callback = FIDLeNet(DATA, ckpt=str(tmp_path / "missing.pt"), cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="fid_lenet needs a trained LeNet"):
        callback.setup(None, None, "fit")
    assert not any(tmp_path.iterdir())  # nothing trained
