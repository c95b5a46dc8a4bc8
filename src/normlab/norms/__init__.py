"""The core package: every normalization layer, built by name through one registry."""

from normlab.norms.base import NoNorm, Norm, NormConfigError
from normlab.norms.batchnorm import BatchNorm, BatchNormFunction
from normlab.norms.batchrenorm import BatchRenorm
from normlab.norms.dyt import DyT, DyTFunction
from normlab.norms.fold import fold_batchnorm
from normlab.norms.groupnorm import GroupNorm
from normlab.norms.instancenorm import InstanceNorm
from normlab.norms.layernorm import LayerNorm
from normlab.norms.registry import (
    available_norms,
    create_norm,
    needs_spatial,
    norm_from_config,
    norm_keywords,
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
    "PRMSNorm",
    "RMSNorm",
    "RMSNormFunction",
    "available_norms",
    "create_norm",
    "fold_batchnorm",
    "needs_spatial",
    "norm_from_config",
    "norm_keywords",
]
