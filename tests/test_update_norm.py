"""The UpdateNorm callback: today's update_norm, and DeepNet's relative update of the blocks."""

from __future__ import annotations

from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch

from normlab.callbacks.update_norm import UpdateNorm
from normlab.models.transformer import GPT
from normlab.norms import norm_partial

LAYERNORM = norm_partial("layernorm", eps=1e-5, elementwise_affine=True, bias=True)


class Task(pl.LightningModule):
    def __init__(self, placement: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = GPT(65, {"name": placement, "arch": "decoder"}, LAYERNORM, depth=3,
                       d_model=32, n_heads=2, ctx=16)  # fmt: skip

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.net(idx)


class Logged:
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict]] = []

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.rows.append((step, dict(metrics)))


def _started(callback: UpdateNorm, task: Task) -> tuple[SimpleNamespace, torch.Tensor]:
    """The callback after it has seen the first batch (x, y) at step 0."""
    trainer = SimpleNamespace(global_step=0, loggers=[Logged()])
    idx = torch.randint(0, 65, (4, 16), generator=torch.Generator().manual_seed(1))
    callback.on_train_batch_start(trainer, task, (idx, idx), 0)
    return trainer, idx


def _logged_after(callback: UpdateNorm, task: Task, trainer: SimpleNamespace) -> dict:
    trainer.global_step = 1
    callback.on_train_batch_end(trainer, task, None, None, 0)
    return trainer.loggers[0].rows[-1][1]


def test_default_logs_the_logits_change_alone():
    task = Task("post")
    callback = UpdateNorm(steps=5)
    trainer, idx = _started(callback, task)
    before = task(idx).detach()
    with torch.no_grad():
        task.net.pos_emb.weight.add_(0.1)
    logged = _logged_after(callback, task, trainer)
    assert set(logged) == {"update_norm"}
    assert logged["update_norm"] == pytest.approx(
        float((task(idx).detach() - before).norm(dim=-1).mean()), rel=1e-5
    )


@pytest.mark.parametrize("placement", ["post", "deepnorm"])
def test_blocks_update_is_relative_and_leaves_out_the_embedding(placement: str):
    task = Task(placement)
    callback = UpdateNorm(steps=5, blocks="net.blocks")
    trainer, idx = _started(callback, task)
    with torch.no_grad():  # the embedding alone changes: the logits move, the blocks do not
        task.net.pos_emb.weight.add_(0.5)
    logged = _logged_after(callback, task, trainer)
    assert logged["update/model"] > 0.01 and logged["update/blocks"] == 0.0
    with torch.no_grad():
        h = task.net.tok_emb(idx) + task.net.pos_emb(torch.arange(16)) - 0.5  # init's stream
        start = h
        for block in task.net.blocks:
            start = block(start)
        task.net.blocks[1].mlp.sublayer.fc2.weight.mul_(1.5)
        now = h
        for block in task.net.blocks:
            now = block(now)
    logged = _logged_after(callback, task, trainer)
    assert logged["update/blocks"] == pytest.approx(
        float((now - start).norm() / start.norm()), rel=1e-4
    )
    resumed = UpdateNorm(steps=5, blocks="net.blocks")
    resumed.load_state_dict(callback.state_dict())  # a resumed run measures against init
    assert _logged_after(resumed, task, trainer) == pytest.approx(logged, rel=1e-6)
