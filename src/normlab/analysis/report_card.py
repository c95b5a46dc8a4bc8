"""A norm's report card (`python scripts/reproduce.py card ...`, dispatched here).

    python scripts/reproduce.py card --norm NAME|pkg.Class [--plugin MODULE]
                                     [--budget quick|card] [--jobs N] [--threads N]
                                     [--slots NAME,..]   # only these reproductions' slots
                                     [--decide]  # on to the seeds undecided verdicts plan
                                     [--retrain-baselines | --reuse-baselines]  # stale ones:
                                     # (default: replayed first, normlab.analysis.baselines)
    python scripts/reproduce.py card --leaderboard   # docs/cards.md from the built-in cards

A built-in norm (one whose arms the reproductions commit: batchnorm, layernorm, groupnorm,
rmsnorm, dyt, ...) is read from the committed evidence, no training. Any other norm runs in
every slot that fits its traits (normlab.analysis.card), through `reproduce.py NAME --norm X
--grids G`: finished jobs are reused, so an interrupted card resumes where it stopped. `card`
(the default budget) is evidence: each slot's grid at its reproduction's protocol and initial
seeds; `quick` is a smoke run of minutes, "smoke: not evidence", no verdicts, written under the
ignored outputs/cards/quick/.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from normlab import layout
from normlab.analysis import baselines, card, report, reproduce
from normlab.analysis.reproductions import REPRODUCTIONS

REPO = layout.root()  # --root's default: the checkout (or the cwd of an installed normlab)
CONF = layout.reproduce_dir()
COMMITTED = REPO / "outputs" / "figures"  # the reproductions' committed evidence: the baselines
QUICK_JOB_S = 60.0  # a --quick job's time (its budget is a minute)
FILES = ("md", "csv", "png")
hours = reproduce._hours  # one home for how a time reads


def check_norm(norm: str, plugin: str | None) -> None:
    """A bad --norm fails here, in one line, before any job: an unknown name, a class path that
    does not import, or something that is not an nn.Module class."""
    from torch import nn  # lazy: --help and bad input stay fast

    from normlab.norms import available_norms, norm_class  # lazy: as torch's, above

    if str(REPO) not in sys.path:  # plugins import from the repo root, as train.py's jobs do
        sys.path.insert(0, str(REPO))
    if plugin:
        try:
            importlib.import_module(plugin)
        except ImportError as err:
            raise SystemExit(f"card: --plugin {plugin} does not import: {err}") from None
    if "." in norm:
        module, _, attr = norm.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise SystemExit(f"card: --norm {norm} does not import: {err}") from None
        if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
            raise SystemExit(f"card: --norm {norm} is a {type(obj).__name__}, not an nn.Module "
                             "class (a norm class taking the number of features first)")
        return
    try:
        known = norm_class(norm) is not None
    except ValueError:  # NormConfigError: an unknown name
        known = False
    if not known:
        raise SystemExit(f"card: --norm {norm!r} is not a registered norm; known: "
                         f"{', '.join(available_norms())} (a user's: --plugin MODULE, or its "
                         "class path pkg.Class)")  # fmt: skip


def builtin(norm: str, slots: list[card.Slot]) -> bool:
    """Whether the norm's arms are committed by the reproductions (read, not trained)."""
    return any(norm in s.arms for s in slots)


def estimate(slots: list[card.Slot], quick: bool,
             decided: list[baselines.Baseline] | None = None
             ) -> tuple[float, list[float]]:  # fmt: skip
    """Seconds of one core per slot: the committed jobs of its first baseline, per seed, times
    the seeds the card runs (a quick job: a minute); and as much again for each baseline arm
    the card retrains there (baselines.retrain_s)."""
    per_slot = []
    for s in slots:
        again = sum(baselines.retrain_s(s, a, quick, COMMITTED)
                    for a in baselines.retrained(decided, s))  # fmt: skip
        repro = REPRODUCTIONS[s.reproduction]
        seeds = 2 if quick else repro.initial_seeds
        jobs = pd.read_csv(REPO / "outputs" / "figures" / s.reproduction / "jobs.csv")
        mine = jobs[jobs["arm"] == s.arm(s.baselines[0])]
        per_seed = len(mine) / max(1, mine["seed"].nunique())
        wall = QUICK_JOB_S if quick else float(mine["wall_time_s"].median())
        per_slot.append(seeds * per_seed * wall + again)
    return sum(per_slot), per_slot


