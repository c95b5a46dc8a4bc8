"""Fashion-MNIST as one normalized tensor in memory, read with torchvision's IDX reader.

raw/ may hold the official .gz files, the unpacked files, or both: a missing unpacked file is
unpacked from its .gz (into raw/, or into normlab's cache folder when raw/ is read-only)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
from torchvision.datasets import FashionMNIST
from torchvision.datasets.mnist import read_image_file, read_label_file

from normlab.data.integrity import cache_dir, clause, gunzip, verify
from normlab.data.tensor_loader import TensorLoader
from normlab.errors import DataError

# sha256 of the official release files (the unpacked files torchvision reads).
SHA256 = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
# sha256 of the official .gz files (their md5 are the ones in torchvision's FashionMNIST.resources).
GZ_SHA256 = {
    "train-images-idx3-ubyte": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
    "train-labels-idx1-ubyte": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    "t10k-images-idx3-ubyte": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    "t10k-labels-idx1-ubyte": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
}
TRAIN_IMAGES = 60_000  # in the release's training file (every file is checked against SHA256)
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")  # fmt: skip


class FashionMNISTDataModule(pl.LightningDataModule):
    """Train/val/test splits as float tensors (N, 1, 28, 28), standardized with train mean/std."""

    num_classes = 10
    classes = CLASSES  # names of labels 0..9
    input_shape = (1, 28, 28)

    def __init__(
        self,
        root: str = "data",
        batch_size: int = 256,
        val_size: int = 5000,
        split_seed: int = 0,
        download: bool = True,
        eval_batch_size: int = 1000,
    ):
        super().__init__()
        self.root = Path(root)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.val_size = val_size
        self.split_seed = split_seed
        self.download = download
        self.splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._paths: dict[str, Path] = {}  # name -> verified unpacked file, set by prepare_data
        self.mean = self.std = 0.0
        self.check_sizes(world_size=1)  # before any work; setup checks again per process

    def check_sizes(self, world_size: int) -> None:
        """Raise DataError, naming the numbers, unless the split leaves every one of world_size
        processes at least one full training batch (a last partial batch is dropped)."""
        n, val = TRAIN_IMAGES, self.val_size
        if isinstance(val, bool) or not isinstance(val, int) or not 0 <= val < n:
            raise DataError(f"data.val_size must be in [0, {n}) (the training images), got {val!r}")
        per_process = (n - val) // world_size
        if self.batch_size > per_process:
            over = f", over {world_size} processes" if world_size > 1 else ""
            raise DataError(
                f"batch={self.batch_size} is more than the {per_process} training images per "
                f"process ({n} - data.val_size={val}{over}): no full training batch"
            )

    @property
    def raw_dir(self) -> Path:
        return self.root / "FashionMNIST" / "raw"

    @property
    def unpack_dir(self) -> Path:
        """Where a .gz is unpacked when raw/ is read-only."""
        return cache_dir() / "FashionMNIST" / "raw"

    def _hint(self) -> str:
        files = ", ".join(f"{name}.gz or {name}" for name in SHA256)
        return (
            f"Put the four official Fashion-MNIST files in {self.raw_dir}, each as downloaded "
            f"(.gz) or unpacked: {files} (or set NORMLAB_DATA / data.root to a folder holding "
            "FashionMNIST/raw), or run once with network access to download them."
        )

    def _missing(self, absent: list[str], failed: str | None = None) -> str:
        """Three short lines: which files are missing where (and why the download failed, in
        one clause), the names to put there, and the other way to point at them."""
        why = f" (download failed: {failed})" if failed else ""
        return (
            f"Fashion-MNIST files missing from {self.raw_dir}{why}\n"
            f"put there, each .gz or unpacked: {' '.join(absent)}\n"
            "or point NORMLAB_DATA (or data.root) at a folder holding FashionMNIST/raw"
        )

    def _absent(self) -> list[str]:
        """The files found in raw/ neither unpacked nor as .gz."""
        raw = self.raw_dir
        return [n for n in SHA256 if not (raw / n).is_file() and not (raw / f"{n}.gz").is_file()]

    def prepare_data(self) -> None:
        """Download when files are missing (and allowed); unpack .gz files whose unpacked file is
        missing; verify every file's sha256 (hashed from its bytes). Once per data module: a run
        checks its files before it starts, and Lightning's fit and test call this again."""
        if self._paths:
            return
        absent = self._absent()
        failed = self._download(absent) if absent and self.download else None
        if failed is not None:
            raise DataError(self._missing(self._absent(), failed))
        self._paths = self._verified()

    def _verified(self) -> dict[str, Path]:
        """name -> the unpacked file to read, each checked against SHA256 (DataError if not)."""
        absent = self._absent()
        if absent:
            raise DataError(self._missing(absent))
        return {name: self._unpacked(name) for name in SHA256}

    def _unpacked(self, name: str) -> Path:
        plain = self.raw_dir / name
        if plain.is_file():  # the user's file: a bad one is reported, never replaced
            verify(plain, SHA256[name], self._hint())
            return plain
        gz = self.raw_dir / f"{name}.gz"
        verify(gz, GZ_SHA256[name], self._hint())
        try:
            gunzip(gz, plain, SHA256[name])
            return plain
        except OSError:  # raw/ is read-only: unpack into the cache, re-made if it is bad
            pass
        cached = self.unpack_dir / name
        try:
            if cached.is_file():
                verify(cached, SHA256[name], "")
                return cached
        except DataError:
            pass
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            gunzip(gz, cached, SHA256[name])
        except OSError as err:
            raise DataError(
                f"cannot unpack {gz}: {self.raw_dir} is read-only and {cached.parent} is not "
                f"writable ({err.strerror or err}). Put the unpacked {name} (gunzip of {gz.name}) "
                f"in {self.raw_dir}, or set NORMLAB_CACHE to a writable folder."
            ) from None
        return cached

    def checksum(self) -> str:
        """sha256 over the sha256 of each of the four files. The files are checked first (a
        DataError unless each is the release's), so this equals the value from SHA256."""
        self._verified()
        lines = "".join(f"{name} {SHA256[name]}\n" for name in sorted(SHA256))
        return hashlib.sha256(lines.encode()).hexdigest()

    def _download(self, missing: list[str]) -> str | None:
        """Download into a temp dir beside raw/, then move each file in with one rename, so a
        half-written download is never where the reader looks. None when done, else why not
        (one clause: torchvision's last line, e.g. `Name or service not known`)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=self.root, prefix=".download-") as tmp:
                for train in (True, False):
                    FashionMNIST(tmp, train=train, download=True)
                self.raw_dir.mkdir(parents=True, exist_ok=True)
                for name in missing:
                    os.replace(Path(tmp) / "FashionMNIST" / "raw" / name, self.raw_dir / name)
        except Exception as err:  # offline, mirror down, disk full, root not writable...
            return clause(err)
        return None

    def _read(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        split = "train" if train else "t10k"
        images = read_image_file(str(self._paths[f"{split}-images-idx3-ubyte"]))
        labels = read_label_file(str(self._paths[f"{split}-labels-idx1-ubyte"]))
        return images, labels

    def test_images(self) -> torch.Tensor:
        """The 10,000 official test images as uint8 (N, 28, 28), from the checked files."""
        if not self._paths:
            self.prepare_data()
        return self._read(train=False)[0]

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()  # a no-op when this data module has checked its files
        images, labels = self._read(train=True)
        test_images, test_labels = self._read(train=False)
        self.check_sizes(self.trainer.world_size if self.trainer else 1)
        order = torch.randperm(
            len(images), generator=torch.Generator().manual_seed(self.split_seed)
        )
        train_idx, val_idx = order[self.val_size :], order[: self.val_size]
        pixels = images[train_idx].float().div_(255)
        self.mean, self.std = pixels.mean().item(), pixels.std().item()

        def norm(x: torch.Tensor) -> torch.Tensor:
            return x.float().div_(255).sub_(self.mean).div_(self.std).unsqueeze(1)

        self.splits = {
            "train": (norm(images[train_idx]), labels[train_idx]),
            "val": (norm(images[val_idx]), labels[val_idx]),
            "test": (norm(test_images), test_labels),
        }

    def _loader(self, split: str, train: bool) -> TensorLoader:
        trainer = self.trainer
        return TensorLoader(
            self.splits[split],
            self.batch_size if train else self.eval_batch_size,
            shuffle=train,
            drop_last=train,  # a last batch of 1 would break BatchNorm mid-epoch
            seed=torch.initial_seed() % (2**31),
            rank=trainer.global_rank if trainer else 0,
            world_size=trainer.world_size if trainer else 1,
            epoch_fn=lambda: trainer.current_epoch if trainer else 0,
        )

    def train_dataloader(self) -> TensorLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> TensorLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> TensorLoader:
        return self._loader("test", train=False)
