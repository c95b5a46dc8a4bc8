"""Data files on disk: .gz-only Fashion-MNIST works offline (unpacked atomically, into the cache
when raw/ is read-only), files are checked by content on every read, nothing is downloaded when
the files are there. Every test works on copies in tmp_path of the files in the data root
($NORMLAB_DATA, the conftest's data_root), never in the data root itself."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from normlab.data import fashion_mnist, integrity, shakespeare
from normlab.data.fashion_mnist import GZ_SHA256, SHA256, FashionMNISTDataModule
from normlab.data.shakespeare import ShakespeareDataModule
from normlab.errors import DataError

# sha256 over "name sha256\n" of the four unpacked files: the key fid_lenet caches under
CHECKSUM = "daf9de4cf12669ecda2c289b235db8654ca1a41e08fab265b0fc64c56f960be8"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """normlab's cache folder for this test (never ~/.cache)."""
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def no_download(monkeypatch):
    """Any download attempt fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(FashionMNISTDataModule, "_download", refuse)
    monkeypatch.setattr(fashion_mnist, "FashionMNIST", refuse)
    monkeypatch.setattr(shakespeare, "download", refuse)


def copy_raw(data_root: Path, tmp_path: Path, suffix: str) -> Path:
    """A data root in tmp_path holding copies of data_root's four Fashion-MNIST files
    name + suffix; its raw/ folder."""
    source, raw = data_root / "FashionMNIST" / "raw", tmp_path / "data" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in SHA256:
        shutil.copyfile(source / f"{name}{suffix}", raw / f"{name}{suffix}")
    return raw


def corrupt_in_place(path: Path) -> None:
    """Flip one byte, keeping the size and restoring atime and mtime."""
    before = path.stat()
    with open(path, "r+b") as f:
        f.seek(before.st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_gz_only_raw_dir_sets_up_offline(data_root, tmp_path, no_download):
    raw = copy_raw(data_root, tmp_path, ".gz")
    data = FashionMNISTDataModule(root=str(raw.parents[1]), download=True, batch_size=64)
    data.setup("fit")
    images, labels = data.splits["train"]
    assert images.shape == (55000, 1, 28, 28) and labels.shape == (55000,)
    assert data.splits["test"][0].shape == (10000, 1, 28, 28)
    assert abs(data.mean - 0.286) < 1e-3  # real pixels, standardized with the train statistics
    for name, expected in SHA256.items():  # unpacked beside the .gz, whole
        assert sha256(raw / name) == expected
    assert sorted(p.name for p in raw.iterdir()) == sorted([*SHA256, *(f"{n}.gz" for n in SHA256)])
    assert data.checksum() == CHECKSUM  # fid_lenet's key: the same as from the unpacked release


def test_read_only_raw_dir_unpacks_into_the_cache_or_says_where_to_put_files(
    data_root, tmp_path, cache, monkeypatch, no_download
):
    raw = copy_raw(data_root, tmp_path, ".gz")
    real_mkstemp = tempfile.mkstemp
    read_only = {raw}

    def mkstemp(dir=None, **kwargs):  # tests run as root here: chmod would not stop a write
        if Path(dir) in read_only:
            raise PermissionError(13, "Permission denied", str(dir))
        return real_mkstemp(dir=dir, **kwargs)

    monkeypatch.setattr(integrity.tempfile, "mkstemp", mkstemp)
    data = FashionMNISTDataModule(root=str(raw.parents[1]), download=False)
    data.prepare_data()
    assert sorted(p.name for p in raw.iterdir()) == sorted(f"{n}.gz" for n in SHA256)
    for name, expected in SHA256.items():
        assert sha256(cache / "FashionMNIST" / "raw" / name) == expected
    assert data.checksum() == CHECKSUM

    shutil.rmtree(cache)
    read_only.add(cache / "FashionMNIST" / "raw")
    with pytest.raises(DataError) as err:
        FashionMNISTDataModule(root=str(raw.parents[1]), download=False).prepare_data()
    message = str(err.value)
    assert "\n" not in message
    assert f"{raw} is read-only" in message
    name = "train-images-idx3-ubyte"
    assert f"Put the unpacked {name} (gunzip of {name}.gz) in {raw}" in message
    assert "NORMLAB_CACHE" in message


def test_no_files_offline_names_every_accepted_file_and_where(tmp_path):
    data = FashionMNISTDataModule(root=str(tmp_path / "empty"), download=False)
    with pytest.raises(DataError) as err:
        data.prepare_data()
    raw = tmp_path / "empty" / "FashionMNIST" / "raw"
    assert str(err.value).splitlines() == [
        f"Fashion-MNIST files missing from {raw}",
        "put there, each .gz or unpacked: " + " ".join(SHA256),
        "or point NORMLAB_DATA (or data.root) at a folder holding FashionMNIST/raw",
    ]


def test_a_failed_download_is_one_clause_of_the_three_lines(tmp_path, monkeypatch):
    from normlab.data import fashion_mnist

    def offline(root, train, download):  # torchvision's message: three lines, a URL, <...>
        raise RuntimeError(
            "Error downloading train-images-idx3-ubyte.gz:\nTried http://mirror/, got:\n"
            "<urlopen error [Errno -2] Name or service not known>\n"
        )

    monkeypatch.setattr(fashion_mnist, "FashionMNIST", offline)
    with pytest.raises(DataError) as err:
        FashionMNISTDataModule(root=str(tmp_path)).prepare_data()
    lines = str(err.value).splitlines()
    assert len(lines) == 3 and "http" not in lines[0]
    assert lines[0].endswith("(download failed: [Errno -2] Name or service not known)")


@pytest.mark.parametrize("download", [True, False])
def test_missing_shakespeare_is_three_short_lines(download, tmp_path, monkeypatch):
    def offline(url, path, timeout=30.0):
        raise OSError("<urlopen error [Errno -2] Name or service not known>")

    monkeypatch.setattr(shakespeare, "download", offline)
    data = shakespeare.ShakespeareDataModule(root=str(tmp_path), download=download, batch_size=8)
    with pytest.raises(DataError) as err:
        data.prepare_data()
        data.setup("fit")
    lines = str(err.value).splitlines()
    assert len(lines) == 3 and lines[1].startswith("put input.txt there, from https://")
    assert lines[0].startswith(f"tiny Shakespeare missing: no {tmp_path}")
    assert ("download failed: [Errno -2] Name or service not known" in lines[0]) == download


def test_a_truncated_gz_fails_with_one_line_and_unpacks_nothing(data_root, tmp_path, no_download):
    raw = copy_raw(data_root, tmp_path, ".gz")
    gz = raw / "t10k-labels-idx1-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:-100])
    with pytest.raises(DataError) as err:
        FashionMNISTDataModule(root=str(raw.parents[1]), download=True).prepare_data()
    message = str(err.value)
    assert "\n" not in message
    assert str(gz) in message and "corrupted or truncated" in message
    assert "the release has 67da17c76eaf" in message  # checked against the .gz's sha256
    assert not (raw / "t10k-labels-idx1-ubyte").exists()
    assert not list(raw.glob(".*"))  # no temp file

    # the unpacker checks the stream on its own too (a truncated .gz with no known sha256)
    dst = tmp_path / "out"
    with pytest.raises(DataError, match="corrupted or truncated"):
        integrity.gunzip(gz, dst, SHA256["t10k-labels-idx1-ubyte"])
    assert list(tmp_path.glob("*out*")) == []


def test_a_gz_that_unpacks_to_other_bytes_is_refused(tmp_path):
    src = tmp_path / "t10k-labels-idx1-ubyte.gz"
    src.write_bytes(gzip.compress(b"\x00" * 10008))
    dst = tmp_path / "t10k-labels-idx1-ubyte"
    with pytest.raises(DataError, match="unpacks to sha256"):
        integrity.gunzip(src, dst, SHA256[dst.name])
    assert not dst.exists() and not list(tmp_path.glob(".*"))


def test_corruption_in_place_with_mtime_kept_is_caught(data_root, tmp_path, no_download):
    raw = copy_raw(data_root, tmp_path, "")
    data = FashionMNISTDataModule(root=str(raw.parents[1]), download=False)
    data.prepare_data()  # a verified run first
    assert data.checksum() == CHECKSUM
    target = raw / "t10k-labels-idx1-ubyte"
    corrupt_in_place(target)
    again = FashionMNISTDataModule(root=str(raw.parents[1]), download=False)
    with pytest.raises(DataError, match="corrupted or truncated data file .*t10k-labels") as err:
        again.prepare_data()
    assert str(target) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DataError, match="t10k-labels"):
        data.checksum()  # fid_lenet's cache key is never computed from a bad file


def test_shakespeare_corruption_in_place_with_mtime_kept_is_caught(
    data_root, tmp_path, no_download
):
    path = tmp_path / "tinyshakespeare" / "input.txt"
    path.parent.mkdir()
    shutil.copyfile(data_root / "tinyshakespeare" / "input.txt", path)
    data = ShakespeareDataModule(str(tmp_path), batch_size=4, ctx=8)
    data.prepare_data()
    data.setup()
    assert len(data.chars) == 65
    corrupt_in_place(path)
    again = ShakespeareDataModule(str(tmp_path), batch_size=4, ctx=8)
    again.prepare_data()  # present: no download
    with pytest.raises(DataError, match="corrupted or not tiny Shakespeare"):
        again.setup()


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_no_download_is_attempted_when_the_files_are_present(
    data_root, tmp_path, suffix, no_download
):
    raw = copy_raw(data_root, tmp_path, suffix)
    FashionMNISTDataModule(root=str(raw.parents[1]), download=True).prepare_data()
    ShakespeareDataModule(str(data_root), batch_size=4, ctx=8, download=True).prepare_data()


def test_missing_files_are_downloaded_and_only_those(data_root, tmp_path, monkeypatch):
    raw = copy_raw(data_root, tmp_path, ".gz")
    (raw / "train-labels-idx1-ubyte.gz").unlink()
    asked = []
    monkeypatch.setattr(FashionMNISTDataModule, "_download", lambda self, m: asked.extend(m))
    with pytest.raises(DataError, match="train-labels-idx1-ubyte"):
        FashionMNISTDataModule(root=str(raw.parents[1]), download=True).prepare_data()
    assert asked == ["train-labels-idx1-ubyte"]


def test_a_killed_extraction_leaves_no_partial_file(data_root, tmp_path, monkeypatch, no_download):
    raw = copy_raw(data_root, tmp_path, ".gz")
    real_open = gzip.open

    class Killed(gzip.GzipFile):
        reads = 0

        def read(self, size=-1):
            Killed.reads += 1
            if Killed.reads == 3:  # two blocks written, then the process dies
                raise KeyboardInterrupt("killed mid-write")
            return super().read(size)

    monkeypatch.setattr(integrity.gzip, "open", lambda path, mode: Killed(path, mode))
    data = FashionMNISTDataModule(root=str(raw.parents[1]), download=False)
    with pytest.raises(KeyboardInterrupt):
        data.prepare_data()
    assert Killed.reads == 3
    assert sorted(p.name for p in raw.iterdir()) == sorted(f"{n}.gz" for n in SHA256)

    monkeypatch.setattr(integrity.gzip, "open", real_open)
    data.prepare_data()  # the next run unpacks it whole
    assert sha256(raw / "train-images-idx3-ubyte") == SHA256["train-images-idx3-ubyte"]


def test_gz_checksums_are_the_ones_torchvision_lists(data_root):
    import torchvision.datasets

    md5 = dict(torchvision.datasets.FashionMNIST.resources)
    for name in SHA256:
        gz = (data_root / "FashionMNIST" / "raw" / f"{name}.gz").read_bytes()
        assert hashlib.md5(gz).hexdigest() == md5[f"{name}.gz"]
        assert hashlib.sha256(gz).hexdigest() == GZ_SHA256[name]
