"""gn_batch_size: GroupNorm paper Fig. 1 / Tables 1-2, test error against images per device.

The paper's design on one machine: 8 virtual devices of b images, SGD on the 8b images with the
learning rate scaled linearly, BatchNorm's statistics per device (Ghost BN); GN, LN and IN see
the same steps. A second arm keeps SGD's batch at 256 and shrinks only BN's statistics batch.
A pilot (pilot/<norm> arms: BN, GN, LN at b=32, one seed, 2 to 64 epochs) finds the budget at
which the b=32 runs pass the converged gate, the budget every b then trains for. `extract`
reads the run logs into runs.csv; `render` decides the claims from runs.csv alone.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import matplotlib.pyplot as plt
import pandas as pd

from normlab.analysis import claims as declared
from normlab.analysis import gates
from normlab.analysis.logs import Run
from normlab.analysis.report import Claim, Result, markdown_table
from normlab.analysis.stats import Interval

# ----- the claims: conf/reproduce/gn_batch_size.yaml's claims:, built by normlab.analysis.claims
GN_FLAT = 1.0  # the band GN's claims hold its change from b=32 in (+-points), shaded in the figure
NORMS = {"batchnorm": "BN", "groupnorm": "GN", "layernorm": "LN", "instancenorm": "IN"}
FIXED = "batchnorm_sgd256"  # the arm with SGD's batch fixed at 256
PRECISE = "batchnorm_precise"  # BN with precise statistics (Wu & Johnson 2021) before test
LABELS = {**NORMS, FIXED: "BN, SGD batch fixed at 256", PRECISE: "BN, precise statistics"}
BIG, SMALL = 32, 2


PILOT = "pilot/"  # the pilot's arms: pilot/bn, pilot/gn, pilot/ln; the all-conv net's below
EPOCHS, STEPS = "budget/epochs", "budget/steps"  # per job: its trainer.max_epochs, last step
# the all-conv net's arms (experiment=gn_batch_size_allconv): 6 convs at 28, 14 and 7 pixels
ALLCONV = {"allconv/batchnorm": "BN", "allconv/groupnorm": "GN"}
ALLCONV_PILOT = "pilot/allconv/"  # its pilot's arms: pilot/allconv/bn, pilot/allconv/gn
NETS = {"lenet": "LeNet", "allconv": "All-conv net"}


def net(arm_: str) -> str:
    """The network an arm trains: 'allconv' (its arms and pilot arms) or 'lenet'."""
    return "allconv" if arm_ in ALLCONV or arm_.startswith(ALLCONV_PILOT) else "lenet"


# The suffix naming a job's gate rows after the value of the key its grid sweeps: gate_arm's
# (a b grid's per_device) and pilot_arm's (a pilot's trainer.max_epochs); job_rows reads them.
JOB_SUFFIX = {"per_device": "b", "trainer.max_epochs": "e"}


def gate_arm(arm_: str, b: float) -> str:
    """The gates' name of one arm at one b (the gates read one job per seed)."""
    return f"{arm_}/{JOB_SUFFIX['per_device']}{b:g}"


# a gate_arm name (not allconv/batchnorm's /b)
GATE_ARM = re.compile(rf"/{JOB_SUFFIX['per_device']}\d+$")


def pilot_arm(arm_: str, epochs: float) -> str:
    """The gates' name of one pilot job (one norm at one budget)."""
    return f"{arm_}/{JOB_SUFFIX['trainer.max_epochs']}{epochs:g}"


