"""RMSNorm (Zhang & Sennrich, 2019) and partial RMSNorm: no centring, divide by the rms."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from normlab.norms import _fused_rms
from normlab.norms._fused_rms import fused_rms_norm
from normlab.norms.base import Norm, NormConfigError, channel_view, check_eps, stats_dtype
from normlab.norms.layernorm import check_one_feature_dim, trailing_shape
from normlab.norms.registry import register_norm


def _full_rms_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    inv_rms: torch.Tensor,
    needs_grad: tuple[bool, ...],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dx, dw) when the rms uses every feature, on LayerNorm's fused backward kernel.

    With mean 0 and rstd = 1 / rms, LayerNorm's backward is RMSNorm's except for its
    centring term -inv_rms * mean(dy * w), which is added back. For a half x the kernel
    accumulates in float32 and takes the float32 inv_rms only in its mixed-type form, with a
    float32 weight (ones when there is none); the centring sum is float32 too.
    """
    need_x, need_w = needs_grad[0], weight is not None and needs_grad[1]
    acc = inv_rms.dtype
    w = weight
    if x.dtype != acc:
        w = weight.to(acc) if weight is not None else x.new_ones(x.shape[1], dtype=acc)
    dx, dw, _ = torch.ops.aten.native_layer_norm_backward(
        dy,
        x,
        [x.shape[1]],
        torch.zeros_like(inv_rms),
        inv_rms,
        w,
        None,
        [need_x, need_w, False],
    )
    if need_w:
        dw = dw.to(weight.dtype)
    if need_x:  # a sum over D in float32: in half it rounds, and overflows under loss scaling
        mean_dyw = dy.sum(1, dtype=acc) if weight is None else torch.mv(dy.to(acc), w.to(acc))
        dx.add_(mean_dyw.view(-1, 1).mul_(inv_rms).div_(x.shape[1]))
    return dx, dw


class RMSNormFunction(torch.autograd.Function):
    """y = x / rms * w over rows of a (R, D) input, rms from the first k features.

    rms = sqrt(mean(x[:, :k]^2) + eps). Written for CPU memory traffic: no x^2 intermediate
    (the norm comes from `vector_norm`), one full-size allocation in forward and in backward.
    A float16/bfloat16 x: inv_rms in float32 (`stats_dtype`; the squared norm of a half row
    overflows past 65504, e.g. D=4096 at std 4), y = x * inv_rms * w in float32 cast back once,
    and the partial-rms backward on float32 copies of dy and x.
    """

    @staticmethod
    def forward(ctx, x, weight, eps, k):
        acc = stats_dtype(x.dtype)
        sq_norm = torch.linalg.vector_norm(x[:, :k], dim=1, keepdim=True, dtype=acc).square_()
        inv_rms = sq_norm.div_(k).add_(eps).rsqrt_()  # (R, 1)
        y = torch.mul(x, inv_rms)  # in acc: a float32 tensor for a half x
        if weight is not None:
            y.mul_(weight)
        ctx.save_for_backward(x, weight, inv_rms)
        ctx.k = k
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, inv_rms = ctx.saved_tensors
        k = ctx.k
        if k == x.shape[1]:
            dx, dw = _full_rms_backward(dy, x, weight, inv_rms, ctx.needs_input_grad)
            return dx, dw, None, None
        x_dtype, w_dtype = x.dtype, None if weight is None else weight.dtype
        if x.dtype != inv_rms.dtype:  # half: sums and products in float32, copies of dy and x
            dy, x = dy.to(inv_rms.dtype), x.to(inv_rms.dtype)
            weight = None if weight is None else weight.to(inv_rms.dtype)
        # with xhat = x * inv_rms:  dw = sum over rows of dy * xhat
        #   dx = inv_rms * (dy * w - x[:, :k] * inv_rms * sum(dy * w * xhat) / k)
        # (the second term only where x entered the rms). Plain reductions are cheaper here
        # than matrix-vector products, and `buf` is the one full-size allocation, reused for dx.
        buf = torch.mul(dy, x).mul_(inv_rms)  # dy * xhat
        dw = buf.sum(0).to(w_dtype) if weight is not None and ctx.needs_input_grad[1] else None
        if not ctx.needs_input_grad[0]:
            return None, dw, None, None
        if weight is not None:
            buf.mul_(weight)
        coef = buf.sum(1, keepdim=True).mul_(inv_rms).div_(-k)  # (R, 1)
        dx = torch.mul(dy, weight, out=buf) if weight is not None else buf.copy_(dy)
        dx[:, :k].addcmul_(x[:, :k], coef)
        dx.mul_(inv_rms)
        return dx.to(x_dtype), dw, None, None


