"""Norms: forward + backward time and activation memory of every normlab norm (each impl)
against the torch.nn layer (and timm's where it has one), at a CNN shape (256, 16, 14, 14) and a
Transformer shape (64, 256, 512); float32 on CPU, plus float32 and bf16 on a GPU if present.
Target: fast <= 1.05x the torch layer; manual and reference are reported, not targeted.
RMSNorm's cases also time torch.compile(nn.RMSNorm) (inductor, fullgraph): the fused op
against what the compiler makes of torch's layer at the same shape (compilation happens in the
untimed warmup rounds).

The layers of a case are called in turn, in a random order each round, the ratio taken per
round, then the median over rounds (timing.interleaved).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from normlab.bench.timing import activation_bytes, interleaved, median_ms, ratio
from normlab.norms import _fused_rms, create_norm

CNN = (256, 16, 14, 14)
SEQ = (64, 256, 512)
FAST_TARGET = 1.05  # manual and reference impls: reported, no target
RMS_VS_LN_TARGET = 0.93  # fast RMSNorm / torch LayerNorm: the RMSNorm paper's smallest gain
ROUNDS = 15  # the default rounds of a case
MIN_TOTAL_S = 3.0  # at ROUNDS: seconds of calls of each case's slowest layer (more rounds for
# short calls); fewer rounds asked for scale it down alike (--rounds 1: a smoke run)
COLUMNS = ["device", "dtype", "shape", "norm", "layer", "ms", "time_ratio", "act_MiB",
           "mem_ratio", "target", "ok", "note"]  # fmt: skip
TITLE = "Norms: forward + backward, ratio to the first torch layer of each group"
COMPILE_BACKEND = "inductor"  # torch.compile's backend for the compiled torch RMSNorm rows


class ChannelsLast(nn.Module):
    """A channels-first torch layer applied to (B, T, D) features, as normlab's channel_dim=-1."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.movedim(-1, 1)).movedim(1, -1)  # (B, T, D)


@dataclass
class NormCase:
    """A normlab norm at one shape and the layers it is compared with (first: the baseline)."""

    shape: tuple[int, ...]
    name: str
    kwargs: dict[str, Any]
    baselines: dict[str, Callable[[], nn.Module]]
    impls: tuple[str, ...] = ("fast", "reference", "manual")
    note: str = ""
    extra: dict[str, Callable[[], nn.Module]] = field(default_factory=dict)


