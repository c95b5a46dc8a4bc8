"""normlab's norms as other libraries' `norm_layer`: torch.nn's factory keywords (device, dtype)
and timm's own models (ResNet, ViT, Mlp) built with them, equal to the same models with torch's
norms after loading their weights. No download: random weights, small inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normlab.norms import (
    BatchNorm,
    LayerNorm,
    LayerNorm2d,
    RMSNorm,
    available_norms,
    create_norm,
)

timm = pytest.importorskip("timm")

# families with a torch.nn twin: normlab class, torch class, constructor keywords of both
TWINS = {
    "batchnorm": (BatchNorm, nn.BatchNorm2d, {}),
    "layernorm": (LayerNorm, nn.LayerNorm, {}),
    "rmsnorm": (RMSNorm, nn.RMSNorm, {}),
}


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.state_dict(keep_vars=True))


@pytest.mark.parametrize("name", available_norms())
def test_every_norm_creates_its_tensors_with_the_factory_keywords(name):
    """device='meta' puts every parameter and buffer there; dtype=float64 makes the floating
    ones float64 and leaves integer counters (num_batches_tracked) long, as torch.nn does."""
    default = _tensors(create_norm(name, 32))
    on_meta = _tensors(create_norm(name, 32, device="meta"))
    in_double = _tensors(create_norm(name, 32, dtype=torch.float64))
    assert on_meta.keys() == default.keys() == in_double.keys()
    for key, t in default.items():
        assert on_meta[key].device.type == "meta", key
        want = torch.float64 if t.is_floating_point() else t.dtype
        assert in_double[key].dtype == want, key


@pytest.mark.parametrize("name", sorted(TWINS))
def test_factory_keywords_give_torch_s_state_dict(name):
    ours, theirs, kw = TWINS[name]
    factory = {"device": "cpu", "dtype": torch.float64}
    a, b = ours(16, **kw, **factory).state_dict(), theirs(16, **kw, **factory).state_dict()
    assert list(a) == list(b)
    assert [(t.dtype, t.shape) for t in a.values()] == [(t.dtype, t.shape) for t in b.values()]


def test_a_norm_built_in_double_runs_forward_and_backward_in_double():
    norm = create_norm("layernorm", 8, dtype=torch.float64)
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    norm(x).sum().backward()
    assert x.grad.dtype == norm.weight.grad.dtype == torch.float64


@pytest.mark.parametrize("alias", ["batchnorm2d", "batchnorm1d", "BatchNorm2d"])
def test_timm_s_batchnorm_names_are_aliases(alias):
    assert isinstance(create_norm(alias, 8), BatchNorm)


# ------------------------------------------------------------------------------ timm's models


def _perturb(model: nn.Module) -> None:
    """Make every norm's affine and every bias not the identity (so loading them matters), and
    give BN running statistics that are not (0, 1)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for key, t in model.state_dict().items():
            if t.dim() == 1 and t.is_floating_point():
                low = 0.5 if key.endswith(("running_var", "weight")) else -0.5
                t.copy_(torch.rand(t.shape, generator=g) + low)


def _twin(build, ours, theirs) -> tuple[nn.Module, nn.Module]:
    """(model with torch's/timm's norm, perturbed; the same with normlab's, its weights loaded)."""
    torch.manual_seed(0)
    ref = build(theirs)
    _perturb(ref)
    model = build(ours)
    model.load_state_dict(ref.state_dict())  # strict: the same keys
    return ref, model


def _assert_same(ref: nn.Module, model: nn.Module, x: torch.Tensor, what: str) -> float:
    """Equal outputs (fp32 tolerance) of both models on x; the largest difference is returned
    and printed in the message."""
    with torch.no_grad():
        a, b = ref(x), model(x)
    diff = (a - b).abs().max().item()
    scale = a.abs().max().item()
    assert diff <= 1e-5 * max(1.0, scale), f"{what}: largest |diff| {diff:.3g} (|out| {scale:.3g})"
    return diff


