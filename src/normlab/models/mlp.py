"""The BN paper's MNIST MLP (Ioffe & Szegedy 2015, Sec. 4.1, Fig. 1): a norm after each fc layer."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from torch import nn

from normlab.models.lenet import ACTIVATIONS, norm_for_layer
from normlab.norms.registry import NormLayer


class MLP(nn.Module):
    """fc 100 -> fc 100 -> fc 100 -> fc 10 on flattened images, norms from the registry.

    The BN paper's network: 3 hidden layers of 100 sigmoid units, each fc layer followed by
    BatchNorm (or by nothing, its baseline); `hidden` sets the widths. `init_std` draws every fc
    weight from N(0, init_std^2) with zero biases, the paper's "small random Gaussian values"
    (None: PyTorch's default init). The image is flattened in
    forward, so `layers` holds only fc<i>, norm<i>, act<i> and out. Features are (N, C): a norm
    that needs spatial extent (instancenorm) has nothing to normalize over and fails here.
    """

    input_shape = (1, 28, 28)

    def __init__(
        self,
        norm_layer: NormLayer,
        hidden: Sequence[int] = (100, 100, 100),
        activation: str = "sigmoid",
        num_classes: int = 10,
        init_std: float | None = None,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r}: choose one of {list(ACTIVATIONS)}")
        is_list = isinstance(hidden, Sequence) and not isinstance(hidden, str)
        widths = list(hidden) if is_list else []  # Hydra's ListConfig is a Sequence
        if not widths or not all(
            isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths
        ):
            raise ValueError(
                f"hidden={hidden!r}: need a non-empty list of positive integers "
                "(the hidden widths), e.g. [100, 100, 100]"
            )
        act = ACTIVATIONS[activation]

        # ----- layers: (B, 784) -> (B, hidden[0]) -> ... -> (B, hidden[-1]) -> (B, num_classes)
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        width = 28 * 28
        for i, features in enumerate(widths, start=1):
            layers[f"fc{i}"] = nn.Linear(width, features)  # (B, width) -> (B, features)
            layers[f"norm{i}"] = norm_for_layer(norm_layer, features, f"layers.norm{i}", fc=True)
            layers[f"act{i}"] = act()
            width = features
        layers["out"] = nn.Linear(width, num_classes)  # the last act's output: penultimate feature
        self.layers = nn.Sequential(layers)
        if init_std is not None:
            if not init_std > 0:
                raise ValueError(f"init_std must be a positive number or None, got {init_std!r}")
            for module in self.layers:
                if isinstance(module, nn.Linear):  # the paper's init, the baseline's too
                    nn.init.normal_(module.weight, std=init_std)
                    nn.init.zeros_(module.bias)

    def forward(self, x):
        return self.layers(x.flatten(1))  # (B, 1, 28, 28) -> (B, num_classes)

    def penultimate(self, x):
        """The last hidden layer's activations, before the output layer."""
        return self.layers[:-1](x.flatten(1))  # (B, hidden[-1])
