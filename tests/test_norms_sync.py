"""Synchronised BatchNorm over 2 CPU processes (gloo) equals one process with the whole batch."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_norms_no_host_sync import host_reads_raise

from normlab.norms import create_norm

TOL = {"rtol": 1e-5, "atol": 1e-5}
SPLIT = (2, 4)  # rows of the batch of 6 on rank 0 and rank 1: uneven on purpose
# (impl, input shape): every impl takes the synchronised path in distributed training
CASES = [("fast", (6, 3, 2, 2)), ("reference", (6, 3)), ("manual", (6, 3, 4))]
STEPS = 3


def _run(impl: str, shape: tuple[int, ...], rows: slice, sync: bool) -> dict[str, list]:
    """Train steps of a BN on `rows` of fixed batches; what each step produced, then eval."""
    torch.manual_seed(0)
    bn = create_norm("batchnorm", shape[1], impl=impl, sync=sync, momentum=None)
    with torch.no_grad():
        bn.weight.normal_()
        bn.bias.normal_()
    out: dict[str, list] = {"y": [], "dx": [], "dw": [], "db": []}
    for step in range(STEPS):
        x = (torch.randn(shape) * 2 + step)[rows].requires_grad_()
        g = torch.randn(shape)[rows]
        with host_reads_raise(("item", "tolist")) if sync else contextlib.nullcontext():
            y = bn(x)  # synchronised: the statistics reduced as tensors, never read on the host
            y.backward(g)
        out["y"].append(y.detach())
        out["dx"].append(x.grad)
        out["dw"].append(bn.weight.grad.clone())
        out["db"].append(bn.bias.grad.clone())
        bn.zero_grad()
    out["state"] = [bn.state_dict()]
    out["eval"] = [bn.eval()(torch.randn(shape)[rows])]
    return out


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    start = sum(SPLIT[:rank])
    rows = slice(start, start + SPLIT[rank])
    results = [_run(impl, shape, rows, sync=True) for impl, shape in CASES]
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_sync_batchnorm_two_processes_equal_one_process(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for i, (impl, shape) in enumerate(CASES):
        whole = _run(impl, shape, slice(None), sync=False)
        parts = [ranks[0][i], ranks[1][i]]
        for step in range(STEPS):
            for key in ("y", "dx"):  # each process holds its rows
                joined = torch.cat([parts[0][key][step], parts[1][key][step]])
                torch.testing.assert_close(joined, whole[key][step], **TOL, msg=f"{impl} {key}")
            for key in ("dw", "db"):  # summed over processes, as DDP's all-reduce would
                summed = parts[0][key][step] + parts[1][key][step]
                torch.testing.assert_close(summed, whole[key][step], **TOL, msg=f"{impl} {key}")
        for part in parts:  # running statistics: global, the same on both processes
            for key, value in whole["state"][0].items():
                torch.testing.assert_close(part["state"][0][key], value, **TOL, msg=key)
        joined_eval = torch.cat([parts[0]["eval"][0], parts[1]["eval"][0]])
        torch.testing.assert_close(joined_eval, whole["eval"][0], **TOL)
