"""The DiT model: adaLN-Zero identity at init, the four conditionings and their blocks, the size
presets, config errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO
from omegaconf import OmegaConf

from normlab.models.dit import BLOCKS, DiT, build_dit
from normlab.norms import NormConfigError, norm_partial
from normlab.norms.adaptive import AdaLN

LN = norm_partial("layernorm", eps=1e-5, elementwise_affine=True, bias=True, impl="fast")
TINY = {"hidden_size": 32, "depth": 2, "num_heads": 4, "patch_size": 4}
B = 8
SIZES = REPO / "conf" / "size" / "dit"  # the named shapes: size=dit/<name>


def tiny_dit(conditioning="adaln_zero", **kw):
    torch.manual_seed(0)
    return build_dit(LN, conditioning=conditioning, class_dropout=0.0, **TINY, **kw)


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, 1, 28, 28, generator=g)
    t = torch.randint(0, 1000, (B,), generator=g)
    y = torch.randint(0, 10, (B,), generator=g)
    return x, t, y


def train_steps(net, steps, lr=1e-3):
    """`steps` Adam steps regressing a fixed target (noise) from a fixed batch."""
    x, t, y = batch()
    target = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(steps):
        loss = (net(x, t, y) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def block_io(net, x, t, y):
    """(input, output) of every block in one forward pass."""
    pairs = []
    hooks = [b.register_forward_hook(lambda m, a, o: pairs.append((a[0], o))) for b in net.blocks]
    out = net(x, t, y)
    for h in hooks:
        h.remove()
    return pairs, out


def test_adaln_zero_blocks_are_identity_and_output_zero_at_init():
    net = tiny_dit()
    pairs, out = block_io(net, *batch())
    assert len(pairs) == 2
    for inp, outp in pairs:
        assert torch.equal(inp, outp)  # exactly: the gates are 0
    assert torch.equal(out, torch.zeros_like(out))


def test_adaln_zero_leaves_identity_after_training_steps():
    # Step 1: only the zero output Linear gets a gradient (everything before it is multiplied
    # by its zero weights), so it stops outputting zeros; the blocks are still the identity.
    # Step 2: gradients now flow back through the output layer to the gates: blocks change.
    net = tiny_dit()
    train_steps(net, 1)
    pairs, out = block_io(net, *batch(1))
    assert out.abs().max() > 0
    assert all(torch.equal(i, o) for i, o in pairs)
    train_steps(net, 1)
    pairs, _ = block_io(net, *batch(1))
    assert not any(torch.equal(i, o) for i, o in pairs)


@pytest.mark.parametrize("conditioning", BLOCKS)
def test_conditioning_shapes_and_label_effect(conditioning):
    net = tiny_dit(conditioning)
    x, t, y = batch()
    assert net(x, t, y).shape == x.shape
    train_steps(net, 5)
    net.eval()
    with torch.no_grad():
        out_a = net(x, t, torch.zeros_like(y))
        out_b = net(x, t, torch.full_like(y, 7))
        out_null = net(x, t, torch.full_like(y, net.null_class))
    assert not torch.allclose(out_a, out_b)
    assert not torch.allclose(out_a, out_null)


@pytest.mark.parametrize("conditioning", BLOCKS)
def test_the_conditioning_picks_the_block_and_only_adaln_regresses(conditioning):
    net = tiny_dit(conditioning)
    assert all(type(block) is BLOCKS[conditioning] for block in net.blocks)
    regressions = [m for m in net.modules() if isinstance(m, AdaLN)]
    if conditioning in ("cross_attn", "in_context"):  # plain norms, with their own affine
        assert regressions == [] and net.final_layer.adaLN_modulation is None
        assert all(b.norm1.weight is not None for b in net.blocks)
    else:  # one regression a branch and the final norm's; the norms' affine switched off
        assert len(regressions) == 2 * 2 + 1
        assert all(b.norm1.weight is None and b.norm2.weight is None for b in net.blocks)


def randomized(net):
    """net with every parameter drawn from N(0, 0.3^2): gates, regressions and outputs open."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return net


def ln(norm, x):
    """A block's norm written out: LayerNorm over D with eps 1e-6 (DiT's), the module's affine
    when it has one (the plain conditionings), none when adaptive (shift/scale replace it)."""
    return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, eps=1e-6)


def regressed(modulation, c, chunks):
    """The chunks (shift, scale[, gate]) a regression Linear(SiLU(c)) gives, each (B, 1, D)."""
    lin = modulation[1]
    return [t[:, None] for t in (F.silu(c) @ lin.weight.T + lin.bias).chunk(chunks, -1)]


def branches(block):
    """(norm, regression, branch) of the attention and of the MLP."""
    return (block.norm1, block.adaLN_msa, block.attn), (block.norm2, block.adaLN_mlp, block.mlp)


