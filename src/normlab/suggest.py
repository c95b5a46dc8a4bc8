"""Did you mean: an override whose key or choice is a typo of a valid one names the valid one
first, on one line, before Hydra's own message (whose "To append to your config use +key=..."
would add the misspelt key as a new one, which the run then ignores or rejects later):

  $ python train.py norm=groupnorm norm.num_grups=4
  did you mean norm.num_groups=4? (norm.num_grups is not a key of the config)
  Could not override 'norm.num_grups'.
  To append to your config use +norm.num_grups=4
  ...

A key of another choice of its group names that choice (`python train.py norm.num_grups=4`,
with the default norm=batchnorm: `did you mean norm=groupnorm norm.num_groups=4?`), and an
unknown choice the nearest one (`norm=groupnrm`: `did you mean norm=groupnorm?`).

`install()` wraps Hydra's config loader (ConfigLoaderImpl.load_configuration, which composes
the config of a run or of each job of a multirun): when composing fails on an unknown key or
choice, the same exception is raised again with the line in front. No torch here.
"""

from __future__ import annotations

import difflib
import functools
import re
import sys
from pathlib import Path
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

CUTOFF = 0.6  # difflib's similarity a name must reach to be suggested (its default)
_OVERRIDE = re.compile(r"^Could not override '([^']+)'\.")
_MISSING = re.compile(r"Could not find '([^']+)'")
_OPTIONS = re.compile(r"Available options in '([^']+)':\n((?:\t.*\n?)+)")


def closest(name: str, candidates: list[str]) -> str | None:
    """The candidate nearest to `name`, if near enough (difflib's ratio >= CUTOFF), or one
    with the same letters in another order (`nrom`: `norm`)."""
    swapped = [c for c in candidates if sorted(c) == sorted(name)]
    found = swapped or difflib.get_close_matches(name, candidates, n=1, cutoff=CUTOFF)
    return found[0] if found else None


def nearest_key(root: DictConfig, key: str) -> str | None:
    """The dotted key of `root` nearest to `key`, part by part: each part not in its node is
    replaced by the node's nearest key (`key` itself when it is one; None when a part has none
    near)."""
    node: Any = root
    parts = []
    for part in key.split("."):
        if not isinstance(node, DictConfig):
            return None
        keys = [str(k) for k in node.keys()]
        if part not in keys:
            part = closest(part, keys)  # type: ignore[assignment]
            if part is None:
                return None
        parts.append(part)
        node = node._get_node(part)
    return ".".join(parts)


def _value(overrides: list[str], key: str) -> str | None:
    """The value of the override of `key` among the command's overrides."""
    for line in overrides:
        name, sep, value = line.partition("=")
        if sep and name == key:
            return value
    return None


def unknown_key(err: BaseException, overrides: list[str], conf_dir: Path | None) -> str | None:
    """For Hydra's "Could not override 'KEY'": the nearest key of the config, as an override,
    else the key in another choice of its config group (other_choice)."""
    match = _OVERRIDE.match(str(err))
    cause = err.__cause__ or err.__context__
    parent = getattr(cause, "parent_node", None)
    if match is None or not isinstance(parent, DictConfig):
        return None
    key = match.group(1)
    # as typed: a multirun's sweep (norm.num_grups=2,4) rather than its first job's value
    value = _value(sys.argv[1:], key) or _value(overrides, key)
    root: DictConfig = parent._get_root()  # type: ignore[assignment]
    near = nearest_key(root, key)
    if near is not None and near != key:
        typed = near if value is None else f"{near}={value}"
        return f"did you mean {typed}? ({key} is not a key of the config)"
    group, dot, rest = key.partition(".")
    group = group if group in root else closest(group, [str(k) for k in root.keys()]) or group
    return other_choice(conf_dir, group + dot + rest, value) if conf_dir is not None else None


def other_choice(conf_dir: Path, key: str, value: str | None) -> str | None:
    """For GROUP.KEY, not a key of the chosen conf/GROUP/<choice>.yaml: the choices of GROUP
    that have KEY, or the one with a key nearest to it."""
    group, _, rest = key.partition(".")
    folder = conf_dir / group
    if not rest or not folder.is_dir():
        return None
    found = []
    for path in sorted(folder.glob("*.yaml")):
        if "@package" in path.read_text():  # keys elsewhere than under GROUP
            continue
        node = OmegaConf.load(path)
        near = nearest_key(node, rest) if isinstance(node, DictConfig) else None
        if near is not None:
            found.append((path.stem, near))
    exact = [choice for choice, near in found if near == rest]
    typed = "" if value is None else f"={value}"
    if exact:
        choices = " or ".join(f"{group}={choice}" for choice in exact)
        return (
            f"{key} is a key of {choices}, not of the chosen {group}: e.g. "
            f"{group}={exact[0]} {key}{typed}"
        )
    if found:
        choice, near = found[0]
        typed = f"{group}={choice} {group}.{near}{typed}"
        return f"did you mean {typed}? (the chosen {group} has no {rest})"
    return None


def unknown_choice(err: BaseException, overrides: list[str]) -> str | None:
    """For Hydra's "Could not find 'GROUP/NAME'" with its options: the nearest option."""
    missing, options = _MISSING.search(str(err)), _OPTIONS.search(str(err))
    if missing is None or options is None:
        return None
    group, path = options.group(1), missing.group(1)
    names = [line.strip() for line in options.group(2).splitlines() if line.strip()]
    near = closest(path.removeprefix(f"{group}/"), names)
    if near is None:
        return None
    for line in overrides:  # the override that chose it: GROUP=NAME, or a group above it
        key, _, value = line.lstrip("+~").partition("=")
        if f"{key}/{value}" == path:
            choice = f"{group}/{near}".removeprefix(f"{key}/")
            return f"did you mean {key}={choice}? ({group} has no {path.removeprefix(group + '/')})"
    return f"did you mean {group}/{near}? ({group} has no {path.removeprefix(group + '/')})"


def suggestion(
    err: BaseException, overrides: list[str], conf_dir: Path | None = None
) -> str | None:
    """The "did you mean" line for a composition error (conf_dir: where the config groups
    are, for keys of another choice), or None."""
    return unknown_key(err, overrides, conf_dir) or unknown_choice(err, overrides)


def _with_line(err: Exception, line: str) -> Exception:
    """The same exception with `line` in front of its message."""
    message = f"{line}\n{err}"
    if isinstance(err, MissingConfigException):
        return MissingConfigException(message, err.missing_cfg_file, err.options)
    return type(err)(message)


def install(conf_dir: Path | None = None) -> None:
    """Wrap Hydra's config loader so that its composition errors say "did you mean" (once);
    `conf_dir` (train.py's conf/) also finds a key in another choice of its group."""
    load = ConfigLoaderImpl.load_configuration
    if getattr(load, "suggests", False):
        return

    @functools.wraps(load)
    def load_configuration(self: Any, config_name: Any, overrides: list[str], *a: Any, **kw: Any):
        try:
            return load(self, config_name, overrides, *a, **kw)
        except (ConfigCompositionException, MissingConfigException) as err:
            line = suggestion(err, list(overrides), conf_dir)
            if line is None:
                raise
            raise _with_line(err, line) from err.__cause__  # Hydra prints an OmegaConf cause

    load_configuration.suggests = True  # type: ignore[attr-defined]
    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]
