"""Resuming a run: which checkpoint ckpt_path names, whether it holds the task the config
builds, and whether the run dir holds an earlier run of another config."""

from __future__ import annotations

import logging
import re
import zipfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf

from normlab import identity
from normlab.errors import ConfigError, RunDirError
from normlab.run import rundir
from normlab.run.rundir import LAST, LAST_OR_NEW, run_dir

log = logging.getLogger(__name__)
CONFIG_KEY = "normlab_config"  # a checkpoint's entry holding the resolved config that saved it
MODEL_KEYS = ("model", "norm", "placement", "optim")  # what builds the task a checkpoint holds
RESUME_KEYS = ("state_dict", "global_step", "epoch", "optimizer_states")  # what a resume reads
SHOWN_DIFFERENCES = 4  # differing keys an error names
_ABSENT = object()
_ALIAS = re.compile(r"\$\{[\w.]+\}")  # a node that is another node (model.net.norm_layer: ${norm})


def resolve_ckpt(cfg: DictConfig) -> str | None:
    """ckpt_path: null | last (this run dir's last.ckpt, which must exist) | last_or_new (it,
    or a new run when there is none) | a run dir | a .ckpt file."""
    value = cfg.get("ckpt_path")
    if value in (None, ""):
        return None
    here = value in (LAST, LAST_OR_NEW)
    path = run_dir(cfg) / "checkpoints" / "last.ckpt" if here else Path(value)
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt"
    if not path.is_file():
        if value == LAST_OR_NEW:
            log.info("ckpt_path=last_or_new: no %s yet, starting a new run", path)
            return None
        if value == LAST:
            raise ConfigError(
                f"ckpt_path=last: nothing to resume in {run_dir(cfg)} (no {path}); name the "
                "run dir to resume (hydra.run.dir=<dir>), or ckpt_path=last_or_new to start a "
                "new run when there is none"
            )
        raise ConfigError(f"ckpt_path={value!r}: no checkpoint at {path}")
    return str(path)


def read_checkpoint(path: str | Path, what: str) -> dict[str, Any]:
    """The checkpoint at path, or ConfigError naming it (`what`, e.g. ckpt_path=last) when it
    cannot be read (not a torch file, truncated) or is not a full Lightning checkpoint."""
    try:
        if not zipfile.is_zipfile(path):  # torch.save's format; a cut file lost its directory
            raise ValueError("no zip directory at its end")
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        cause = str(err).split(". ")[0].strip().rstrip(".") or type(err).__name__
        raise ConfigError(
            f"{what}: {path} is not a readable checkpoint (truncated or not a .ckpt file: {cause})"
        ) from err
    missing = [k for k in RESUME_KEYS if not isinstance(checkpoint, dict) or k not in checkpoint]
    if missing:
        raise ConfigError(
            f"{what}: {path} is not a checkpoint a run can resume from: it has no "
            f"{', '.join(missing)} (a weights-only or foreign file?)"
        )
    return checkpoint


class ConfigInCheckpoint(pl.Callback):
    """Stores the run's resolved config in every checkpoint (CONFIG_KEY): a resume checks it."""

    def __init__(self, resolved: dict[str, Any]):
        self.resolved = resolved

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        checkpoint[CONFIG_KEY] = self.resolved


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a config container's leaves (lists and empty dicts are leaves)."""
    leaves = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            leaves.update(_leaves(value, f"{prefix}{key}."))
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


def _show(values: dict[str, Any], key: str) -> str:
    if key not in values:
        return "absent"
    value = values[key]
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def differences(
    old: dict[str, Any], new: dict[str, Any], cfg: DictConfig, old_name: str, new_name: str
) -> str:
    """'key: <old> (old_name) vs <new> (new_name)' for each leaf whose value differs, "; "-joined
    (the first SHOWN_DIFFERENCES, changed values before keys one side lacks); empty when none.
    A key that is another node in cfg (model.net.norm_layer: ${norm}) is left to that node."""
    unresolved = _leaves(OmegaConf.to_container(cfg, resolve=False))  # type: ignore[arg-type]
    aliases = tuple(f"{k}." for k, v in unresolved.items() if _ALIAS.fullmatch(str(v)))
    a, b = _leaves(old), _leaves(new)
    differ = [k for k in sorted(a.keys() | b.keys()) if a.get(k, _ABSENT) != b.get(k, _ABSENT)]
    keys = [k for k in differ if not f"{k}.".startswith(aliases)]
    keys.sort(key=lambda k: k not in a or k not in b)  # changed values first, then added/removed
    shown = [f"{k}: {_show(a, k)} ({old_name}) vs {_show(b, k)} ({new_name})" for k in keys]
    more = len(shown) - SHOWN_DIFFERENCES
    return "; ".join(shown[:SHOWN_DIFFERENCES]) + (f"; and {more} more" if more > 0 else "")


