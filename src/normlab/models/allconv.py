"""A small all-conv network in three stages at 28, 14 and 7 pixels, a norm after every conv.

The network in which the GN paper's account of BN at small batches can act: BN's statistics
over few values per channel in the late, low-resolution stages, stacked over several norm
layers. At 2 images per device its last stage's norms average 2 x 7 x 7 = 98 values per
channel, as ResNet-50's res5 (7 x 7 at 224 pixels) does at 2 images per GPU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from torch import nn

from normlab.models.lenet import conv_widths, norm_for_layer
from normlab.norms.registry import NormLayer

CONVS_PER_STAGE = 2


class AllConvNet(nn.Module):
    """3 stages of 2 x (conv3x3 -> norm -> relu), 2x2 max pool between stages, global average
    pool, fc to the classes; norms from the registry.

    On (N, 1, 28, 28): stage 1 at 28x28 (`channels[0]`), stage 2 at 14x14, stage 3 at 7x7, so the
    six norms see 28, 28, 14, 14, 7, 7 pixels. Every conv is 3x3 with padding 1, without a bias
    when its norm normalizes (the norm's shift replaces it; with norm=none the convs keep
    theirs). Widths (16, 32, 64) double as the resolution halves, as in ResNets, and leave
    GroupNorm 4 groups of 4, 8 and 16 channels. Downsampling is a 2x2 max pool, so every conv
    and its norm stay at one resolution. Convs are initialized as torchvision's ResNets do
    (Kaiming normal, fan_out, relu); the fc layer and the norms keep their defaults.
    """

    input_shape = (1, 28, 28)

    def __init__(
        self,
        norm_layer: NormLayer,
        channels: Sequence[int] = (16, 32, 64),
        num_classes: int = 10,
    ):
        super().__init__()
        widths = conv_widths(
            channels, 3, "the widths of the stages at 28, 14 and 7 pixels", "[16, 32, 64]"
        )
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes={num_classes!r}: need a positive integer")

        # ----- features: (B, 1, 28, 28) -> (B, c1, 28, 28) -> (B, c2, 14, 14) -> (B, c3, 7, 7)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        width, k = 1, 0
        for stage, features in enumerate(widths, start=1):
            if stage > 1:
                layers[f"pool{stage - 1}"] = nn.MaxPool2d(2, 2)
            for _ in range(CONVS_PER_STAGE):
                k += 1
                norm = norm_for_layer(norm_layer, features, f"features.norm{k}", fc=False)
                bias = not getattr(norm, "normalizes", True)
                layers[f"conv{k}"] = nn.Conv2d(width, features, 3, padding=1, bias=bias)
                layers[f"norm{k}"] = norm
                layers[f"act{k}"] = nn.ReLU()
                width = features
        self.features = nn.Sequential(layers)
        # ----- head: global average pool, (B, c3) -> (B, num_classes)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)
        for module in self.features:
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        return self.fc(self.penultimate(x))  # (B, num_classes)

    def penultimate(self, x):
        """The globally pooled last-stage features, before the fc layer."""
        return self.pool(self.features(x)).flatten(1)  # (B, channels[-1])
