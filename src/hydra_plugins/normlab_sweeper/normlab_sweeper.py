"""Hydra's basic sweeper, each job's config composed once instead of twice.

The basic sweeper composes every job of a batch to check that it can be (validate_batch_is_legal:
a bad override fails before any job runs), then its launcher composes each job again to run it.
Composing one of normlab's configs takes ~0.2 s, as long as a quick job's training; this sweeper
keeps the configs the check composed and hands each to the launcher once, so a multirun composes
each job once. Everything else is the basic sweeper's: the same jobs in the same order, the same
`hydra.sweeper.params`, the same early failure.

It is registered under its own name, `hydra/sweeper: normlab`, and normlab's conf chooses it
(conf/hydra/default.yaml), so every multirun of train.py uses it while any other Hydra app in the
same environment keeps Hydra's own basic sweeper; another sweeper (hydra/sweeper=optuna)
replaces it as before. A
launcher that composes in other processes (joblib, submitit) cannot use configs composed here:
under it the check is the basic sweeper's (composed, then dropped), and its workers get the plain
config loader.
"""

# no `from __future__ import annotations`: Hydra's plugin scan runs this module before it is in
# sys.modules, where a dataclass cannot resolve string annotations
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf
from hydra.core.config_store import ConfigStore
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class _ComposedOnce:
    """A config loader that returns a job's config composed by the check to the launcher's call
    for the same job (once), and otherwise does what the loader it wraps does."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._kept: dict[tuple[int, tuple[str, ...]], DictConfig] = {}

    def keep(self, master_config: DictConfig, batch: Sequence[Sequence[str]]) -> None:
        """Compose every job of the batch (an error stops here, as the check's does) and keep it."""
        self._kept = {}
        for overrides in batch:
            key = (id(master_config), tuple(overrides))
            self._kept[key] = self._loader.load_sweep_config(master_config, list(overrides))

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> Any:
        kept = self._kept.pop((id(master_config), tuple(sweep_overrides)), None)
        if kept is not None:
            return kept
        return self._loader.load_sweep_config(master_config, sweep_overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (for a launcher's worker processes) as the loader it wraps."""
        return (_identity, (self._loader,))


def _identity(loader: Any) -> Any:
    return loader


class ComposeOnceSweeper(BasicSweeper):
    """BasicSweeper whose launcher runs the configs its check composed."""

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        once = _ComposedOnce(hydra_context.config_loader)
        context = HydraContext(config_loader=once, callbacks=hydra_context.callbacks)  # type: ignore[arg-type]
        super().setup(hydra_context=context, task_function=task_function, config=config)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Compose every job of the batch; keep them for a launcher that composes here."""
        if not isinstance(self.launcher, BasicLauncher):
            return super().validate_batch_is_legal(batch)
        assert self.hydra_context is not None and self.config is not None
        self.hydra_context.config_loader.keep(self.config, batch)  # type: ignore[attr-defined]


@dataclass
class ComposeOnceSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.normlab_sweeper.normlab_sweeper.ComposeOnceSweeper"


ConfigStore.instance().store(
    group="hydra/sweeper", name="normlab", node=ComposeOnceSweeperConf, provider="normlab"
)