def reference_block(conditioning, block, x, c, ctx):
    """DiT's block, one formula per conditioning (Peebles & Xie 2023, Fig. 3)."""
    if conditioning == "adaln_zero":  # x + gate * F(modulate(norm(x), shift, scale))
        for norm, modulation, branch in branches(block):
            shift, scale, gate = regressed(modulation, c, 3)
            x = x + gate * branch(ln(norm, x) * (1 + scale) + shift)
        return x
    if conditioning == "adaln":  # x + F(modulate(norm(x), shift, scale))
        for norm, modulation, branch in branches(block):
            shift, scale = regressed(modulation, c, 2)
            x = x + branch(ln(norm, x) * (1 + scale) + shift)
        return x
    x = x + block.attn(ln(block.norm1, x))  # plain pre-norm block
    if conditioning == "cross_attn":
        x = x + block.cross_attn(ln(block.norm_cross, x), ctx)
    return x + block.mlp(ln(block.norm2, x))


@pytest.mark.parametrize("conditioning", BLOCKS)
def test_each_block_and_the_model_are_their_formulas(conditioning):
    net = randomized(tiny_dit(conditioning)).eval()
    x, t, y = batch()
    B, D = x.shape[0], TINY["hidden_size"]
    tokens = torch.randn(B, 5, D, generator=torch.Generator().manual_seed(4))
    c = torch.randn(B, D, generator=torch.Generator().manual_seed(5))
    ctx = torch.randn(B, 2, D, generator=torch.Generator().manual_seed(6))
    block = net.blocks[0]
    with torch.no_grad():
        cond = {"cross_attn": ctx, "in_context": None}.get(conditioning, c)  # what it reads
        torch.testing.assert_close(
            block(tokens, cond), reference_block(conditioning, block, tokens, c, ctx)
        )
        # the model: how t and y reach the blocks and which tokens reach the final layer
        h = net.x_embedder(x) + net.pos_embed
        t_emb, y_emb = net.t_embedder(t), net.y_embedder(y)
        c = t_emb + y_emb if conditioning in ("adaln_zero", "adaln") else None
        ctx = torch.stack([t_emb, y_emb], 1) if conditioning == "cross_attn" else None
        if conditioning == "in_context":
            h = torch.cat([t_emb[:, None], y_emb[:, None], h], 1)
        for block in net.blocks:
            h = reference_block(conditioning, block, h, c, ctx)
        h = h[:, 2:] if conditioning == "in_context" else h
        final = net.final_layer
        if c is None:
            h = ln(final.norm_final, h)
        else:  # the final norm is shifted and scaled by c, no gate
            shift, scale = regressed(final.adaLN_modulation, c, 2)
            h = ln(final.norm_final, h) * (1 + scale) + shift
        expected = net.unpatchify(net.final_layer.linear(h))
        torch.testing.assert_close(net(x, t, y), expected)


def test_unpatchify_inverts_row_major_patches():
    net = tiny_dit()
    x = torch.randn(2, 1, 28, 28)
    G, p = 7, 4
    patches = x.view(2, 1, G, p, G, p).permute(0, 2, 4, 3, 5, 1).reshape(2, G * G, p * p)
    assert torch.equal(net.unpatchify(patches), x)


def test_label_dropout_only_in_training():
    torch.manual_seed(0)
    net = build_dit(LN, class_dropout=1.0, **TINY)
    y = torch.arange(B) % 10
    null = net.y_embedder.table.weight[net.null_class]
    net.train()
    assert torch.equal(net.y_embedder(y), null.expand(B, -1))
    net.eval()
    assert not torch.equal(net.y_embedder(y), null.expand(B, -1))


def test_size_presets_are_consistent_and_tiny_is_the_default():
    presets = {p.relative_to(SIZES).with_suffix("").as_posix(): p for p in SIZES.rglob("*.yaml")}
    assert sorted(presets) == sorted(
        ["tiny", *(f"{s}/{p}" for s in ("S", "B", "L", "XL") for p in (2, 4))]
    )
    for name, path in presets.items():
        shape = OmegaConf.to_container(OmegaConf.load(path))
        assert set(shape) == {"hidden_size", "depth", "num_heads", "patch_size"}, name
        assert shape["hidden_size"] % shape["num_heads"] == 0, name
        assert shape["hidden_size"] % 4 == 0, name  # 2D sin-cos positions
        assert 28 % shape["patch_size"] == 0, name
    tiny = OmegaConf.load(presets["tiny"])
    model_yaml = OmegaConf.load(REPO / "conf" / "model" / "dit.yaml").net
    assert all(model_yaml[k] == v for k, v in tiny.items())  # conf/model/dit.yaml is tiny
    net = build_dit(LN)  # the builder's defaults: the same tiny shape
    assert (len(net.blocks), net.x_embedder.proj.out_channels, net.patch_size) == (4, 96, 4)
    assert net(*batch()).shape == (B, 1, 28, 28)


