"""Dynamic Tanh (Zhu, Chen, He, LeCun & Liu 2025, "Transformers without Normalization").

    DyT(x) = gamma * tanh(alpha * x) + beta

A drop-in replacement for a norm layer that computes no statistics: alpha is one learnable
scalar (init `alpha0`, the paper's default 0.5), gamma (ones) and beta (zeros) are per feature.
Each element is squashed on its own, so a token's output depends on that token only: it can sit
wherever LayerNorm sits (every residual placement, adaLN's base norm). No eps: nothing is divided.

Numerics as the other families (see normlab.norms.base): a float16/bfloat16 input is computed in
float32 (`stats_dtype`; tanh's backward 1 - tanh^2 cancels badly in half near saturation) and the
output cast back to the input's dtype; parameters keep their own dtype.

The parameters are named as in the paper's code (alpha of shape (1,), weight, bias), so its
checkpoints load.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from normlab.norms.base import Norm, NormConfigError, channel_view, check_positive_int, stats_dtype
from normlab.norms.registry import register_norm


class DyTFunction(torch.autograd.Function):
    """y = weight * tanh(alpha * x) + bias with a hand-written backward: fewer full-size tensors
    than autograd of the formula (for a float32 x, 2 allocated in forward instead of 4 and 2 in
    backward instead of 5), which is what an elementwise layer costs on a CPU.

    weight and bias (either may be None) come already shaped to broadcast against x; alpha has
    shape (1,). With t = tanh(alpha * x) and g = dy * weight * (1 - t^2) = dL/d(alpha * x):
        dx = alpha * g,   dalpha = sum(x * g),   dweight = sum(dy * t),   dbias = sum(dy)
    (the parameters' sums over every dim they are broadcast along).
    """

    @staticmethod
    def forward(ctx, x, alpha, weight, bias):
        acc = stats_dtype(x.dtype)
        t = torch.mul(x.to(acc), alpha.to(acc)).tanh_()  # (..., D) in acc
        if weight is None:
            y = t.clone() if bias is None else torch.add(t, bias.to(acc))
        elif bias is None:
            y = torch.mul(t, weight.to(acc))
        else:
            y = torch.addcmul(bias.to(acc), t, weight.to(acc))
        ctx.save_for_backward(x, alpha, weight, t)
        ctx.bias_shape = None if bias is None else bias.shape
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, alpha, weight, t = ctx.saved_tensors
        need_x, need_alpha, need_w, need_b = ctx.needs_input_grad
        acc = t.dtype
        dy = dy.to(acc)
        dw = db = dx = dalpha = None
        if need_b:
            db = dy.sum_to_size(ctx.bias_shape).to(ctx.bias_dtype)
        if need_w:
            dw = torch.mul(dy, t).sum_to_size(weight.shape).to(weight.dtype)
        if not (need_x or need_alpha):
            return dx, dalpha, dw, db
        g = torch.mul(t, t).neg_().add_(1)  # 1 - t^2
        g.mul_(dy)
        if weight is not None:
            g.mul_(weight.to(acc))
        if need_alpha:
            dalpha = torch.dot(g.reshape(-1), x.to(acc).reshape(-1)).reshape(alpha.shape)
            dalpha = dalpha.to(alpha.dtype)
        if need_x:
            dx = g.mul_(alpha.to(acc)).to(x.dtype)
        return dx, dalpha, dw, db


@register_norm("dyt", aliases=("dynamictanh",))
class DyT(Norm):
    """DyT(x) = weight * tanh(alpha * x) + bias over the features of (..., D) (or (N, C, *)
    with channel_dim=1: per-channel weight and bias, as LayerNorm's conv layout).

    alpha0: alpha's initial value (a finite number > 0; the paper's 0.5, which it finds best
    for non-LLM models). elementwise_affine=False drops weight and bias, bias=False only the
    bias (LayerNorm's keywords); alpha is always learned. impl: `fast` and `manual` both run
    DyTFunction, a hand-written backward (~1.5x autograd's speed on CPU; torch has no fused DyT
    kernel), `reference` the formula with autograd.
    """

    family = "dyt"
    impls = ("fast", "reference", "manual")
    natural_channel_dim = -1
    normalizes = True  # no statistics, but it stands where a norm does: norm_stats hooks it
    tokenwise = True  # elementwise: each token's output depends on that token only
    affine_key = "elementwise_affine"  # weight and bias off; alpha stays

    def __init__(
        self,
        num_features: int,
        alpha0: float = 0.5,
        elementwise_affine: bool = True,
        bias: bool = True,
        impl: str = "fast",
        *,
        channel_dim: int = -1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(impl, channel_dim)
        self.num_features = check_positive_int(self.family, "num_features", num_features)
        if (
            isinstance(alpha0, bool)
            or not isinstance(alpha0, (int, float))
            or not math.isfinite(alpha0)
            or alpha0 <= 0
        ):
            raise NormConfigError(
                f"{self.family}: alpha0 must be a finite number > 0, got {alpha0!r}"
            )
        self.alpha0 = float(alpha0)
        self.elementwise_affine = elementwise_affine
        self.alpha = nn.Parameter(torch.full((1,), self.alpha0, device=device, dtype=dtype))
        self._init_affine(
            (num_features,), elementwise_affine, elementwise_affine and bias, device, dtype
        )

    def reset_parameters(self) -> None:
        """alpha = alpha0, weight ones, bias zeros."""
        nn.init.constant_(self.alpha, self.alpha0)
        super().reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, alpha0={self.alpha0}, "
            f"elementwise_affine={self.elementwise_affine}, impl={self.impl!r}"
        )

    def _check_input(self, x: torch.Tensor) -> None:
        if self.channel_dim == 1:
            self._check_channels(x, self.num_features)
        else:
            self._check_trailing(x, (self.num_features,))

    def _affine(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """weight and bias shaped to broadcast against x: (D,) for (..., D), (1, C, 1, ...)."""
        if self.channel_dim == -1:
            return self.weight, self.bias
        view = [None if t is None else channel_view(t, x.dim()) for t in (self.weight, self.bias)]
        return view[0], view[1]

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self._affine(x)
        return DyTFunction.apply(x, self.alpha, weight, bias)

    def _manual(self, x: torch.Tensor) -> torch.Tensor:
        return self._fast(x)  # DyTFunction is the hand-written backward

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self._affine(x)
        acc = stats_dtype(x.dtype)  # float32 for a half input
        y = torch.tanh(self.alpha.to(acc) * x.to(acc))
        if weight is not None:
            y = y * weight.to(acc)
        if bias is not None:
            y = y + bias.to(acc)
        return y.to(x.dtype)
