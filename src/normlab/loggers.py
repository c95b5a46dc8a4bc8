"""Experiment trackers: Lightning loggers built from conf/logger/*.yaml."""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, MLFlowLogger, WandbLogger


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


def mlflow_logger(
    experiment_name: str = "normlab", tracking_uri: str | None = None, **kwargs: Any
) -> MLFlowLogger:
    """An MLFlowLogger; a `file:` store is allowed explicitly (MLflow 3 asks for an opt-in)."""
    if tracking_uri and tracking_uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return MLFlowLogger(
        experiment_name=experiment_name,
        tracking_uri=tracking_uri,
        run_name=kwargs.pop("run_name", None) or sweep_job_name(),
        tags={"group": sweep_group() or ""},
        **kwargs,
    )


def sweep_job_name() -> str | None:
    """The run dir's name (unique per run and per multirun job)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir).name
    except (ImportError, ValueError):
        return None


def finish(loggers: list[Logger]) -> None:
    """Close every tracker run so the next run of a multirun starts a fresh one."""
    for logger in loggers:
        logger.finalize("success")
        if isinstance(logger, WandbLogger):
            import wandb

            if wandb.run is not None:
                wandb.finish()
