# Over 400 lines: one paper's extraction, FID resampling, claims and figure
"""dit_conditioning: DiT (Peebles & Xie 2023) Table 4, the four conditioning mechanisms by FID.

Grid `conditioning` (experiment=dit_conditioning): adaLN-Zero, adaLN, cross-attention and
in-context on the tiny DiT (4 blocks), each over seeds. Grid `deep` (experiment=
dit_conditioning_deep, arms deep/<conditioning>): adaLN-Zero against adaLN in a DiT of twice the
depth, where starting each block as the identity is meant to matter more; paired by seed with
the 4-block pair, it asks whether adaLN-Zero's gain grows with depth.

Every job is scored once after its last step: val/fid_lenet of 5,000 samples without guidance,
from the EMA weights, the starting noise the same for every job. `resample` scores each arm's
first-seed checkpoint again on other starting noise: fid_lenet's resampling noise. `extract`
reads the run logs into runs.csv; `render` decides from runs.csv alone.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normlab import fid_train, layout
from normlab.analysis import claims as declared
from normlab.analysis import gates
from normlab.analysis.curves import metric
from normlab.analysis.logs import Run
from normlab.analysis.report import Result
from normlab.analysis.stats import Interval
from normlab.analysis.sweep import job_threads, threads_env

# the claims: conf/reproduce/dit_conditioning.yaml's claims: (the paper's numbers with them),
# built by normlab.analysis.claims
NAMES = {
    "adaln_zero": "adaLN-Zero",
    "adaln": "adaLN",
    "cross_attn": "cross-attention",
    "in_context": "in-context",
}
KEY = "model.net.conditioning"
PAIR = ("adaln_zero", "adaln")  # the deeper DiT's comparison
DEEP = "deep/"  # the deep grid's arms: deep/<conditioning>
FID = "val/fid_lenet"
RESAMPLE_FILE = "fid_resample.json"  # in a run dir: its checkpoint scored on other noise

# runs.csv metrics
FINAL_FID, RESAMPLED_FID = "final/fid_lenet", "resampled/fid_lenet"
VAL_LOSS, FINAL_LOSS = "val/loss", "final/val_loss"
# ... and the settings behind them, from each job's composed config
SETTINGS = {
    "config/fid_samples": "callbacks.fid.num_samples",
    "config/fid_steps": "callbacks.fid.steps",
    "config/fid_guidance": "callbacks.fid.guidance_scale",
    "config/norm_eps": "model.net.norm_eps",
}
DEPTH = "config/depth"


# ----- a second sample set of one checkpoint per arm ---------------------------------------------


def _resample_command(run: Run, threads: int, repo: Path) -> list[str] | None:
    """scripts/fid.py on the run's last checkpoint with the run's own fid settings, its LeNet
    and the next sample seed (disjoint starting noise); None when the run has no checkpoint or
    no fid."""
    ckpt = _last(run)
    config = run.run_dir / ".hydra" / "config.yaml"
    if not ckpt.is_file() or not config.is_file():
        return None
    cfg = OmegaConf.load(config)
    fid = OmegaConf.select(cfg, "callbacks.fid")
    if fid is None:
        return None
    cmd = [sys.executable, "scripts/fid.py", str(ckpt), "--num-threads", str(threads)]
    # the run's LeNet; a config from before `features` named a file in `ckpt`, or null: the cache
    features = fid.get("features", fid.get("ckpt") or fid_train.CACHED)
    if features == fid_train.CACHED:  # the run's cached LeNet (found, not trained again)
        lenet = fid_train.ensure(
            repo / fid.cache_dir,
            fid.lenet_epochs,
            list(fid.lenet_overrides),
            fid.data_root,
            layout.conf_dir(),
        )
    else:
        lenet = fid_train.feature_file(features)
    cmd += ["--lenet", str(lenet), "--data-root", str(fid.data_root)]
    cmd += ["--num-samples", str(fid.num_samples), "--seed", str(int(fid.seed) + 1)]
    cmd += ["--batch-size", str(fid.batch_size)]
    if fid.steps is not None:
        cmd += ["--steps", str(fid.steps)]
    if fid.guidance_scale is not None:
        cmd += ["--guidance-scale", str(fid.guidance_scale)]
    return cmd


def _first_seeds(runs: list[Run]) -> list[Run]:
    """Each arm's lowest-seed finished run, where its grid's seeds below it (a grid runs seeds
    0 up) are among `runs` and did not finish: none for an arm of a --subset run at later seeds,
    whose first seed the run that ran it scored."""
    first = []
    for arm in dict.fromkeys(r.arm for r in runs):
        mine = sorted((r for r in runs if r.arm == arm), key=lambda r: int(r.get("seed")))
        seeds = {int(r.get("seed")) for r in mine}
        ok = [r for r in mine if r.status == "ok"]
        if ok and seeds >= set(range(int(ok[0].get("seed")))):
            first.append(ok[0])
    return first


def resample(runs: list[Run], jobs: int, repo: Path) -> None:
    """Score each arm's first-seed finished checkpoint (_first_seeds) on a second sample set
    (written to <run dir>/fid_resample.json; a run dir that has one is not scored again).
    Checkpoints of the same fid settings share a scripts/fid.py process (its LeNet and the test
    set's features load once, not once per checkpoint), split into `jobs` processes run at
    once."""
    todo = [r for r in _first_seeds(runs) if not (r.run_dir / RESAMPLE_FILE).is_file()]
    jobs = max(1, jobs)
    threads = job_threads(jobs)
    env = threads_env(threads)
    groups: dict[tuple[str, ...], list[Run]] = {}  # fid.py's command without its checkpoint
    for run in todo:
        cmd = _resample_command(run, threads, repo)
        if cmd is not None:
            groups.setdefault((*cmd[:2], *cmd[3:]), []).append(run)
    shares = [(cmd, group[i::jobs]) for cmd, group in groups.items()
              for i in range(min(jobs, len(group)))]  # fmt: skip
    for start in range(0, len(shares), jobs):
        procs = [
            (share, subprocess.Popen([*cmd[:2], *(str(_last(r)) for r in share), *cmd[2:]],
                                     cwd=repo, env=env, stdout=subprocess.PIPE, text=True))
            for cmd, share in shares[start : start + jobs]
        ]  # fmt: skip
        for share, proc in procs:
            out, _ = proc.communicate()
            scored = _scored_lines(out)  # a process that failed midway still scored those before
            for run in share:
                line = scored.get(str(_last(run)))
                if line is None:
                    print(f"dit_conditioning: resampling {run.run_dir} failed", file=sys.stderr)
                    continue
                tmp = run.run_dir / (RESAMPLE_FILE + ".tmp")
                tmp.write_text(line + "\n")
                tmp.replace(run.run_dir / RESAMPLE_FILE)  # never half-written


def _last(run: Run) -> Path:
    return run.run_dir / "checkpoints" / "last.ckpt"


def _scored_lines(out: str) -> dict[str, str]:
    """scripts/fid.py's JSON lines by the checkpoint each scored."""
    scored = {}
    for line in out.splitlines():
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "ckpt" in found:
            scored[str(found["ckpt"])] = line.strip()
    return scored


# ----- run logs -> runs.csv ----------------------------------------------------------------------


def _depth(net: DictConfig) -> int:
    """The DiT's number of blocks: model.net.depth of the job's composed config. A config
    written before the shapes were explicit has depth null and names its shape in
    model.net.size: that size's preset, conf/size/dit/<size>.yaml, has the depth."""
    if net.get("depth") is not None:
        return net.depth
    return OmegaConf.load(layout.conf_dir() / "size" / "dit" / f"{net.size}.yaml").depth


def _settings(run: Run) -> dict[str, float]:
    """The fid settings and the depth of a job, from its composed config."""
    cfg = OmegaConf.load(run.run_dir / ".hydra" / "config.yaml")
    found = {name: OmegaConf.select(cfg, key) for name, key in SETTINGS.items()}
    if found["config/norm_eps"] is None:  # null: the norm config's own eps
        found["config/norm_eps"] = OmegaConf.select(cfg, "norm.eps", default=math.nan)
    if found["config/fid_guidance"] is None:  # null: the model's own sampling settings
        found["config/fid_guidance"] = cfg.model.guidance_scale
    if found["config/fid_steps"] is None:
        found["config/fid_steps"] = cfg.model.sample_steps
    found[DEPTH] = _depth(cfg.model.net)
    return {name: float(value) for name, value in found.items()}


def extract(runs: list[Run]) -> pd.DataFrame:
    """Per finished job: its val loss (EMA weights) after each epoch (x = steps trained), the
    last of it, its final val/fid_lenet and, where scored, the second sample set's; the rows its
    gates read."""
    rows = []
    for run in runs:
        if run.status != "ok":
            continue
        a, seed = run.arm, int(run.get("seed"))
        loss = run.series(VAL_LOSS).drop_duplicates("step", keep="last")  # a resumed job
        rows.append((a, seed, math.nan, "steps", float(loss["step"].max() + 1)))
        rows += [
            (a, seed, float(s + 1), VAL_LOSS, float(v))
            for s, v in zip(loss["step"], loss[VAL_LOSS], strict=True)
        ]
        rows.append((a, seed, math.nan, FINAL_LOSS, run.last(VAL_LOSS)))
        rows.append((a, seed, math.nan, FINAL_FID, run.last(FID)))
        rows += [(a, seed, math.nan, name, value) for name, value in _settings(run).items()]
        rows += gates.gate_rows(run, a, seed)
        extra = run.run_dir / RESAMPLE_FILE
        if extra.is_file():
            again = json.loads(extra.read_text())["fid_lenet"]
            rows.append((a, seed, math.nan, RESAMPLED_FID, again))
    return pd.DataFrame(rows, columns=["arm", "seed", "x", "metric", "value"])


# ----- runs.csv -> claims and figure -------------------------------------------------------------


def conditioning(arm: str) -> str:
    """The conditioning an arm runs: `adaln` of both `adaln` and `deep/adaln`."""
    return arm.removeprefix(DEEP)


def label(data: pd.DataFrame, arm: str) -> str:
    """An arm's name in the figure and notes; a deep arm's with its depth."""
    name = NAMES[conditioning(arm)]
    return f"{name}, {setting(data, [arm], DEPTH)} blocks" if arm.startswith(DEEP) else name


def per_seed(data: pd.DataFrame, a: str, name: str) -> pd.Series:
    """{seed: value} of one arm's final metric."""
    return metric(data, a, name).set_index("seed")["value"].sort_index()


def _by_seed(data: pd.DataFrame, better: str, worse: list[str], name: str) -> pd.Series:
    """{seed: the smallest of (worse arm's value - better arm's)}, over the seeds all share."""
    table = pd.concat([per_seed(data, a, name) for a in (better, *worse)], axis=1).dropna()
    return table.iloc[:, 1:].min(axis=1) - table.iloc[:, 0]


def quantities(data: pd.DataFrame) -> pd.DataFrame:
    """runs.csv's rows and the gaps the declared claims read (`_by_seed`'s, per seed): under
    adaln_zero, lowest_gap/* (the other three's smallest minus adaLN-Zero's); under each depth's
    adaLN-Zero arm, gain/fid_lenet (adaLN's minus adaLN-Zero's)."""
    zero, others = "adaln_zero", [c for c in NAMES if c != "adaln_zero"]
    gaps = {(zero, f"lowest_gap/{name.split('/')[-1]}"): _by_seed(data, zero, others, name)
            for name in (FINAL_FID, FINAL_LOSS)}  # fmt: skip
    for better, worse in (PAIR, tuple(DEEP + c for c in PAIR)):
        gaps[better, "gain/fid_lenet"] = _by_seed(data, better, [worse], FINAL_FID)
    rows = [(a, seed, math.nan, name, v) for (a, name), gap in gaps.items()
            for seed, v in gap.items()]  # fmt: skip
    return pd.concat([data, pd.DataFrame(rows, columns=data.columns)], ignore_index=True)


def words(data: pd.DataFrame) -> dict:
    """The declared claims' words from the data: the deep grid's depth (where it ran), the
    4-block pair's, and why the two depths are not comparable (their norms' eps), if they are
    not."""
    deep = [DEEP + c for c in PAIR]
    eps = {setting(data, [a], "config/norm_eps") for a in (*PAIR, *deep)}  # '?': not recorded
    apart = ""
    if "?" in eps:
        apart = "not comparable: an arm's runs do not record the norms' eps (rerun its grid)"
    elif len(eps) > 1:
        apart = (
            f"not comparable: the norms' eps differ between the arms ({' vs '.join(sorted(eps))})"
        )
    ran = any(a in set(data["arm"]) for a in deep)
    return {"depth": [setting(data, deep, DEPTH)] if ran else [],
            "shallow": setting(data, list(PAIR), DEPTH), "apart": apart}  # fmt: skip


def setting(data: pd.DataFrame, arms: list[str], name: str) -> str:
    """The value(s) of a config setting over the jobs of some arms, as text ('?' if none)."""
    values = data[data["arm"].isin(arms) & (data["metric"] == name)]["value"]
    return "/".join(f"{v:g}" for v in sorted(values.unique())) or "?"


def _color(arm: str) -> str:
    return f"C{list(NAMES).index(conditioning(arm))}"


def _dots(ax: plt.Axes, data: pd.DataFrame, arms: list[str], name: str) -> None:
    """Each seed (dots) and the mean with its 95% t-interval, per arm; resampled sets as x."""
    for i, a in enumerate(arms):
        color = _color(a)
        values = per_seed(data, a, name)
        offsets = np.linspace(-0.12, 0.12, len(values)) if len(values) > 1 else [0.0]
        ax.plot(i + np.asarray(offsets), values.values, ".", color=color, alpha=0.6)
        interval = Interval.of(values.to_numpy())
        if interval.known:
            err = [[interval.mean - interval.low], [interval.high - interval.mean]]
            ax.errorbar([i], [interval.mean], yerr=err, fmt="o", ms=7, capsize=4, color=color)
        if name == FINAL_FID:
            again = per_seed(data, a, RESAMPLED_FID)
            ax.plot([i + 0.25] * len(again), again.values, "x", color=color)
    ax.set_xticks(range(len(arms)), [NAMES[conditioning(a)] for a in arms], fontsize=8)


def _loss_curves(ax: plt.Axes, data: pd.DataFrame, arms: list[str]) -> None:
    for a in arms:
        curves = metric(data, a, VAL_LOSS).pivot(index="x", columns="seed", values="value")
        if curves.empty:
            continue
        ax.plot(curves.index, curves.mean(axis=1), color=_color(a), marker=".",
                ls="--" if a.startswith(DEEP) else "-", label=label(data, a))  # fmt: skip
    ax.set(xlabel="training step", ylabel="val loss (EMA weights)",
           title="val loss, mean over seeds")  # fmt: skip
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)


