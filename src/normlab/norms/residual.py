"""Where the norm sits around a residual sublayer F (attention or MLP) of a Transformer block.

    post      x_{l+1} = Norm(x + F(x))                  (Vaswani et al. 2017, "Post-LN")
    pre       x_{l+1} = x + F(Norm(x))                  (Xiong et al. 2020, "Pre-LN"; final norm)
    deepnorm  x_{l+1} = Norm(alpha * x + F(x))          (Wang et al. 2022, DeepNet; beta init)
    sandwich  x_{l+1} = x + Norm(F(Norm(x)))            (Ding et al. 2021, CogView; final norm)
    none      x_{l+1} = x + F(x)                        (no norm anywhere: the ablation)

Only norms that normalise each token over its last dim (layernorm, rmsnorm, prmsnorm, none), or
act on each token alone (dyt: elementwise), can sit in a placement: the families whose class
declares `tokenwise` (normlab.norms.norm_traits), a user's too. BatchNorm, GroupNorm and
InstanceNorm of a (B, T, D) stream would take their statistics across positions (after a
transpose to (B, D, T)), so in a causal language model a token's output would depend on later
tokens: they are rejected with an error naming the norm and the placement rather than supported
through a transpose.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from normlab.errors import ConfigError
from normlab.norms import NormConfigError, build_norm, norm_name, norm_traits, norms_with
from normlab.norms.registry import NormLayer

DEEPNORM_ARCHS = ("encoder", "decoder", "encoder_decoder")


def tokenwise_norm(norm_layer: NormLayer, d_model: int, placement: str) -> nn.Module:
    """Build the configured norm for a (B, T, D) stream; reject norms that mix positions."""
    traits = norm_traits(norm_layer)
    if traits is not None and not traits.tokenwise:
        name = norm_name(norm_layer)
        raise NormConfigError(
            f"norm={name} cannot sit in placement={placement}: a Transformer block normalises "
            f"each token over its {d_model} features, and {name} would take statistics across "
            "positions (future tokens in a causal model). "
            f"Use {', '.join(norms_with('tokenwise'))}"
        )
    return build_norm(norm_layer, d_model, channel_dim=-1)  # (B, T, D): features last


def deepnorm_constants(
    arch: str, N: int | None = None, M: int | None = None, side: str = "encoder"
) -> tuple[float, float]:
    """DeepNet's (alpha, beta) for N encoder / M decoder layers (Wang et al. 2022, Table 1).

    arch: encoder (needs N), decoder (needs M), encoder_decoder (needs N and M; `side` picks
    the encoder's or the decoder's pair).
    """
    key = str(arch).lower().replace("-", "_")
    if key not in DEEPNORM_ARCHS:
        raise ValueError(f"deepnorm arch={arch!r} is not one of {list(DEEPNORM_ARCHS)}")
    need = {"encoder": ("N",), "decoder": ("M",), "encoder_decoder": ("N", "M")}[key]
    for name, value in (("N", N), ("M", M)):
        if name in need and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(
                f"deepnorm arch={key}: {name} must be a positive integer, got {value!r}"
            )
    if key == "encoder":
        return (2 * N) ** 0.25, (8 * N) ** -0.25
    if key == "decoder":
        return (2 * M) ** 0.25, (8 * M) ** -0.25
    if side == "encoder":
        return 0.81 * (N**4 * M) ** (1 / 16), 0.87 * (N**4 * M) ** (-1 / 16)
    if side == "decoder":
        return (3 * M) ** 0.25, (12 * M) ** -0.25
    raise ValueError(
        f"deepnorm arch=encoder_decoder: side must be encoder or decoder, got {side!r}"
    )


# --------------------------------------------------------------------------------------------
# Placements
# --------------------------------------------------------------------------------------------


class Residual(nn.Module):
    """A residual sublayer with its norm(s); subclasses say where the norm sits.

    A placement also owns what it needs from the model around it: the constructor keywords it
    reads from its config for a stack of `depth` blocks (`stack_kwargs`), and the init of its
    branch's value path (`init_branch`), so a model builds every placement the same way.
    """

    name: ClassVar[str]
    needs_final_norm: ClassVar[bool] = False  # the residual stream leaves the last block unnormed
    init_gain: float = 1.0  # xavier gain of the branch's value path (DeepNorm: beta)

    def __init__(self, sublayer: nn.Module, d_model: int, norm_layer: NormLayer) -> None:
        super().__init__()
        self.sublayer = sublayer

    @classmethod
    def stack_kwargs(cls, cfg: Mapping[str, Any], depth: int) -> dict[str, Any]:
        """The keywords (beyond sublayer, d_model, norm_layer) of this placement in every block
        of a stack of `depth` blocks, from its config (`placement=...`); none by default."""
        return {}

    def init_branch(self, value_path: Iterable[nn.Linear]) -> None:
        """Draw the weights of the branch's value path, the linears that carry the size of F(x)
        (attention's value and output projections, the MLP's linears): xavier_normal with gain
        `init_gain` (1: the Post-LN setup every placement shares), in the order given."""
        for linear in value_path:
            nn.init.xavier_normal_(linear.weight, gain=self.init_gain)


class PostNorm(Residual):
    """Post-LN: Norm(x + F(x))."""

    name = "post"

    def __init__(self, sublayer: nn.Module, d_model: int, norm_layer: NormLayer) -> None:
        super().__init__(sublayer, d_model, norm_layer)
        self.norm = tokenwise_norm(norm_layer, d_model, self.name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.sublayer(x))  # (B, T, D)


class PreNorm(Residual):
    """Pre-LN: x + F(Norm(x)); the model adds a final norm after the last block."""

    name = "pre"
    needs_final_norm = True

    def __init__(self, sublayer: nn.Module, d_model: int, norm_layer: NormLayer) -> None:
        super().__init__(sublayer, d_model, norm_layer)
        self.norm = tokenwise_norm(norm_layer, d_model, self.name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.sublayer(self.norm(x))  # (B, T, D)


class DeepNorm(Residual):
    """DeepNorm: Norm(alpha * x + F(x)), F's value path drawn with xavier gain beta.

    DeepNet's Algorithm 1 (Wang et al. 2022): xavier_normal_(w, gain=beta) for the FFN and the
    value and output projections; q and k keep gain 1 (they only shape the attention weights,
    not the magnitude of the branch), so the model draws them itself. `stack_kwargs` gives the
    (alpha, beta) of Table 1 for a stack of `depth` blocks; beta=1 leaves the init unscaled.
    """

    name = "deepnorm"

    def __init__(
        self,
        sublayer: nn.Module,
        d_model: int,
        norm_layer: NormLayer,
        alpha: float,
        beta: float = 1.0,
    ) -> None:
        super().__init__(sublayer, d_model, norm_layer)
        for key, value in (("alpha", alpha), ("beta", beta)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"deepnorm: {key} must be a positive number, got {value!r}")
        self.alpha = float(alpha)
        self.beta = self.init_gain = float(beta)
        self.norm = tokenwise_norm(norm_layer, d_model, self.name)

    @classmethod
    def stack_kwargs(cls, cfg: Mapping[str, Any], depth: int) -> dict[str, Any]:
        """DeepNet's (alpha, beta) for one stack of `depth` blocks: placement.arch is encoder
        (N = depth) or decoder (M = depth, the default: a decoder-only model)."""
        arch = cfg.get("arch", "decoder")
        if arch not in ("encoder", "decoder"):
            raise ConfigError(
                f"placement.arch={arch!r}: one stack of {depth} layers (a decoder-only model) "
                "takes encoder or decoder, not encoder_decoder"
            )
        alpha, beta = deepnorm_constants(arch, N=depth, M=depth)
        return {"alpha": alpha, "beta": beta}

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4g}, beta={self.beta:.4g}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.alpha * x + self.sublayer(x))  # (B, T, D)


class SandwichNorm(Residual):
    """Sandwich-LN: x + Norm_out(F(Norm_in(x))); the model adds a final norm."""

    name = "sandwich"
    needs_final_norm = True

    def __init__(self, sublayer: nn.Module, d_model: int, norm_layer: NormLayer) -> None:
        super().__init__(sublayer, d_model, norm_layer)
        self.norm_in = tokenwise_norm(norm_layer, d_model, self.name)
        self.norm_out = tokenwise_norm(norm_layer, d_model, self.name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm_out(self.sublayer(self.norm_in(x)))  # (B, T, D)


class PlainResidual(Residual):
    """No norm: x + F(x) (the configured norm is ignored)."""

    name = "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.sublayer(x)  # (B, T, D)


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

PLACEMENTS: dict[str, type[Residual]] = {
    cls.name: cls for cls in (PostNorm, PreNorm, DeepNorm, SandwichNorm, PlainResidual)
}


def available_placements() -> list[str]:
    """The placement names `create_residual` knows."""
    return sorted(PLACEMENTS)


def placement_class(placement: str) -> type[Residual]:
    """The Residual class of a placement name (case, `_` and `-` ignored: `Pre` == `pre`)."""
    cls = PLACEMENTS.get(str(placement).lower().replace("_", "").replace("-", ""))
    if cls is None:
        raise ValueError(f"placement={placement!r} is not one of {available_placements()}")
    return cls


def create_residual(
    placement: str,
    sublayer: nn.Module,
    d_model: int,
    norm_layer: NormLayer,
    **kw: Any,
) -> Residual:
    """Wrap `sublayer` in the named placement, norms from `norm_layer` (deepnorm needs alpha=;
    a model gets every keyword of a placement from `placement_class(name).stack_kwargs`)."""
    cls = placement_class(placement)
    try:
        return cls(sublayer, d_model, norm_layer, **kw)
    except TypeError as err:
        raise ValueError(f"placement={cls.name}: bad arguments {sorted(kw)}: {err}") from err
