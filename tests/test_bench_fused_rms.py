"""RMSNorm's fused C++ kernel: built here, equal to torch, gradchecked, and a clean fallback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from normlab.norms import _fused_rms, create_norm
from normlab.norms._fused_rms import fused_rms_norm

REPO = Path(__file__).resolve().parents[1]
CAN_BUILD = shutil.which("ninja") is not None and shutil.which("c++") is not None


def needs_kernel() -> None:
    if not CAN_BUILD:
        pytest.skip("no C++ compiler or ninja: the fused kernel cannot be built here")
    assert _fused_rms.available(), "a compiler and ninja are present but the kernel did not build"


@pytest.mark.parametrize("k", [7, 3, 1])
@pytest.mark.parametrize("with_weight", [True, False])
def test_fused_function_gradcheck(k, with_weight):
    needs_kernel()
    torch.manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True) if with_weight else None
    inputs = (x, w) if with_weight else (x,)
    f = lambda x, w=None: fused_rms_norm(x, w, 1e-5, k)  # noqa: E731
    assert torch.autograd.gradcheck(f, inputs)


def test_rmsnorm_fast_runs_the_kernel_and_equals_torch():
    needs_kernel()
    torch.manual_seed(0)
    norm = create_norm("rmsnorm", 300, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(4, 33, 300, requires_grad=True)  # rows not a multiple of the thread count
    x_ref = x.detach().clone().requires_grad_()
    w_ref = norm.weight.detach().clone().requires_grad_()
    y, y_ref = norm(x), F.rms_norm(x_ref, (300,), w_ref, 1e-6)
    assert "normlab_fused_rms_norm" in type(y.grad_fn.next_functions[0][0]).__name__
    torch.testing.assert_close(y, y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(norm.weight.grad, w_ref.grad, rtol=1e-4, atol=1e-4)


def test_bfloat16_input_accumulates_in_float():
    needs_kernel()
    torch.manual_seed(0)
    x = torch.randn(8, 512) * 30
    norm = create_norm("rmsnorm", 512, eps=1e-6)
    y = norm.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), F.rms_norm(x, (512,), eps=1e-6), rtol=1e-2, atol=1e-2)


def test_falls_back_to_pure_torch_when_the_kernel_is_unavailable(monkeypatch):
    monkeypatch.setattr(_fused_rms, "available", lambda: False)
    norm = create_norm("rmsnorm", 16)
    y = norm(torch.randn(3, 16, requires_grad=True))
    assert type(y.grad_fn.next_functions[0][0]).__name__ == "RMSNormFunctionBackward"


@pytest.mark.parametrize(
    "layout", ["expanded", "rows-expanded", "row-repeated", "row-stride", "transposed"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_non_contiguous_upstream_gradient_equals_torch(layout, dtype):
    # the kernel reads a dy whose rows are contiguous (any row stride, 0 included) or one value
    # repeated (column stride 0, as `.sum().backward()` gives) in place; others are copied
    needs_kernel()
    torch.manual_seed(0)
    rows, d, k = 37, 300, 41  # k < d: the partial-rms term too; d not a multiple of 16
    x = torch.randn(rows, d, dtype=torch.float64)
    w = torch.randn(d, dtype=torch.float64)
    grads = {
        "expanded": torch.tensor(1.5, dtype=torch.float64).expand(rows, d),
        "rows-expanded": torch.randn(rows, 1, dtype=torch.float64).expand(rows, d),
        "row-repeated": torch.randn(1, d, dtype=torch.float64).expand(rows, d),
        "row-stride": torch.randn(rows, 2 * d, dtype=torch.float64)[:, :d],
        "transposed": torch.randn(d, rows, dtype=torch.float64).t(),
    }
    gy = grads[layout]
    x_ours = x.to(dtype, copy=True).requires_grad_()
    w_ours = w.to(dtype, copy=True).requires_grad_()
    x_ref, w_ref = x.clone().requires_grad_(), w.clone().requires_grad_()
    fused_rms_norm(x_ours, w_ours, 1e-5, k).backward(gy.to(dtype))
    inv = (x_ref[:, :k].pow(2).mean(1, keepdim=True) + 1e-5).rsqrt()
    (x_ref * inv * w_ref).backward(gy.to(dtype).double())
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype != torch.bfloat16 else {"rtol": 0.05, "atol": 0.1}
    torch.testing.assert_close(x_ours.grad.double(), x_ref.grad, **tol)
    torch.testing.assert_close(w_ours.grad.double(), w_ref.grad, **{**tol, "atol": 1e-3 * rows})


def test_sum_backward_reads_the_expanded_gradient_in_place():
    # `.sum().backward()` on a (B, T, D) RMSNorm: the kernel gets a stride-0 dy and equals torch
    needs_kernel()
    torch.manual_seed(0)
    norm = create_norm("rmsnorm", 64, eps=1e-6)
    x = torch.randn(4, 8, 64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    norm(x).sum().backward()
    F.rms_norm(x_ref, (64,), norm.weight.detach(), 1e-6).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping holding `address` (Linux /proc/self/smaps)."""
    flags, inside = [], False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(a, 16) for a in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
    return flags