def _train_panel(ax: plt.Axes, data: pd.DataFrame, arms: list[str]) -> None:
    """The train loss the converged gate reads, mean over seeds (a running mean over the
    logged steps: one step's diffusion loss is noisy), with the gate's two windows shaded."""
    last, top = 0.0, 0.0
    for a in arms:
        curves = metric(data, a, gates.TRAIN_LOSS).pivot(index="x", columns="seed", values="value")
        if curves.empty:
            continue
        mean = curves.mean(axis=1).rolling(max(1, len(curves) // 25), center=True).mean()
        ax.plot(mean.index, mean.values, color=_color(a), ls="--" if a.startswith(DEEP) else "-",
                label=label(data, a))  # fmt: skip
        last = max(last, float(curves.index.max()))
        top = max(top, float(mean[mean.index > 0.1 * mean.index.max()].max()))
    if top:  # the first tenth of the steps (a loss ~8x the rest) would flatten the end
        ax.set_ylim(top=1.1 * top)
    if not last:
        ax.text(0.5, 0.5, "no train loss in runs.csv\n(the runs predate the gates)",
                ha="center", va="center", transform=ax.transAxes, fontsize=8)  # fmt: skip
    for lo, hi in gates.WINDOWS:
        ax.axvspan(lo * last, hi * last, color="0.9", zorder=0)
    ax.set(xlabel="training step", ylabel="train loss (running mean)",
           title="train loss, mean over seeds;\nshaded: the converged gate's windows")  # fmt: skip
    ax.title.set_fontsize(9)


def _fid_panel(ax: plt.Axes, data: pd.DataFrame, arms: list[str]) -> None:
    _dots(ax, data, arms, FINAL_FID)
    samples = setting(data, arms, "config/fid_samples")
    guidance = setting(data, arms, "config/fid_guidance")
    ax.set(ylabel=f"fid_lenet ({samples} samples, guidance {guidance})",
           title=f"DiT of {setting(data, arms, DEPTH)} blocks: fid_lenet per seed (dots), mean "
           "and 95% CI;\nx: the same checkpoint on other noise")  # fmt: skip
    ax.title.set_fontsize(9)


def _figure(data: pd.DataFrame, arms: list[str], deep: list[str]) -> plt.Figure:
    """fid_lenet per arm (seeds, mean and CI, resampled sets) at each depth, beside the val
    loss curves (the deep arms dashed)."""
    widths = [4, 2, 3, 3] if deep else [4, 3, 3]
    fig, axes = plt.subplots(1, len(widths), figsize=(18 if deep else 15, 4.6),
                             gridspec_kw={"width_ratios": widths})  # fmt: skip
    _fid_panel(axes[0], data, arms)
    if deep:
        _fid_panel(axes[1], data, deep)
    _loss_curves(axes[-2], data, arms + deep)
    _train_panel(axes[-1], data, arms + deep)
    steps = setting(data, arms + deep, "steps")
    fig.suptitle(f"DiT conditioning (DiT Table 4) on Fashion-MNIST: {steps} steps")
    fig.tight_layout()
    return fig


def render(data: pd.DataFrame) -> Result:
    """fid_lenet per arm (seeds, mean and CI, resampled sets) at each depth and val loss
    curves; the four-way claims, and the deep pair's where its grid ran."""
    present = set(data["arm"])
    arms = [c for c in NAMES if c in present]
    deep = [DEEP + c for c in PAIR if DEEP + c in present]
    fig = _figure(data, arms, deep)
    claims = declared.build("dit_conditioning", quantities(data), words(data))
    return Result(fig, claims, _notes(data, arms + deep), gates.gates(data, arms + deep))


def _by_depth(data: pd.DataFrame, arms: list[str]) -> list[list[str]]:
    """The arms grouped by grid: the 4-block arms, then the deep ones (empty groups left out)."""
    groups = [[a for a in arms if not a.startswith(DEEP)], [a for a in arms if a.startswith(DEEP)]]
    return [g for g in groups if g]


def _mean_ci(values: pd.Series, digits: int) -> str:
    i = Interval.of(values.to_numpy())
    ci = f" [{i.low:.{digits}f}, {i.high:.{digits}f}]" if i.known else ""
    return f"{i.mean:.{digits}f}{ci}"


def _notes(data: pd.DataFrame, arms: list[str]) -> list[str]:
    notes = [
        "fid_lenet is the Frechet distance in the features of a LeNet trained on Fashion-MNIST "
        "(normlab.fid), against the 10,000 test images; not Inception FID, so only its order "
        "compares with the paper's. Every job draws its "
        f"{setting(data, arms, 'config/fid_samples')} samples (classes balanced, "
        f"{setting(data, arms, 'config/fid_steps')} DDIM steps, guidance "
        f"{setting(data, arms, 'config/fid_guidance')}) from the EMA weights after its last step "
        "(the DiT's norms at eps "
        + ", ".join(
            f"{setting(data, group, 'config/norm_eps')} at {setting(data, group, DEPTH)} blocks"
            for group in _by_depth(data, arms)
        )  # fmt: skip
        + ") "
        "and from the same starting noise, so a paired difference leaves that draw aside; the "
        "resampling note shows how far another draw moves one checkpoint.",
        "Per arm, mean [95% CI] over seeds: "
        + "; ".join(
            f"{label(data, a)}: fid_lenet {_mean_ci(per_seed(data, a, FINAL_FID), 2)}, val loss "
            f"{_mean_ci(per_seed(data, a, FINAL_LOSS), 4)}"
            for a in arms
        )
        + ".",
    ]
    again = [
        (a, s, per_seed(data, a, FINAL_FID).get(s), v)
        for a in arms
        for s, v in per_seed(data, a, RESAMPLED_FID).items()
    ]
    if again:
        shifts = [abs(v - f) for _, _, f, v in again if f is not None]
        notes.append(
            "Resampling noise (one checkpoint, two disjoint sets of starting noise): "
            + "; ".join(
                f"{label(data, a)} seed {s}: {f:.2f} vs {v:.2f}" for a, s, f, v in again
            )  # fmt: skip
            + f"; the largest shift {max(shifts):.2f}."
        )
    return notes
