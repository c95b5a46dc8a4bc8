# Over 400 lines: one paper's extraction, speed-share intervals, claims and figures
"""rmsnorm_speed: Zhang & Sennrich 2019, RMSNorm's training speed and quality against LayerNorm.

Grids `speed` (experiment=rmsnorm_speed: the Pre-LN GPT at d_model 128 and 256) and
`speed_lstm` (experiment=rmsnorm_speed_lstm: the LN-LSTM), arms speed/<model>/<norm>/t<threads>:
in each job the step time of the model with the swept norm, of the same model with LayerNorm and
of it with no norm, stepped side by side in one process (callbacks.paired_step_time), and the
two norms' own calls of a step replayed alone at the model's shapes; seeds are repeats;
norm=layernorm is the control (the same model on both sides). From a job's timed steps:
LayerNorm's share s of a step (1 - no norm's / LayerNorm's time), the op-level ratio r of the
norm's calls to LayerNorm's, the measured step ratio, and the step ratio 1 - s(1 - r) that s and
r predict. Runs of the earlier layout (arms speed/<norm>/t<threads>: two twins, no share) are
drawn as they were. `quality` (experiment=rmsnorm_quality): the val loss of LayerNorm, RMSNorm
and pRMSNorm over 600 steps. `extract` reads the run logs into runs.csv; `render` draws the
figure and decides the claims from runs.csv alone.
"""

from __future__ import annotations

import math
import re
from itertools import product

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from normlab.analysis import claims as declared
from normlab.analysis import gates
from normlab.analysis.curves import final_loss, metric, val_loss_rows
from normlab.analysis.logs import Run
from normlab.analysis.report import Result, markdown_table
from normlab.analysis.stats import Interval, bootstrap, bootstrap_joint

# ----- the claims (Zhang & Sennrich 2019): declared in conf/reproduce/rmsnorm_speed.yaml ------
RESAMPLES, BOOTSTRAP_SEED = 10_000, 0
CI_BOOTSTRAP = (
    f"speed: 95% percentile bootstrap interval of the pooled median, {RESAMPLES:,} resamples "
    f"of the pairs drawn within each repeat (stratified), RNG seed {BOOTSTRAP_SEED}"
)

SPEED = "rmsnorm_speed"
BASELINE = "layernorm"
NORMS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "prmsnorm": "pRMSNorm"}
MODEL_MS, BASELINE_MS = "time/model_step_ms", "time/baseline_step_ms"
BASELINE_FIRST = "time/baseline_first"
IDENTITY_MS = "time/identity_step_ms"  # the twin with no norm
MODEL_OP, BASELINE_OP = "time/model_op_ms", "time/baseline_op_ms"  # the norms' calls alone
TIMES = (MODEL_MS, BASELINE_MS, BASELINE_FIRST, IDENTITY_MS, MODEL_OP, BASELINE_OP)
MODEL_TIMES = (MODEL_MS, BASELINE_MS, IDENTITY_MS, MODEL_OP, BASELINE_OP)  # a per-model step's
SPEED_ARM = re.compile(r"^speed/(?P<norm>\w+)/t(?P<threads>\d+)$")
MODEL_ARM = re.compile(r"^speed/(?P<model>\w+)/(?P<norm>\w+)/t(?P<threads>\d+)$")
EARLIER_LAYOUT = (
    "These speed runs are of the earlier layout (arms speed/<norm>/t<threads>: the GPT at d_model "
    "128 only, 10 warmup + 300 timed pairs of two twins at 1 and 2 threads), without the no-norm "
    "twin and the op timing: LayerNorm's share of a step and the op-level ratio are not measured "
    "here, so a speed verdict cannot say whether 7% was reachable. The budget line above is the "
    "current layout's: rerun the reproduction for the per-model share reading."
)


