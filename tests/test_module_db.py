"""torch's own module tests as ours: every `module_db` sample of torch's nine norm layers.

torch.testing._internal.common_modules.module_db holds, for each torch.nn module, a function
generating constructor arguments and inputs (`module_inputs_func`; torch's test_modules.py runs
it per device, dtype, requires_grad and training). For nn.BatchNorm1d/2d/3d, nn.GroupNorm,
nn.InstanceNorm1d/2d/3d, nn.LayerNorm and nn.RMSNorm, each sample's constructor arguments are
translated to normlab's family and keywords (`_translate`) and the layer is built with
`create_norm`, once per impl of the family (`cls.impls`), in training and in eval mode, in
float32 and float64. Both layers start from the same random parameters and running statistics
(num_batches_tracked too: off their init, so that the momentum=None average and eval's use of
the running statistics are exercised), run the sample's input forward and a random cotangent
backward, and must agree on: state_dict keys (a torch checkpoint loads into normlab's layer),
output, input gradient, every parameter gradient, and every buffer after the step.

One documented difference is asserted rather than equalled: torch's InstanceNorm registers
num_batches_tracked but never counts it; normlab's counts training steps as BatchNorm's does (its
momentum=None is a cumulative average; see normlab.norms.instancenorm).

Tolerances, relative to the largest entry of torch's tensor (the backward's terms cancel, so an
error scales with the tensor, not with each entry; inputs are make_tensor's uniform [-9, 9]):
|ours - torch| <= rtol |torch| + atol max(1, max |torch|), rtol = atol = 1e-5 in float32 (worst
seen over 20 input seeds: 5.4e-6, the BN reference and GN manual paths) and 1e-10 in float64
(worst 4.6e-13: the formulas are the same, only rounding differs). One documented exception,
LOOSER below. Error-input samples (module_error_inputs_func) are not run: normlab's own argument
checks are in tests/test_norms_registry.py.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import warnings

import hypothesis
import pytest
import torch
from hypothesis.errors import InvalidArgument
from torch import nn

from normlab.norms import (
    BatchNorm,
    GroupNorm,
    InstanceNorm,
    LayerNorm,
    Norm,
    NormConfigError,
    RMSNorm,
    create_norm,
)

# torch layer -> (normlab family, spatial dims of torch's InstanceNormNd, else None)
FAMILIES: dict[type[nn.Module], tuple[type[Norm], int | None]] = {
    nn.BatchNorm1d: (BatchNorm, None),
    nn.BatchNorm2d: (BatchNorm, None),
    nn.BatchNorm3d: (BatchNorm, None),
    nn.GroupNorm: (GroupNorm, None),
    nn.InstanceNorm1d: (InstanceNorm, 1),
    nn.InstanceNorm2d: (InstanceNorm, 2),
    nn.InstanceNorm3d: (InstanceNorm, 3),
    nn.LayerNorm: (LayerNorm, None),
    nn.RMSNorm: (RMSNorm, None),
}
# torch's argument names that normlab spells differently
RENAMED = {"num_channels": "num_features"}
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
# (family, impl) -> float32 tolerance, with the reason. LayerNorm's manual path computes
# var = E[x^2] - E[x]^2 in one pass (normlab.norms.standardize: no full-size temporary, 3x
# faster than torch.var_mean or float64 sums on CPU); on the sample "1d_elementwise_affine_
# large_batch" (640 rows of 5 values) the rows whose values cluster away from 0 lose digits to
# the cancellation: up to 4.6e-5 of the largest input gradient over 20 seeds (1e-6 with float64
# sums). Its float64 check stays at 1e-10. (The reference path's two-pass variance does not.)
LOOSER = {("layernorm", "manual"): 1e-4}
BUFFERS = ("running_mean", "running_var", "num_batches_tracked")
ENV_BEFORE = dict(os.environ)  # at collection, before any test imported torch's test utils


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> None:
    """|actual - expected| <= tol |expected| + tol max(1, max |expected|), dtypes equal."""
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(
        actual, expected, rtol=tol, atol=tol * scale, msg=lambda m: f"{what}: {m}"
    )


@contextlib.contextmanager
def _process_state_restored():
    """Undo what importing torch's internal test utils does to the whole process.

    common_utils, on import: freezes torch.backends flags (Lightning's Trainer then fails to set
    cudnn.benchmark), registers and loads its own hypothesis profiles (replacing the one
    conftest.py loaded: HYPOTHESIS_PROFILE=ci would stop being derandomized), wraps TorchScript
    calls, adds warning filters and sets TORCHINDUCTOR_CACHE_DIR. Other tests share the process.
    """
    frozen = torch.backends.flags_frozen()
    current = hypothesis.settings.get_current_profile_name()
    profiles = {}
    for name in {current, "dev", "ci", "debug", "pytorch_ci"}:
        with contextlib.suppress(InvalidArgument):
            profiles[name] = hypothesis.settings.get_profile(name)
    script_calls = torch._C.ScriptFunction.__call__, torch._C.ScriptMethod.__call__
    environ = dict(os.environ)
    cpp_log = logging.getLogger("torch.utils.cpp_extension")  # warns that there is no CUDA
    level = cpp_log.level
    cpp_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            yield
    finally:
        cpp_log.setLevel(level)
        if not frozen:  # the flag disable_global_flags() cleared, in the module flags_frozen reads
            torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
        for name, profile in profiles.items():
            hypothesis.settings.register_profile(name, profile)
        hypothesis.settings.load_profile(current)
        torch._C.ScriptFunction.__call__, torch._C.ScriptMethod.__call__ = script_calls
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update(environ)


@functools.cache
def _module_infos() -> dict[type[nn.Module], object]:
    """The ModuleInfo of each torch layer in FAMILIES, imported once per process."""
    with _process_state_restored():
        from torch.testing._internal.common_modules import module_db
    return {info.module_cls: info for info in module_db if info.module_cls in FAMILIES}


def _translate(module_cls: type[nn.Module], args: tuple, kwargs: dict) -> tuple[str, int, dict]:
    """torch's constructor arguments -> (normlab family, num_features, normlab keywords)."""
    norm_cls, spatial_dims = FAMILIES[module_cls]
    bound = inspect.signature(module_cls).bind(*args, **kwargs)
    bound.apply_defaults()  # torch's defaults, passed explicitly (GroupNorm's num_groups has none)
    given = {RENAMED.get(k, k): v for k, v in bound.arguments.items()}
    assert given.pop("device") is None and given.pop("dtype") is None  # the test moves the layer
    if "normalized_shape" in given:  # LayerNorm, RMSNorm: an int or a list of trailing dims
        shape = given["normalized_shape"]
        given["normalized_shape"] = (shape,) if isinstance(shape, int) else tuple(shape)
        num_features = given["normalized_shape"][-1]
    else:
        num_features = given.pop("num_features")
    if spatial_dims is not None:
        given["spatial_dims"] = spatial_dims
    return norm_cls.family, num_features, given


