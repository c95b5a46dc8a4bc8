"""normlab's sweeper is a Hydra plugin of its own name: installing normlab leaves every other
Hydra app in the environment on Hydra's basic sweeper, and normlab's conf chooses its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import REPO

BASIC = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
NORMLAB = "hydra_plugins.normlab_sweeper.normlab_sweeper.ComposeOnceSweeper"


def _sweeper_target(script: str, *args: str, cwd=None) -> str:
    """hydra.sweeper._target_ of a Hydra app's composed config (`--cfg hydra`), run as a user
    runs it: a new process in this environment."""
    out = subprocess.run(
        [sys.executable, script, "--cfg", "hydra", "--package", "hydra.sweeper", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=True,
    ).stdout
    return next(line.split(": ", 1)[1] for line in out.splitlines() if "_target_" in line)


def test_an_unrelated_hydra_app_gets_hydra_s_basic_sweeper(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "app.yaml").write_text("x: 1\n")
    (tmp_path / "app.py").write_text(
        textwrap.dedent(
            """
            import hydra

            @hydra.main(config_path="conf", config_name="app", version_base="1.3")
            def main(cfg):
                print(cfg.x)

            main()
            """
        )
    )
    assert _sweeper_target("app.py", cwd=tmp_path) == BASIC


def test_normlab_s_conf_chooses_its_sweeper_and_a_user_can_choose_another():
    train = str(REPO / "train.py")
    assert _sweeper_target(train) == NORMLAB
    assert _sweeper_target(train, "hydra/sweeper=basic") == BASIC
