"""RMSNorm's fused kernel as a torch op: opcheck, the fast path's choice of kernel, and
torch.compile / torch.export with the op inside their graphs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_bench_fused_rms import needs_kernel
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from normlab.models.transformer import GPT
from normlab.norms import _fused_rms, create_norm, norm_partial, rmsnorm
from normlab.norms._fused_rms import fused_rms_norm
from normlab.norms.rmsnorm import fast_kernel

FORWARD = torch.ops.normlab.fused_rms_norm.default
BACKWARD = torch.ops.normlab.fused_rms_norm_backward.default


def _rows(dtype: torch.dtype, weight: bool, k: int, grad: bool = True):
    """(x, w) for a (6, 40) input whose rms comes from its first k features."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40, generator=gen).to(dtype).requires_grad_(grad)
    w = torch.randn(40, generator=gen).to(dtype).requires_grad_(grad) if weight else None
    return x, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(("weight", "k"), [(True, 40), (False, 40), (True, 5)])
def test_opcheck_forward(dtype, weight, k):
    # schema, fake tensor, autograd registration, and AOT dispatch with dynamic shapes
    needs_kernel()
    x, w = _rows(dtype, weight, k)
    torch.library.opcheck(FORWARD, (x, w, 1e-5, k))


@pytest.mark.parametrize(("need_dx", "need_dw"), [(True, True), (True, False), (False, True)])
def test_opcheck_backward(need_dx, need_dw):
    needs_kernel()
    x, w = _rows(torch.float32, True, 40, grad=False)
    _, inv_rms = FORWARD(x, w, 1e-5, 40)
    dy = torch.randn_like(x)
    dx, dw = BACKWARD(dy, x, w, inv_rms, 40, need_dx, need_dw)
    assert dx.shape == (x.shape if need_dx else (0,))
    assert dw.shape == (w.shape if need_dw else (0,))
    torch.library.opcheck(BACKWARD, (dy, x, w, inv_rms, 40, need_dx, need_dw))


def test_inv_rms_is_not_differentiable():
    needs_kernel()
    x, w = _rows(torch.float32, True, 40)
    y, inv_rms = FORWARD(x, w, 1e-5, 40)
    assert y.requires_grad and not inv_rms.requires_grad
    torch.testing.assert_close(inv_rms, x.detach().pow(2).mean(1, keepdim=True).add(1e-5).rsqrt())


def test_double_backward_fails_naming_the_op():
    # once differentiable, as the autograd.Function it replaced: no silent zero second gradient
    needs_kernel()
    x, w = _rows(torch.float64, True, 40)
    y = fused_rms_norm(x, w, 1e-5, 40)
    (dx,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="fused_rms_norm_backward.*no autograd formula"):
        dx.sum().backward()


def test_fast_kernel_choice(monkeypatch):
    # CUDA: torch's F.rms_norm (full rms only); CPU: the fused op where built and the weight
    # has the input's dtype; anything else: RMSNormFunction ("manual")
    f32, bf16 = torch.float32, torch.bfloat16
    monkeypatch.setattr(_fused_rms, "available", lambda: True)
    assert fast_kernel("cuda", f32, f32, full=True) == "torch"
    assert fast_kernel("cuda", bf16, f32, full=True) == "torch"
    assert fast_kernel("cuda", f32, f32, full=False) == "manual"  # pRMSNorm: no torch kernel
    assert fast_kernel("cpu", f32, f32, full=True) == "fused"
    assert fast_kernel("cpu", f32, None, full=False) == "fused"
    assert fast_kernel("cpu", bf16, f32, full=True) == "manual"  # a float32 weight, bf16 input
    assert fast_kernel("cpu", torch.int64, None, full=True) == "manual"
    assert fast_kernel("mps", f32, f32, full=True) == "manual"
    monkeypatch.setattr(_fused_rms, "available", lambda: False)
    assert fast_kernel("cpu", f32, f32, full=True) == "manual"
    assert fast_kernel("cuda", f32, f32, full=True) == "torch"


def test_torch_kernel_choice_calls_f_rms_norm(monkeypatch):
    # what the CUDA choice runs, taken on CPU: F.rms_norm with the norm's weight and eps
    calls, rms_norm = [], F.rms_norm

    def spy(x, shape, weight, eps):
        calls.append((tuple(x.shape), shape, eps))
        return rms_norm(x, shape, weight, eps)

    monkeypatch.setattr(rmsnorm, "fast_kernel", lambda *args: "torch")
    monkeypatch.setattr(rmsnorm.F, "rms_norm", spy)
    norm = create_norm("rmsnorm", 32, eps=1e-6)
    x = torch.randn(2, 3, 32)
    y = norm(x)
    assert calls == [((6, 32), (32,), 1e-6)]
    expected = create_norm("rmsnorm", 32, eps=1e-6, impl="reference")(x)
    torch.testing.assert_close(y, expected)