def _evidence(slot: card.Slot, norm: str, quick: bool, root: Path,
              again: tuple[str, ...] = ()) -> pd.DataFrame:  # fmt: skip
    """The committed runs.csv of the slot's reproduction (the baselines), with the norm's own
    rows, and those of the baseline arms the card retrained, from NAME+norm's (a trained card)
    where they exist."""
    figures = root / "outputs" / "figures"
    data = pd.read_csv(COMMITTED / slot.reproduction / "runs.csv")
    own = (figures / "quick" if quick else figures) / f"{slot.reproduction}+{norm}" / "runs.csv"
    if own.is_file():
        arms, mine = (slot.arm(norm), *again), pd.read_csv(own)
        data = pd.concat([data[~baselines.of_arms(data, arms)],
                          mine[baselines.of_arms(mine, arms)]], ignore_index=True)  # fmt: skip
    return data


def _outcome(slot: card.Slot, norm: str, quick: bool, root: Path) -> str:
    """What the card's cell says where the norm has no value: 'not run', or how its jobs there
    ended ('diverged in 2 of 2 jobs': a norm whose runs blew up has a result, not a gap)."""
    figures = root / "outputs" / "figures" / ("quick" if quick else "")
    path = figures / f"{slot.reproduction}+{norm}" / "jobs.csv"
    if not path.is_file():
        return "not run"
    jobs = pd.read_csv(path)
    mine = jobs[jobs["arm"] == slot.arm(norm)]
    bad = mine[mine["status"] != "ok"]
    if mine.empty:
        return "not run"
    if bad.empty:  # a target never reached, or a deep stack that overflowed: nothing logged
        return f"no value from its {len(mine)} finished jobs"
    return f"{'/'.join(sorted(set(bad['status'])))} in {len(bad)} of {len(mine)} jobs"


def _to_a_decision(s: card.Slot, norm: str, plugin: str | None, jobs: int,
                   threads: int | None, root: Path,
                   again: tuple[str, ...] = ()) -> None:  # fmt: skip
    """--decide: a slot whose verdicts are undecided at its first seeds runs once more, to the
    seeds they plan for, and where still undecided there, to the cap: the reproductions' three
    looks (`reproduce.py NAME --decide`, normlab.analysis.sequential), finished jobs reused
    (the baseline arms the card retrained run the same seeds)."""
    def plan() -> int | None:
        return card.seeds_to_decide(card.rows(s, norm, _evidence(s, norm, False, root, again)))

    ran, first = s.initial, plan()
    looks = [("its undecided verdicts plan", first)] if first and first > ran else []
    for why, n in [*looks, ("still undecided at the plan: the cap", s.cap)]:
        if n is None or n <= ran or (why.startswith("still") and plan() is None):
            continue
        print(f"card {norm}: {s.title}: {why} {n} seeds (cap {s.cap})", flush=True)
        reproduce.reproduce(s.reproduction, False, jobs, root, n,
                            [f"{s.grid}-{norm}", *again], norm, plugin, threads=threads,
                            cut={s.grid: s.overrides})  # fmt: skip
        ran = n


