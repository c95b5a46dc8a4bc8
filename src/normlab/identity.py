"""What a sweep job is: its fully resolved config and the version of normlab's code.

A finished job is reused only when both match the earlier run's (normlab.sweep.jobs): a changed
experiment yaml, override or default (through the resolved config) and a changed line of training
code all rerun it. conf/ itself is not hashed: a job's config is what reaches it, so an edit of a
file the job never composes (another experiment's yaml, a comment) leaves it finished.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import normlab

SRC = Path(normlab.__file__).resolve().parent
# Code that does not decide what a job computes, only which jobs run, where they write and what
# their sweep records (sweep/), or never runs inside a job (analysis/): editing it must not rerun
# finished jobs.
NOT_TRAINING_CODE = ("analysis", "sweep", "conf")  # conf: a job's config is hashed, not its files
# Keys that say where a job writes or reads, how it was started, what it shows while it runs
# or where its memory comes from, not what it computes.
NOT_IDENTITY = ("paths", "ckpt_path", "overwrite", "progress", "progress_every", "keep_heap")


def _digest(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()[:16]


def config_hash(cfg: DictConfig) -> str:
    """A hash of the resolved config, where the run's own dirs are replaced by placeholders."""
    tree: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    paths = tree.get("paths") or {}
    text = json.dumps({k: v for k, v in tree.items() if k not in NOT_IDENTITY}, sort_keys=True)
    for key in ("output_dir", "data_dir"):  # longest first would matter only for nested dirs
        if paths.get(key):
            text = text.replace(json.dumps(str(paths[key]))[1:-1], f"<{key}>")
    return _digest(text)


def code_version() -> str:
    """A hash of normlab's training code: each file of src/normlab without NOT_TRAINING_CODE, by
    its path below src/normlab and its contents."""
    hasher = hashlib.sha256()
    for path in sorted(SRC.rglob("*")):
        rel = path.relative_to(SRC)
        if not path.is_file() or "__pycache__" in rel.parts or rel.parts[0] in NOT_TRAINING_CODE:
            continue
        if path.suffix not in (".py", ".yaml", ".cpp"):
            continue
        hasher.update(f"src/{rel.as_posix()}\0".encode())
        hasher.update(path.read_bytes() + b"\0")
    return hasher.hexdigest()[:16]


def hydra_conf_dir() -> Path | None:
    """The conf/ dir of the running Hydra app (None outside Hydra)."""
    if not HydraConfig.initialized():
        return None
    for source in HydraConfig.get().runtime.config_sources:
        if source.provider == "main" and source.schema == "file":
            return Path(source.path)
    return None
