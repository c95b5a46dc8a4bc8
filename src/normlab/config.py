"""OmegaConf resolvers used by conf/ and checks of the composed config before any work starts."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import math
import os
import re
import secrets
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from normlab.errors import ConfigError, UserError

PROGRESS = ("bar", "epoch", "none")  # what a run shows while it trains (conf/train.yaml)
# conf/model/<name>.yaml -> the conf/data/<name>.yaml it trains on (images or characters)
MODEL_DATA = {
    "lenet": ("fashion_mnist",),
    "mlp": ("fashion_mnist",),
    "allconv": ("fashion_mnist",),
    "dit": ("fashion_mnist",),
    "transformer": ("shakespeare",),
    "lstm": ("shakespeare",),
}
DEFAULT_PLACEMENT = "pre"  # conf/train.yaml's placement; a model reads it when its config
# interpolates ${placement} (the Transformer's residual blocks)


def _uid() -> str:
    # Cached per config (use_cache), so one run's dirs agree; distinct across processes.
    return f"{os.getpid() % 100000:05d}{secrets.token_hex(2)}"


def _slug(text: str, limit: int = 80) -> str:
    """A file name for a job's overrides. When it had to be cut or changed, a hash of the whole
    text follows, so two jobs whose overrides differ only past the cut never share a dir."""
    text = str(text)
    slug = re.sub(r"[^A-Za-z0-9=.,_+-]+", "_", text).strip("_")
    if slug == text and len(slug) <= limit:
        return slug or "default"
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return f"{slug[: limit - 9]}-{digest}"


def _norm_name(key: str, _root_: DictConfig) -> str:
    """The short name of the norm config at `key`: the name its class is registered under
    (norm=dyt: dyt; a plugin's: its own), else the class's name."""
    from normlab.norms import norm_name, norm_partial  # lazy: torch loads only when a config asks

    return norm_name(norm_partial(str(OmegaConf.select(_root_, key)._target_)))


def _norm_target(name: str, _root_: DictConfig) -> str:
    """`${normlab.norm:NAME}`: the class path of the norm registered as NAME (a plugin's: the
    config's `plugins` are imported first), or NAME itself when it is a class path: a norm
    config's `_target_` (norm=custom 'norm._target_=${normlab.norm:meanonly}')."""
    from normlab.norms import class_path  # lazy: torch loads only when a config asks

    import_plugins(_root_)
    return class_path(str(name))


def register_resolvers() -> None:
    """Register normlab's resolvers once (safe to call repeatedly)."""
    if not OmegaConf.has_resolver("normlab.uid"):
        OmegaConf.register_new_resolver("normlab.uid", _uid, use_cache=True)
    if not OmegaConf.has_resolver("normlab.slug"):
        OmegaConf.register_new_resolver("normlab.slug", _slug)
    if not OmegaConf.has_resolver("normlab.mul"):  # batch = devices x per-device batch
        OmegaConf.register_new_resolver("normlab.mul", lambda a, b: a * b)
    if not OmegaConf.has_resolver("normlab.div"):  # linear lr scaling: lr x batch / 256
        OmegaConf.register_new_resolver("normlab.div", lambda a, b: a / b)
    if not OmegaConf.has_resolver("normlab.floordiv"):  # warmup steps = warmup images // batch
        OmegaConf.register_new_resolver("normlab.floordiv", lambda a, b: a // b)
    if not OmegaConf.has_resolver("normlab.norm_name"):  # an arm: ${normlab.norm_name:norm}
        OmegaConf.register_new_resolver("normlab.norm_name", _norm_name)
    if not OmegaConf.has_resolver("normlab.norm"):  # a registered name -> its class path
        OmegaConf.register_new_resolver("normlab.norm", _norm_target)
    if not OmegaConf.has_resolver("normlab.ddp_backend"):
        OmegaConf.register_new_resolver(
            "normlab.ddp_backend", lambda acc: "nccl" if acc in ("gpu", "cuda") else "gloo"
        )


register_resolvers()


def _positive_int(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")


def _non_finite(node: DictConfig | ListConfig, prefix: str = "") -> tuple[str, float] | None:
    """The first float anywhere under node that is NaN or inf, with its dotted key."""
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        name = f"{prefix}{key}" if isinstance(node, DictConfig) else f"{prefix.rstrip('.')}[{key}]"
        try:
            value = node[key]
        except Exception:  # missing, or an interpolation only a run resolves: checked where used
            continue
        if isinstance(value, (DictConfig, ListConfig)):
            found = _non_finite(value, f"{name}.")
            if found is not None:
                return found
        elif isinstance(value, float) and not math.isfinite(value):
            return name, value
    return None


def _choices() -> dict[str, str]:
    """Hydra's config group choices of this run ({} outside a Hydra run)."""
    # lazy: hydra only here: normlab.config stays omegaconf-only (loads in ms)
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return {k: v for k, v in HydraConfig.get().runtime.choices.items() if isinstance(v, str)}


def _reads_placement(node: object) -> bool:
    """Whether a (unresolved) config container interpolates ${placement} anywhere."""
    if isinstance(node, dict):
        return any(_reads_placement(v) for v in node.values())
    if isinstance(node, list):
        return any(_reads_placement(v) for v in node)
    return isinstance(node, str) and "${placement" in node


def check_combination(cfg: DictConfig) -> None:
    """A model and data that fit (MODEL_DATA), a size of that model (conf/size/<model>/), and a
    placement only for a model that reads it."""
    choices = _choices()
    model, data = choices.get("model"), choices.get("data")
    fits = MODEL_DATA.get(model or "")
    if fits is not None and data is not None and data not in fits:
        takes = " or ".join(f"data={d}" for d in fits)
        raise ConfigError(f"model={model} does not train on data={data}: it takes {takes}")
    size = choices.get("size")
    if size is not None and model is not None and size.split("/")[0] != model:
        raise ConfigError(
            f"size={size} is a shape of model={size.split('/')[0]}, not of model={model}: the "
            f"sizes of model={model} are conf/size/{model}/<name>.yaml (size={model}/<name>)"
        )
    placement = OmegaConf.select(cfg, "placement.name", default=None)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=False) if "model" in cfg else {}
    if placement not in (None, DEFAULT_PLACEMENT) and not _reads_placement(model_cfg):
        raise ConfigError(
            f"placement={placement} has no effect on model={model or cfg.model.get('_target_')}: "
            "placement applies only to the Transformer models whose residual blocks read it "
            "(model=transformer)"
        )


def import_plugins(cfg: DictConfig) -> None:
    """Import the modules of `plugins` (conf/train.yaml), which register norms of their own with
    normlab.norms.register_norm; one that cannot be imported raises a one-line ConfigError."""
    plugins = cfg.get("plugins") or []
    if not isinstance(plugins, ListConfig | list):
        raise ConfigError(f"plugins must be a list of module names, got {plugins!r}")
    for name in plugins:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"plugins: a module name must be a non-empty string, got {name!r}")
        try:
            importlib.import_module(name)
        except Exception as err:
            first = (str(err).strip().splitlines() or [""])[0]
            raise ConfigError(
                f"plugins: cannot import {name!r}: {type(err).__name__}: {first} "
                "(module names are looked up on sys.path: train.py's dir and PYTHONPATH)"
            ) from err


# what Hydra's InstantiationException says: the class it called and the config node it built
_TARGET = re.compile(r"Error in call to target '([\w.]+)'")
_FULL_KEY = re.compile(r"^full_key: (\S+)$", re.M)


def name_config_keys(err: BaseException) -> ConfigError | None:
    """A class's own ValueError about its arguments, raised while Hydra built a config node, as
    the one-line ConfigError users read: each argument it names (`depth must be ...`,
    `n_heads=3 does not divide d_model=64`) becomes the node's key (`model.net.depth must be
    ...`). None for anything else: a UserError names its cause already, and a message naming
    none of the class's arguments is not about the config."""
    # lazy: hydra only here: normlab.config stays omegaconf-only (loads in ms)
    from hydra.errors import InstantiationException
    from hydra.utils import get_object  # lazy: as above

    cause = err.__cause__ if isinstance(err, InstantiationException) else None
    if not isinstance(cause, ValueError) or isinstance(cause, UserError):
        return None
    target, node = _TARGET.search(str(err)), _FULL_KEY.search(str(err))
    if target is None or node is None:
        return None
    try:
        arguments = list(inspect.signature(get_object(target.group(1))).parameters)
    except (ImportError, TypeError, ValueError):  # no signature to read the names from
        return None
    names = "|".join(sorted(map(re.escape, arguments), key=len, reverse=True))
    keyed, found = re.subn(rf"(?<![\w.])({names})(?==| must )", rf"{node.group(1)}.\1", str(cause))
    return ConfigError(keyed) if found else None


# model.net's keys that take a norm layer (a norm config, made a partial by Hydra); the string a
# slot may hold instead (LeNet's fc_norm: auto)
NORM_SLOTS = {"norm_layer": (), "qk_norm": (), "fc_norm": ("auto",)}


def check_norm_slots(cfg: DictConfig) -> None:
    """A norm slot given a norm's name (model.net.qk_norm=rmsnorm) fails, saying how to give it
    a norm config: a slot takes a callable width -> module, never a registry name."""
    for key, words in NORM_SLOTS.items():
        value = OmegaConf.select(cfg, f"model.net.{key}", default=None,
                                 throw_on_resolution_failure=False)  # fmt: skip
        if isinstance(value, str) and value not in words:
            raise ConfigError(
                f"model.net.{key}={value!r} is a name: a norm slot takes a norm config, "
                f"+norm@model.net.{key}={value} (or model.net.{key}=${{norm}})"
            )


def validate(cfg: DictConfig) -> None:
    """Fail fast on values that cannot work, naming the key and the value. The plugins are
    imported first: the norms they register are then known to everything after."""
    import_plugins(cfg)
    if "norm" in cfg and OmegaConf.is_missing(cfg.norm, "_target_"):
        raise ConfigError(
            "norm._target_ is missing: norm=custom takes norm._target_=<a norm class's path>, "
            "or norm._target_=${normlab.norm:<a registered name>} with plugins=[<the module "
            "registering it>]"
        )
    check_combination(cfg)
    check_norm_slots(cfg)
    found = _non_finite(cfg)
    if found is not None:
        raise ConfigError(f"{found[0]} must be a finite number, got {found[1]!r}")
    _positive_int(cfg, "batch")
    progress = cfg.get("progress")
    if progress not in PROGRESS:
        raise ConfigError(f"progress must be one of {', '.join(PROGRESS)}, got {progress!r}")
    every = cfg.get("progress_every")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int | float)
                              or not every > 0):  # fmt: skip
        raise ConfigError(f"progress_every must be a positive number of seconds, got {every!r}")
    _positive_int(cfg, "trainer.devices")
    _positive_int(cfg, "data.ctx")
    ctx, model_ctx = (OmegaConf.select(cfg, key) for key in ("data.ctx", "model.net.ctx"))
    if isinstance(ctx, int) and isinstance(model_ctx, int) and ctx > model_ctx:
        raise ConfigError(
            f"data.ctx={ctx} is longer than the model's context length model.net.ctx={model_ctx}"
        )
    _positive_int(cfg, "num_threads")
    seed = OmegaConf.select(cfg, "seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed must be an integer or null, got {seed!r}")
    lr = OmegaConf.select(cfg, "optim.optimizer.lr")
    if lr is not None and (not isinstance(lr, (int, float)) or lr <= 0):
        raise ConfigError(f"optim.optimizer.lr must be a positive number, got {lr!r}")
    warmup = OmegaConf.select(cfg, "optim.warmup_steps")
    if warmup is not None and (not isinstance(warmup, int) or warmup < 0):
        raise ConfigError(f"optim.warmup_steps must be an integer >= 0, got {warmup!r}")
    schedule, ratio = (OmegaConf.select(cfg, f"optim.{k}") for k in ("schedule", "min_lr_ratio"))
    if schedule == "exponential" and not (isinstance(ratio, (int, float)) and 0 < ratio < 1):
        raise ConfigError(f"optim.schedule=exponential decays to optim.min_lr_ratio, which must "
                          f"lie in (0, 1), got {ratio!r}")  # fmt: skip
    epochs = OmegaConf.select(cfg, "trainer.max_epochs")
    if epochs is not None and epochs != -1 and (not isinstance(epochs, int) or epochs <= 0):
        raise ConfigError(f"trainer.max_epochs must be a positive integer, got {epochs!r}")


def check_or_exit(cfg: DictConfig) -> bool:
    """A single run's plain config checks, before torch and Lightning load (seconds of imports):
    a bad value exits at once with its message; True when checked (normlab.run.task.main does not
    check it again). In a sweep normlab.run.task.main checks each job, records a failure in the
    summary and goes on: False."""
    # lazy: hydra only here: normlab.config stays omegaconf-only (loads in ms)
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN":
        return False
    try:
        validate(cfg)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    return True


def compose(overrides: list[str], run_dir: str | Path, config_dir: str | Path) -> DictConfig:
    """The config `python train.py <overrides> hydra.run.dir=<run_dir>` would run, in-process.

    Hydra's runtime config is set as during a run (loggers and callbacks read it), and
    `paths.output_dir` points at run_dir.
    """
    # lazy: hydra only here: normlab.config stays omegaconf-only (loads in ms)
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir  # lazy: as above
    from hydra.core.hydra_config import HydraConfig  # lazy: as above

    with initialize_config_dir(str(Path(config_dir).resolve()), version_base="1.3"):
        cfg = hydra_compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(run_dir)
        del cfg.hydra
    return cfg