def run(norm: str, plugin: str | None, quick: bool, jobs: int, threads: int | None,
        root: Path, only: list[str] | None = None, decide: bool = False,
        policy: str = "check") -> dict[str, Path]:  # fmt: skip
    """Train the norm in every slot it fits (unless built in; `only`: the slots of these
    reproductions; `decide`: each slot on to the seeds its undecided verdicts plan for), each
    slot's stale baselines replayed first and retrained where that says to (`policy`: check,
    retrain or reuse, normlab.analysis.baselines), then write its card."""
    slots = card.slots(CONF)
    unknown = sorted(set(only or ()) - {s.reproduction for s in slots})
    if unknown:
        raise SystemExit(f"card: --slots {','.join(unknown)}: no slot there; slots in "
                         f"{sorted({s.reproduction for s in slots})}")  # fmt: skip
    slots = [s for s in slots if only is None or s.reproduction in only]
    check_norm(norm, plugin)
    fits = {s.title: s.applicable(norm) for s in slots}
    todo = [s for s in slots if not fits[s.title]]
    decided = None
    if not builtin(norm, slots):
        decided = _baselines(todo, len(slots) - len(todo), norm, policy, quick, jobs, decide)
        total, each = estimate(todo, quick, decided)
        start, done = time.time(), 0.0
        for k, (s, secs) in enumerate(zip(todo, each, strict=True), 1):
            again = baselines.retrained(decided, s)
            reproduce.reproduce(s.reproduction, quick, jobs, root, None,
                                [f"{s.grid}-{norm}", *again], norm, plugin, threads=threads,
                                cut={s.grid: s.overrides})  # fmt: skip
            if decide:
                _to_a_decision(s, norm, plugin, jobs, threads, root, again)
            done += secs
            spent = time.time() - start
            left = spent / done * (total - done) if done else 0.0
            print(f"card {norm}: slot {k}/{len(todo)} done ({s.reproduction}: {s.title}); "
                  f"{hours(spent)} so far, about {hours(left)} left", flush=True)  # fmt: skip
    elif changed(slots, norm):
        print(changed(slots, norm), flush=True)
    return write(norm, slots, fits, quick, root, plugin, decide, decided, policy)


def _baselines(todo: list[card.Slot], skipped: int, norm: str, policy: str, quick: bool,
               jobs: int, decide: bool) -> list[baselines.Baseline]:  # fmt: skip
    """Print the card's estimate (the norm's jobs, the stale baselines' replays, the arms to
    retrain), replay the stale baselines, and say per arm what the card does with it."""
    from normlab.identity import code_version  # lazy: hashes src/ only when a card runs

    first = baselines.pending(todo, norm, policy, code_version(), COMMITTED)
    checks, replays, worst = baselines.costs(first, todo, quick, COMMITTED)
    total, _ = estimate(todo, quick, first)
    wall = (f"about {hours(total / jobs)} at --jobs {jobs}" if jobs > 1 else
            f"about {hours(total / 2)} at --jobs 2 on 2 cores")  # fmt: skip
    again = sum(b.action == "retrain" for b in first)
    print(f"card {norm}: {len(todo)} slots to train ({skipped} not applicable), about "
          f"{hours(total)} of one core with {again} baseline arms retrained, {wall} (from the "
          f"committed jobs' wall times); first {checks} stale baseline arms replayed (about "
          f"{hours(replays)}), each that differs retrained (up to {hours(worst)} more)"
          f"{'; smoke: not evidence' if quick else ''}"
          f"{'; --decide adds the seeds undecided verdicts plan' if decide else ''}",
          flush=True)  # fmt: skip
    return baselines.settle(first, todo, norm, COMMITTED, quick,
                            log=lambda text: print(text, flush=True))  # fmt: skip


POLICY_FLAGS = {"retrain": "--retrain-baselines", "reuse": "--reuse-baselines"}


def card_command(norm: str, plugin: str | None, quick: bool, slots: list[card.Slot],
                 decide: bool = False, policy: str = "check") -> str:  # fmt: skip
    """The command that makes this card, as its md prints it: --slots when it has only some."""
    cmd = f"python scripts/reproduce.py card --norm {norm}"
    cmd += (f" --plugin {plugin}" if plugin else "") + (" --budget quick" if quick else "")
    default = "reuse" if quick else "check"  # the budget's own policy goes without its flag
    flag = POLICY_FLAGS.get(policy) if policy != default else None
    cmd += (" --decide" if decide else "") + (f" {flag}" if flag else "")
    mine = list(dict.fromkeys(s.reproduction for s in slots))
    every = {s.reproduction for s in card.slots(CONF)}
    return cmd + (f" --slots {','.join(mine)}" if set(mine) != every else "")


