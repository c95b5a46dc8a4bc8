# Over 400 lines: one paper's extraction, LN-map measurement and tanh fits, claims' words, figure
"""dyt_vs_ln: Zhu, Chen, He, LeCun & Liu 2025, "Transformers without Normalization".

Three grids, every arm over seeds and paired by seed (a seed sets the init of the weights the arms
share and the data order):
- gpt: the Pre-LN char-level GPT (experiment=dyt_vs_ln_gpt) with LayerNorm, DyT and RMSNorm, each
  a literal drop-in (the LayerNorm GPT's recipe unchanged);
- pilot (one seed): DyT in the same GPT with the authors' LLaMA recipe (their code: alpha0 set
  apart for the attention-input, FFN-input and final norms, no DyT bias, an untied head, a
  learnable scalar on the embeddings) over a grid of attention and FFN/final alpha0;
- recipe: that recipe at the pilot's best setting, over seeds, against the gpt grid's arms;
- dit: the tiny adaLN-Zero DiT (experiment=dyt_vs_ln_dit) with the same three norms;
- dit_long_lr (one seed, 3x the dit grid's steps), dit_long (9x): LayerNorm and DyT with the
  authors' DiT patch trained longer, each norm's lr first piloted over a grid, as the authors
  tune it for both.
A norm of the user's (`reproduce.py dyt_vs_ln --norm NAME --plugin MODULE`) is one more arm of
the gpt and dit grids, held to DyT's margins against LayerNorm.

`measure_ln_maps` (run after the sweeps) feeds fixed validation windows through every trained
LayerNorm GPT and records, for each LN layer, its inputs against its outputs before the affine
(the paper's Fig. 2-4) and how well a line and a fitted tanh explain that map (R^2), in
<run dir>/ln_map.csv. `extract` reads the run logs and those files into runs.csv; `render`
decides from runs.csv alone.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from scipy.optimize import curve_fit

from normlab.analysis import claims as declared
from normlab.analysis import gates
from normlab.analysis.curves import diverged_seeds, final_loss, metric, seed_curves, val_loss_rows
from normlab.analysis.logs import Run
from normlab.analysis.report import Result
from normlab.analysis.stats import Interval

if TYPE_CHECKING:  # torch loads only where the LN maps are measured
    import torch

GPT, PILOT, DIT, DIT_PILOT = "gpt", "pilot", "dit", "dit_pilot"
LONG = "long"  # LayerNorm and the recipe trained 5x longer than the gpt grid
DIT_LONG, DIT_LONG_LR = "dit_long", "dit_long_lr"  # the DiT trained longer, and its lr pilot
DITS = (DIT, DIT_PILOT, DIT_LONG, DIT_LONG_LR)  # the DiT grids
LR = "optim/lr"  # a DiT job's lr (its composed config's)
NORMS = {"layernorm": "LayerNorm", "dyt": "DyT", "rmsnorm": "RMSNorm"}
RECIPE = f"{GPT}/dyt_recipe"  # DyT with the authors' LLaMA recipe at the pilot's best alpha0s
RECIPE_LABEL = "DyT, LLaMA recipe"
PILOT_ARM = re.compile(r"^pilot/a(?P<attn>[\d.]+)_f(?P<ffn>[\d.]+)$")
# the claims: conf/reproduce/dyt_vs_ln.yaml's claims:, built by normlab.analysis.claims; its bands
# are its thresholds: (the figure and notes draw them, read by `_band`)

LN_MAP_FILE = "ln_map.csv"
WINDOWS = 2  # validation batches (of the run's batch windows) fed through the model
POINTS = 1500  # random points per layer kept for the scatter (+ the TAIL largest |input|)
TAIL = 300


# ----- LayerNorm's input-output map in a trained GPT ------------------------------------------


def _tanh(x: np.ndarray, a: float, b: float, c: float, d: float) -> np.ndarray:
    return a * np.tanh(b * x + c) + d


def _r2(y: np.ndarray, fitted: np.ndarray) -> float:
    return 1.0 - float(np.sum((y - fitted) ** 2)) / float(np.sum((y - y.mean()) ** 2))


def fit_maps(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """R^2 of the least-squares line y = s x + i and of the least-squares tanh
    y = a tanh(b x + c) + d (started from the line at several amplitudes, the best kept; as b -> 0
    it tends to a line, so it is never much worse)."""
    s, i = np.polyfit(x, y, 1)
    fits = {"line_s": float(s), "line_i": float(i), "r2_line": _r2(y, s * x + i)}
    best = None
    top = float(np.max(np.abs(y)))
    for a in (top, 2 * top, 4 * top):
        try:
            p, _ = curve_fit(_tanh, x, y, p0=(a, s / a, 0.0, i), maxfev=4000)
        except RuntimeError:  # no convergence from this start
            continue
        sse = float(np.sum((y - _tanh(x, *p)) ** 2))
        if best is None or sse < best[0]:
            best = (sse, p)
    if best is None:
        fits.update(tanh_a=math.nan, tanh_b=math.nan, tanh_c=math.nan, tanh_d=math.nan)
        fits["r2_tanh"] = math.nan
        return fits
    a, b, c, d = (float(v) for v in best[1])
    fits.update(tanh_a=a, tanh_b=b, tanh_c=c, tanh_d=d, r2_tanh=_r2(y, _tanh(x, a, b, c, d)))
    return fits


def _load_task(run_dir: Path, cfg) -> torch.nn.Module:
    """The job's task (cfg: its composed config) with its last checkpoint's weights."""
    import torch  # lazy: torch loads only where the LN maps are measured
    from hydra.utils import instantiate  # lazy: only where the LN maps are measured

    from normlab.config import import_plugins  # lazy: only where the LN maps are measured

    import_plugins(cfg)
    task = instantiate(cfg.model)
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu",
                       weights_only=False)["state_dict"]  # fmt: skip
    task.load_state_dict(state)
    return task.eval()


def _windows(cfg, task: torch.nn.Module) -> list[torch.Tensor]:
    """The job's first WINDOWS fixed validation batches (inputs only)."""
    from hydra.utils import instantiate  # lazy: only where the LN maps are measured

    data = instantiate(cfg.data)
    if getattr(data, "ctx", None) is None:
        data.ctx = task.net.ctx
    data.setup("validate")
    return [x for x, _ in list(data.val_dataloader())[:WINDOWS]]


