"""One forward pass on a dummy batch before training, so bad combinations fail at once.

Runs on a copy of the task (running statistics untouched) in training mode with the real
per-device batch size; an error is re-raised naming the innermost layer that raised it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from normlab.errors import ConfigError, UserError


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(task: nn.Module, batch_size: int) -> None:
    """A network that can estimate its forward pass (forward_bytes(batch)) is refused, before
    anything is allocated, when that estimate exceeds the memory available."""
    estimate = getattr(getattr(task, "net", task), "forward_bytes", None)
    available = available_memory()
    if estimate is None or available is None:
        return
    need, how = estimate(batch_size)
    if need > available:
        raise ConfigError(
            f"a forward pass with batch={batch_size} needs about {need / 2**30:.1f} GiB ({how}) "
            f"but {available / 2**30:.1f} GiB of memory is available (MemAvailable): lower the "
            "batch or the model's size (model.net.ctx, ...)"
        )


def preflight(task: nn.Module, batch_size: int) -> None:
    """Run task(*task.example_input(batch_size)) on a copy; raise ConfigError naming the layer
    (or, before that, check_memory's estimate)."""
    check_memory(task, batch_size)
    probe = copy.deepcopy(task).train()
    stack: list[str] = []
    handles = []
    for name, module in probe.named_modules():
        if not name:
            continue

        def push(_m, _args, name=name):
            stack.append(name)

        def pop(_m, _args, _out):
            stack.pop()

        handles.append(module.register_forward_pre_hook(push))
        handles.append(module.register_forward_hook(pop))
    try:
        with torch.no_grad():
            probe(*probe.example_input(batch_size))
    except (RuntimeError, ValueError) as err:
        where = "the model"
        if stack:
            where = f"layer {stack[-1]} ({type(probe.get_submodule(stack[-1])).__name__})"
        if not isinstance(err, UserError):
            where = f"pre-flight forward pass failed at {where}"
        raise ConfigError(f"{where} with batch={batch_size}: {err}") from err
    finally:
        for h in handles:
            h.remove()
