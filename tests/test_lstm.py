"""The char-level LSTM LM with the LN-LSTM's norms (Ba et al. 2016): against torch.nn.LSTM, against
the LN-LSTM equations written out, gradients, refused norms, and a tiny train.py run."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY
from test_norm_stats import hooked_layers
from test_train import metrics_rows

from normlab.models.lstm import LSTMLM, LSTMLayer
from normlab.norms import (
    Norm,
    NormConfigError,
    available_norms,
    norm_partial,
    norm_traits,
    norms_with,
)

DATA_ROOT = Path(os.environ["NORMLAB_DATA"])
LAYERNORM = norm_partial("layernorm", eps=1e-5, elementwise_affine=True, bias=True)
RMSNORM = norm_partial("rmsnorm", eps=1e-6, elementwise_affine=True)
NONE = norm_partial("none")


def lstm(norm=LAYERNORM, seed: int = 0, **kw) -> LSTMLM:
    torch.manual_seed(seed)
    kw = {"hidden_size": 16, "num_layers": 2, "emb_dim": 12, "ctx": 8, **kw}
    return LSTMLM(65, norm, **kw)


def randomize(module: torch.nn.Module, seed: int = 1) -> None:
    """Every parameter to random values (norm gains and biases too: they must be used)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)


# --------------------------------------------------------------------------------------------
# The cell
# --------------------------------------------------------------------------------------------


