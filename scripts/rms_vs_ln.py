"""RMSNorm's fast path against LayerNorm's, forward + backward, timed in interleaved pairs.

    python scripts/rms_vs_ln.py [--threads 1 2] [--pairs 31] [--shape 64 256 512] [--keep-heap]
                                [--out outputs/bench/rms_vs_ln.md]

For each thread count: normlab's fast RMSNorm (the fused kernel) and torch's LayerNorm (what
normlab's fast LayerNorm calls) run forward + backward in turn, in a random order per pair, the
ratio taken per pair and then the median (with the 25th-75th percentiles), for two upstream
gradients: a dense random tensor and `.sum().backward()`'s (an expanded scalar, stride 0).
Memory traffic: bytes each call must move (forward: read x, write y; backward: read dy and x,
write dx; a dense dy only) over its median time, against `dst.copy_(src)` of the same size into
a preallocated tensor (read + write, no page faults) and `src.clone()` (a fresh tensor, as a
layer's output is). Prints one markdown table per measure.

Both layers allocate two full-size tensors per call (y, dx), and in a default glibc process each
starts on fresh pages (see bench.py --keep-heap), whose page faults often cost more than the
arithmetic. The fused kernel advises its outputs as transparent huge pages (a fault per 2 MiB);
torch's LayerNorm takes 4 KiB pages unless THP_MEM_ALLOC_ENABLE=1 gives torch's allocator huge
pages too. --keep-heap keeps freed memory in the process (no page faults at all), and
THP_MEM_ALLOC_ENABLE=1 makes the faults cheap for both: each shows the kernels' own difference.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from normlab.compute import keep_heap
from normlab.norms import _fused_rms, create_norm
from normlab.tables import markdown_table


def _time(fn, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def measure(shape: tuple[int, ...], pairs: int, threads: int) -> list[dict]:
    torch.set_num_threads(threads)
    d = shape[-1]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).requires_grad_()
    dense = torch.randn(shape, generator=gen)
    rms = create_norm("rmsnorm", d)  # impl="fast": the fused kernel
    ln = create_norm("layernorm", d)  # impl="fast": torch's layer_norm kernel
    rows = []
    for grad_name in ("dense", "sum"):

        def step(module, grad_name=grad_name):
            inputs = [x, *module.parameters()]
            y = module(x)
            if grad_name == "dense":
                return torch.autograd.grad(y, inputs, dense)
            return torch.autograd.grad(y.sum(), inputs)

        fns = {"rmsnorm": lambda: step(rms), "layernorm": lambda: step(ln)}
        for fn in fns.values():  # warm up: kernels built, pages touched
            for _ in range(3):
                fn()
        order = random.Random(0)
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(pairs):
            for name in order.sample(list(fns), 2):
                times[name].append(_time(fns[name], 1))
        ratios = [a / b for a, b in zip(times["rmsnorm"], times["layernorm"], strict=True)]
        lo, med, hi = _quartiles(ratios)
        rows.append({
            "threads": threads,
            "grad": grad_name,
            "rms_ms": 1e3 * statistics.median(times["rmsnorm"]),
            "ln_ms": 1e3 * statistics.median(times["layernorm"]),
            "ratio": med,
            "q25": lo,
            "q75": hi,
        })  # fmt: skip
    return rows


def traffic(shape: tuple[int, ...], reps: int, threads: int) -> list[dict]:
    """Effective bandwidth of each call vs copy_ (preallocated) and clone (fresh output)."""
    torch.set_num_threads(threads)
    d = shape[-1]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    dy = torch.randn(shape, generator=gen)
    w = torch.ones(d)
    nbytes = x.numel() * x.element_size()
    dst = torch.empty_like(x)
    fused = _fused_rms.available()
    rows2d, dy2d = x.view(-1, d), dy.view(-1, d)
    y, inv = torch.ops.normlab_rms.forward(rows2d, w, 1e-6, d) if fused else (None, None)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [d], w, torch.zeros(d), 1e-5)
    calls = {
        "copy_ (preallocated)": (lambda: dst.copy_(x), 2),
        "clone (fresh output)": (lambda: x.clone(), 2),
        "LayerNorm fwd (torch)": (
            lambda: torch.ops.aten.native_layer_norm(x, [d], w, torch.zeros(d), 1e-5), 2),
        "LayerNorm bwd (torch)": (
            lambda: torch.ops.aten.native_layer_norm_backward(
                dy, x, [d], mean, rstd, w, None, [True, True, False]), 3),
    }  # fmt: skip
    if fused:
        calls["RMSNorm fwd (fused)"] = (
            lambda: torch.ops.normlab_rms.forward(rows2d, w, 1e-6, d), 2)  # fmt: skip
        calls["RMSNorm bwd (fused)"] = (
            lambda: torch.ops.normlab_rms.backward(dy2d, rows2d, w, inv, d, True, True),
            3,
        )
    for fn, _ in calls.values():
        fn()
    order = random.Random(1)
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(reps):
        for name in order.sample(list(calls), len(calls)):
            times[name].append(_time(calls[name][0], 1))
    copy_gbs = 2 * nbytes / statistics.median(times["copy_ (preallocated)"]) / 1e9
    out = []
    for name, (_, tensors) in calls.items():
        t = statistics.median(times[name])
        gbs = tensors * nbytes / t / 1e9
        out.append({"threads": threads, "call": name, "ms": 1e3 * t, "MB_moved": tensors *
                    nbytes / 1e6, "GB_s": gbs, "vs_copy_": gbs / copy_gbs})  # fmt: skip
    return out


def _table(rows: list[dict]) -> str:
    """rows as a markdown table, floats to 3 decimals (normlab.tables.markdown_table)."""
    cols = list(rows[0])
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else v  # noqa: E731
    return markdown_table(cols, ([fmt(r[c]) for c in cols] for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--pairs", type=int, default=31)
    parser.add_argument("--shape", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--keep-heap", action="store_true", help="glibc: reuse freed memory")
    parser.add_argument("--out", type=Path, help="also write what it prints to this .md file")
    args = parser.parse_args()
    if args.keep_heap:
        keep_heap()
    shape = tuple(args.shape)
    lines: list[str] = []

    def say(*new: str) -> None:  # print, and keep for --out
        lines.extend(new)
        print("\n".join(new), flush=True)

    say(
        f"`python scripts/rms_vs_ln.py {' '.join(sys.argv[1:])}`",
        f"fused kernel: {_fused_rms.available()}, torch {torch.__version__}, shape {shape}, "
        f"load average {os.getloadavg()[0]:.2f}, heap {'kept' if args.keep_heap else 'default'}, "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')}",
    )
    for title, measure_fn in (
        ("RMSNorm fast / LayerNorm fast, forward + backward, per-pair ratio", measure),
        ("Memory traffic: bytes a call must move / median time, vs copy_", traffic),
    ):
        rows = [r for t in args.threads for r in measure_fn(shape, args.pairs, t)]
        say("", f"{title}:", "", _table(rows))
    say("", f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
