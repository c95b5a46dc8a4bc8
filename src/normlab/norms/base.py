"""What every normlab norm shares: the error type, argument checks, `impl` binding, affine.

The `impl` contract, the same for every family (`Norm.impls` lists a family's):
- `reference`: autograd through the formula, written as the paper writes it; no speed target.
- `fast`: torch's fused kernel (F.layer_norm, F.group_norm, F.batch_norm, F.instance_norm), or
  normlab's own where that is faster (RMSNorm's fused C++ kernel, DyT's DyTFunction); held to
  <= 1.05x the torch.nn layer by scripts/bench.py.
- `manual`: a hand-written backward (BatchNorm's from the BN paper, LayerNorm/GroupNorm/
  InstanceNorm's written-out gradient of the standardization in normlab.norms.standardize,
  RMSNorm's and DyT's autograd Functions); families without one (BatchRenorm, none) refuse it.
All impls of a family compute the same function and agree with torch to fp32 tolerance.

Numerics, the same for every family and impl (fast, reference, manual, the fused RMSNorm kernel
and its pure-torch fallback):
- statistics (mean, variance, mean of squares, the rsqrt) are computed in `stats_dtype(input)`:
  float32 for float16/bfloat16 inputs (as torch's kernels accumulate), the input's own dtype for
  float32/float64 (BatchNorm's manual/sync path sums in float64, and the reference paths of
  BatchNorm, BatchRenorm and InstanceNorm compute in float64: a float32 mean, rounded, is off by
  up to 3e-3 std at mean 1e3 and std 1e-2); the normalization itself runs in that dtype too and
  the output is cast back to the input's dtype. Parameters and running statistics keep their
  own dtype (float32 running statistics stay float32 under a half input).
- eps is added to the variance (the mean of squares for RMSNorm) inside the square root:
  y = (x - mean) / sqrt(var + eps), as torch does. It must be a finite number > 0. RMSNorm's
  eps=None is torch.finfo(stats_dtype(input)).eps, the value torch.nn.RMSNorm's kernel uses
  (float32's 1.19e-7 for a float16/bfloat16 input, not the input dtype's own epsilon).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from normlab.errors import UserError


class NormConfigError(UserError):
    """A norm was asked for with arguments or an input it cannot work with."""


def check_positive_int(family: str, name: str, value: object) -> int:
    """Return `value` if it is an int > 0, else raise NormConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise NormConfigError(f"{family}: {name} must be a positive integer, got {value!r}")
    return value


def check_eps(family: str, eps: float | None, allow_none: bool = False) -> float | None:
    """Return `eps` if it is a finite number > 0 (or None when allowed), else raise
    NormConfigError: eps = 0 divides by zero on a constant input, NaN or inf spoils every output."""
    if eps is None and allow_none:
        return None
    if (
        isinstance(eps, bool)
        or not isinstance(eps, (int, float))
        or not math.isfinite(eps)
        or eps <= 0
    ):
        raise NormConfigError(f"{family}: eps must be a finite number > 0, got {eps!r}")
    return float(eps)


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a norm computes statistics in: float32 for float16/bfloat16, else `dtype`."""
    return torch.promote_types(dtype, torch.float32)


def kernel_affine(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    shape: tuple[int, ...],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The weight and bias to hand torch's F.layer_norm / F.group_norm kernels for input x.

    Unchanged for float32/float64 x. For a float16/bfloat16 x, a float32 weight (ones of `shape`
    when there is none) and bias: the kernels' mixed-type form, which keeps the mean and rstd it
    saves for backward in float32; with half or no parameters torch keeps them in half, and the
    backward's dw and dx carry their rounding.
    """
    acc = stats_dtype(x.dtype)
    if acc == x.dtype:
        return weight, bias
    weight = x.new_ones(shape, dtype=acc) if weight is None else weight.to(acc)
    return weight, None if bias is None else bias.to(acc)


