"""Every command the README and the pages under docs/ show, run as typed from the repository
root, shrunk by appended options (fewer steps, samples and trials; outputs in a temp dir). Slow:
CI runs it.

The commands are read from the code blocks of README.md and docs/*.md, so a command added there
is run here; a command this file does not know how to shrink fails the test until it is taught
one. The console scripts (`normlab-train ...`, `normlab-reproduce ...`) run as pip's wrapper
runs them, through the entry point pyproject.toml declares, shrunk as their checkout twins are
(tests/test_package.py runs the installed script of a built wheel). (The MLflow UI's command in
docs/runs.md, which is not `python ...`, is run by tests/test_trackers.py.)
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# the files whose code blocks are read: the README, then the docs pages (mkdocs.yml's docs_dir)
SHOWN = [README, *sorted((REPO / "docs").glob("*.md"))]

# what `python train.py ...` runs get appended, by what they train
SHRINK = {
    "lenet": [
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
    ],
    "transformer": [
        "batch=8",
        "trainer.max_epochs=1",
        "data.train_batches_per_epoch=2",
        "data.val_batches=1",
    ],
    "dit": [
        "batch=16",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        "model.sample_steps=2",
        "callbacks.samples.per_class=1",
        "callbacks.fid.every_n_epochs=1",
        "callbacks.fid.num_samples=50",
        "callbacks.fid.steps=2",
        "callbacks.fid.batch_size=50",
    ],
}
# commands no machine without a cluster can run; each with why
CANNOT_RUN_HERE = {
    "hydra/launcher=slurm": "needs a SLURM cluster (sbatch)",
    "--launcher slurm": "needs a SLURM cluster (sbatch; --launcher local: test_reproduce.py)",
}
# scripts, by name: options appended ({tmp}: the test's temp dir)
SCRIPT_SHRINK = {
    "reproduce.py": ["--quick", "--root", "{tmp}"],
    "bench.py": [
        "--rounds",
        "1",
        "--threads",
        "1",
        "--train-cases",
        "lenet_bn_epoch",
        "--out",
        "{tmp}/bench",
    ],
}
# the console scripts, and the checkout command each is the same as (shrunk the same way)
TWINS = {"normlab-train": "train.py", "normlab-reproduce": "scripts/reproduce.py"}
# placeholders in the pages' usage lines, and what stands for them here
PLACEHOLDERS = {"NAME": "gn_batch_size"}


def readme_commands() -> list[tuple[str, str | None]]:
    """(command, the error the page shows it printing, or None), from every code block of the
    README and the docs pages."""
    return [c for path in SHOWN for c in page_commands(path)]


def page_commands(path: Path) -> list[tuple[str, str | None]]:
    commands, block, inside = [], [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            if inside:
                commands += block_commands(block)
            block, inside = [], not inside
        elif inside:
            block.append(line)
    return commands


def block_commands(lines: list[str]) -> list[tuple[str, str | None]]:
    found, i = [], 0
    while i < len(lines):
        line = lines[i].removeprefix("$ ")
        i += 1
        if not line.startswith(("python ", *TWINS)) or line.startswith("python -c"):
            continue
        while line.endswith("\\"):  # continuation lines
            line = line[:-1] + lines[i].strip()
            i += 1
        line = line.split("  #")[0].split(" # ")[0].strip()
        error = None
        if i < len(lines) and lines[i].startswith(("error:", "did you mean")):  # it fails
            error = " ".join(lines[i:])
        found.append((line, error))
    return found


def shrunk(command: str, tmp: Path) -> list[str]:
    """The command's argv with the options that shrink it and send its outputs to tmp."""
    for name, value in PLACEHOLDERS.items():
        command = command.replace(name, value)
    command = re.sub(r"\s*\[--[^\]]*\]", "", command)  # optional parts of a usage line
    argv = shlex.split(command)
    if argv[0] in TWINS:  # a console script: its twin's options, run through its entry point
        twin = shrunk(shlex.join(["python", TWINS[argv[0]], *argv[1:]]), tmp)
        return [*entry_point(argv[0]), *twin[2:]]
    argv[0] = sys.executable
    if argv[1] == "train.py":
        return [*argv[:2], *train_args(argv[2:], tmp)]
    script = Path(argv[1]).name
    if script not in SCRIPT_SHRINK:
        raise AssertionError(f"the docs run {argv[1]}: teach this test how to shrink it")
    if "--list" in argv:
        return argv
    if argv[2:3] == ["card"]:  # a report card: the quick budget, one slot, outputs in tmp
        shrink = {} if "--leaderboard" in argv else {"--budget": "quick", "--slots": "bn_lenet",
                                                     "--threads": "1"}  # fmt: skip
        # --decide plans seeds from evidence a smoke run does not give (tests/test_card.py); an
        # option the command gives (`--budget quick`) is not given twice, so distinct() sees
        # the command that differs from another only by it as the same run
        kept = [a for a in argv if a != "--decide"]
        shrink = [x for k, v in shrink.items() if k not in kept for x in (k, v)]
        return [*kept, *shrink, "--root", str(tmp)]
    if "--readme" in argv or "--redraw" in argv:  # they read the committed results under --root
        return [*argv, "--root", str(tmp)]
    extra = [a.format(tmp=tmp) for a in SCRIPT_SHRINK[script]]
    if script == "reproduce.py":
        argv = reproduce_args(argv)
    return argv + [a for a in extra if a not in argv or not a.startswith("--")]