def ln_map(run_dir: Path) -> pd.DataFrame:
    """Per LayerNorm layer of the job's trained model, in depth order: the R^2 and fits of
    fit_maps over every (input, output before the affine) pair of the validation windows, and a
    sample of those pairs (kind 'point')."""
    import torch  # lazy: reproduce.py's --list, --redraw and checks run without torch

    from normlab.norms.layernorm import LayerNorm  # lazy: torch, as above

    with torch.no_grad():
        cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")  # read once, for model and data
        task = _load_task(run_dir, cfg)
        layers = {n: m for n, m in task.named_modules() if isinstance(m, LayerNorm)}
        seen: dict[str, list[torch.Tensor]] = {n: [] for n in layers}
        hooks = [
            m.register_forward_pre_hook(lambda m, args, n=n: seen[n].append(args[0].double()))
            for n, m in layers.items()
        ]
        try:
            for x in _windows(cfg, task):
                task(x)
        finally:
            for h in hooks:
                h.remove()
        rows, rng = [], np.random.default_rng(0)
        for depth, (name, module) in enumerate(layers.items()):
            x = torch.cat(seen[name]).reshape(-1, seen[name][0].shape[-1])
            mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
            y = (x - mean) / torch.sqrt(var + module.eps)  # LN's output before its affine
            xs, ys = x.reshape(-1).numpy(), y.reshape(-1).numpy()
            for key, value in fit_maps(xs, ys).items():
                rows.append((depth, name, key, math.nan, value))
            keep = np.concatenate([rng.choice(len(xs), POINTS, replace=False),
                                   np.argsort(np.abs(xs))[-TAIL:]])  # fmt: skip
            rows += [(depth, name, "point", float(xs[k]), float(ys[k])) for k in keep]
    return pd.DataFrame(rows, columns=["depth", "layer", "kind", "x", "value"])


