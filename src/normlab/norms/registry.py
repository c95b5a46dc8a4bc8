"""Build any norm by name: one registry, one argument convention, traits read from the class.

A family joins the registry with `@register_norm("name", aliases=(...))` (the built-in ones in
their own modules, a user's in theirs: see conf/train.yaml's `plugins`). `create_norm(name,
num_features, ...)` builds it with the number of features first, as every family takes it.
What a model needs to know about a family is read from its class by `norm_traits`: a Norm
declares it once (defaults on `Norm`), a plain nn.Module gets the conservative defaults below.

Models take a norm spec (`NormSpec`): a norm config (the family's name and its keywords, built
by `norm_from_config`) or any callable from a width to a module (a class such as timm's RmsNorm,
a partial, a function), called with the width alone on the layout the model feeds it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from normlab.norms.base import NormConfigError

_NORMS: dict[str, type[nn.Module]] = {}  # canonical name -> class
_ALIASES: dict[str, str] = {}  # alias -> canonical name
M = TypeVar("M", bound=type[nn.Module])
NormSpec = Mapping[str, Any] | Callable[[int], nn.Module]


def _key(name: str) -> str:
    """`Group_Norm`, `group-norm` -> `groupnorm`; a non-string raises NormConfigError."""
    if not isinstance(name, str):
        raise NormConfigError(f"norm name must be a string, got {name!r}")
    return name.lower().replace("_", "").replace("-", "")


def register_norm(
    name: str, aliases: Sequence[str] = (), *, replace: bool = False
) -> Callable[[M], M]:
    """Class decorator: `create_norm(name, ...)` (and each alias) builds this class.

    Names are normalised (case, `_` and `-` ignored). The class takes the number of features as
    its first argument; its other constructor keywords are the norm config's keys. A name or
    alias already taken raises NormConfigError unless `replace=True` (registering the same class
    again is a no-op).
    """
    key, alias_keys = _key(name), [_key(a) for a in aliases]

    def decorator(cls: M) -> M:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise NormConfigError(f"register_norm({name!r}) needs an nn.Module class, got {cls!r}")
        for taken in (key, *alias_keys):
            owner = _NORMS.get(_ALIASES.get(taken, taken))
            if owner is not None and owner is not cls and not replace:
                raise NormConfigError(
                    f"norm name {taken!r} is already registered to "
                    f"{owner.__module__}.{owner.__qualname__}; pick another name or pass "
                    "replace=True"
                )
        _ALIASES.pop(key, None)
        _NORMS[key] = cls
        for alias in alias_keys:
            _NORMS.pop(alias, None)
            _ALIASES[alias] = key
        return cls

    return decorator


def canonical_name(name: str) -> str:
    """`Group_Norm`, `group-norm`, `gn` -> `groupnorm`; unknown names raise NormConfigError."""
    key = _key(name)
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


@dataclass(frozen=True)
class NormTraits:
    """What a model needs to know about a norm family, read from its class (see `Norm`)."""

    tokenwise: bool  # acts on each token over its own features: fits a Transformer block,
    # the DiT and the LSTM, where statistics across positions or samples would leak
    spatial: bool  # needs inputs with spatial extent (dims beyond (N, C)): not after an fc layer
    affine_key: str | None  # the constructor keyword that switches its affine off (adaptive norms)
    syncable: bool  # takes `sync` (batch statistics over all processes)
    channel_dims: tuple[int, ...]  # where its input's features may be: 1 (N, C, *), -1 (..., D)


def norm_traits(norm: str | type[nn.Module]) -> NormTraits:
    """The traits of a registered name or a class. A class declares them as class attributes
    (`Norm` holds the defaults); a plain nn.Module lacking them gets the conservative ones:
    not tokenwise, not spatial, no affine key, no sync, features last unless it declares
    `natural_channel_dim`. A class whose constructor takes `channel_dim` takes either layout."""
    cls = norm if isinstance(norm, type) else _NORMS[canonical_name(norm)]
    takes_layout = "channel_dim" in inspect.signature(cls).parameters
    return NormTraits(
        tokenwise=bool(getattr(cls, "tokenwise", False)),
        spatial=bool(getattr(cls, "spatial", False)),
        affine_key=getattr(cls, "affine_key", None),
        syncable=bool(getattr(cls, "syncable", False)),
        channel_dims=(1, -1) if takes_layout else (getattr(cls, "natural_channel_dim", -1),),
    )


def norms_with(trait: str, value: object = True) -> list[str]:
    """The registered names whose trait `trait` equals `value`, sorted (for error messages)."""
    return [n for n in available_norms() if getattr(norm_traits(n), trait) == value]


def norm_keywords(name: str) -> list[str]:
    """The keyword arguments the family `name` takes (besides its first, the number of features,
    and channel_dim, which the model decides)."""
    params = list(inspect.signature(_NORMS[canonical_name(name)]).parameters)
    return [p for p in params[1:] if p != "channel_dim"]


def create_norm(
    name: str, num_features: int, channel_dim: int | Sequence[int] | None = None, **kwargs: object
) -> nn.Module:
    """Build the norm `name` for `num_features` features.

    Keyword arguments are the family's own (torch's names: eps, momentum, affine, ..., plus impl,
    p, and sync for the families that can sync); anything else raises NormConfigError naming the
    valid ones. `channel_dim` says where the caller's features are: 1 for (N, C, *spatial), -1
    for (..., D), or a tuple of positions that are the same dim (an fc layer's (N, C): (1, -1)),
    the first the family takes being used; it is passed to a constructor that takes it, and a
    family fixed to another layout raises NormConfigError. None: the family's own layout.
    """
    key = canonical_name(name)
    cls, traits = _NORMS[key], norm_traits(key)
    valid = norm_keywords(key)
    if "sync" in kwargs and not traits.syncable:
        raise NormConfigError(
            f"{key}: sync={kwargs['sync']!r} is only supported by "
            f"{', '.join(norms_with('syncable'))}"
        )
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise NormConfigError(
            f"{key}: unknown argument(s) {', '.join(unknown)}; valid: {', '.join(valid)}"
        )
    if channel_dim is not None:
        wanted = (channel_dim,) if isinstance(channel_dim, int) else tuple(channel_dim)
        if not wanted or any(d not in (1, -1) or isinstance(d, bool) for d in wanted):
            raise NormConfigError(f"{key}: channel_dim must be 1 or -1, got {channel_dim!r}")
        fits = [d for d in wanted if d in traits.channel_dims]
        if not fits:
            raise NormConfigError(
                f"{key} takes its features at dim {traits.channel_dims[0]} and these are at dim "
                f"{' / '.join(map(str, wanted))} (declare natural_channel_dim on the class, or "
                "take a channel_dim constructor argument)"
            )
        if len(traits.channel_dims) > 1:
            kwargs["channel_dim"] = fits[0]
    return cls(num_features, **kwargs)


def spec_traits(spec: NormSpec) -> NormTraits | None:
    """What a model can know of a norm spec before building it: a config's family's traits, the
    traits a class declares (`norm_traits`; a normlab `Norm` does), or None: a config without a
    name (`norm_from_config` then names what is missing) or a callable that declares none (a
    plain class such as timm's RmsNorm, a partial, a function). Of those nothing is known: the
    model's checks pass them, and the run's pre-flight forward pass is where a misfit fails."""
    if isinstance(spec, Mapping):
        name = spec.get("name")
        return None if name is None else norm_traits(str(name))
    declares = isinstance(spec, type) and hasattr(spec, "tokenwise")
    return norm_traits(spec) if declares else None


def spec_name(spec: NormSpec) -> str:
    """A norm spec as error messages name it: the config's family, or the callable's name."""
    if isinstance(spec, Mapping):
        return str(spec.get("name"))
    return getattr(spec, "__qualname__", None) or repr(spec)


def norm_from_config(
    cfg: NormSpec,
    num_features: int,
    channel_dim: int | Sequence[int] | None = None,
) -> nn.Module:
    """Build a norm spec for `num_features`: a config as `create_norm(cfg["name"], num_features,
    **rest of cfg)` (None values passed through), a callable as `cfg(num_features)` (it takes
    its input as the model lays it out: `channel_dim` says where, and is not passed)."""
    if not isinstance(cfg, Mapping):
        if not callable(cfg):
            raise NormConfigError(
                f"a norm spec is a config mapping or a callable width -> nn.Module, got {cfg!r}"
            )
        module = cfg(num_features)
        if not isinstance(module, nn.Module):
            raise NormConfigError(f"norm {spec_name(cfg)}({num_features}) gave {module!r}")
        return module
    if "name" not in cfg:
        raise NormConfigError(f"norm config needs a 'name' key, got keys {sorted(cfg)}")
    kwargs = {str(k): v for k, v in cfg.items() if k != "name"}
    return create_norm(str(cfg["name"]), num_features, channel_dim=channel_dim, **kwargs)