def _randomize(module: nn.Module, gen: torch.Generator) -> None:
    """Parameters and running statistics off their init (num_batches_tracked 5: not 0)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
        if getattr(module, "running_mean", None) is not None:
            mean, var = module.running_mean, module.running_var
            mean.copy_(torch.randn(mean.shape, generator=gen, dtype=mean.dtype))
            var.copy_(torch.rand(var.shape, generator=gen, dtype=var.dtype) * 1.5 + 0.5)
            module.num_batches_tracked.fill_(5)


def _check_sample(module_cls, sample, impl: str, training: bool, dtype: torch.dtype) -> None:
    """Run one sample through torch's layer and normlab's; assert they agree."""
    args, kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
    family, num_features, keywords = _translate(module_cls, args, kwargs)
    tol = LOOSER.get((family, impl), TOL[dtype]) if dtype == torch.float32 else TOL[dtype]
    ref = module_cls(*args, **kwargs).to(dtype).train(training)
    ours = create_norm(family, num_features, impl=impl, **keywords).to(dtype).train(training)
    gen = torch.Generator().manual_seed(0)
    _randomize(ref, gen)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    ours.load_state_dict(ref.state_dict())  # strict: the same keys and shapes

    (x,) = sample.forward_input.args
    assert not sample.forward_input.kwargs
    x_ref = x.detach().clone().requires_grad_()
    x_ours = x.detach().clone().requires_grad_()
    y_ref, y_ours = ref(x_ref), ours(x_ours)
    _assert_close(y_ours, y_ref, tol, "output")

    cotangent = torch.randn(y_ref.shape, generator=gen, dtype=dtype)
    y_ref.backward(cotangent)
    y_ours.backward(cotangent)
    _assert_close(x_ours.grad, x_ref.grad, tol, "input grad")
    for (name, p_ours), p_ref in zip(ours.named_parameters(), ref.parameters(), strict=True):
        assert (p_ours.grad is None) == (p_ref.grad is None), name
        if p_ref.grad is not None:
            _assert_close(p_ours.grad, p_ref.grad, tol, f"{name} grad")

    state_ref = ref.state_dict()
    for name in BUFFERS:
        if name not in state_ref:
            continue
        expected = state_ref[name]
        if name == "num_batches_tracked" and family == "instancenorm" and training:
            expected = expected + 1  # torch's InstanceNorm never counts; normlab's does
        _assert_close(ours.state_dict()[name], expected, tol, name)
    # and normlab's state loads into torch's layer
    module_cls(*args, **kwargs).to(dtype).load_state_dict(ours.state_dict())


PARAMS = [
    pytest.param(module_cls, impl, training, id=f"{module_cls.__name__}-{impl}-{mode}")
    for module_cls, (norm_cls, _) in FAMILIES.items()
    for impl in norm_cls.impls
    for training, mode in [(True, "train"), (False, "eval")]
]


@pytest.fixture
def one_thread():
    """The samples are tiny: on one thread, as a second (busy) core only makes kernels wait."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("module_cls", "impl", "training"), PARAMS)
