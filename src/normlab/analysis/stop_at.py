"""A training run stopped after its first steps, unchanged up to them: a report card's replay
of a committed baseline job (normlab.analysis.replay) adds this callback through an override,
`+callbacks.replay_stop={_target_: normlab.analysis.stop_at.StopAt, step: N}`.

It stops the run as early stopping does, without touching trainer.max_steps or max_epochs: the
lr schedule (a cosine over the run's planned steps) is the committed job's at every step. Here,
not among the training callbacks: analysis/ is not training code (normlab.identity), so adding
it moves no job's code version.
"""

from __future__ import annotations

import lightning.pytorch as pl


class StopAt(pl.Callback):
    """Ask Lightning to stop once `step` optimizer steps are done; a validation due at that step
    runs first (Lightning checks for a stop after it)."""

    def __init__(self, step: int) -> None:
        self.step = int(step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True