def check_checkpoint(cfg: DictConfig, task: pl.LightningModule, checkpoint: dict, path: str):
    """A checkpoint to resume must hold the task cfg builds: the same MODEL_KEYS (when it stores
    its config) and the same state_dict keys and shapes. Raise ConfigError naming the keys that
    differ; read only."""
    where = f"ckpt_path={cfg.ckpt_path}: {path}"
    stored = checkpoint.get(CONFIG_KEY)
    if stored is not None:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        old, new = ({k: t[k] for k in MODEL_KEYS if k in t} for t in (stored, resolved))
        diff = differences(old, new, cfg, "checkpoint", "config")
        if diff:
            raise ConfigError(f"{where} does not match the config: {diff}")

    def shapes(state: dict[str, Any]) -> dict[str, list[int]]:  # torch.compile's keys unwrapped
        return {k.replace("_orig_mod.", ""): [*getattr(v, "shape", ())] for k, v in state.items()}

    theirs, ours = shapes(checkpoint.get("state_dict", {})), shapes(task.state_dict())
    diff = differences(theirs, ours, cfg, "checkpoint", "model")
    if diff:
        raise ConfigError(f"{where} does not fit the model the config builds: {diff}")


def other_run(cfg: DictConfig) -> str | None:
    """None when the run dir holds no earlier run, or one of this config (identity.config_hash,
    what a sweep calls the same job); else what differs. Call before a random seed is written
    into cfg."""
    guard = rundir.current()
    if guard is None or guard.job or not guard.holds_run():  # a job's: its sweep decides
        return None
    config_hash = identity.config_hash(cfg)
    try:
        before = OmegaConf.create(guard.previous_config())
        if identity.config_hash(before) == config_hash:
            return None
        old = OmegaConf.to_container(before, resolve=True)
    except Exception as err:  # a config this code cannot read or resolve: another config
        return f"its .hydra/config.yaml cannot be resolved: {err}"
    new = OmegaConf.to_container(cfg, resolve=True)
    old, new = ({k: v for k, v in t.items() if k not in identity.NOT_IDENTITY} for t in (old, new))
    return differences(old, new, cfg, "run dir", "config") or "another config_hash"


def check(
    cfg: DictConfig,
    task: pl.LightningModule,
    ckpt: str | None,
    checkpoint: dict[str, Any] | None,
    other: str | None,
) -> tuple[dict[str, Any] | None, bool]:
    """The checkpoint at `ckpt` (read unless the caller has, `checkpoint`) checked against the
    task, and whether an earlier run of another config (`other`, other_run) is to be moved
    aside (overwrite=true); RunDirError when it stays in the way. Read only."""
    if ckpt and checkpoint is None:
        checkpoint = read_checkpoint(ckpt, f"ckpt_path={cfg.ckpt_path}")
    if checkpoint is not None:
        check_checkpoint(cfg, task, checkpoint, ckpt)  # type: ignore[arg-type]
    if ckpt and Path(ckpt).resolve().is_relative_to(run_dir(cfg).resolve()):
        other = None  # it resumes the run in its dir: the checkpoint's check above decides
    if other is not None and not cfg.get("overwrite"):
        raise RunDirError(
            f"run dir {run_dir(cfg)} holds a run of another config ({other}): pick another "
            f"hydra.run.dir, or overwrite=true to move that run to {run_dir(cfg)}/"
            f"{rundir.OLD_PREFIX}<time>/ and start anew"
        )
    return checkpoint, other is not None


def resume_point(checkpoint: dict[str, Any] | None) -> dict[str, int | None]:
    """{} without a checkpoint; else the global step it was saved at and the rows of the CSV
    log before it (None in a checkpoint that did not count them): all of them (resume_rows,
    a checkpoint after validation or at the end) or those logged before a checkpoint taken
    after a batch (resume_batch_rows)."""
    if checkpoint is None:
        return {}
    return {
        "resume_step": int(checkpoint["global_step"]),
        "resume_rows": checkpoint.get("csv_rows"),
        "resume_batch_rows": checkpoint.get("csv_rows_at_batch"),
    }
