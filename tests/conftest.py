"""Shared test setup: data root, config composition, tiny overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw new examples locally; CI (HYPOTHESIS_PROFILE=ci) replays a fixed set.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

REPO = Path(__file__).resolve().parents[1]
# The data (FashionMNIST/raw, tinyshakespeare/input.txt) is found through NORMLAB_DATA only,
# never through where the checkout sits: the tests run from any clone (pytest_configure).
DATA_ENV = "NORMLAB_DATA"
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("NORMLAB_PROGRESS", "none")  # no progress bar or epoch lines in test output
# The cores shared out between the xdist workers (`-n auto`: one per core), for their own torch
# and every train.py or reproduce.py they start (which read OMP_NUM_THREADS), instead of every
# worker's torch asking for all the cores. Set in the workers only: the controller's environment
# is theirs too. The user's own setting wins.
USER_THREADS = os.environ.get("OMP_NUM_THREADS")
if "PYTEST_XDIST_WORKER" in os.environ and USER_THREADS is None:
    _workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))

# Every run in tests: one epoch of a few batches, CSV only, no test split unless asked.
TINY = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "trainer.log_every_n_steps=1",
    "callbacks.norm_stats.every_n_steps=1",
]


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(DATA_ENV):
        raise pytest.UsageError(
            f"{DATA_ENV} is not set: the tests read Fashion-MNIST and tiny Shakespeare from it. "
            f"export {DATA_ENV}=/path/to/data (the folder holding FashionMNIST/raw and "
            "tinyshakespeare/input.txt; README, Data)"
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `heavy` (the longest) first, in their order: xdist hands tests out in
    collection order, and a long one handed out last runs alone while the other worker idles."""
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)  # a stable sort


@pytest.fixture(autouse=True)
def _torch_threads_kept():
    """torch's thread count as it was before the test: a run trained in-process sets it (an
    experiment's num_threads=1), and the tests after it, in the same process, read the cores."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The data root NORMLAB_DATA names (FashionMNIST/raw, tinyshakespeare/input.txt)."""
    return Path(os.environ[DATA_ENV]).resolve()


@pytest.fixture
def scratch_registry(monkeypatch):
    """The norm registry as it is, restored after the test: registrations do not leak."""
    from normlab.norms import registry

    monkeypatch.setattr(registry, "_NORMS", dict(registry._NORMS))
    monkeypatch.setattr(registry, "_ALIASES", dict(registry._ALIASES))


@pytest.fixture
def compose():
    """compose(overrides, run_dir) -> a DictConfig from conf/train.yaml with hydra runtime set."""
    from hydra.core.hydra_config import HydraConfig

    from normlab.config import compose as compose_config

    yield lambda overrides, run_dir: compose_config(overrides, run_dir, REPO / "conf")
    HydraConfig.instance().cfg = None