def compiled(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """A maker of torch.compile(make()): one graph (fullgraph), COMPILE_BACKEND."""
    return lambda: torch.compile(make(), backend=COMPILE_BACKEND, fullgraph=True)


def norm_cases() -> list[NormCase]:
    from timm import layers as timm_layers  # lazy: timm loads only for the norms cases

    c, d = CNN[1], SEQ[-1]
    return [
        NormCase(CNN, "batchnorm", {}, {
            "torch BatchNorm2d": lambda: nn.BatchNorm2d(c),
            "timm BatchNormAct2d": lambda: timm_layers.BatchNormAct2d(c, apply_act=False),
        }),
        NormCase(CNN, "groupnorm", {"num_groups": 4}, {
            "torch GroupNorm": lambda: nn.GroupNorm(4, c),
            "timm GroupNorm": lambda: timm_layers.GroupNorm(c, num_groups=4),
        }),
        NormCase(CNN, "instancenorm", {}, {"torch InstanceNorm2d": lambda: nn.InstanceNorm2d(c)}),
        NormCase(CNN, "layernorm", {"channel_dim": 1}, {
            "torch GroupNorm(1)": lambda: nn.GroupNorm(1, c),
            "timm GroupNorm1": lambda: timm_layers.GroupNorm1(c),
        }, note="over (C, H, W), per-channel affine"),
        NormCase(CNN, "rmsnorm", {"channel_dim": 1}, {
            "torch RMSNorm(C,H,W)": lambda: nn.RMSNorm(CNN[1:]),
        }, note="over (C, H, W); torch's weight is per element",
            extra={"torch.compile(RMSNorm(C,H,W))": compiled(lambda: nn.RMSNorm(CNN[1:]))}),
        NormCase(CNN, "prmsnorm", {"channel_dim": 1}, {
            "torch RMSNorm(C,H,W)": lambda: nn.RMSNorm(CNN[1:]),
        }, note="rms of the first 1/16 of the channels"),
        NormCase(SEQ, "layernorm", {}, {
            "torch LayerNorm": lambda: nn.LayerNorm(d),
            "timm LayerNorm": lambda: timm_layers.LayerNorm(d),
        }),
        NormCase(SEQ, "rmsnorm", {}, {
            "torch RMSNorm": lambda: nn.RMSNorm(d),
            "timm RmsNorm": lambda: timm_layers.RmsNorm(d),
        }, extra={
            "torch LayerNorm": lambda: nn.LayerNorm(d),
            "torch.compile(RMSNorm)": compiled(lambda: nn.RMSNorm(d)),
        }),
        NormCase(SEQ, "prmsnorm", {}, {"torch RMSNorm": lambda: nn.RMSNorm(d)},
                 note="rms of the first 32 of 512 features"),
        NormCase(SEQ, "batchnorm", {"channel_dim": -1}, {
            "torch BatchNorm1d": lambda: ChannelsLast(nn.BatchNorm1d(d)),
        }, note="features last, statistics over (B, T)"),
        NormCase(SEQ, "groupnorm", {"channel_dim": -1, "num_groups": 32}, {
            "torch GroupNorm": lambda: ChannelsLast(nn.GroupNorm(32, d)),
        }, note="features last"),
        NormCase(SEQ, "instancenorm", {"channel_dim": -1}, {
            "torch InstanceNorm1d": lambda: ChannelsLast(nn.InstanceNorm1d(d)),
        }, note="features last, statistics over T"),
    ]  # fmt: skip


def _norm_rows(case: NormCase, device: str, dtype: torch.dtype, rounds: int) -> list[dict]:
    kwargs = dict(case.kwargs)
    channel_dim = kwargs.pop("channel_dim", None)
    features = case.shape[1] if case.shape == CNN else case.shape[-1]
    layers: dict[str, nn.Module] = {k: make() for k, make in case.baselines.items()}
    for impl in case.impls:
        layers[f"normlab {impl}"] = create_norm(
            case.name, features, channel_dim=channel_dim, impl=impl, **kwargs
        )
    layers.update({k: make() for k, make in case.extra.items()})
    layers = {k: m.to(device=device, dtype=dtype).train() for k, m in layers.items()}
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(case.shape, generator=gen, device=device, dtype=dtype).requires_grad_()
    dy = torch.randn(case.shape, generator=gen, device=device, dtype=dtype)

    def step(module: nn.Module) -> Callable[[], None]:
        # gradients returned, not accumulated into .grad: every call does the same work
        inputs = [x, *(p for p in module.parameters() if p.requires_grad)]
        return lambda: torch.autograd.grad(module(x), inputs, dy)

    times = interleaved(
        {k: step(m) for k, m in layers.items()},
        rounds,
        warmup=2,
        device=device,
        min_sample_s=5e-4,  # one call per sample unless calls take microseconds
        min_total_s=MIN_TOTAL_S * min(rounds, ROUNDS) / ROUNDS,
    )
    memory = {k: activation_bytes(m, x) for k, m in layers.items()}
    return _rows(case, device, dtype, layers, times, memory)


def _rows(case: NormCase, device: str, dtype: torch.dtype, layers: dict[str, nn.Module],
          times: dict, memory: dict[str, int]) -> list[dict]:  # fmt: skip
    """One table row per layer of a case: its time and activation memory against the baseline."""
    base = next(iter(case.baselines))
    rows = []
    for name in layers:
        impl = name.removeprefix("normlab ") if name.startswith("normlab") else ""
        target = FAST_TARGET if impl == "fast" else None  # manual, reference: no target
        time_ratio = round(ratio(times, name, base), 3)  # judged as shown: 1.0504 is 1.05
        row = {
            "device": device,
            "dtype": str(dtype).removeprefix("torch."),
            "shape": "x".join(map(str, case.shape)),
            "norm": case.name,
            "layer": name,
            "ms": round(median_ms(times[name]), 3),
            "time_ratio": time_ratio,
            "act_MiB": round(memory[name] / 2**20, 2),
            "mem_ratio": round(memory[name] / memory[base], 3),
            "baseline": base,
            "target": f"<= {target}" if target else "",
            "ok": "" if target is None else ("yes" if time_ratio <= target else "NO"),
            "note": case.note,
        }
        if case.name == "rmsnorm" and impl == "fast" and "torch LayerNorm" in layers:
            vs_ln = ratio(times, name, "torch LayerNorm")
            row["vs_layernorm"] = round(vs_ln, 3)
            row["note"] = f"{vs_ln:.3f}x torch LayerNorm (target <= {RMS_VS_LN_TARGET})"
        if name.startswith("torch.compile"):  # the fused op against the compiled torch layer
            fast_vs = ratio(times, "normlab fast", name)
            row["fast_vs_compiled"] = round(fast_vs, 3)
            row["note"] = f"normlab fast {fast_vs:.3f}x this"
        rows.append(row)
    return rows


def bench(rounds: int, tick: Callable[[str], None] | None = None) -> list[dict]:
    """A row per layer of every case, at every device and dtype; tick(case) as each ends."""
    fused = _fused_rms.available()  # build the fused kernel before any timing
    print(f"fused RMSNorm kernel: {'on' if fused else 'OFF (pure-torch fast path)'}")
    settings = [("cpu", torch.float32)]
    if torch.cuda.is_available():
        settings += [("cuda", torch.float32), ("cuda", torch.bfloat16)]
    rows = []
    for device, dtype in settings:
        for case in norm_cases():
            rows += _norm_rows(case, device, dtype, rounds)
            last = rows[-1]
            print(f"  {device} {last['dtype']} {last['shape']} {case.name}: done", flush=True)
            if tick:
                tick(f"{device} {last['dtype']} {last['shape']} {case.name}")
    return rows