def measure_ln_maps(runs: list[Run], jobs: int, repo: Path) -> None:
    """Write <run dir>/ln_map.csv for every finished LayerNorm GPT job without one (atomically:
    a killed measurement leaves no half-written file)."""
    for run in runs:
        if run.status != "ok" or run.arm != f"{GPT}/layernorm":
            continue
        path = run.run_dir / LN_MAP_FILE
        if path.is_file() or not (run.run_dir / "checkpoints" / "last.ckpt").is_file():
            continue
        tmp = path.with_suffix(".tmp")
        ln_map(run.run_dir).to_csv(tmp, index=False, float_format="%.6g")
        tmp.replace(path)


# ----- run logs -> runs.csv -------------------------------------------------------------------

ALPHA_KEY = re.compile(r"^norm/(.+)/alpha$")


def _alphas(run: Run, a: str, seed: int) -> list[tuple]:
    """A DyT job's learned alpha per layer at its end (metric alpha/<layer>)."""
    rows = []
    for key in run.metrics.columns:
        m = ALPHA_KEY.match(str(key))
        if m:
            rows.append((a, seed, math.nan, f"alpha/{m.group(1)}", run.last(key)))
    return rows


def _ln_rows(run: Run, a: str, seed: int, points: bool) -> list[tuple]:
    path = run.run_dir / LN_MAP_FILE
    if not path.is_file():
        return []
    table = pd.read_csv(path)
    rows = []
    for r in table.itertuples():
        if r.kind == "point":
            if points:
                rows.append((a, seed, r.x, f"ln_point/{r.depth}/{r.layer}", r.value))
        else:
            rows.append((a, seed, float(r.depth), f"ln_{r.kind}/{r.layer}", r.value))
    return rows


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per job: the GPTs' val loss curve, final val loss, DyT's alphas and (LayerNorm) the LN
    maps' fits (the scatter points of the lowest seed only), and the rows of their gates; the
    DiTs' val loss by step, final val loss and val/fid_lenet (a diverged DiT: only that it
    diverged)."""
    rows = []
    ln_seeds = [int(r.get("seed")) for r in runs if r.arm == f"{GPT}/layernorm"]
    for run in runs:
        a, seed = run.arm, int(run.get("seed"))
        if a.startswith(tuple(g + "/" for g in DITS)):
            if run.status == "diverged":  # no fid_lenet: named by its gate and claim, not paired
                rows.append((a, seed, math.nan, "diverged", 1.0))
            if run.status != "ok":
                continue
            rows.append((a, seed, math.nan, LR, float(run.setting("optim.optimizer.lr", "nan"))))
            loss = run.series("val/loss").drop_duplicates("step", keep="last")
            rows += [(a, seed, float(s + 1), "val/loss", float(v))
                     for s, v in zip(loss["step"], loss["val/loss"], strict=True)]  # fmt: skip
            rows.append((a, seed, math.nan, "final/val_loss", run.last("val/loss")))
            rows.append((a, seed, math.nan, "final/fid_lenet", run.last("val/fid_lenet")))
            rows += gates.gate_rows(run, a, seed)
            continue
        rows += val_loss_rows(run, a, seed)
        rows += _alphas(run, a, seed)
        rows += gates.gate_rows(run, a, seed)
        if a == f"{GPT}/layernorm":
            rows += _ln_rows(run, a, seed, points=seed == min(ln_seeds))
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


# ----- runs.csv -> claims and figure ----------------------------------------------------------


def arms_of(data: pd.DataFrame, grid: str) -> list[str]:
    """The grid's norms present in runs.csv: the built-in ones in order, then the user's."""
    found = {a.split("/", 1)[1] for a in data["arm"].unique()
             if a.startswith(grid + "/") and a != RECIPE}  # fmt: skip
    return [n for n in NORMS if n in found] + sorted(found - set(NORMS))


def label(norm: str) -> str:
    return {**NORMS, "dyt_patch": "DyT, authors' DiT patch"}.get(norm, norm)


def _final(data: pd.DataFrame, a: str, name: str) -> pd.Series:
    return metric(data, a, name).set_index("seed")["value"].sort_index()


def ln_fits(data: pd.DataFrame) -> pd.DataFrame:
    """Per (seed, layer): depth, r2_line, r2_tanh and the unexplained-variance ratio
    u = (1 - r2_tanh) / (1 - r2_line) of the LayerNorm GPTs' LN maps."""
    rows = data[(data["arm"] == f"{GPT}/layernorm") & data["metric"].str.startswith("ln_r2")]
    if rows.empty:
        return pd.DataFrame(columns=["seed", "layer", "depth", "r2_line", "r2_tanh", "u"])
    rows = rows.assign(kind=rows["metric"].str.split("/", n=1).str[0].str[3:],
                       layer=rows["metric"].str.split("/", n=1).str[1])  # fmt: skip
    table = rows.pivot_table(index=["seed", "layer", "x"], columns="kind", values="value")
    table = table.reset_index().rename(columns={"x": "depth"}).sort_values(["seed", "depth"])
    table["u"] = (1 - table["r2_tanh"]) / (1 - table["r2_line"])
    return table.reset_index(drop=True)


