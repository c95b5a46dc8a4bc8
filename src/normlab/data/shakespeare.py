"""Tiny Shakespeare, character level: the whole text as one tensor, windows drawn by index."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import lightning.pytorch as pl
import torch

from normlab.data.integrity import clause
from normlab.errors import ConfigError, DataError

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def download(url: str, path: Path, timeout: float = 30.0) -> None:
    """Fetch url to path via a temp file + rename, after checking its sha256: a broken or wrong
    download never sits at path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=timeout) as r:
        payload = r.read()
    digest = hashlib.sha256(payload).hexdigest()
    if digest != SHA256:
        raise DataError(f"download from {url} has sha256 {digest}, expected {SHA256}")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


class WindowBatches:
    """An epoch of `num_batches` batches (x, y) of random windows, y = x shifted by one.

    The windows of an epoch are a function of its seed only. `state_dict` records the seed of
    the epoch being iterated and how many batches it handed out (Lightning saves it in
    checkpoints and restores it on resume): a loader resumed in that epoch draws the windows
    of the batches done and drops them, so it goes on with the same windows as an uninterrupted
    run. A checkpoint of an epoch's end leaves its position behind (another seed: the next
    epoch starts at its first batch)."""

    def __init__(
        self,
        data: torch.Tensor,
        ctx: int,
        batch_size: int,
        num_batches: int,
        seed: Callable[[], int],
    ) -> None:
        self.data, self.ctx, self.batch_size = data, ctx, batch_size
        self.num_batches, self.seed = num_batches, seed
        self.epoch_seed: int | None = None  # the seed of the epoch being iterated
        self.done = 0  # batches handed out in that epoch
        self._resume: tuple[int | None, int] = (None, 0)  # (epoch_seed, done) of a loaded state

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        seed = self.seed()  # read at the first batch, in the epoch that consumes it
        g = torch.Generator().manual_seed(seed)
        (resume_seed, done), self._resume = self._resume, (None, 0)
        skip = done if resume_seed == seed else 0
        self.epoch_seed, self.done = seed, skip
        offsets = torch.arange(self.ctx + 1)  # (T + 1,)
        for i in range(self.num_batches):
            start = torch.randint(0, len(self.data) - self.ctx, (self.batch_size,), generator=g)
            if i < skip:  # done before the checkpoint: drawn only to advance the generator
                continue
            windows = self.data[start[:, None] + offsets]  # (B, T + 1)
            self.done = i + 1  # counted when handed out (Lightning knows the length: no prefetch)
            yield windows[:, :-1], windows[:, 1:]  # (B, T), (B, T)

    def state_dict(self) -> dict[str, int | None]:
        return {"epoch_seed": self.epoch_seed, "done": self.done}

    def load_state_dict(self, state: dict[str, int | None]) -> None:
        self._resume = (state.get("epoch_seed"), int(state.get("done") or 0))