def _tiny_gpt() -> GPT:
    torch.manual_seed(0)
    placement = {"name": "pre", "arch": "decoder"}
    return GPT(65, placement, norm_partial("rmsnorm"), depth=2, d_model=32, n_heads=2, ctx=16)


def _ops(graphs: list[torch.fx.GraphModule], op) -> int:
    return sum(node.target is op for gm in graphs for node in gm.graph.nodes)


def _loss_and_grads(model: torch.nn.Module, idx: torch.Tensor):
    logits = model(idx)
    loss = logits.pow(2).mean()
    return logits, torch.autograd.grad(loss, list(model.parameters()))


def test_compile_gpt_keeps_the_fused_op_in_one_graph():
    # fullgraph: no graph break; AOT autograd traces the op's fake and its registered backward
    needs_kernel()
    model = _tiny_gpt()
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    graphs: dict[str, list[torch.fx.GraphModule]] = {"fw": [], "bw": []}

    def keep(kind: str):
        def compiler(gm: torch.fx.GraphModule, _example_inputs):
            graphs[kind].append(gm)
            return make_boxed_func(gm)

        return compiler

    backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"))
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    logits, grads = _loss_and_grads(compiled, idx)
    logits_ref, grads_ref = _loss_and_grads(model, idx)

    norms = 2 * model.depth + 1  # two per Pre-LN block and the final norm
    assert len(graphs["fw"]) == len(graphs["bw"]) == 1
    assert _ops(graphs["fw"], FORWARD) == norms
    assert _ops(graphs["bw"], BACKWARD) == norms
    torch.testing.assert_close(logits, logits_ref)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.slow
def test_compile_gpt_with_inductor_equals_eager():
    # the default backend (inductor) around the op: ~35 s of compilation on 2 CPU cores
    needs_kernel()
    model = _tiny_gpt()
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    explained = torch._dynamo.explain(model)(idx)
    assert explained.graph_break_count == 0
    assert _ops(explained.graphs, FORWARD) == 2 * model.depth + 1
    logits, grads = _loss_and_grads(torch.compile(model, fullgraph=True), idx)
    logits_ref, grads_ref = _loss_and_grads(model, idx)
    torch.testing.assert_close(logits, logits_ref)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("strict", [False, True])
def test_export_rmsnorm_holds_the_op(strict):
    needs_kernel()
    norm = create_norm("rmsnorm", 64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 64)
    batch = torch.export.Dim("batch")
    program = torch.export.export(norm, (x,), dynamic_shapes={"x": {0: batch}}, strict=strict)
    assert [n.target for n in program.graph.nodes].count(FORWARD) == 1
    x2 = torch.randn(7, 5, 64)
    torch.testing.assert_close(program.module()(x2), norm(x2))


def test_a_failed_build_warns_and_the_fast_path_stays_on_torch(monkeypatch, tmp_path):
    monkeypatch.setattr(_fused_rms, "SOURCE", tmp_path / "missing.cpp")
    with pytest.warns(UserWarning, match="could not be built.*pure-torch fast path"):
        assert _fused_rms._build.__wrapped__() is False  # the build itself, past its cache


def test_compile_without_the_kernel_runs_the_pure_torch_path(monkeypatch):
    monkeypatch.setattr(_fused_rms, "available", lambda: False)
    model = _tiny_gpt()
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    explained = torch._dynamo.explain(model)(idx)
    assert explained.graph_break_count == 0
    assert _ops(explained.graphs, FORWARD) == 0
    logits, grads = _loss_and_grads(torch.compile(model, backend="aot_eager", fullgraph=True), idx)
    logits_ref, grads_ref = _loss_and_grads(model, idx)
    torch.testing.assert_close(logits, logits_ref)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref)


def test_fast_path_binds_its_kernel_once_per_device_and_dtype(monkeypatch):
    # chosen at the first call, not on every call; moving or casting the module binds again
    chosen, choose = [], rmsnorm.fast_kernel

    def spy(*args):
        chosen.append(args)
        return choose(*args)

    monkeypatch.setattr(rmsnorm, "fast_kernel", spy)
    norm = create_norm("rmsnorm", 8)
    x = torch.randn(3, 8)
    norm(x), norm(x)
    assert len(chosen) == 1
    norm.double()
    y = norm(x.double())
    assert len(chosen) == 2 and chosen[-1][1:3] == (torch.float64, torch.float64)
    torch.testing.assert_close(y, create_norm("rmsnorm", 8, impl="reference").double()(x.double()))
