"""Compute options of a run: compile, bf16 precision, channels_last, num_threads, keep_heap."""

from __future__ import annotations

import ctypes
import math

import lightning.pytorch as pl
import pytest
import torch
from conftest import TINY

from normlab.run import train

SEEN: dict[str, object] = {}


class Probe(pl.Callback):
    """Records what the training steps actually ran with."""

    def on_train_start(self, trainer, pl_module):
        net = pl_module.net
        SEEN["net_type"] = type(net).__name__
        SEEN["threads"] = torch.get_num_threads()
        conv = pl_module.get_submodule("net.features.conv2")
        SEEN["channels_last"] = conv.weight.is_contiguous(memory_format=torch.channels_last)
        fc = pl_module.get_submodule("net.classifier.fc1")
        fc.register_forward_hook(self.record_dtype)

    @staticmethod
    def record_dtype(_module, _args, out) -> None:
        SEEN.setdefault("fc_dtype", out.dtype)


@pytest.fixture
def run(compose, tmp_path):
    threads = torch.get_num_threads()
    SEEN.clear()

    def _run(*overrides: str) -> dict:
        probe = "+callbacks.probe._target_=test_bench_compute_options.Probe"
        cfg = compose([*TINY, "batch=16", "test=false", probe, *overrides], tmp_path)
        result = train(cfg)
        assert result["status"] == "ok"
        assert math.isfinite(result["metrics"]["val/loss"])
        return SEEN

    yield _run
    torch.set_num_threads(threads)  # train() sets the process's thread count


def test_defaults_run_eager_fp32_contiguous(run):
    seen = run()
    assert seen["net_type"] == "LeNet" and seen["fc_dtype"] == torch.float32
    assert not seen["channels_last"]


def test_num_threads(run):
    assert run("num_threads=1")["threads"] == 1


def test_channels_last(run):
    assert run("channels_last=true")["channels_last"]


def test_bf16_mixed_precision(run):
    assert run("trainer.precision=bf16-mixed")["fc_dtype"] == torch.bfloat16


@pytest.mark.slow  # inductor compiles forward and backward: a minute or more on 2 cores
def test_compile(run):
    seen = run("compile=true", "norm=rmsnorm")
    assert seen["net_type"] == "OptimizedModule"


class _MallInfo2(ctypes.Structure):
    _fields_ = [  # glibc <malloc.h>: struct mallinfo2
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def _free_heap_bytes_after_a_64mib_tensor() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    t = torch.ones(64 * 2**20 // 4)  # 64 MiB: above glibc's largest default mmap threshold
    del t
    return libc.mallinfo2().fordblks


def test_keep_heap_keeps_freed_memory_in_the_process(run):
    try:
        ctypes.CDLL("libc.so.6").mallinfo2  # noqa: B018
    except (OSError, AttributeError):
        pytest.skip("needs glibc >= 2.33")
    run("keep_heap=true")
    # the run set it for the process: a freed 64 MiB block now stays in the heap, not unmapped
    assert _free_heap_bytes_after_a_64mib_tensor() >= 64 * 2**20
