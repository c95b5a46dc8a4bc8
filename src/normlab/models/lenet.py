"""LeNet-5 with a norm after every conv and fc layer but the last (d2l, BatchNorm chapter)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal

from torch import nn

from normlab.errors import ConfigError
from normlab.norms import NoNorm, build_norm, norm_name, norm_traits, norms_with
from normlab.norms.registry import NormLayer

ACTIVATIONS = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU}
# 2x2 stride-2 pooling after each conv: avg as d2l's LeNet (LeNet-5's subsampling), the default;
# max as the lecture's LeNet+BN
POOLS = {"avg": nn.AvgPool2d, "max": nn.MaxPool2d}


def norm_for_layer(norm_layer: NormLayer, features: int, layer: str, fc: bool) -> nn.Module:
    """The configured norm after a conv layer (features (N, C, H, W)) or an fc layer ((N, C)), or
    a ConfigError naming the layer: one that needs spatial extent has none after an fc layer."""
    try:
        traits = norm_traits(norm_layer)
        if fc and traits is not None and traits.spatial:
            raise ConfigError(
                f"norm={norm_name(norm_layer)} needs spatial extent and an fc layer's "
                f"(N, {features}) output has no spatial extent; use "
                f"{', '.join(norms_with('spatial', False))}"
            )
        # an fc layer's features are at dim 1 and at dim -1: a norm of either layout fits
        return build_norm(norm_layer, features, channel_dim=(1, -1) if fc else 1)
    except ValueError as err:
        raise ConfigError(f"{layer} ({features} features): {err}") from err


def conv_widths(channels: Sequence[int], count: int, what: str, example: str) -> list[int]:
    """`channels` as a list of `count` positive integers, or a one-line ValueError naming it."""
    is_list = isinstance(channels, Sequence) and not isinstance(channels, str)
    widths = list(channels) if is_list else []  # Hydra's ListConfig is a Sequence
    if len(widths) != count or not all(
        isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in widths
    ):
        raise ValueError(
            f"channels={channels!r}: need exactly {count} positive integers ({what}), "
            f"e.g. {example}"
        )
    return widths


class LeNet(nn.Module):
    """conv 6 -> pool -> conv 16 -> pool -> fc 120 -> fc 84 -> fc 10, norms from the registry.

    Features are channels-first (N, C, H, W) / (N, C): a layer norm normalizes each sample over
    (C, H, W) as in the GN paper. `norm_layer` normalizes the conv layers; `fc_norm` the fc layers:
    "auto" uses `norm_layer` there too,
    except for a norm that needs spatial extent (its class's `spatial` trait: instancenorm), which
    an fc layer lacks — those layers then get no norm. An explicit fc_norm (a norm layer, e.g.
    NoNorm for none) is used as given (one needing spatial extent fails, naming the layer).
    `channels` are the two conv widths, LeNet-5's (6, 16) by default; (16, 32) leaves GroupNorm
    room for 4 groups of at least 4 channels in both conv layers. `pool` is the 2x2 pooling
    after each conv: "avg" (d2l's LeNet) or "max".
    """

    input_shape = (1, 28, 28)

    def __init__(
        self,
        norm_layer: NormLayer,
        fc_norm: NormLayer | Literal["auto"] = "auto",
        activation: str = "sigmoid",
        num_classes: int = 10,
        channels: Sequence[int] = (6, 16),
        pool: str = "avg",
    ):
        super().__init__()
        c1, c2 = conv_widths(channels, 2, "the widths of conv1 and conv2", "[6, 16]")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r}: choose one of {list(ACTIVATIONS)}")
        if pool not in POOLS:
            raise ValueError(f"pool={pool!r}: choose one of {list(POOLS)}")
        if fc_norm == "auto":
            traits = norm_traits(norm_layer)
            fc_norm = NoNorm if traits is not None and traits.spatial else norm_layer
        elif not callable(fc_norm):
            raise ValueError(
                f"fc_norm={fc_norm!r} is neither 'auto' nor a norm layer (a callable width -> "
                "module, as a norm config's partial)"
            )
        act = ACTIVATIONS[activation]
        pooling = POOLS[pool]

        # ----- feature extractor: (B, 1, 28, 28) -> (B, c1, 12, 12) -> (B, c2, 4, 4)
        self.features = nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(1, c1, kernel_size=5),
                norm1=norm_for_layer(norm_layer, c1, "features.norm1", fc=False),
                act1=act(),
                pool1=pooling(2, 2),
                conv2=nn.Conv2d(c1, c2, kernel_size=5),
                norm2=norm_for_layer(norm_layer, c2, "features.norm2", fc=False),
                act2=act(),
                pool2=pooling(2, 2),
            )
        )
        # ----- classifier: (B, c2 * 4 * 4) -> (B, num_classes); act4's output: penultimate feature
        self.classifier = nn.Sequential(
            OrderedDict(
                flatten=nn.Flatten(),
                fc1=nn.Linear(c2 * 4 * 4, 120),
                norm3=norm_for_layer(fc_norm, 120, "classifier.norm3", fc=True),
                act3=act(),
                fc2=nn.Linear(120, 84),
                norm4=norm_for_layer(fc_norm, 84, "classifier.norm4", fc=True),
                act4=act(),
                fc3=nn.Linear(84, num_classes),
            )
        )

    def forward(self, x):
        return self.classifier(self.features(x))  # (B, num_classes)

    def penultimate(self, x):
        """The 84 activations before the last layer (features for fid_lenet)."""
        return self.classifier[:-1](self.features(x))  # (B, 84)