def job_rows(data: pd.DataFrame, key: str, values: list[str]) -> pd.Series:
    """Which runs.csv rows came from the jobs at one of `values` of `key` (per_device in the b
    grids, trainer.max_epochs in the pilots): an arm's rows at x in values, and the gate rows
    of the gate arms (or pilot arms) named for one of them."""
    if key not in JOB_SUFFIX:
        raise ValueError(f"gn_batch_size: --subset selects per_device or trainer.max_epochs, "
                         f"got {key}")  # fmt: skip
    wanted = [float(v) for v in values]
    gate = data["metric"].str.startswith("gate/")
    named = data["arm"].str.extract(rf"/{JOB_SUFFIX[key]}(\d+)$")[0].astype(float)
    return (~gate & data["x"].astype(float).isin(wanted)) | (gate & named.isin(wanted))


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per job: test error (%) at its images per device (x), its final training loss and its
    gates' rows (under gate_arm); a pilot job: at its epochs (x), test error and final train
    loss, and its gates' rows (under pilot_arm)."""
    rows = []
    for run in runs:
        if run.status != "ok":
            continue
        a, seed, b = run.arm, int(run.get("seed")), float(run.get("per_device"))
        error = 100.0 * (1.0 - run.last("test/acc"))
        if a.startswith(PILOT):
            epochs = _epochs(run)
            rows += [(a, seed, epochs, "pilot/test_error", error),
                     (a, seed, epochs, "pilot/train_loss", run.last("train/loss_epoch")),
                     *gates.gate_rows(run, pilot_arm(a, epochs), seed)]  # fmt: skip
            continue
        rows.append((a, seed, b, "test/error", error))
        rows.append((a, seed, b, "train/loss", run.last("train/loss_epoch")))
        rows.append((a, seed, b, EPOCHS, _epochs(run)))
        steps = run.metrics.get("step", pd.Series(dtype=float))  # test's row: the global step
        rows.append((a, seed, b, STEPS, float(steps.max()) if len(steps) else math.nan))
        rows += gates.gate_rows(run, gate_arm(a, b), seed)
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


def _epochs(run: Run) -> float:
    """A job's trainer.max_epochs: its composed config's, else its override's; NaN if neither."""
    return float(run.setting("trainer.max_epochs", run.get("trainer.max_epochs", "nan")))


def pilot(data: pd.DataFrame, net_: str = "lenet") -> pd.DataFrame:
    """One network's pilot table: per norm and epochs, test error, final train loss and the
    late-gain rule (gates.late_gain_gate: the budget at which the loss stops falling)."""
    rows = data[data["arm"].str.startswith(PILOT) & data["metric"].str.startswith("pilot/")]
    rows = rows[rows["arm"].map(net) == net_]
    if rows.empty:
        return pd.DataFrame(columns=["arm", "epochs", "test_error", "train_loss", "gate"])
    table = rows.pivot_table(index=["arm", "x"], columns="metric", values="value")
    table.columns = [str(c).removeprefix("pilot/") for c in table.columns]
    table = table.reindex(columns=["test_error", "train_loss"]).reset_index()
    table = table.rename(columns={"x": "epochs"})
    own = gates.by_arm(data)
    table["gate"] = [gates.late_gain_gate(own[pilot_arm(a, e)], pilot_arm(a, e))
                     for a, e in zip(table["arm"], table["epochs"], strict=True)]  # fmt: skip
    return table


def pilot_epochs(table: pd.DataFrame) -> float:
    """The budget the pilot picks: the fewest epochs at which every norm passes the converged
    gate; NaN when no budget the pilot ran passes."""
    passing = table.groupby("epochs")["gate"].agg(lambda g: all(x.passed for x in g))
    return float(passing[passing].index.min()) if passing.any() else math.nan


def errors(data: pd.DataFrame, arm_: str, metric: str = "test/error") -> pd.DataFrame:
    """Test error (%) (or another metric) of one arm: a row per seed, a column per b."""
    rows = data[(data["arm"] == arm_) & (data["metric"] == metric)]
    table = rows.pivot(index="seed", columns="x", values="value")
    table.columns = [int(b) for b in table.columns]
    # every b of the paper's axis present (NaN where not run): an arm run at some b only, or
    # not at all (a --grids run of other arms), still renders
    return table.reindex(columns=sorted({BIG, 16, 8, 4, SMALL} | set(table.columns)))


def _change(table: pd.DataFrame, b: int) -> list[float]:
    """Per seed: the error at b minus the error at b=32."""
    if b not in table or BIG not in table:
        return []
    return list((table[b] - table[BIG]).dropna())


def _epochs_by_gate_arm(data: pd.DataFrame) -> dict[str, set[float]]:
    """The epochs each gate arm's jobs (one arm at one b, over seeds) trained, pilots aside."""
    rows = data[(data["metric"] == EPOCHS) & ~data["arm"].str.startswith(PILOT)].dropna()
    return {gate_arm(a, b): set(g["value"]) for (a, b), g in rows.groupby(["arm", "x"])}


def _comparable(claim: Claim, epochs: dict[str, set[float]]) -> Claim:
    """The claim as it is where its arms' jobs all trained the same epochs (as the paper trains
    every b), else not comparable: a grid landing a share at a time (--subset) can hold jobs at
    an old budget beside jobs at the pilot's, and their gap would measure the budget."""
    trained = {a: epochs[a] for a in claim.arms if a in epochs}
    if len(set().union(*trained.values())) < 2 or claim.precluded:
        return claim
    said = "; ".join(f"{a}: {', '.join(f'{e:g}' for e in sorted(v))}" for a, v in trained.items())
    return replace(claim, precluded=f"not comparable: its jobs trained different epochs ({said})")