def entry_point(name: str) -> list[str]:
    """The argv that runs console script `name` as pip's wrapper does: its entry point from
    pyproject.toml's [project.scripts] (`module:function`), called with sys.argv[0] = name."""
    pyproject = (REPO / "pyproject.toml").read_text()  # `name = "module:function"` lines
    module, _, function = re.search(rf'^{name} = "(.+?)"', pyproject, re.M)[1].partition(":")
    code = (f"import sys; from {module} import {function}; sys.argv[0] = {name!r}; "
            f"sys.exit({function}())")  # fmt: skip
    return [sys.executable, "-c", code]


def reproduce_args(argv: list[str]) -> list[str]:
    """A reproduction's run, shrunk beyond --quick: at most 2 seeds, and its first grid only
    when it names none (tests/test_reproduce.py runs every reproduction's grids whole)."""
    from normlab.analysis.reproductions import REPRODUCTIONS

    argv = list(argv)
    if "--seeds" in argv:
        argv[argv.index("--seeds") + 1] = "2"
    name = argv[2]
    if "--grids" not in argv and name in REPRODUCTIONS:
        argv += ["--grids", REPRODUCTIONS[name].grids[0].name]
    return argv


def train_args(args: list[str], tmp: Path) -> list[str]:
    """A train.py command's overrides, shrunk: a key the command sets keeps its value, except a
    sweep's number of trials."""
    text = " ".join(args)
    lm = "transformer" in text or "lstm" in text  # the language models: data.* budgets
    kind = "dit" if "dit" in text else "transformer" if lm else "lenet"
    keys = {a.split("=")[0] for a in args if "=" in a}
    options = [o for o in SHRINK[kind] if o.split("=")[0] not in keys]
    multirun = "-m" in args or "hparams_search=" in text
    options.append(f"hydra.{'sweep' if multirun else 'run'}.dir={tmp / 'out'}")
    if "hparams_search=" in text:
        args = [a for a in args if not a.startswith("hydra.sweeper.n_trials=")]
        options.append("hydra.sweeper.n_trials=2")
    return args + options


def distinct(commands: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    """Each command once: two lines that run the same shrunk argv are one case."""
    seen, kept = set(), []
    for command, error in commands:
        key = tuple(sorted(shrunk(command, Path("/tmp/x"))))
        if key not in seen:
            seen.add(key)
            kept.append((command, error))
    return kept


COMMANDS = distinct(readme_commands())


def test_the_readme_shows_the_commands_this_file_expects():
    shown = [c for c, _ in COMMANDS]
    assert page_commands(REPO / "docs" / "runs.md"), "the docs pages' commands are read too"
    assert "python train.py" in shown
    assert any(c.startswith("python train.py experiment=dit") for c in shown)
    assert {c.split()[0] for c in shown} >= set(TWINS), "the console scripts are shown and run"
    assert any(e for _, e in COMMANDS), "the README's example of a one-line error"
    assert len(shown) >= 15


@pytest.mark.slow
@pytest.mark.parametrize("command,error", COMMANDS, ids=[c for c, _ in COMMANDS])
def test_readme_command_works_as_typed(command, error, tmp_path):
    for key, why in CANNOT_RUN_HERE.items():
        if key in command:
            pytest.skip(why)
    if "--redraw" in command or "--readme" in command:  # they read the committed results
        shutil.copytree(REPO / "outputs" / "figures", tmp_path / "outputs" / "figures")
        shutil.copy(README, tmp_path / "README.md")
    argv = shrunk(command, tmp_path)
    if "--collect" in argv:  # it reads jobs already run: run them first, as a user would have
        first = [a for a in argv if a != "--collect"]
        subprocess.run(first, cwd=REPO, capture_output=True, text=True, timeout=900, check=True)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    if error is not None:
        assert proc.returncode != 0
        printed = " ".join(proc.stderr.split())
        assert " ".join(error.split()) in printed, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        return
    assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_readme_python_example_runs():
    """The Python example of the norms API (docs/norms.md), with a model for its `model`."""
    text = "".join(path.read_text() for path in SHOWN)
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (example,) = [b for b in blocks if "create_norm(" in b]
    import torch

    from normlab.norms import create_norm

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3), create_norm("batchnorm", 64))
    model(torch.randn(4, 3, 8, 8))  # running statistics off their init
    scope = {"model": model}
    exec(compile(example, "docs/norms.md", "exec"), scope)
    assert isinstance(scope["folded"], torch.nn.Module)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(scope["folded"](x), model.eval()(x), rtol=1e-4, atol=1e-5)
    assert "groupnorm" in scope["available_norms"]()


def test_the_readme_tensorboard_command_finds_the_runs_events(tmp_path):
    """`tensorboard --logdir X` as the README shows it, run from the repository root, finds the
    events of a run with logger=[csv,tensorboard] in its default run dir (the output root moved
    into tmp_path; tensorboard --inspect reads them as the server would)."""
    from omegaconf import OmegaConf

    (logdir,) = re.findall(r"^tensorboard --logdir (\S+)", README.read_text(), flags=re.M)
    root = OmegaConf.load(REPO / "conf" / "paths" / "default.yaml").output_root
    assert Path(logdir).parts[0] == root  # so tmp_path/<logdir> stands for it
    argv = [sys.executable, "train.py", "logger=[csv,tensorboard]", *SHRINK["lenet"],
            "progress=none", f"paths.output_root={tmp_path / root}"]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tensorboard = shutil.which("tensorboard")
    assert tensorboard, "tensorboard is installed with normlab ([dev] pulls it)"
    inspect = subprocess.run(
        [tensorboard, "--inspect", "--logdir", str(tmp_path / logdir)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    found = inspect.stdout + inspect.stderr
    assert "Found event files in:" in found and f"{tmp_path / root}/runs/" in found, found