def _tanh_values(fits: pd.DataFrame) -> tuple[dict, dict, int]:
    """{seed: the geometric mean of u over the deeper half of the LN layers (blocks depth/2 and
    on, and the final norm)}, {seed: that over the first LN layer's u} (NaN where a seed's maps
    are incomplete), and the first deeper layer."""
    deep, ratio = {}, {}
    n_layers = int(fits["depth"].max()) + 1 if len(fits) else 0
    first_deep = n_layers // 2  # 2 norms a block + the final: the deeper half and the final
    for seed, g in fits.groupby("seed"):
        g = g.sort_values("depth")
        u = g["u"].to_numpy()
        if len(u) != n_layers or not np.all(np.isfinite(u)) or np.any(u <= 0):
            deep[seed] = ratio[seed] = math.nan
            continue
        deep[seed] = float(np.exp(np.log(u[first_deep:]).mean()))
        ratio[seed] = deep[seed] / float(u[0])
    return deep, ratio, first_deep


def _gpt_arms(data: pd.DataFrame) -> dict[str, str]:
    """{arm: label} of the GPT arms held against LayerNorm and RMSNorm: DyT (and a user's norm)
    as literal drop-ins, then DyT with the paper's LLaMA recipe."""
    arms = {f"{GPT}/{n}": label(n) for n in arms_of(data, GPT) if n not in ("layernorm", "rmsnorm")}
    arms.pop(RECIPE, None)
    if f"{GPT}/dyt" in arms:
        arms[f"{GPT}/dyt"] = "DyT (drop-in)"
    if (data["arm"] == RECIPE).any():
        arms[RECIPE] = RECIPE_LABEL
    return arms


def quantities(data: pd.DataFrame) -> pd.DataFrame:
    """runs.csv's rows and the quantities the declared claims read that no job logs: each arm's
    final_loss (curves.final_loss: a diverged job's at ln VOCAB) and the LayerNorm GPT's tanh/*
    per seed (`_tanh_values`)."""
    losses = sorted(data.loc[data["metric"] == "final/val_loss", "arm"].unique())
    rows = [(a, seed, math.nan, "final_loss", v) for a in losses
            for seed, v in final_loss(data, a).items()]  # fmt: skip
    deep, ratio, _ = _tanh_values(ln_fits(data))
    rows += [(f"{GPT}/layernorm", seed, math.nan, f"tanh/{name}", v)
             for name, values in (("deeper", deep), ("ratio", ratio))
             for seed, v in values.items()]  # fmt: skip
    return pd.concat([data, pd.DataFrame(rows, columns=data.columns)], ignore_index=True)


def _band(name: str) -> float:
    return float(declared.thresholds("dyt_vs_ln")[name])


def words(data: pd.DataFrame) -> dict:
    """What the declared claims read from the data: the GPT arms held against LayerNorm and
    RMSNorm, each DiT grid's (`_dit_words`), the long grids' bases that ran and their steps,
    and the LN maps' deeper layers."""
    gpt = _gpt_arms(data)
    mine = final_loss(data, f"{LONG}/dyt_recipe")
    bases = [
        (f"{LONG}/{b}", name)
        for b, name in (("layernorm", "LayerNorm"), ("rmsnorm", "RMSNorm"))
        if not (mine.empty or final_loss(data, f"{LONG}/{b}").empty)
    ]
    deeper = _tanh_values(ln_fits(data))[2] // 2  # the first deeper layer's block
    return {"gpt_arm": list(gpt), "gpt_name": list(gpt.values()),
            **_dit_words(data), "recipe": RECIPE_LABEL,
            "long_base": [b for b, _ in bases], "long_name": [n for _, n in bases],
            "long_steps": [f"{_steps(data, b):,}" for b, _ in bases], "windows": WINDOWS,
            "deeper": f"the LN layers from block {deeper} on and the final norm",
            "fid_percent": f"{_band('fid_high') - 1:.0%}"}  # fmt: skip


