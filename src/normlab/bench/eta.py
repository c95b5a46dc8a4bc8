"""How long a bench will take, said before it starts, and `k/N done, ETA ...` as its cases end.

Each case's time is planned from what it runs: a norms case calls its slowest layer for the
part's minimum time (norms.MIN_TOTAL_S, scaled by --rounds) and its other layers alike, so about
layers x that; a training case takes per round the committed times (outputs/bench/train.csv) of
both sides (in process: three runs of each side a round, counted as two whole runs of both;
end to end: one run of each side). The ETA scales what is left of the plan by how much slower
or faster than planned the finished cases ran on this machine.
"""

from __future__ import annotations

import csv
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from normlab import layout
from normlab.bench import norms, train
from normlab.callbacks.progress import duration

COMMITTED = layout.root() / "outputs" / "bench" / "train.csv"


def committed_seconds(path: Path = COMMITTED) -> dict[str, float]:
    """A training case's committed seconds of one round, both sides, by case name."""
    if not path.is_file():
        return {}
    seconds = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            both = float(row["hand_s"]) + float(row["normlab_s"])
            if row["measure"] == "build + fit":  # in process: hand, normlab, paired a round
                seconds[row["case"]] = 2 * both
            elif row["measure"].startswith("end to end"):
                seconds[row["case"]] = both
    return seconds


def plan(part: str, rounds: int | None, names: list[str] | None) -> dict[str, float]:
    """The cases this bench will run, in order, with each one's planned seconds."""
    cases: dict[str, float] = {}
    if part in ("norms", "all"):
        r = rounds or norms.ROUNDS
        per_layer = norms.MIN_TOTAL_S * min(r, norms.ROUNDS) / norms.ROUNDS
        settings = ["cpu float32"]
        if torch.cuda.is_available():
            settings += ["cuda float32", "cuda bfloat16"]
        for setting in settings:
            for case in norms.norm_cases():
                layers = len(case.baselines) + len(case.impls) + len(case.extra)
                shape = "x".join(map(str, case.shape))
                cases[f"{setting} {shape} {case.name}"] = layers * per_layer
    if part in ("train", "all"):
        known = committed_seconds()
        fallback = statistics.median(known.values()) if known else 60.0  # not committed: typical
        for name in [*train.TRAIN_CASES, *train.END_TO_END]:
            if not names or name in names:
                cases[name] = known.get(name, fallback) * (rounds or train.ROUNDS)
    return cases


def estimate_line(cases: dict[str, float], rounds: int | None) -> str:
    """`estimate: about T for N cases (...)`, printed before the work."""
    each = f"{rounds} rounds each" if rounds else "default rounds"
    return (
        f"estimate: about {duration(sum(cases.values()))} for {len(cases)} cases ({each}; "
        "committed times of an idle machine: a loaded one runs 2-5x slower)"
    )


class Progress:
    """Say `k/N done, ETA T (case)` as each planned case ends."""

    def __init__(self, cases: dict[str, float], say: Callable[[str], None] = print) -> None:
        self.cases, self.say, self.done = cases, say, 0
        self.planned_done = 0.0
        self.start = time.monotonic()

    def tick(self, name: str) -> None:
        self.planned_done += self.cases.get(name, 0.0)
        self.done += 1
        self.say(self.line(name, time.monotonic() - self.start))

    def line(self, name: str, elapsed: float) -> str:
        left = sum(self.cases.values()) - self.planned_done
        speed = elapsed / self.planned_done if self.planned_done > 0 else 1.0
        eta = duration(max(left, 0.0) * speed)
        return f"{self.done}/{len(self.cases)} done, ETA {eta} ({name})"
