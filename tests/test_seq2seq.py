"""The encoder-decoder of Xiong et al.'s setup (normlab.models.seq2seq): shapes, placements,
causality of the decoder, its init, and the language-model task's loss on the target side."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from normlab.models.seq2seq import EncoderDecoder, sinusoids
from normlab.tasks.language_model import LanguageModelTask


def _model(placement: str = "post", **kw) -> EncoderDecoder:
    torch.manual_seed(0)
    shape = dict(ctx=16, src_len=8, encoder_layers=2, decoder_layers=2, d_model=16, n_heads=2,
                 ffn=32)  # fmt: skip
    return EncoderDecoder(11, {"name": placement}, **{**shape, **kw})


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_it_predicts_the_target_side_and_pre_ln_has_final_norms(placement):
    model = _model(placement)
    idx = torch.randint(0, 11, (3, 16))
    assert model(idx).shape == (3, 8, 11)
    assert (model.encoder.norm is not None) == (placement == "pre")
    assert all(layer.norm_first == (placement == "pre") for layer in model.decoder.layers)


def test_a_decoder_position_sees_the_source_and_earlier_targets_only():
    model = _model().eval()
    idx = torch.randint(0, 11, (1, 16))
    later = idx.clone()
    later[0, 12:] = (later[0, 12:] + 1) % 11  # change target positions 4..7
    source = idx.clone()
    source[0, 0] = (source[0, 0] + 1) % 11
    out = model(idx)
    assert torch.equal(model(later)[:, :4], out[:, :4])  # positions before the change
    assert not torch.allclose(model(source), out)  # every position reads the source


def test_init_is_fairseqs_unit_scale_embeddings_and_zero_biases():
    model = _model(d_model=64, n_heads=4, ffn=128)
    emb = model.src_emb.weight * math.sqrt(64)
    assert emb.std().item() == pytest.approx(1.0, rel=0.1)
    assert model.head.weight is model.tgt_emb.weight
    linear2 = model.encoder.layers[0].linear2
    assert linear2.bias.abs().max() == 0
    bound = math.sqrt(6 / (128 + 64))  # Xavier-uniform's bound
    assert linear2.weight.abs().max() <= bound
    table = sinusoids(5, 8)
    assert torch.allclose(table[0], torch.tensor([0.0] * 4 + [1.0] * 4))


def test_bad_arguments_are_one_line_value_errors():
    with pytest.raises(ValueError, match="placement must be one of"):
        _model("deepnorm")
    with pytest.raises(ValueError, match="src_len=16 must be below ctx=16"):
        _model(src_len=16)
    with pytest.raises(ValueError, match="ctx=16 characters, got 15"):
        _model()(torch.zeros(1, 15, dtype=torch.long))


def test_the_language_model_loss_scores_the_last_positions_the_net_predicts():
    task = LanguageModelTask(net=_model(), optim={})
    x = torch.randint(0, 11, (2, 16))
    y = torch.randint(0, 11, (2, 16))
    logits = task.net(x)
    expected = F.cross_entropy(logits.flatten(0, 1), y[:, 8:].flatten())
    assert torch.allclose(task.loss((x, y)), expected)