def test_rmsnorm_base():
    net = build_dit(norm_partial("rmsnorm", eps=None), **TINY)
    assert net(*batch()).shape == (B, 1, 28, 28)


def test_bad_configs_fail_with_the_reason():
    with pytest.raises(ValueError, match="^conditioning='concat' is not one of"):
        build_dit(LN, conditioning="concat")
    with pytest.raises(ValueError, match="^depth must be a positive integer, got None$"):
        build_dit(LN, **{**TINY, "depth": None})  # no null: the shape is always given
    with pytest.raises(ValueError, match="^patch_size=8 does not divide input_size=28$"):
        build_dit(LN, **{**TINY, "patch_size": 8})
    with pytest.raises(NormConfigError, match="batchnorm"):
        build_dit(norm_partial("batchnorm"), **TINY)


def built_norms(net):
    """Every registry norm inside the model (adaptive norms' base norms included)."""
    return [m for m in net.modules() if getattr(m, "family", "none") != "none"]


@pytest.mark.parametrize("conditioning", BLOCKS)
def test_every_norm_has_dits_eps_by_default(conditioning):
    norms = built_norms(tiny_dit(conditioning))  # LN's eps is 1e-5
    assert len(norms) >= 2 * 2 + 1
    assert all(m.eps == 1e-6 for m in norms)
    rms = build_dit(norm_partial("rmsnorm", eps=None), conditioning=conditioning, **TINY)
    assert all(m.eps == 1e-6 for m in built_norms(rms))


def test_norm_eps_null_keeps_the_norm_configs_eps():
    assert all(m.eps == 1e-5 for m in built_norms(tiny_dit(norm_eps=None)))
    rms = build_dit(norm_partial("rmsnorm", eps=None), norm_eps=None, **TINY)
    assert all(m.eps is None for m in built_norms(rms))


def test_norm_eps_skips_a_norm_without_eps():
    net = build_dit(norm_partial("none"), **TINY)  # `none` takes no eps: nothing to set
    assert built_norms(net) == [] and net(*batch()).shape == (B, 1, 28, 28)


def test_dit_config_sets_eps_1e6(compose, tmp_path):
    from hydra.utils import instantiate

    cfg = compose(["experiment=dit"], tmp_path)
    assert cfg.model.net.norm_eps == 1e-6 and cfg.norm.eps == 1e-5
    net = instantiate(cfg.model.net)
    assert all(m.eps == 1e-6 for m in built_norms(net))
    cfg = compose(["experiment=dit", "model.net.norm_eps=null"], tmp_path)
    assert all(m.eps == 1e-5 for m in built_norms(instantiate(cfg.model.net)))


def test_zero_init_false_keeps_xavier_on_the_regressions_and_the_final_layer():
    """The DyT authors' DiT patch deletes DiT's zeroing of the adaLN modulation and of the final
    layer: those Linears keep the xavier-uniform init every other Linear gets."""
    import math

    torch.manual_seed(0)
    zero, plain = (
        build_dit(hidden_size=32, depth=2, num_heads=2),
        build_dit(hidden_size=32, depth=2, num_heads=2, zero_init=False),
    )
    for model, zeroed in ((zero, True), (plain, False)):
        linears = [m[1] for m in model.modules() if isinstance(m, AdaLN)]
        linears.append(model.final_layer.linear)
        for linear in linears:
            out_f, in_f = linear.weight.shape
            bound = math.sqrt(6.0 / (in_f + out_f))  # xavier-uniform's bound
            w = linear.weight.abs()
            assert (w.max().item() == 0.0) == zeroed
            if not zeroed:
                assert w.max().item() <= bound and w.max().item() > 0.5 * bound
            assert linear.bias.abs().max().item() == 0.0
    x, t, y = torch.randn(2, 1, 28, 28), torch.tensor([1, 500]), torch.tensor([0, 3])
    assert zero(x, t, y).abs().max().item() == 0.0  # adaLN-Zero: starts predicting eps = 0
    assert plain(x, t, y).abs().max().item() > 0.0


def test_the_dit_takes_its_norm_as_a_callable_of_the_width():
    """DiT(norm_layer) with torch's LayerNorm as DiT's code builds it is the model build_dit()
    builds from the layernorm config: the same parameters from the same seed, the same output."""
    from functools import partial

    from torch import nn

    torch.manual_seed(0)
    ours = DiT(partial(nn.LayerNorm, elementwise_affine=False, eps=1e-6), **TINY)
    assert all(type(b.norm1) is nn.LayerNorm for b in ours.blocks)
    built = tiny_dit()  # seeds 0 itself
    ours.y_embedder.dropout = 0.0
    assert ours.state_dict().keys() == built.state_dict().keys()
    assert all(torch.equal(ours.state_dict()[k], v) for k, v in built.state_dict().items())
    randomized(ours), randomized(built)
    with torch.no_grad():
        assert torch.equal(ours(*batch()), built(*batch()))
