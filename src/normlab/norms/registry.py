"""Build any norm by name: one argument convention for every family."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from torch import nn

from normlab.norms.base import NoNorm, NormConfigError
from normlab.norms.batchnorm import BatchNorm
from normlab.norms.batchrenorm import BatchRenorm
from normlab.norms.dyt import DyT
from normlab.norms.groupnorm import GroupNorm
from normlab.norms.instancenorm import InstanceNorm
from normlab.norms.layernorm import LayerNorm
from normlab.norms.rmsnorm import PRMSNorm, RMSNorm

_NORMS: dict[str, type[nn.Module]] = {
    "batchnorm": BatchNorm,
    "batchrenorm": BatchRenorm,
    "dyt": DyT,
    "groupnorm": GroupNorm,
    "instancenorm": InstanceNorm,
    "layernorm": LayerNorm,
    "none": NoNorm,
    "prmsnorm": PRMSNorm,
    "rmsnorm": RMSNorm,
}
_ALIASES = {
    "bn": "batchnorm",
    "brn": "batchrenorm",
    "gn": "groupnorm",
    "in": "instancenorm",
    "ln": "layernorm",
    "rms": "rmsnorm",
    "prms": "prmsnorm",
    "identity": "none",
    "dynamictanh": "dyt",
}
# families that normalise over spatial positions, so need inputs with dims beyond (N, C)
_SPATIAL = {"instancenorm"}


def _canonical(name: str) -> str:
    """`Group_Norm`, `group-norm`, `gn` -> `groupnorm`; unknown names raise NormConfigError."""
    if not isinstance(name, str):
        raise NormConfigError(f"norm name must be a string, got {name!r}")
    key = name.lower().replace("_", "").replace("-", "")
    key = _ALIASES.get(key, key)
    if key not in _NORMS:
        raise NormConfigError(
            f"unknown norm {name!r}; valid names: {', '.join(available_norms())} "
            f"(aliases: {', '.join(sorted(_ALIASES))})"
        )
    return key


def available_norms() -> list[str]:
    """The canonical names `create_norm` accepts, sorted."""
    return sorted(_NORMS)


def needs_spatial(name: str) -> bool:
    """Whether the family `name` needs inputs with spatial extent (dims beyond (N, C))."""
    return _canonical(name) in _SPATIAL


def norm_keywords(name: str) -> list[str]:
    """The keyword arguments the family `name` takes (besides num_features and channel_dim)."""
    cls = _NORMS[_canonical(name)]
    return [p for p in inspect.signature(cls).parameters if p != "num_features"]


def create_norm(
    name: str, num_features: int, channel_dim: int | None = None, **kwargs: object
) -> nn.Module:
    """Build the norm `name` for `num_features` channels (dim 1) or trailing features.

    Keyword arguments are the family's own (torch's names: eps, momentum, affine, ...,
    plus impl, sync, p); anything else raises NormConfigError naming the valid ones.
    `channel_dim` (1 or -1) says where the caller's features are when it is not the family's
    own layout (see `Norm.set_channel_dim`); None keeps the family's layout.
    """
    key = _canonical(name)
    cls = _NORMS[key]
    valid = norm_keywords(key)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise NormConfigError(
            f"{key}: unknown argument(s) {', '.join(unknown)}; valid: {', '.join(valid)}"
        )
    norm = cls(num_features, **kwargs)
    return norm if channel_dim is None else norm.set_channel_dim(channel_dim)


def norm_from_config(
    cfg: Mapping[str, object], num_features: int, channel_dim: int | None = None
) -> nn.Module:
    """`create_norm(cfg["name"], num_features, **rest of cfg)`; None values are passed through."""
    if "name" not in cfg:
        raise NormConfigError(f"norm config needs a 'name' key, got keys {sorted(cfg)}")
    kwargs = {str(k): v for k, v in cfg.items() if k != "name"}
    return create_norm(str(cfg["name"]), num_features, channel_dim=channel_dim, **kwargs)
