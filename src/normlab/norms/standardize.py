"""The standardize-then-affine formula with its gradient written out: LN/GN/IN's `manual` impl.

    y = (x - mean) / sqrt(var + eps) * w + b = xhat * w + b

with mean and (biased) var over the normalized elements of each statistics group (M of them).
Its gradient, with gy = dL/dy and sums over the statistics group:

    dL/db = sum over the batch of gy            dL/dw = sum over the batch of gy * xhat
    dL/dx = rstd * (gy * w - A / M - xhat * B / M),   A = sum gy * w,   B = sum gy * w * xhat

(the BN paper's backward with the group in place of the batch). Autograd through the formula
(the `reference` impl, normlab.norms.base.standardize) makes 7-9 full-size tensors per forward
+ backward and ran 4-9x torch's fused kernel; written out, the backward makes one (gy * x,
which then holds dL/dx) besides the output, as torch's kernels do. Forward and backward are
checked with torch.autograd.gradcheck in float64 and against torch.nn
(tests/test_norms_properties.py, tests/test_norms_vs_torch.py).

Precision: statistics are float32 for a float16/bfloat16 x (`stats_dtype`), and so is the
normalization x * scale + shift (with x ~ 100 and std ~ 5, scale and shift rounded to float16 would
cost ~1e-2 of the output) and the backward (on float32 copies of x and gy); outputs and gradients
are cast back to the dtype of x and of the parameters. float32 and float64 inputs take the
same ops as before, with no extra full-size tensor.

Two layouts, by where the affine sits relative to the statistics:
- GroupStandardize: x viewed as (N, G, K, S), statistics per (n, g) over (K, S), affine per
  channel (g, k): GroupNorm, LayerNorm over (C, *spatial) (G = 1) and InstanceNorm (G = C,
  K = 1).
- RowStandardize: x viewed as (R, D), statistics per row, affine per column: LayerNorm over the
  trailing dims.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from normlab.norms.base import stats_dtype


def _stats(x: torch.Tensor, dims: tuple[int, ...], eps: float) -> tuple[torch.Tensor, ...]:
    """mean and rstd = 1 / sqrt(E[x^2] - E[x]^2 + eps) over `dims`, kept as size-1 dims.

    Two reads of x and no full-size temporary (sum of squares by vector_norm); at least float32
    (as torch's kernels accumulate half and bfloat16); the clamp keeps rounding from giving a
    variance below 0.
    """
    acc = stats_dtype(x.dtype)
    m = math.prod(x.shape[d] for d in dims)
    mean = x.sum(dims, keepdim=True, dtype=acc).div_(m)
    sq = torch.linalg.vector_norm(x, 2, dims, keepdim=True, dtype=acc).square_().div_(m)
    var = sq.sub_(mean * mean).clamp_min_(0.0)
    return mean, var.add_(eps).rsqrt_()


def _scale_shift(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """x * scale + shift with small broadcast scale/shift in the statistics dtype.

    In one pass when x has that dtype; a half x is computed as a float32 copy (the result in
    float32; the caller casts back), so that scale and shift are not rounded to half.
    """
    if x.dtype == scale.dtype:
        return torch.addcmul(shift, x, scale)
    return x.to(scale.dtype).mul_(scale).add_(shift)


def _upcast_saved(gy: torch.Tensor, x: torch.Tensor, acc: torch.dtype) -> tuple[torch.Tensor, ...]:
    """gy and x in the statistics dtype `acc` for the backward: copies only for a half input."""
    return gy.to(acc), x.to(acc)


def _input_grad_terms(
    a: torch.Tensor, b_sum: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """dL/dx = rstd * (gy * w + c1 + c2 * x): the per-group c1, c2 from A and B (module docstring).

    -A / M - xhat * B / M with xhat = (x - mean) * rstd is c1 + c2 * x for c2 = -rstd B / M and
    c1 = -A / M - c2 * mean.
    """
    c2 = (rstd * b_sum).div_(-m)
    c1 = (a / -m).sub_(c2 * mean)
    return c1, c2


class GroupStandardize(torch.autograd.Function):
    """y = xhat * w + b for x of shape (N, G, K, S): statistics per (n, g); w, b of shape (G*K,)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        _, g, k, _ = x.shape
        mean, rstd = _stats(x, (2, 3), eps)  # (N, G, 1, 1)
        w = None if weight is None else weight.view(1, g, k, 1)
        # xhat * w + b as x * scale + shift with per-(n, channel) scale and shift: one pass
        scale = rstd if w is None else rstd * w
        shift = -mean * scale
        if bias is not None:
            shift = shift.add_(bias.view(1, g, k, 1))
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return _scale_shift(x, scale.to(rstd.dtype), shift.to(rstd.dtype)).to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, w, mean, rstd = ctx.saved_tensors
        x_dtype, w_dtype = x.dtype, None if w is None else w.dtype
        gy, x = _upcast_saved(gy, x, rstd.dtype)
        w = None if w is None else w.to(rstd.dtype)
        _, _, k, s = x.shape
        gx = gy * x  # its buffer is reused for dL/dx below
        g1 = gy.sum(3, keepdim=True, dtype=rstd.dtype)  # per (n, channel): sum gy, sum gy * x
        g2 = gx.sum(3, keepdim=True, dtype=rstd.dtype)
        grad_w = grad_b = None
        if ctx.needs_input_grad[1]:  # sum over n of (sum gy * xhat)
            grad_w = (g2 - mean * g1).mul_(rstd).sum(0).flatten().to(w_dtype)
        if ctx.needs_input_grad[2]:
            grad_b = g1.sum(0).flatten().to(ctx.bias_dtype)
        if w is not None:
            g1, g2 = g1 * w, g2 * w
        a = g1.sum(2, keepdim=True)  # A = sum gy * w;  B = sum gy * w * xhat
        b_sum = g2.sum(2, keepdim=True).sub_(mean * a).mul_(rstd)
        c1, c2 = _input_grad_terms(a, b_sum, mean, rstd, k * s)
        # rstd * (gy * w + c1 + c2 * x) with rstd folded into the per-(n, channel) factors
        scale = rstd if w is None else rstd * w
        grad_x = torch.addcmul((rstd * c1).to(x.dtype), x, (rstd * c2).to(x.dtype), out=gx)
        grad_x = grad_x.addcmul_(gy, scale.to(x.dtype))
        return grad_x.to(x_dtype), grad_w, grad_b, None


class RowStandardize(torch.autograd.Function):
    """y = xhat * w + b for x of shape (R, D): statistics per row, w and b of shape (D,)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        mean, rstd = _stats(x, (1,), eps)  # (R, 1)
        y = _scale_shift(x, rstd, -mean * rstd)  # xhat, in rstd's dtype
        if weight is not None and bias is not None:
            torch.addcmul(bias, y, weight, out=y)  # in place: xhat is not kept
        elif weight is not None:
            y.mul_(weight)
        elif bias is not None:
            y.add_(bias)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, w, mean, rstd = ctx.saved_tensors
        x_dtype, w_dtype = x.dtype, None if w is None else w.dtype
        gy, x = _upcast_saved(gy, x, rstd.dtype)
        w = None if w is None else w.to(rstd.dtype)
        gx = gy * x  # its buffer is reused for dL/dx below
        # per-row sums of gy * w and gy * w * x as matrix-vector products: reads, no temporaries
        a = (gy.sum(1) if w is None else torch.mv(gy, w)).unsqueeze(1).to(rstd.dtype)
        b_sum = (gx.sum(1) if w is None else torch.mv(gx, w)).unsqueeze(1).to(rstd.dtype)
        b_sum = b_sum.sub_(mean * a).mul_(rstd)  # B = sum gy * w * xhat
        grad_w = grad_b = None
        if ctx.needs_input_grad[1]:  # sum over rows of gy * (x - mean) * rstd
            r, mr = rstd.squeeze(1).to(x.dtype), (mean * rstd).squeeze(1).to(x.dtype)
            grad_w = (torch.mv(gx.t(), r) - torch.mv(gy.t(), mr)).to(w_dtype)
        if ctx.needs_input_grad[2]:
            grad_b = gy.sum(0).to(ctx.bias_dtype)
        c1, c2 = _input_grad_terms(a, b_sum, mean, rstd, x.shape[1])
        # rstd * (gy * w + c1 + c2 * x): one buffer, three passes
        grad_x = torch.addcmul(c1.to(x.dtype), x, c2.to(x.dtype), out=gx)
        grad_x = grad_x.add_(gy) if w is None else grad_x.addcmul_(gy, w)
        return grad_x.mul_(rstd.to(x.dtype)).to(x_dtype), grad_w, grad_b, None