def test_large_outputs_are_advised_as_huge_pages_and_still_equal_torch():
    needs_kernel()
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.is_file() or "[never]" in mode.read_text():
        pytest.skip("no transparent huge pages on this machine")
    torch.manual_seed(0)
    x = torch.randn(2048, 1024, requires_grad=True)  # 8 MiB outputs: a 2 MiB-aligned interior
    norm = create_norm("rmsnorm", 1024, eps=1e-6)
    y = norm(x)
    middle = y.data_ptr() + y.nbytes // 2
    assert "hg" in _vm_flags(middle)  # MADV_HUGEPAGE on the output's mapping
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    assert "hg" in _vm_flags(dx.data_ptr() + dx.nbytes // 2)
    x_ref = x.detach().clone().requires_grad_()
    y_ref = F.rms_norm(x_ref, (1024,), norm.weight.detach(), 1e-6)
    (dx_ref,) = torch.autograd.grad(y_ref, x_ref, dy)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(dx, dx_ref)


def test_rms_vs_ln_script_writes_its_tables(tmp_path):
    needs_kernel()
    out = tmp_path / "rms_vs_ln.md"
    args = ["--threads", "1", "--pairs", "3", "--shape", "4", "8", "64", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "rms_vs_ln.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert text.startswith("`python scripts/rms_vs_ln.py --threads 1 --pairs 3")
    assert "| 1 | dense |" in text and "| 1 | RMSNorm bwd (fused) |" in text
    assert "load average at the end" in text and text.splitlines()[1] in done.stdout


def test_a_failed_build_warns_with_the_compilers_error_lines_not_its_command(monkeypatch):
    import torch.utils.cpp_extension as cpp

    command = "c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=normlab_fused_rms " + "-I/x " * 80
    text = (
        "Error building extension 'normlab_fused_rms_1234': [1/2] " + command + "\n"
        "FAILED: main.o\n" + command + "\n"
        "/src/_fused_rms.cpp:3:10: fatal error: omp.h: No such file or directory\n"
        "    3 | #include <omp.h>\n"
        "compilation terminated.\n"
        "ninja: build stopped: subcommand failed.\n"
    )

    def fail(**kwargs):
        raise RuntimeError(text)

    monkeypatch.setattr(cpp, "load", fail)
    monkeypatch.setenv("NORMLAB_FUSED_RMS", "1")
    _fused_rms._build.cache_clear()
    try:
        with pytest.warns(UserWarning) as caught:
            assert not _fused_rms.available()
    finally:
        _fused_rms._build.cache_clear()
    (message,) = [str(w.message) for w in caught if "fused RMSNorm" in str(w.message)]
    assert message == (
        "normlab: the fused RMSNorm kernel could not be built (RuntimeError: "
        "/src/_fused_rms.cpp:3:10: fatal error: omp.h: No such file or directory); RMSNorm "
        "uses its pure-torch fast path"
    )


def test_the_builds_name_tells_cpus_sources_checkouts_and_torches_apart(tmp_path):
    # torch rebuilds a cached build whose build file differs, and that file names the source's
    # path and torch's: two checkouts (or venvs) of the same source sharing one cache need two
    # names, or each load rebuilds over the other's
    here, there = tmp_path / "a" / "_fused_rms.cpp", tmp_path / "b" / "_fused_rms.cpp"
    for path in (here, there):
        path.parent.mkdir()
        path.write_text("int f() { return 1; }\n")
    torch_a, torch_b = "/venv-a/torch/__init__.py", "/venv-b/torch/__init__.py"
    name = _fused_rms.build_name("cpu1", here, torch_a)
    assert name == _fused_rms.build_name("cpu1", here, torch_a)  # the same build: found again
    assert name.startswith("normlab_fused_rms_cpu1_")
    others = [
        _fused_rms.build_name("cpu2", here, torch_a),  # another CPU type
        _fused_rms.build_name("cpu1", there, torch_a),  # another checkout
        _fused_rms.build_name("cpu1", here, torch_b),  # another venv
    ]
    here.write_text("int f() { return 2; }\n")
    others.append(_fused_rms.build_name("cpu1", here, torch_a))  # another source
    assert len({name, *others}) == 5
    assert _fused_rms.build_name(None, here, torch_a) == others[-1].replace("cpu1_", "")
