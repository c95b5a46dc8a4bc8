"""The classification task's epoch metrics against a computation by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from normlab.tasks.classification import EpochTotals


def test_epoch_totals_are_the_mean_batch_loss_and_the_accuracy_over_samples():
    gen = torch.Generator().manual_seed(0)
    sizes = [7, 16, 3]  # batches of unequal size: the loss is a mean over batches, as logged
    batches = [(torch.randn(n, 10, generator=gen), torch.randint(0, 10, (n,), generator=gen))
               for n in sizes]  # fmt: skip
    totals = EpochTotals()
    for logits, y in batches:
        totals.update(F.cross_entropy(logits, y), logits, y)
    loss, acc = totals.compute()
    losses = [F.cross_entropy(logits, y).item() for logits, y in batches]
    hits = sum(int(logits[i].argmax() == y[i]) for logits, y in batches for i in range(len(y)))
    assert loss.dtype == acc.dtype == torch.float32
    assert abs(loss.item() - sum(losses) / len(losses)) < 1e-6
    assert abs(acc.item() - hits / sum(sizes)) < 1e-7
    totals.reset()
    assert int(totals.batches) == 0 and int(totals.seen) == 0


@pytest.mark.filterwarnings("ignore:The ..compute.. method")
def test_epoch_totals_survive_a_state_dict_round_trip():
    logits, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 0, 1])
    totals = EpochTotals()
    totals.persistent(True)
    totals.update(torch.tensor(0.25), logits, y)
    restored = EpochTotals()
    restored.persistent(True)
    restored.load_state_dict(totals.state_dict())
    assert sorted(totals.state_dict()) == ["batches", "correct", "loss_sum", "seen"]
    assert [float(t) for t in restored.compute()] == [float(t) for t in totals.compute()]
