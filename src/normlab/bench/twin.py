"""The hand-written twin of a `python train.py` run, as its own process: plain PyTorch, no
Lightning. `python -m normlab.bench.twin [overrides]` trains what `python train.py [overrides]`
trains (an image classifier on Fashion-MNIST, e.g. the default LeNet+BN): the same model and
init, data files, train/val split and normalization, batch order, optimizer and per-step lr
schedule, validation after each epoch, then the test split with the weights of the best
validation accuracy (kept in memory). It prints one JSON line: steps, best val/acc, test/acc
and test/loss. It keeps no logs, writes no files and leaves the C heap as glibc sets it, as a
plain script does (a run keeps it: keep_heap): the bench's baseline for what a user waits for
(normlab.bench.train.END_TO_END).
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra.utils import instantiate

from normlab import layout
from normlab.config import compose
from normlab.data.tensor_loader import TensorLoader

REPO = layout.root()
FILES = {"train": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
         "test": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}  # fmt: skip


def read_idx(path: Path) -> torch.Tensor:
    """An IDX file (the MNIST format) as a uint8 tensor: a big-endian header, then the bytes."""
    data = path.read_bytes()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(data[4 + 4 * ndim :]), dtype=torch.uint8).view(shape)


def splits(root: Path, val_size: int, split_seed: int) -> dict[str, tuple[torch.Tensor, ...]]:
    """Fashion-MNIST's train/val/test as the run's data module makes them: val carved from the
    training images by split_seed, pixels standardized by the training split's mean and std."""
    raw = root / "FashionMNIST" / "raw"
    images, labels = read_idx(raw / FILES["train"]), read_idx(raw / FILES["train_labels"])
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(split_seed))
    train, val = order[val_size:], order[:val_size]
    pixels = images[train].float().div_(255)
    mean, std = pixels.mean().item(), pixels.std().item()

    def norm(x: torch.Tensor) -> torch.Tensor:
        return x.float().div_(255).sub_(mean).div_(std).unsqueeze(1)

    test = (read_idx(raw / FILES["test"]), read_idx(raw / FILES["test_labels"]))
    return {
        "train": (norm(images[train]), labels[train].long()),
        "val": (norm(images[val]), labels[val].long()),
        "test": (norm(test[0]), test[1].long()),
    }


def schedule(optim: dict, total_steps: int):
    """The lr factor of step s: linear warmup, then constant or cosine decay (optim config)."""
    warmup, kind = int(optim.get("warmup_steps", 0)), optim.get("schedule", "constant")
    floor = float(optim.get("min_lr_ratio", 0.0))
    if kind not in ("constant", "cosine"):
        raise SystemExit(f"twin: optim.schedule={kind} is not written here (constant, cosine)")

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if kind == "constant" or step == warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def limit(n: int, value: int | float | None) -> int:
    """Batches of a loader of n under a trainer.limit_*_batches value (None, a count or a
    fraction, as Lightning reads it)."""
    if value is None:
        return n
    return min(n, int(value)) if isinstance(value, int) else int(n * value)


@torch.no_grad()
def evaluate(net: torch.nn.Module, loader: TensorLoader, batches: int) -> tuple[float, float]:
    """Mean batch loss and accuracy over the first `batches` batches, in eval mode."""
    net.eval()
    losses, correct, seen = [], 0, 0
    for i, (x, y) in enumerate(loader):
        if i == batches:
            break
        logits = net(x)
        losses.append(F.cross_entropy(logits, y).item())
        correct += int((logits.argmax(1) == y).sum())
        seen += len(y)
    net.train()
    return sum(losses) / len(losses), correct / seen


def main(argv: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose(argv, tmp, layout.conf_dir())
    if not str(cfg.data._target_).endswith("FashionMNISTDataModule"):
        raise SystemExit(f"twin: data={cfg.data._target_} is not written here (fashion_mnist)")
    seed = int(cfg.seed)
    random.seed(seed)
    torch.manual_seed(seed)
    if cfg.get("num_threads"):
        torch.set_num_threads(int(cfg.num_threads))
    data = splits(Path(cfg.data.root), int(cfg.data.val_size), int(cfg.data.split_seed))
    net = instantiate(cfg.model.net)  # the run's init: the same seed, then the net first
    optim = dict(cfg.optim)
    decay = [p for p in net.parameters() if p.ndim >= 2]
    groups = [
        {"params": decay, "weight_decay": float(optim.get("weight_decay") or 0.0)},
        {"params": [p for p in net.parameters() if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = instantiate(cfg.optim.optimizer)(groups)
    eval_batch = int(cfg.data.get("eval_batch_size", 1000))
    train = TensorLoader(data["train"], int(cfg.batch), shuffle=True, drop_last=True, seed=seed)
    val = TensorLoader(data["val"], eval_batch)
    trainer = cfg.trainer
    steps = limit(len(train), trainer.limit_train_batches)
    epochs = int(trainer.max_epochs)
    lr = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(optim, steps * epochs))
    best, best_acc = None, -1.0
    for epoch in range(epochs):
        train.epoch_fn = lambda epoch=epoch: epoch
        for i, (x, y) in enumerate(train):
            if i == steps:
                break
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            lr.step()
        val_loss, val_acc = evaluate(net, val, limit(len(val), trainer.limit_val_batches))
        print(f"epoch {epoch + 1}/{epochs}  val/acc {val_acc:.4f}  val/loss {val_loss:.4f}",
              file=sys.stderr)  # fmt: skip
        if val_acc > best_acc:
            best, best_acc = copy.deepcopy(net.state_dict()), val_acc
    result = {"steps": steps * epochs, "val/acc": best_acc}
    if cfg.get("test"):
        net.load_state_dict(best)
        test = TensorLoader(data["test"], eval_batch)
        loss, acc = evaluate(net, test, limit(len(test), trainer.limit_test_batches))
        result.update({"test/acc": acc, "test/loss": loss})
    return result


if __name__ == "__main__":
    os.environ.setdefault("NORMLAB_DATA", str(REPO.parent / "shared" / "data"))
    print(json.dumps(main(sys.argv[1:])))
