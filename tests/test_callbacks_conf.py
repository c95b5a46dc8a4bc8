"""conf/callbacks: one file per callback, `default` composing the usual ones, and early stopping
on the task's own metric, chosen with callbacks=[default,early_stopping]."""

from __future__ import annotations

from conftest import REPO, TINY

from normlab.callbacks.early_stopping import TaskEarlyStopping
from normlab.run import train

CONF = REPO / "conf" / "callbacks"
DEFAULT = [
    "model_checkpoint", "last_checkpoint", "divergence", "norm_stats", "lr_monitor", "precise_bn",
]  # fmt: skip


def test_default_composes_one_file_per_callback(compose, tmp_path):
    files = {p.stem for p in CONF.glob("*.yaml")} - {"default"}
    assert files == {*DEFAULT, "early_stopping"}
    assert list(compose([], tmp_path).callbacks) == DEFAULT
    added = compose(["callbacks=[default,early_stopping]"], tmp_path).callbacks
    assert list(added) == [*DEFAULT, "early_stopping"]


def test_early_stopping_stops_on_the_task_s_metric(compose, tmp_path):
    """LeNet's metric is val/acc (max): with min_delta=1.0 no validation improves on the first,
    so patience=1 stops training after its second epoch of five."""
    overrides = [
        "callbacks=[default,early_stopping]",
        "callbacks.early_stopping.patience=1",
        "callbacks.early_stopping.min_delta=1.0",
        "batch=16",
        *TINY,
        "trainer.max_epochs=5",
        "test=false",
    ]
    result, objects = train(compose(overrides, tmp_path))
    (stop,) = [c for c in objects.callbacks if isinstance(c, TaskEarlyStopping)]
    assert result["status"] == "ok"
    assert (stop.monitor, stop.mode, stop.min_delta) == ("val/acc", "max", 1.0)
    assert objects.trainer.current_epoch == 2 and stop.stopped_epoch == 1