def write(norm: str, slots: list[card.Slot], fits: dict[str, str], quick: bool,
          root: Path, plugin: str | None = None, decide: bool = False,
          decided: list[baselines.Baseline] | None = None,
          policy: str = "check") -> dict[str, Path]:  # fmt: skip
    """outputs/cards[/quick]/NORM.{md,csv,png} from the evidence (with the baseline arms the
    card retrained, from `decided`, which the md's table of baselines lists)."""
    rows: list = []
    for s in slots:
        if fits[s.title]:
            rows.append((s, fits[s.title]))
            continue
        unrun = _outcome(s, norm, quick, root)
        data = _evidence(s, norm, quick, root, baselines.retrained(decided, s))
        rows += [replace(r, unrun=unrun) for r in card.rows(s, norm, data, smoke=quick)]
    frame = card.table(rows)
    out = root / "outputs" / "cards" / ("quick" if quick else "")
    out.mkdir(parents=True, exist_ok=True)
    safe = norm.replace("/", "_")
    paths = {k: out / f"{safe}.{k}" for k in FILES}
    frame.to_csv(paths["csv"], index=False, float_format=report.FLOAT)
    card.figure(norm, rows, paths["png"])
    how = ("read from the committed evidence (no training)" if builtin(norm, slots) else
           f"`{card_command(norm, plugin, quick, slots, decide, policy)}`")  # fmt: skip
    header = [f"# Report card: {norm}", "", *([f"**{card.SMOKE}**", ""] if quick else []),
              f"![{safe}]({safe}.png)", "", f"Command: {how}  ",
              "Verdicts: the norm against each baseline, paired by seed, by the reproductions' "
              "rules (gates, the sequential boundary, an equivalence band per quantity); an "
              "undecided one says how many seeds its plan asks for (`--decide` runs them, up to "
              "the reproduction's cap).  ",
              "Bands: " + "; ".join(dict.fromkeys(f"{s.reproduction}: {s.delta_why}"
                                                  for s in slots))]  # fmt: skip
    if decided is None:  # a built-in norm's card: the committed evidence alone
        header.append(versions(slots, norm))
    text = card.markdown(norm, frame, header)
    paths["md"].write_text(text + ("\n" + baselines.markdown(decided) if decided else ""))
    return paths


def baseline_versions(slots: list[card.Slot], norm: str) -> dict[str, set[str]]:
    """The training-code versions the baselines' committed jobs ran -> the reproductions."""
    seen: dict[str, set[str]] = {}
    for s in slots:
        jobs = pd.read_csv(REPO / "outputs" / "figures" / s.reproduction / "jobs.csv")
        arms = [s.arm(b) for b in s.baselines if b != norm]
        for v in jobs[jobs["arm"].isin(arms)]["code_version"].dropna().astype(str):
            seen.setdefault(v, set()).add(s.reproduction)
    return seen


def versions(slots: list[card.Slot], norm: str) -> str:
    """The card md's line on its baselines: read as committed, from the versions they ran."""
    seen = baseline_versions(slots, norm)
    listed = "; ".join(f"{v} ({', '.join(sorted(r))})" for v, r in sorted(seen.items()))
    return (f"Baselines: the committed jobs, training code {listed} (normlab.identity); "
            "read as committed, never retrained by a card (to retrain a baseline: "
            "`python scripts/reproduce.py NAME --grids GRID`).")


def changed(slots: list[card.Slot], norm: str) -> str:
    """'' where every baseline ran today's training code, else a line saying which did not."""
    from normlab.identity import code_version  # lazy: hashes src/ only when a card is written

    now = code_version()
    if set(baseline_versions(slots, norm)) <= {now}:
        return ""
    return (f"card {norm}: today's training code is {now}; the baselines are read as committed, "
            "from the versions its md lists")


