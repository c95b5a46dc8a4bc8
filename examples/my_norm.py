"""A norm of your own, used without editing normlab: a mean-only LayerNorm.

    y = (x - mean(x)) * weight         mean over each token's D features (or, for conv features
                                       (N, C, H, W), over each sample's (C, H, W))

LayerNorm without the division by the standard deviation (the "mean-only" ablation of LayerNorm,
cf. Salimans & Kingma 2016's mean-only batch normalization), with a learnable gain per feature.

Register it with `register_norm` and list this module in `plugins`; from the repo root:

    python train.py plugins=[examples.my_norm] norm=custom 'norm._target_=${normlab.norm:meanonly}'

or, unregistered, by its class path: norm=custom norm._target_=examples.my_norm.MeanOnlyLayerNorm
(from elsewhere, put this file's dir on PYTHONPATH and write plugins=[my_norm]). The class
attributes below are its traits (normlab.norms.norm_traits): what the models check before they
build it. A plain nn.Module works; a normlab `Norm` subclass would inherit their defaults.
"""

from __future__ import annotations

import torch
from torch import nn

from normlab.norms import register_norm


@register_norm("meanonly", aliases=("mean_only_layernorm",))
class MeanOnlyLayerNorm(nn.Module):
    """Subtract each token's mean over its features, then a learnable gain per feature."""

    tokenwise = True  # each token on its own: fits a Transformer placement, the DiT, the LSTM
    spatial = False  # works on (N, C) too: fits LeNet's and the MLP's fc layers
    affine_key = "elementwise_affine"  # the DiT's adaLN switches the gain off through it
    normalizes = True  # the norm_stats callback logs its input and output

    def __init__(
        self, num_features: int, elementwise_affine: bool = True, channel_dim: int = -1
    ) -> None:
        super().__init__()
        if channel_dim not in (1, -1):
            raise ValueError(f"meanonly: channel_dim must be 1 or -1, got {channel_dim!r}")
        self.channel_dim = channel_dim  # taking it lets the models place it in either layout
        self.weight = nn.Parameter(torch.ones(num_features)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channel_dim == -1:  # (..., D): over each token's features
            centred = x - x.mean(-1, keepdim=True)
            return centred if self.weight is None else centred * self.weight
        centred = x - x.mean(tuple(range(1, x.dim())), keepdim=True)  # (N, C, *): over (C, *)
        if self.weight is None:
            return centred
        return centred * self.weight.view(-1, *([1] * (x.dim() - 2)))  # per channel
