"""Model update ||F(x, theta_t) - F(x, theta_0)|| on a fixed batch (Wang et al. 2022, Fig. 4/5)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch


class UpdateNorm(pl.Callback):
    """Log `update_norm` for the first `steps` steps: the mean per-token L2 norm of the change in
    the model's output (logits) on the first training batch, computed in eval mode. The batch
    and its first output are kept in checkpoints while they are needed: a resumed run goes on
    logging it."""

    def __init__(self, steps: int = 100, every_n_steps: int = 1, max_examples: int = 8) -> None:
        self.steps, self.every_n_steps, self.max_examples = steps, every_n_steps, max_examples
        self.inputs: tuple[torch.Tensor, ...] | None = None
        self.reference: torch.Tensor | None = None

    @torch.no_grad()
    def _output(self, pl_module: pl.LightningModule) -> torch.Tensor:
        was_training = pl_module.training
        pl_module.eval()
        out = pl_module(*self.inputs)  # (B, T, V)
        pl_module.train(was_training)
        return out

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.inputs is None and trainer.global_step == 0:
            inputs = batch[:-1] if isinstance(batch, (tuple, list)) else (batch,)
            self.inputs = tuple(t[: self.max_examples].clone() for t in inputs)
            self.reference = self._output(pl_module)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step  # optimizer steps taken so far
        if self.reference is None or step > self.steps or step % self.every_n_steps:
            return
        diff = self._output(pl_module) - self.reference  # (B, T, V)
        value = diff.norm(dim=-1).mean().item()
        for logger in trainer.loggers:
            logger.log_metrics({"update_norm": value}, step=step)

    def state_dict(self) -> dict[str, Any]:
        if self.reference is None:
            return {}
        return {"inputs": self.inputs, "reference": self.reference}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            self.inputs, self.reference = state_dict["inputs"], state_dict["reference"]