def fast_kernel(
    device: str, dtype: torch.dtype, weight_dtype: torch.dtype | None, full: bool
) -> str:
    """The kernel of RMSNorm's fast path for rows of `dtype` on `device` (a device type), with a
    weight of `weight_dtype` (None: no weight); `full`: the rms uses every feature (k = D).

    "torch": F.rms_norm, torch's fused kernel on CUDA (it has no partial rms);
    "fused": normlab's C++ op (torch.ops.normlab.fused_rms_norm) on CPU where it is built,
    for a weight of the input's dtype;
    "manual": RMSNormFunction, torch ops with the gradient written out (any device and dtype).
    """
    if device == "cuda" and full:
        return "torch"
    takes_weight = weight_dtype is None or weight_dtype == dtype
    if device == "cpu" and dtype in _fused_rms.DTYPES and takes_weight and _fused_rms.available():
        return "fused"
    return "manual"


def _torch_rms_norm(
    rows: torch.Tensor, weight: torch.Tensor | None, eps: float, k: int
) -> torch.Tensor:
    """torch's F.rms_norm over rows (R, D) whose rms uses every feature (k = D)."""
    return F.rms_norm(rows, (rows.shape[1],), weight, eps)


def _manual_rms_norm(
    rows: torch.Tensor, weight: torch.Tensor | None, eps: float, k: int
) -> torch.Tensor:
    """RMSNormFunction over rows (R, D): torch ops with the gradient written out."""
    return RMSNormFunction.apply(rows, weight, eps, k)


# fast_kernel's choice -> the function RMSNorm's fast path binds: (rows, weight, eps, k) -> y
KERNELS = {"torch": _torch_rms_norm, "fused": fused_rms_norm, "manual": _manual_rms_norm}


