"""The core package: every normalization layer, built by name through one registry.

A norm of your own joins it with `@register_norm("name")` (see normlab.norms.registry and
examples/my_norm.py) and is then built by `create_norm` / `norm_from_config` like a built-in;
a model also takes any callable width -> nn.Module as its norm (`NormSpec`).
"""

from normlab.norms.base import Norm, NormConfigError
from normlab.norms.batchnorm import BatchNorm, BatchNormFunction
from normlab.norms.batchrenorm import BatchRenorm
from normlab.norms.dyt import DyT, DyTFunction
from normlab.norms.fold import fold_batchnorm
from normlab.norms.groupnorm import GroupNorm
from normlab.norms.instancenorm import InstanceNorm
from normlab.norms.layernorm import LayerNorm
from normlab.norms.nonorm import NoNorm
from normlab.norms.registry import (
    NormSpec,
    NormTraits,
    available_norms,
    canonical_name,
    create_norm,
    norm_from_config,
    norm_keywords,
    norm_traits,
    norms_with,
    register_norm,
    spec_name,
    spec_traits,
)
from normlab.norms.rmsnorm import PRMSNorm, RMSNorm, RMSNormFunction

__all__ = [
    "BatchNorm",
    "BatchNormFunction",
    "BatchRenorm",
    "DyT",
    "DyTFunction",
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "NoNorm",
    "Norm",
    "NormConfigError",
    "NormSpec",
    "NormTraits",
    "PRMSNorm",
    "RMSNorm",
    "RMSNormFunction",
    "available_norms",
    "canonical_name",
    "create_norm",
    "fold_batchnorm",
    "norm_from_config",
    "norm_keywords",
    "norm_traits",
    "norms_with",
    "register_norm",
    "spec_name",
    "spec_traits",
]
