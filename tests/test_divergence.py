"""DivergenceGuard: which losses stop a run, and no host sync between its every_n_steps reads."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_norms_no_host_sync import host_reads_raise

from normlab.callbacks.divergence import DivergenceGuard


class Task(SimpleNamespace):
    """The parts of a task the guard touches."""

    def __init__(self):
        super().__init__(run_status="ok", run_note="", logged={})

    def log(self, name, value, **kwargs):
        self.logged[name] = value


def _feed(guard: DivergenceGuard, losses: list[float], banned_steps=()) -> tuple:
    """Steps 1.. with these losses; host reads raise on `banned_steps`. (trainer, task, the
    step training stopped at or None)."""
    trainer = SimpleNamespace(global_step=0, checkpoint_callbacks=[], should_stop=False)
    task = Task()
    for step, loss in enumerate(losses, start=1):
        trainer.global_step = step
        reads = host_reads_raise() if step in banned_steps else _nothing()
        with reads:
            guard.on_train_batch_end(trainer, task, {"loss": torch.tensor(loss)}, None, step)
        if trainer.should_stop:
            return trainer, task, step
    return trainer, task, None


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_every_step_stops_at_the_first_non_finite_loss():
    _, task, stopped = _feed(DivergenceGuard(), [2.0, 1.5, math.nan, 1.0])
    assert stopped == 3 and task.run_status == "diverged"
    assert task.run_note == "loss nan at step 3 is non-finite" and task.logged == {"diverged": 1.0}


def test_a_loss_above_factor_times_the_first_finite_one_stops():
    _, task, stopped = _feed(DivergenceGuard(factor=10.0), [2.0, 19.0, 21.0, 1.0])
    assert stopped == 3
    assert task.run_note == "loss 21 at step 3 is > 10.0 x first 2"


def test_warmup_steps_forgive_a_high_loss_but_not_a_nan():
    guard = DivergenceGuard(factor=10.0, warmup_steps=2)
    assert _feed(guard, [2.0, 30.0, 1.0, 30.0])[2] == 4
    assert _feed(DivergenceGuard(warmup_steps=5), [2.0, math.nan])[2] == 2


def test_between_reads_nothing_is_read_on_the_host_and_the_read_names_the_step():
    """every_n_steps=4: steps 1-3 run with host reads banned; the read at step 4 finds the
    divergence of step 2, the first one, not step 3's."""
    guard = DivergenceGuard(every_n_steps=4)
    _, task, stopped = _feed(guard, [1.0, math.inf, 50.0, 1.0, 1.0], banned_steps=(1, 2, 3))
    assert stopped == 4
    assert task.run_note == "loss inf at step 2 is non-finite"


def test_the_end_of_an_epoch_reads_the_verdict():
    guard = DivergenceGuard(every_n_steps=100)
    trainer, task, stopped = _feed(guard, [1.0, math.nan])
    assert stopped is None
    guard.on_train_epoch_end(trainer, task)
    assert trainer.should_stop and task.run_note == "loss nan at step 2 is non-finite"


def test_a_healthy_run_is_never_stopped_and_its_first_loss_is_checkpointed():
    guard = DivergenceGuard(every_n_steps=2)
    trainer, task, stopped = _feed(guard, [3.0, 2.0, 25.0, 1.0])  # 25 < 10 x 3
    guard.on_train_epoch_end(trainer, task)
    assert stopped is None and not trainer.should_stop and task.run_status == "ok"
    resumed = DivergenceGuard()
    resumed.load_state_dict(guard.state_dict())
    assert guard.state_dict() == resumed.state_dict() == {"first": 3.0}
    _, _, stopped = _feed(resumed, [31.0])  # measured against the first loss of the run
    assert stopped == 1


@pytest.mark.parametrize("n", [0, -1, 1.5, True])
def test_bad_every_n_steps_raises(n):
    with pytest.raises(ValueError, match="every_n_steps must be an integer >= 1"):
        DivergenceGuard(every_n_steps=n)
