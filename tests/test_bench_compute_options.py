"""Compute options of a run: compile, bf16 precision, channels_last, num_threads, keep_heap."""

from __future__ import annotations

import ctypes
import math
import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch
from conftest import TINY

import normlab.run.training
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
    SEEN.clear()

    def _run(*overrides: str) -> dict:
        probe = "+callbacks.probe._target_=test_bench_compute_options.Probe"
        cfg = compose([*TINY, "batch=16", "test=false", probe, *overrides], tmp_path)
        result, _ = train(cfg)
        assert result["status"] == "ok"
        assert math.isfinite(result["metrics"]["val/loss"])
        return SEEN

    yield _run  # train() sets the process's thread count: conftest restores it


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


# In a fresh interpreter (this one's heap may have been kept by an earlier run): the free bytes
# left in glibc's heap after a 64 MiB block, above its largest default mmap threshold, is freed.
_FREE_AFTER_64MIB = """
import ctypes, sys
from normlab.compute import keep_heap
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
if sys.argv[1] == "keep":
    assert keep_heap()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
block = libc.malloc(64 * 2**20)
ctypes.memset(block, 1, 64 * 2**20)
libc.free(block)
print(libc.mallinfo2().fordblks)
"""


def test_keep_heap_keeps_freed_memory_in_the_process():
    try:
        ctypes.CDLL("libc.so.6").mallinfo2  # noqa: B018
    except (OSError, AttributeError):
        pytest.skip("needs glibc >= 2.33")

    def free_bytes(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _FREE_AFTER_64MIB, mode],
                              capture_output=True, text=True, check=True)  # fmt: skip
        return int(done.stdout)

    assert free_bytes("default") < 64 * 2**20  # glibc unmaps the block: the OS has it back
    assert free_bytes("keep") >= 64 * 2**20  # kept: the block stays in the heap for reuse


@pytest.mark.parametrize("overrides, kept", [((), True), (("keep_heap=false",), False)])
def test_a_run_keeps_its_heap_unless_told_not_to(compose, tmp_path, monkeypatch, overrides, kept):
    calls = []
    monkeypatch.setattr(normlab.run.training, "keep_heap", lambda: calls.append(1) or True)
    normlab.run.training.build_task(compose([*TINY, *overrides], tmp_path))
    assert calls == ([1] if kept else [])