def _dit_words(data: pd.DataFrame) -> dict[str, list[str]]:
    """Each DiT arm of the dit, then the dit_long grid (RMSNorm aside), held against its grid's
    LayerNorm: the arm, the base, its name, where (the dit_long grid's with its steps), and its
    diverged seeds left out."""
    out: dict[str, list[str]] = {k: [] for k in ("dit_arm", "dit_base", "dit_name", "dit_where",
                                                 "dit_after", "dit_left_out")}  # fmt: skip
    for grid in (DIT, DIT_LONG):
        base, norms = f"{grid}/layernorm", arms_of(data, grid)
        where, after = "DiT", ""
        if grid != DIT and "layernorm" in norms:  # the steps LayerNorm, the base, trained
            steps = f"{_steps(data, base):,} steps"
            where, after = f"DiT, {steps}", f", after {steps}"
        for norm in (n for n in norms if n not in ("layernorm", "rmsnorm")):
            arm = f"{grid}/{norm}"
            values = (arm, base, label(norm), where, after, _left_out(data, (arm, base)))
            for key, v in zip(out, values, strict=True):
                out[key].append(v)
    return out


def _left_out(data: pd.DataFrame, arms: tuple[str, ...]) -> str:
    """'; left out, diverged (no fid_lenet): <arm> seeds [..]' for the arms' diverged seeds
    (a pair needs both arms' fid_lenet), or ''."""
    named = diverged_seeds(data[data["arm"].isin(arms)])
    return "" if named == "none" else f"; left out, diverged (no fid_lenet): {named}"


def _steps(data: pd.DataFrame, arm: str, *, grid: bool = False) -> int | None:
    """The steps an arm trained: its last val loss's step (with `grid`, the last of the arms
    of the grid named `arm`; None when none logged one)."""
    picked = data["arm"].str.startswith(arm + "/") if grid else data["arm"] == arm
    x = data.loc[picked & (data["metric"] == "val/loss"), "x"]
    return int(x.max()) if len(x) else None


def _gpt_panel(ax: plt.Axes, data: pd.DataFrame) -> None:
    arms = {f"{GPT}/{n}": label(n) for n in arms_of(data, GPT)} | _gpt_arms(data)
    for i, (a, name) in enumerate(arms.items()):
        style = "--" if a == f"{GPT}/dyt" else "-"
        seed_curves(ax, data, a, style, f"C{i}", f"{name} ({{n}} seeds)")
    ax.set(xlabel="training step", ylabel="val loss (nats per character)",
           title="Pre-LN GPT on tiny Shakespeare")  # fmt: skip
    if ax.lines:
        low = min(line.get_ydata().min() for line in ax.lines)
        last = max(line.get_ydata()[-1] for line in ax.lines)  # a stuck arm stays in view
        ax.set_ylim(low - 0.05, max(low + 1.2, last + 0.15))
        ax.legend(fontsize=7)


def _long_panel(ax: plt.Axes, data: pd.DataFrame) -> None:
    """The long grid's val loss curves: LayerNorm and the recipe."""
    arms = {f"{LONG}/layernorm": "LayerNorm", f"{LONG}/dyt_recipe": RECIPE_LABEL}
    for i, (a, name) in enumerate(arms.items()):
        seed_curves(ax, data, a, "-", f"C{i}", f"{name} ({{n}} seeds)")
    if not ax.lines:
        ax.set_axis_off()
        return
    low = min(line.get_ydata().min() for line in ax.lines)
    ax.set_ylim(low - 0.05, low + 1.2)
    ax.set(xlabel="training step", ylabel="val loss (nats per character)",
           title="the GPT trained 5x longer")  # fmt: skip
    ax.legend(fontsize=7)


