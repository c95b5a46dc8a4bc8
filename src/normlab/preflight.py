"""One forward pass on a dummy batch before training, so bad combinations fail at once.

Runs on a copy of the task (running statistics untouched) in training mode with the real
per-device batch size; an error is re-raised naming the innermost layer that raised it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from normlab.errors import ConfigError, UserError


def preflight(task: nn.Module, batch_size: int) -> None:
    """Run task(*task.example_input(batch_size)) on a copy; raise ConfigError naming the layer."""
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
