"""RMSNorm's fused CPU kernel (_fused_rms.cpp): each row read from memory once and written once,
forward and backward (one reduction per row each way); an expanded upstream gradient (as
`.sum().backward()` gives) is read in place, not copied; fresh outputs of 4 MiB or more are
advised to Linux as transparent huge pages (one page fault per 2 MiB, not per 4 KiB).

The C++ source is compiled on first use into torch's extension cache
(TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions; needs a C++ compiler and ninja) and
reused afterwards. When it cannot be built, RMSNorm's fast path stays on pure torch ops
(normlab.norms.rmsnorm.RMSNormFunction) after one warning. NORMLAB_FUSED_RMS=0 switches it off.

The kernel is a torch op, `torch.ops.normlab.fused_rms_norm` (and `fused_rms_norm_backward`),
with a fake (shape-only) implementation and its gradient registered: torch.compile traces it
into its graph (no graph break) and torch.export keeps it as one node.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import warnings
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("_fused_rms.cpp")
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _cpu_tag() -> str | None:
    """A short hash of this CPU's feature flags (Linux), or None when they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return None
    return hashlib.sha1(flags.encode()).hexdigest()[:8]


def build_name(tag: str | None, source: Path = SOURCE, torch_file: str = torch.__file__) -> str:
    """The kernel's name in the extension cache. -march=native tunes a build to this CPU
    (AVX2/AVX-512 where present), so the name carries the CPU's feature flags (`tag`, None:
    unknown, a portable build) and another CPU type gets a build of its own. Then a hash of the
    source, of its path and of the torch it builds against: torch rebuilds a cached build whose
    build file differs, and that file names both paths, so two checkouts or venvs sharing one
    cache would rebuild over each other's (~30 s each time) without them."""
    key = source.read_bytes() + f"\0{source.resolve()}\0{Path(torch_file).resolve()}".encode()
    digest = hashlib.sha1(key).hexdigest()[:8]
    return f"normlab_fused_rms_{tag}_{digest}" if tag else f"normlab_fused_rms_{digest}"


@torch.compiler.assume_constant_result  # torch.compile reads the answer as a constant
def available() -> bool:
    """Build (or load from the cache) the kernel once per process; False if that fails."""
    return _build()


@functools.cache  # not on available(): torch.compile traces through a cached function
def _build() -> bool:
    if os.environ.get("NORMLAB_FUSED_RMS", "1") == "0":
        return False
    try:
        cpp_log = logging.getLogger("torch.utils.cpp_extension")
        level = cpp_log.level
        cpp_log.setLevel(logging.ERROR)  # its import warns about CUDA, which is not used here
        try:
            from torch.utils.cpp_extension import load  # lazy: only to build; it warns of CUDA
        finally:
            cpp_log.setLevel(level)

        tag = _cpu_tag()
        log.info("loading the fused RMSNorm kernel (compiled once into the torch extension cache)")
        load(
            name=build_name(tag),
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-fopenmp", *(["-march=native"] if tag else [])],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
        )
    except Exception as err:  # no compiler, no ninja, no source file: keep the torch path
        warnings.warn(
            f"normlab: the fused RMSNorm kernel could not be built ({type(err).__name__}: "
            f"{build_errors(str(err))}); RMSNorm uses its pure-torch fast path",
            stacklevel=3,  # the caller of available()
        )
        return False
    return True


SHOWN_ERRORS = 6  # compiler error lines a failed build's warning shows


def build_errors(text: str) -> str:
    """The cause of a failed build in torch's error text: the compiler's error lines (ninja's
    output repeats each command first), " | "-joined; the text's last lines when it has none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    commands = ("[", "FAILED:", "ninja: ", "Error building extension")
    errors = [
        line
        for line in lines
        if re.search(r"\berror\b", line, re.IGNORECASE) and not line.startswith(commands)
    ]
    shown = errors[:SHOWN_ERRORS] or lines[-3:]
    more = len(errors) - SHOWN_ERRORS
    return " | ".join(shown) + (f" | and {more} more error lines" if more > 0 else "")


# ---------------------------------------------------------------------------------------------
# The ops: the C++ kernels behind torch.library custom ops
# ---------------------------------------------------------------------------------------------


def _require_kernel() -> None:
    if not available():
        raise RuntimeError("normlab: the fused RMSNorm kernel is not built (see the warning)")


@torch.library.custom_op(
    "normlab::fused_rms_norm",
    mutates_args=(),
    device_types="cpu",
    schema="(Tensor x, Tensor? weight, float eps, SymInt k) -> (Tensor, Tensor)",
)
def fused_rms_norm_op(
    x: Tensor, weight: Tensor | None, eps: float, k: int
) -> tuple[Tensor, Tensor]:
    """(y, inv_rms) for contiguous rows x (R, D): y = x * inv_rms * w, inv_rms (R, 1) in the
    accumulation dtype (float32 for float16/bfloat16), the rms from the first k features."""
    _require_kernel()
    return torch.ops.normlab_rms.forward(x, weight, eps, k)


@fused_rms_norm_op.register_fake
def _(x: Tensor, weight: Tensor | None, eps: float, k: int) -> tuple[Tensor, Tensor]:
    torch._check(x.dim() == 2, lambda: "rms: x must be a (R, D) tensor")
    inv_rms = x.new_empty((x.shape[0], 1), dtype=torch.promote_types(x.dtype, torch.float32))
    return torch.empty_like(x), inv_rms


@torch.library.custom_op(
    "normlab::fused_rms_norm_backward",
    mutates_args=(),
    device_types="cpu",
    schema="(Tensor dy, Tensor x, Tensor? weight, Tensor inv_rms, SymInt k, bool need_dx, "
    "bool need_dw) -> (Tensor, Tensor)",
)
def fused_rms_norm_backward_op(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    inv_rms: Tensor,
    k: int,
    need_dx: bool,
    need_dw: bool,
) -> tuple[Tensor, Tensor]:
    """(dx, dw) of fused_rms_norm; one not asked for (or dw with no weight) is an empty tensor."""
    _require_kernel()
    return torch.ops.normlab_rms.backward(dy, x, weight, inv_rms, k, need_dx, need_dw)


@fused_rms_norm_backward_op.register_fake
def _(dy, x, weight, inv_rms, k, need_dx, need_dw):
    dx = torch.empty_like(x) if need_dx else x.new_empty(0)
    dw = torch.empty_like(weight) if need_dw and weight is not None else x.new_empty(0)
    return dx, dw


def _setup_context(ctx, inputs, output) -> None:
    x, weight, _, k = inputs
    inv_rms = output[1]
    ctx.mark_non_differentiable(inv_rms)  # a statistic handed out for backward, not a result
    ctx.save_for_backward(x, weight, inv_rms)
    ctx.k = k


def _backward(ctx, dy: Tensor, _: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
    x, weight, inv_rms = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    need_w = weight is not None and ctx.needs_input_grad[1]
    dx, dw = fused_rms_norm_backward_op(dy, x, weight, inv_rms, ctx.k, need_x, need_w)
    return (dx if need_x else None, dw if need_w else None, None, None)


# once differentiable: the backward op has no gradient of its own
fused_rms_norm_op.register_autograd(_backward, setup_context=_setup_context)


def fused_rms_norm(x: Tensor, weight: Tensor | None, eps: float, k: int) -> Tensor:
    """y = x / rms * w over rows of a (R, D) input, rms from the first k features (C++ kernel)."""
    return fused_rms_norm_op(x.contiguous(), weight, float(eps), k)[0]