def _dots(ax: plt.Axes, i: int, values: pd.Series, color: str, log: bool = False) -> None:
    """One arm's per-seed values as dots and its mean with the 95% CI as an error bar."""
    if values.empty:
        return
    ax.plot([i] * len(values), values.values, "o", color=color, alpha=0.4, ms=4)
    ci = Interval.of(values.values, log=log)
    if ci.known:
        ax.errorbar([i + 0.15], [ci.mean], yerr=[[ci.mean - ci.low], [ci.high - ci.mean]],
                    fmt="s", color=color, capsize=3)  # fmt: skip


def pilot(data: pd.DataFrame) -> pd.DataFrame:
    """The pilot's table: attention alpha0, FFN/final alpha0, final val loss (one seed each)."""
    rows = []
    for a in sorted(data["arm"].unique()):
        m = PILOT_ARM.match(a)
        loss = final_loss(data, a)
        if m and len(loss):
            rows.append((float(m["attn"]), float(m["ffn"]), a, float(loss.iloc[0])))
    return pd.DataFrame(rows, columns=["attn", "ffn", "arm", "val_loss"]).sort_values(
        ["attn", "ffn"], ignore_index=True
    )


def _pilot_panel(ax: plt.Axes, data: pd.DataFrame) -> None:
    table = pilot(data)
    for k, (ffn, g) in enumerate(table.groupby("ffn")):
        ax.plot(g["attn"], g["val_loss"], "o-", color=f"C{k + 3}", label=f"FFN/final {ffn:g}")
    for norm, color in (("layernorm", "C0"), ("rmsnorm", "C2")):
        base = final_loss(data, f"{GPT}/{norm}")
        if len(base):
            ax.axhline(float(base.mean()), color=color, ls="--", lw=1,
                       label=f"{label(norm)} (mean)")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set(xlabel="attention-input alpha0", ylabel="final val loss (seed 0)",
           title=f"GPT pilot, {RECIPE_LABEL}")  # fmt: skip
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _lr_pilot_note(data: pd.DataFrame, pilot: str, grid: str, what: str) -> str:
    """An lr pilot of the DiT (one seed): fid_lenet by lr per norm, the lowest (marked where it
    is the grid's edge), and whether `grid`'s arm of that norm runs at it (its logged lr)."""
    fid = data[data["arm"].str.startswith(pilot + "/") & (data["metric"] == "final/fid_lenet")]
    if fid.empty:
        return f"{what}: not run yet."
    lr = data[data["metric"] == LR].groupby("arm")["value"].first()  # the grid's arms' lrs
    parts = []
    # dit_pilot's arms are dit_pilot/lr<lr> (DyT with the patch); dit_long_lr's <grid>/<norm>/lr<lr>
    norm_of = fid["arm"].map(lambda a: a.split("/")[1] if a.count("/") == 2 else "dyt_patch")
    named = fid["arm"].map(lambda a: float(a.rsplit("/lr", 1)[1]))
    for norm, g in fid.assign(lr=named).groupby(norm_of, sort=False):
        g = g.groupby("lr", as_index=False)["value"].mean()  # one seed (more in --quick: mean)
        cells = "; ".join(f"{r.lr:g}: {r.value:.2f}" for r in g.itertuples())
        best = float(g.loc[g["value"].idxmin(), "lr"])
        edge = " (the grid's edge)" if best in (g["lr"].min(), g["lr"].max()) else ""
        text = f"{label(norm)}: {cells}; lowest at {best:g}{edge}"
        runs = lr.get(f"{grid}/{norm}", math.nan)
        if not math.isnan(runs):
            same = "the pilot's lowest" if runs == best else f"NOT the pilot's lowest ({best:g})"
            text += f"; the {grid} grid runs it at {runs:g}, {same}"
        parts.append(text)
    seeds = sorted(set(fid["seed"].astype(int)))
    which = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean of seeds {', '.join(map(str, seeds))}"
    steps, grid_steps = _steps(data, pilot, grid=True), _steps(data, grid, grid=True)
    if steps:
        which += f", {steps:,} steps"
        if grid_steps and grid_steps != steps:
            which += f"; the {grid} grid trains {grid_steps:,}"
    return f"{what} ({which}; fid_lenet by lr): " + ". ".join(parts) + "."


