"""normlab.fid_train: the LeNet of fid_lenet: the committed file by default (pinned by its
sha256, never trained), or one trained on first use and cached by its config and the data's
checksum. Trained here on a shrunk budget (2 steps): the pipeline, not the LeNet."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

from normlab import fid, fid_train
from normlab.analysis import sweep
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

    # the fid callback asked for the cached LeNet: the same cache, before training starts
    callback = FIDLeNet(
        DATA, features="cached", cache_dir=str(cache), lenet_epochs=1, lenet_overrides=TINY
    )
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


def test_dit_uses_the_committed_lenet_by_default(compose, tmp_path):
    cfg = compose(["experiment=dit"], tmp_path)
    assert cfg.callbacks.fid.features == fid_train.COMMITTED
    assert cfg.callbacks.fid.cache_dir == "outputs/fid_lenet"  # for features=cached
    assert cfg.callbacks.fid.lenet_epochs == fid_train.EPOCHS


def test_the_committed_lenet_matches_its_pin_and_ships_with_the_package():
    assert fid.COMMITTED_FILE.parent.parent == REPO / "src" / "normlab"
    assert hashlib.sha256(fid.COMMITTED_FILE.read_bytes()).hexdigest() == fid.COMMITTED_SHA256
    assert "assets/*.pt" in (REPO / "pyproject.toml").read_text()  # package data: in the wheel


@pytest.fixture
def no_training(monkeypatch):
    """Any attempt to train (or look up) a LeNet fails the test."""

    def fail(*args, **kwargs):
        raise AssertionError("a LeNet was trained")

    from normlab.run import fid_lenet

    monkeypatch.setattr(fid_train, "ensure", fail)  # the child process that trains one
    for name in ("build", "train"):  # the training itself (in that child process)
        monkeypatch.setattr(fid_lenet, name, fail)


def test_the_default_loads_the_committed_lenet_without_training(no_training):
    callback = FIDLeNet(DATA)
    callback.setup(None, None, "fit")
    assert callback.lenet.sha256 == fid.COMMITTED_SHA256
    mean, cov = callback.reference
    assert mean.shape == (84,) and cov.shape == (84, 84)
    sweep.ensure_fid_lenet(REPO)  # the reproductions' prepare hook: a check, no training


def test_an_altered_committed_lenet_is_a_one_line_error(tmp_path, monkeypatch):
    altered = tmp_path / "fid_lenet.pt"
    shutil.copyfile(fid.COMMITTED_FILE, altered)
    data = bytearray(altered.read_bytes())
    data[-100] ^= 1
    altered.write_bytes(bytes(data))
    monkeypatch.setattr(fid, "COMMITTED_FILE", altered)
    with pytest.raises(ConfigError) as err:
        FIDLeNet(DATA).setup(None, None, "fit")
    message = str(err.value)
    assert "\n" not in message and str(altered) in message
    assert fid.COMMITTED_SHA256 in message and fid.file_sha256(altered) in message
    with pytest.raises(ConfigError, match="its pin is"):
        sweep.ensure_fid_lenet(REPO)


def test_the_script_retrains_into_out(tmp_path):
    out = tmp_path / "mine" / "lenet.pt"
    args = ["--epochs", "1", "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]
    cmd = [sys.executable, "scripts/train_fid_lenet.py", *args, *TINY]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"fid_lenet file: {out}" in proc.stdout and "training one (1 epoch" in proc.stderr
    assert fid.file_sha256(out) != fid.COMMITTED_SHA256  # a LeNet of its own
    callback = FIDLeNet(DATA, features=str(out))  # measured with it
    callback.setup(None, None, "fit")
    assert callback.lenet.sha256 == fid.file_sha256(out)


@pytest.mark.parametrize("features", [None, ""])
def test_no_features_is_a_one_line_error(features):
    with pytest.raises(ConfigError, match="give committed, cached or a fid_lenet file"):
        FIDLeNet(DATA, features=features).setup(None, None, "fit")


def test_a_given_file_is_used_as_is(tmp_path):
    callback = FIDLeNet(DATA, features=str(tmp_path / "missing.pt"), cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="fid_lenet needs a trained LeNet"):
        callback.setup(None, None, "fit")
    assert not any(tmp_path.iterdir())  # nothing trained