def _mean_ci(table: pd.DataFrame) -> tuple[list[int], list[float], list[float]]:
    """b values, mean error and CI half-width per b."""
    bs = sorted(table.columns, reverse=True)
    means, halves = [], []
    for b in bs:
        i = Interval.of(table[b].dropna())
        means.append(i.mean)
        halves.append((i.high - i.low) / 2 if i.known else 0.0)
    return bs, means, halves


def render(data: pd.DataFrame) -> Result:
    """Error against b per norm; change from b=32 per seed (paired); BN with SGD's batch fixed."""
    err = {a: errors(data, a) for a in LABELS}
    allconv = {a: errors(data, a).dropna(axis=1, how="all") for a in ALLCONV}
    ran = not all(table.empty for table in allconv.values())  # a panel of its own when run
    fig, axes = plt.subplots(1, 5 if ran else 4, figsize=(26 if ran else 21, 4.5))
    ax, ax_rel, ax_fix, ax_train = axes[:4]
    for k, (a, table) in enumerate(err.items()):
        if table.empty:
            continue
        color = f"C{k}"
        bs, means, halves = _mean_ci(table)
        if a != FIXED:
            ax.errorbar(bs, means, yerr=halves, marker="o", capsize=3, color=color,
                        label=f"{LABELS[a]} ({len(table)} seeds)")  # fmt: skip
            for _, row in table.iterrows():
                ax.plot(bs, [row[b] for b in bs], color=color, alpha=0.25, lw=0.8)
            rel = table.sub(table[BIG], axis=0) if BIG in table else table * float("nan")
            bs_r, means_r, halves_r = _mean_ci(rel)
            ax_rel.errorbar(bs_r, means_r, yerr=halves_r, marker="o", capsize=3, color=color,
                            label=LABELS[a])  # fmt: skip
        if a in ("batchnorm", FIXED, PRECISE):
            fixed = table.copy()
            if a == FIXED and BIG in err["batchnorm"]:
                fixed[BIG] = err["batchnorm"][BIG]  # the same job: SGD batch 8 x 32 = 256
            bs_f, means_f, halves_f = _mean_ci(fixed)
            ax_fix.errorbar(
                bs_f,
                means_f,
                yerr=halves_f,
                marker="o",
                capsize=3,
                color=color,
                label=LABELS[a] if a != "batchnorm" else "BN, SGD batch 8b (lr scaled)",
            )
    _train_panel(ax_train, data)
    if ran:
        _allconv_panel(axes[4], allconv)
    _decorate(fig, tuple(axes))
    pilots = {n: pilot(data, n) for n in NETS}  # each net's table, its gates read once
    budget = _budget(data, pilots["lenet"])
    notes = _notes(budget)
    notes.append(_sgd_effect(err, budget))
    if ran:
        allconv_budget = _budget(data, pilots["allconv"], "allconv")
        notes.append(f"{ALLCONV_NOTE} {_upper_first(allconv_budget)} for every b.")
    arms = sorted(
        {a for a in data["arm"].unique() if GATE_ARM.search(a) and not a.startswith(PILOT)}
    )
    sections = {"Pilot: the budget at which b=32 converges": _pilot_section(pilots)}
    claims = declared.build("gn_batch_size", data)  # test/error per arm, seed and b
    epochs = _epochs_by_gate_arm(data)
    claims = [_comparable(c, epochs) for c in claims]
    return Result(fig, claims, notes, gates.gates(data, arms), sections)


ALLCONV_NOTE = (
    "All-conv net (experiment=gn_batch_size_allconv, the same recipe at b = 32, 8, 2): 3 stages "
    "of 2 x (conv3x3 -> norm -> relu) at 28, 14 and 7 pixels, widths 16, 32, 64, 2x2 max pool "
    "between stages, global average pool, fc 10; a norm after each of the 6 convs (GN: 4 groups "
    "of 4, 8, 16 channels). At b=2 its last stage's BN averages 2 x 7 x 7 = 98 values per "
    "channel in each of two layers, as ResNet-50's res5 does at 2 images per GPU; LeNet's last "
    "BN averages 2 x 8 x 8 = 128 in its one conv layer at that resolution."
)