def _pilot_note(data: pd.DataFrame) -> str:
    table = pilot(data)
    if table.empty:
        return "Pilot: not in runs.csv."
    cells = "; ".join(f"{r.attn:g}/{r.ffn:g}: {r.val_loss:.3f}" for r in table.itertuples())
    best = table.loc[table["val_loss"].idxmin()]
    return (
        "Pilot (seed 0, one job each; final val loss by attention / FFN-and-final alpha0): "
        f"{cells}. Lowest: attention {best.attn:g}, FFN/final {best.ffn:g}; the recipe arm "
        "runs the setting conf/reproduce/dyt_vs_ln.yaml declares."
    )


def _dit_panel(ax: plt.Axes, data: pd.DataFrame) -> None:
    """Each DiT arm's fid_lenet per seed: the dit grid's, then the dit_long grid's (each
    norm in its dit grid's colour)."""
    norms = arms_of(data, DIT)
    ticks = []
    for grid, tag in ((DIT, ""), (DIT_LONG, "\n(long)")):
        for norm in arms_of(data, grid):
            color = f"C{norms.index(norm) if norm in norms else len(norms) + len(ticks)}"
            values = _final(data, f"{grid}/{norm}", "final/fid_lenet")
            _dots(ax, len(ticks), values, color, log=True)
            ticks.append(label(norm) + tag)
    ax.set_xticks(range(len(ticks)), ticks, fontsize=7)
    ax.set(ylabel="val/fid_lenet (lower is better)", title="tiny adaLN-Zero DiT, Fashion-MNIST")


def _u_panel(ax: plt.Axes, fits: pd.DataFrame) -> None:
    for seed, g in fits.groupby("seed"):
        ax.plot(g["depth"], g["u"], "o-", alpha=0.6, lw=1, label=f"seed {seed}")
    ax.axhline(_band("tanh_gain"), color="grey", ls="--", lw=1)
    ax.set_yscale("log")
    ax.set(xlabel="LN layer (depth order; last = final norm)",
           ylabel="u = (1-R² tanh) / (1-R² line)",
           title="LayerNorm GPT: tanh vs line per layer")  # fmt: skip
    if ax.lines:
        ax.legend(fontsize=7)


def _scatter(ax: plt.Axes, data: pd.DataFrame, depth: int) -> None:
    a = f"{GPT}/layernorm"
    pts = data[(data["arm"] == a) & data["metric"].str.startswith(f"ln_point/{depth}/")]
    if pts.empty:
        ax.set_axis_off()
        return
    layer = pts["metric"].iloc[0].split("/", 2)[2]
    seed = int(pts["seed"].iloc[0])
    ax.plot(pts["x"], pts["value"], ".", ms=1.5, alpha=0.3, color="C0")
    rows = data[(data["arm"] == a) & (data["seed"] == seed)
                & data["metric"].str.endswith("/" + layer) & data["metric"].str.startswith("ln_")
                & ~data["metric"].str.startswith("ln_point")]  # fmt: skip
    fit = {m.split("/")[0][3:]: float(v) for m, v in zip(rows["metric"], rows["value"],
                                                          strict=True)}  # fmt: skip
    grid = np.linspace(pts["x"].min(), pts["x"].max(), 200)
    if "line_s" in fit:
        ax.plot(grid, fit["line_s"] * grid + fit["line_i"], "--", color="grey", lw=1,
                label=f"line R²={fit['r2_line']:.3f}")  # fmt: skip
    if np.isfinite(fit.get("tanh_a", math.nan)):
        ax.plot(grid, _tanh(grid, fit["tanh_a"], fit["tanh_b"], fit["tanh_c"], fit["tanh_d"]),
                color="C3", lw=1.2, label=f"tanh R²={fit['r2_tanh']:.3f}")  # fmt: skip
    ax.set(xlabel="LN input", ylabel="LN output (before affine)")
    ax.set_title(f"{layer} (seed {seed})", fontsize=8)
    ax.legend(fontsize=7, loc="upper left")