def mean_var(x: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """mean = E[x] and the biased var = E[(x - mean)^2] over `dims` (kept as size-1 dims).

    Two passes, as the formula reads: the variance keeps its precision when the mean is large
    against the spread, where the one-pass E[x^2] - E[x]^2 cancels (a float32 channel of mean
    12 and std 0.1 keeps ~4 digits of it; at mean 1e3 and std 1e-2, none). Pass x in
    `stats_dtype` (a half x would round the statistics to half).
    """
    mean = x.mean(dims, keepdim=True)
    var = (x - mean).pow(2).mean(dims, keepdim=True)
    return mean, var


def standardize(x: torch.Tensor, dims: tuple[int, ...], eps: float) -> torch.Tensor:
    """(x - E[x]) / sqrt(Var[x] + eps) over `dims`, Var the biased variance: the BN, LN and GN
    papers' formula for the reference paths, differentiated by autograd. Pass x in `stats_dtype`."""
    mean, var = mean_var(x, dims)
    return (x - mean) / torch.sqrt(var + eps)


def scale_shift(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """x * scale + shift, with small broadcast scale/shift: one full-size tensor, not two."""
    return (x * scale).add_(shift)  # in place on the product, which backward does not need


def channel_view(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """View a per-channel tensor of shape (C,) as (1, C, 1, ..., 1) for an `ndim`-dim input."""
    return t.view(1, -1, *([1] * (ndim - 2)))


class Norm(nn.Module):
    """Base of every normlab norm: checks `impl` and the layout, binds the impl's method once
    (`_fast`, `_reference`, `_manual`: forward calls it on an input in the family's own
    layout), owns the affine; holds the defaults of the traits a family declares (read by
    `norm_traits`).

    Every family takes torch.nn's factory keywords `device=None, dtype=None` (its parameters
    and buffers are created with them; integer counters keep their dtype), so a normlab class
    is a `norm_layer` for timm's and torchvision's models, which pass them."""

    family: ClassVar[str] = "norm"
    impls: ClassVar[tuple[str, ...]] = ("fast", "reference")
    # where the family's features sit: 1 for (N, C, *) families, -1 for (..., D) families
    natural_channel_dim: ClassVar[int] = 1
    # whether it normalizes its input (False for the `none` placeholder): what norm statistics hook
    normalizes: ClassVar[bool] = True
    # acts on each token over its own features: may sit in a Transformer block, the DiT, the LSTM
    tokenwise: ClassVar[bool] = False
    # needs inputs with spatial extent (dims beyond (N, C)): no place after an fc layer
    spatial: ClassVar[bool] = False
    # the constructor keyword that switches its own affine off (None: it has none to switch)
    affine_key: ClassVar[str | None] = None
    # takes `sync`: batch statistics over all processes
    syncable: ClassVar[bool] = False
    # a (..., D) family whose channels-first layout (N, C, *spatial) is normalized at each
    # position over its C channels (timm's LayerNorm2d), not each sample over (C, *spatial)
    per_position: ClassVar[bool] = False

    def __init__(self, impl: str, channel_dim: int) -> None:
        """`channel_dim`: where the input's features are, 1 for (N, C, *spatial), -1 for
        (..., D) (a family's default is its own, `natural_channel_dim`). A (N, C, *) family given -1
        normalizes the last dim of (B, T, D) as its channels (B and T are its batch/positions);
        a (..., D) family given 1 normalizes each sample over (C, *spatial) with a per-channel
        affine (the GN paper's LayerNorm for conv features), or, declaring `per_position`, each
        position over its C channels (C moved last around the impl)."""
        super().__init__()
        if impl not in self.impls:
            why = " (it has no hand-written backward)" if impl == "manual" else ""
            raise NormConfigError(
                f"{self.family}: impl must be one of {list(self.impls)}, got {impl!r}{why}"
            )
        if channel_dim not in (1, -1) or isinstance(channel_dim, bool):
            raise NormConfigError(
                f"{self.family}: channel_dim must be 1 or -1, got {channel_dim!r}"
            )
        self.impl = impl
        self.channel_dim = channel_dim
        # picked once here, called by forward: one frame between forward and torch's kernel
        self._impl_forward = getattr(self, f"_{impl}")
        # (from, to): the dim moved so that the impl sees its own layout; None: none moved
        self._move: tuple[int, int] | None = None
        if self.per_position and channel_dim == 1:  # (N, C, *spatial): C last, per position
            self._move = (1, -1)
        elif not self.per_position and channel_dim == -1 and self.natural_channel_dim == 1:
            self._move = (-1, 1)  # (..., D): D as the channels
        # a (..., D) impl given (N, C, *spatial) as it is: each sample over (C, *spatial)
        self._whole_sample = channel_dim == 1 and not self.per_position

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        move = self._move
        x = x if move is None else x.movedim(*move)
        self._check_input(x)
        y = self._impl_forward(x)
        return y if move is None else y.movedim(move[1], move[0])

    def _check_input(self, x: torch.Tensor) -> None:
        """Raise NormConfigError if this norm cannot normalise `x`."""

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _manual(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _init_affine(
        self,
        shape: tuple[int, ...],
        weight: bool,
        bias: bool,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Register `weight` (ones) and `bias` (zeros) of `shape`, or None when switched off,
        created on `device` with `dtype` (torch.nn's factory keywords; None: torch's defaults)."""
        factory = {"device": device, "dtype": dtype}
        self.register_parameter(
            "weight", nn.Parameter(torch.ones(shape, **factory)) if weight else None
        )
        self.register_parameter(
            "bias", nn.Parameter(torch.zeros(shape, **factory)) if bias else None
        )

    def reset_parameters(self) -> None:
        """Set the weight to ones and the bias to zeros (the identity affine map)."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _check_channels(self, x: torch.Tensor, num_channels: int, min_dim: int = 2) -> None:
        """Raise unless `x` is (N, C, *) with at least `min_dim` dims and C == num_channels."""
        if x.dim() < min_dim:
            raise NormConfigError(
                f"{self.family} needs an input with at least {min_dim} dims (N, C, ...), "
                f"got input of shape {tuple(x.shape)}"
            )
        if x.shape[1] != num_channels:
            raise NormConfigError(
                f"{self.family} was built for {num_channels} channels (dim 1), "
                f"got input of shape {tuple(x.shape)}"
            )

    def _check_trailing(self, x: torch.Tensor, shape: tuple[int, ...]) -> None:
        """Raise unless the trailing dims of `x` equal `shape`."""
        if tuple(x.shape[x.dim() - len(shape) :]) != shape or x.dim() < len(shape):
            raise NormConfigError(
                f"{self.family} was built for trailing dims {shape}, "
                f"got input of shape {tuple(x.shape)}"
            )
