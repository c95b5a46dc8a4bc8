"""Build any norm by name or from a partial: one registry, one argument convention, traits read
from the class.

A family joins the registry with `@register_norm("name", aliases=(...))` (the built-in ones in
their own modules, a user's in theirs: see conf/train.yaml's `plugins`). Models take a norm
layer: a callable from the width to a module, called with the width (timm's `norm_layer`):
a norm config is `_target_: normlab.norms.<Class>` with `_partial_: true` and its keywords, which
Hydra makes a `functools.partial` of the class. `build_norm(norm_layer, width, channel_dim)` is
how a model calls it: the keywords of a normlab-known class checked, its layout matched.
`create_norm(name, num_features, ...)` builds a registered name with the number of features
first, as every family takes it. What a model needs to know about a norm is read from its class
by `norm_traits` (a partial's `func`): a Norm declares it once (defaults on `Norm`), a
registered plain nn.Module gets the conservative defaults below.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from normlab.norms.base import NormConfigError

_NORMS: dict[str, type[nn.Module]] = {}  # canonical name -> class
_ALIASES: dict[str, str] = {}  # alias -> canonical name
M = TypeVar("M", bound=type[nn.Module])
NormLayer = Callable[[int], nn.Module]  # a model's norm: called with the width (timm's norm_layer)


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


def norm_class(norm: Any) -> type | None:
    """The class a norm is an instance of: a registered name's, a class itself, a partial's
    `func` (however nested); None for another callable (a function, a lambda)."""
    if isinstance(norm, str):
        return _NORMS[canonical_name(norm)]
    while isinstance(norm, functools.partial):
        norm = norm.func
    return norm if isinstance(norm, type) else None


def norm_name(norm: Any) -> str:
    """A norm as configs and messages name it: the registered name of its class, else the
    class's or the callable's own name."""
    cls = norm_class(norm)
    known = [name for name, registered in _NORMS.items() if registered is cls]
    if known:
        return known[0]
    return getattr(cls or norm, "__qualname__", None) or repr(norm)


def norm_traits(norm: Any) -> NormTraits | None:
    """The traits of a registered name, a class or a partial of one, read from the class: it
    declares them as class attributes (`Norm` holds the defaults); a registered plain nn.Module
    lacking them gets the conservative ones: not tokenwise, not spatial, no affine key, no sync,
    features last unless it declares `natural_channel_dim`. A class whose constructor takes
    `channel_dim` takes either layout. None: a class neither registered nor declaring traits
    (timm's RmsNorm), or a function: nothing is known, the models' checks pass it, and the
    run's pre-flight forward pass is where a misfit fails."""
    cls = norm_class(norm)
    registered = cls is not None and cls in _NORMS.values()
    if cls is None or not (registered or hasattr(cls, "tokenwise")):
        return None
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


def _check_keywords(cls: type, name: str, traits: NormTraits, kwargs: dict[str, Any]) -> None:
    """Raise NormConfigError for a keyword the class does not take (naming the valid ones: its
    constructor's but the first, the number of features, and channel_dim, the model's)."""
    params = list(inspect.signature(cls).parameters)
    valid = [p for p in params[1:] if p != "channel_dim"]
    if "sync" in kwargs and not traits.syncable:
        raise NormConfigError(
            f"{name}: sync={kwargs['sync']!r} is only supported by "
            f"{', '.join(norms_with('syncable'))}"
        )
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise NormConfigError(
            f"{name}: unknown argument(s) {', '.join(unknown)}; valid: {', '.join(valid)}"
        )


def _layout(name: str, traits: NormTraits, channel_dim: int | Sequence[int]) -> dict[str, int]:
    """The channel_dim keyword for a model's layout (none for a family of one layout), or
    NormConfigError when the family cannot take it."""
    wanted = (channel_dim,) if isinstance(channel_dim, int) else tuple(channel_dim)
    if not wanted or any(d not in (1, -1) or isinstance(d, bool) for d in wanted):
        raise NormConfigError(f"{name}: channel_dim must be 1 or -1, got {channel_dim!r}")
    fits = [d for d in wanted if d in traits.channel_dims]
    if not fits:
        raise NormConfigError(
            f"{name} takes its features at dim {traits.channel_dims[0]} and these are at dim "
            f"{' / '.join(map(str, wanted))} (declare natural_channel_dim on the class, or "
            "take a channel_dim constructor argument)"
        )
    return {"channel_dim": fits[0]} if len(traits.channel_dims) > 1 else {}


def _keywords(norm_layer: Any) -> dict[str, Any]:
    """The keywords a (possibly nested) partial passes its class, the outer ones last."""
    if not isinstance(norm_layer, functools.partial):
        return {}
    return {**_keywords(norm_layer.func), **norm_layer.keywords}


def build_norm(
    norm_layer: Callable[..., nn.Module],
    num_features: int,
    channel_dim: int | Sequence[int] | None = None,
) -> nn.Module:
    """`norm_layer(num_features)`, the norm a model puts on `num_features` features.

    Of a class with traits (`norm_traits`; a partial of one, as a norm config makes), the
    keywords are checked (NormConfigError naming the valid ones) and `channel_dim` says where
    the model's features are: 1 for (N, C, *spatial), -1 for (..., D), or a tuple of positions
    that are the same dim (an fc layer's (N, C): (1, -1)), the first the family takes being
    passed to a constructor that takes it; a family fixed to another layout raises. Any other
    callable takes its input as the model lays it out and is called with the width alone.
    """
    if not callable(norm_layer):
        raise NormConfigError(
            f"a norm layer is a callable width -> nn.Module (a class, a partial), "
            f"got {norm_layer!r}"
        )
    traits, layout = norm_traits(norm_layer), {}
    if traits is not None:
        name = norm_name(norm_layer)
        _check_keywords(norm_class(norm_layer), name, traits, _keywords(norm_layer))
        layout = {} if channel_dim is None else _layout(name, traits, channel_dim)
    module = norm_layer(num_features, **layout)
    if not isinstance(module, nn.Module):
        raise NormConfigError(f"norm {norm_name(norm_layer)}({num_features}) gave {module!r}")
    return module


def class_path(name: str) -> str:
    """The import path of the class registered as `name` (case, `_` and `-` ignored), or `name`
    itself when it is a class path, not a registered name: what a norm config's `_target_`
    holds (conf/norm/custom.yaml, through the config's `normlab.norm` resolver)."""
    if "." in name and _key(name) not in _NORMS and _key(name) not in _ALIASES:
        return name
    cls = norm_class(name)
    return f"{cls.__module__}.{cls.__qualname__}"


def norm_partial(name: str, **kwargs: Any) -> functools.partial:
    """functools.partial(the class registered as `name`, or at the class path `name`,
    **kwargs), its keywords checked: the norm layer a norm config of that class makes."""
    path = class_path(name)
    if path == name and "." in name:  # a class path: imported
        module, _, attr = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise NormConfigError(f"norm {name!r}: cannot import it: {err}") from None
    else:
        cls = norm_class(name)
    layer = functools.partial(cls, **kwargs)
    traits = norm_traits(layer)
    if traits is not None:
        _check_keywords(cls, norm_name(cls), traits, kwargs)
    return layer


def create_norm(
    name: str, num_features: int, channel_dim: int | Sequence[int] | None = None, **kwargs: object
) -> nn.Module:
    """Build the registered norm `name` for `num_features` features: `build_norm` of
    functools.partial(its class, **kwargs). Keyword arguments are the family's own (torch's
    names: eps, momentum, affine, ..., plus impl, p, and sync for the families that can sync);
    anything else raises NormConfigError naming the valid ones. None `channel_dim`: the
    family's own layout."""
    return build_norm(functools.partial(norm_class(name), **kwargs), num_features, channel_dim)