def render(data: pd.DataFrame) -> Result:
    """Row 1: GPT curves, alpha0 sensitivity, DiT fid_lenet, u per LN layer (and the long grid's
    curves when it ran); row 2: LN input vs output of four layers of the lowest seed's LayerNorm
    GPT with the fitted line and tanh."""
    long = (data["arm"].str.startswith(LONG + "/")).any()
    fig, axes = plt.subplots(2, 5 if long else 4, figsize=(23 if long else 19, 8.5))
    fits = ln_fits(data)
    _gpt_panel(axes[0, 0], data)
    _pilot_panel(axes[0, 1], data)
    _dit_panel(axes[0, 2], data)
    _u_panel(axes[0, 3], fits)
    if long:
        _long_panel(axes[0, 4], data)
    depths = sorted({int(m.split("/")[1]) for m in data["metric"].unique()
                     if m.startswith("ln_point/")})  # fmt: skip
    shown = [depths[i] for i in sorted({0, len(depths) // 3, 2 * len(depths) // 3,
                                        len(depths) - 1})] if depths else []  # fmt: skip
    for k, ax in enumerate(axes[1]):
        _scatter(ax, data, shown[k]) if k < len(shown) else ax.set_axis_off()
    fig.suptitle("Transformers without Normalization (Zhu et al. 2025): DyT vs LayerNorm and "
                 "RMSNorm; LayerNorm's tanh-like map", fontsize=11)  # fmt: skip
    fig.tight_layout()
    notes = [
        "Paired by seed: a seed sets the init of the weights every arm shares (the norms' own "
        "parameters aside) and the data order; every arm keeps the LayerNorm baseline's "
        "hyperparameters (the paper's drop-in protocol), DyT at the paper's alpha0 0.5 in every "
        "place a norm sits (both norms of each block and the final norm; in the DiT, under "
        "adaLN-Zero, with the affine from the condition).",
        f"Margins: the paper's LLaMA losses differ by at most 0.01 nats, here "
        f"+-{_band('loss_margin'):g} nats; its DiT FIDs by -1.5% to +4.5%, here "
        f"+-{_band('fid_high') - 1:.0%} on fid_lenet (a LeNet "
        "feature space on Fashion-MNIST, not Inception's; compare only at equal sample counts).",
        f"{RECIPE_LABEL} (the authors' fms-fsdp LLaMA code): DyT without its bias, alpha0 set "
        "apart for the attention-input, FFN-input and final norms (their 7B: 0.8, 0.2, 0.2), an "
        "untied LM head, and the embeddings times a learnable scalar (init sqrt(d_model) on "
        "their embeddings; ours start at N(0, 0.02), so 50 puts them at unit scale as theirs). "
        "The LayerNorm and RMSNorm baselines keep the GPT's own recipe, as in the paper.",
        _pilot_note(data),
        _lr_pilot_note(data, DIT_PILOT, DIT, "DiT lr pilot for the dit grid"),
        _lr_pilot_note(data, DIT_LONG_LR, DIT_LONG, "DiT lr pilot for the dit_long grid"),
        "DiT: DyT keeps adaLN-Zero's zero init of the modulation and of the final layer; the "
        "authors' DiT patch removes that init for DyT (model.net.zero_init=false). The authors "
        "tune the lr of the LN and the DyT models alike, over 1e-4, 2e-4, 4e-4 (their README's "
        "learning-rate fix serves both): here the dit_pilot grid (DyT, 800 steps) and the "
        "dit_long_lr grid (both, 2,400 steps). The DiT's DyT has no affine of its own (as "
        "LayerNorm there: the condition's scale and shift), only alpha.",
        "LN maps: every (input, output before the affine) pair of every channel and token of "
        f"{WINDOWS} validation batches through each LN layer of each trained LayerNorm GPT; the "
        "scatter shows a random sample plus the largest inputs. A tanh nests a line (b -> 0), "
        f"so u <= 1 by construction: the claim asks for u <= {_band('tanh_gain'):g}, and the "
        "second compares depths, which can go either way.",
    ]
    grids = tuple(g + "/" for g in (GPT, PILOT, LONG, *DITS))
    arms = sorted(a for a in data["arm"].unique() if a.startswith(grids))
    claims = declared.build("dyt_vs_ln", quantities(data), words(data))
    return Result(fig, claims, notes, gates.gates(data, arms))
