"""Per-layer gradient norms: at initialization and every k steps (Xiong et al. 2020, Fig. 3)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch


def block_grad_norms(blocks: torch.nn.ModuleList) -> list[float]:
    """L2 norm of the gradient of each block's weight matrices (biases and norm gains left out)."""
    norms = []
    for block in blocks:
        squares = [
            p.grad.pow(2).sum() for p in block.parameters() if p.ndim >= 2 and p.grad is not None
        ]
        norms.append(float(sum(squares, torch.tensor(0.0)).sqrt()))
    return norms


class GradNorms(pl.Callback):
    """Log grad_norm/block_00, block_01, ... before the first optimizer step and every k steps."""

    def __init__(self, every_n_steps: int = 50, blocks: str = "net.blocks") -> None:
        if every_n_steps <= 0:
            raise ValueError(f"callbacks.grad_norms.every_n_steps must be > 0, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.blocks = blocks

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # Step 0 sees the gradients of the untrained model: the "at initialization" curve.
        step = trainer.global_step
        if step % self.every_n_steps:
            return
        norms = block_grad_norms(pl_module.get_submodule(self.blocks))
        metrics = {f"grad_norm/block_{i:02d}": v for i, v in enumerate(norms)}
        # Written to the trackers directly: Lightning would only flush self.log values on its
        # log_every_n_steps cadence, which can skip step 0.
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