@register_norm("rmsnorm", aliases=("rms",))
class RMSNorm(Norm):
    """RMSNorm over the trailing dims `normalized_shape` of (..., *normalized_shape).

    eps=None means the machine epsilon of the dtype the statistics are computed in,
    torch.finfo(stats_dtype(input)).eps: float32's for float16/bfloat16 inputs. That is what
    torch.nn.RMSNorm's kernel does (its docs say the input dtype's, 9.8e-4 for float16, which
    would be 8000x float32's; normlab used that before, and disagreed with torch in half).
    """

    family = "rmsnorm"
    impls = ("fast", "reference", "manual")
    natural_channel_dim = -1
    tokenwise = True
    affine_key = "elementwise_affine"

    def __init__(
        self,
        num_features: int,
        eps: float | None = None,
        elementwise_affine: bool = True,
        normalized_shape: int | Sequence[int] | None = None,
        impl: str = "fast",
        *,
        channel_dim: int = -1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(impl, channel_dim)
        self.normalized_shape = trailing_shape(self.family, num_features, normalized_shape)
        check_one_feature_dim(self)
        self.eps = check_eps(self.family, eps, allow_none=True)
        self.elementwise_affine = elementwise_affine
        self._init_affine(self.normalized_shape, elementwise_affine, False, device, dtype)
        self.num_stat_features = math.prod(self.normalized_shape)  # k: features in the rms
        self._bound_for: tuple[torch.device, torch.dtype] | None = None  # the fast kernel's

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, impl={self.impl!r}"
        )

    def _eps(self, x: torch.Tensor) -> float:
        return torch.finfo(stats_dtype(x.dtype)).eps if self.eps is None else self.eps

    def _check_input(self, x: torch.Tensor) -> None:
        if self._whole_sample:
            self._check_channels(x, self.normalized_shape[0])
        else:
            self._check_trailing(x, self.normalized_shape)

    def _rows(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """x as rows (R, D) holding one statistic each, and (positions per feature, k)."""
        if self._whole_sample:  # one row per sample: (N, C * spatial), channel-major
            spatial = x[0, 0].numel()
            return x.reshape(x.shape[0], -1), spatial, self.num_stat_features * spatial
        d = math.prod(self.normalized_shape)
        return x.reshape(-1, d), 1, self.num_stat_features

    def _row_weight(self, spatial: int) -> torch.Tensor | None:
        """The weight as one gain per entry of a row (per-channel gains repeated per position)."""
        weight = None if self.weight is None else self.weight.reshape(-1)
        if weight is not None and spatial > 1:
            weight = weight.repeat_interleave(spatial)
        return weight

    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        # the kernel bound for this input's device and dtype (`_bind`): one check, no choice
        rows, spatial, k = self._rows(x)
        if self._bound_for != (rows.device, rows.dtype):
            self._bind(rows.device, rows.dtype)
        return self._kernel(rows, self._row_weight(spatial), self._bound_eps, k).view(x.shape)

    def _bind(self, device: torch.device, dtype: torch.dtype) -> None:
        """Pick the fast path's kernel (`fast_kernel`) and eps once for inputs on `device` of
        `dtype`, at the first call: torch's F.rms_norm on CUDA, the fused C++ op on CPU, else
        manual's. Moving or casting the module (`_apply`) unbinds it."""
        w_dtype = None if self.weight is None else self.weight.dtype
        full = self.num_stat_features == math.prod(self.normalized_shape)  # k = D
        kernel = fast_kernel(device.type, dtype, w_dtype, full)
        self._kernel = KERNELS[kernel]
        self._bound_eps = torch.finfo(stats_dtype(dtype)).eps if self.eps is None else self.eps
        self._bound_for = (device, dtype)

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 (nn.Module's signature)
        self._bound_for = None  # .to(), .half(), .cuda(): bind again at the next call
        return super()._apply(fn, recurse)

    def _manual(self, x: torch.Tensor) -> torch.Tensor:
        # RMSNormFunction: torch ops with the gradient written out (any device and dtype)
        rows, spatial, k = self._rows(x)
        return RMSNormFunction.apply(rows, self._row_weight(spatial), self._eps(x), k).view(x.shape)

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        # y = x / sqrt(mean(x[:k]^2) + eps) * weight (the paper's formula); autograd
        rows, _, k = self._rows(x)  # the rms of each row's first k entries
        rows = rows.to(stats_dtype(x.dtype))  # a float32 copy of a half input, else no copy
        rms = torch.sqrt(rows[:, :k].pow(2).mean(-1, keepdim=True) + self._eps(x))
        y = (rows / rms).view(x.shape)
        if self.weight is not None:
            y = y * (channel_view(self.weight, x.dim()) if self._whole_sample else self.weight)
        return y.to(x.dtype)


@register_norm("prmsnorm", aliases=("prms",))
class PRMSNorm(RMSNorm):
    """Partial RMSNorm over (..., D): rms of the first k = ceil(p * D) features divides all.

    The paper's definition (Zhang & Sennrich 2019, Sec. 4, pRMSNorm), the reference here:

        RMS(a) ~ sqrt(1/k * sum_{i=1..k} a_i^2),   k = ceil(n * p)

    the statistic of the first p of the n summed inputs, rounded up. The authors' code
    (bzhangGo/rmsnorm, rmsnorm_torch.py) takes `int(d * p)`, rounded down: the two agree when
    p * D is a whole number (D = 64, 128 at the default p = 0.0625) and differ by one feature
    otherwise (D = 100: 7 here, 6 there); this layer keeps the paper's k.
    """

    family = "prmsnorm"

    def __init__(
        self,
        num_features: int,
        p: float = 0.0625,
        eps: float | None = None,
        elementwise_affine: bool = True,
        impl: str = "fast",
        *,
        channel_dim: int = -1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_features,
            eps,
            elementwise_affine,
            impl=impl,
            channel_dim=channel_dim,
            device=device,
            dtype=dtype,
        )
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise NormConfigError(f"prmsnorm: p must be in (0, 1], got {p!r}")
        self.p = float(p)
        # round p * D to 9 decimals first so that e.g. 0.1 * 30 gives 3, not 4
        self.num_stat_features = math.ceil(round(self.p * num_features, 9))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, p={self.p}, k={self.num_stat_features}"


@register_norm("rmsnorm2d")
class RMSNorm2d(RMSNorm):
    """timm's RmsNorm2d: each position of (N, C, *spatial) divided by the rms of its C channels,
    gain per channel; channel_dim=-1: RMSNorm over the last dim of (..., D).

    Not RMSNorm with channel_dim=1, whose rms is over each sample's (C, *spatial). eps defaults
    to timm's 1e-6.
    """

    family = "rmsnorm2d"
    natural_channel_dim = 1
    per_position = True
    tokenwise = False  # for channels-first conv features; (B, T, D) tokens take the 1d family

    def __init__(
        self,
        num_features: int,
        eps: float | None = 1e-6,
        elementwise_affine: bool = True,
        impl: str = "fast",
        *,
        channel_dim: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_features, eps, elementwise_affine, impl=impl,
            channel_dim=channel_dim, device=device, dtype=dtype,
        )  # fmt: skip
