"""Model update ||F(x, theta_t) - F(x, theta_0)|| on a fixed batch (Wang et al. 2022, Fig. 4/5)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch


def relative_change(now: torch.Tensor, start: torch.Tensor) -> float:
    """||now - start|| / ||start||, Frobenius norms over the whole fixed batch."""
    return float((now - start).norm() / start.norm())


class UpdateNorm(pl.Callback):
    """Log `update_norm` for the first `steps` steps: the mean per-token L2 norm of the change in
    the model's output (logits) on the first training batch, computed in eval mode.

    With `blocks` (the module list of the blocks, e.g. `net.blocks`) it also logs DeepNet's model
    update of the blocks alone and of the whole model, each relative to its value at init:
    `update/blocks` = ||B(h, theta_t) - B(h, theta_0)|| / ||B(h, theta_0)||, B the blocks in turn
    and h the stream that entered the first block at init (held fixed: the embedding's own
    change and the head are left out); `update/model` = the same ratio for the logits. The batch
    and the first outputs are kept in checkpoints while they are needed: a resumed run goes on
    logging them."""

    def __init__(
        self, steps: int = 100, every_n_steps: int = 1, max_examples: int = 8,
        blocks: str | None = None,
    ) -> None:  # fmt: skip
        self.steps, self.every_n_steps, self.max_examples = steps, every_n_steps, max_examples
        self.blocks = blocks
        self.inputs: tuple[torch.Tensor, ...] | None = None
        self.reference: torch.Tensor | None = None
        self.stream: torch.Tensor | None = None  # the first block's input at init
        self.blocks_reference: torch.Tensor | None = None  # the last block's output at init

    @torch.no_grad()
    def _output(self, pl_module: pl.LightningModule) -> torch.Tensor:
        was_training = pl_module.training
        pl_module.eval()
        out = pl_module(*self.inputs)  # (B, T, V)
        pl_module.train(was_training)
        return out

    @torch.no_grad()
    def _blocks_output(self, pl_module: pl.LightningModule) -> torch.Tensor:
        """The blocks, in eval mode, on the stream that entered them at init."""
        was_training = pl_module.training
        pl_module.eval()
        x = self.stream
        for block in pl_module.get_submodule(self.blocks):
            x = block(x)  # (B, T, D)
        pl_module.train(was_training)
        return x

    def _start(self, pl_module: pl.LightningModule) -> None:
        """The outputs at init; with `blocks`, also the stream entering the first block and the
        one leaving the last, caught by hooks in the same forward pass."""
        if self.blocks is None:
            self.reference = self._output(pl_module)
            return
        blocks = pl_module.get_submodule(self.blocks)
        seen: dict[str, torch.Tensor] = {}
        hooks = (
            blocks[0].register_forward_pre_hook(lambda _m, a: seen.setdefault("in", a[0].clone())),
            blocks[-1].register_forward_hook(lambda _m, _a, y: seen.setdefault("out", y.clone())),
        )
        try:
            self.reference = self._output(pl_module)
        finally:
            for hook in hooks:
                hook.remove()
        self.stream, self.blocks_reference = seen["in"], seen["out"]

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.inputs is None and trainer.global_step == 0:
            inputs = batch[:-1] if isinstance(batch, (tuple, list)) else (batch,)
            self.inputs = tuple(t[: self.max_examples].clone() for t in inputs)
            self._start(pl_module)

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
        out = self._output(pl_module)
        metrics = {"update_norm": (out - self.reference).norm(dim=-1).mean().item()}
        if self.blocks_reference is not None:
            metrics["update/model"] = relative_change(out, self.reference)
            metrics["update/blocks"] = relative_change(
                self._blocks_output(pl_module), self.blocks_reference
            )
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def state_dict(self) -> dict[str, Any]:
        if self.reference is None:
            return {}
        state = {"inputs": self.inputs, "reference": self.reference}
        if self.blocks_reference is not None:
            state.update(stream=self.stream, blocks_reference=self.blocks_reference)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            self.inputs, self.reference = state_dict["inputs"], state_dict["reference"]
            self.stream = state_dict.get("stream")
            self.blocks_reference = state_dict.get("blocks_reference")
