"""Experiment trackers: Lightning loggers built from conf/logger/*.yaml."""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, WandbLogger


def sweep_group() -> str | None:
    """The sweep dir's name when running inside a Hydra multirun, else None."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return None
    return Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None


def wandb_has_credentials() -> bool:
    """True when an API key is in the environment or ~/.netrc (no network involved)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        auth = netrc.netrc().authenticators("api.wandb.ai")
    except (FileNotFoundError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def wandb_logger(
    project: str = "normlab",
    save_dir: str = ".",
    group: str | None = None,
    mode: str | None = None,
    tags: list[str] | None = None,
    **kwargs: Any,
) -> WandbLogger:
    """A WandbLogger that never blocks: offline when no credentials are configured."""
    mode = (
        mode or os.environ.get("WANDB_MODE") or ("online" if wandb_has_credentials() else "offline")
    )
    import wandb

    settings = wandb.Settings(init_timeout=60, silent=True, x_disable_stats=True)
    return WandbLogger(
        project=project,
        save_dir=save_dir,
        group=group or sweep_group(),
        mode=mode,
        tags=list(tags or []),
        settings=settings,
        **kwargs,
    )


def finish(loggers: list[Logger]) -> None:
    """Close every tracker run so the next run of a multirun starts a fresh one."""
    for logger in loggers:
        logger.finalize("success")
        if isinstance(logger, WandbLogger):
            import wandb

            if wandb.run is not None:
                wandb.finish()
