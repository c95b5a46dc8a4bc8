"""A norm's forward reaches torch's kernel in at most two of normlab's frames: `impl` is
resolved once in `__init__`, not re-dispatched on every call."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import normlab
from normlab.norms import create_norm

NORMLAB = str(Path(normlab.__file__).parent)
FUNCTIONAL = F.__file__


def normlab_frames(module: torch.nn.Module, x: torch.Tensor) -> list[str]:
    """The normlab functions on the stack when `module(x)` first enters torch.nn.functional,
    outermost first (an empty list: it never did)."""
    seen: list[str] = []

    def profile(frame, event, arg):  # noqa: ANN001, ARG001
        if event != "call" or seen or frame.f_code.co_filename != FUNCTIONAL:
            return
        caller = frame.f_back
        while caller is not None:
            if caller.f_code.co_filename.startswith(NORMLAB):
                seen.insert(0, caller.f_code.co_qualname)
            caller = caller.f_back
        seen.append(f"F.{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        module(x)
    finally:
        sys.setprofile(None)
    return seen


CASES = [  # name, keywords, input shape, torch's kernel, normlab frames at most
    ("batchnorm", {}, (8, 4, 5, 5), "F.batch_norm", 2),
    ("layernorm", {}, (8, 6, 4), "F.layer_norm", 2),
    ("groupnorm", {"num_groups": 2}, (8, 4, 5, 5), "F.group_norm", 2),
    ("batchrenorm", {}, (8, 4, 5, 5), "F.batch_norm", 2),
    # its forward first takes an unbatched (C, *spatial) sample as a batch of one
    ("instancenorm", {}, (8, 4, 5, 5), "F.instance_norm", 3),
]

NAMES = [case[0] for case in CASES]


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(("name", "kw", "shape", "kernel", "most"), CASES, ids=NAMES)
def test_forward_reaches_the_kernel_in_at_most_two_normlab_frames(
    name, kw, shape, kernel, most, training
):
    norm = create_norm(name, shape[-1] if name == "layernorm" else shape[1], **kw)
    norm.train(training)
    frames = normlab_frames(norm, torch.randn(shape))
    assert frames[-1] == kernel, frames
    assert len(frames) - 1 <= most, frames
