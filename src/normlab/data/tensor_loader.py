"""Batches drawn by index from tensors held in memory: no per-sample work, no worker processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch


class TensorLoader:
    """Iterate over (t1[idx], t2[idx], ...) batches; reshuffled per epoch, sharded per rank.

    The order of epoch e is a function of (seed, e) only, so a resumed run sees the same
    batches; `state_dict` records which epoch the loader is in and how far into it it got
    (Lightning saves it in checkpoints and restores it on resume). A resumed loader skips the
    batches done only in that same epoch: a checkpoint of an epoch's end (after its validation,
    say) leaves its position behind, and the next epoch starts at its first batch.
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
        self.epoch: int | None = None  # the epoch being iterated (None before the first)
        self.done = 0  # batches yielded in that epoch
        self._resume: tuple[int | None, int] = (None, 0)  # (epoch, done) of a loaded state

    def _shard_size(self) -> int:
        n = len(self.tensors[0])
        return n // self.world_size if self.world_size > 1 else n

    def __len__(self) -> int:
        n = self._shard_size()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _order(self, epoch: int) -> torch.Tensor:
        n = len(self.tensors[0])
        if not self.shuffle:
            order = torch.arange(n)
        else:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            order = torch.randperm(n, generator=gen)
        if self.world_size > 1:  # equal-sized shards: every rank takes the same number of steps
            order = order[: self._shard_size() * self.world_size][self.rank :: self.world_size]
        return order

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch = self.epoch_fn()  # read at the first batch, in the epoch that consumes it
        order = self._order(epoch)
        (resume_epoch, done), self._resume = self._resume, (None, 0)
        start = done if resume_epoch in (None, epoch) else 0  # None: a state without its epoch
        self.epoch, self.done = epoch, start
        for i in range(start, len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            self.done = i + 1  # counted when handed out (Lightning does not fetch ahead of a
            yield tuple(t[idx] for t in self.tensors)  # loader whose length it knows)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = (state.get("epoch"), int(state["done"]))