def _allconv_panel(ax: plt.Axes, allconv: dict[str, pd.DataFrame]) -> None:
    """The all-conv net's test error against b: each seed a dot, the mean with its 95% CI."""
    for a, table in allconv.items():
        if table.empty:
            continue
        color = "C0" if a.endswith("batchnorm") else "C1"  # as BN and GN in the LeNet panels
        bs, means, halves = _mean_ci(table)
        ax.errorbar(bs, means, yerr=halves, marker="o", capsize=3, color=color,
                    label=f"{ALLCONV[a]} ({len(table)} seeds)")  # fmt: skip
        for b in bs:
            seeds = table[b].dropna()
            ax.plot([b] * len(seeds), seeds, ".", color=color, alpha=0.4)
    ax.set_title("all-conv net (6 convs at 28, 14, 7 px): test error, BN and GN", fontsize=9)
    ax.set_ylabel("test error (%)")


def _decorate(fig: plt.Figure, axes: tuple[plt.Axes, ...]) -> None:
    """Titles, the b axis (shrinking to the right, as in the paper), labels and legends."""
    ax, ax_rel, ax_fix, ax_train = axes[:4]
    ax_rel.axhspan(-GN_FLAT, GN_FLAT, color="C1", alpha=0.1, label=f"+-{GN_FLAT:g} point")
    ax.set_title("test error, SGD on 8 devices x b images, lr 0.2 x 8b/256", fontsize=9)
    ax_rel.set_title(f"change from b={BIG}, paired by seed (mean, 95% CI)", fontsize=9)
    ax_fix.set_title("BN: SGD batch 8b vs fixed 256; moving-average vs precise statistics",
                     fontsize=9)  # fmt: skip
    for a in axes:
        a.set_xscale("log", base=2)
        a.set_xticks([32, 16, 8, 4, 2])
        a.get_xaxis().set_major_formatter(plt.ScalarFormatter())
        a.invert_xaxis()  # as in the paper: the batch shrinks to the right
        a.set_xlabel("images per device b (BN's statistics batch)")
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:  # a quick run may draw no labelled line here
            a.legend(fontsize=8)
    ax.set_ylabel("test error (%)")
    ax_rel.set_ylabel("error - error at b=32 (points)")
    ax_fix.set_ylabel("test error (%)")
    fig.suptitle("Per-device batch size: BN vs GN, LN, IN on LeNet / Fashion-MNIST "
                 "(GN paper Fig. 1)")  # fmt: skip
    fig.tight_layout()


def _budget(data: pd.DataFrame, pilot_table: pd.DataFrame, net_: str = "lenet") -> str:
    """One network's jobs' budget as their logs give it (pilot jobs aside): 'E epochs, the
    pilot's budget (S SGD steps at b=32, S' at b=2)', steps the most of any job at that b;
    epochs as 'E1-E2' if the jobs differ, its pilot's pick (from `pilot_table`, `pilot`'s table
    of that network) beside them if another, steps left out where not logged."""
    rows = data[~data["arm"].str.startswith(PILOT) & (data["arm"].map(net) == net_)]
    epochs = rows.loc[rows["metric"] == EPOCHS, "value"].dropna()
    if epochs.empty:
        return "the same epochs"
    low, high = epochs.min(), epochs.max()
    text = f"{low:g} epochs" if low == high else f"{low:g}-{high:g} epochs"
    chosen = pilot_epochs(pilot_table)
    if not math.isnan(chosen):
        text += ", the pilot's budget" if low == high == chosen else f" (the pilot's: {chosen:g})"
    steps = rows[rows["metric"] == STEPS].groupby("x")["value"].max()
    if {BIG, SMALL} <= set(steps.dropna().index):
        text += f" ({steps[BIG]:,.0f} SGD steps at b={BIG}, {steps[SMALL]:,.0f} at b={SMALL})"
    return text


def _upper_first(text: str) -> str:
    """text with its first letter in upper case (str.capitalize lowers the rest)."""
    return text[:1].upper() + text[1:]