class FixedBatches:
    """The same batches every epoch (one loader: a plain list would read as several)."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(self.batches)


class ShakespeareDataModule(pl.LightningDataModule):
    """Char-level tiny Shakespeare: 90/10 split, random training windows, fixed val windows.

    `ctx` is the window length; conf/data/shakespeare.yaml sets it to the model's context
    length (${model.net.ctx}).
    """

    def __init__(
        self,
        root: str,
        batch_size: int,
        vocab_size: int = 65,
        ctx: int = 64,
        train_batches_per_epoch: int = 100,
        val_batches: int = 8,
        val_fraction: float = 0.1,
        seed: int = 0,
        download: bool = True,
        url: str = URL,
    ) -> None:
        super().__init__()
        self.path = Path(root) / "tinyshakespeare" / "input.txt"
        self.batch_size, self.vocab_size, self.ctx = batch_size, vocab_size, ctx
        self.train_batches_per_epoch, self.val_batches = train_batches_per_epoch, val_batches
        self.val_fraction, self.seed, self.download = val_fraction, seed, download
        self.url = url
        self.chars: list[str] = []
        for key in ("ctx", "train_batches_per_epoch", "val_batches"):  # 0: no batches / windows
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise DataError(f"data.{key} must be a positive integer, got {value!r}")
        if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
            raise DataError(
                f"data.val_fraction must be in (0, 1) (both splits need text), got {val_fraction!r}"
            )

    # ----------------------------------------------------------------------------------------
    # Files
    # ----------------------------------------------------------------------------------------

    def prepare_data(self) -> None:
        if self.path.exists() or not self.download:
            return
        try:
            download(self.url, self.path)
        except (OSError, DataError) as err:
            raise DataError(
                f"tiny Shakespeare missing: no {self.path} (download failed: {clause(err)})\n"
                f"put input.txt there, from {self.url}\n"
                "or point NORMLAB_DATA (or data.root) at a folder holding tinyshakespeare/"
            ) from None

    def _read(self) -> str:
        if not self.path.exists():
            raise DataError(
                f"tiny Shakespeare missing: no {self.path}\nput input.txt there, from {self.url}"
                "\nor point NORMLAB_DATA (or data.root) at a folder holding tinyshakespeare/"
            )
        # Hashed on every read (about 1 ms), from the very bytes that are then decoded.
        payload = self.path.read_bytes()
        digest = hashlib.sha256(payload).hexdigest()
        if digest != SHA256:
            raise DataError(
                f"{self.path} is corrupted or not tiny Shakespeare (sha256 {digest}, expected "
                f"{SHA256}). Delete it and rerun online to download it again, or copy a good "
                f"input.txt from {self.url} there."
            )
        return payload.decode("utf-8")

    # ----------------------------------------------------------------------------------------
    # Tensors
    # ----------------------------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        if self.chars:
            return
        text = self._read()
        self.chars = sorted(set(text))
        if len(self.chars) != self.vocab_size:
            raise ConfigError(
                f"data.vocab_size={self.vocab_size} but {self.path} has {len(self.chars)} "
                f"distinct characters: set data.vocab_size={len(self.chars)}"
            )
        stoi = {c: i for i, c in enumerate(self.chars)}
        data = torch.tensor([stoi[c] for c in text], dtype=torch.long)  # (N,)
        n_train = int(len(data) * (1 - self.val_fraction))
        self.train_data, self.val_data = data[:n_train], data[n_train:]
        if len(self.train_data) <= self.ctx:
            raise DataError(
                f"the training split has {len(self.train_data)} characters (data.val_fraction="
                f"{self.val_fraction}), fewer than a window of {self.ctx + 1}: no training batch"
            )
        need = self.batch_size * (self.ctx + 1) * self.val_batches
        if need > len(self.val_data):
            raise ConfigError(
                f"data.val_batches={self.val_batches} x batch={self.batch_size} windows of "
                f"{self.ctx + 1} characters need {need} characters; the validation split has "
                f"{len(self.val_data)}"
            )

    def encode(self, text: str) -> torch.Tensor:
        """Character ids of text (characters outside the vocabulary raise KeyError)."""
        stoi = {c: i for i, c in enumerate(self.chars)}
        return torch.tensor([stoi[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())

    # ----------------------------------------------------------------------------------------
    # Loaders (use_distributed_sampler=false: each rank draws its own share)
    # ----------------------------------------------------------------------------------------

    def _rank(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def train_dataloader(self) -> WindowBatches:
        # A fresh, reproducible draw per (seed, epoch, rank), read when each epoch starts: ranks
        # see different windows and a resumed run sees the same windows for the same epoch.
        rank, _ = self._rank()

        def seed() -> int:
            epoch = self.trainer.current_epoch if self.trainer else 0
            return (self.seed * 1_000_003 + epoch) * 1009 + rank

        return WindowBatches(
            self.train_data, self.ctx, self.batch_size, self.train_batches_per_epoch, seed
        )

    def val_dataloader(self) -> FixedBatches:
        # Fixed, non-overlapping windows evenly spread over the validation text; rank r takes
        # batches r, r + world, ...
        rank, world = self._rank()
        n = self.batch_size * self.val_batches
        stride = (len(self.val_data) - self.ctx - 1) // max(n - 1, 1)
        start = torch.arange(n) * stride  # (n,)
        windows = self.val_data[start[:, None] + torch.arange(self.ctx + 1)]  # (n, T + 1)
        batches = windows.view(self.val_batches, self.batch_size, self.ctx + 1)
        return FixedBatches([(b[:, :-1], b[:, 1:]) for b in batches[rank::world]])
