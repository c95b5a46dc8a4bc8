"""Golden losses: the first 20 training losses of LeNet, the GPT, the LSTM and the DiT at seed 0,
bit for bit, against tests/golden/losses.json.

The file is written by this module, never by hand: `python tests/test_golden.py --regen [NAME ...]`
runs the four configs (or the named ones, keeping the others' entries) and stores each loss as
the hex float of its float32 value, with the CPU it ran on (`cpu`). A change that moves any
of these losses (a norm's arithmetic, an init, the data order, the optimizer) fails here; when
it is meant to, regenerate the file and say why in the commit. On the CPU the file names the
losses must match bit for bit; on another (its float32 kernels sum in another order: the same
code moved LeNet's losses by about 1e-7 and the LSTM's by up to 1e-5 on an AMD EPYC against
the file's earlier CPU) within a relative 1e-4, far below what any change of the arithmetic
moves them.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # conftest when run as a script
from conftest import REPO  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden" / "losses.json"
STEPS = 20
RUNS = {  # name -> the train.py overrides of the run it pins
    "lenet": [],  # python train.py: LeNet+BN on Fashion-MNIST
    "gpt": ["model=transformer"],
    "lstm": ["model=lstm", "norm=layernorm"],
    "dit": ["experiment=dit"],
}
# Added to every run; none of these changes the first STEPS losses. Validation, its sanity check
# and the test split draw nothing from the training RNG streams; the sample grids and the FID
# run only after a validation. One thread: float sums in the same order on any machine.
# The run is stopped after STEPS steps by FirstLosses, not by limit_train_batches or max_steps,
# which would shorten the cosine schedule the learning rate follows from step 1 on.
SHRINK = [
    "seed=0",
    "num_threads=1",
    "trainer.limit_val_batches=0",
    "test=false",
    "++callbacks.samples=null",
    "++callbacks.fid=null",
]


OTHER_CPU_RTOL = 1e-4  # the tolerance on a CPU other than the file's


def cpu() -> str:
    """This machine's CPU as far as its float32 kernels go: vendor, model, torch's capability."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    fields = [re.search(rf"^{key}\s*:\s*(.*)$", info, re.M) for key in ("vendor_id", "model name")]
    parts = [m.group(1).strip() for m in fields if m]
    return " / ".join([*parts, torch.backends.cpu.get_cpu_capability()])


class FirstLosses(pl.Callback):
    """Records the loss of each training step and stops the run after `steps` of them."""

    def __init__(self, steps: int):
        self.steps = steps
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"]
        assert loss.dtype == torch.float32
        self.losses.append(loss.item())  # a float32 is exact as a Python float
        if len(self.losses) == self.steps:
            trainer.should_stop = True


def first_losses(overrides: list[str], run_dir: Path) -> list[float]:
    """The first STEPS training losses of `python train.py <overrides>` (plus SHRINK)."""
    from hydra.core.hydra_config import HydraConfig

    from normlab.config import compose
    from normlab.run import build, fit

    cfg = compose([*overrides, *SHRINK], run_dir, REPO / "conf")
    try:
        recorder = FirstLosses(STEPS)
        result = fit(build(cfg, callbacks=[recorder]))
    finally:
        HydraConfig.instance().cfg = None
    assert result["status"] == "ok", result
    assert len(recorder.losses) == STEPS
    return recorder.losses


def regenerate(names: list[str]) -> dict[str, list[str]]:
    """Run the entries `names` of RUNS (all when empty) and write their losses into GOLDEN,
    {name: [hex float of each loss]}, keeping the other entries; return the new ones."""
    unknown = set(names) - set(RUNS)
    if unknown:
        raise SystemExit(f"unknown runs {sorted(unknown)}; the runs are {list(RUNS)}")
    runs = json.loads(GOLDEN.read_text()) if names and GOLDEN.is_file() else {}
    new = {}
    for name in names or RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            new[name] = [x.hex() for x in first_losses(RUNS[name], Path(tmp))]
    runs.update(new)
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"cpu": cpu(), **{k: runs[k] for k in RUNS}}, indent=1) + "\n")
    return new


@pytest.mark.parametrize("name", list(RUNS))
def test_first_losses_match_the_golden_file_bit_for_bit(name, tmp_path):
    golden = json.loads(GOLDEN.read_text())
    expected = [float.fromhex(x) for x in golden[name]]
    assert len(expected) == STEPS
    losses = first_losses(RUNS[name], tmp_path)
    rtol = 0.0 if golden.get("cpu") == cpu() else OTHER_CPU_RTOL
    differ = [(i, e, x) for i, (e, x) in enumerate(zip(expected, losses, strict=True))
              if abs(x - e) > rtol * abs(e)]  # fmt: skip
    assert not differ, f"{name}: (step, golden, now) that differ (rtol {rtol:g}): {differ}"


if __name__ == "__main__":
    if sys.argv[1:2] != ["--regen"]:
        raise SystemExit(f"usage: python {sys.argv[0]} --regen [NAME ...]  (rewrites {GOLDEN})")
    for name, values in regenerate(sys.argv[2:]).items():
        print(name, " ".join(f"{float.fromhex(x):.6f}" for x in values))