def test_timm_resnet18_with_normlab_batchnorm_equals_torch_s():
    ref, model = _twin(
        lambda norm: timm.create_model("resnet18", num_classes=10, norm_layer=norm),
        BatchNorm,
        nn.BatchNorm2d,
    )
    assert sum(isinstance(m, BatchNorm) for m in model.modules()) == 20
    x = torch.randn(4, 3, 32, 32)
    _assert_same(ref.eval(), model.eval(), x, "resnet18 eval (running statistics)")
    _assert_same(ref.train(), model.train(), x, "resnet18 train (batch statistics)")
    for (key, a), b in zip(ref.state_dict().items(), model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=f"{key} after a training forward")


@pytest.mark.parametrize(
    ("ours", "theirs"), [(LayerNorm, nn.LayerNorm), (RMSNorm, nn.RMSNorm)], ids=["ln", "rms"]
)
def test_timm_vit_tiny_with_normlab_norms_equals_torch_s(ours, theirs):
    def build(norm):
        return timm.create_model(
            "vit_tiny_patch16_224", img_size=32, num_classes=10, norm_layer=norm
        )

    ref, model = _twin(build, ours, theirs)
    assert sum(isinstance(m, ours) for m in model.modules()) == 25  # 2 per block + final
    _assert_same(ref.eval(), model.eval(), torch.randn(2, 3, 32, 32), f"vit_tiny {ours.__name__}")


def test_timm_mlp_with_normlab_layernorm_equals_torch_s():
    ref, model = _twin(
        lambda norm: timm.layers.Mlp(8, 16, norm_layer=norm), LayerNorm, nn.LayerNorm
    )
    assert isinstance(model.norm, LayerNorm)
    _assert_same(ref, model, torch.randn(5, 8), "Mlp(8, 16) LayerNorm")


def test_timm_attention_qk_norm_takes_normlab_rmsnorm():
    """The DiT's attention: timm's Attention calls norm_layer(head_dim, device=, dtype=)."""
    attn = timm.layers.Attention(16, num_heads=2, qk_norm=True, norm_layer=RMSNorm)
    assert isinstance(attn.q_norm, RMSNorm) and attn.q_norm.normalized_shape == (8,)
    q = torch.randn(1, 2, 3, 8)
    torch.testing.assert_close(attn.q_norm(q), F.rms_norm(q, (8,)))


@pytest.mark.parametrize(
    ("name", "theirs"), [("layernorm2d", "LayerNorm2d"), ("rmsnorm2d", "RmsNorm2d")]
)
@pytest.mark.parametrize("impl", ["fast", "reference", "manual"])
def test_timm_s_2d_norms_by_name_equal_timm_s(name, theirs, impl):
    """Each position of (N, C, H, W) over its C channels, as timm's layer of that name (not
    each sample over (C, H, W), as layernorm/rmsnorm with channel_dim=1)."""
    ref = getattr(timm.layers, theirs)(8)
    _perturb(ref)
    norm = create_norm(name, 8, impl=impl)
    norm.load_state_dict(ref.state_dict())
    x = (torch.randn(2, 8, 5, 5) * 3 + 1).requires_grad_()
    _assert_same(ref, norm, x, f"{name} impl={impl}")
    (norm(x) * x).sum().backward()
    ours = x.grad.clone()
    x.grad = None
    (ref(x) * x).sum().backward()
    torch.testing.assert_close(ours, x.grad, msg=f"{name} impl={impl} dx")
    flat = create_norm(name.removesuffix("2d"), 8, channel_dim=1, impl=impl)
    with torch.no_grad():
        assert not torch.allclose(flat(x), norm(x), atol=1e-3)  # a different layer


def test_timm_convnext_with_normlab_layernorm2d_equals_timm_s():
    def build(norm):
        return timm.create_model("convnext_atto", num_classes=10, conv_mlp=True, norm_layer=norm)

    ref, model = _twin(build, LayerNorm2d, timm.layers.LayerNorm2d)
    assert sum(isinstance(m, LayerNorm2d) for m in model.modules()) > 10
    _assert_same(ref.eval(), model.eval(), torch.randn(2, 3, 32, 32), "convnext_atto LayerNorm2d")
