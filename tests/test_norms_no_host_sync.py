"""No normlab norm reads a tensor's value on the host in its forward or backward: on a GPU each
such read (`Tensor.item`, `float(t)`, `int(t)`, `if t:`) stalls the CPU until the device catches
up, once per layer per step. Checked on the CPU by making those reads raise."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from normlab.norms import available_norms, create_norm, norm_class

# the Python-level ways a tensor's value reaches the host
READS = ("item", "tolist", "__float__", "__int__", "__index__", "__bool__")


class HostSync(AssertionError):
    """A tensor's value was read on the host where it must not be."""


@contextlib.contextmanager
def host_reads_raise(reads: tuple[str, ...] = READS) -> Iterator[None]:
    """Within: `Tensor.<read>` for each of `reads` raises HostSync naming it."""

    def banned(name):
        def read(self, *args, **kwargs):
            raise HostSync(f"Tensor.{name} called: a host sync")

        return read

    saved = {name: getattr(torch.Tensor, name) for name in reads}
    try:
        for name in reads:
            setattr(torch.Tensor, name, banned(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def test_the_ban_catches_every_read():
    t = torch.tensor([1.5])
    reads = (
        lambda: t.item(),
        lambda: t.tolist(),
        lambda: float(t),
        lambda: int(t),
        lambda: bool(t),
    )
    for read in reads:
        with host_reads_raise(), pytest.raises(HostSync):
            read()
    assert t.item() == 1.5  # restored after


def _input(name: str, width: int) -> torch.Tensor:
    """A batch in the family's own layout: (N, C, L) for (N, C, *) families, (N, T, D) else."""
    features_first = getattr(norm_class(name), "natural_channel_dim", -1) == 1
    shape = (4, width, 5) if features_first else (4, 5, width)
    return torch.randn(shape, requires_grad=True)


CASES = [
    (name, impl, mode)
    for name in available_norms()
    for impl in getattr(norm_class(name), "impls", ("fast",))
    for mode in ("train", "eval")
]


@pytest.mark.parametrize(("name", "impl", "mode"), CASES)
def test_no_norm_reads_a_tensor_on_the_host_in_forward_or_backward(name, impl, mode):
    norm = create_norm(name, 32, impl=impl)
    norm.train(mode == "train")
    x = _input(name, 32)
    for _ in range(2):  # a second step: running statistics and counters already set
        with host_reads_raise():
            y = norm(x)
            y.backward(torch.ones_like(y))
    assert x.grad is not None and torch.isfinite(x.grad).all()
