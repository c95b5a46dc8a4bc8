"""Folding eval-mode BatchNorm into the convolution or linear layer before it."""

from __future__ import annotations

import copy

import torch
import torch.fx
from torch import nn

from normlab.norms.base import stats_dtype
from normlab.norms.batchnorm import BatchNorm

_FOLDABLE_INTO = (nn.Conv1d, nn.Conv2d, nn.Linear)
_BATCHNORMS = (BatchNorm, nn.modules.batchnorm._BatchNorm)


class _LeafTracer(torch.fx.Tracer):
    """An fx tracer that keeps batch norms and the layers they fold into as single calls."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, _BATCHNORMS + _FOLDABLE_INTO) or super().is_leaf_module(m, qualname)


def _pairs_by_tracing(model: nn.Module) -> list[tuple[str, str]]:
    """(layer, bn) names where the bn's only input is the layer's output and nothing else uses it.

    Each of the two modules must be called exactly once in the traced forward.
    """
    graph = _LeafTracer().trace(model)
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or len(node.all_input_nodes) != 1:
            continue
        prev = node.all_input_nodes[0]
        if prev.op != "call_module" or len(prev.users) != 1 or len(node.args) != 1:
            continue
        if calls[node.target] == 1 and calls[prev.target] == 1:
            pairs.append((prev.target, node.target))
    return pairs


def _pairs_in_sequentials(model: nn.Module) -> list[tuple[str, str]]:
    """(layer, bn) names of neighbours inside any nn.Sequential of `model`."""
    pairs = []
    for seq_name, seq in model.named_modules():
        if isinstance(seq, nn.Sequential):
            names = list(seq._modules)
            prefix = f"{seq_name}." if seq_name else ""
            pairs += [(prefix + a, prefix + b) for a, b in zip(names, names[1:], strict=False)]
    return pairs


def _foldable(layer: nn.Module, bn: nn.Module) -> bool:
    out = layer.out_features if isinstance(layer, nn.Linear) else getattr(layer, "out_channels", 0)
    return (
        isinstance(layer, _FOLDABLE_INTO)
        and isinstance(bn, _BATCHNORMS)
        and bn.track_running_stats
        and bn.num_features == out
    )


@torch.no_grad()
def _fold_into(layer: nn.Module, bn: nn.Module) -> None:
    """W' = W * gamma / sqrt(var + eps) per output channel, b' = (b - mean) * that + beta.

    Computed in float32 for a half model (`stats_dtype`; var + eps and the rsqrt would round in
    float16), then stored in the layer's dtype.
    """
    acc = stats_dtype(bn.running_var.dtype)
    scale = torch.rsqrt(bn.running_var.to(acc) + bn.eps)
    shift = -bn.running_mean.to(acc) * scale
    if bn.weight is not None:
        scale = scale * bn.weight
        shift = shift * bn.weight
    if bn.bias is not None:  # None also with affine=True, bias=False (torch's `bias` keyword)
        shift = shift + bn.bias
    bias = layer.bias if layer.bias is not None else torch.zeros_like(scale)
    layer.weight.mul_(scale.view(-1, *([1] * (layer.weight.dim() - 1))))
    layer.bias = nn.Parameter((bias * scale + shift).to(layer.weight.dtype))


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """Return an eval-mode deep copy of `model` with each BatchNorm after a conv/linear folded in.

    Detected pairs: a Conv1d, Conv2d or Linear whose output goes only to a batch norm (normlab's
    BatchNorm or any torch.nn BatchNorm) with the same channel count and tracked running
    statistics, each module called once per forward. Pairs are found by tracing forward with
    torch.fx; if the model cannot be traced (data-dependent control flow), only neighbours inside
    an nn.Sequential are folded. Anything else (a norm after an activation, a BN reached through
    an add or a functional call, a shared layer, conv-transpose) is left unfolded. A Linear
    followed by a BN is folded assuming (N, C) activations, the only layout where C is its output.
    Folded BNs become nn.Identity.
    """
    folded = copy.deepcopy(model).eval()
    try:
        pairs = _pairs_by_tracing(folded)
    except Exception:  # fx cannot trace this forward: fall back to nn.Sequential neighbours
        pairs = _pairs_in_sequentials(folded)
    for layer_name, bn_name in pairs:
        layer, bn = folded.get_submodule(layer_name), folded.get_submodule(bn_name)
        if _foldable(layer, bn):
            _fold_into(layer, bn)
            parent_name, _, child = bn_name.rpartition(".")
            setattr(folded.get_submodule(parent_name), child, nn.Identity())
    return folded
