"""QK-norm (model.net.qk_norm, a norm layer: +norm@model.net.qk_norm=rmsnorm) in the GPT's and
the DiT's attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import nn

from normlab.models.dit import build_dit
from normlab.models.transformer import GPT
from normlab.norms import LayerNorm, RMSNorm, norm_partial
from normlab.norms.qknorm import check_qk_norm

LN = norm_partial("layernorm", eps=1e-5, elementwise_affine=True, bias=True)
GPT_TINY = {"depth": 2, "d_model": 32, "n_heads": 4, "ctx": 16}  # head_dim 8
DIT_TINY = {"hidden_size": 32, "depth": 2, "num_heads": 4, "patch_size": 4}


def qk_layer(name):
    """The norm layer of a registered family's defaults (what +norm@model.net.qk_norm=<name>
    builds), None for None."""
    return None if name is None else norm_partial(name)


def gpt(qk_norm=None, placement="pre"):
    torch.manual_seed(0)
    return GPT(65, {"name": placement}, LN, qk_norm=qk_layer(qk_norm), **GPT_TINY).eval()


def dit(qk_norm=None, conditioning="adaln_zero", **kw):
    torch.manual_seed(0)
    kw = {**DIT_TINY, **kw}
    net = build_dit(LN, conditioning=conditioning, class_dropout=0.0, qk_norm=qk_layer(qk_norm),
                    **kw)  # fmt: skip
    for block in net.blocks:
        block.attn.fused_attn = True  # timm's F.scaled_dot_product_attention path, recorded below
    return net.eval()


def tokens():
    return torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(0))


def images():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 1, 28, 28, generator=g), torch.tensor([3, 700]), torch.tensor([1, 7])


@pytest.fixture
def sdpa_inputs(monkeypatch):
    """The (q, k) of every call to F.scaled_dot_product_attention, in call order."""
    calls = []
    original = F.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        calls.append((q.detach(), k.detach()))
        return original(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return calls


def per_head_moments(t):
    """Mean and biased variance of each head vector (over head_dim, the last dim)."""
    return t.mean(-1), t.var(-1, unbiased=False)


def assert_standardized(t, eps):
    mean, var = per_head_moments(t)
    torch.testing.assert_close(mean, torch.zeros_like(mean), rtol=0, atol=1e-5)
    # a LayerNorm's output has variance var / (var + eps): 1 up to eps relative to var
    torch.testing.assert_close(var, torch.ones_like(var), rtol=0, atol=1e-4 + 50 * eps)


# ------------------------------------------------------------------ what the dot product sees


def test_gpt_layernorm_qk_feeds_standardized_heads_to_the_dot_product(sdpa_inputs):
    gpt("layernorm")(tokens())
    assert len(sdpa_inputs) == GPT_TINY["depth"]
    for q, k in sdpa_inputs:
        assert q.shape == k.shape == (2, 4, 16, 8)  # (B, H, T, head_dim)
        assert_standardized(q, 1e-5)
        assert_standardized(k, 1e-5)


def test_gpt_without_qk_norm_feeds_raw_projections(sdpa_inputs):
    gpt(None)(tokens())  # the check above can fail: plain q, k are not standardized per head
    q, k = sdpa_inputs[0]
    for t in (q, k):
        _, var = per_head_moments(t)
        assert (var - 1).abs().max() > 0.1


def test_gpt_rmsnorm_qk_gives_unit_rms_heads(sdpa_inputs):
    gpt("rmsnorm")(tokens())
    for q, k in sdpa_inputs:
        for t in (q, k):
            ms = t.pow(2).mean(-1)
            torch.testing.assert_close(ms, torch.ones_like(ms), rtol=1e-5, atol=0)
            assert t.mean(-1).abs().max() > 1e-3  # not centred: RMSNorm, not LayerNorm


@pytest.mark.parametrize(("conditioning", "calls"), [("adaln_zero", 1), ("cross_attn", 2)])
def test_dit_layernorm_qk_in_self_and_cross_attention(sdpa_inputs, conditioning, calls):
    # eps 1e-12: at init the cross-attention's keys come from the label and timestep embeddings
    # (std 0.02), whose per-head variance is small enough for eps 1e-6 to shrink it by 2%
    dit("layernorm", conditioning, norm_eps=1e-12)(*images())
    assert len(sdpa_inputs) == calls * DIT_TINY["depth"]  # self- (and cross-) attention
    for q, k in sdpa_inputs:
        assert q.shape[-1] == k.shape[-1] == 8  # head_dim
        assert_standardized(q, 1e-12)
        assert_standardized(k, 1e-12)


def test_gpt_attention_is_softmax_of_normalized_q_and_k_recomputed_by_hand():
    model = gpt("layernorm")
    attn = model.blocks[0].attn.sublayer
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # an affine away from identity: the norms' own parameters are used
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.copy_(1 + 0.5 * torch.randn(8, generator=g))
            norm.bias.copy_(0.5 * torch.randn(8, generator=g))
    x = torch.randn(2, 16, 32, generator=g)

    def heads(t):  # (B, T, D) -> (B, H, T, head_dim)
        return t.view(2, 16, 4, 8).transpose(1, 2)

    def ln(t, norm):
        mean, var = t.mean(-1, keepdim=True), t.var(-1, unbiased=False, keepdim=True)
        return (t - mean) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias

    q = ln(heads(attn.q_proj(x)), attn.q_norm)
    k = ln(heads(attn.k_proj(x)), attn.k_norm)
    v = heads(attn.v_proj(x))
    scores = q @ k.transpose(-2, -1) / 8**0.5
    scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 16, 32)
    torch.testing.assert_close(attn(x), attn.out_proj(y), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ default: today's attention


def test_gpt_default_attention_is_plain_attention_bit_for_bit():
    model = gpt(None)
    attn = model.blocks[0].attn.sublayer
    assert isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity)
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(4))

    def heads(t):
        return t.view(2, 16, 4, 8).transpose(1, 2)

    q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 16, 32)
    assert torch.equal(attn(x), attn.out_proj(y))


def test_dit_default_attention_is_timms_plain_attention_bit_for_bit():
    net = dit(None, "cross_attn")
    block = net.blocks[0]
    assert isinstance(block.attn.q_norm, nn.Identity) and isinstance(block.attn.k_norm, nn.Identity)
    assert isinstance(block.cross_attn.q_norm, nn.Identity)
    x = torch.randn(2, 49, 32, generator=torch.Generator().manual_seed(4))
    qkv = block.attn.qkv(x).view(2, 49, 3, 4, 8).permute(2, 0, 3, 1, 4)  # (3, B, H, N, hd)
    y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape(2, 49, 32)
    assert torch.equal(block.attn(x), block.attn.proj(y))


@pytest.mark.parametrize("qk_norm", ["layernorm", "rmsnorm"])
def test_gpt_qk_norm_adds_only_its_norms_to_the_same_weights(qk_norm):
    plain, normed = gpt(None).state_dict(), gpt(qk_norm).state_dict()
    extra = sorted(set(normed) - set(plain))
    affine = ["bias", "weight"] if qk_norm == "layernorm" else ["weight"]
    assert extra == sorted(
        f"blocks.{i}.attn.sublayer.{n}_norm.{p}" for i in range(2) for n in "qk" for p in affine
    )
    assert set(plain) <= set(normed)
    assert all(torch.equal(plain[key], normed[key]) for key in plain)  # same seed, same weights
    assert all(normed[key].shape == (8,) for key in extra)  # head_dim
    assert not torch.equal(gpt(None)(tokens()), gpt(qk_norm)(tokens()))  # and it does something


def test_dit_qk_norm_state_dict_and_eps():
    plain, normed = dit(None, "cross_attn"), dit("rmsnorm", "cross_attn")
    extra = sorted(set(normed.state_dict()) - set(plain.state_dict()))
    assert extra == sorted(
        f"blocks.{i}.{attn}.{n}_norm.weight"
        for i in range(2) for attn in ("attn", "cross_attn") for n in "qk"
    )  # fmt: skip
    assert all(torch.equal(v, normed.state_dict()[k]) for k, v in plain.state_dict().items())
    qk = [m for n, m in normed.named_modules() if n.endswith(("q_norm", "k_norm"))]
    assert len(qk) == 8 and all(isinstance(m, RMSNorm) and m.eps == 1e-6 for m in qk)
    keep = dit("layernorm", norm_eps=None)  # the registry's default eps
    qk = [m for n, m in keep.named_modules() if n.endswith(("q_norm", "k_norm"))]
    assert len(qk) == 4 and all(isinstance(m, LayerNorm) and m.eps == 1e-5 for m in qk)


# ------------------------------------------------------------------ configuration


def test_config_default_is_null_and_reaches_both_models(compose, tmp_path):
    cfg = compose(["model=transformer"], tmp_path)
    assert cfg.model.net.qk_norm is None
    cfg = compose(["model=transformer", "+norm@model.net.qk_norm=rmsnorm"], tmp_path)
    attn = instantiate(cfg.model.net).blocks[0].attn.sublayer
    assert isinstance(attn.q_norm, RMSNorm) and isinstance(attn.k_norm, RMSNorm)
    cfg = compose(["model=transformer", "norm=rmsnorm", "model.net.qk_norm=${norm}"], tmp_path)
    attn = instantiate(cfg.model.net).blocks[0].attn.sublayer
    assert isinstance(attn.q_norm, RMSNorm) and attn.q_norm.weight.shape == (16,)  # head_dim
    cfg = compose(["experiment=dit"], tmp_path)
    assert cfg.model.net.qk_norm is None
    cfg = compose(["experiment=dit", "+norm@model.net.qk_norm=layernorm"], tmp_path)
    assert isinstance(instantiate(cfg.model.net).blocks[0].attn.q_norm, LayerNorm)


BAD = ["batchnorm", "groupnorm", "foo", True, 1]


@pytest.mark.parametrize("value", BAD)
def test_bad_values_name_the_valid_ones(value):
    if value in ("batchnorm", "groupnorm"):  # a norm layer of a family that is not tokenwise
        value = norm_partial(value, **({"num_groups": 1} if value == "groupnorm" else {}))
    message = r"qk_norm=.* is not a QK-norm .*; valid: .*layernorm.*rmsnorm.* or None"
    with pytest.raises(ValueError, match=message):
        check_qk_norm(value)
    with pytest.raises(ValueError, match=message):
        GPT(65, {"name": "pre"}, LN, qk_norm=value, **GPT_TINY)
    with pytest.raises(ValueError, match=message):
        build_dit(LN, qk_norm=value, **DIT_TINY)


def test_a_registered_name_is_not_a_norm_layer():
    # a norm slot takes a callable width -> module; a name goes through the config's norm group
    with pytest.raises(ValueError, match=r"qk_norm='layernorm' is not a QK-norm"):
        check_qk_norm("layernorm")
    assert check_qk_norm(None) is None and check_qk_norm(LN) is LN


def test_any_tokenwise_family_is_a_qk_norm_a_registered_one_too(scratch_registry):
    from normlab.norms import register_norm
    from normlab.norms.dyt import DyT

    @register_norm("qk_test_tanh")
    class QKTanh(DyT):  # a user's family: tokenwise by inheritance, built over head_dim
        pass

    assert check_qk_norm(DyT) is DyT and check_qk_norm(QKTanh) is QKTanh
    model = GPT(65, {"name": "pre"}, LN, qk_norm=QKTanh, **GPT_TINY)
    q_norm = model.blocks[0].attn.sublayer.q_norm
    assert isinstance(q_norm, QKTanh) and q_norm.weight.shape == (8,)  # head_dim
    assert model(torch.randint(0, 65, (2, 8))).isfinite().all()
