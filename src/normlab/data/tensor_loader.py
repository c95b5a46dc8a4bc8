"""Batches drawn by index from tensors held in memory: no per-sample work, no worker processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch


class TensorLoader:
    """Iterate over (t1[idx], t2[idx], ...) batches; reshuffled per epoch, sharded per rank.

    The order of epoch e is a function of (seed, e) only, so a resumed run sees the same
    batches; `state_dict` records how far into the epoch the loader got (Lightning saves it
    in checkpoints and restores it on resume).
    """

    def __init__(
        self,
        tensors: tuple[torch.Tensor, ...],
        batch_size: int,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        epoch_fn: Callable[[], int] = lambda: 0,
    ):
        self.tensors = tensors
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch_fn = epoch_fn
        self.done = 0  # batches yielded in the current epoch
        self._resume_at = 0

    def _shard_size(self) -> int:
        n = len(self.tensors[0])
        return n // self.world_size if self.world_size > 1 else n

    def __len__(self) -> int:
        n = self._shard_size()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self) -> torch.Tensor:
        n = len(self.tensors[0])
        if not self.shuffle:
            order = torch.arange(n)
        else:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch_fn())
            order = torch.randperm(n, generator=gen)
        if self.world_size > 1:  # equal-sized shards: every rank takes the same number of steps
            order = order[: self._shard_size() * self.world_size][self.rank :: self.world_size]
        return order

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        order = self._order()
        start, self._resume_at = self._resume_at, 0
        for i in range(start, len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            self.done = i + 1  # counted when handed out (Lightning does not fetch ahead of a
            yield tuple(t[idx] for t in self.tensors)  # loader whose length it knows)

    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_at = int(state["done"])