def test_norm_none_is_torch_lstm_with_the_same_weights():
    model = lstm(NONE).double()
    ref = torch.nn.LSTM(12, 16, num_layers=2, batch_first=True).double()
    randomize(ref)
    with torch.no_grad():
        for k, layer in enumerate(model.layers):
            layer.weight_ih.copy_(getattr(ref, f"weight_ih_l{k}"))
            layer.weight_hh.copy_(getattr(ref, f"weight_hh_l{k}"))
            layer.bias.copy_(getattr(ref, f"bias_ih_l{k}") + getattr(ref, f"bias_hh_l{k}"))
    idx = torch.randint(0, 65, (3, 11), generator=torch.Generator().manual_seed(0))
    emb = model.tok_emb(idx)  # (B, T, E)
    g = torch.Generator().manual_seed(2)
    h0 = torch.randn(2, 3, 16, generator=g, dtype=torch.float64)
    c0 = torch.randn(2, 3, 16, generator=g, dtype=torch.float64)
    for start in (None, (h0, c0)):  # from zeros (training) and from a carried state
        expected, (h_n, c_n) = ref(emb, start)
        state = None if start is None else [(h0[k], c0[k]) for k in range(2)]
        logits, states = model.run(idx, state)
        x = emb
        for layer, s in zip(model.layers, state or [None, None], strict=True):
            x, _ = layer(x, s)
        torch.testing.assert_close(x, expected, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(torch.stack([s[0] for s in states]), h_n)
        torch.testing.assert_close(torch.stack([s[1] for s in states]), c_n)
        torch.testing.assert_close(logits, model.lm_head(expected))
    assert {type(m).__name__ for m in model.modules() if isinstance(m, Norm)} == {"NoNorm"}


def layer_norm(z, weight, bias, eps):
    mean = z.mean(-1, keepdim=True)
    var = ((z - mean) ** 2).mean(-1, keepdim=True)
    return (z - mean) / torch.sqrt(var + eps) * weight + bias


def rms_norm(z, weight, bias, eps):
    return z / torch.sqrt((z**2).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("cfg,norm", [(LAYERNORM, layer_norm), (RMSNORM, rms_norm)])
def test_steps_follow_the_ln_lstm_equations_written_out(cfg, norm):
    """Ba et al. 2016, appendix (LN-LSTM), two steps from a non-zero state:
    (f, i, o, g) = LN(W_h h) + LN(W_x x) + b; c' = s(f) c + s(i) tanh(g); h' = s(o) tanh(LN(c'))
    (here in torch's gate order i, f, g, o)."""
    H, eps = 4, cfg.keywords["eps"]
    layer = LSTMLayer(5, H, cfg).double()
    randomize(layer)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 5, generator=g, dtype=torch.float64)  # (B, T, I)
    h = torch.randn(3, H, generator=g, dtype=torch.float64)
    c = torch.randn(3, H, generator=g, dtype=torch.float64)

    def affine(n):  # a family without bias (RMSNorm) has none
        return n.weight, n.bias if n.bias is not None else 0.0

    out, (h_n, c_n) = layer(x, (h, c))
    hs = []
    for t in range(2):
        a = (
            norm(x[:, t] @ layer.weight_ih.T, *affine(layer.norm_x), eps)
            + norm(h @ layer.weight_hh.T, *affine(layer.norm_h), eps)
            + layer.bias
        )
        i, f, gg, o = a[:, :H], a[:, H : 2 * H], a[:, 2 * H : 3 * H], a[:, 3 * H :]
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(norm(c, *affine(layer.norm_c), eps))
        hs.append(h)
    torch.testing.assert_close(out, torch.stack(hs, dim=1))
    torch.testing.assert_close((h_n, c_n), (h, c))
    assert type(layer.norm_x).__name__ == type(layer.norm_c).__name__ == type(layer.norm_h).__name__
    assert tuple(layer.norm_x.weight.shape) == (4 * H,) and tuple(layer.norm_c.weight.shape) == (H,)


def test_gradients_reach_every_parameter_and_flow_back_through_time():
    model = lstm()
    randomize(model)  # norm biases non-zero too, so each gets a gradient
    idx = torch.randint(0, 65, (4, 8), generator=torch.Generator().manual_seed(0))
    logits = model(idx)
    assert logits.shape == (4, 8, 65)
    F.cross_entropy(logits.flatten(0, 1), idx.roll(-1, 1).flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    # the last position's loss reaches the first position's input through the recurrence
    x = model.tok_emb(idx).detach().requires_grad_()  # (B, T, E)
    out = x
    for layer in model.layers:
        out, _ = layer(out)
    F.cross_entropy(model.lm_head(out[:, -1]), idx[:, 0]).backward()
    assert (x.grad[:, 0].abs().sum(-1) > 0).all()
    assert torch.isfinite(x.grad).all()


def test_causal_and_state_carrying_generation():
    model = lstm().eval()
    idx = torch.randint(0, 65, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = model(idx)
    changed = idx.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 65
    after = model(changed)
    torch.testing.assert_close(after[:, :6], logits[:, :6])  # the past never sees the future
    assert not torch.allclose(after[:, 6:], logits[:, 6:])
    # generate carries the state: its greedy choices are those of re-reading the whole text
    out = model.generate(idx[:, :3], 10, temperature=0)
    assert out.shape == (2, 13) and torch.equal(out[:, :3], idx[:, :3])
    for t in range(3, 13):
        assert torch.equal(out[:, t], model(out[:, :t])[:, -1].argmax(-1))
    sampled = model.generate(idx[:, :3], 5, generator=torch.Generator().manual_seed(0))
    again = model.generate(idx[:, :3], 5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, again) and sampled.shape == (2, 8)


@pytest.mark.parametrize(
    "cfg,norm_keys",
    [(LAYERNORM, ["weight", "bias"]), (RMSNORM, ["weight"]), (NONE, [])],
)
def test_state_dict_keys(cfg, norm_keys):
    model = lstm(cfg, num_layers=2)
    expected = {"tok_emb.weight", "lm_head.weight", "lm_head.bias"}
    for k in range(2):
        expected |= {f"layers.{k}.{n}" for n in ("weight_ih", "weight_hh", "bias")}
        expected |= {f"layers.{k}.norm_{t}.{n}" for t in "xhc" for n in norm_keys}
    state = model.state_dict()
    assert set(state) == expected
    assert state["layers.0.weight_ih"].shape == (64, 12)  # 4 * hidden gates, emb_dim inputs
    assert state["layers.1.weight_ih"].shape == (64, 16)
    assert state["layers.0.weight_hh"].shape == (64, 16)
    assert torch.equal(state["layers.0.bias"][16:32], torch.ones(16))  # forget gate bias 1
    assert not state["layers.0.bias"][:16].any() and not state["layers.0.bias"][32:].any()


# --------------------------------------------------------------------------------------------
# Which norms fit
# --------------------------------------------------------------------------------------------


def test_the_per_sample_norms_are_read_from_the_norm_classes():
    choices = norms_with("tokenwise")
    assert {"layernorm", "rmsnorm", "prmsnorm", "dyt", "none"} <= set(choices)
    assert not {"batchnorm", "batchrenorm", "groupnorm", "instancenorm"} & set(choices)
    assert choices == sorted(choices) and set(choices) <= set(available_norms())


@pytest.mark.parametrize("name", available_norms())
def test_every_registry_norm_either_builds_an_lstm_or_is_refused_naming_layer_and_choices(name):
    kwargs = {"num_groups": 2} if name == "groupnorm" else {}
    if norm_traits(name).tokenwise:
        model = lstm(norm_partial(name, **kwargs), num_layers=1)
        assert torch.isfinite(model(torch.zeros(2, 5, dtype=torch.long))).all()
        return
    with pytest.raises(NormConfigError) as err:
        lstm(norm_partial(name, **kwargs))
    message = str(err.value)
    assert message.startswith(
        f"norm={name} cannot be used in model=lstm (layer layers.0.norm_x, 64 features): "
    )
    assert message.endswith(f"use one of {', '.join(norms_with('tokenwise'))}")
    assert "\n" not in message


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="^hidden_size must be a positive integer, got 0$"):
        lstm(hidden_size=0)
    with pytest.raises(ValueError, match="^num_layers must be a positive integer"):
        lstm(num_layers=1.5)
    with pytest.raises(ValueError, match=r"^dropout must be in \[0, 1\), got 1$"):
        lstm(dropout=1)
    with pytest.raises(NormConfigError, match="layers.0.norm_x .*eps must be a finite number"):
        lstm(norm_partial("layernorm", eps=0))


# --------------------------------------------------------------------------------------------
# Through the config: python train.py model=lstm data=shakespeare norm=...
# --------------------------------------------------------------------------------------------

LSTM_TINY = [*TINY, "model=lstm", "data=shakespeare", "batch=8", "model.net.hidden_size=32"]
LSTM_TINY += ["model.net.ctx=16", "callbacks.text_sample.length=20"]


def test_model_lstm_config_builds_the_lstm_on_shakespeare(compose, tmp_path):
    from hydra.utils import instantiate

    cfg = compose(["model=lstm"], tmp_path)
    assert (
        cfg.data._target_.endswith("ShakespeareDataModule")
        and cfg.norm._target_ == "normlab.norms.LayerNorm"
    )
    task = instantiate(cfg.model)
    net = task.net
    assert isinstance(net, LSTMLM) and (net.hidden_size, net.num_layers, net.ctx) == (256, 2, 64)
    assert task.example_input(3)[0].shape == (3, 64)
    data = instantiate(cfg.data)
    assert data.ctx == 64 and data.vocab_size == net.vocab_size == 65  # ctx: the model's
    layers = hooked_layers(task)  # norm statistics: the three norms of each layer
    assert layers == {f"net.layers.{k}.norm_{t}" for k in range(2) for t in "xhc"}


@pytest.mark.parametrize("norm", ["layernorm", "none"])
def test_train_py_model_lstm_runs_tiny(compose, tmp_path, norm):
    from normlab.run import train

    cfg = compose([*LSTM_TINY, f"norm={norm}"], tmp_path)
    result, _ = train(cfg)
    assert result["status"] == "ok", result
    metrics = result["metrics"]
    assert math.isfinite(metrics["val/loss"]) and metrics["val/loss"] < 2 * math.log(65)
    assert metrics["val/bpc"] == pytest.approx(metrics["val/loss"] / math.log(2), 1e-4)
    rows = metrics_rows(tmp_path)
    assert any(r.get("train/loss") for r in rows)
    assert any(r.get("grad_norm/block_01") for r in rows)  # one series per LSTM layer
    stats = any(r.get("norm/net.layers.0.norm_h/out_std") for r in rows)
    assert stats == (norm == "layernorm")  # `none` normalizes nothing: no statistics
    sample = (tmp_path / "samples_text.txt").read_text()
    assert sample.startswith("--- step")
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_the_data_module_windows_are_the_lstm_context(compose, tmp_path):
    from hydra.utils import instantiate

    from normlab.data.shakespeare import ShakespeareDataModule

    cfg = compose([*LSTM_TINY], tmp_path)
    task = instantiate(cfg.model)
    data = instantiate(cfg.data)
    assert isinstance(data, ShakespeareDataModule) and data.ctx == task.net.ctx == 16
    data.setup()
    x, y = next(iter(data.train_dataloader()))
    assert x.shape == y.shape == (8, 16)
    assert task.loss((x, y)).isfinite()