# ----- run logs -> runs.csv -------------------------------------------------------------------


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per speed job: each timed pair (x = the run's step) as its two step times (ms) and which
    went first. Per quality job: the val loss curve (x = steps trained), its last val loss and
    whether it diverged."""
    rows = []
    for run in runs:
        a, seed = run.arm, int(run.get("seed"))
        if not a.startswith("speed/"):
            rows += val_loss_rows(run, a, seed) + gates.gate_rows(run, a, seed)
            continue
        if run.status != "ok":
            continue
        for key in TIMES:  # a key the job did not log (an earlier layout) gives no rows
            series = run.series(key)
            rows += [
                (a, seed, float(s), key, float(v))
                for s, v in zip(series["step"], series[key], strict=True)
            ]
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


# ----- runs.csv -> claims and figure ----------------------------------------------------------


def pairs(data: pd.DataFrame, norm: str, threads: int) -> pd.DataFrame:
    """The timed pairs of one speed arm: a row per (seed, step) with both times, which went
    first, and the ratio (the norm's model / LayerNorm's)."""
    rows = data[data["arm"] == f"speed/{norm}/t{threads}"]
    table = rows.pivot_table(index=["seed", "x"], columns="metric", values="value")
    if table.empty or MODEL_MS not in table or BASELINE_MS not in table:
        return pd.DataFrame(columns=[MODEL_MS, BASELINE_MS, BASELINE_FIRST, "ratio"])
    table = table.dropna(subset=[MODEL_MS, BASELINE_MS])
    return table.assign(ratio=table[MODEL_MS] / table[BASELINE_MS])


def ratio_interval(table: pd.DataFrame) -> Interval:
    """The median of the per-pair ratios pooled over the repeats, and its bootstrap CI."""
    if table.empty:
        return bootstrap([])
    groups = [g["ratio"].to_numpy() for _, g in table.groupby(level="seed")]
    return bootstrap(groups, np.median, resamples=RESAMPLES, seed=BOOTSTRAP_SEED)


def repeat_medians(table: pd.DataFrame) -> pd.Series:
    """{seed: median ratio of that repeat's pairs}."""
    if table.empty:
        return pd.Series(dtype=float)
    return table["ratio"].groupby(level="seed").median()


def speed_arms(data: pd.DataFrame) -> list[tuple[str, int]]:
    """(norm, threads) of every speed arm in the data, in NORMS order then by threads."""
    found = {
        (m["norm"], int(m["threads"])) for a in data["arm"].unique() if (m := SPEED_ARM.match(a))
    }
    rank = {norm: i for i, norm in enumerate(NORMS)}
    return sorted(found, key=lambda nt: (rank.get(nt[0], len(rank)), nt[1]))


def _label(norm: str) -> str:
    return NORMS.get(norm, norm) + (" (control)" if norm == BASELINE else "")


def _threads(n: int) -> str:
    return f"{n} thread" + ("s" if n != 1 else "")


# the quality grids: their arms' prefix -> whether the claim names its steps (the longer one)
QUALITY = {"quality": False, "quality_long": True}


def quality_steps(data: pd.DataFrame, grid: str) -> int:
    """The steps a quality grid's jobs trained (its val loss's last x; 0 without its rows)."""
    rows = data[(data["metric"] == "val/loss") & data["arm"].str.startswith(f"{grid}/")]
    return int(rows["x"].max()) if len(rows) else 0


# ----- what the declared claims (conf/reproduce/rmsnorm_speed.yaml) read ----------------------


def quantities(data: pd.DataFrame) -> pd.DataFrame:
    """runs.csv's rows and each quality arm's final_loss per seed (curves.final_loss: a
    diverged job's at DIVERGED_LOSS), which no job logs."""
    arms = sorted(a for a in data["arm"].unique() if a.split("/")[0] in QUALITY)
    rows = [(a, seed, math.nan, "final_loss", v) for a in arms
            for seed, v in final_loss(data, a).items()]  # fmt: skip
    return pd.concat([data, pd.DataFrame(rows, columns=data.columns)], ignore_index=True)


def max_ratio() -> float:
    """The step time ratio to LayerNorm at the paper's smallest gain (declared: thresholds)."""
    return float(declared.thresholds(SPEED)["max_ratio"])


def max_share() -> float:
    """LayerNorm's share of a step below which no norm can save the paper's smallest gain."""
    return 1 - max_ratio()


def words(data: pd.DataFrame, numbers: dict[tuple[str, str, int], dict]) -> dict:
    """What the declared claims read from the data: the per-model arms held against LayerNorm
    (`numbers`, _arm_numbers's; none for the earlier layout) with, where LayerNorm's share of a
    step rules 7% out, that verdict; the earlier layout's thread counts; the quality grids'
    norms (the first always for the earlier layout, else each grid that ran) and steps."""
    model = [a for a in numbers if a[1] != BASELINE]
    threads = [] if numbers else sorted({t for _, t in speed_arms(data)}) or [1, 2]
    short = ["rmsnorm", "prmsnorm"] if not numbers or quality_steps(data, "quality") else []
    ran = {a.split("/")[-1] for a in data["arm"].unique() if a.startswith("quality_long/")}
    long = [n for n in NORMS if n in ran and n != BASELINE] if numbers else []
    steps = quality_steps(data, "quality_long")
    return {
        "arm": [f"speed/{m}/{n}/t{t}" for m, n, t in model], "norm": [n for _, n, _ in model],
        "name": [NORMS.get(n, n) for _, n, _ in model],  # a user's norm by its own name
        "where": [f"{model_label(m)}, {_threads(t)}" for m, _, t in model],
        "unreachable": [unreachable(numbers[a]["s"]) for a in model],
        "pooled_t": threads, "pooled_threads": [_threads(t) for t in threads],
        "short_norm": short, "short_name": [NORMS[n] for n in short],
        "short_steps": str(quality_steps(data, "quality")),
        "long_norm": long, "long_name": [NORMS[n] for n in long],
        "long_steps": f"{steps:,}", "long_steps_plain": str(steps),
        "gain": f"{max_share():.0%}",
    }  # fmt: skip


def intervals(data: pd.DataFrame, numbers: dict[tuple[str, str, int], dict]) -> dict:
    """The speed claims' bootstrap intervals by name, each with how it was computed: per
    per-model arm its r, measured step ratio and gap to the prediction (`numbers`); for the
    earlier layout the pooled median pair ratio per norm and thread count."""
    if numbers:
        return {f"speed/{m}/{n}/t{t}: {key}": (numbers[(m, n, t)][key], CI_JOINT)
                for m, n, t in numbers for key in ("r", "measured", "gap")}  # fmt: skip
    threads = sorted({t for _, t in speed_arms(data)}) or [1, 2]
    return {f"speed/{norm}/t{t}: ratio": (ratio_interval(pairs(data, norm, t)), CI_BOOTSTRAP)
            for norm in ("rmsnorm", "prmsnorm") for t in threads}  # fmt: skip


def _ratio_panel(ax: plt.Axes, data: pd.DataFrame, arms: list[tuple[str, int]]) -> None:
    """Each repeat's median ratio (dots) and the pooled median with its bootstrap CI."""
    for i, (norm, t) in enumerate(arms):
        table = pairs(data, norm, t)
        color = f"C{list(NORMS).index(norm)}" if norm in NORMS else "C7"
        medians = repeat_medians(table)
        offsets = np.linspace(-0.15, 0.15, len(medians)) if len(medians) > 1 else [0.0]
        ax.plot(i + np.asarray(offsets), medians.values, ".", color=color, alpha=0.6)
        interval = ratio_interval(table)
        if interval.known:
            ax.errorbar(
                [i],
                [interval.mean],
                yerr=[[interval.mean - interval.low], [interval.high - interval.mean]],
                fmt="o",
                ms=7,
                capsize=4,
                color=color,
            )
    ax.axhline(1.0, color="grey", lw=0.8, label="1: as fast as LayerNorm")
    ax.axhline(max_ratio(), color="grey", ls=":",
               label=f"{max_ratio():g}: the paper's smallest gain")  # fmt: skip
    ax.set_xticks(
        range(len(arms)),
        [_label(n).replace(" ", "\n") + f"\n{_threads(t)}" for n, t in arms],
        fontsize=8,
    )
    ax.set(
        ylabel="step time / LayerNorm's (paired)",
        title="step time ratio: pooled median, 95% bootstrap CI; dots: each repeat's median",
    )
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)


def _loss_panel(ax: plt.Axes, data: pd.DataFrame) -> None:
    """Val loss against steps per norm: mean over seeds and its 95% t-interval as a band."""
    for (grid, long), (k, (norm, label)) in product(QUALITY.items(), enumerate(NORMS.items())):
        curves = metric(data, f"{grid}/{norm}", "val/loss").pivot(
            index="x", columns="seed", values="value"
        )
        curves = curves.dropna()
        if curves.empty:
            continue
        intervals = [Interval.of(row.to_numpy()) for _, row in curves.iterrows()]
        x = list(curves.index)
        ax.plot(x, [i.mean for i in intervals], ":" if long else "-", color=f"C{k}",
                label=f"{label}{f', {x[-1]:,.0f} steps' if long else ''} "
                f"({curves.shape[1]} seeds)")  # fmt: skip
        if all(i.known for i in intervals):
            lows, highs = [i.low for i in intervals], [i.high for i in intervals]
            ax.fill_between(x, lows, highs, color=f"C{k}", alpha=0.2)
    ax.set(
        xlabel="training step",
        ylabel="val loss (nats/char)",
        title="val loss: mean over seeds, 95% CI band",
    )
    ax.title.set_fontsize(9)
    if ax.get_legend_handles_labels()[0]:  # a quick run may draw no curve here
        ax.legend(fontsize=8)


def render(data: pd.DataFrame) -> Result:
    """Step time ratios to LayerNorm per norm and thread count, and val loss curves per norm;
    with the per-model arms, the norm-share reading (render_shares)."""
    if model_arms(data):
        return render_shares(data)
    arms = speed_arms(data)
    steps = quality_steps(data, "quality")
    fig, (ax_t, ax_loss) = plt.subplots(1, 2, figsize=(13, 4.6))
    _ratio_panel(ax_t, data, arms)
    _loss_panel(ax_loss, data)
    fig.suptitle("RMSNorm vs LayerNorm: paired step time and val loss, Pre-LN char-level GPT "
                 "(Zhang & Sennrich 2019)")  # fmt: skip
    fig.tight_layout()
    claims = declared.build(SPEED, quantities(data), words(data, {}),
                            intervals=intervals(data, {}))  # fmt: skip
    notes = _notes(data, arms, steps) + ([EARLIER_LAYOUT] if arms else [])
    return Result(fig, claims, notes)


def _arm_note(data: pd.DataFrame, norm: str, t: int) -> str:
    """One speed arm: each repeat's median, both sides' median times, and the order effect."""
    table = pairs(data, norm, t)
    if table.empty:
        return f"{NORMS.get(norm, norm)}, {_threads(t)}: no timed pairs"
    medians = repeat_medians(table)
    interval = ratio_interval(table)
    first = table[table[BASELINE_FIRST] == 1]["ratio"]
    second = table[table[BASELINE_FIRST] == 0]["ratio"]
    return (
        f"{_label(norm)}, {_threads(t)}: pooled median {interval.mean:.3f} "
        f"[{interval.low:.3f}, {interval.high:.3f}] over {len(table)} pairs; per repeat "
        + ", ".join(f"seed {s}: {m:.3f}" for s, m in medians.items())
        + f"; median step {table[MODEL_MS].median():.1f} ms vs LayerNorm's "
        f"{table[BASELINE_MS].median():.1f} ms; LayerNorm's twin stepped first in "
        f"{len(first)} of {len(table)} pairs (median ratio {first.median():.3f} then, "
        f"{second.median():.3f} when it stepped second)"
    )


def _notes(data: pd.DataFrame, arms: list[tuple[str, int]], steps: int) -> list[str]:
    """How the quantities were measured, and the numbers a reader needs to judge the spread."""
    notes = [
        "Speed (grid `speed`, experiment=rmsnorm_speed): in each job, after each of the run's "
        "training steps, two twins built from the run's model config with the run's seed (one "
        "with the job's norm, one with LayerNorm; each with its own AdamW and lr schedule) took "
        "one step each on that batch, in a random order, each timed by the same code from its "
        "forward pass to its lr-schedule step; Lightning's loop around the run's own step is in "
        "neither time. The first pairs of a job are warmup, left out. A pair's ratio is the "
        "job's-norm twin's time / the LayerNorm twin's. Seeds are repeats of the whole job (init "
        "and batches follow the seed; both twins share them), run one job at a time.",
        "The bootstrap interval covers the pair-to-pair noise within these repeats (each "
        "repeat's pairs resampled on their own), not run-to-run spread beyond them: compare "
        "the per-repeat medians below with it. norm=layernorm is the control: the same model "
        "on both sides, so its ratio shows what the pairing itself reads (1 if unbiased).",
    ]
    notes += [_arm_note(data, norm, t) for norm, t in arms]
    finals = {n: final_loss(data, f"quality/{n}") for n in NORMS}
    notes.append(
        f"Quality (grid `quality`, experiment=rmsnorm_quality): {steps} AdamW steps (warmup "
        "then cosine); the val loss is the mean cross-entropy "
        "on the same fixed windows of the last 10% of the text for every job; final = at the "
        "last step. A seed sets the init and the training windows; the three norms of a seed "
        "share both. Final val loss per seed: "
        + "; ".join(
            f"{NORMS[n]} " + ", ".join(f"{v:.3f}" for v in f.values) for n, f in finals.items()
        )
        + "."
    )
    return notes


# ----- per-model arms: LayerNorm's share of a step, the op-level ratio, the predicted ratio ----


def model_arms(data: pd.DataFrame) -> list[tuple[str, str, int]]:
    """(model, norm, threads) of every per-model speed arm, by model, then NORMS order, threads."""
    found = {
        (m["model"], m["norm"], int(m["threads"]))
        for a in data["arm"].unique()
        if (m := MODEL_ARM.match(a))
    }
    rank = {norm: i for i, norm in enumerate(NORMS)}
    return sorted(found, key=lambda a: (_model_rank(a[0]), rank.get(a[1], len(rank)), a[2]))


def _model_rank(model: str) -> tuple[int, int, str]:
    gpt = re.fullmatch(r"gpt(\d+)", model)
    return (0, int(gpt[1]), model) if gpt else (1, 0, model)


MANUAL = "lstm_manual"  # the LSTM with every norm written out (impl=manual): like for like
MODEL_LABELS = {"lstm": "LN-LSTM", MANUAL: "LN-LSTM, norms written out (impl=manual)"}


def model_label(model: str) -> str:
    """'gpt128' -> 'GPT d_model 128', 'lstm' -> 'LN-LSTM'."""
    gpt = re.fullmatch(r"gpt(\d+)", model)
    return f"GPT d_model {gpt[1]}" if gpt else MODEL_LABELS.get(model, model)


def model_pairs(data: pd.DataFrame, model: str, norm: str, threads: int) -> pd.DataFrame:
    """The timed steps of one per-model arm: a row per (seed, step), a column per time, the
    rows with all three twins' times and both ops' times."""
    rows = data[data["arm"] == f"speed/{model}/{norm}/t{threads}"]
    table = rows.pivot_table(index=["seed", "x"], columns="metric", values="value")
    needed = list(MODEL_TIMES)
    if table.empty or any(c not in table for c in needed):
        none = pd.MultiIndex.from_tuples([], names=["seed", "x"])
        return pd.DataFrame(columns=needed, index=none)
    return table.dropna(subset=needed)


def share(c: dict[str, np.ndarray]) -> np.ndarray:
    """LayerNorm's share of a step: the median over steps of 1 - no norm's time / LayerNorm's."""
    return np.median(1 - c[IDENTITY_MS] / c[BASELINE_MS], axis=-1)


def op_ratio(c: dict[str, np.ndarray]) -> np.ndarray:
    """r: the median over steps of the norm's calls' time / LayerNorm's calls' time."""
    return np.median(c[MODEL_OP] / c[BASELINE_OP], axis=-1)


def step_ratio(c: dict[str, np.ndarray]) -> np.ndarray:
    """The median over steps of the norm's twin's step time / LayerNorm's twin's."""
    return np.median(c[MODEL_MS] / c[BASELINE_MS], axis=-1)


def predicted(s: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The step ratio if a step is LayerNorm's calls plus the rest: 1 - s(1 - r), with s its
    share of the step and r the op ratio."""
    return 1 - s * (1 - r)


STATISTICS = ("s", "r", "predicted", "measured", "gap")  # speed_numbers's keys


def speed_numbers(c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """s, r, the predicted and the measured step ratio, and the measured - predicted gap."""
    s, r, measured = share(c), op_ratio(c), step_ratio(c)
    expected = predicted(s, r)
    return {"s": s, "r": r, "predicted": expected, "measured": measured,
            "gap": measured - expected}  # fmt: skip


def joint_intervals(table: pd.DataFrame) -> dict[str, Interval]:
    """speed_numbers of a per-model arm's timed steps, with their bootstrap CIs: the steps
    resampled together, within each repeat; the five numbers read the same resamples (NaN
    intervals for an arm with no timed steps)."""
    columns = {c: table[c].to_numpy(dtype=float) for c in MODEL_TIMES}
    seeds = table.index.get_level_values("seed").to_numpy()
    positions = np.arange(len(table), dtype=float)
    groups = [positions[seeds == s] for s in np.unique(seeds)]

    def of_rows(rows: np.ndarray, axis: int = -1) -> dict[str, np.ndarray]:
        at = rows.astype(int)
        return speed_numbers({c: v[at] for c, v in columns.items()})

    joint = bootstrap_joint(groups, of_rows, resamples=RESAMPLES, seed=BOOTSTRAP_SEED)
    return joint or dict.fromkeys(STATISTICS, Interval(math.nan, math.nan, math.nan, len(groups)))


CI_JOINT = (
    f"per-model speed: 95% percentile bootstrap interval, {RESAMPLES:,} resamples of the timed "
    f"steps drawn within each repeat (stratified; a step's times resampled together), RNG seed "
    f"{BOOTSTRAP_SEED}"
)


def unreachable(s: Interval) -> str:
    """The step claim's verdict when LayerNorm's share of the step is wholly below 7% ('' when
    it is not)."""
    if not s.known or s.high >= max_share():
        return ""
    return (f"unreachable: LayerNorm is s={s.mean:.3f} [{s.low:.3f}, {s.high:.3f}] of the step, "
            f"so no norm can save {100 * max_share():g}%")  # fmt: skip


def _arm_numbers(data: pd.DataFrame, arm: tuple[str, str, int]) -> dict[str, Interval]:
    """s, r, the predicted and the measured step ratio of one per-model arm."""
    table = model_pairs(data, *arm)
    return joint_intervals(table) | {"steps": len(table)}


def _ci(i: Interval) -> str:
    return "n/a" if not i.known else f"{i.mean:.3f} [{i.low:.3f}, {i.high:.3f}]"


def share_table(numbers: dict[tuple[str, str, int], dict]) -> str:
    """The norm-share table: per arm, s, r, the predicted and the measured step ratio."""
    rows = []
    for arm, n in numbers.items():
        rows.append((model_label(arm[0]), _label(arm[1]), arm[2], _ci(n["s"]), _ci(n["r"]),
                     _ci(n["predicted"]), _ci(n["measured"]), n["steps"]))  # fmt: skip
    columns = ["model", "norm", "threads", "s: LayerNorm's share of a step", "r: op time / "
               "LayerNorm's", "predicted step ratio 1 - s(1 - r)", "measured step ratio",
               "timed steps"]  # fmt: skip
    return (
        "Each a median over the timed steps of all repeats pooled, with its 95% bootstrap CI "
        f"(the steps resampled within each repeat). A norm can save at most s of a step: where "
        f"s < {max_share():g} the paper's {100 * max_share():g}% is out of reach whatever r is. "
        "For the control (LayerNorm) r and the step ratio read what the pairing itself reads "
        "(1 if unbiased).\n\n" + markdown_table(columns, rows)
    )


def _share_panel(ax: plt.Axes, numbers: dict[tuple[str, str, int], dict]) -> None:
    """Per arm: the measured step ratio, its prediction 1 - s(1 - r), and r, with CIs."""
    marks = {"measured": ("o", "measured step ratio"), "r": ("^", "r: op time ratio"),
             "predicted": ("x", "predicted, 1 - s(1 - r)")}  # fmt: skip
    arms = list(numbers)
    for i, arm in enumerate(arms):
        for k, (key, (mark, label)) in enumerate(marks.items()):
            v = numbers[arm][key]
            if v.known:
                err = [[v.mean - v.low], [v.high - v.mean]]
                ax.errorbar([i + 0.2 * (k - 1)], [v.mean], yerr=err, fmt=mark, color=f"C{k}",
                            capsize=3, label=label if i == 0 else None)  # fmt: skip
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(max_ratio(), color="grey", ls=":",
               label=f"{max_ratio():g}: the paper's smallest gain")  # fmt: skip
    ax.set_xticks(range(len(arms)), [f"{model_label(m)}\n{_label(n)}\n{_threads(t)}"
                                     for m, n, t in arms], fontsize=6)  # fmt: skip
    ax.set(ylabel="time / LayerNorm's", title="per model: step ratio, its prediction from "
           "LayerNorm's share s and the op ratio r (median, 95% bootstrap CI)")  # fmt: skip
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)


def render_shares(data: pd.DataFrame) -> Result:
    """The per-model speed arms (op ratio, step ratio, share, prediction) and the quality."""
    arms = model_arms(data)
    steps = quality_steps(data, "quality")
    numbers = {arm: _arm_numbers(data, arm) for arm in arms}
    fig, (ax_t, ax_loss) = plt.subplots(1, 2, figsize=(15, 5), width_ratios=[3, 2])
    _share_panel(ax_t, numbers)
    _loss_panel(ax_loss, data)
    fig.suptitle("RMSNorm vs LayerNorm: step and op time ratios, LayerNorm's share of a step, "
                 "and val loss (Zhang & Sennrich 2019)")  # fmt: skip
    fig.tight_layout()
    claims = declared.build(SPEED, quantities(data), words(data, numbers),
                            intervals=intervals(data, numbers))  # fmt: skip
    notes = _share_notes(data, arms) + _notes(data, [], steps)[-1:] + _long_note(data)
    quality = sorted(a for a in data["arm"].unique() if a.split("/")[0] in QUALITY)
    return Result(fig, claims, notes, gates.gates(data, quality),
                  sections={"Norm share": share_table(numbers)})  # fmt: skip


def _long_note(data: pd.DataFrame) -> list[str]:
    """The longer quality grid's recipe and final val losses (none without its rows)."""
    steps = quality_steps(data, "quality_long")
    if not steps:
        return []
    finals = {n: final_loss(data, f"quality_long/{n}") for n in NORMS}
    return [
        f"Quality at {steps:,} steps (grid `quality_long`, dotted): the same recipe, five times "
        "the epochs, its cosine stretched over them. Final val loss per seed: "
        + "; ".join(f"{NORMS[n]} " + ", ".join(f"{v:.3f}" for v in f.values)
                    for n, f in finals.items() if len(f))  # fmt: skip
        + "."
    ]


def _share_notes(data: pd.DataFrame, arms: list[tuple[str, str, int]]) -> list[str]:
    """How the per-model quantities were measured, and each arm's medians."""
    notes = [
        "Speed (grids `speed`, experiment=rmsnorm_speed, and `speed_lstm`, "
        "experiment=rmsnorm_speed_lstm): in each job, after each of the run's training steps, "
        "three twins built from the run's model config with the run's seed (the job's norm, "
        "LayerNorm, and no norm; each with its own AdamW and lr schedule) took one step each on "
        "that batch, in a random order, each timed from its forward pass to its lr-schedule "
        "step. Then the norm calls of the job's norm and of LayerNorm in one step (recorded once, "
        "at the model's own shapes: (batch, ctx, d_model) for the GPT; the LSTM's input term "
        "over (batch, ctx, 4 x hidden), and at each time step its recurrent term (batch, "
        "4 x hidden) and cell (batch, hidden)) were replayed alone, forward and backward, in a "
        "random order. The first steps of a job are warmup, left out. Seeds are repeats of the "
        "whole job, run one job at a time.",
        "The bootstrap intervals cover the step-to-step noise within these repeats, not "
        "run-to-run spread beyond them. A norm can save at most LayerNorm's share s of a step "
        f"(a free norm's step is 1 - s as long): where the share's CI lies wholly below "
        f"{max_share():g}, the paper's {100 * max_share():g}% claim reads `unreachable` with s, "
        "not `does not hold`, and is left out of Holm's family.",
        "What is timed is each norm as normlab trains with it (impl=fast): LayerNorm is torch's "
        "native kernel (F.layer_norm, its backward in C++); RMSNorm and pRMSNorm run normlab's "
        "fused C++ kernel on CPU, reached through Python (the module, and a gradient registered "
        "with torch.library). At the models' shapes a call moves little data, so that per-call "
        "overhead can outweigh the arithmetic RMSNorm saves; at a large shape the fused kernel "
        "alone beats LayerNorm's (`python scripts/rms_vs_ln.py`, docs/bench/rms_vs_ln.md). r "
        "and the step ratios compare these implementations, not the formulas.",
    ]
    if any(model == MANUAL for model, _, _ in arms):
        notes.append(
            f"{model_label(MANUAL)} (grid `speed_lstm_manual`): like for like, every norm of "
            "the run and LayerNorm's twin at impl=manual: the forward written in torch ops and "
            "the backward written out by hand, the same kind of code for each, so r and the "
            "step ratios there compare the formulas (one pass fewer for RMSNorm) more than the "
            "kernels."
        )
    for model, norm, t in arms:
        table = model_pairs(data, model, norm, t)
        if table.empty:
            notes.append(f"{model_label(model)}, {_label(norm)}, {_threads(t)}: no timed steps")
            continue
        med = table.median()
        notes.append(
            f"{model_label(model)}, {_label(norm)}, {_threads(t)}: median step "
            f"{med[MODEL_MS]:.1f} ms ({NORMS.get(norm, norm)}) vs {med[BASELINE_MS]:.1f} ms "
            f"(LayerNorm) vs {med[IDENTITY_MS]:.1f} ms (no norm); the norms' calls of a step "
            f"alone {med[MODEL_OP]:.2f} ms vs {med[BASELINE_OP]:.2f} ms; {len(table)} timed steps"
        )
    return notes
