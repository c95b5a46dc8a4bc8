"""Per-layer gradient norms: at initialization and every k steps (Xiong et al. 2020, Fig. 3)."""

from __future__ import annotations

import itertools

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


class GradAtInit(pl.Callback):
    """Log grad_init/block_XX/<name> at step 0: each block's ||dL/dW|| for one weight matrix W,
    averaged over the first `batches` training batches of the model at init (Xiong et al. 2020,
    Fig. 3: W2, the FFN's second matrix).

    At fit start, before any step: forward and backward of each batch on the untrained model in
    training mode (no optimizer step in between). The gradients go to torch.autograd.grad, not
    to .grad, and the torch RNG is forked, so training afterwards is the same with or without
    this callback. The batches come from the datamodule's train loader (epoch 0): the data
    seed picks them.
    """

    def __init__(
        self,
        batches: int = 32,
        blocks: str = "net.blocks",
        weight: str = "mlp.sublayer.fc2.weight",
        name: str = "w2",
    ) -> None:
        if batches <= 0:
            raise ValueError(f"callbacks.grad_at_init.batches must be > 0, got {batches}")
        self.batches, self.blocks, self.weight, self.name = batches, blocks, weight, name

    def norms(self, pl_module: pl.LightningModule, loader) -> list[float]:
        """Mean over `batches` batches of each block's ||dL/dW||."""
        weights = [b.get_parameter(self.weight) for b in pl_module.get_submodule(self.blocks)]
        total = torch.zeros(len(weights), dtype=torch.float64)
        seen, was_training = 0, pl_module.training
        pl_module.train()
        with torch.random.fork_rng(devices=[]):
            for batch in itertools.islice(loader, self.batches):
                batch = pl_module.transfer_batch_to_device(batch, pl_module.device, 0)
                grads = torch.autograd.grad(pl_module.loss(batch), weights)
                total += torch.stack([g.double().norm().cpu() for g in grads])
                seen += 1
        pl_module.train(was_training)
        if seen < self.batches:
            raise ValueError(
                f"callbacks.grad_at_init.batches={self.batches} but the train loader has {seen}"
            )
        return (total / seen).tolist()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.ckpt_path is not None:  # a resumed run is not at its initialization
            return
        norms = self.norms(pl_module, trainer.datamodule.train_dataloader())
        metrics = {f"grad_init/block_{i:02d}/{self.name}": v for i, v in enumerate(norms)}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=0)
