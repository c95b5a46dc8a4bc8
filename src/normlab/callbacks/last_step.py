"""A run that max_steps stops mid-epoch validates at its last step, so it ends with val numbers."""

from __future__ import annotations

import lightning.pytorch as pl


class ValidateLastStep(pl.Callback):
    """Ask Lightning to stop at the step that reaches trainer.max_steps when it falls inside an
    epoch: a run told to stop validates at that step (as after early stopping), where a run
    that only reaches max_steps ends without validating. No effect on runs that end with an
    epoch."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        max_steps = trainer.max_steps
        mid_epoch = batch_idx + 1 < trainer.num_training_batches
        if max_steps is not None and 0 < max_steps <= trainer.global_step and mid_epoch:
            trainer.should_stop = True