def _notes(budget: str) -> list[str]:
    """What every figure of this reproduction holds fixed and how its arms differ."""
    return [
        "Network (the same for all four norms): LeNet with conv widths 16 and 32, relu, a norm "
        "after each conv layer (where BN, GN, LN and IN are all defined), none on the fc "
        "layers; GN has 4 groups (4 and 8 channels a group), so it is neither LN nor IN.",
        "Held fixed across seeds: the held-out split and the 10k test images. A seed sets the "
        "init, the order of the training images and so the steps; all arms of a seed share them.",
        f"{_upper_first(budget)} for every b, lr "
        "0.2 x 8b/256 (linear scaling, as in the paper; its base is 0.1 for ResNet-50) after a "
        "linear warmup over the same 12,800 images at every b, then a cosine to 0. The paper "
        "trains ResNet-50 for 100 epochs on ImageNet.",
        f"The fixed-batch arm's b={BIG} is the linear-scaling BN job at b={BIG} (identical "
        "config: SGD batch 256, statistics over 32).",
        "BN, precise statistics (Wu & Johnson 2021): the BN arm's jobs with "
        "callbacks.precise_bn.enabled=true. Training never reads the running statistics, so a "
        "seed trains the same weights as in the BN arm; before each validation and before test "
        "the running mean and variance are replaced by the average of per-batch statistics over "
        "200 training batches of 8b images (whole batches, not the b-image slices BN normalized "
        "by in training), computed with the weights of that moment. Each arm tests its best "
        "checkpoint by its own validation accuracy.",
    ]


def _train_panel(ax: plt.Axes, data: pd.DataFrame) -> None:
    """Each norm's final train loss against b (mean over seeds): how far training got."""
    for k, a in enumerate(LABELS):
        table = errors(data, a, "train/loss")
        if a == FIXED or table.dropna(how="all").empty:
            continue
        bs, means, _ = _mean_ci(table)
        ax.plot(bs, means, "o-", color=f"C{k}", label=LABELS[a])
    ax.set_title("final train loss (last epoch's mean), mean over seeds", fontsize=9)
    ax.set_ylabel("train loss (nats)")


def _pilot_section(pilots: dict[str, pd.DataFrame]) -> str:
    """Each network's pilot table, and the budget it picks by the converged gate's rule."""
    parts = [_pilot_table(table, NETS[n]) for n, table in pilots.items() if not table.empty]
    return "\n\n".join(parts) if parts else "Not in runs.csv."


def _pilot_table(table: pd.DataFrame, name: str) -> str:
    """One network's pilot: its table and the budget it picks."""
    rows = [
        (r.arm.rsplit("/", 1)[-1].upper(), f"{r.epochs:g}", r.gate.measured, r.gate.status,
         f"{r.train_loss:.3f}", f"{r.test_error:.2f}")
        for r in table.itertuples()
    ]  # fmt: skip
    columns = ["norm", "epochs", "converged gate: measured", "status", "final train loss",
               "test error (%)"]  # fmt: skip
    chosen = pilot_epochs(table)
    pick = (
        f"the fewest epochs at which every norm passes: {chosen:g}"
        if not math.isnan(chosen)
        else f"no budget up to {table['epochs'].max():g} epochs passes: the b={BIG} runs' "
        "train and held-out losses are still falling there"
    )
    grids = ",".join(sorted(table["arm"].unique()))  # a pilot arm is its grid's name
    return "\n".join([
        f"**{name}**, b={BIG} (SGD on 8 x {BIG}), seed 0, one job per norm and budget, each with "
        f"its own cosine schedule to 0 (`--grids {grids}`), held to the converged "
        "gate every arm is held to (its rule under Gates): the late gain is the train loss's "
        "relative fall over the last 20% of steps, the held-out loss's beside it (validated "
        f"once an epoch), bound {gates.CONVERGED_GAIN:.0%}.",
        "",
        markdown_table(columns, rows),
        "",
        f"Budget by the gate's rule: {pick}.",
    ])  # fmt: skip


def _sgd_effect(err: dict[str, pd.DataFrame], budget: str) -> str:
    """The change from b=32 to b=2 of every norm, side by side: LN and IN do not depend on the
    batch at all, so their change is the optimizer's (fewer, larger steps at b=32)."""
    parts = []
    for norm, table in err.items():
        if norm == FIXED or BIG not in table or SMALL not in table:
            continue
        i = Interval.of(_change(table, SMALL))
        parts.append(f"{LABELS[norm]} {i.mean:+.2f}")
    return (
        f"Mean change of the test error from b={BIG} to b={SMALL}, points: "
        + ", ".join(parts)
        + ". LN and IN compute nothing over the batch, so what they share with GN is the "
        f"optimizer's: {budget}, steps of 8b images with the lr scaled to match."
    )