BUILTIN = ("batchnorm", "layernorm", "groupnorm", "rmsnorm", "dyt")  # the leaderboard's rows



def leaderboard(root: Path, norms: tuple[str, ...] = BUILTIN) -> Path:
    """docs/cards.md: the built-in norms' committed cards as one table, then the committed cards
    of norms the reproductions never ran (trained by `card --norm X`), and how to run one."""
    cards, others = {}, {}
    for path in sorted((root / "outputs" / "cards").glob("*.csv")):
        (cards if path.stem in norms else others)[path.stem] = pd.read_csv(path,
                                                                           keep_default_na=False)
    cards = {n: cards[n] for n in norms if n in cards}
    text = [
        "# Report cards", "",
        "Each built-in norm's card (outputs/cards/NORM.md), one row per norm: its mean per slot "
        "quantity and its verdicts against the slot's baselines. Regenerate with "
        "`python scripts/reproduce.py card --leaderboard`; a norm of your own: "
        "`python scripts/reproduce.py card --norm NAME --plugin MODULE`.", "",
        card.leaderboard(cards), ""]  # fmt: skip
    if others:
        text += ["## Norms the reproductions never ran", "",
                 "Their cards trained the norm in every slot it fits, beside the baselines' "
                 "committed jobs (outputs/cards/NORM.md says the command, the seeds and the "
                 "bands).", "", card.leaderboard(others), ""]  # fmt: skip
    path = root / "docs" / "cards.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([*text, card.RUN_A_CARD, ""]))
    return path


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="reproduce.py card", description=__doc__.splitlines()[0])
    parser.add_argument("--norm", help="a registered norm's name, or a class path pkg.Class")
    parser.add_argument("--plugin", help="module that registers --norm (plugins=[MODULE])")
    parser.add_argument("--budget", choices=("quick", "card"), default="card")
    parser.add_argument("--jobs", type=int, default=1, help="parallel jobs")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per job")
    parser.add_argument("--root", type=Path, default=REPO, help="where outputs/ goes")
    parser.add_argument("--leaderboard", action="store_true", help="write docs/cards.md")
    parser.add_argument("--slots", help="comma-separated reproductions: only their slots")
    parser.add_argument("--decide", action="store_true",
                        help="each slot on to the seeds its undecided verdicts plan for, then "
                        "to the reproduction's cap where still undecided (as reproduce.py "
                        "NAME --decide)")  # fmt: skip
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--retrain-baselines", action="store_true",
                       help="retrain every baseline arm run under older training code, beside "
                       "the norm's (into NAME+norm), without replaying it first")  # fmt: skip
    which.add_argument("--reuse-baselines", action="store_true",
                       help="read every baseline arm as committed, whatever code it ran: no "
                       "replay, no retraining (the md says so; --budget quick's default)")
    args = parser.parse_args(argv)
    quick = args.budget == "quick"  # a smoke run reads its baselines unchecked (no evidence)
    policy = ("retrain" if args.retrain_baselines else
              "reuse" if args.reuse_baselines or quick else "check")  # fmt: skip
    if args.decide and args.budget == "quick":
        parser.error("--decide plans seeds from evidence: not with --budget quick")
    if args.leaderboard:
        print(f"wrote {leaderboard(args.root.resolve())}")
        return
    if not args.norm:
        parser.error("card needs --norm NAME (or --leaderboard)")
    try:
        only = [n for n in args.slots.split(",") if n] if args.slots else None
        paths = run(args.norm, args.plugin, quick, args.jobs, args.threads,
                    args.root.resolve(), only, args.decide, policy)  # fmt: skip
    except KeyboardInterrupt:
        command = shlex.join([*reproduce.PROGRAM(), "card", *argv])
        print(f"card {args.norm}: interrupted; finished jobs are kept. continue with: {command}",
              file=sys.stderr, flush=True)  # fmt: skip
        raise SystemExit(130) from None
    print(f"card {args.norm}: wrote {paths['md']}")
    print(pd.read_csv(paths["csv"], keep_default_na=False).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1:])