def test_module_db_samples(module_cls, impl, training, subtests):
    info = _module_infos()[module_cls]
    for dtype_id, dtype in DTYPES.items():
        torch.manual_seed(0)  # the samples' inputs are drawn from the global generator
        samples = info.module_inputs_func(
            info, device="cpu", dtype=dtype, requires_grad=True, training=training
        )
        assert samples, "module_db gave no samples"
        for i, sample in enumerate(samples):
            with subtests.test(sample=sample.desc or f"#{i}", dtype=dtype_id):
                _check_sample(module_cls, sample, impl, training, dtype)


def test_torch_test_utils_leave_the_process_as_it_was():
    # what conftest.py loaded, and what Lightning's Trainer sets (cudnn.benchmark), still hold
    # after torch's common_utils was imported (by this call or an earlier test in this process)
    _module_infos()
    profile = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    assert hypothesis.settings.get_current_profile_name() == profile
    assert hypothesis.settings.default.derandomize == (profile == "ci")
    assert hypothesis.settings.default.print_blob
    assert not torch.backends.flags_frozen()
    torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark  # raises when frozen
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ or "TORCHINDUCTOR_CACHE_DIR" in ENV_BEFORE


# ---------------------------------------------------------------- what the samples do not reach


@pytest.mark.parametrize("impl", BatchNorm.impls)
def test_bias_false_and_empty_batch_with_ghost_batches(impl):
    torch.manual_seed(0)
    ours = create_norm("batchnorm", 3, impl=impl, ghost_batch=2, bias=False)
    assert ours.bias is None and [n for n, _ in ours.named_parameters()] == ["weight"]
    ref = nn.BatchNorm2d(3, bias=False)
    with torch.no_grad():
        ours.weight.normal_()
        ref.weight.copy_(ours.weight)
    x = torch.randn(4, 3, 2, 2)
    expected = torch.cat([ref(x[:2]), ref(x[2:])])  # each slice by its own statistics
    torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)

    mean, var = ours.running_mean.clone(), ours.running_var.clone()
    y = ours(torch.randn(0, 3, 2, 2, requires_grad=True))  # as torch's BN: a step, no update
    assert y.shape == (0, 3, 2, 2) and int(ours.num_batches_tracked) == 2
    assert torch.equal(ours.running_mean, mean) and torch.equal(ours.running_var, var)


@pytest.mark.parametrize("impl", InstanceNorm.impls)
def test_instancenorm_spatial_dims(impl):
    norm = create_norm("instancenorm", 3, impl=impl, spatial_dims=1)
    x = torch.randn(3, 5)
    torch.testing.assert_close(norm(x), nn.InstanceNorm1d(3)(x))  # unbatched (C, L)
    channels_last = create_norm("instancenorm", 3, channel_dim=-1, impl=impl, spatial_dims=1)
    torch.testing.assert_close(channels_last(x.t()), norm(x).t())  # unbatched (L, C)
    with pytest.raises(
        NormConfigError,
        match=r"^instancenorm with spatial_dims=1 needs an input \(N, C, \*spatial\) or "
        r"\(C, \*spatial\) with 1 spatial dims, got input of shape \(2, 3, 4, 4\)$",
    ):
        norm(torch.randn(2, 3, 4, 4))
    with pytest.raises(NormConfigError, match="spatial_dims must be a positive integer, got 0"):
        create_norm("instancenorm", 3, spatial_dims=0)
    assert "spatial_dims=1" in repr(norm)
