"""Did you mean: a typo of a key or choice names the valid one, on the first line, before
Hydra's "+key" advice; the suggested overrides compose."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

from normlab import suggest


def cfg_job(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "train.py", *overrides, "--cfg", "job"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture
def composing():
    """compose(overrides): conf/train.yaml composed in-process with the suggestions installed."""
    from hydra import compose, initialize_config_dir

    suggest.install(REPO / "conf")

    def run(overrides: list[str]):
        with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
            return compose("train", overrides=overrides)

    return run


def test_a_mistyped_key_names_the_valid_one_before_hydras_plus_advice():
    proc = cfg_job("norm=groupnorm", "norm.num_grups=4")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines[0] == "did you mean norm.num_groups=4? (norm.num_grups is not a key of the config)"
    assert lines[1] == "Could not override 'norm.num_grups'."
    assert "To append to your config use +norm.num_grups=4" in lines[2]  # Hydra's, after ours


def test_a_multirun_names_the_key_with_the_values_as_typed(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "norm=groupnorm",
            "norm.num_grups=2,4",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )  # it fails composing its first job: nothing runs
    assert not list(tmp_path.glob("*/csv"))
    assert proc.stderr.splitlines()[0] == (
        "did you mean norm.num_groups=2,4? (norm.num_grups is not a key of the config)"
    )


def test_a_key_of_another_choice_names_that_choice():
    # the default norm is batchnorm: num_groups is a key of norm=groupnorm
    proc = cfg_job("norm.num_grups=4")
    assert proc.stderr.splitlines()[0] == (
        "did you mean norm=groupnorm norm.num_groups=4? (the chosen norm has no num_grups)"
    )


LINES = [  # overrides, the line
    (["norm=groupnrm"], "did you mean norm=groupnorm? (norm has no groupnrm)"),
    (
        ["trainer.max_epoch=3"],
        "did you mean trainer.max_epochs=3? (trainer.max_epoch is not a key of the config)",
    ),
    (
        ["norm.num_groups=4"],
        "norm.num_groups is a key of norm=groupnorm, not of the chosen norm: e.g. norm=groupnorm "
        "norm.num_groups=4",
    ),
    (
        ["norm=groupnorm", "nrom.num_grups=4"],
        "did you mean norm.num_groups=4? (nrom.num_grups is not a key of the config)",
    ),
]


@pytest.mark.parametrize(("overrides", "line"), LINES)
def test_the_line_comes_first_in_hydras_error(overrides, line, composing):
    with pytest.raises(Exception) as caught:
        composing(overrides)
    assert str(caught.value).splitlines()[0] == line


@pytest.mark.parametrize(
    ("overrides", "fixed"),
    [
        (["norm.num_grups=4"], ["norm=groupnorm", "norm.num_groups=4"]),
        (["norm=groupnorm", "norm.num_grups=4"], ["norm=groupnorm", "norm.num_groups=4"]),
        (["norm=groupnrm"], ["norm=groupnorm"]),
    ],
)
def test_the_suggestion_composes_as_printed(overrides, fixed, composing):
    """The last override is the typo; the line's overrides replace it."""
    with pytest.raises(Exception) as caught:
        composing(overrides)
    typed = str(caught.value).splitlines()[0].removeprefix("did you mean ").split("?")[0].split()
    assert [o for o in overrides[:-1] if o not in typed] + typed == fixed
    assert composing(fixed).norm._target_ == "normlab.norms.GroupNorm"


def test_a_key_near_nothing_keeps_hydras_message_alone(composing):
    with pytest.raises(Exception) as caught:
        composing(["zzz.qqq=1"])
    assert str(caught.value).startswith("Could not override 'zzz.qqq'.")


@pytest.mark.parametrize(
    ("name", "candidates", "near"),
    [
        ("num_grups", ["eps", "num_groups", "affine"], "num_groups"),
        ("nrom", ["norm", "model"], "norm"),  # letters swapped
        ("zzz", ["norm", "model"], None),
    ],
)
def test_closest(name, candidates, near):
    assert suggest.closest(name, candidates) == near


def test_install_wraps_the_loader_once():
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    suggest.install()
    wrapped = ConfigLoaderImpl.load_configuration
    suggest.install()
    assert ConfigLoaderImpl.load_configuration is wrapped and wrapped.suggests
