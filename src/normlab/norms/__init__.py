"""The core package: every normalization layer, built by name through one registry.

A norm of your own joins it with `@register_norm("name")` (see normlab.norms.registry and
examples/my_norm.py) and is then built by `create_norm` like a built-in. A model takes its norm
as `norm_layer`, any callable width -> nn.Module: a norm config's partial of a class
(`_target_: normlab.norms.<Class>`, `_partial_: true`), a class, a function.
"""

from normlab.norms.base import Norm, NormConfigError
from normlab.norms.batchnorm import BatchNorm, BatchNormFunction
from normlab.norms.batchrenorm import BatchRenorm
from normlab.norms.dyt import DyT, DyTFunction
from normlab.norms.fold import fold_batchnorm
from normlab.norms.groupnorm import GroupNorm
from normlab.norms.instancenorm import InstanceNorm
from normlab.norms.layernorm import LayerNorm, LayerNorm2d
from normlab.norms.nonorm import NoNorm
from normlab.norms.registry import (
    NormTraits,
    available_norms,
    build_norm,
    canonical_name,
    class_path,
    create_norm,
    norm_class,
    norm_name,
    norm_partial,
    norm_traits,
    norms_with,
    register_norm,
)
from normlab.norms.rmsnorm import PRMSNorm, RMSNorm, RMSNorm2d, RMSNormFunction

__all__ = [
    "BatchNorm",
    "BatchNormFunction",
    "BatchRenorm",
    "DyT",
    "DyTFunction",
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "LayerNorm2d",
    "NoNorm",
    "Norm",
    "NormConfigError",
    "NormTraits",
    "PRMSNorm",
    "RMSNorm",
    "RMSNorm2d",
    "RMSNormFunction",
    "available_norms",
    "build_norm",
    "canonical_name",
    "class_path",
    "create_norm",
    "fold_batchnorm",
    "norm_class",
    "norm_name",
    "norm_partial",
    "norm_traits",
    "norms_with",
    "register_norm",
]
