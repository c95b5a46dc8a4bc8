"""Speed and memory of normlab against its baselines: `python scripts/bench.py [norms|train|all]`
(normlab.bench.main).

norms: forward + backward time and activation memory of every normlab norm (each impl) against
       the torch.nn layer (and timm's where it has one), at a CNN shape (256, 16, 14, 14) and a
       Transformer shape (64, 256, 512); float32 on CPU, plus float32 and bf16 on a GPU if present.
train: one epoch of LeNet+BN on Fashion-MNIST through normlab.run.build and fit (the composed
       config of `python train.py`, in this process) against a hand-written loop over the same
       tensors with the same model, batch order and optimizer; the same for N steps of the
       Transformer LM; and end to end, `python train.py` (the default 10-epoch run) against its
       hand-written twin run (normlab.bench.twin), each as its own process.

Every figure is a ratio to a baseline measured in the same run. Norms: the layers are called in
turn, in a random order each round, the ratio taken per round, then the median over rounds
(timing.interleaved). Training: the median step is measured paired, the hand-written loop
stepping a twin model after each of normlab's steps in the same run (timing.PairedSteps), the
ratio taken per pair, then the median; whole runs of each side, in turn, give the other rows;
end to end, the two processes run in turn, the wall-time ratio taken per round, then the median.
Prints markdown tables and writes outputs/bench-local/<part>.csv and <part>.md (keep_heap/ under
it with --keep-heap), a folder git ignores; --out DIR writes them to DIR instead. The committed
tables (outputs/bench/) are written with --out outputs/bench, on an idle machine.

--keep-heap: glibc returns freed memory above a threshold to the OS (large blocks are mmapped,
the heap top is trimmed), so a path that allocates many full-size temporaries pays page faults
on every call, and how many depends on the allocation pattern of the whole process. The flag
keeps freed memory in the process (normlab.compute.keep_heap, as `keep_heap=true` in a run),
which takes those page faults out of every layer's time alike; without it the numbers are what
a default process sees.
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import signal
import sys
from pathlib import Path

from normlab import layout
from normlab.compute import keep_heap
from normlab.tables import markdown_table

REPO = layout.root()  # the checkout (or the cwd): outputs/ goes below it
OUT = REPO / "outputs" / "bench-local"  # ignored by git; outputs/bench/ holds the committed tables


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def _parser() -> argparse.ArgumentParser:
    from normlab.bench import norms, train  # lazy: torch and Lightning, only for the parser

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", default="all", choices=["norms", "train", "all"])
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"repeats (norms {norms.ROUNDS}, train {train.ROUNDS}); fewer norms rounds also "
        "shorten each case's minimum time",
    )
    cases = [*train.TRAIN_CASES, *train.END_TO_END]
    parser.add_argument("--train-cases", nargs="*", default=None, choices=cases)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of this process (default: torch's); end-to-end runs keep torch's",
    )
    parser.add_argument(
        "--keep-heap", action="store_true", help="glibc: no mmap/trim of freed memory (see top)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="dir for <part>.csv and .md (default: outputs/bench-local/, ignored by git, "
        "keep_heap/ under it with --keep-heap; the committed tables: --out outputs/bench)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    import torch  # lazy: torch (seconds) only when a bench runs: `import normlab.bench` is light

    from normlab.bench import eta, norms, train  # lazy: torch and Lightning, as above

    args = _parser().parse_args(argv)
    heap = "default"
    if args.keep_heap:
        heap = "kept (mallopt)" if keep_heap() else "default (not glibc: --keep-heap ignored)"
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("NORMLAB_DATA", str(REPO.parent / "shared" / "data"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    setting = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {load:.1f}, THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')}, "
        f"heap: {heap}"
    )
    print(setting)
    out = args.out or (OUT / "keep_heap" if args.keep_heap else OUT)  # default: by heap setting

    saved: list[str] = []  # the parts whose tables are written
    cases = eta.plan(args.part, args.rounds, args.train_cases)
    print(eta.estimate_line(cases, args.rounds), flush=True)
    progress = eta.Progress(cases, lambda line: print(line, flush=True))

    def report(part: str, title: str, rows: list[dict], cols: list[str], note: str = "") -> None:
        """Print the table; write <out>/<part>.csv and <part>.md (with the command, setting and
        note)."""
        saved.append(part)
        write_csv(rows, out / f"{part}.csv")
        table = markdown_table(cols, ([r.get(c, "") for c in cols] for r in rows))
        print(f"\n## {title}\n\n{table}")
        given = argv if argv is not None else sys.argv[1:]
        command = " ".join(["python scripts/bench.py", *given])
        (out / f"{part}.md").write_text(f"# {title}\n\n`{command}`: {setting}{note}\n\n{table}\n")

    try:
        if args.part in ("norms", "all"):
            rows = norms.bench(args.rounds or norms.ROUNDS, progress.tick)
            report("norms", norms.TITLE, rows, norms.COLUMNS)
        if args.part in ("train", "all"):
            rows = train.bench(args.rounds or train.ROUNDS, args.train_cases, progress.tick)
            report("train", train.TITLE, rows, train.COLUMNS, train.HEAP_NOTE)
    except BaseException as err:  # Ctrl+C (Lightning turns one inside fit into sys.exit(1))
        from normlab.loggers import killed_by  # lazy: Lightning, only after a signal

        signum = killed_by(err)
        if not signum:
            raise
        given = argv if argv is not None else sys.argv[1:]
        print(interrupted(signum, args.part, saved, out, given), file=sys.stderr)
        raise SystemExit(128 + signum) from None
    print(f"\nCSV and markdown in {out}")


def interrupted(signum: int, part: str, saved: list[str], out: Path, given: list[str]) -> str:
    """Two lines for a bench ended by a signal: what it saved (each part's tables are written
    when the part ends), and the command that runs what is left (the parts not saved, with the
    same options)."""
    name = signal.Signals(signum).name
    if saved:
        wrote = "saved " + ", ".join(f"{out / p}.csv and {p}.md" for p in saved)
    else:
        wrote = "nothing saved yet (a part's tables are written when the part ends)"
    left = "train" if part == "all" and "norms" in saved else part
    options = [a for a in given if a not in ("norms", "train", "all")]
    command = shlex.join(["python", "scripts/bench.py", left, *options])
    return f"interrupted ({name}): {wrote}\ncontinue with: {command}"
